"""Chains of LLM projections as mksim workloads, and the cases the GPU runner measures (no GPU here).

A chain is a sequence of bf16 matmuls (``F.linear``: K inputs -> N outputs) in which each op reads
the previous op's whole output, so that op i's N is op i + 1's K. :data:`SEQUENCES` names the
sequences, from the projection shapes of Llama-3.2-1B and Llama-3.1-8B; :func:`chain_workload`
makes one a :class:`~mksim.workload.Workload` of ``matmul`` ops that validation.megakernel's
generated kernels run in every mode (the first op reads an input buffer of its own).

>>> wl = chain_workload("1b-gqa", 1)
>>> len(wl.ops), wl.ops[0].attrs["k"], wl.ops[0].out_size, wl.ops[1].inputs[0].op
(16, 2048, 512, 'm0')
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import hwmodels
import mksim
from mksim import models
from mksim.errors import MksimError
from mksim.schedule import MODE_DEFAULTS
from mksim.workload import ACT_BYTES, MATMUL_ALIGN, Input, Op, Workload
from validation.megakernel import program as P

GPU = "h200-calibrated"  # the hardware model the measured schedules are built with (tiling and queues)
BATCHES = (1, 8)
MKSIM_MODES = ("stream", "graph", "graph_pdl", "persistent_barrier", "megakernel")
CUBLAS_MODES = ("stream", "graph")
IMPLEMENTATIONS = ("mksim", "cublas")
TRIGGERS = ("early", "late")  # graph_pdl: where mk_chain triggers launch_dependents


@dataclass(frozen=True)
class Sequence:
    """A chain's shapes: ``(K, N)`` per op (op i's N is op i + 1's K), the model whose projections
    they are (its config is what the generated kernels need besides the ops), and the batches it
    runs at."""
    name: str
    model: str
    shapes: tuple[tuple[int, int], ...]
    batches: tuple[int, ...] = BATCHES
    about: str = ""


def _repeat(block: tuple[tuple[int, int], ...], n: int) -> tuple[tuple[int, int], ...]:
    return block * n


SEQUENCES: dict[str, Sequence] = {s.name: s for s in (
    Sequence("1b-mlp", "llama-3.2-1b", _repeat(((2048, 2048), (2048, 8192), (8192, 2048)), 4),
             about="Llama-3.2-1B o / up / down projections, 4 times: 12 kernels of 8-32 MiB, 288 MiB"),
    Sequence("1b-gqa", "llama-3.2-1b", _repeat(((2048, 512), (512, 2048)), 8),
             about="Llama-3.2-1B k (2048->512) and its transpose, 8 times: 16 kernels of 2 MiB, 32 MiB"),
    Sequence("8b-attn", "llama-3.1-8b", _repeat(((4096, 4096), (4096, 1024), (1024, 4096)), 4),
             about="Llama-3.1-8B o (4096->4096), k (4096->1024) and its transpose, 4 times: 12 kernels, 192 MiB"),
    Sequence("8b-mlp", "llama-3.1-8b", _repeat(((4096, 14336), (14336, 4096)), 2), batches=(1,),
             about="Llama-3.1-8B up / down, twice: 4 kernels of 112 MiB, 448 MiB (batch 1: at batch 8 a "
                   "14336-wide input does not fit the generated kernel's shared memory)"),
)}
QUICK_SEQUENCES = ("1b-gqa",)

# the calibration set: K x N of 64 KiB .. 256 MiB of bf16 weights at K = 2048, doubling
SWEEP_K = 2048
SWEEP_BYTES = tuple(1 << e for e in range(16, 29))
QUICK_SWEEP_BYTES = tuple(1 << e for e in range(16, 29, 4))


def sweep_shapes(quick: bool = False) -> list[tuple[int, int]]:
    """``(K, N)`` of the size sweep (N a multiple of 16: whole 16-row groups)."""
    return [(SWEEP_K, b // (2 * SWEEP_K)) for b in (QUICK_SWEEP_BYTES if quick else SWEEP_BYTES)]


def matmul_op(name: str, k: int, n: int, batch: int, src: str | None) -> Op:
    """One bf16 projection of ``batch`` rows, as mksim's LLM builder makes it (no bias, no norm)."""
    return Op(name=name, kind="matmul", out_size=n, elem_bytes=batch * ACT_BYTES, flops=2.0 * batch * k * n,
              weight_bytes=float(k * n * 2), inputs=(Input(src, full=True),) if src else (), align=MATMUL_ALIGN,
              dtype="bf16", attrs={"k": k, "rows": batch, "fused_norm": False})


