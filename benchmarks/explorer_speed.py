"""Explorer speed: how long the Compare page's comparison takes (target: under a second for llama-3.2-1b).

Run: python benchmarks/explorer_speed.py [--model llama-3.2-1b] [--gpu h200] [--repeat 3]   (figures in
docs/explorer.md). Exits 1 when a comparison the page runs (imports done, not yet remembered) takes a
second or more.

- "first, cold": ``explorer.data.compare_data`` in a fresh process (it imports the simulator);
- "compare_data": the same again (imports done): what ``mksim compare --json`` computes;
- "page, first": ``explorer.data.compare_run``, which the Compare page calls once its module (and the
  simulator with it) is imported, for inputs not asked before;
- "page, again": the same inputs again (remembered).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

TARGET_S = 1.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    t0 = time.perf_counter()
    from explorer import data  # imported here, timed: a cold start includes importing the simulator

    data.compare_data(a.model, a.gpu, 1, 1024, "decode")
    cold = time.perf_counter() - t0
    warm, first, again = [], [], []
    for i in range(a.repeat):
        t0 = time.perf_counter()
        data.compare_data(a.model, a.gpu, 1, 1024, "decode")
        warm.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        data.compare_run(a.model, a.gpu, 1, 1024 + i, "decode")  # inputs not asked before
        first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        data.compare_run(a.model, a.gpu, 1, 1024 + i, "decode")
        again.append(time.perf_counter() - t0)
    print(f"{a.model} on {a.gpu}, batch 1, KV 1024, decode, every mode (median of {a.repeat}):")
    print(f"  first, cold      {cold:6.3f} s")
    print(f"  compare_data     {statistics.median(warm):6.3f} s")
    print(f"  page, first      {statistics.median(first):6.3f} s   (target < {TARGET_S:g} s)")
    print(f"  page, again      {statistics.median(again) * 1e3:6.1f} ms")
    sys.exit(0 if statistics.median(first) < TARGET_S else 1)


if __name__ == "__main__":
    main()
