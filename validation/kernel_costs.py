"""Per-task costs of the generated kernels' device functions, fitted to single ops.

The validation runner times every distinct op of a ``graph``-mode case alone, as one kernel, and
keeps its tasks' compute times from the kernel's trace (``Runner.time_ops`` in
:mod:`validation.megakernel.gpu`; ``cases[i]["measurement"]["single_ops"]`` of a suite's
``measured.json``). One record per op::

    {"op", "kind", "N", "K", "tiles", "us", "spread_us", "streamed_B", "GBps",
     "task_us_mean", "task_us_max", "task_B_mean", "start_spread_us"}

and, added here from the case, ``"batch"`` (rows per task; 1 where absent). :func:`fit` turns them
into the ``[runtime.kernels.<kind>]`` task costs the simulator applies (docs/model.md, "What a task
costs"), per op kind, in the form the kind's description declares (``mksim.workload.KINDS``:
``streams``, ``per_row``, and so ``cost_fields``):

- kinds that stream bytes (``matmul``, ``attn_partial``): the line ``task_us_mean = fixed +
  task_B_mean / consume`` over the shapes measured, by least squares on relative residuals (task
  times span 1 to 250 µs; plain least squares would follow the largest alone). With one byte size
  only, fixed and rate cannot be told apart: the task's time is taken as all consumption
  (``fixed = 0``, the rate its bytes over its time), so that it scales with its bytes;
- the others: ``fixed`` = the mean of ``task_us_mean``;
- kinds whose tasks do every row of the batch (``embed``, ``rmsnorm``, ``matmul``, ``rope_kv``,
  ``silu_mul``), measured at more than one batch: each row beyond the first adds ``row`` to the
  fixed part (plain least squares, a line in rows) and, for ``matmul``, ``bytes / consume_row``
  to the consumption (relative least squares, as above). Attention tasks do one sequence each.

A coefficient that comes out negative is fixed at 0 and the rest refitted. ``spread`` is the
larger of the fit's largest relative residual and the median within-op spread of the task times
(``task_us_max / task_us_mean - 1``); the note names the shapes and the residuals.

Never fit these to full steps: those are the held-out validation.

Run ``python -m validation.kernel_costs MEASURED.json [...] --out FILE``: it writes the
``[runtime.kernels.<kind>]`` tables of a calibrated overlay (hwmodels/calibrated/h200-mk-kernels.toml).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mksim.errors import MksimError
from mksim.workload import KINDS as OP_KINDS

# the kinds the generated kernels run (the only ones with single ops to fit), and their fit forms
KINDS = tuple(k.name for k in OP_KINDS.values() if k.opcode is not None)
STREAMING = tuple(k for k in KINDS if OP_KINDS[k].streams)
PER_ROW = tuple(k for k in KINDS if OP_KINDS[k].per_row)
NEEDED = ("op", "kind", "task_us_mean", "task_B_mean")


def fit(single_ops: list[dict], *, dram_bound_GBps: float | None = None) -> dict[str, dict[str, dict]]:
    """``[runtime.kernels.<kind>]`` task costs from single-op records (see the module docstring).

    Returns ``{kind: {key: {"value", "spread", "note"}}}`` for the kinds present (keys
    ``task_fixed_us``, ``consume_GBps``, ...: ``hwmodels.KernelCost``); records of kinds without
    a device function are left out.
    ``dram_bound_GBps``: records whose op streamed at least this many GB/s over the whole chip are
    DRAM-bound (their tasks wait for DRAM, not for their workers) and are left out of the fits of
    the streaming kinds, named in the note.

    >>> recs = [{"op": f"m{b}", "kind": "matmul", "task_B_mean": b, "task_us_mean": 1.0 + b / 25e3}
    ...         for b in (65536, 262144)]
    >>> {k: round(v["value"], 3) for k, v in fit(recs)["matmul"].items()}
    {'task_fixed_us': 1.0, 'consume_GBps': 25.0}
    """
    recs = [_checked(r, i) for i, r in enumerate(_as_list(single_ops))]
    # ops timed with L2 flushed before each launch (as they run in a step) are what a fit wants;
    # records without the key come from runs that timed them warm
    if any(r.get("l2") == "flushed" for r in recs):
        recs = [r for r in recs if r.get("l2") == "flushed"]
    out: dict[str, dict[str, dict]] = {}
    for kind in KINDS:
        rs = [r for r in recs if r["kind"] == kind]
        if not rs:
            continue
        left_out: list[dict] = []
        if kind in STREAMING and dram_bound_GBps is not None:
            left_out = [r for r in rs if r.get("GBps", 0.0) >= dram_bound_GBps]
            rs = [r for r in rs if r.get("GBps", 0.0) < dram_bound_GBps]
            if not rs:
                raise MksimError(f"every {kind} record streamed at {dram_bound_GBps:g} GB/s or more (DRAM-bound); "
                                 "lower --dram-bound-GBps or measure smaller shapes")
        out[kind] = _fit_kind(kind, rs, left_out)
    return out


def _as_list(single_ops: Any) -> list:
    if not isinstance(single_ops, list) or not single_ops:
        raise MksimError("no single-op records: expected a non-empty list (graph-mode cases of a measured.json "
                         "measured with single ops)")
    return single_ops


def _checked(r: Any, i: int) -> dict:
    if not isinstance(r, dict):
        raise MksimError(f"single-op record {i} is {type(r).__name__}, not an object")
    for key in NEEDED:
        if key not in r:
            raise MksimError(f"single-op record {i} ({r.get('op', '?')}) has no {key!r}")
    if not isinstance(r["kind"], str):
        raise MksimError(f"single-op record {i} ({r['op']}): kind must be a string, got {r['kind']!r}")
    for key, least in (("task_us_mean", 0.0), ("task_B_mean", 0.0), ("batch", 1.0)):
        v = r.get(key, 1)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < least \
                or (key == "task_us_mean" and v <= 0):
            raise MksimError(f"single-op record {i} ({r['op']}): {key} = {v!r}; expected a "
                             f"{'positive' if key == 'task_us_mean' else 'non-negative'} number"
                             + (" of at least 1" if key == "batch" else ""))
    return r


def _lstsq(cols: dict[str, np.ndarray], t: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """Least squares ``t ≈ Σ c_j col_j`` weighted by ``w``, every coefficient >= 0 (a negative one
    is fixed at 0 and the rest refitted); columns the data cannot tell apart are dropped last first."""
    names = list(cols)
    while True:
        A = np.column_stack([cols[n] for n in names]) * w[:, None]
        if np.linalg.matrix_rank(A) < len(names):  # e.g. more batches of one shape only
            names.pop()
            continue
        coef = np.linalg.lstsq(A, t * w, rcond=None)[0]
        neg = [n for n, c in zip(names, coef, strict=True) if c < 0]
        if not neg:
            return {n: float(c) for n, c in zip(names, coef, strict=True)} | {n: 0.0 for n in cols if n not in names}
        names.remove(min(neg, key=lambda n: coef[names.index(n)]))
        if not names:
            return {n: 0.0 for n in cols}


def _fit_kind(kind: str, rs: list[dict], left_out: list[dict]) -> dict[str, dict]:
    t = np.array([r["task_us_mean"] for r in rs], dtype=float)
    B = np.array([r["task_B_mean"] for r in rs], dtype=float)
    rows = np.array([r.get("batch", 1) if kind in PER_ROW else 1 for r in rs], dtype=float)
    extra = rows - 1
    by_rows = bool(np.ptp(rows) > 0)
    streams = kind in STREAMING and bool(B.max() > 0)
    how: str
    if streams:
        one_size = len(set(B.tolist())) == 1
        cols: dict[str, np.ndarray] = {}
        if not one_size:
            cols["fixed"] = np.ones_like(t)
        cols["per_B"] = B
        if by_rows:
            if not one_size:
                cols["row"] = extra
            cols["row_per_B"] = B * extra
        c = _lstsq(cols, t, 1.0 / t)
        how = ("one byte size only: the task's time taken as all consumption (fixed 0)" if one_size else
               "least squares on relative residuals: fixed + bytes / rate")
    else:
        cols = {"fixed": np.ones_like(t)}
        if by_rows:
            cols["row"] = extra
        c = _lstsq(cols, t, np.ones_like(t))
        how = "mean of the task times" if not by_rows else "least squares: fixed + (rows - 1) * row"
    fitted = (c.get("fixed", 0.0) + c.get("row", 0.0) * extra + B * (c.get("per_B", 0.0) + c.get("row_per_B", 0.0)
                                                                      * extra))
    rel = fitted / t - 1
    within = statistics.median(max(r.get("task_us_max", r["task_us_mean"]) / r["task_us_mean"] - 1, 0.0) for r in rs)
    worst = int(np.argmax(np.abs(rel)))
    spread = max(float(np.abs(rel).max()), within)
    shapes = ", ".join(dict.fromkeys(_shape(r) for r in rs))
    batches = ", ".join(str(b) for b in sorted({r.get("batch", 1) for r in rs}))
    note = (f"{len(rs)} single ops ({shapes}; batch {batches}); {how}; residual rms "
            f"{_pct(np.sqrt(np.mean(rel ** 2)))}, largest {_pct(rel[worst], sign=True)} ({_case(rs[worst])}); "
            f"task times within an op +{_pct(within)} (median of max/mean)")
    if left_out:
        note += "; left out as DRAM-bound: " + ", ".join(f"{_case(r)} at {r['GBps']:.0f} GB/s" for r in left_out)
    out = {"task_fixed_us": c.get("fixed", 0.0)}
    if by_rows:
        out["task_row_us"] = c.get("row", 0.0)
    if streams:
        if c.get("per_B", 0.0) > 0:
            out["consume_GBps"] = 1.0 / c["per_B"] / 1e3  # B/µs -> GB/s
        if by_rows and c.get("row_per_B", 0.0) > 0:
            out["consume_row_GBps"] = 1.0 / c["row_per_B"] / 1e3
    return {k: {"value": v, "spread": spread, "note": note} for k, v in out.items()}


def _shape(r: dict) -> str:
    """``qkv_proj 3072x2048`` (N x K), ``attn_partial 52429 B`` (bytes per task), ``silu_mul 8192``."""
    name = str(r["op"]).rsplit(".", 1)[-1]
    if r.get("K"):
        return f"{name} {r['N']}x{r['K']}"
    if r["task_B_mean"] > 1024:
        return f"{name} {r['task_B_mean']:.0f} B"
    return f"{name} {r['N']}" if r.get("N") else name


def _case(r: dict) -> str:
    where = f" {r['model']}" if r.get("model") else ""
    return f"{_shape(r)}{where} b{r.get('batch', 1)}: {r['task_us_mean']:.2f} us"


def _pct(x: float, sign: bool = False) -> str:
    return f"{x:+.1%}" if sign else f"{x:.1%}"


# -- reading measurements, writing the fragment ---------------------------------------------------
def records(docs: list[Any]) -> list[dict]:
    """Single-op records of suite ``measured.json`` documents (``cases[i].measurement.single_ops``,
    each given the case's ``batch`` and ``model``) or of plain lists of records."""
    out: list[dict] = []
    for doc in docs:
        if isinstance(doc, list):
            out += doc
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
            raise MksimError("expected a validation measured.json (with \"cases\") or a list of single-op records")
        for case in doc["cases"]:
            m = case.get("measurement") or {}
            for r in m.get("single_ops") or []:
                out.append({"batch": case.get("batch", 1), "model": case.get("model"), **r})
    return out


def _num(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.6g}"


def fragment(params: dict[str, dict[str, dict]], source: str = "calibration", header: str = "") -> str:
    """TOML ``[runtime.kernels.<kind>]`` tables of :func:`fit`'s costs, in the style of the
    calibrated overlay."""
    lines = [f"# {line}" for line in header.splitlines()] if header else []
    for kind, costs in params.items():
        lines += ["", f"[runtime.kernels.{kind}]"]
        for key, p in costs.items():
            note = p["note"].replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{key} = {{ value = {_num(p["value"])}, source = "{source}", spread = {p["spread"]:.4f}, '
                         f'note = "{note}" }}')
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.kernel_costs", description=__doc__.splitlines()[0])
    ap.add_argument("measured", nargs="+", type=Path, help="measured.json files (or folders holding one)")
    ap.add_argument("--out", type=Path, default=None, help="write the TOML lines here (default: standard output)")
    ap.add_argument("--source", default="calibration", help="the source id the lines name (default: calibration)")
    ap.add_argument("--dram-bound-GBps", type=float, default=None,
                    help="leave out of the streaming kinds' fits the ops that streamed at least this fast")
    a = ap.parse_args(argv)
    try:
        docs = []
        for p in a.measured:
            f = p / "measured.json" if p.is_dir() else p
            try:
                docs.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError) as exc:
                raise MksimError(f"{f}: cannot read ({exc.__class__.__name__}: {exc})".splitlines()[0]) from None
        params = fit(records(docs), dram_bound_GBps=a.dram_bound_GBps)
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(str(p) for p in a.measured)
    text = fragment(params, a.source, "[runtime.kernels.<kind>] task costs fitted to single ops by python -m "
                                      f"validation.kernel_costs\nfrom {names}; put these tables in the overlay")
    if a.out:
        a.out.write_text(text)
    else:
        sys.stdout.write(text)
    for kind, costs in params.items():
        for key, p in costs.items():
            print(f"{kind + '.' + key:30s} {p['value']:10.4g}   spread {p['spread']:.1%}",
                  file=sys.stderr if not a.out else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
