"""Run a schedule of matvec chains as the interpreter megakernel (first version) and check it.

``matvec_chain(sizes)`` is a workload of dependent matvecs (op i reads op i-1's whole output);
:func:`run_chain` builds its megakernel schedule, encodes it, runs ``interp.cu`` through CuPy,
checks the output against a float64 reference and times it with CUDA events. GPU only.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from mksim.errors import MksimError
from mksim.workload import Input, Op, Workload

from .encode import encode

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels"
ERRORS = {1: "an op counter was not reached in 2 s (a dependency never finished)",
          2: "a tile flag was not set in 2 s (a dependency never finished)"}


def matvec_chain(sizes: list[int]) -> Workload:
    """``len(sizes) - 1`` dependent matvecs: op i maps ``sizes[i]`` inputs to ``sizes[i + 1]`` outputs."""
    ops = []
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        ops.append(Op(name=f"mv{i}", kind="matmul", out_size=n, elem_bytes=4.0, flops=2.0 * k * n,
                      weight_bytes=2.0 * k * n, inputs=(Input(f"mv{i - 1}", full=True),) if i else (),
                      align=16, attrs={"k": k, "rows": 1}))
    return Workload(name=f"matvec chain {sizes}", ops=tuple(ops), tokens=1)


def run_chain(sizes: list[int], gpu: str = "h200", policy: str = "dag", reps: int = 20, threads: int = 256,
              unroll: int = 2, **options) -> dict:
    import cupy as cp

    import mksim

    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()  # every allocation, copy and launch below is ordered on this one stream
    wl = matvec_chain(sizes)
    sched = mksim.build_schedule(wl, gpu, "megakernel", policy=policy, **options)
    prog = encode(sched)
    n_sms = len(sched.queues)
    rng = np.random.default_rng(0)
    # weights as bf16 bit patterns from fp32 normals scaled by 1/sqrt(K); x0 random
    Ws, ys = [], []
    for k, n in zip(sizes, sizes[1:]):
        w = (rng.standard_normal((n, k), dtype=np.float32) * np.float32(k ** -0.5)).view(np.uint32) >> 16
        Ws.append(cp.asarray(w.astype(np.uint16)))
        ys.append(cp.full(n, cp.nan, dtype=cp.float32))
    x0 = cp.asarray(rng.standard_normal(sizes[0], dtype=np.float32))
    flag_base = np.concatenate([[0], np.cumsum(prog.op_tiles)]).astype(np.int64)
    desc = np.zeros(len(Ws), dtype=[("W", "u8"), ("x", "u8"), ("y", "u8"), ("K", "i4"), ("N", "i4"),
                                    ("flag_base", "i4"), ("pad", "i4")])
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        desc[i] = (Ws[i].data.ptr, (x0 if i == 0 else ys[i - 1]).data.ptr, ys[i].data.ptr, k, n, flag_base[i], 0)
    d_desc = cp.asarray(desc.view(np.uint8))
    d_tasks, d_qs = cp.asarray(prog.tasks), cp.asarray(prog.queue_start)
    d_deps = cp.asarray(prog.deps if len(prog.deps) else np.zeros((1, 4), np.int32))
    d_tiles = cp.asarray(prog.op_tiles)
    counters = cp.zeros(len(Ws), dtype=cp.uint32)
    flags = cp.zeros(int(flag_base[-1]), dtype=cp.uint32)
    error = cp.zeros(1, dtype=cp.int32)
    src = (HERE / "interp.cu").read_text()
    mod = cp.RawModule(code=src, options=("-std=c++17", f"-I{KERNELS}", f"-DMK_UNROLL={unroll}"))
    k = mod.get_function("mk_interp")
    smem = max(sizes[:-1]) * 4
    k.max_dynamic_shared_size_bytes = smem

    def launch():
        counters.fill(0)
        flags.fill(0)
        k((n_sms,), (threads,), (d_tasks, d_qs, d_deps, d_tiles, d_desc, counters, flags, error), shared_mem=smem,
          stream=stream)

    def wait(ev, limit_s=30.0):
        t0 = time.monotonic()
        while not ev.done:
            if time.monotonic() - t0 > limit_s:
                raise MksimError("the megakernel ran over 30 s (hung); stopping")
            time.sleep(1e-4)

    times = []
    for r in range(3 + reps):
        for y in ys:
            y.fill(cp.nan)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        launch()
        e1.record(stream)
        wait(e1)
        if int(error[0]):
            code = int(error[0])
            raise MksimError(f"megakernel failed: {ERRORS.get(code, f'no device function for opcode {code - 100}')}")
        if r >= 3:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    ref = cp.asnumpy(x0).astype(np.float64)
    for w in Ws:
        wf = (cp.asnumpy(w).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        ref = wf @ ref
    out = cp.asnumpy(ys[-1]).astype(np.float64)
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    if not np.isfinite(out).all() or err > 1e-3:
        raise MksimError(f"megakernel output is wrong: relative error {err:.2e}")
    pred = mksim.simulate(sched)
    weight_B = float(sum(2 * k * n for k, n in zip(sizes, sizes[1:])))
    med = float(np.median(times))
    return {"sizes": sizes, "policy": policy, "threads": threads, "unroll": unroll, "n_tasks": len(sched.graph), "rel_err": err, "us": times,
            "median_us": med, "GBps": weight_B / med / 1e3,
            "predicted_us": pred.latency_us - sched.gpu.launch.launch_latency_us}


def main() -> None:
    import json
    import sys

    big = [2048, 8192, 2048, 8192, 2048]
    cases = [(big, "dag", 256, 2), (big, "rr", 256, 2), ([2048] + [3072, 2048] * 8, "dag", 256, 2),
             ([4096, 14336, 4096], "dag", 256, 2)]
    # bytes in flight per SM = threads x 16 B x unroll: how far more loads in flight take this version
    cases += [(big, "dag", t, u) for t, u in ((512, 2), (512, 4), (1024, 4), (512, 8))]
    cases += [([4096, 14336, 4096], "dag", 1024, 4), ([2048] + [3072, 2048] * 8, "dag", 1024, 4)]
    out = []
    for sizes, policy, threads, unroll in cases:
        r = run_chain(sizes, policy=policy, threads=threads, unroll=unroll)
        out.append(r)
        print(f"{policy:4s} {len(sizes) - 1:2d} matvecs {sizes[:3]}... {threads:4d} threads x{unroll}: "
              f"{r['median_us']:8.1f} us measured, {r['predicted_us']:8.1f} us predicted, {r['GBps']:6.0f} GB/s, "
              f"rel err {r['rel_err']:.1e}", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
