"""The command line the generated kernels' case suites share (``attn_suite``, ``kchunk_suite``,
``moe_suite``): ``predict OUT`` (on the CPU, before the run), ``run OUT [--only ...] [--timeout S]
[--predicted FILE]`` (on the GPU; with ``--predicted`` it compares at once into ``OUT/compare.json``) and
``compare PREDICTED MEASURED... [--json FILE]``. A bad input is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mksim.errors import MksimError


def main(argv: list[str] | None, prog: str, description: str, predict: Callable[[Path], dict],
         run: Callable[..., Any], compare: Callable[[Path, list[Path]], dict], table: Callable[[dict], str]) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=description)
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("predict", help="write OUT/predicted.json (on the CPU, before the run)")
    p.add_argument("out")
    r = sub.add_parser("run", help="run the cases on the GPU into OUT/measured.json")
    r.add_argument("out")
    r.add_argument("--only", nargs="*", default=[], help="cases whose name contains one of these")
    r.add_argument("--timeout", type=float, default=None, help="begin no case after this many seconds")
    r.add_argument("--predicted", default=None, help="predicted.json to compare the run with (OUT/compare.json)")
    c = sub.add_parser("compare", help="measured cases against the predictions made before")
    c.add_argument("predicted")
    c.add_argument("measured", nargs="+")
    c.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        if a.verb == "predict":
            for row in predict(Path(a.out))["cases"]:
                print(f"{row['name']}: {row.get('predicted_us', row.get('refused'))}")
            return 0
        if a.verb == "run":
            run(Path(a.out), a.only, a.timeout, say=print)
            if not a.predicted:
                return 0
            a.measured, a.json = [str(Path(a.out) / "measured.json")], str(Path(a.out) / "compare.json")
        doc = compare(Path(a.predicted), [Path(m) for m in a.measured])
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(table(doc))
    except MksimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