def check_shapes(shapes: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> None:
    """Reject a sequence whose ops do not chain, or whose sizes the generated kernel cannot take."""
    if not shapes:
        raise MksimError("a chain needs at least one (K, N) shape")
    for i, (k, n) in enumerate(shapes):
        if k % 256 or n % 16 or k <= 0 or n <= 0:
            raise MksimError(f"op {i}: K={k}, N={n}; K must be a positive multiple of 256 and N of 16")
        if i and shapes[i - 1][1] != k:
            raise MksimError(f"op {i} reads {k} inputs but op {i - 1} makes {shapes[i - 1][1]}; a chain's "
                             "op i + 1 must read op i's outputs")


def chain_workload(seq: str | Sequence, batch: int, independent: bool = False,
                   shapes: list[tuple[int, int]] | None = None) -> Workload:
    """The chain ``seq`` at ``batch`` rows as a workload of ``matmul`` ops ``m0``, ``m1``, ...
    ``independent``: no op reads another (each its own input; for timing ops alone), and then
    ``shapes`` may replace the sequence's."""
    s = SEQUENCES[seq] if isinstance(seq, str) else seq
    sh = list(shapes if shapes is not None else s.shapes)
    if not independent:
        check_shapes(sh)
    ops = tuple(matmul_op(f"m{i}", k, n, batch, None if independent or i == 0 else f"m{i - 1}")
                for i, (k, n) in enumerate(sh))
    return Workload(name=f"chain {s.name} b{batch}", ops=ops, tokens=batch, batch=batch, kv_len=0,
                    model=models.get(s.model))


def fits_kernel(shapes: list[tuple[int, int]] | tuple[tuple[int, int], ...], batch: int) -> bool:
    """Whether mksim's generated kernel can run these shapes at ``batch``: the inputs, the row
    accumulators and a ring of two 32 KiB pages in one block's shared memory."""
    k_max, k_min = max(k for k, _ in shapes), min(k for k, _ in shapes)
    x_B = -(-batch * k_max * 2 // 16) * 16
    return P.smem_bytes(32 * 1024, 2, x_B, P.acc_rows(32 * 1024, k_min), batch) <= P.SMEM_MAX_B


def kernel_options(wl: Workload, mode: str, gpu: str = GPU) -> dict:
    """Schedule options the generated kernels need for ``wl`` in ``mode`` (as
    :func:`validation.megakernel.program.kernel_options` gives a model's): one block per SM, the
    shared memory they keep besides the weight pages, and a prefetch depth that fits beside it."""
    probe = mksim.build_schedule(wl, gpu, "graph", blocks_per_sm=1)
    x_B = P.x_region_bytes(probe)
    k_min = min(op.attrs["k"] for op in wl.ops)
    rows = P.acc_rows(64 * 1024, k_min)
    reserve = math.ceil((P.smem_bytes(0, 0, x_B, rows, wl.batch) + 12 * 16) / 1024)
    opts: dict = {"blocks_per_sm": 1, "smem_reserve_KiB": reserve}
    cap = int((hwmodels.load(gpu).sm.shared_memory_per_block_KiB - reserve) // 32)
    if MODE_DEFAULTS[mode]["prefetch_depth"] > cap:
        opts["prefetch_depth"] = cap
    return opts


def build_schedule(wl: Workload, mode: str, gpu: str = GPU, **options):
    """The schedule mksim's generated kernels run ``wl`` with in ``mode`` (the runner's and the
    predictor's, so that both see the same tiling and queues); ``options`` add schedule options
    the kernels do not need (``pdl_trigger``: the predictor's)."""
    return mksim.build_schedule(wl, gpu, mode, **kernel_options(wl, mode, gpu), **options)


@dataclass(frozen=True)
class Case:
    """One measured chain: a sequence at a batch, run by one implementation in one mode
    (``trigger``: graph_pdl's trigger position, mksim only)."""
    sequence: str
    batch: int
    implementation: str
    mode: str
    trigger: str | None = None

    @property
    def name(self) -> str:
        return f"{self.sequence}/b{self.batch}/{self.implementation}/{self.mode}" + (
            f":{self.trigger}" if self.trigger else "")


def case_list(sequences: tuple[str, ...] | list[str] | None = None) -> list[Case]:
    """Every case of ``sequences`` (default all): per batch, mksim's 5 modes (graph_pdl with both
    triggers) and cuBLAS's stream and graph."""
    out = []
    for name in sequences or list(SEQUENCES):
        s = SEQUENCES[name]
        for b in s.batches:
            for mode in MKSIM_MODES:
                for trig in (TRIGGERS if mode == "graph_pdl" else (None,)):
                    out.append(Case(name, b, "mksim", mode, trig))
            out.extend(Case(name, b, "cublas", mode) for mode in CUBLAS_MODES)
    return out
