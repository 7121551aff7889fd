"""Run a schedule on the GPU as mksim's generated kernels, check it against torch and time it.

:func:`measure` takes a schedule of any mode: ``megakernel`` and ``persistent_barrier`` launch the
persistent kernel of ``mk_kernel.cu`` once; ``stream``, ``graph`` and ``graph_pdl`` launch its
per-op kernel once per op, from the host, as a CUDA graph, or as a graph whose kernels are
captured with programmatic stream serialisation (PDL). All modes run the same device functions.

Correctness first, every call: the outputs (and the KV-cache slot the step appends) are poisoned
with NaN, the step runs once, every op's output is compared with torch's (``reference.py``).
Then the step is timed with CUDA events after a warm-up: median and p90 - p10 of ``reps`` runs.
A kernel that does not finish within ``watchdog_s`` is reported as hung (the device side gives up
its own waits after 2 s and sets an error code, so this is the last resort).

With ``sync="sentinel"`` (megakernel) a step has two sets of outputs and KV caches and steps
alternate between them (``SentinelPlan`` in program.py): each step resets the other set in the
kernel, so the timed steps include their reset and poll data no host fill has touched. The check
runs twice: once on set 0 after the host's poison, and once more after the timed steps on set 1,
which only the kernel reset (``recycled_max_rel_err``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mksim.errors import MksimError
from validation.calibrate import NoGPUError

from . import program as P
from . import reference
from .encode import opcode_defines

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent / "kernels"
SOURCES = (HERE / "mk_kernel.cu", KERNELS / "mk_ops.cuh", KERNELS / "mk_device.cuh")
ERRORS = {1: "an op counter was not reached in 2 s (a dependency never finished)",
          2: "a tile flag was not set in 2 s (a dependency never finished)",
          3: "a grid barrier was not reached in 2 s",
          4: "a shared-memory page was not filled or freed in 2 s (the weight pipeline stalled)",
          5: "no attention device function for this head shape in this build (program.attn_defines)",
          6: "an unknown opcode in the task table",
          7: "no matmul device function for this batch",
          8: "polled data kept its sentinel for 2 s (sync=sentinel: a producer never wrote it)",
          9: "fewer row-group slots than one page's row groups (program.acc_rows)",
          10: "a k-chunked matmul task without the slots or chunk shape it needs (program.check_kc_slots), or "
              "a build without the chunked walk (MK_MM=1)"}
WARMUP_MS = 20.0
L2_FLUSH_B = 256 << 20  # written before each single-op launch: over four times the H200's 60 MB L2
kernel_options = P.kernel_options
# where mk_chain triggers launch_dependents under graph_pdl (MK_PDL_TRIGGER in mk_kernel.cu):
# "early" (the default) at the kernel's start, "late" after the task's main loop
PDL_TRIGGERS = {"early": 0, "late": 1}


def compile_options(pdl_trigger: str = "early", defines: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The flags the kernels are compiled with (NVRTC here; ``nvcc -arch=sm_90 -c`` takes the same):
    C++17, the include path, the worker warps, the op kinds' opcodes (:func:`.encode.opcode_defines`),
    the PDL trigger's position (:data:`PDL_TRIGGERS`), a plan's ``defines`` (``Plan.defines``: its
    attention's template instance, :func:`.program.attn_defines`) and an experiment's
    ``MKSIM_KERNEL_DEFINES`` (``-DNAME=VALUE ...``)."""
    if pdl_trigger not in PDL_TRIGGERS:
        raise MksimError(f"unknown PDL trigger {pdl_trigger!r}; give one of {', '.join(PDL_TRIGGERS)}")
    extra = tuple(os.environ.get("MKSIM_KERNEL_DEFINES", "").split())
    return ("-std=c++17", f"-I{KERNELS}", f"-DMK_CONSUMERS={P.CONSUMERS}", *opcode_defines(),
            f"-DMK_PDL_TRIGGER={PDL_TRIGGERS[pdl_trigger]}", *defines, *extra)


@contextlib.contextmanager
def kernel_defines(defines: str) -> Iterator[None]:
    """``MKSIM_KERNEL_DEFINES`` set to ``defines`` (``-DNAME=VALUE ...``) inside the block, as it was after it:
    a build of an A/B (what :func:`compile_options` and a :class:`Runner` made inside compile)."""
    old = os.environ.get("MKSIM_KERNEL_DEFINES")
    os.environ["MKSIM_KERNEL_DEFINES"] = defines
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MKSIM_KERNEL_DEFINES", None)
        else:
            os.environ["MKSIM_KERNEL_DEFINES"] = old


