"""A markdown table of calibrated values next to the base model's (datasheet or estimate) values.

``python -m validation.calibrate.report FITS.json`` prints it; docs/calibration.md embeds the
table for our H200 between markers, and a test keeps the two identical.
"""

from __future__ import annotations

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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m validation.calibrate.report FITS.json")
    sys.stdout.write(markdown_table(Path(sys.argv[1])))
