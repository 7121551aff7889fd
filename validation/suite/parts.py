"""The suite in parts: how long each case takes, parts that fit a device call, and their merge.

A device call runs for 10 minutes at most, so the suite runs as parts whose ``measured.json``
files merge into one:

- :func:`estimate_s` — a case's seconds on the GPU machine, from the ``elapsed_s`` of the same
  or a like case in an earlier run (:data:`REFERENCE`), plus :data:`START_S` once per process
  (importing torch and compiling the kernels: 22.7 s in the reference run);
- :func:`split` — ``n`` parts of about equal time, each model and batch kept in one part (its
  modes and schedules ranked against each other), and :func:`parts_needed` for a time budget;
- :func:`merge` — ``measured.json`` files into one, keyed by case name: a case measured without
  error wins over a failed or refused one, a later run over an earlier one; the runs' devices,
  dates and code are kept in ``runs`` and each case says which run it came from.

The same as a command line that needs neither typer nor rich (the GPU machine has the project's
core packages only)::

    python3 -m validation suite parts [--parts N] [--budget-s 480]
    python3 -m validation suite run --part K/N --out DIR [--traces] [--timeout-s S] [--reps 20]
    python3 -m validation suite merge DIR_OR_FILE ... --out DIR

``mksim validate suite --part K/N``, ``mksim validate parts`` and ``mksim validate merge`` are the
same functions.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mksim.errors import MksimError

from . import core as vs

__all__ = ["BUDGET_S", "REFERENCE", "START_S", "estimate_s", "main", "merge", "parse_part", "parts_needed",
           "reference_times", "refused", "select_part", "split"]

REFERENCE = vs.RESULTS / vs.MEASURED  # the run whose elapsed_s the estimates start from
START_S = 30.0     # once per process: torch imported, the kernels compiled (22.7 s in the reference run)
BUDGET_S = 480.0   # a part's estimate: 8 of a device call's 10 minutes
UNKNOWN_S = 5.0    # a case of a model the reference never ran
NEW_SCHEDULE_X = 2.0  # a megakernel schedule the reference never ran: its default's time, twice (sentinel checks twice)


def reference_times(path: Path | str = REFERENCE) -> dict[str, float]:
    """``{case name: elapsed_s}`` of an earlier run, a process's start taken out (a case that took
    over ten times its model's median is counted at the median); {} without the file."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    recs = [r for r in doc.get("cases", []) if isinstance(r.get("elapsed_s"), (int, float))]
    med = {m: statistics.median([r["elapsed_s"] for r in recs if r["model"] == m])
           for m in {r["model"] for r in recs}}
    return {r["name"]: (med[r["model"]] if r["elapsed_s"] > 10 * med[r["model"]] else float(r["elapsed_s"]))
            for r in recs}


@functools.cache
def refused(model: str, batch: int, kv_len: int = vs.KV_LEN) -> bool:
    """Whether the kernels refuse every case of ``model`` at ``batch`` (:class:`validation.suite.Refused`)."""
    try:
        vs.kernel_options(model, batch, kv_len)
    except vs.Refused:
        return True
    except MksimError:  # another problem: the case will say which
        return False
    return False


def estimate_s(case: vs.Case, ref: dict[str, float]) -> float:
    """A case's seconds (without the process's start): 0 where it is refused (:func:`refused`); its
    own time in ``ref``; else the same mode and schedule at the nearest batch of the reference,
    scaled by the batch; else (a schedule the reference never ran) its model's default megakernel
    so estimated, times :data:`NEW_SCHEDULE_X`; else :data:`UNKNOWN_S`."""
    if case.model in vs.models.names() and refused(case.model, case.batch, case.kv_len):
        return 0.0
    if case.name in ref:
        return ref[case.name]

    def like(mode: str, schedule: str) -> float | None:
        got = {b: ref[n] for b in range(1, 65) if (n := vs.Case(case.model, b, mode, schedule).name) in ref}
        if not got:
            return None
        b = min(got, key=lambda b: (abs(b - case.batch), -b))
        return got[b] * max(1.0, case.batch / b)

    own = like(case.mode, case.schedule)
    if own is not None:
        return own
    base = like("megakernel", "default")
    return base * NEW_SCHEDULE_X if base is not None else UNKNOWN_S


