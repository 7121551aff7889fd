"""Where the tests' time goes, from the CPU times ``tests/cputime.py`` records, and which ``slow`` marks are
wrong (a test over ``--over`` seconds of CPU without the mark, or one under ``--under`` with it).

Run::

    rm -f /tmp/mksim-test-cputime.jsonl && python -m pytest -p tests.cputime
    python benchmarks/test_times.py                  # by file, the heaviest tests, the marks to change
    python benchmarks/test_times.py --top 50 --over 1.0 --under 0.3
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLOW_IDS = ROOT / "tests" / "slow_ids.txt"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", nargs="?", default="/tmp/mksim-test-cputime.jsonl")
    ap.add_argument("--top", type=int, default=25, help="how many of the heaviest tests and files to list")
    ap.add_argument("--over", type=float, default=1.0, help="CPU seconds over which a test should be slow")
    ap.add_argument("--under", type=float, default=0.25, help="CPU seconds under which a slow test need not be")
    ap.add_argument("--write", action="store_true",
                    help="make tests/slow_ids.txt the tests over --over whose code has no slow mark")
    args = ap.parse_args(argv)
    path = Path(args.file)
    if not path.is_file():
        raise SystemExit(f"error: no such file {path}; run python -m pytest -p tests.cputime first")
    rows = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        rows[r["id"]] = r | {"total": r["cpu"] + r["children"]}  # a test run again: its last run
    quick = [r for r in rows.values() if not r["slow"]]
    print(f"{len(rows)} tests, {sum(r['total'] for r in rows.values()):.1f} s of CPU; "
          f'-m "not slow": {len(quick)} tests, {sum(r["total"] for r in quick):.1f} s')
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows.values():
        f = by_file[r["id"].split("::")[0]]
        f[0] += r["total"]
        f[1] += 0 if r["slow"] else r["total"]
        f[2] += 1
    print(f"\n{'CPU s':>8} {'quick s':>8} {'tests':>6}  file")
    for name, (total, fast, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{total:8.1f} {fast:8.1f} {n:6d}  {name}")
    print(f"\n{'CPU s':>8} {'child s':>8} {'slow':>5}  test")
    for r in sorted(rows.values(), key=lambda r: -r["total"])[:args.top]:
        print(f"{r['total']:8.2f} {r['children']:8.2f} {'yes' if r['slow'] else '':>5}  {r['id']}")
    unmarked = sorted((r for r in quick if r["total"] > args.over), key=lambda r: -r["total"])
    overmarked = sorted((r for r in rows.values() if r["slow"] and r["total"] < args.under), key=lambda r: r["total"])
    print(f"\nover {args.over:g} s without the slow mark: {len(unmarked)}")
    for r in unmarked:
        print(f"{r['total']:8.2f}  {r['id']}")
    print(f"\nslow but under {args.under:g} s: {len(overmarked)}")
    for r in overmarked:
        print(f"{r['total']:8.2f}  {r['id']}")
    if args.write:  # the list becomes the tests over --over whose code has no mark; ids this run did not see stay
        old = [x for x in SLOW_IDS.read_text().splitlines() if x.strip()] if SLOW_IDS.is_file() else []
        head = [x for x in old if x.startswith("#")] or [
            "# tests over about 1 s of CPU without a slow mark in their code: tests/conftest.py marks them slow",
            "# (written by python benchmarks/test_times.py --write from a run of python -m pytest -p tests.cputime)"]
        listed = [r for r in rows.values() if r.get("listed")]
        fast = {r["id"] for r in listed if r["total"] <= args.over}
        ids = sorted(({x for x in old if not x.startswith("#")} - fast)
                     | {r["id"] for r in (*unmarked, *listed) if r["total"] > args.over})
        SLOW_IDS.write_text("\n".join([*head, *ids]) + "\n")
        print(f"\nwrote {len(ids)} ids to {SLOW_IDS}")


if __name__ == "__main__":
    main()
