"""Chains of LLM projections, mksim's kernels and cuBLAS: measure (GPU) and predict (CPU).

Run: python -m validation chains run --out DIR [--quick] [--timeout S] [--reps N]
     python -m validation chains predict RAW.json [--summary OUT] [--json OUT]
     python -m validation chains fit RAW.json [--out hwmodels/profiles/cublas.toml]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mksim.errors import MksimError

from . import calibrate as K
from .cases import SEQUENCES
from .predict import format_report, report, summary_json
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


def _read(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        _fail(f"{path}: {exc.strerror or exc}")
    except json.JSONDecodeError as exc:
        _fail(f"{path}: not JSON ({exc.msg}, line {exc.lineno})")
    raise AssertionError  # _fail exits


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        _fail(f"{path}: {exc.strerror or exc}")


def cmd_predict(a: argparse.Namespace) -> int:
    raw = _read(a.raw)
    try:
        rep = report(raw, a.gpu, profiles=not a.no_profiles)
    except MksimError as exc:
        _fail(f"{a.raw}: {exc}")
    print(format_report(rep))
    if a.json:
        _write(a.json, json.dumps(rep, indent=1) + "\n")
    if a.summary:
        _write(a.summary, json.dumps(summary_json(rep, a.raw), indent=1) + "\n")
    return 0


def cmd_fit(a: argparse.Namespace) -> int:
    raw = _read(a.raw)
    try:
        K.check_fit_input(raw)
        fit = K.fit_cublas(raw, a.gpu)
    except MksimError as exc:
        _fail(f"{a.raw}: {exc}")
    print(K.fit_report(fit))
    if a.out:
        _write(a.out, K.profile_toml(fit, raw, a.raw, a.gpu))
        print(f"wrote {a.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation chains", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure the chains and single kernels on the GPU")
    r.add_argument("--out", required=True, help="directory for chains.json")
    r.add_argument("--timeout", type=float, default=200.0, help="seconds; what is left after it is skipped")
    r.add_argument("--quick", action="store_true", help="one sequence, a short sweep, 10 replays (~30 s)")
    r.add_argument("--reps", type=int, default=None, help="timed replays per case (default 25, quick 10)")
    r.add_argument("--sequences", default=None, help=f"comma-separated subset of {','.join(SEQUENCES)}")
    p = sub.add_parser("predict", help="predict the measured chains with mksim (CPU)")
    p.add_argument("raw", help="chains.json written by run")
    p.add_argument("--gpu", default="h200-calibrated", help="hardware model (default h200-calibrated); each "
                   "implementation's profile is applied to it where one exists")
    p.add_argument("--no-profiles", action="store_true", help="ideal kernels for every implementation")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--summary", default=None, help="write the issue's summary.json here")
    f = sub.add_parser("fit", help="fit the cublas profile to the run's single kernels (CPU)")
    f.add_argument("raw", help="chains.json written by run")
    f.add_argument("--gpu", default="h200-calibrated", help="hardware model the profile is measured on")
    f.add_argument("--out", default=None, help="write the profile here (hwmodels/profiles/cublas.toml)")
    a = ap.parse_args(argv)
    if a.cmd == "run" and (a.timeout <= 0 or (a.reps is not None and a.reps < 1)):
        _fail("--timeout must be > 0 and --reps >= 1")
    if a.cmd == "run" and a.sequences is not None:
        a.sequences = a.sequences.split(",")
        unknown = [s for s in a.sequences if s not in SEQUENCES]
        if unknown:
            _fail(f"unknown sequence {unknown[0]!r}; give some of {', '.join(SEQUENCES)}")
    return {"run": cmd_run, "predict": cmd_predict, "fit": cmd_fit}[a.cmd](a)

