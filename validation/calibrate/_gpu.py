"""The GPU side of calibration: CuPy microbenchmarks and the C++ launch harness.

Each ``bench_*`` function returns plain JSON-able data (lists of samples, never fitted values):
fitting happens in :mod:`validation.calibrate.fit`. Every benchmark warms up, times with CUDA
events, repeats, rotates or flushes its inputs so that DRAM is measured where DRAM is the point,
and checks what the kernel computed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from mksim.errors import MksimError

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels"
WARMUP_US = 20_000.0  # timed warm-up before the samples of each benchmark (a quarter with --quick)
WATCHDOG_S = 60.0  # no single timed region here should take more than a fraction of a second


class BenchmarkError(MksimError):
    """A benchmark computed a wrong result or hung."""


class Gpu:
    """One CUDA device with the calibration kernels compiled for it."""

    def __init__(self, quick: bool = False):
        import cupy as cp

        self.cp = cp
        self.quick = quick
        self.reps = 5 if quick else 11
        props = cp.cuda.runtime.getDeviceProperties(0)
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        self.sms = int(props["multiProcessorCount"])
        self.l2_B = int(props["l2CacheSize"])
        self.cc = f"{props['major']}.{props['minor']}"
        self.smem_optin_B = int(props.get("sharedMemPerBlockOptin")
                                or props.get("sharedMemPerMultiprocessor", 0) - 1024)
        self.driver = cp.cuda.runtime.driverGetVersion()
        self.runtime = cp.cuda.runtime.runtimeGetVersion()
        src = (HERE / "kernels.cu").read_text()
        opts = ("-std=c++17", f"-I{KERNELS}")
        self.mod = {ilp: cp.RawModule(code=src, options=opts + (f"-DILP={ilp}",)) for ilp in (1, 2, 4, 8)}
        self.k = self.mod[4]
        # Everything (data generation, checks, timed kernels) goes on this one stream, in order: a
        # benchmark must never overlap the generation of its own inputs.
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.stream.use()
        self.rng = cp.random.RandomState(20261129)
        self.flush_buf = self.random_u32(max(4 * self.l2_B, 64 << 20) // 4)
        self.sink = cp.zeros(1 << 16, dtype=cp.uint32)
        self.pad_B = 0 if self.smem_optin_B < 2 else self.smem_optin_B // 2 + 1024  # one block per SM

    # ---------------------------------------------------------------- helpers
    def random_u32(self, n: int):
        """``n`` random, non-zero 32-bit words on the device."""
        return self.rng.randint(1, (1 << 31) - 1, size=n, dtype=self.cp.int32).view(self.cp.uint32)

    def bf16_random(self, n: int):
        """``n`` finite, non-zero bf16 values (raw 16-bit words): random sign and mantissa, magnitude
        in [2^-7, 1), no denormals — the range of trained weights and of normalised activations."""
        cp = self.cp
        r = self.random_u32(n)
        exponent = cp.uint32(120) + (r >> 8) % cp.uint32(7)
        bits = ((r >> 15) & cp.uint32(1)) << 15 | exponent << 7 | (r & cp.uint32(0x7F))
        return bits.astype(cp.uint16)

    def f32_random(self, n: int, scale: float = 1.0):
        """``n`` finite, non-zero fp32 values, magnitude in [2^-7, 1) times ``scale``, random sign."""
        cp = self.cp
        return (self.bf16_random(n).astype(cp.uint32) << 16).view(cp.float32) * cp.float32(scale)

    def fn(self, name: str, ilp: int = 4, pad: bool = False):
        f = self.mod[ilp].get_function(name)
        if pad and self.pad_B:
            f.max_dynamic_shared_size_bytes = self.pad_B
        return f

    def flush(self) -> None:
        """Evict the L2 by reading a buffer four times its size (clean lines: no write-back)."""
        n_vec = self.flush_buf.size // 4
        self.fn("l2_flush")((self.sms * 4,), (512,), (self.flush_buf, np.uint64(n_vec), self.sink),
                            stream=self.stream)

    def wait(self, ev) -> None:
        """Wait for ``ev`` with a watchdog: a hung kernel ends the process with one line."""
        t0 = time.monotonic()
        while not ev.done:
            if time.monotonic() - t0 > WATCHDOG_S:
                print(f"mksim calibrate: a GPU kernel ran over {WATCHDOG_S:.0f} s (hung?); stopping", flush=True)
                os._exit(3)
            time.sleep(1e-4)

    def time_us(self, launch, reps: int | None = None, flush: bool = True, warmup: int = 1) -> list[float]:
        """Median-ready samples: µs of ``launch()`` between two events.

        Warm-up is at least ``warmup`` runs and at least WARMUP_US of measured time: on our H200 the
        first runs over freshly allocated buffers of a few hundred MiB took up to 3x longer for a
        few milliseconds (seen in the attention benchmark, 2026-11-29), so a fixed count is not
        enough.
        """
        cp = self.cp
        out: list[float] = []
        warm_runs, warm_us = 0, 0.0
        budget = WARMUP_US / (4 if self.quick else 1)
        while len(out) < (reps or self.reps):
            if flush:
                self.flush()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(self.stream)
            launch()
            e1.record(self.stream)
            self.wait(e1)
            t = cp.cuda.get_elapsed_time(e0, e1) * 1e3
            if warm_runs < warmup or (warm_us < budget and warm_runs < 500):
                warm_runs += 1
                warm_us += t
                continue
            out.append(t)
        return out

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            raise BenchmarkError(f"calibration check failed: {what}")

    # ---------------------------------------------------------------- memory
    def bench_memory(self) -> dict:
        cp = self.cp
        nbytes = (1 << 30) if self.quick else (2 << 30)
        a = self.random_u32(nbytes // 4)
        n_vec = a.size // 4
        out = cp.zeros(self.sms * 8, dtype=cp.uint32)

        # Read-only over the whole buffer (many times the L2), all SMs, 1 block of 1024 per SM.
        read = self.fn("read_sum")
        chunk = n_vec // (self.sms * 8)
        grid = self.sms * 8
        def run_read():
            read((grid,), (512,), (a, np.uint64(chunk), np.uint64(0), out), stream=self.stream)
        t_read = self.time_us(run_read)
        covered = grid * chunk * 16
        sub_ref = int(a[: covered // 4].sum(dtype=cp.uint64)) & 0xFFFFFFFF
        self.check(int(out[:grid].sum(dtype=cp.uint64)) & 0xFFFFFFFF == sub_ref, "read_sum checksum")

        # Copy: half the buffer to the other half; bytes = read + written.
        half = n_vec // 2
        src, dst = a[: half * 4], a[half * 4: 2 * half * 4]
        src_copy = src.copy()
        cpy = self.fn("copy_vec")
        def run_copy():
            cpy((self.sms * 8,), (512,), (src, dst, np.uint64(half)), stream=self.stream)
        t_copy = self.time_us(run_copy)
        self.check(bool(cp.array_equal(dst, src_copy)), "copy_vec result")

        # L2 hits: repeated passes over a region well inside the L2.
        region_B = min(self.l2_B // 4, 16 << 20)
        region_vec = region_B // 16
        passes = 20 if self.quick else 50
        acc = cp.zeros(1, dtype=cp.uint32)
        l2 = self.fn("l2_read")
        runs = [0]
        def run_l2():
            runs[0] += 1
            l2((self.sms * 4,), (512,), (a, np.uint64(region_vec), np.int32(passes), acc), stream=self.stream)
        t_l2 = self.time_us(run_l2, flush=False, warmup=2)
        region_sum = int(a[: region_vec * 4].sum(dtype=cp.uint64))
        self.check(int(acc[0]) == (region_sum * passes * runs[0]) & 0xFFFFFFFF, "l2_read checksum")
        return {"read_bytes": covered, "read_us": t_read, "copy_bytes": 2 * half * 16, "copy_us": t_copy,
                "l2_bytes": region_vec * 16 * passes, "l2_region_bytes": region_vec * 16, "l2_us": t_l2,
                "buffer_bytes": nbytes}

    def bench_latency(self) -> dict:
        """Pointer chase (one thread, one dependent load per 128-byte line) over growing buffers."""
        cp = self.cp
        sizes_MiB = [2, 8, 16, 24, 32, 48, 64, 96, 128, 256, 1024] + ([] if self.quick else [4096])
        ch = self.fn("chase")
        out = cp.zeros(1, dtype=cp.uint32)
        rows = []
        for mib in sizes_MiB:
            n = (mib << 20) // 128
            words = self.random_u32(n * 32)
            order = self.rng.permutation(n).astype(cp.uint32)
            words[order.astype(cp.int64) * 32] = cp.roll(order, -1)
            steps = 20000 if mib <= 128 else 8000
            start = int(order[0])
            def run():
                ch((1,), (1,), (words, np.uint32(start), np.int32(steps), out), stream=self.stream)
            in_l2 = mib * (1 << 20) < self.l2_B
            t = self.time_us(run, reps=3 if self.quick else 5, flush=not in_l2, warmup=1)
            self.check(int(out[0]) == int(order[steps % n]), f"pointer chase over {mib} MiB")
            rows.append({"size_bytes": mib << 20, "steps": steps, "ns_per_load": [x * 1e3 / steps for x in t]})
        return {"chase": rows}

    def bench_concurrency(self) -> dict:
        """DRAM bandwidth versus active SMs x bytes in flight per SM (warps x 16 B x loads per thread)."""
        cp = self.cp
        a = self.random_u32((1 << 30) // 4)
        out = cp.zeros(self.sms, dtype=cp.uint32)
        sm_counts = sorted({1, 2, 4, 8, 16, 32, self.sms // 4, self.sms // 2, 3 * self.sms // 4, self.sms})
        warps = [1, 2, 4, 8, 16, 32]
        ilps = [1, 4] if self.quick else [1, 2, 4, 8]
        if self.quick:
            sm_counts = [s for s in sm_counts if s in (1, 4, 16, self.sms // 2, self.sms)]
        pts = []
        for ilp in ilps:
            k = self.fn("read_sum", ilp=ilp, pad=True)
            for w in warps:
                inflight = w * 32 * 16 * ilp
                for sms in sm_counts:
                    guess_GBps = min(sms * min(inflight / 600.0, 60.0), 4800.0)
                    chunk_B = int(min(max(guess_GBps * 1e3 * 200 / sms, 256 << 10), a.nbytes // sms))
                    chunk = chunk_B // 16
                    def run():
                        k((sms,), (w * 32,), (a, np.uint64(chunk), np.uint64(0), out),
                          stream=self.stream, shared_mem=self.pad_B)
                    t = self.time_us(run, reps=3)
                    pts.append({"sms": sms, "warps": w, "ilp": ilp, "inflight_bytes": inflight,
                                "bytes": sms * chunk * 16, "us": t})
        # one result check on the last configuration
        k = self.fn("read_sum", ilp=ilps[-1], pad=True)
        k((2,), (64,), (a, np.uint64(1024), np.uint64(0), out), stream=self.stream, shared_mem=self.pad_B)
        self.stream.synchronize()
        want = [int(a[i * 4096:(i + 1) * 4096].sum(dtype=cp.uint64)) & 0xFFFFFFFF for i in range(2)]
        self.check([int(out[0]), int(out[1])] == want, "read_sum with one block per SM")
        return {"points": pts}

    def bench_boundary(self) -> dict:
        """A small memory-bound kernel's time versus its bytes, alone and as a chain in a CUDA graph."""
        cp = self.cp
        k_chain = 8 if self.quick else 16
        sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20] + ([] if self.quick else [256 << 20])
        a = self.random_u32(((sizes[-1] * k_chain) + (64 << 20)) // 4)
        out = cp.zeros(self.sms * 8, dtype=cp.uint32)
        read = self.fn("read_sum")
        rows = []
        for size in sizes:
            grid = self.sms
            chunk = max(size // 16 // grid, 1)
            stride = grid * chunk + 1024
            def one(i):
                read((grid,), (512,), (a, np.uint64(chunk), np.uint64(i * stride), out), stream=self.stream)
            alone = self.time_us(lambda: one(0))
            with self.stream:
                self.stream.begin_capture()
                for i in range(k_chain):
                    one(i)
                graph = self.stream.end_capture()
            graph.launch(self.stream)
            chain = [t / k_chain for t in self.time_us(lambda: graph.launch(self.stream))]
            last = (k_chain - 1) * stride * 4  # the chain's last kernel wrote `out`: check its sums
            want = int(a[last: last + grid * chunk * 4].sum(dtype=cp.uint64)) & 0xFFFFFFFF
            self.check(int(out[:grid].sum(dtype=cp.uint64)) & 0xFFFFFFFF == want, f"boundary chain at {size} bytes")
            rows.append({"bytes": grid * chunk * 16, "alone_us": alone, "graph_per_kernel_us": chain,
                         "chain": k_chain})
        self.stream.synchronize()
        return {"boundary": rows}

    # ---------------------------------------------------------------- sync
    def bench_sync(self) -> dict:
        cp = self.cp
        rows = {}
        state = cp.zeros(4, dtype=cp.uint32)
        arrivals = cp.zeros(1, dtype=cp.uint32)
        bar = self.fn("counter_barrier", pad=True)
        iters = 500 if self.quick else 2000
        def run_bar():
            state.fill(0)
            arrivals.fill(0)
            bar((self.sms,), (128,), (np.int32(iters), state, arrivals), stream=self.stream, shared_mem=self.pad_B)
        t = self.time_us(run_bar, flush=False)
        self.check(int(state[2]) == 0 and int(state[1]) == iters, "counter barrier generations")
        rows["counter_barrier_us"] = [x / iters for x in t]

        flags = cp.zeros(64, dtype=cp.uint32)
        sm = cp.zeros(4, dtype=cp.uint32)
        pp = self.fn("flag_pingpong", pad=True)
        rounds = 2000 if self.quick else 10000
        def run_pp():
            flags.fill(0)
            pp((2,), (32,), (np.int32(rounds), flags, sm), stream=self.stream, shared_mem=self.pad_B)
        t = self.time_us(run_pp, flush=False)
        self.check(int(flags[0]) == rounds and int(flags[32]) == rounds, "flag ping-pong rounds")
        self.check(int(sm[0]) != int(sm[1]), "ping-pong blocks on two SMs")
        rows["flag_one_way_ns"] = [x * 1e3 / (2 * rounds) for x in t]

        cnt = cp.zeros(1, dtype=cp.uint32)
        res = cp.zeros(1, dtype=cp.uint32)
        ac = self.fn("atomic_chain")
        n = 5000 if self.quick else 20000
        def run_ac():
            cnt.fill(0)
            ac((1,), (1,), (np.int32(n), cnt, np.uint32(0), res), stream=self.stream)
        t = self.time_us(run_ac, flush=False)
        self.check(int(cnt[0]) == n and int(res[0]) == (n * (n - 1) // 2) & 0xFFFFFFFF, "atomic chain")
        rows["atomic_roundtrip_ns"] = [x * 1e3 / n for x in t]
        return rows

    # ---------------------------------------------------------------- compute
    def bench_compute(self) -> dict:
        cp = self.cp
        res: dict = {}
        iters = 4096 if self.quick else 16384
        blocks, threads = self.sms * 8, 256
        outf = cp.empty(blocks * threads, dtype=cp.float32)
        clk = cp.zeros(2, dtype=cp.int64)
        fma = self.fn("fma_rate")
        b, c = np.float32(0.999), np.float32(0.001)
        t = self.time_us(lambda: fma((blocks,), (threads,), (np.int32(iters), b, c, outf, clk), stream=self.stream),
                         flush=False)
        fp = float(c) / (1 - float(b))
        want = sum(fp + (1.0 + k - fp) * float(b) ** iters for k in range(8))
        self.check(bool(cp.allclose(outf, want, rtol=1e-3)), "fma_rate result against its closed form")
        res["fma_flops"] = 2.0 * 8 * iters * blocks * threads
        res["fma_us"] = t
        cycles, ns = int(clk[0]), int(clk[1])
        res["sm_clock_MHz"] = cycles / ns * 1e3 if ns else None

        try:
            import torch
        except ImportError:
            res["gemm"] = None
            return res
        gen = torch.Generator(device="cuda").manual_seed(7)
        n = 4096 if self.quick else 8192
        res["gemm"] = {}
        for name, dtype, tf32 in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, False),
                                  ("tf32", torch.float32, True)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            A = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
            B = torch.randn(n, n, device="cuda", dtype=dtype, generator=gen)
            C = A @ B
            ref = A[:64].double() @ B.double()
            err = float((C[:64].double() - ref).norm() / ref.norm())
            self.check(err < (5e-3 if name == "tf32" else 2e-2), f"{name} GEMM relative error {err:.2e}")
            times = []
            for i in range(3 + self.reps):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                torch.matmul(A, B, out=C)
                e1.record()
                e1.synchronize()
                if i >= 3:
                    times.append(e0.elapsed_time(e1) * 1e3)
            res["gemm"][name] = {"n": n, "flops": 2.0 * n ** 3, "us": times, "rel_err": err}
            del A, B, C, ref
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.cuda.empty_cache()
        return res

    # ---------------------------------------------------------------- device functions
    def bench_device_functions(self) -> dict:
        """matvec and rmsnorm (validation/kernels/mk_device.cuh) versus size, checked against cuBLAS/CuPy."""
        cp = self.cp
        rows = []
        mv = self.fn("matvec")
        K_list = [2048, 8192]
        N_list = [256, 1024, 4096, 16384, 65536] + ([] if self.quick else [131072])
        for K in K_list:
            mv.max_dynamic_shared_size_bytes = K * 4
            for N in N_list:
                if N * K * 2 > (1 << 30):
                    continue
                W = self.bf16_random(N * K)
                x = self.f32_random(K)
                y = cp.full(N, cp.nan, dtype=cp.float32)  # poisoned: every row must be written
                rows_per_block = max(1, -(-N // (self.sms * 4)))
                rows_per_block = -(-rows_per_block // 8) * 8
                grid = -(-N // rows_per_block)
                def run():
                    mv((grid,), (256,), (W, x, y, np.int32(N), np.int32(K), np.int32(rows_per_block)),
                       stream=self.stream, shared_mem=K * 4)
                t = self.time_us(run)
                Wf = (W.astype(cp.uint32) << 16).view(cp.float32).reshape(N, K)
                ref = Wf.astype(cp.float64) @ x.astype(cp.float64)
                err = float(cp.linalg.norm(y - ref) / cp.linalg.norm(ref))
                bad = cp.where(~cp.isfinite(y))[0]
                self.check(err < 1e-4, f"matvec {N}x{K} relative error {err:.2e}; {bad.size} rows not finite "
                                       f"(first {bad[:4].tolist()}), grid {grid} x {rows_per_block} rows, "
                                       f"inputs finite: {bool(cp.isfinite(Wf).all())}, {bool(cp.isfinite(x).all())}")
                rows.append({"fn": "matvec", "N": N, "K": K, "bytes": N * K * 2 + K * 4 + N * 4, "us": t,
                             "rel_err": err, "grid": grid})
        rn = self.fn("rmsnorm")
        for n in (2048, 8192):
            for r in (1, 16, 256, 4096):
                x = self.f32_random(r * n)
                w = self.bf16_random(n)
                o = cp.empty_like(x)
                grid = min(r, self.sms * 4)
                t = self.time_us(lambda: rn((grid,), (256,), (x, w, o, np.int32(r), np.int32(n), np.float32(1e-5)),
                                            stream=self.stream))
                xr = x.reshape(r, n).astype(cp.float64)
                wf = (w.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
                ref = xr / cp.sqrt((xr * xr).mean(axis=1, keepdims=True) + 1e-5) * wf
                err = float(cp.linalg.norm(o.reshape(r, n) - ref) / cp.linalg.norm(ref))
                self.check(err < 1e-5, f"rmsnorm {r}x{n} relative error {err:.2e}")
                rows.append({"fn": "rmsnorm", "rows": r, "n": n, "bytes": 2 * r * n * 4 + n * 2, "us": t,
                             "rel_err": err, "grid": grid})
        rows += self._bench_attention()
        return {"device_functions": rows}

    def _bench_attention(self) -> list[dict]:
        """Decode attention partials (one block per KV head x split), merged and checked in float64."""
        cp = self.cp
        rows = []
        R, BG = 4, 8  # 4 query heads per KV head, batch 1 x 8 KV heads (Llama-3 shapes)
        lengths = [1024, 4096, 16384] + ([] if self.quick else [65536])
        for D in (64, 128):
            k = self.fn(f"attn_partial_d{D}_r{R}")
            threads = 256
            smem = (R * D + (threads // 32) * R * (D + 2)) * 4
            k.max_dynamic_shared_size_bytes = smem
            for L in lengths:
                splits = max(1, -(-2 * self.sms // BG))
                chunk = -(-L // splits)
                q = self.f32_random(BG * R * D, 2.0 / D ** 0.5)
                K = self.bf16_random(BG * L * D)
                V = self.bf16_random(BG * L * D)
                o = cp.empty(BG * splits * R * D, dtype=cp.float32)
                m = cp.empty(BG * splits * R, dtype=cp.float32)
                lsum = cp.empty_like(m)
                t = self.time_us(lambda: k((BG, splits), (threads,),
                                           (q, K, V, o, m, lsum, np.int32(L), np.int32(chunk)),
                                           stream=self.stream, shared_mem=smem))
                f64 = lambda a: (a.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)  # noqa: E731
                Kf, Vf = f64(K).reshape(BG, L, D), f64(V).reshape(BG, L, D)
                s = cp.einsum("grd,gld->grl", q.reshape(BG, R, D).astype(cp.float64), Kf)
                p = cp.exp(s - s.max(axis=2, keepdims=True))
                ref = cp.einsum("grl,gld->grd", p / p.sum(axis=2, keepdims=True), Vf)
                mm, ll = m.reshape(BG, splits, R), lsum.reshape(BG, splits, R)
                M = mm.max(axis=1, keepdims=True)
                c = cp.exp((mm - M).astype(cp.float64))
                out = (o.reshape(BG, splits, R, D) * c[..., None]).sum(axis=1) / (ll * c).sum(axis=1)[..., None]
                err = float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref))
                self.check(err < 1e-4, f"attention D={D} L={L} relative error {err:.2e}")
                rows.append({"fn": "attention", "D": D, "L": L, "BG": BG, "R": R, "splits": splits,
                             "bytes": 2 * BG * L * D * 2 + BG * splits * R * (D + 2) * 4, "us": t,
                             "rel_err": err, "grid": BG * splits})
        return rows


def launch_harness(quick: bool) -> dict:
    """Build and run launch_bench.cu (nvcc) and return its JSON; a missing nvcc is one line."""
    candidate = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda")) / "bin" / "nvcc"
    nvcc = shutil.which("nvcc") or (str(candidate) if candidate.is_file() else None)
    if nvcc is None:
        raise BenchmarkError("nvcc not found: the launch benchmarks are built with it; put the CUDA toolkit's "
                             "bin/ on PATH or set CUDA_PATH")
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "launch_bench"
        build = subprocess.run([nvcc, "-O2", "-std=c++17", "-arch=native", "-o", str(exe),
                                str(HERE / "launch_bench.cu")], capture_output=True, text=True, timeout=300)
        if build.returncode != 0:
            raise BenchmarkError(f"nvcc could not build launch_bench.cu: {build.stderr.strip().splitlines()[-1:]}")
        try:
            run = subprocess.run([str(exe)] + (["--quick"] if quick else []), capture_output=True, text=True,
                                 timeout=120)
        except subprocess.TimeoutExpired:
            raise BenchmarkError("launch_bench ran over 120 s (hung?); stopped") from None
        if run.returncode != 0:
            raise BenchmarkError(f"launch_bench failed: {run.stderr.strip()}")
        return json.loads(run.stdout)