def _cupy():
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError
        return cp
    except Exception:
        raise NoGPUError("no CUDA GPU (or no CuPy) here; run validation on a machine with an NVIDIA GPU") from None


# -- the driver's cuLaunchKernelEx, for launches with programmatic stream serialisation ----------
class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("val", ctypes.c_int * 16)]  # val: a 64-byte union


class _Config(ctypes.Structure):
    _fields_ = [("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint), ("bx", ctypes.c_uint),
                ("by", ctypes.c_uint), ("bz", ctypes.c_uint), ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attr)), ("n_attrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _Launch:
    """One prepared launch of a kernel: its config and argument block, kept alive together."""

    _lib: ctypes.CDLL | None = None

    def __init__(self, func_ptr: int, grid: int, threads: int, smem: int, stream_ptr: int, args: list, pdl: bool):
        if _Launch._lib is None:
            _Launch._lib = ctypes.CDLL("libcuda.so.1")
            _Launch._lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                                      ctypes.c_void_p]
        self.lib = _Launch._lib
        self.attr = _Attr()
        self.attr.id = _PROGRAMMATIC_STREAM_SERIALIZATION
        self.attr.val[0] = 1  # programmaticStreamSerializationAllowed
        self.cfg = _Config(grid, 1, 1, threads, 1, 1, smem, stream_ptr, ctypes.pointer(self.attr), 1 if pdl else 0)
        self.args = args
        self.argv = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self.func = func_ptr

    def __call__(self) -> None:
        rc = self.lib.cuLaunchKernelEx(ctypes.byref(self.cfg), self.func, self.argv, None)
        if rc != 0:
            raise MksimError(f"cuLaunchKernelEx failed with CUDA error {rc}")


class _Unpacking(dict):
    """Buffers as torch tensors; those in ``packed`` (tensor-core weights in fragment order) unpacked
    each time they are read, not kept: a step's weights unpacked all at once would be a second copy of
    them (a Mixtral step's 93 GB does not fit twice)."""

    def __init__(self) -> None:
        super().__init__()
        self.packed: dict[str, P.Buffer] = {}

    def __getitem__(self, name: str):
        a = super().__getitem__(name)
        return P.unpack_buffer(a, self.packed[name]) if name in self.packed else a


