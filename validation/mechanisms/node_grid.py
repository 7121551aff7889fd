"""How a CUDA graph's node interval depends on the kernel's grid: chains of empty kernels.

A torch step in a CUDA graph is hundreds of small kernels of 1-8 blocks; the calibration's
``graph_node_us`` (0.70 µs on the H200) comes from chains of 132-block kernels. This times graphs of
``n`` dependent empty kernels (each block's threads exit at once) for grids of 1 to 1056 blocks and
128 or 512 threads, n = 20 and 200: (replay(200) - replay(20)) / 180 is the interval per node.
Needs CuPy and a GPU; nothing from mksim.

Run: python3 -m validation node-grid --out node_grid.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

GRIDS = (1, 2, 4, 8, 16, 33, 66, 132, 264, 528, 1056)
THREADS = (128, 512)
SRC = r'extern "C" __global__ void k_empty(int* p) { if (p && threadIdx.x == 1024) p[0] = 1; }'


def measure(reps: int = 11) -> dict[str, Any]:
    import cupy as cp  # the device machine's CuPy; imported here so the module loads without it

    kern = cp.RawKernel(SRC, "k_empty")
    stream = cp.cuda.Stream(non_blocking=True)
    out: dict[str, Any] = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "reps": reps,
                           "points": []}

    def graph_of(n: int, grid: int, threads: int):
        with stream:
            stream.begin_capture()
            for _ in range(n):
                kern((grid,), (threads,), (0,))
            return stream.end_capture()

    def replay_us(g) -> float:
        times = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            g.launch(stream)
            e1.record(stream)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
        return statistics.median(times)

    for threads in THREADS:
        for grid in GRIDS:
            g20, g200 = graph_of(20, grid, threads), graph_of(200, grid, threads)
            g20.launch(stream)
            g200.launch(stream)
            stream.synchronize()
            t20, t200 = replay_us(g20), replay_us(g200)
            node = (t200 - t20) / 180
            out["points"].append({"grid": grid, "threads": threads, "replay20_us": t20, "replay200_us": t200,
                                  "node_us": node})
            print(f"grid {grid:5d} x {threads:4d}: {node:6.3f} us per node", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation node-grid", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=11)
    a = ap.parse_args(argv)
    try:
        doc = measure(a.reps)
    except (ImportError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(a.out, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return 0

