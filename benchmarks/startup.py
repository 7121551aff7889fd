"""Start-up cost: CPU and wall seconds of fresh processes that run ``mksim --help``, ``import mksim`` and
``mksim compare``, medians of several runs, beside the floor (a bare ``python`` and one that imports
typer and rich, which every command line pays); against a reference checkout, both run interleaved.

Run::

    python benchmarks/startup.py [--repeat 7]               # this tree
    python benchmarks/startup.py --ref /tmp/ref --repeat 9  # this tree against a reference checkout

Each run starts a process per command (``python -m mksim ...``, ``python -c ...``) in the checkout
measured, with ``PYTHONPATH`` set to it; with ``--ref`` the reference's run of a command comes right
before this tree's, so both see the same machine load (benchmarks/README.md). CPU is the process's
user + system time with its children's (``mksim compare`` simulates its modes in worker processes),
from ``getrusage``; wall is the time until it exits. With ``--ref`` the outputs of the two trees are
compared too: a start-up change should change no output.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: (name, arguments after ``python``): what is timed, floors first
COMMANDS: list[tuple[str, list[str]]] = [
    ("python -c pass", ["-c", "pass"]),
    ("import typer, rich", ["-c", "import typer, rich.console, rich.table"]),
    ("import mksim", ["-c", "import mksim"]),
    ("mksim --help", ["-m", "mksim", "--help"]),
    ("mksim compare", ["-m", "mksim", "compare", "--model", "llama-3.2-1b", "--gpu", "h200"]),
]


def run_once(tree: str, args: list[str]) -> tuple[float, float, str]:
    """``(CPU s, wall s, stdout)`` of ``python args`` run in ``tree`` with ``PYTHONPATH`` set to it."""
    env = {**os.environ, "PYTHONPATH": tree, "COLUMNS": "100"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} in {tree} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, r.stdout


def _spread(xs: list[float]) -> str:
    """min–max around the median, as a fraction of it."""
    m = statistics.median(xs)
    return f"{(min(xs) - m) / m:+.0%}/{(max(xs) - m) / m:+.0%}" if m > 0 else "-"


def report(times: dict[str, list[tuple[float, float]]], title: str) -> dict[str, float]:
    """Print each command's median CPU and wall seconds, the CPU's spread and best; return the CPU medians."""
    print(title)
    print(f"{'command':22s} {'CPU s':>7s} {'spread':>9s} {'best':>7s} {'wall s':>7s} {'best':>7s}")
    med = {}
    for name, runs in times.items():
        cpu, wall = [c for c, _ in runs], [w for _, w in runs]
        med[name] = statistics.median(cpu)
        print(f"{name:22s} {med[name]:7.3f} {_spread(cpu):>9s} {min(cpu):7.3f} {statistics.median(wall):7.3f} "
              f"{min(wall):7.3f}")
    print()
    return med


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="processes per command and tree")
    ap.add_argument("--ref", help="a checkout of the reference commit, run interleaved with this tree")
    ap.add_argument("--only", help="the commands whose name contains this (the floors are always run)")
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    ref = str(Path(args.ref).resolve()) if args.ref else None
    commands = [(n, a) for i, (n, a) in enumerate(COMMANDS) if i < 2 or not args.only or args.only in n]
    mine: dict[str, list[tuple[float, float]]] = {n: [] for n, _ in commands}
    theirs: dict[str, list[tuple[float, float]]] = {n: [] for n, _ in commands}
    differs: set[str] = set()
    for _ in range(args.repeat):
        for name, cmd in commands:
            if ref is not None:
                cpu, wall, out_ref = run_once(ref, cmd)
                theirs[name].append((cpu, wall))
            cpu, wall, out = run_once(here, cmd)
            mine[name].append((cpu, wall))
            if ref is not None and out != out_ref:
                differs.add(name)
    m = report(mine, f"this tree ({here}), medians of {args.repeat} processes")
    if ref is not None:
        r = report(theirs, f"reference ({ref}), medians of {args.repeat} processes")
        print(f"{'command':22s} {'CPU: reference / this tree':>27s}  output")
        for name in m:
            print(f"{name:22s} {r[name] / m[name]:26.2f}x  {'DIFFERS' if name in differs else 'same'}")


if __name__ == "__main__":
    main()