class Runner:
    """A planned schedule's buffers and kernels on the GPU."""

    def __init__(self, schedule, seed: int = 0, source_dir: Path | None = None, pdl_trigger: str = "early"):
        cp = self.cp = _cupy()
        self.schedule = schedule
        self.plan = plan = P.plan(schedule, seed)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.stream.use()  # every allocation, fill and launch below is ordered on this one stream
        self.sources = []
        if source_dir is not None:
            source_dir = Path(source_dir)
            source_dir.mkdir(parents=True, exist_ok=True)
            for src in SOURCES:
                (source_dir / src.name).write_text(src.read_text())
                self.sources.append(str(source_dir / src.name))
        options = compile_options(pdl_trigger, plan.defines)
        if source_dir is not None:  # the flags too: the opcodes are not in the sources
            (source_dir / "compile_options.txt").write_text(" ".join(options) + "\n")
            self.sources.append(str(source_dir / "compile_options.txt"))
        mod = cp.RawModule(code=SOURCES[0].read_text(), options=options)
        self.k_persistent = mod.get_function("mk_persistent")
        self.k_chain = mod.get_function("mk_chain")
        for k in (self.k_persistent, self.k_chain):
            k.max_dynamic_shared_size_bytes = plan.smem_B
        rng = cp.random.default_rng(seed)
        self.bufs = {name: self._alloc(name, b, rng) for name, b in plan.buffers.items()}
        g = plan.graph  # the tasks the kernel runs (an MoE step's: validation/megakernel/moe.py)
        for i, op in enumerate(schedule.workload.ops):
            self.bufs[f"bounds:{op.name}"][...] = cp.asarray(g.bounds[i].astype(np.int32))
        sp = plan.sentinel
        if sp is not None:  # the second set of outputs and KV caches (steps alternate)
            for name in sp.twins:
                self.bufs[P.twin(name, 1)] = twin = self.bufs[name].copy()
                if name.startswith(("kc:", "vc:")):  # the slot the step appends starts as the sentinel
                    twin[:, :, schedule.workload.kv_len].fill(0xFFFF)
        addrs = [{name: self.bufs[P.twin(name, p) if sp is not None and name in sp.twins else name].data.ptr
                  for name in plan.buffers} for p in (0, 1)]
        prog = plan.program
        self.d_tasks = cp.asarray(prog.tasks)
        self.d_qs = cp.asarray(prog.queue_start)
        self.d_deps = cp.asarray(prog.deps if len(prog.deps) else np.zeros((1, 4), np.int32))
        self.d_tiles = cp.asarray(prog.op_tiles)
        n_ops = len(schedule.workload.ops)
        self.counters = cp.zeros(n_ops, dtype=cp.uint32)
        self.flags = cp.zeros(int(np.sum(prog.op_tiles)), dtype=cp.uint32)
        self.barrier = cp.zeros(1, dtype=cp.uint32)
        self.error = cp.zeros(1, dtype=cp.int32)
        self.trace = cp.zeros((len(prog.tasks), 4), dtype=cp.uint64)
        self.d_keep: list = []  # per-parity tables the parameters point to
        self.param_sets = [self._params(p, addrs, n_ops) for p in ((0, 1) if sp is not None else (0,))]
        self.d_params = self.param_sets[0]
        self.parity = 0  # the output set the next megakernel step uses (sync="sentinel")
        self.graph: Any = None  # a cupy.cuda.graph.Graph once captured (cupy ships no type stubs)
        self.launches: list[_Launch] = []
        if schedule.mode in ("stream", "graph", "graph_pdl"):
            func = self.k_chain.kernel.ptr
            pdl = schedule.mode == "graph_pdl"
            for i in range(n_ops):
                args = [ctypes.c_uint64(self.d_params.data.ptr), ctypes.c_int(int(g.op_first[i]))]
                self.launches.append(_Launch(func, int(g.n_tiles[i]), P.THREADS, plan.smem_B, self.stream.ptr, args,
                                             pdl))
        self.stream.synchronize()

    def _params(self, parity: int, addrs: list[dict[str, int]], n_ops: int):
        """The kernel parameters of steps on output set ``parity`` (0 unless sync="sentinel")."""
        cp, plan = self.cp, self.plan
        sp = plan.sentinel
        d_ops = cp.asarray(P.op_table(plan, addrs[parity]).view(np.uint8))
        params = np.zeros(1, dtype=P.PARAM_FIELDS)
        for f, a in zip(P.PARAM_PTR_FIELDS, (self.d_tasks, self.d_qs, self.d_deps, self.d_tiles, d_ops,
                                             self.counters, self.flags, self.barrier, self.error, self.trace),
                        strict=True):
            params[0][f] = a.data.ptr
        for f, v in zip(P.PARAM_INT_FIELDS, (n_ops, plan.page_B, plan.depth, plan.x_B,
                                             self.schedule.workload.batch * plan.acc_rows, plan.acc_rows,
                                             int(plan.ahead), plan.l2_lead_B), strict=True):
            params[0][f] = v
        self.d_keep.append(d_ops)
        if sp is not None:  # poll this set's outputs, reset the other set's
            polls = cp.asarray(P.poll_table(sp, addrs[parity]).view(np.uint8))
            deps = cp.asarray(sp.poll_deps if len(sp.poll_deps) else np.zeros((1, 2), np.int32))
            resets = cp.asarray(P.reset_table(sp, addrs[1 - parity]).view(np.uint8))
            self.d_keep += [polls, deps, resets]
            for f, a in zip(P.SENTINEL_PTR_FIELDS, (polls, deps, resets), strict=True):
                params[0][f] = a.data.ptr
            params[0]["n_resets"] = len(sp.resets)
            params[0]["sentinel"] = 1
        return cp.asarray(params.view(np.uint8))

    def _alloc(self, name: str, b: P.Buffer, rng):
        cp = self.cp
        n = int(np.prod(b.shape))
        if b.fill == "tokens":
            return rng.integers(0, int(b.scale), size=b.shape, dtype=np.int64).astype(cp.int32)
        if b.fill == "rope":
            wl = self.schedule.workload
            return cp.asarray(P.rope_table(wl.model.head_dim, b.scale, wl.kv_len))
        if b.fill == "bounds":
            return cp.zeros(b.shape, dtype=cp.int32)
        if b.dtype == "f32":  # all ones: the sentinel of sync="sentinel" (a NaN, as poison)
            return cp.full(b.shape, 0xFFFFFFFF, dtype=cp.uint32).view(cp.float32)
        out = cp.empty(n, dtype=cp.uint16)
        if b.fill == "poison":
            out.fill(0xFFFF)
        else:
            chunk = 1 << 26
            for s in range(0, n, chunk):
                e = min(n, s + chunk)
                x = rng.standard_normal(e - s, dtype=cp.float32)
                x = 1.0 + 0.1 * x if b.fill == "norm" else x * b.scale
                u = x.astype(cp.float32).view(cp.uint32)
                out[s:e] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
        return out.reshape(b.shape)

    # -- running -----------------------------------------------------------------------------
    def _enqueue(self) -> None:
        mode = self.schedule.mode
        if mode in ("megakernel", "persistent_barrier"):
            self.counters.fill(0)
            self.flags.fill(0)
            self.barrier.fill(0)
            self._record_start()
            params = self.param_sets[self.parity]
            self.parity = (self.parity + 1) % len(self.param_sets)
            self.k_persistent((len(self.schedule.queues),), (P.THREADS,),
                              (params, np.int32(mode == "persistent_barrier")), shared_mem=self.plan.smem_B,
                              stream=self.stream)
        elif mode == "stream":
            self._record_start()
            for launch in self.launches:
                launch()
        else:
            if self.graph is None:
                self.stream.begin_capture()
                for launch in self.launches:
                    launch()
                self.graph = self.stream.end_capture()
            self._record_start()
            self.graph.launch(self.stream)
        self.e1.record(self.stream)

    def _record_start(self) -> None:
        self.e0, self.e1 = self.cp.cuda.Event(), self.cp.cuda.Event()
        self.e0.record(self.stream)

    def run_once(self, watchdog_s: float = 60.0) -> float:
        """One step; its GPU time in µs (CUDA events)."""
        self._enqueue()
        t0 = time.monotonic()
        while not self.e1.done:
            if time.monotonic() - t0 > watchdog_s:
                raise MksimError(f"the {self.schedule.mode} kernel ran over {watchdog_s:g} s (hung); stopping — "
                                 "this process's GPU context is lost, start a new one")
            time.sleep(2e-5)
        code = int(self.error[0])
        if code:
            raise MksimError(f"the {self.schedule.mode} kernel failed: {ERRORS.get(code, f'error code {code}')}")
        return self.cp.cuda.get_elapsed_time(self.e0, self.e1) * 1e3

    def poison(self) -> None:
        """Every output and the KV-cache slot the step appends to all-ones bytes (NaN; the sentinel
        of sync="sentinel"), in output set 0."""
        for name in self.plan.outputs:
            a = self.bufs[name]
            a.view(self.cp.uint16 if a.dtype == self.cp.uint16 else self.cp.uint32).fill(
                0xFFFF if a.dtype == self.cp.uint16 else 0xFFFFFFFF)
        pos = self.schedule.workload.kv_len
        for name, a in self.bufs.items():
            if name.startswith(("kc:", "vc:")) and "@" not in name:
                a[:, :, pos].fill(0xFFFF)

    def torch_buffers(self, parity: int = 0) -> dict:
        """The plan's buffers as torch tensors (those of output set ``parity`` under their plain names)."""
        import torch

        sp = self.plan.sentinel
        out = _Unpacking()
        for name in self.plan.buffers:
            a = self.bufs[P.twin(name, parity) if sp is not None and name in sp.twins else name]
            if a.dtype == self.cp.uint16:
                out[name] = torch.from_dlpack(a.view(self.cp.int16)).view(torch.bfloat16)
                if self.plan.buffers[name].layout.startswith("mma"):  # the weight the packed array holds, when read
                    out.packed[name] = self.plan.buffers[name]
            else:
                out[name] = torch.from_dlpack(a)
        return out

    def check(self, watchdog_s: float = 60.0) -> tuple[dict[str, float], dict[str, float]]:
        """Poison, run once, compare every op's output with torch. Two relative errors per op: with
        the op's inputs taken from the kernel (its own error), and end to end."""
        self.poison()
        self.parity = 0
        self.run_once(watchdog_s)
        return self._compare(0)

    def check_recycled(self, watchdog_s: float = 60.0) -> tuple[dict[str, float], dict[str, float]]:
        """sync="sentinel": run a step on output set 1 as the timed steps do, its outputs reset by
        the step before (no host poison), and compare them with torch as :meth:`check` does."""
        if self.plan.sentinel is None:
            raise MksimError("check_recycled is for sync=sentinel schedules")
        if self.parity == 0:
            self.run_once(watchdog_s)
        self.run_once(watchdog_s)
        return self._compare(1)

    def _compare(self, parity: int) -> tuple[dict[str, float], dict[str, float]]:
        self.stream.synchronize()
        tb = self.torch_buffers(parity)
        ops = self.schedule.workload.ops
        local = reference.run(self.plan, tb, local=True)
        rows = self.plan.ops
        e_local = {op.name: reference.op_rel_err(op, r, tb[n], local[n], tb)
                   for op, r, n in zip(ops, rows, self.plan.outputs, strict=True)}
        del local
        e2e = reference.run(self.plan, tb)
        e_e2e = {op.name: reference.op_rel_err(op, r, tb[n], e2e[n], tb)
                 for op, r, n in zip(ops, rows, self.plan.outputs, strict=True)}
        return e_local, e_e2e

    def trace_summary(self) -> dict:
        """Per op kind, from the last run's %globaltimer stamps: tasks, mean µs waiting for inputs,
        computing and publishing, and the weight bandwidth of a computing SM."""
        tr = self.cp.asnumpy(self.trace).astype(np.int64)
        prog, g = self.plan.program, self.plan.graph
        ops = self.schedule.workload.ops
        t0 = tr[:, 0][tr[:, 0] > 0].min()
        out: dict = {"span_us": float((tr[:, 3].max() - t0) / 1e3), "kinds": {}}
        streamed = (g.weight_bytes + g.kv_read_bytes)[prog.task_id]
        for kind in sorted({op.kind for op in ops}):
            sel = np.array([ops[o].kind == kind for o in prog.tasks[:, 1]])
            w, c, p = (np.diff(tr[sel], axis=1) / 1e3).T
            out["kinds"][kind] = {"tasks": int(sel.sum()), "wait_us": float(w.mean()), "compute_us": float(c.mean()),
                                  "publish_us": float(p.mean()),
                                  "GBps_per_sm": float(streamed[sel].sum() / max(c.sum(), 1e-9) / 1e3)}
        moe = self._moe_trace(tr)
        if moe:
            out["moe"] = moe
        return out

    def _moe_trace(self, tr: np.ndarray) -> dict:
        """An MoE step's expert tasks split by whether their slot was active (the kernel's route tables):
        ``expert_active`` and ``expert_exit`` (the early exit of a slot past the active experts), as the
        kinds above; and per MoE layer, means over the layers: ``router_to_topk_us`` (the router's last
        task finished to the top-k's) and ``topk_to_expert_us`` (the top-k finished to the first expert
        task's dependencies met, as its SM's waiter saw them)."""
        g, prog = self.plan.graph, self.plan.program
        per = getattr(g, "per", None)
        if per is None:
            return {}
        ops = self.schedule.workload.ops
        idx = {op.name: i for i, op in enumerate(ops)}
        count = {}
        for op, out in zip(ops, self.plan.outputs, strict=True):
            if op.kind == "topk":
                count[op.layer] = int(self.cp.asnumpy(self.bufs[out][:1])[0])
        t = prog.task_id
        op_of = g.op_of[t]
        is_exp = per[op_of] > 0
        slot = np.where(is_exp, g.tile_of[t] // np.maximum(per[op_of], 1), 0)
        layer_count = np.array([count.get(op.layer, 0) if op.layer is not None else 0 for op in ops])
        active = is_exp & (slot < layer_count[op_of])
        res: dict = {}
        for name, sel in (("expert_active", active), ("expert_exit", is_exp & ~active)):
            if sel.any():
                w, c, p = (np.diff(tr[sel], axis=1) / 1e3).T
                res[name] = {"tasks": int(sel.sum()), "wait_us": float(w.mean()), "compute_us": float(c.mean()),
                             "publish_us": float(p.mean())}
        lags: dict[str, list[float]] = {"router_to_topk_us": [], "topk_to_expert_us": []}
        for L in sorted(count):
            rows = {n: np.flatnonzero(op_of == idx[f"L{L}.{n}"]) for n in ("router", "topk", "experts_gate_up")
                    if f"L{L}.{n}" in idx}
            if len(rows) < 3:
                continue
            done = tr[rows["topk"], 3].max()
            lags["router_to_topk_us"].append(float(done - tr[rows["router"], 3].max()) / 1e3)
            lags["topk_to_expert_us"].append(float(tr[rows["experts_gate_up"], 1].min() - done) / 1e3)
        res.update({k: float(np.mean(v)) for k, v in lags.items() if v})
        return res

    def time(self, reps: int = 20, watchdog_s: float = 60.0) -> list[float]:
        t_end = time.monotonic() + WARMUP_MS / 1e3
        n = 0
        while n < 3 or time.monotonic() < t_end:
            self.run_once(watchdog_s)
            n += 1
        return [self.run_once(watchdog_s) for _ in range(reps)]

    def time_ops(self, reps: int = 10, watchdog_s: float = 60.0, cold: bool = True) -> list[dict]:
        """Each distinct op (kind and shape) of a chain mode run alone as one kernel: median µs of
        ``reps`` launches between CUDA events, and the bytes it streams per µs; each record names
        the weight ring it ran with (``page_KiB``, ``depth``: its pages, what validation.kernel_costs
        fits a cost per page to).

        ``cold``: before every launch, outside the events, write a buffer of several L2 sizes, so
        that the op's weights, KV cache and inputs come from DRAM as they do in a step, where the
        ops before it stream far more than L2 holds (run hot, the small ops measured 1.3-2.5x
        faster alone than in the step: docs/validation-log.md)."""
        if not self.launches:
            return []
        g, ops = self.plan.graph, self.schedule.workload.ops
        flush = self.cp.empty(L2_FLUSH_B // 4, dtype=self.cp.float32) if cold else None
        seen: dict[tuple, dict] = {}
        for i, op in enumerate(ops):
            key = (op.kind, op.out_size, op.attrs.get("k", 0), int(g.n_tiles[i]))
            if key in seen:
                continue
            times = []
            for r in range(reps + 2):
                if flush is not None:
                    flush.fill(r)
                e0, e1 = self.cp.cuda.Event(), self.cp.cuda.Event()
                e0.record(self.stream)
                self.launches[i]()
                e1.record(self.stream)
                t0 = time.monotonic()
                while not e1.done:
                    if time.monotonic() - t0 > watchdog_s:
                        raise MksimError(f"op {op.name} ran over {watchdog_s:g} s alone (hung)")
                if r >= 2:
                    times.append(self.cp.cuda.get_elapsed_time(e0, e1) * 1e3)
            med = statistics.median(times)
            streamed = op.weight_bytes + op.kv_read_bytes
            # the last launch's tasks, from the trace: when each began computing and for how long
            a, b = int(g.op_first[i]), int(g.op_first[i + 1])
            tr = self.cp.asnumpy(self.trace[a:b]).astype(np.int64)
            task_us = (tr[:, 2] - tr[:, 1]) / 1e3
            task_B = g.weight_bytes[a:b] + g.kv_read_bytes[a:b]
            rec = {"op": op.name, "kind": op.kind, "l2": "flushed" if cold else "warm",
                   "page_KiB": self.plan.page_B / 1024, "depth": self.plan.depth,
                   "N": op.out_size, "K": op.attrs.get("k"),
                   "tiles": int(g.n_tiles[i]), "us": med, "spread_us": float(np.ptp(times)),
                   "streamed_B": streamed, "GBps": streamed / med / 1e3,
                   "task_us_mean": float(task_us.mean()), "task_us_max": float(task_us.max()),
                   "task_B_mean": float(task_B.mean()),
                   "start_spread_us": float((tr[:, 1].max() - tr[:, 1].min()) / 1e3)}
            rec.update(self._moe_op_fields(i, op, task_us, task_B, med))
            seen[key] = rec
        return list(seen.values())

    def _moe_op_fields(self, i: int, op: Any, task_us: np.ndarray, task_B: np.ndarray, med_us: float) -> dict:
        """What a single MoE op's record adds (validation.kernel_costs reads them): a top-k's experts and
        top k; an expert op's slots (``slots``, ``per_slot`` tiles each), how many its route table made
        active, its tasks' time and bytes over the active slots only (the others stream nothing and exit
        early: ``exit_us_mean``), the rows each task computes (every token's: ``task_rows``) and those
        the simulator charges it (its expert's tokens in the draw, on average: ``group_rows_mean``)."""
        g = self.plan.graph
        per = getattr(g, "per", None)
        if op.kind == "topk":
            return {"experts": op.attrs["experts"], "top_k": op.attrs["top_k"]}
        if per is None or not per[i]:
            return {}
        ops = self.schedule.workload.ops
        topk = next(j for j, o in enumerate(ops) if o.kind == "topk" and o.layer == op.layer)
        count = int(self.cp.asnumpy(self.bufs[self.plan.outputs[topk]][:1])[0])
        p = int(per[i])
        act = np.arange(len(task_us)) < count * p
        out = {"experts_op": True, "slots": int(len(task_us) // p), "per_slot": p, "active_slots": count,
               "task_rows": self.schedule.workload.batch,
               "group_rows_mean": float(np.mean(op.attrs["group_rows"])), "streamed_B": float(task_B[act].sum()),
               "GBps": float(task_B[act].sum()) / med_us / 1e3}
        if act.any():
            out.update(task_us_mean=float(task_us[act].mean()), task_us_max=float(task_us[act].max()),
                       task_B_mean=float(task_B[act].mean()))
        if (~act).any():
            out["exit_us_mean"] = float(task_us[~act].mean())
        return out

    def close(self) -> None:
        self.bufs.clear()
        self.graph = None
        self.cp.get_default_memory_pool().free_all_blocks()


def measure(schedule, *, reps: int = 20, watchdog_s: float = 60.0, source_dir: Path | None = None,
            tolerance: float = 1e-2, single_ops: bool | None = None, raw_trace: str | Path | None = None,
            pdl_trigger: str = "early") -> dict:
    """Check and time ``schedule`` on the GPU (see the module docstring). ``single_ops`` (by
    default for the ``graph`` mode): also time each distinct op alone, one kernel, and record its
    tasks' compute times from the trace: the single-op measurements the model is calibrated on.
    ``raw_trace``: write the last timed run's per-task stamps there (numpy .npz).
    ``pdl_trigger``: where the chain kernels trigger the next one's launch (:data:`PDL_TRIGGERS`)."""
    if single_ops is None:
        single_ops = schedule.mode == "graph"
    r = Runner(schedule, source_dir=source_dir, pdl_trigger=pdl_trigger)
    try:
        errs, e2e = r.check(watchdog_s)
        worst = max(errs, key=errs.__getitem__)
        times = r.time(reps, watchdog_s)
        recycled = max(r.check_recycled(watchdog_s)[0].values()) if r.plan.sentinel is not None else None
        trace = r.trace_summary()
        if raw_trace is not None:  # the last run's stamps, with the task rows they belong to
            np.savez_compressed(raw_trace, stamps=r.cp.asnumpy(r.trace), tasks=r.plan.program.tasks,
                                queue_start=r.plan.program.queue_start,
                                ops=np.array([op.name for op in schedule.workload.ops]))
        single = r.time_ops() if single_ops else []
    finally:
        r.close()
    wl = schedule.workload
    med = statistics.median(times)
    q = np.percentile(times, [10, 90])
    streamed = float(wl.weight_bytes + sum(op.kv_read_bytes for op in wl.ops))
    return {"measured_us": med, "measured_spread_us": float(q[1] - q[0]), "times_us": times,
            "max_rel_err": errs[worst], "worst_op": worst, "rel_err": errs,
            "ok": errs[worst] <= tolerance and (recycled is None or recycled <= tolerance),
            "recycled_max_rel_err": recycled, "sync": schedule.options.sync,
            "e2e_rel_err": max(e2e.values()), "e2e_rel_err_by_op": e2e, "trace": trace, "single_ops": single,
            "bytes_moved": streamed, "GBps": streamed / med / 1e3,
            "kernel": {"threads": P.THREADS, "worker_warps": P.CONSUMERS, "smem_B": r.plan.smem_B,
                       "page_B": r.plan.page_B, "depth": r.plan.depth, "ahead": r.plan.ahead,
                       "l2_lead_B": r.plan.l2_lead_B, "defines": os.environ.get("MKSIM_KERNEL_DEFINES", ""),
                       "blocks": len(schedule.queues) if schedule.queues is not None else None,
                       "sentinel_polls": len(r.plan.sentinel.polls) if r.plan.sentinel is not None else 0,
                       "sentinel_reset_B": (sum(b for _n, _o, b in r.plan.sentinel.resets)
                                            if r.plan.sentinel is not None else 0)},
            "sources": r.sources}
