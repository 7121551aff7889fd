"""Simulator speed: tasks, events, build and simulate time and tasks/s for decode steps on h200, as
medians of several runs with their spread; against a reference checkout, both run interleaved.

Run::

    python benchmarks/sim_speed.py [--repeat 5]              # this tree (figures in docs/model.md)
    python benchmarks/sim_speed.py --ref /tmp/ref --repeat 7 # this tree against a reference checkout
    python benchmarks/sim_speed.py --only megakernel         # the cases whose name contains this

Each run is a fresh process that builds and simulates every case once (after one warm-up case); with
``--ref`` the runs alternate between the reference's code and this tree's (``PYTHONPATH``), so both see
the same machine load (benchmarks/README.md). Times are CPU seconds of the process
(``time.process_time``) unless ``--wall``: on a shared machine they vary less than wall time.
"build" is ``build_schedule`` (a fresh task graph), "sim" is ``simulate`` on the built schedule (with
the cycle collector paused, as ``simulate`` does); "events" counts SimPy's scheduled events. The last
table is ``simulate(s)`` against ``simulate(s, timeline=False)`` on the same schedules.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# (name, model, mode, tasks per SM relative to the mode's default, options)
CASES: list[tuple[str, str, str, float, dict[str, Any]]] = []
for _model in ("llama-3.2-1b", "llama-3.1-8b"):
    for _mode in ("graph", "megakernel"):
        for _mult in (1, 4, 16):
            CASES.append((f"{_model} {_mode} {_mult}x", _model, _mode, _mult, {}))
for _mode in ("stream", "graph_pdl", "persistent_barrier"):
    CASES.append((f"llama-3.2-1b {_mode} 1x", "llama-3.2-1b", _mode, 1, {}))
for _label, _opts in (("sentinel", {"sync": "sentinel"}), ("flag", {"sync": "flag"}),
                      ("dynamic", {"dispatch": "dynamic"}), ("dies", {"dies": True}),
                      ("native", {"movement": "native"}), ("l2pf", {"l2_prefetch_KiB": 256.0})):
    CASES.append((f"llama-3.1-8b megakernel:{_label} 1x", "llama-3.1-8b", "megakernel", 1, _opts))


def _clock(wall: bool) -> Any:
    return time.perf_counter if wall else time.process_time


def worker(only: str | None, wall: bool) -> list[dict[str, Any]]:
    """Build and simulate every case once; one row per case."""
    import mksim
    from mksim.schedule import MODE_DEFAULTS, build_schedule, gc_paused
    from mksim.schedule import _build as build_mod
    from mksim.sim._engine import _Engine

    clock = _clock(wall)
    rows = []
    mksim.simulate(build_schedule("llama-3.2-1b", "h200", "megakernel"))  # imports, caches
    for name, model, mode, mult, opts in CASES:
        if only and only not in name:
            continue
        wl = mksim.models.workload(model, batch=1, kv_len=1024)
        base = MODE_DEFAULTS[mode].get("tasks_per_sm", 1.0)
        build_mod._RECENT_GRAPHS.clear()  # a fresh task graph, as a first build has
        t0 = clock()
        s = build_schedule(wl, "h200", mode, tasks_per_sm=base * mult, **opts)
        t1 = clock()
        with gc_paused():
            eng = _Engine(s)
            eng.run()
            res = eng.result()
        t2 = clock()
        with gc_paused():
            t3 = clock()
            mksim.simulate(s, timeline=False)
            t4 = clock()
        rows.append({"case": name, "tasks": len(s.graph), "events": next(eng.env._eid), "build_s": t1 - t0,
                     "sim_s": t2 - t1, "lean_s": t4 - t3, "latency_us": res.latency_us})
    return rows


def _run(path: str | None, only: str | None, wall: bool) -> list[list[dict[str, Any]]]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = path
    args = [sys.executable, __file__, "--worker"] + (["--only", only] if only else []) + (["--wall"] if wall else [])
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _spread(xs: list[float]) -> str:
    """min–max around the median, as a fraction of it."""
    m = _med(xs)
    return f"{(min(xs) - m) / m:+.0%}/{(max(xs) - m) / m:+.0%}" if m > 0 else "-"


def report(runs: list[list[dict[str, Any]]], title: str) -> dict[str, float]:
    """Print the medians of ``runs`` (one list of rows per run); return each case's median sim time."""
    print(title)
    print(f"{'case':38s} {'tasks':>7s} {'events':>7s} {'build s':>8s} {'sim s':>7s} {'spread':>9s} {'best s':>7s} "
          f"{'tasks/s':>8s} {'no-tl s':>8s} {'latency us':>11s}")
    med: dict[str, float] = {}
    for i, row in enumerate(runs[0]):
        sims = [r[i]["sim_s"] for r in runs]
        b, s, lean = _med([r[i]["build_s"] for r in runs]), _med(sims), _med([r[i]["lean_s"] for r in runs])
        med[row["case"]] = s
        print(f"{row['case']:38s} {row['tasks']:7d} {row['events']:7d} {b:8.3f} {s:7.3f} {_spread(sims):>9s} "
              f"{min(sims):7.3f} {row['tasks'] / s:8.0f} {lean:8.3f} {row['latency_us']:11.2f}", flush=True)
    print()
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs (processes) per tree")
    ap.add_argument("--ref", help="a checkout of the reference commit, run interleaved with this tree")
    ap.add_argument("--only", help="the cases whose name contains this")
    ap.add_argument("--wall", action="store_true", help="wall time instead of the process's CPU time")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        json.dump(worker(args.only, args.wall), sys.stdout)
        return
    here = str(Path(__file__).resolve().parent.parent)
    mine: list[list[dict[str, Any]]] = []
    ref: list[list[dict[str, Any]]] = []
    for _ in range(args.repeat):
        if args.ref:
            ref.append(_run(args.ref, args.only, args.wall))
        mine.append(_run(here, args.only, args.wall))
    unit = "wall" if args.wall else "CPU"
    m = report(mine, f"this tree ({here}), medians of {args.repeat} runs, {unit} seconds")
    if args.ref:
        r = report(ref, f"reference ({args.ref}), medians of {args.repeat} runs, {unit} seconds")
        print(f"{'case':38s} {'sim: reference / this tree':>27s}")
        for case in m:
            print(f"{case:38s} {r[case] / m[case]:26.2f}x")
        for case, row_m, row_r in zip(m, mine[0], ref[0], strict=True):
            if row_m["latency_us"] != row_r["latency_us"]:
                print(f"latency differs: {case}: {row_r['latency_us']!r} -> {row_m['latency_us']!r}")


if __name__ == "__main__":
    main()
