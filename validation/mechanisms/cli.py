"""Command line: build and run the mechanism sweeps on a GPU, or summarise saved raw files.

    python -m validation mechanisms run --out DIR [--quick] [--sweeps bw,chain,cost,opb] [--timeout S]
    python -m validation mechanisms summarize DIR [--out FILE] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import hwmodels
from validation.mechanisms import analysis, runner


def _write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, separators=(",", ":")) + "\n")


def load_dir(d: Path) -> dict[str, dict]:
    """Every ``<sweep>.json`` in ``d`` that holds data (a failed sweep's file holds only its error)."""
    raws = {}
    for s in analysis.SWEEPS:
        p = d / f"{s}.json"
        if p.exists():
            raw = json.loads(p.read_text())
            if "error" not in raw:
                raws[s] = raw
    if not raws:
        raise analysis.RawError(f"no sweep results in {d}")
    return raws


def summarize_dir(d: Path, out: Path | None = None) -> str:
    """Summarise the sweeps in ``d``; write the summary to ``out`` (default ``d/analysis.json``) and
    return the text table."""
    summary = analysis.summarize(load_dir(d))
    _write(out or d / "analysis.json", summary)
    return analysis.table(summary)


def cmd_run(args: argparse.Namespace) -> int:
    out = runner.run_all(Path(args.out), args.sweeps.split(","), args.quick, args.timeout,
                         lambda m: print(m, flush=True))
    print(summarize_dir(out))
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from validation.mechanisms import fit  # scipy: only here, the device runner stays numpy-only

    d = Path(args.dir)
    raws = load_dir(d)
    if "bw" not in raws or "bwl1" not in raws:
        raise analysis.RawError(f"{d} needs bw.json and bwl1.json")
    build = json.loads((d / "build.json").read_text()) if (d / "build.json").exists() else {}
    result = fit.fit_dram(raws["bw"], raws["bwl1"], build, hwmodels.load(args.gpu).hbm_bandwidth_Bps / 1e9)
    sync = fit.fit_sync_load(raws["opb"], result) if "opb" in raws else None
    if args.json:
        _write(Path(args.json), {"dram": result.as_dict(), "sync": asdict(sync) if sync else None})
    print(fit.overlay_lines(result, args.dir, sync), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation mechanisms", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="build mech_bench and run sweeps (needs nvcc and a GPU)")
    r.add_argument("--out", required=True)
    r.add_argument("--quick", action="store_true")
    r.add_argument("--sweeps", default=",".join(analysis.SWEEPS))
    r.add_argument("--timeout", type=float, default=120.0, help="seconds per sweep")
    s = sub.add_parser("summarize", help="summarise raw sweep files in a folder (no GPU)")
    s.add_argument("dir")
    s.add_argument("--out", help="where to write the summary JSON (default DIR/analysis.json)")
    s.add_argument("--markdown", action="store_true", help="print the headline table (markdown) instead")
    f = sub.add_parser("fit", help="fit the DRAM mechanism of mksim's model to the bandwidth sweeps (no GPU)")
    f.add_argument("dir")
    f.add_argument("--gpu", default="h200-calibrated", help="hardware file whose reachable bandwidth is used")
    f.add_argument("--json", help="also write the fit as JSON here")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "run":
            bad = [x for x in args.sweeps.split(",") if x not in analysis.SWEEPS]
            if bad:
                raise analysis.RawError(f"unknown sweep {bad[0]!r}; expected some of {', '.join(analysis.SWEEPS)}")
            return cmd_run(args)
        if args.cmd == "fit":
            return cmd_fit(args)
        if args.markdown:
            print(analysis.headline_markdown(analysis.summarize(load_dir(Path(args.dir)))), end="")
            return 0
        print(summarize_dir(Path(args.dir), Path(args.out) if args.out else None))
        return 0
    except (analysis.RawError, runner.BuildError, OSError, json.JSONDecodeError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

