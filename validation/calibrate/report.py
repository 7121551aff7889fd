"""A markdown table of calibrated values next to the base model's (datasheet or estimate) values.

``python -m validation calibrate-report FITS.json`` prints it; docs/calibration.md embeds the
table for our H200 between markers, and a test keeps the two identical.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def markdown_table(fits_path: Path) -> str:
    s = json.loads(Path(fits_path).read_text())
    rows = ["| parameter | measured | spread | run-to-run | base model | measured / base |",
            "|---|---:|---:|---:|---:|---:|"]
    for key, p in s["params"].items():
        base = s["datasheet"].get(key)
        rr = s["run_to_run"].get(key)
        ratio = f"{p['value'] / base:.2f}" if base else "-"
        rows.append(f"| `{key}` | {p['value']:g} | {p['spread']:.1%} | {'-' if rr is None else f'{rr:.1%}'} | "
                    f"{'-' if base is None else f'{base:g}'} | {ratio} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m validation calibrate-report FITS.json``: print the table."""
    ap = argparse.ArgumentParser(prog="python -m validation calibrate-report", description=__doc__.splitlines()[0])
    ap.add_argument("fits", type=Path, help="the fits summary a calibration wrote (NAME.fits.json)")
    a = ap.parse_args(argv)
    try:
        table = markdown_table(a.fits)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a missing file, not JSON, not a fits summary
        print(f"error: {a.fits}: not a calibration's fits summary ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 2
    sys.stdout.write(table)
    return 0
