"""A/B runs of the generated kernels in one process: cases that differ in kernel defines, schedule
options or workload options, run in the order given (interleave A B A B: two runs of one case on one
machine differ by ~2 %), each checked and timed as ``python -m validation megakernel`` does, within
a time budget. One process saves the interpreter's, torch's and CuPy's start per case (seconds of
device time each); the kernel is compiled again only when a case's defines differ.

    python -m validation megakernel-ab PLAN.json --out DIR [--budget-s 400] [--reps 20]

``PLAN.json``::

    {"reps": 20,
     "cases": [{"name": "b1-base", "model": "llama-3.2-1b", "batch": 1,
                "wl": {"kv_splits": 16, "fuse_norm": 1}},
               {"name": "b1-groups2", "model": "llama-3.2-1b", "batch": 1,
                "wl": {"kv_splits": 16, "fuse_norm": 1}, "defines": "-DMK_MM_GROUPS=2",
                "opt": {"prefetch_depth": 3}, "traces": true}]}

A case takes ``name`` (letters, digits, ``.``, ``_``, ``-``; unique), ``model``, ``batch`` and
optionally ``kv_len`` (1024), ``mode`` (``megakernel``), ``wl`` (keywords of
:func:`mksim.workload.build_llm_workload`, as ``--wl``), ``opt`` (schedule options, as ``--opt``),
``defines`` (``-DNAME=VALUE`` words: ``MKSIM_KERNEL_DEFINES`` for this case alone), ``reps``,
``traces`` (keep the per-task stamps as ``DIR/NAME.npz``) and ``single_ops``. Every case is built and
checked before any GPU work; a plan with a bad case is refused in one line (exit 2).

Writes ``DIR/NAME.json`` for each case (the row list ``python -m validation megakernel --json``
writes) and ``DIR/summary.json`` after every case (the plan, then per case its measured and predicted
µs, spread, max rel err, whether it checked, the matmul's mean wait and compute per task, or its
error, or ``skipped``: a case not begun once the budget was spent). A case that fails records its
error in one line and the others go on; exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mksim.errors import MksimError

from .predict import RUN_GPU as GPU  # what the runner asks the kernel's needs of (its default --gpu)
from .quick import case_schedule, measure_row, row_lines, workload_option

NAME = re.compile(r"[A-Za-z0-9._-]+")
DEFINE = re.compile(r"-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]*)?")
KEYS = {"name", "model", "batch", "kv_len", "mode", "wl", "opt", "defines", "reps", "traces", "single_ops"}


def load_plan(path: Path) -> dict[str, Any]:
    """The plan file, checked: every case has what it needs, and its schedule builds and is one the
    generated kernels run (:func:`case_schedule`; kept as the case's ``_schedule``). Raises
    :class:`MksimError` in one line."""
    try:
        plan = json.loads(Path(path).read_text())
    except OSError as exc:
        raise MksimError(f"{path}: cannot read the plan ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MksimError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("cases"), list) or not plan["cases"]:
        raise MksimError(f"{path}: a plan is an object with a non-empty list 'cases'")
    reps = plan.get("reps", 20)
    if type(reps) is not int or reps < 1:
        raise MksimError(f"{path}: reps must be a positive integer, got {reps!r}")
    seen: set[str] = set()
    for i, c in enumerate(plan["cases"]):
        where = f"{path}: case {i + 1}"
        if not isinstance(c, dict):
            raise MksimError(f"{where} is not an object")
        extra = sorted(set(c) - KEYS)
        if extra:
            raise MksimError(f"{where}: unknown key {extra[0]!r}; a case takes {', '.join(sorted(KEYS))}")
        name = c.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise MksimError(f"{where}: name must be letters, digits, '.', '_' or '-', got {name!r}")
        if name in seen:
            raise MksimError(f"{where}: name {name!r} is used twice")
        seen.add(name)
        where = f"{path}: case {name!r}"
        if not isinstance(c.get("model"), str):
            raise MksimError(f"{where}: needs a model (a model name)")
        for key, default in (("batch", None), ("kv_len", 1024), ("reps", reps)):
            v = c.get(key, default)
            if type(v) is not int or v < (0 if key == "kv_len" else 1):
                raise MksimError(f"{where}: {key} must be a{' non-negative' if key == 'kv_len' else ' positive'} "
                                 f"integer, got {v!r}")
        defines = c.get("defines", "")
        if not isinstance(defines, str) or not all(DEFINE.fullmatch(w) for w in defines.split()):
            raise MksimError(f"{where}: defines must be -DNAME=VALUE words, got {defines!r}")
        for key in ("wl", "opt"):
            if not isinstance(c.get(key, {}), dict):
                raise MksimError(f"{where}: {key} must be an object of options")
        for key in ("traces", "single_ops"):
            if not isinstance(c.get(key, False), bool):
                raise MksimError(f"{where}: {key} must be true or false")
        try:
            wl = {k: workload_option(k, "1" if v is True else "0" if v is False else str(v))
                  for k, v in c.get("wl", {}).items()}
        except ValueError as exc:
            raise MksimError(f"{where}: wl: {exc}") from None
        try:
            c["_schedule"] = case_schedule(c["model"], c["batch"], c.get("kv_len", 1024), GPU,
                                           c.get("mode", "megakernel"), wl, dict(c.get("opt", {})))
        except MksimError as exc:
            raise MksimError(f"{where}: {exc}") from None
        c["_wl"] = wl
    return plan


def _matmul(r: dict) -> dict | None:
    k = r.get("trace", {}).get("kinds", {}).get("matmul")
    return None if k is None else {"wait_us": round(k["wait_us"], 3), "compute_us": round(k["compute_us"], 3)}


def summary_row(c: dict, r: dict) -> dict[str, Any]:
    """One case of ``summary.json`` from its measured row ``r``."""
    return {"name": c["name"], "defines": c.get("defines", ""), "measured_us": round(r["measured_us"], 2),
            "spread_us": round(r["measured_spread_us"], 2), "predicted_us": round(r["predicted_us"], 2),
            "max_rel_err": r["max_rel_err"], "ok": r["ok"], "matmul": _matmul(r)}


def run_plan(plan: dict, out: Path, budget_s: float, *, measure: Callable[..., dict] = measure_row,
             clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] = print) -> list[dict]:
    """Run the plan's cases in order into ``out`` (see the module docstring); ``measure`` and
    ``clock`` are the GPU run and the time (tests give others). Returns the summary's cases."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = clock()
    rows: list[dict] = []
    public = {k: v for k, v in plan.items() if k != "cases"}
    public["cases"] = [{k: v for k, v in c.items() if not k.startswith("_")} for c in plan["cases"]]
    saved = os.environ.get("MKSIM_KERNEL_DEFINES")
    try:
        for c in plan["cases"]:
            name = c["name"]
            if clock() - t0 > budget_s:
                rows.append({"name": name, "skipped": f"the {budget_s:g} s budget was spent"})
                say(f"{name}: skipped (budget)")
            else:
                os.environ["MKSIM_KERNEL_DEFINES"] = c.get("defines", "")
                s = c["_schedule"]  # built and checked by load_plan
                try:
                    raw = str(out / f"{name}.npz") if c.get("traces") else None
                    r = measure(s, reps=c.get("reps", plan.get("reps", 20)), single_ops=c.get("single_ops", False),
                                raw_trace=raw)
                except MksimError as exc:
                    rows.append({"name": name, "error": str(exc).splitlines()[0]})
                    say(f"{name}: {rows[-1]['error']}")
                else:
                    r.update(mode=s.mode, model=c["model"], batch=c["batch"], kv_len=c.get("kv_len", 1024),
                             wl=c["_wl"], options=dict(c.get("opt", {})), pdl_trigger="early")
                    (out / f"{name}.json").write_text(json.dumps([r], separators=(",", ":")))
                    rows.append(summary_row(c, r))
                    say(f"{name}: " + "\n".join(row_lines(s.mode, r)))
            (out / "summary.json").write_text(json.dumps({"plan": public, "cases": rows}, indent=1) + "\n")
    finally:
        if saved is None:
            os.environ.pop("MKSIM_KERNEL_DEFINES", None)
        else:
            os.environ["MKSIM_KERNEL_DEFINES"] = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation megakernel-ab", description=__doc__.splitlines()[0])
    ap.add_argument("plan", type=Path, help="the plan (JSON; see the module docstring)")
    ap.add_argument("--out", type=Path, required=True, help="folder for each case's row and summary.json")
    ap.add_argument("--budget-s", type=float, default=400.0, help="begin no case after this many seconds")
    ap.add_argument("--reps", type=int, default=None, help="timed runs a case (overrides the plan's)")
    a = ap.parse_args(argv)
    try:
        if a.reps is not None and a.reps < 1:
            raise MksimError(f"--reps must be positive, got {a.reps}")
        if not a.budget_s > 0:
            raise MksimError(f"--budget-s must be positive, got {a.budget_s}")
        plan = load_plan(a.plan)
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.reps is not None:
        plan["reps"] = a.reps
        for c in plan["cases"]:
            c.pop("reps", None)
    rows = run_plan(plan, a.out, a.budget_s, say=lambda m: print(m, flush=True))
    return 1 if any("error" in r for r in rows) else 0