def split(cases: list[vs.Case], n: int, ref: dict[str, float] | None = None) -> list[list[vs.Case]]:
    """``cases`` in ``n`` parts of about equal estimated time (longest group first into the part
    with least so far), each model and batch in one part where there are at least ``n`` of them;
    each part keeps the order of ``cases``."""
    if n < 1:
        raise MksimError(f"the suite runs in 1 part or more, not {n}")
    ref = reference_times() if ref is None else ref
    groups: dict[tuple[str, int], list[vs.Case]] = {}
    for c in cases:
        groups.setdefault((c.model, c.batch), []).append(c)
    units = list(groups.values()) if len(groups) >= n else [[c] for c in cases]
    load = [0.0] * n
    where: dict[str, int] = {}
    for unit in sorted(units, key=lambda u: -sum(estimate_s(c, ref) for c in u)):
        k = load.index(min(load))
        load[k] += sum(estimate_s(c, ref) for c in unit)
        where.update((c.name, k) for c in unit)
    return [[c for c in cases if where[c.name] == k] for k in range(n)]


def part_estimate_s(part: list[vs.Case], ref: dict[str, float]) -> float:
    return START_S + sum(estimate_s(c, ref) for c in part) if part else 0.0


def parts_needed(cases: list[vs.Case], budget_s: float = BUDGET_S, ref: dict[str, float] | None = None) -> int:
    """The fewest parts whose estimates are each within ``budget_s``."""
    ref = reference_times() if ref is None else ref
    for n in range(1, len(cases) + 1):
        if all(part_estimate_s(p, ref) <= budget_s for p in split(cases, n, ref)):
            return n
    return max(len(cases), 1)


def parse_part(text: str) -> tuple[int, int]:
    """``"K/N"`` as ``(K, N)``, 1 ≤ K ≤ N, in one line when it is not."""
    k, sep, n = text.partition("/")
    try:
        kk, nn = int(k), int(n)
    except ValueError:
        kk = nn = 0
    if not sep or not 1 <= kk <= nn:
        raise MksimError(f"--part takes K/N with 1 <= K <= N (part K of N), not {text!r}")
    return kk, nn


def select_part(cases: list[vs.Case], part: str | None, ref: dict[str, float] | None = None) -> list[vs.Case]:
    """The cases of ``part`` (``"K/N"``; all of them for ``None``)."""
    if part is None:
        return list(cases)
    k, n = parse_part(part)
    return split(cases, n, ref)[k - 1]


# -- merging ---------------------------------------------------------------------------------------
def _good(r: dict) -> bool:
    return "measurement" in r and not r.get("error")


def merge(sources: list[Path | str], out_dir: Path | str | None = None) -> dict:
    """One ``measured.json`` of several (files or folders holding one), keyed by case name: a case
    measured without error wins over a failed or refused record of it, a later source over an
    earlier one. ``runs`` keeps each source's device, dates and code; each case its ``run`` (its
    index there). Written to ``out_dir/measured.json`` when ``out_dir`` is given."""
    if not sources:
        raise MksimError("merge needs at least one measured.json (or a folder holding one)")
    docs = [vs.load_measured(s) for s in sources]
    best: dict[str, dict] = {}
    runs: list[dict[str, Any]] = []
    not_begun: list[str] = []
    for i, (src, d) in enumerate(zip(sources, docs, strict=True)):
        runs.append({"source": str(src), **{k: d.get(k) for k in ("gpu", "driver", "host", "started", "date",
                                                                   "reps", "code")}})
        not_begun += d.get("not_begun") or []
        for r in d["cases"]:
            old = best.get(r["name"])
            if old is None or _good(r) or not _good(old):
                best[r["name"]] = {**r, "run": i}
    first, last = docs[0], max(docs, key=lambda d: d.get("date") or "")
    doc: dict[str, Any] = {
        "format": vs.FORMAT, "version": 1, "gpu": first.get("gpu"), "driver": first.get("driver"),
        "host": first.get("host"), "started": min((d.get("started") or "" for d in docs), default=None),
        "date": last.get("date"), "predicted_with": first.get("predicted_with"), "reps": first.get("reps"),
        "code": first.get("code"), "runs": runs, "cases": vs.ordered(list(best.values())),
        "not_begun": [n for n in dict.fromkeys(not_begun) if n not in best]}
    if len({(r["gpu"], r["driver"]) for r in runs}) > 1:
        doc["gpu"] = " / ".join(dict.fromkeys(str(r["gpu"]) for r in runs))
    if out_dir is not None:
        vs._write(Path(out_dir) / vs.MEASURED, doc, compact=True)
    return doc


