"""A first predicted-versus-measured check: chains of memory-bound kernels.

The calibration measured (and did not fit anything to) 16-kernel chains of a memory-bound kernel
in a CUDA graph: plain, with PDL waiting before reading, and with PDL reading first
(``launch_bench.cu``, ``memory_chain``), and the same kernel alone and as a graph chain from CuPy
(``boundary``). Here the simulator predicts those times from the calibrated hardware model alone.
(The CuPy kernel timed alone is left out: events around one launch include the GPU's side of the
launch, which the model folds into ``launch_latency_us`` as the host sees it.)

Run: python -m validation.microchain [RAW.json ...] [--gpu h200-calibrated] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import hwmodels
from mksim.schedule import build_schedule
from mksim.sim import simulate
from mksim.workload import Input, Op, Workload

HERE = Path(__file__).resolve().parent
DEFAULT_RAW = [HERE / "results" / "h200-2026-11-29" / f"run{i}.raw.json" for i in (1, 2)]
PAGE_KiB = 32.0


def chain_workload(nbytes: float, n_kernels: int, n_sms: int) -> Workload:
    """``n_kernels`` ops that each stream ``nbytes`` (one tile per SM), each after the last."""
    ops = []
    for i in range(n_kernels):
        ops.append(Op(name=f"k{i}", kind="matmul", out_size=n_sms, elem_bytes=4.0, flops=0.0,
                      weight_bytes=float(nbytes), inputs=(Input(f"k{i - 1}", full=True),) if i else ()))
    return Workload(name=f"chain of {n_kernels} x {nbytes:.0f} B", ops=tuple(ops), tokens=1)


def predict_us(gpu, nbytes: float, n_kernels: int, mode: str, **opts) -> float:
    """Simulated time per kernel (the launch latency before the first kernel left out)."""
    wl = chain_workload(nbytes, n_kernels, gpu.sm.count)
    s = build_schedule(wl, gpu, mode, tasks_per_sm=1.0, blocks_per_sm=1, **opts)
    res = simulate(s)
    return (res.latency_us - gpu.launch.launch_latency_us) / n_kernels


def compare(raws: list[dict], gpu_name: str) -> list[dict]:
    gpu = hwmodels.load(gpu_name)
    rows = []
    chains: dict[tuple[str, int], list[float]] = {}
    for raw in raws:
        for r in raw["launch"].get("memory_chain", []):
            chains.setdefault((r["mode"], r["bytes"]), []).append(statistics.median(r["us"]))
        for r in raw["boundary"]["boundary"]:
            chains.setdefault(("cupy_graph", r["bytes"]), []).append(statistics.median(r["graph_per_kernel_us"]))
    for (kind, nbytes), meas in sorted(chains.items()):
        chunk_KiB = nbytes / gpu.sm.count / 1024
        if kind in ("graph", "cupy_graph"):
            pred = predict_us(gpu, nbytes, 16, "graph")
        elif kind == "pdl_wait_first":
            pred = predict_us(gpu, nbytes, 16, "graph_pdl", prefetch_depth=0)
        else:  # pdl_read_first: the kernel reads all of its chunk before it waits
            pred = predict_us(gpu, nbytes, 16, "graph_pdl", prefetch_depth=max(1, math.ceil(chunk_KiB / PAGE_KiB)),
                              page_KiB=PAGE_KiB)
        m = statistics.mean(meas)
        rows.append({"benchmark": kind, "bytes": nbytes, "measured_us": m, "predicted_us": pred,
                     "error": pred / m - 1})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", nargs="*", type=Path, default=DEFAULT_RAW)
    ap.add_argument("--gpu", default="h200-calibrated")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    rows = compare([json.loads(p.read_text()) for p in a.raw], a.gpu)
    print(f"{'benchmark':16s} {'bytes':>10s} {'measured us':>12s} {'predicted us':>13s} {'error':>7s}")
    for r in rows:
        print(f"{r['benchmark']:16s} {r['bytes']:10d} {r['measured_us']:12.2f} {r['predicted_us']:13.2f} "
              f"{r['error']:+7.1%}")
    errs = [abs(r["error"]) for r in rows]
    print(f"mean |error| {statistics.mean(errs):.1%}, max {max(errs):.1%} over {len(rows)} cases")
    if a.json:
        a.json.write_text(json.dumps({"gpu": a.gpu, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
