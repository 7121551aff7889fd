"""How fast a library's host path issues kernels: back-to-back calls from Python, the GPU never the limit.

A stream of torch calls (``F.linear`` through cuBLAS, an element-wise add) is paced by the host when
each call's kernel is shorter than the host's work per call (Python, the dispatcher, cuBLAS's
heuristics, the launch). This microbenchmark times ``N`` back-to-back calls of one small op on one
stream (inputs resident, tiny outputs), synchronises once, and reports wall time / N: the host
interval between launches, ``runtime.launch.stream_launch_us`` of that library's implementation
profile. Each op is also timed captured in a CUDA graph (no host in the loop) to show the GPU side
is far shorter. Needs torch and a GPU; nothing from mksim.

Run: python3 -m validation host-rate --out host_rate.json [--n 2000] [--reps 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def _ops(torch: Any) -> dict[str, tuple[Callable[[], Any], str]]:
    """The ops timed: name -> (a call, what it launches)."""
    dev = torch.device("cuda")
    x1 = torch.randn(1, 2048, device=dev, dtype=torch.bfloat16)
    x8 = torch.randn(8, 2048, device=dev, dtype=torch.bfloat16)
    w = torch.randn(512, 2048, device=dev, dtype=torch.bfloat16)   # 2 MiB
    w_small = torch.randn(16, 2048, device=dev, dtype=torch.bfloat16)  # 64 KiB
    a = torch.randn(2048, device=dev, dtype=torch.bfloat16)
    f = torch.nn.functional
    return {
        "linear_b1_2MiB": (lambda: f.linear(x1, w), "cuBLAS GEMV/GEMM, batch 1, 512 x 2048 bf16"),
        "linear_b8_2MiB": (lambda: f.linear(x8, w), "cuBLAS GEMM, batch 8, 512 x 2048 bf16"),
        "linear_b1_64KiB": (lambda: f.linear(x1, w_small), "cuBLAS, batch 1, 16 x 2048 bf16"),
        "add": (lambda: a + a, "one element-wise kernel, 2048 bf16"),
    }


def measure(n: int = 2000, reps: int = 7) -> dict[str, Any]:
    import torch  # the device machine's torch; imported here so the module loads without it

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "n": n,
                           "reps": reps, "ops": {}}
    for name, (call, what) in _ops(torch).items():
        for _ in range(50):
            call()
        torch.cuda.synchronize()
        host = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            torch.cuda.synchronize()
            host.append((time.perf_counter() - t0) / n * 1e6)
        # the same op in a CUDA graph: the GPU side alone, per call
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        k = 200
        with torch.cuda.graph(g):
            for _ in range(k):
                call()
        g.replay()
        torch.cuda.synchronize()
        gpu = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            torch.cuda.synchronize()
            gpu.append(e0.elapsed_time(e1) * 1e3 / k)
        out["ops"][name] = {"what": what, "host_us_per_call": statistics.median(host), "host_us": host,
                            "graph_us_per_call": statistics.median(gpu), "graph_us": gpu}
        print(f"{name:18s} host {statistics.median(host):6.2f} us/call, in a graph {statistics.median(gpu):6.2f} "
              f"us/call ({what})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation host-rate", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args(argv)
    if a.n < 10 or a.reps < 1:
        print("error: --n must be >= 10 and --reps >= 1", file=sys.stderr)
        return 2
    try:
        doc = measure(a.n, a.reps)
    except (RuntimeError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with open(a.out, "w") as fh:
        json.dump(doc, fh, separators=(",", ":"))
    return 0

