"""Search speed: trials per second and the wall time of a 200-trial study (llama-3.2-1b, h200).

Run: python benchmarks/search_speed.py [--trials 200] [--workers 1] [--storage sqlite|memory] [--profile]
(figures in docs/search.md). It prints the wall time and this process's CPU time (with its workers'): on a
machine that other work shares, the CPU time is the steadier figure.
With --profile (one worker) it also prints where a trial's time goes (schedule building vs
simulation vs Optuna); the profiler slows the event-heavy simulation about threefold, so time the
study without it.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import tempfile
import time

from mksim.search import search


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (the workers)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--storage", choices=("sqlite", "memory"), default="sqlite",
                    help="the default SQLite storage (a new file) or --storage memory")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{os.path.join(tmp, 'speed.db')}" if a.storage == "sqlite" else "memory"
        prof = cProfile.Profile()
        t0, cpu0 = time.perf_counter(), _cpu_s()
        profiling = a.profile and a.workers == 1
        if profiling:
            prof.enable()
        res = search(a.model, a.gpu, trials=a.trials, seed=0, storage=url, workers=a.workers)
        prof.disable()
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    n = res.n_complete + res.n_pruned
    print(f"{a.model} on {a.gpu}, {a.storage}: {n} trials ({res.n_pruned} pruned) with {a.workers} worker(s) in "
          f"{wall:.1f} s ({cpu:.1f} s of CPU) = {n / wall:.2f} trials/s; best {res.best['latency_us']:.1f} us "
          f"(best baseline {min(b['latency_us'] for b in res.baselines.values()):.1f} us)")
    if profiling:
        st = pstats.Stats(prof)
        total = sum(v[3] for k, v in st.stats.items() if k[2] == "search")  # cumulative time of search()
        def cum(fn_name: str, file_part: str) -> float:
            return sum(v[3] for k, v in st.stats.items() if k[2] == fn_name and file_part in k[0])
        sim, bld = cum("simulate", "mksim/sim/_engine.py"), cum("build", "mksim/search/_space.py")
        print(f"time in simulate {sim:.1f} s ({sim / total:.0%}), in schedule building {bld:.1f} s "
              f"({bld / total:.0%}), rest (Optuna sampling and storage) {total - sim - bld:.1f} s "
              f"({(total - sim - bld) / total:.0%})")


if __name__ == "__main__":
    main()
