"""Chains of LLM projections, mksim's kernels and cuBLAS: measure (GPU) and predict (CPU).

Run: python -m validation.chains run --out DIR [--quick] [--timeout S] [--reps N]
     python -m validation.chains predict RAW.json [--gpu h200-calibrated] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mksim.errors import MksimError

from .cases import SEQUENCES
from .predict import format_report, report
from .runner import run


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def cmd_run(a: argparse.Namespace) -> int:
    try:
        doc = run(Path(a.out), a.timeout, quick=a.quick, reps=a.reps, sequences=a.sequences)
    except ImportError as exc:
        _fail(f"the GPU runner needs torch and CuPy: {exc}")
    return 0 if doc["cases"] and not doc["errors"] else 1


def cmd_predict(a: argparse.Namespace) -> int:
    try:
        raw = json.loads(Path(a.raw).read_text())
    except OSError as exc:
        _fail(f"{a.raw}: {exc.strerror or exc}")
    except json.JSONDecodeError as exc:
        _fail(f"{a.raw}: not JSON ({exc.msg}, line {exc.lineno})")
    try:
        rep = report(raw, a.gpu)
    except MksimError as exc:
        _fail(f"{a.raw}: {exc}")
    print(format_report(rep))
    if a.json:
        try:
            Path(a.json).write_text(json.dumps(rep, indent=1) + "\n")
        except OSError as exc:
            _fail(f"{a.json}: {exc.strerror or exc}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.chains", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure the chains and single kernels on the GPU")
    r.add_argument("--out", required=True, help="directory for chains.json")
    r.add_argument("--timeout", type=float, default=200.0, help="seconds; what is left after it is skipped")
    r.add_argument("--quick", action="store_true", help="one sequence, a short sweep, 10 replays (~30 s)")
    r.add_argument("--reps", type=int, default=None, help="timed replays per case (default 25, quick 10)")
    r.add_argument("--sequences", default=None, help=f"comma-separated subset of {','.join(SEQUENCES)}")
    p = sub.add_parser("predict", help="predict the measured chains with mksim (CPU)")
    p.add_argument("raw", help="chains.json written by run")
    p.add_argument("--gpu", default="h200-calibrated", help="hardware model (default h200-calibrated)")
    p.add_argument("--json", default=None, help="write the report here")
    a = ap.parse_args(argv)
    if a.cmd == "run" and (a.timeout <= 0 or (a.reps is not None and a.reps < 1)):
        _fail("--timeout must be > 0 and --reps >= 1")
    if a.cmd == "run" and a.sequences is not None:
        a.sequences = a.sequences.split(",")
        unknown = [s for s in a.sequences if s not in SEQUENCES]
        if unknown:
            _fail(f"unknown sequence {unknown[0]!r}; give some of {', '.join(SEQUENCES)}")
    return cmd_run(a) if a.cmd == "run" else cmd_predict(a)


if __name__ == "__main__":
    sys.exit(main())
