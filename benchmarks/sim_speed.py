"""Simulator speed: tasks, events, wall time and tasks/s for decode steps on h200, and what
skipping the timeline saves.

Run: python benchmarks/sim_speed.py [--repeat N]   (figures are recorded in docs/model.md)

"sim s" is what :func:`mksim.simulate` spends on a built schedule (it runs the engine with the
cycle collector paused, as here); "events" counts SimPy's scheduled events. The second table
times ``simulate(s)`` against ``simulate(s, timeline=False)`` (best of ``--repeat`` runs each,
interleaved), and the five modes of a ``mksim compare`` of llama-3.2-1b built and simulated in
one process.
"""

from __future__ import annotations

import argparse
import time

import mksim
from mksim.schedule import MODES, build_schedule, gc_paused
from mksim.sim._engine import _Engine


def one(model: str, mode: str, tasks_per_sm: float) -> dict:
    wl = mksim.models.workload(model, batch=1, kv_len=1024)
    t0 = time.perf_counter()
    s = build_schedule(wl, "h200", mode, tasks_per_sm=tasks_per_sm)
    t1 = time.perf_counter()
    with gc_paused():
        eng = _Engine(s)
        eng.run()
        res = eng.result()
    t2 = time.perf_counter()
    events = next(eng.env._eid)  # SimPy's running count of scheduled events
    return {"model": model, "mode": mode, "x": tasks_per_sm, "tasks": len(s.graph), "events": events,
            "build_s": t1 - t0, "sim_s": t2 - t1, "tasks_per_s": len(s.graph) / (t2 - t1),
            "latency_us": res.latency_us}


def timeline_cost(schedules: list, repeat: int) -> tuple[float, float]:
    """Best wall time of simulating every schedule with and without the timeline."""
    best = {True: float("inf"), False: float("inf")}
    for _ in range(repeat):
        for keep in (True, False):
            t0 = time.perf_counter()
            for s in schedules:
                mksim.simulate(s, timeline=keep)
            best[keep] = min(best[keep], time.perf_counter() - t0)
    return best[True], best[False]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--skip-table", action="store_true", help="only the timeline comparison")
    args = ap.parse_args()
    if not args.skip_table:
        print(f"{'model':14s} {'mode':11s} {'gran':>5s} {'tasks':>7s} {'events':>8s} {'build s':>8s} {'sim s':>7s} "
              f"{'total s':>8s} {'tasks/s':>8s} {'latency us':>11s}")
        for model in ("llama-3.2-1b", "llama-3.1-8b"):
            for mode in ("graph", "megakernel"):
                base = 2.0 if mode == "graph" else 1.0
                for mult in (1, 4, 16):
                    r = one(model, mode, base * mult)
                    print(f"{r['model']:14s} {r['mode']:11s} {mult:>4d}x {r['tasks']:7d} {r['events']:8d} "
                          f"{r['build_s']:8.2f} {r['sim_s']:7.2f} {r['build_s'] + r['sim_s']:8.2f} "
                          f"{r['tasks_per_s']:8.0f} {r['latency_us']:11.1f}", flush=True)
        print()
    cases = {"llama-3.1-8b megakernel": [build_schedule("llama-3.1-8b", "h200", "megakernel")],
             "llama-3.2-1b compare (5 modes)": [build_schedule("llama-3.2-1b", "h200", m) for m in MODES]}
    print(f"{'simulate':32s} {'timeline s':>10s} {'without s':>10s} {'saved':>6s}")
    for name, schedules in cases.items():
        full, fast = timeline_cost(schedules, args.repeat)
        print(f"{name:32s} {full:10.3f} {fast:10.3f} {1 - fast / full:6.1%}", flush=True)


if __name__ == "__main__":
    main()