# -- the plan, in words ----------------------------------------------------------------------------
def plan_lines(cases: list[vs.Case], n: int, ref: dict[str, float] | None = None) -> list[str]:
    """One line per part: its cases' groups and estimated seconds."""
    ref = reference_times() if ref is None else ref
    out = []
    for k, p in enumerate(split(cases, n, ref), 1):
        groups = ", ".join(dict.fromkeys(f"{c.model}/b{c.batch}" for c in p))
        out.append(f"part {k}/{n}: {len(p)} cases, about {part_estimate_s(p, ref):.0f} s ({groups})")
    return out


def main(argv: list[str] | None = None, say: Callable[[str], None] = lambda m: print(m, flush=True)) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation suite", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("parts", help="the standard suite's parts with their estimated seconds")
    p.add_argument("--parts", type=int, default=None, help="this many parts (default: the fewest within --budget-s)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S)
    p.add_argument("--only", action="append", default=[])
    r = sub.add_parser("run", help="run (a part of) the suite on this machine's GPU")
    r.add_argument("--out", required=True)
    r.add_argument("--part", default=None, help="K/N: part K of N (validation.suite.parts.split)")
    r.add_argument("--only", action="append", default=[], help="cases whose name contains this (repeatable)")
    r.add_argument("--reps", type=int, default=20)
    r.add_argument("--watchdog-s", type=float, default=60.0)
    r.add_argument("--timeout-s", type=float, default=None, help="begin no case after this many seconds")
    r.add_argument("--traces", action="store_true", help="keep each persistent case's raw stamps in OUT/traces/")
    r.add_argument("--resume", action="store_true", help="keep what OUT/measured.json already holds")
    m = sub.add_parser("merge", help="merge measured.json files (or folders) into OUT/measured.json")
    m.add_argument("sources", nargs="+")
    m.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "parts":
            cases = vs.select(vs.CASES, a.only)
            n = a.parts or parts_needed(cases, a.budget_s)
            for line in plan_lines(cases, n):
                say(line)
        elif a.cmd == "run":
            cases = select_part(vs.select(vs.CASES, a.only), a.part)
            doc = vs.run_suite(cases, a.out, reps=a.reps, watchdog_s=a.watchdog_s, resume=a.resume,
                               timeout_s=a.timeout_s, traces=a.traces, say=say)
            ran = [c for c in doc["cases"] if c["name"] in {x.name for x in cases}]
            say(f"{sum(_good(c) for c in ran)} measured, {sum('refused' in c for c in ran)} refused, "
                f"{sum(bool(c.get('error')) for c in ran)} failed, {len(doc['not_begun'])} not begun -> "
                f"{Path(a.out) / vs.MEASURED}")
        else:
            doc = merge(a.sources, a.out)
            say(f"{len(doc['cases'])} cases from {len(a.sources)} runs -> {Path(a.out) / vs.MEASURED}"
                + (f"; not begun: {', '.join(doc['not_begun'])}" if doc["not_begun"] else ""))
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0

