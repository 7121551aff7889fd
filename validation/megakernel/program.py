"""What a schedule becomes on the GPU, as plain data (numpy; no GPU needed).

:func:`plan` turns a :class:`~mksim.Schedule` of a model's decode step into a :class:`Plan`:

- the buffers the step needs (weights, activations, KV cache, RoPE table, token ids), each with
  its shape and how it is filled;
- one op-table row per op (:data:`OP_FIELDS`, the ``MkOp`` struct of
  ``validation/kernels/mk_ops.cuh``) naming the buffers its pointers refer to;
- the instruction tables (``encode.py``) and the kernel's launch shape: shared-memory pages
  (the schedule's ``page_KiB`` and ``prefetch_depth``), the input/scratch region, the row
  accumulators, threads.

``gpu.py`` allocates the buffers, writes the pointers and launches the kernels;
``reference.py`` computes the same step with torch from the same buffers.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import mksim
from mksim.errors import MksimError, ScheduleError
from mksim.schedule import MODE_DEFAULTS
from mksim.workload import Op

from .encode import OPCODES, Program, encode_queues, weight_rows_per_output
from .moe import capacity, kernel_graph

MAX_WORKER_WARPS = 28  # a block holds at most 32 warps: the workers and the 4 others


def worker_warps(text: str | None) -> int:
    """Worker warps per block from ``MKSIM_WORKER_WARPS`` (default 8): a whole number from 1 to
    :data:`MAX_WORKER_WARPS`, else :class:`~mksim.errors.MksimError` in one line.

    >>> worker_warps(None), worker_warps("4")
    (8, 4)
    """
    if text is None:
        return 8
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WORKER_WARPS:
        raise MksimError(f"MKSIM_WORKER_WARPS={text!r}: worker warps per block must be a whole number from 1 to "
                         f"{MAX_WORKER_WARPS}; unset it for the default 8")
    return n


CONSUMERS = worker_warps(os.environ.get("MKSIM_WORKER_WARPS"))  # worker warps per block (MK_CONSUMERS in mk_kernel.cu)
THREADS = (CONSUMERS + 4) * 32   # + the producer, publisher, waiter and L2 prefetcher warps
SLOT_B = 224                     # a task slot the waiter fills: the op description and the task row
SMEM_MAX_B = 227 * 1024          # opt-in shared memory per block on sm_90
RING_WITHOUT_PREFETCH = 4        # pages a task streams through when the schedule prefetches nothing
BATCHES = (1, 2, 4, 8)           # rows a matmul task handles at once (template instances)
ATTN_SHAPES = {(64, 4), (128, 4), (128, 3), (64, 8)}  # (head size, group) a build without attn_defines has
ATTN_GROUPS = range(1, 9)        # query heads per KV head the partials take (MHA: 1): the 8 columns of one mma
ATTN_HEAD_DIM_MAX = 256          # the largest head size: a multiple of 16 (the partials' k-steps) up to this
ROPE_NORM = {"head": 1, "all": 2}  # rope_kv's opt for q/k norms by qk_norm_scope: MK_ROPE_NORM_HEAD, _ALL in mk_ops.cuh

OPT_FUSED_NORM, OPT_RESIDUAL, OPT_MMA = 1, 2, 4
OPT_ROPE, OPT_SILU = 8, 16  # matmul epilogues (fuse_rope, fuse_silu): MK_OPT_ROPE, MK_OPT_SILU in mk_ops.cuh
EPILOGUE_OPT = {"rope_kv": OPT_ROPE, "silu_mul": OPT_SILU}  # a matmul's attrs["epilogue"] -> its option bit
OPT_REDUCE = 32  # matmul prologue (fuse_reduce): the input rows merged from attention partials, MK_OPT_REDUCE
PROLOGUE_OPT = {"attn_reduce": OPT_REDUCE}  # a matmul's attrs["prologue"] -> its option bit
# k-chunked input rows (MK_OPT_KCHUNK; mk_matmul_kc in mk_kernel.cu): a matmul whose T input rows of K
# take more than X_WHOLE_MAX_B holds them Kc inputs at a time (k_chunk), in two buffers of at most
# KCHUNK_X_B together; its op-table row carries Kc in ``off2``. The bound is the largest whole input of
# any case measured before chunking (llama-2-7b b8: 172 KiB), so that every such case keeps its plan.
OPT_KCHUNK = 256
X_WHOLE_MAX_B = 176 * 1024
KCHUNK_X_B = 64 * 1024
# mixture of experts (mk_ops.cuh, "mixture of experts"): an expert matmul's weights are its slot's
# expert's (MK_OPT_EXPERTS), its input rows its slot's (MK_OPT_SLOT_IN); topk's and combine's own options
OPT_EXPERTS, OPT_SLOT_IN = 64, 128
TOPK_SIGMOID, TOPK_NORM = 1, 2          # MK_TOPK_SIGMOID, MK_TOPK_NORM
COMBINE_SHARED, COMBINE_GATED = 1, 2    # MK_MOE_OPT_SHARED, MK_MOE_OPT_GATED
MOE_MAX_TOPK = 32                       # a top-k task's warp takes its choices one lane each
OP_INT_FIELDS = ("kind", "n_tiles", "N", "K", "T", "flag_base", "opt", "ld_out", "ld0", "ld1", "ld2", "off1",
                 "off2", "hq", "hkv", "hd", "splits", "kv_total", "pos", "s_max")
OP_FLOAT_FIELDS = ("eps", "scale", "pad0", "pad1")
OP_PTR_FIELDS = ("bounds", "W", "w2", "in0", "in1", "in2", "out", "kc", "vc", "rope", "tokens", "bias")
OP_FIELDS = np.dtype([(f, "<i4") for f in OP_INT_FIELDS] + [(f, "<f4") for f in OP_FLOAT_FIELDS]
                     + [(f, "<u8") for f in OP_PTR_FIELDS])
PARAM_PTR_FIELDS = ("tasks", "queue_start", "deps", "op_tiles", "ops", "counters", "flags", "barrier", "error",
                    "trace")
PARAM_INT_FIELDS = ("n_ops", "page_B", "depth", "x_B", "acc_floats", "acc_rows", "ahead", "l2_lead_B")
# sync="sentinel" (appended, so that the fields above keep their offsets): the byte segments the
# waiter polls, each dependency's range of them, the segments the publisher warp resets for the
# next step, and how many of those there are
SENTINEL_PTR_FIELDS = ("polls", "poll_deps", "resets")
SENTINEL_INT_FIELDS = ("n_resets", "sentinel")
PARAM_FIELDS = np.dtype([(f, "<u8") for f in PARAM_PTR_FIELDS] + [(f, "<i4") for f in PARAM_INT_FIELDS]
                        + [(f, "<u8") for f in SENTINEL_PTR_FIELDS] + [(f, "<i4") for f in SENTINEL_INT_FIELDS])
# a segment the waiter polls (MkPoll in mk_kernel.cu): its address, the units of its dependency's
# list up to and including it, and its unit (POLL_KINDS)
POLL_FIELDS = np.dtype([("ptr", "<u8"), ("end", "<i4"), ("kind", "<i4")])
# a unit of a polled segment: 16 bytes of bf16 or fp32 elements, or one element (the unaligned
# head and tail of a segment)
POLL_KINDS = {("vec", 2): 0, ("vec", 4): 1, ("one", 2): 2, ("one", 4): 3}
POLL_UNIT_B = {0: 16, 1: 16, 2: 2, 3: 4}
RESET_FIELDS = np.dtype([("ptr", "<u8"), ("nbytes", "<u8")])
RESET_CHUNK_B = 4096  # the publisher warps split the next step's reset into pieces of at most this
SENTINEL_BYTE = 0xFF   # every byte of a polled output before its producer writes it (see sentinel_plan)
KERNEL_SYNCS = ("counter", "flag", "sentinel")  # the syncs the megakernel runs (Options.sync)


@dataclass(frozen=True)
class Buffer:
    """A device array: ``fill`` is ``normal`` (times ``scale``), ``norm`` (1 + 0.1 normal),
    ``tokens`` (ids below ``scale``), ``rope`` (cos/sin table), or ``poison`` (NaN; written by
    the step)."""
    shape: tuple[int, ...]
    dtype: str                 # "bf16", "f32" or "i32"
    fill: str
    scale: float = 1.0
    layout: str = "rows"       # "mma": a matmul weight in fragment order (see mma_pack); "mma-kc": ... by k-chunk
    kc: int = 0                # "mma-kc": inputs a chunk (kc_pack)
    tiles: tuple[int, ...] = ()  # "mma-kc": the weight rows' task bounds (kc_pack)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * (4 if self.dtype in ("f32", "i32") else 2)


@dataclass
class Plan:
    schedule: object
    buffers: dict[str, Buffer]
    ops: list[dict]              # one dict per op: OP_FIELDS values, pointer fields name buffers
    program: Program             # task rows as the kernel runs them (queue order, or op order for chains)
    page_B: int
    depth: int
    ahead: bool                  # the producer may stream a task before the workers start it
    x_B: int
    acc_rows: int
    smem_B: int
    outputs: list[str] = field(default_factory=list)  # buffer of each op's output, in op order
    defines: tuple[str, ...] = ()  # compiler flags the plan's kernels need (attn_defines: its attention's instance)
    sentinel: SentinelPlan | None = None  # sync="sentinel": what is polled and reset
    l2_lead_B: int = 0           # the L2 prefetcher's lead ahead of the producer (0: off; l2_prefetch_KiB)
    graph: Any = None            # the tasks the kernel runs: the schedule's graph, or an MoE step's (moe.KernelGraph)


def x_region_bytes(schedule) -> int:
    """The input/scratch region: a matmul's input rows (bf16), or attention's queries, warp
    partials and V rows (32 positions per worker warp). A matmul that merges attention partials
    into its input rows (``fuse_reduce``) holds only the merged rows: the partials stream from L2."""
    wl = schedule.workload
    T = wl.batch
    need = 0
    for op in wl.ops:
        if op.kind == "matmul" and op.attrs.get("grouped") == "experts":  # an expert's rows are never chunked
            need = max(need, T * op.attrs["k"] * 2)
        elif op.kind == "matmul":
            kc = k_chunk(T, op.attrs["k"])
            need = max(need, 2 * T * kc * 2 if kc else T * op.attrs["k"] * 2)
        elif op.kind == "attn_partial":
            cfg = wl.model
            G, D = cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
            need = max(need, (G * D + CONSUMERS * G * (D + 2)) * 4 + CONSUMERS * 32 * D * 2, attn_smem_bytes(D, G))
        elif op.kind == "topk":  # the logits, each token's choices and weights, the active experts' mask
            N, k = op.attrs["experts"], op.attrs["top_k"]
            need = max(need, (T * N + 2 * T * k + (N + 31) // 32) * 4)
        elif op.kind == "combine":  # each token's slots and weights
            need = max(need, 2 * T * op.attrs["top_k"] * 4)
    return -(-need // 16) * 16


def k_chunk(T: int, K: int) -> int:
    """Inputs per chunk of a matmul's T input rows of K (``mk_matmul_kc``), or 0 when the rows are
    held whole (at most :data:`X_WHOLE_MAX_B`): the fewest equal chunks, each a multiple of 32 inputs
    (a tensor-core block's), whose two buffers take at most :data:`KCHUNK_X_B`. :class:`ScheduleError`
    in one line when K has no such chunk.

    >>> k_chunk(4, 14336), k_chunk(8, 14336), k_chunk(8, 18944), k_chunk(8, 12288)
    (0, 2048, 1184, 2048)
    """
    if T * K * 2 <= X_WHOLE_MAX_B:
        return 0
    for n in range(2, K // 32 + 1):
        kc = K // n
        if K % n == 0 and kc % 32 == 0 and 2 * T * kc * 2 <= KCHUNK_X_B:
            return kc
    raise ScheduleError(f"the input rows of a matmul with {K} inputs at batch {T} do not fit in shared memory and "
                        f"{K} has no chunk of a multiple of 32 inputs that does")


def kc_problem(op: Op, T: int, bounds, page_B: int, mma: bool) -> str | None:
    """Why the k-chunked walk (``mk_matmul_kc``) cannot run matmul ``op`` at batch T, or None: it runs
    on the tensor cores, without a fused norm or attention-reduction prologue (which read whole
    rows), on pages no larger than one chunk of a row group (a page then spans at most two chunks),
    with the per-page divisions exact (:func:`fastdiv_ok`)."""
    K, kc = op.attrs["k"], k_chunk(T, op.attrs["k"])
    if op.attrs.get("grouped") == "experts":
        return "an expert matmul's input rows are not chunked along k"
    if T < 4:  # (k_chunk chunks a batch below 4 only for K over 22528)
        return f"chunked input rows at batch {T} have no device function (the chunked walk is built for batch 4 and 8)"
    if not mma:
        return ("chunked input rows run on the tensor-core matmul only, which needs inputs a multiple of 32, tiles "
                "of whole 16-row groups and pages of whole KiB")
    if op.attrs.get("fused_norm"):
        return "a fused norm over chunked input rows has no device code (unfuse the norm: fuse_norm=False)"
    if op.attrs.get("prologue"):
        return "a fused attention reduction over chunked input rows has no device code (fuse_reduce=False)"
    if kc * 32 < page_B:
        return (f"pages of {page_B // 1024} KiB are larger than a row group's chunk of {kc} inputs; use page_KiB <= "
                f"{kc * 32 // 1024}")
    f = weight_rows_per_output(op)
    cb = int(np.diff(np.asarray(bounds)).max()) * f // 16 * (kc // 32)  # the blocks of a chunk of the largest task
    if not (fastdiv_ok((K // kc) * cb, cb) and fastdiv_ok((K // kc) * cb, kc // 32)):
        return "its largest task is too large for the per-page divisions"
    return None


def kc_pack(w, tiles, kc: int):
    """A matmul weight [N, K] (numpy or torch) as the k-chunked walk (``mk_matmul_kc``) reads it: each
    task's rows (``tiles``: bounds of whole 16-row groups) stay one contiguous range, in it chunk by
    chunk (inputs ``[c kc, (c + 1) kc)``) its rows in fragment order (:func:`mma_pack`). One chunk of
    all K is :func:`mma_pack`."""
    N, K = w.shape
    parts = [mma_pack(w[a:z, c:c + kc]).reshape(-1) for a, z in zip(tiles[:-1], tiles[1:], strict=True)
             for c in range(0, K, kc)]
    if isinstance(w, np.ndarray):
        return np.concatenate(parts).reshape(N, K)
    import torch

    return torch.cat(parts).reshape(N, K)


def kc_unpack(p, tiles, kc: int):
    """The inverse of :func:`kc_pack`: the [N, K] weight (in stored row order) a packed array holds."""
    N, K = p.shape
    flat = p.reshape(-1)
    out = np.empty_like(p) if isinstance(p, np.ndarray) else p.new_empty((N, K))
    at = 0
    for a, z in zip(tiles[:-1], tiles[1:], strict=True):
        for c in range(0, K, kc):
            n = (z - a) * kc
            out[a:z, c:c + kc] = mma_unpack(flat[at:at + n].reshape(z - a, kc))
            at += n
    return out


def unpack_buffer(a, b: Buffer):
    """The [N, K] weight (stored row order) that a packed weight buffer ``b``'s array ``a`` holds."""
    return kc_unpack(a, b.tiles, b.kc) if b.layout == "mma-kc" else mma_unpack(a)


def attn_smem_bytes(D: int, G: int, nwarps: int = CONSUMERS) -> int:
    """Shared memory of the tensor-core partials (``mk_attn_smem_bytes<D, G>`` in mk_ops.cuh): per
    worker warp a K and a V tile of 16 rows of ``2 D + 16`` bytes, then q (G rows of D / 2 + 4
    words), then m and l of every warp and head. For the shapes built before any other (and every
    G <= 8 at D 64 and 128) the older layout's region (MK_ATTN 1) is the larger.

    >>> attn_smem_bytes(128, 4, 8), attn_smem_bytes(96, 1, 8)
    (70976, 53520)
    """
    return nwarps * 2 * 16 * (2 * D + 16) + G * (D // 2 + 4) * 4 + 2 * nwarps * G * 4


def attn_shape_problem(head_dim: int, group: int) -> str | None:
    """Why the partials have no device function for ``head_dim`` and ``group`` (query heads per KV
    head), or None: a head is whole 16-element k-steps of the tensor cores up to
    :data:`ATTN_HEAD_DIM_MAX`, a group fills at most the 8 columns of one mma (:data:`ATTN_GROUPS`).

    >>> attn_shape_problem(128, 1) is None, attn_shape_problem(100, 4)
    (True, 'head size 100 is not a multiple of 16 (the tensor cores take 16 elements a step)')
    """
    if head_dim % 16:
        return f"head size {head_dim} is not a multiple of 16 (the tensor cores take 16 elements a step)"
    if head_dim > ATTN_HEAD_DIM_MAX:
        return f"head size {head_dim} is over {ATTN_HEAD_DIM_MAX}"
    if group not in ATTN_GROUPS:
        return (f"{group} query heads per KV head is over {ATTN_GROUPS[-1]} (one mma's 8 columns hold a KV head's "
                "query heads)")
    return None


def attn_defines(cfg) -> tuple[str, ...]:
    """The compiler flags that build the attention partials for ``cfg``'s (head size, group) only
    (``MK_ATTN_HD``, ``MK_ATTN_G`` in mk_ops.cuh): one template instance per build, the model's.

    >>> import mksim
    >>> attn_defines(mksim.models.get("qwen2.5-7b"))
    ('-DMK_ATTN_HD=128', '-DMK_ATTN_G=7')
    """
    return (f"-DMK_ATTN_HD={cfg.head_dim}", f"-DMK_ATTN_G={cfg.num_heads // cfg.num_kv_heads}")


def mma_pack(w):
    """A matmul weight [N, K] (numpy or torch) in the fragment order of the tensor-core matmul
    (``mk_matmul_mma`` in mk_kernel.cu): 1 KiB blocks (16 rows x 32 inputs) in row-group-major
    order; in a block, the 16-byte word of lane 4g + t is row g, inputs 8t .. 8t + 7, followed by
    row g + 8's. A run of whole row groups stays one contiguous range."""
    N, K = w.shape
    b = w.reshape(N // 16, 2, 8, K // 32, 4, 8)
    b = b.permute(0, 3, 1, 2, 4, 5) if hasattr(b, "permute") else b.transpose(0, 3, 1, 2, 4, 5)
    return b.reshape(N, K)


def mma_unpack(p):
    """The inverse of :func:`mma_pack`: the [N, K] weight a packed array holds."""
    N, K = p.shape
    b = p.reshape(N // 16, K // 32, 2, 8, 4, 8)
    b = b.permute(0, 2, 3, 1, 4, 5) if hasattr(b, "permute") else b.transpose(0, 2, 3, 1, 4, 5)
    return b.reshape(N, K)


def mma_ok(op, bounds, page_B: int) -> bool:
    """Whether a matmul runs on the tensor cores: inputs a multiple of 32, every tile a whole number
    of 16-row groups (of weight rows: two per output element with a fused SiLU·mul), pages of whole
    1 KiB blocks, and the blocks of its largest tile few enough for the per-page division by K / 32
    (:func:`fastdiv_ok`)."""
    f = weight_rows_per_output(op)
    k = op.attrs["k"]
    if not (k % 32 == 0 and (f * op.out_size) % 16 == 0 and page_B % 1024 == 0
            and not (f * np.asarray(bounds) % 16).any()):
        return False
    blocks = int(np.diff(np.asarray(bounds)).max()) * f // 16 * (k // 32)
    return fastdiv_ok(blocks, k // 32)


def div_magic(d: int) -> int:
    """The magic number of mk_kernel.cu's ``mk_div_magic``: floor((2^32 - 1) / d) + 1 (32 bits)."""
    return (0xFFFFFFFF // d + 1) & 0xFFFFFFFF


def fastdiv_ok(blocks: int, d: int) -> bool:
    """Whether ``mk_div`` (``MK_MM_FASTDIV``: x / d as the high word of x * :func:`div_magic` (d))
    is exact for every block index x < ``blocks``. With m d = 2^32 + e, 0 <= e < d, the high word
    is floor(x / d + x e / (d 2^32)), exact while x e < 2^32, so x d < 2^32 is enough; d = 1 has no
    32-bit magic.

    >>> fastdiv_ok(16384 // 16 * 64, 64), fastdiv_ok(2**22, 2**10), fastdiv_ok(2**22, 2**11), fastdiv_ok(5, 1)
    (True, True, False, False)
    """
    return d >= 2 and blocks * d <= 2**32


def rope_pair_rows(n: int, rotated: int, head_dim: int) -> np.ndarray:
    """The order in which a q/k/v projection with RoPE in its epilogue (``fuse_rope``) stores its
    ``n`` weight rows: stored row ``p`` is the model's row ``rows[p]``. In the first ``rotated`` rows
    (the q and k heads) each rotate-half pair (d, d + head_dim / 2) of a head lands on the adjacent
    rows (2r, 2r + 1) of a 16-row group: group j of a head holds the pairs d = 8j .. 8j + 7. A head
    keeps its rows, so a range of whole heads is the same range stored; the v rows keep their order.
    The kernel's epilogue (``mk_epilogue_pair`` in mk_ops.cuh) inverts it for each pair it writes.

    >>> r = rope_pair_rows(40, 32, 32)   # one 32-wide head rotated, then 8 v rows
    >>> r[:6].tolist(), r[16:18].tolist(), r[32:34].tolist()
    ([0, 16, 1, 17, 2, 18], [8, 24], [32, 33])
    """
    if head_dim % 16 or rotated % head_dim or not 0 <= rotated <= n:
        raise ValueError(f"rotate-half pairs need whole heads of a multiple of 16 rows, got head_dim {head_dim}, "
                         f"{rotated} rotated rows of {n}")
    p = np.arange(n, dtype=np.int64)
    head, w = np.divmod(p[:rotated], head_dim)
    out = p.copy()
    out[:rotated] = head * head_dim + (w // 16) * 8 + (w % 16) // 2 + (w % 2) * (head_dim // 2)
    return out


def silu_pair_rows(n_out: int) -> np.ndarray:
    """The order in which a gate/up projection with SiLU·mul in its epilogue (``fuse_silu``) stores
    its ``2 n_out`` weight rows: stored rows 2j and 2j + 1 are the model's gate row j and up row j
    (rows j and n_out + j of [gate; up]); the pair makes output element j.

    >>> silu_pair_rows(4).tolist()
    [0, 4, 1, 5, 2, 6, 3, 7]
    """
    p = np.arange(2 * n_out, dtype=np.int64)
    return p // 2 + (p % 2) * n_out


def epilogue_rows(op, cfg) -> np.ndarray | None:
    """The stored order of ``op``'s weight rows (:func:`rope_pair_rows`, :func:`silu_pair_rows`) if
    its epilogue pairs them, else None (the model's order)."""
    epi = op.attrs.get("epilogue") if op.kind == "matmul" else None
    if epi == "rope_kv":
        return rope_pair_rows(op.out_size, cfg.q_size + cfg.kv_size, cfg.head_dim)
    if epi == "silu_mul":
        return silu_pair_rows(op.out_size)
    return None


def pack_weight(w, op, cfg):
    """A model's weight ``w`` [N, K] of matmul ``op`` (numpy or torch) as the tensor-core matmul
    reads it: rows in the order its epilogue pairs them (:func:`epilogue_rows`), then in fragment
    order (:func:`mma_pack`). :func:`unpack_weight` inverts it."""
    rows = epilogue_rows(op, cfg)
    return mma_pack(w if rows is None else w[_index(w, rows)])


def unpack_weight(p, op, cfg):
    """The model's weight [N, K] that a packed array of ``op`` holds (the inverse of :func:`pack_weight`)."""
    w = mma_unpack(p)
    rows = epilogue_rows(op, cfg)
    return w if rows is None else w[_index(w, np.argsort(rows))]


def _index(a, rows: np.ndarray):
    """``rows`` as an index of ``a`` (a torch tensor takes a tensor on its own device)."""
    if hasattr(a, "device"):
        import torch

        return torch.as_tensor(rows, device=a.device)
    return rows


ACC_ROWS = 256  # row accumulators per batch row: a matmul task writes its rows out every ACC_ROWS rows


def mm_groups_per_page(page_B: int, k: int) -> int:
    """The most 16-row groups one page of a tensor-core matmul with ``k`` inputs touches (1 KiB
    blocks of 16 rows x 32 inputs, a group's blocks consecutive, pages at any block): the row-group
    slots the kernel's per-warp row sums need at least (``mk_matmul_mma2``, MK_MM=2).

    >>> mm_groups_per_page(32 * 1024, 2048), mm_groups_per_page(32 * 1024, 256)
    (2, 5)
    """
    blocks, kb = max(page_B // 1024, 1), k // 32
    return (blocks - 1 + kb - 1) // kb + 1


def acc_rows(page_B: int, k_min: int) -> int:
    """Row accumulators per batch row: a power of two (the kernel picks a row's slot with a mask),
    at least the rows one page spans plus the 16-row groups it begins and ends in. The same region
    holds the per-warp row-group slots of MK_MM=2 (``CONSUMERS`` x 16 rows each): at least as many
    as one page touches, so that it is sized right for either build."""
    slots = CONSUMERS * 16 * mm_groups_per_page(page_B, k_min)
    return max(ACC_ROWS, 1 << (page_B // (2 * k_min) + 32).bit_length(), 1 << (slots - 1).bit_length())


def smem_bytes(page_B: int, depth: int, x_B: int, rows: int, T: int) -> int:
    """The kernel's dynamic shared memory: pages, input/scratch region, T x rows accumulators,
    reduction scratch and flags, two mbarriers per page (padded to 16 bytes), two task slots."""
    return page_B * depth + x_B + T * rows * 4 + 40 * 4 + 2 * (depth + depth % 2) * 8 + 2 * SLOT_B


@functools.lru_cache(maxsize=256)
def _step_needs(model: str, batch: int, kv_len: int, gpu: str) -> tuple[int, int, float]:
    """What :func:`kernel_options` reads of a step: its x region's bytes, its smallest matmul K and the
    shared memory a block has, from a graph schedule built to see them (once per step and GPU in a
    process: the suite and its tests ask for the same few steps again and again)."""
    probe = mksim.build_schedule(mksim.models.workload(model, batch=batch, kv_len=kv_len), gpu, "graph",
                                 blocks_per_sm=1)
    k_min = min(op.attrs["k"] for op in probe.workload.ops if op.kind == "matmul")
    return x_region_bytes(probe), k_min, probe.gpu.sm.shared_memory_per_block_KiB


def kernel_options(model: str | mksim.models.ModelConfig, batch: int, kv_len: int = 1024, gpu: str = "h200-calibrated",
                   mode: str | None = None) -> dict:
    """Schedule options the generated kernels need for ``model`` at ``batch``: one block per SM,
    the shared memory they keep besides the weight pages (``smem_reserve_KiB``) and, where the
    default depth of ``mode`` (or of the megakernel) does not fit beside it, ``prefetch_depth``."""
    needs = _step_needs if isinstance(model, str) and isinstance(gpu, str) else _step_needs.__wrapped__
    x_B, k_min, smem_KiB = needs(model, batch, kv_len, gpu)
    rows = acc_rows(64 * 1024, k_min)
    reserve = math.ceil((smem_bytes(0, 0, x_B, rows, batch) + 12 * 16) / 1024)
    opts: dict = {"blocks_per_sm": 1, "smem_reserve_KiB": reserve}
    page_KiB = 32
    cap = int((smem_KiB - reserve) // page_KiB)
    if cap < 1:
        name = model if isinstance(model, str) else model.name
        raise ScheduleError(f"{name} batch {batch} does not fit the kernel's shared memory: its inputs and "
                            f"accumulators take {reserve} of the {smem_KiB:g} KiB a block has, leaving no room for "
                            f"a {page_KiB} KiB weight page")
    if MODE_DEFAULTS[mode or "megakernel"]["prefetch_depth"] > cap:
        opts["prefetch_depth"] = cap
    return opts


KERNEL_RUNS = ("one block per SM, static per-SM queues (dispatch=static), one die (dies=false), "
               "movement=ideal, sync " + "/".join(KERNEL_SYNCS))


def check_designs(schedule) -> None:
    """Refuse, in one line (:class:`ScheduleError`), a schedule whose designs the generated kernels
    do not run, rather than run another design in its place: dynamic dispatch, dies, the native
    data movement of ``movement="native"`` and syncs other than :data:`KERNEL_SYNCS`. The message
    names what the kernels run (:data:`KERNEL_RUNS`)."""
    o = schedule.options
    why = None
    if o.dispatch != "static":
        why = f"dispatch={o.dispatch!r} (its scheduler warps) has no device code"
    elif o.dies:
        why = "dies=true (dependencies across dies) has no device code"
    elif o.movement != "ideal":
        why = f"movement={o.movement!r} (the generation's own loader) has no device code"
    elif o.sync not in KERNEL_SYNCS:
        why = f"sync={o.sync!r} has no device code"
    if why:
        raise ScheduleError(f"the generated kernel cannot run this schedule: {why}; it runs {KERNEL_RUNS}")


def check_supported(schedule) -> None:
    """Refuse, in one line, a schedule the generated kernels cannot run as it was predicted: its
    designs (:func:`check_designs`), its model's op kinds and shapes, its batch, its pages."""
    check_designs(schedule)
    wl = schedule.workload
    cfg = wl.model
    if cfg is None:
        raise ScheduleError("the generated kernel needs a model config (a workload from mksim.models)")
    if wl.phase != "decode":
        raise ScheduleError("the generated kernel runs decode steps; use phase decode")
    if wl.weight_dtype != "bf16":
        raise ScheduleError(f"the generated kernel streams bf16 weights, not {wl.weight_dtype}")
    if wl.batch not in BATCHES:
        raise ScheduleError(f"the generated kernel handles batch {', '.join(map(str, BATCHES))}, not {wl.batch}")
    missing = sorted({op.kind for op in wl.ops} - set(ROWS), key=[op.kind for op in wl.ops].index)
    if missing:
        raise ScheduleError(f"no device function for op kind {missing[0]!r}; the generated kernel runs "
                            f"{', '.join(ROWS)}")
    G = cfg.num_heads // cfg.num_kv_heads
    why = attn_shape_problem(cfg.head_dim, G)
    if why is None and "-DMK_ATTN=1" in os.environ.get("MKSIM_KERNEL_DEFINES", "").split() \
            and cfg.head_dim not in (64, 128):
        why = f"head size {cfg.head_dim} with MK_ATTN=1 (a lane per position takes head sizes 64 and 128)"
    if why:
        raise ScheduleError(f"{cfg.name}: no attention device function: {why}")
    if cfg.qk_norm and getattr(cfg, "qk_norm_scope", "head") not in ROPE_NORM:
        raise ScheduleError(f"{cfg.name}: no device function for q/k norms over {cfg.qk_norm_scope!r}; the kernel "
                            f"runs {', '.join(ROPE_NORM)}")
    for op in wl.ops:
        if op.kind == "matmul" and op.attrs["k"] % 256:
            raise ScheduleError(f"op {op.name}: input size {op.attrs['k']} is not a multiple of 256; the matmul has "
                                "no device function for it (its pages hold whole 512-byte units of a weight row)")
    check_moe(schedule)
    if schedule.options.blocks_per_sm != 1:
        raise ScheduleError("the generated kernels run one block per SM; build the schedule with blocks_per_sm=1")
    page_B = int(schedule.options.page_KiB * 1024)
    if page_B % 512 or page_B != schedule.options.page_KiB * 1024:
        raise ScheduleError(f"page_KiB must be a multiple of 0.5 KiB, got {schedule.options.page_KiB}")


def check_moe(schedule) -> None:
    """Refuse, in one line, a mixture-of-experts step the kernel does not run: a design with no device
    code (the drain queue, the expert prefetch), sync="sentinel" (an inactive slot writes nothing to
    poll), expert ops other than fused gate/up (``fuse_silu``) and down, a top-k above
    :data:`MOE_MAX_TOPK`, sigmoid-scored routers' extras."""
    wl, o = schedule.workload, schedule.options
    if not any(op.kind == "topk" for op in wl.ops):
        return
    why = None
    grouped = [op for op in wl.ops if op.attrs.get("grouped") == "experts"]
    if getattr(o, "moe_dispatch", "plan") == "queue":
        why = ("moe_dispatch='queue' (the route-finalize and drain queue) has no device code yet; "
               "use 'stride' or 'plan'")
    elif getattr(o, "moe_prefetch_MiB", 0):
        why = "moe_prefetch_MiB > 0 (the expert prefetch into L2) has no device code yet; leave it at 0"
    elif o.sync == "sentinel":
        why = ("sync='sentinel' polls every slot's outputs and a slot past the active experts writes none; "
               "use counter or flag")
    elif wl.model.experts_per_token > MOE_MAX_TOPK:
        why = f"a top-k of {wl.model.experts_per_token} > {MOE_MAX_TOPK} has no device function"
    elif any(op.kind != "matmul" for op in grouped) or any(
            op.attrs.get("epilogue") != "silu_mul" for op in grouped
            if wl.ops[wl.index[op.inputs[0].op]].attrs.get("grouped") != "experts"):
        why = "the expert gate/up runs with its SiLU fused (fuse_silu=True, split_gate_up=False) only"
    if why:
        raise ScheduleError(f"the generated kernel cannot run this MoE step: {why}")


def check_ftopk(schedule) -> None:
    """What ``-DMK_MOE_FTOPK=1`` takes of an MoE step (mk_kernel.cu, ``mk_ftopk_router``): every top-k's
    input is the op right before it (its router), and nothing else reads a router's output (the kernel
    publishes no router tile flags then). Raises ScheduleError otherwise.

    >>> import mksim
    >>> check_ftopk(type("S", (), {"workload": mksim.models.workload("olmoe-1b-7b", fuse_silu=True)})())
    """
    wl = schedule.workload
    for i, op in enumerate(wl.ops):
        if op.kind != "topk":
            continue
        router = wl.ops[i - 1] if i else None
        if router is None or [inp.op for inp in op.inputs] != [router.name]:
            raise ScheduleError(f"MK_MOE_FTOPK: top-k {op.name} does not read the op right before it alone")
        readers = [o.name for o in wl.ops if any(inp.op == router.name for inp in o.inputs)]
        if readers != [op.name]:
            raise ScheduleError(f"MK_MOE_FTOPK: {router.name} is read by {readers}, not its top-k alone")


@dataclass
class RowArgs:
    """One op as its kind's row function (:data:`ROWS`) sees it: the op, its op-table row to fill
    (``OP_FIELDS``; pointer fields name buffers), its inputs' buffer names and ops, and the plan's
    buffers, to which it adds the weights and caches it reads."""
    op: Op
    row: dict
    ins: list[str]
    ins_op: list[Op]
    buffers: dict[str, Buffer]
    cfg: Any          # the model config
    T: int            # rows (sequences)
    kv_len: int       # tokens in the KV cache before the step
    bounds: np.ndarray  # the op's tile bounds
    page_B: int
    topk_op: dict[int, int] = field(default_factory=dict)  # an MoE layer's top-k op (its index in the op table)


def _embed_row(a: RowArgs) -> Buffer:
    a.buffers[f"w:{a.op.name}"] = Buffer((a.cfg.vocab_size, a.cfg.hidden_size), "bf16", "normal", 1.0)
    a.row.update(W=f"w:{a.op.name}", tokens="tokens")
    return Buffer((a.T, a.cfg.hidden_size), "bf16", "poison")


def _rmsnorm_row(a: RowArgs) -> Buffer:
    H = a.cfg.hidden_size
    a.buffers[f"w:{a.op.name}"] = Buffer((H,), "bf16", "norm")
    a.row.update(K=H, W=f"w:{a.op.name}", in0=a.ins[0], ld0=a.ins_op[0].out_size, eps=a.cfg.rms_norm_eps)
    return Buffer((a.T, H), "bf16", "poison")


def _matmul_row(a: RowArgs) -> Buffer:
    if a.op.attrs.get("grouped") == "experts":
        return _expert_row(a)
    op, r = a.op, a.row
    K = op.attrs["k"]
    mma = mma_ok(op, a.bounds, a.page_B)
    # a fused epilogue's weight holds its rows in the order the epilogue pairs them (epilogue_rows)
    n_rows = weight_rows_per_output(op) * op.out_size
    kc = k_chunk(a.T, K)
    why = kc_problem(op, a.T, a.bounds, a.page_B, mma) if kc else None
    if why:
        raise ScheduleError(f"op {op.name}: its {a.T} input rows of {K} do not fit in shared memory whole and "
                            f"{why}")
    w = Buffer((n_rows, K), "bf16", "normal", K ** -0.5, "mma" if mma else "rows")
    if kc:  # each task's rows chunk by chunk (kc_pack)
        w = Buffer((n_rows, K), "bf16", "normal", K ** -0.5, "mma-kc", kc,
                   tuple(int(x) * weight_rows_per_output(op) for x in a.bounds))
    a.buffers[f"w:{op.name}"] = w
    src = a.ins[0] if a.ins else f"x:{op.name}"
    if not a.ins:  # the first op of a chain (validation.chains): its input is a buffer of its own
        a.buffers[src] = Buffer((a.T, K), "bf16", "normal", 1.0)
    r.update(K=K, W=f"w:{op.name}", in0=src, ld0=K, opt=OPT_MMA if mma else 0)
    if kc:
        r.update(opt=r["opt"] | OPT_KCHUNK, off2=kc)
    if has_bias(op):  # one per weight row, in the rows' stored order (as the weight: epilogue_rows)
        a.buffers[f"b:{op.name}"] = Buffer((n_rows,), "bf16", "normal", 1.0)
        r.update(bias=f"b:{op.name}")
    if op.attrs.get("fused_norm"):
        a.buffers[f"w2:{op.name}"] = Buffer((K,), "bf16", "norm")
        r.update(opt=r["opt"] | OPT_FUSED_NORM, w2=f"w2:{op.name}", eps=a.cfg.rms_norm_eps)
    if len(op.inputs) > 1:
        r.update(opt=r["opt"] | OPT_RESIDUAL, in1=a.ins[1], ld1=a.ins_op[1].out_size)
    if op.attrs.get("prologue"):
        _reduce_prologue(a)
    epi = op.attrs.get("epilogue")
    if epi:  # the flush hands each row pair (2r, 2r + 1) of a 16-row group to mk_epilogue_pair
        if not mma:
            raise ScheduleError(f"op {op.name}: its fused {epi} epilogue runs on the tensor-core matmul only, which "
                                "needs inputs a multiple of 32, tiles of whole 16-row groups and pages of whole KiB")
        r.update(opt=r["opt"] | EPILOGUE_OPT[epi])
        if epi == "rope_kv":  # rotated with the RoPE table; k and v appended to the layer's KV cache
            r.update(_kv_cache(a), rope="rope")
    return Buffer((a.T, op.out_size), "bf16", "poison")


def has_bias(op: Op) -> bool:
    """Whether matmul ``op`` adds a bias (Qwen2's q, k and v projections): the workload charges its
    bytes, one bf16 per output element, beside the weight's (and a fused norm's) bytes, and the
    kernel reads what the simulator charges.

    >>> import mksim
    >>> ops = {op.name: op for op in mksim.models.workload("qwen2.5-7b").ops}
    >>> has_bias(ops["L0.qkv_proj"]), has_bias(ops["L0.o_proj"])
    (True, False)
    """
    if op.kind != "matmul":
        return False
    k, n = op.attrs["k"], op.out_size
    rows = weight_rows_per_output(op) * n
    plain = k * rows * 2 + (k * 2 if op.attrs.get("fused_norm") else 0)
    return op.weight_bytes == plain + n * 2


def _expert_row(a: RowArgs) -> Buffer:
    """A grouped expert matmul as ``C`` slots (moe.py): its weight is every expert's, stacked (expert
    ``e``'s rows at ``e * rows``, each in the order its epilogue pairs them, in fragment order); its
    output ``C`` slots of ``n`` elements per token; ``tokens`` names the layer's route table (the top-k's
    output), ``pos`` the elements of a slot, ``off2`` the top-k's op (whose counter tells the producer
    that the route table is written: mk_expert_stream). Its input is the normed rows (or the residual,
    the norm fused), or the slots of the expert op before it (``OPT_SLOT_IN``: slot ``j``'s ``K``
    columns)."""
    op, r, cfg = a.op, a.row, a.cfg
    K, G = op.attrs["k"], op.attrs["groups"]
    n, f, C = op.out_size // G, weight_rows_per_output(op), capacity(cfg, a.T)
    if not mma_ok(op, a.bounds, a.page_B):
        raise ScheduleError(f"op {op.name}: expert tiles run on the tensor-core matmul only, which needs inputs a "
                            "multiple of 32, tiles of whole 16-row groups and pages of whole KiB")
    a.buffers[f"w:{op.name}"] = Buffer((cfg.num_experts * f * n, K), "bf16", "normal", K ** -0.5, "mma")
    route = f"out:L{op.layer}.topk"
    if route not in a.buffers or op.layer is None:
        raise ScheduleError(f"op {op.name}: no top-k of layer {op.layer} before it")
    r.update(N=C * n, ld_out=C * n, K=K, W=f"w:{op.name}", in0=a.ins[0], ld0=a.ins_op[0].out_size, pos=n,
             tokens=route, opt=OPT_MMA | OPT_EXPERTS, off2=a.topk_op[op.layer])
    if a.ins_op[0].attrs.get("grouped") == "experts":  # slot j's input: the previous expert op's slot j
        r.update(ld0=C * K, opt=r["opt"] | OPT_SLOT_IN)
    if op.attrs.get("fused_norm"):
        a.buffers[f"w2:{op.name}"] = Buffer((K,), "bf16", "norm")
        r.update(opt=r["opt"] | OPT_FUSED_NORM, w2=f"w2:{op.name}", eps=cfg.rms_norm_eps)
    if op.attrs.get("epilogue") == "silu_mul":
        r.update(opt=r["opt"] | OPT_SILU)
    return Buffer((a.T, C * n), "bf16", "poison")


def _topk_row(a: RowArgs) -> Buffer:
    """The layer's top-k and route table (``mk_topk``; layout in mk_ops.cuh): ``1 + C + 2 T k`` fp32 words."""
    op = a.op
    N, k, C = op.attrs["experts"], op.attrs["top_k"], capacity(a.cfg, a.T)
    scoring = op.attrs["scoring"]
    if scoring not in ("softmax", "sigmoid"):
        raise ScheduleError(f"op {op.name}: no device function for {scoring!r} router scores")
    opt = (TOPK_SIGMOID if scoring == "sigmoid" else 0) | (TOPK_NORM if op.attrs["norm_topk_prob"] else 0)
    a.row.update(N=N, K=k, pos=C, in0=a.ins[0], ld0=a.ins_op[0].out_size, opt=opt, ld_out=0)
    return Buffer((1 + C + 2 * a.T * k,), "f32", "poison")


def _combine_row(a: RowArgs) -> Buffer:
    """The layer's output (``mk_combine``): in0 the down projection's slots, in1 the residual, tokens the
    route table; the shared expert's output in W (its row stride in ld2) and its gate in w2."""
    op, cfg = a.op, a.cfg
    C = capacity(cfg, a.T)
    down, x, route = a.ins[:3]
    a.row.update(K=op.attrs["top_k"], pos=C, in0=down, ld0=C * op.out_size, in1=x, ld1=a.ins_op[1].out_size,
                 tokens=route)
    if len(a.ins) > 3:
        a.row.update(W=a.ins[3], ld2=a.ins_op[3].out_size, opt=COMBINE_SHARED)
    if len(a.ins) > 4:
        a.row.update(w2=a.ins[4], opt=COMBINE_SHARED | COMBINE_GATED)
    return Buffer((a.T, op.out_size), "bf16", "poison")


def _reduce_prologue(a: RowArgs) -> None:
    """A matmul that merges the attention partials into its input rows (``fuse_reduce``;
    ``mk_merge_rows`` in mk_kernel.cu): in0 is the partials (fp32, ld0 floats a partial), and the
    row carries the heads, the head size and the splits, as an ``attn_reduce`` row does. Refuses,
    in one line, what the kernel's merge does not run: another prologue, an input that is not the
    partials (or has other splits), a head size that is not a multiple of 64 (a warp merges 64
    elements of one head), an input size other than the heads', a fused norm."""
    op, r, cfg = a.op, a.row, a.cfg
    pro, src = op.attrs["prologue"], a.ins_op[0] if a.ins_op else None
    hd, G = cfg.head_dim, cfg.num_heads // cfg.num_kv_heads
    why = None
    if pro not in PROLOGUE_OPT:
        why = f"no device function for a fused {pro} prologue; the kernel merges attn_reduce only"
    elif src is None or src.kind != "attn_partial" or src.attrs["kv_splits"] != op.attrs["kv_splits"]:
        why = "its fused attention reduction needs the attention partials of its KV splits as its input"
    elif hd % 64:
        why = f"its fused attention reduction needs a head size that is a multiple of 64, not {hd}"
    elif op.attrs["k"] != cfg.num_heads * hd:
        why = f"its fused attention reduction makes {cfg.num_heads * hd} inputs, not {op.attrs['k']}"
    elif r["opt"] & OPT_FUSED_NORM:
        why = "a fused attention reduction and a fused norm do not go together"
    if why:
        raise ScheduleError(f"op {op.name}: {why}")
    r.update(opt=r["opt"] | PROLOGUE_OPT[pro], hq=cfg.num_heads, hkv=cfg.num_kv_heads, hd=hd,
             splits=op.attrs["kv_splits"], ld0=G * (hd + 2))


def _kv_cache(a: RowArgs) -> dict:
    """The op's layer's K and V caches (added once per layer), and the row fields naming them."""
    hd, nkv, layer, s_max = a.cfg.head_dim, a.cfg.num_kv_heads, a.op.layer, a.kv_len + 1
    for c in ("kc", "vc"):
        a.buffers.setdefault(f"{c}:{layer}", Buffer((a.T, nkv, s_max, hd), "bf16", "normal", 1.0))
    return {"hq": a.cfg.num_heads, "hkv": nkv, "hd": hd, "s_max": s_max, "pos": a.kv_len, "kc": f"kc:{layer}",
            "vc": f"vc:{layer}"}


def _rope_kv_row(a: RowArgs) -> Buffer:
    Q, KV = a.cfg.num_heads * a.cfg.head_dim, a.cfg.num_kv_heads * a.cfg.head_dim
    a.row.update(_kv_cache(a), rope="rope")
    if a.op.attrs.get("qk_norm"):  # RMS norms of q (weight W) and k (w2) before the rotation
        scope = getattr(a.cfg, "qk_norm_scope", "head")
        q_n, k_n = (Q, KV) if scope == "all" else (a.cfg.head_dim, a.cfg.head_dim)
        a.buffers[f"w:{a.op.name}"] = Buffer((q_n,), "bf16", "norm")
        a.buffers[f"w2:{a.op.name}"] = Buffer((k_n,), "bf16", "norm")
        a.row.update(opt=ROPE_NORM[scope], W=f"w:{a.op.name}", w2=f"w2:{a.op.name}", eps=a.cfg.rms_norm_eps)
    if len(a.ins) == 1:  # one fused projection [q; k; v]
        ld = a.ins_op[0].out_size
        a.row.update(in0=a.ins[0], in1=a.ins[0], in2=a.ins[0], ld0=ld, ld1=ld, ld2=ld, off1=Q, off2=Q + KV)
    else:
        a.row.update(in0=a.ins[0], in1=a.ins[1], in2=a.ins[2], ld0=Q, ld1=KV, ld2=KV)
    return Buffer((a.T, a.op.out_size), "bf16", "poison")


def _attn_partial_row(a: RowArgs) -> Buffer:
    cfg, hd = a.cfg, a.cfg.head_dim
    # K: the positions a sliding window attends (the last K of kv_total; 0: all of them)
    a.row.update(_kv_cache(a), splits=a.op.attrs["kv_splits"], kv_total=a.op.attrs["kv_total"], in0=a.ins[0],
                 ld0=a.ins_op[0].out_size, scale=hd ** -0.5, K=a.op.attrs.get("window", 0))
    return Buffer((a.op.out_size, (cfg.num_heads // cfg.num_kv_heads) * (hd + 2)), "f32", "poison")


def _attn_reduce_row(a: RowArgs) -> Buffer:
    cfg = a.cfg
    Q = cfg.num_heads * cfg.head_dim
    a.row.update(hq=cfg.num_heads, hkv=cfg.num_kv_heads, hd=cfg.head_dim, splits=a.op.attrs["kv_splits"],
                 in0=a.ins[0], ld_out=Q)
    return Buffer((a.T, Q), "bf16", "poison")


def _silu_mul_row(a: RowArgs) -> Buffer:
    n = a.op.out_size
    if len(a.ins) == 1:  # one fused gate_up projection
        a.row.update(in0=a.ins[0], in1=a.ins[0], ld0=2 * n, ld1=2 * n, off1=n)
    else:
        a.row.update(in0=a.ins[0], in1=a.ins[1], ld0=n, ld1=n)
    return Buffer((a.T, n), "bf16", "poison")


def _softcap_row(a: RowArgs) -> Buffer:
    a.row.update(in0=a.ins[0], ld0=a.ins_op[0].out_size, scale=a.op.attrs["cap"])
    return Buffer((a.T, a.op.out_size), "bf16", "poison")


# op kind -> the function that fills its op-table row and adds its buffers, returning its output
# buffer: one per kind with an opcode (a test holds this table, OPCODES and the CUDA sources together)
ROWS: dict[str, Callable[[RowArgs], Buffer]] = {
    "embed": _embed_row, "rmsnorm": _rmsnorm_row, "matmul": _matmul_row, "rope_kv": _rope_kv_row,
    "attn_partial": _attn_partial_row, "attn_reduce": _attn_reduce_row, "silu_mul": _silu_mul_row,
    "softcap": _softcap_row, "topk": _topk_row, "combine": _combine_row,
}


@dataclass
class SentinelPlan:
    """``sync="sentinel"`` (Kog's data as its own flag) as tables: no counter, no flag, no fence on
    the producer's side. Every byte of a polled output starts as :data:`SENTINEL_BYTE` (all ones:
    bf16 0xFFFF and fp32 0xFFFFFFFF, NaNs that no output takes: ``mk_f32_to_bf16`` writes every NaN
    as 0x7fc0, the GPU's fp32 arithmetic gives the canonical NaN 0x7fffffff, the weights an
    embedding copies are finite); a producer writes its outputs with plain stores, each element
    once; a consumer's waiter polls every element of the tiles it depends on (16 bytes at a time,
    each element checked, so a partly written row is seen as such) until none is the sentinel, then
    fences once (acquire) before the workers read.

    The reset for the next step is inside the step: a step has two sets of outputs and KV caches
    (``twins``, the second named ``NAME@1``), steps alternate between them, and while step ``s``
    runs on one set its publisher warps (idle with sentinels: nothing to publish) write the
    sentinel over the other set's outputs and the KV-cache slot the step appends (``resets``), which
    no task of step ``s`` reads; step ``s + 1`` starts after step ``s`` has ended. In a decode loop
    the slot would be the next position's; here every step appends at the same one."""
    polls: list[tuple[str, int, int]]   # per segment: buffer, byte offset, kind (POLL_KINDS)
    poll_end: np.ndarray                # int32 per segment: units of its dependency's list up to it
    poll_deps: np.ndarray               # (n_deps, 2) int32: each dependency row's segments [s0, s1)
    resets: list[tuple[str, int, int]]  # buffer, byte offset, bytes (<= RESET_CHUNK_B): one step's reset
    twins: tuple[str, ...]              # buffers a step has two of


def byte_segments(buffer: str, a: int, z: int, esz: int) -> list[tuple[str, int, int, int]]:
    """Bytes ``[a, z)`` of ``buffer`` (elements of ``esz`` bytes; the buffer 16-byte aligned) as
    poll segments ``(buffer, offset, kind, units)``: whole 16-byte words, and single elements for
    an unaligned head and tail.

    >>> byte_segments("x", 6, 40, 2)
    [('x', 6, 2, 5), ('x', 16, 0, 1), ('x', 32, 2, 4)]
    """
    if a % esz or z % esz:
        raise ValueError(f"bytes [{a}, {z}) are not whole {esz}-byte elements")
    A = min(z, -(-a // 16) * 16)
    Z = A + (z - A) // 16 * 16
    out = []
    if A > a:
        out.append((buffer, a, POLL_KINDS["one", esz], (A - a) // esz))
    if Z > A:
        out.append((buffer, A, POLL_KINDS["vec", esz], (Z - A) // 16))
    if z > Z:
        out.append((buffer, Z, POLL_KINDS["one", esz], (z - Z) // esz))
    return out


def written_bytes(op: Op, row: dict, lo: int, hi: int, T: int) -> list[tuple[str, int, int, int]]:
    """What tiles ``[lo, hi)`` (output elements, the op's tile bounds) of ``op`` write:
    ``(buffer, first byte, end byte, element bytes)`` ranges, adjacent ones merged: its rows of the
    output and, for ``rope_kv`` (or a matmul with RoPE in its epilogue), the KV-cache slot it
    appends. A matmul with RoPE in its epilogue writes the elements its stored rows
    (:func:`rope_pair_rows`) hold: whole heads are the same range, a tile that splits a head
    writes runs of 8 elements of each half."""
    out: list[tuple[str, int, int, int]] = []

    def add(buf: str, a: int, z: int, esz: int) -> None:
        if out and out[-1][0] == buf and out[-1][2] == a:
            out[-1] = (buf, out[-1][1], z, esz)
        elif z > a:
            out.append((buf, a, z, esz))

    if op.kind == "attn_partial":  # fp32 partials, one row of G (D + 2) floats each
        stride = row["hq"] // row["hkv"] * (row["hd"] + 2) * 4
        add(row["out"], lo * stride, hi * stride, 4)
        return out
    ld = row["ld_out"]
    if op.kind == "attn_reduce":  # reduction i: the G heads of kv head g = i // T of row b = i % T
        GD = row["hq"] // row["hkv"] * row["hd"]
        for i in range(lo, hi):
            g, b = divmod(i, T)
            add(row["out"], (b * ld + g * GD) * 2, (b * ld + (g + 1) * GD) * 2, 2)
        return out
    rope = op.kind == "rope_kv" or (op.kind == "matmul" and op.attrs.get("epilogue") == "rope_kv")
    spans = [(lo, hi)]  # the output elements, in runs
    if op.kind == "matmul" and rope:
        D = row["hd"]
        e = np.sort(rope_pair_rows(op.out_size, (row["hq"] + row["hkv"]) * D, D)[lo:hi])
        cut = np.flatnonzero(np.diff(e) != 1) + 1
        spans = [(int(r[0]), int(r[-1]) + 1) for r in np.split(e, cut)]
    for b in range(T):  # the other kinds: tiles are ranges of each row's output elements
        for e0, e1 in spans:
            add(row["out"], (b * ld + e0) * 2, (b * ld + e1) * 2, 2)
    if rope:
        D, hkv, s_max, pos = row["hd"], row["hkv"], row["s_max"], row["pos"]
        Q, KV = row["hq"] * D, hkv * D
        for cache, base in (("kc", Q), ("vc", Q + KV)):
            for b in range(T):
                for h in range(hkv):
                    for s0, s1 in spans:
                        e0, e1 = max(s0, base + h * D), min(s1, base + (h + 1) * D)
                        if e1 > e0:
                            slot = ((b * hkv + h) * s_max + pos) * D
                            add(row[cache], (slot + e0 - base - h * D) * 2, (slot + e1 - base - h * D) * 2, 2)
    return out


def sentinel_plan(schedule, rows: list[dict], buffers: dict[str, Buffer], program: Program) -> SentinelPlan:
    """The poll segments of every dependency of ``program`` and the reset of one step (see
    :class:`SentinelPlan`)."""
    wl, g = schedule.workload, schedule.graph
    bounds = [b.tolist() for b in g.bounds]
    polls: list[tuple[str, int, int]] = []
    ends: list[int] = []
    lists: dict[tuple[int, int, int], tuple[int, int]] = {}
    poll_deps = np.zeros((len(program.deps), 2), dtype=np.int32)
    for d, (_kind, p, t0, t1) in enumerate(program.deps.tolist()):
        key = (p, t0, t1)
        if key not in lists:
            s0, units = len(polls), 0
            for buf, a, z, esz in written_bytes(wl.ops[p], rows[p], bounds[p][t0], bounds[p][t1], wl.batch):
                for _b, off, kind, n in byte_segments(buf, a, z, esz):
                    units += n
                    polls.append((buf, off, kind))
                    ends.append(units)
            lists[key] = (s0, len(polls))
        poll_deps[d] = lists[key]
    twins = tuple(n for n in buffers if n.startswith(("out:", "kc:", "vc:")))
    spans: list[tuple[str, int, int]] = [(n, 0, buffers[n].nbytes) for n in twins if n.startswith("out:")]
    for r in rows:  # the KV-cache slot each rope_kv (or matmul with RoPE in its epilogue) appends
        if r["kind"] == OPCODES["rope_kv"] or (r["kind"] == OPCODES["matmul"] and r["opt"] & OPT_ROPE):
            D, slot_B = r["hd"], r["hd"] * 2
            for cache in ("kc", "vc"):
                for bh in range(wl.batch * r["hkv"]):
                    spans.append((r[cache], ((bh * r["s_max"]) + r["pos"]) * D * 2, slot_B))
    resets = [(n, a + c, min(RESET_CHUNK_B, nb - c)) for n, a, nb in spans for c in range(0, nb, RESET_CHUNK_B)]
    return SentinelPlan(polls=polls, poll_end=np.array(ends, dtype=np.int32), poll_deps=poll_deps, resets=resets,
                        twins=twins)


def twin(name: str, parity: int) -> str:
    """The name of buffer ``name`` in the set of step parity ``parity`` (sync="sentinel")."""
    return f"{name}@1" if parity else name


def poll_table(sp: SentinelPlan, address: dict[str, int]) -> np.ndarray:
    """The poll segments with buffer names replaced by device addresses (POLL_FIELDS)."""
    t = np.zeros(len(sp.polls), dtype=POLL_FIELDS)
    for i, (buf, off, kind) in enumerate(sp.polls):
        t[i] = (address[buf] + off, sp.poll_end[i], kind)
    return t


def reset_table(sp: SentinelPlan, address: dict[str, int]) -> np.ndarray:
    """The reset pieces with buffer names replaced by device addresses (RESET_FIELDS)."""
    t = np.zeros(len(sp.resets), dtype=RESET_FIELDS)
    for i, (buf, off, nb) in enumerate(sp.resets):
        t[i] = (address[buf] + off, nb)
    return t


def plan(schedule, seed: int = 0) -> Plan:
    """The buffers, op table and instruction tables of ``schedule`` (any mode)."""
    check_supported(schedule)
    wl = schedule.workload
    g = kernel_graph(schedule)  # the tasks the kernel runs (an MoE step's differ from the graph's: moe.py)
    cfg = wl.model
    T, kv_len = wl.batch, wl.kv_len
    buffers: dict[str, Buffer] = {
        "tokens": Buffer((T,), "i32", "tokens", cfg.vocab_size),
        "rope": Buffer((cfg.head_dim,), "f32", "rope", cfg.rope_theta),
    }
    index = wl.index
    page_B = int(schedule.options.page_KiB * 1024)
    flag_base = np.concatenate([[0], np.cumsum(g.n_tiles)]).astype(np.int64)
    rows: list[dict] = []
    outputs: list[str] = []
    topk_op = {op.layer: i for i, op in enumerate(wl.ops) if op.kind == "topk"}

    def out_name(name: str) -> str:
        return f"out:{name}"

    for i, op in enumerate(wl.ops):
        r: dict[str, Any] = ({f: 0 for f in OP_INT_FIELDS} | {f: 0.0 for f in OP_FLOAT_FIELDS}
                             | {f: None for f in OP_PTR_FIELDS})
        r.update(kind=OPCODES[op.kind], n_tiles=int(g.n_tiles[i]), N=op.out_size, T=T, flag_base=int(flag_base[i]),
                 ld_out=op.out_size, bounds=f"bounds:{op.name}", out=out_name(op.name))
        buffers[f"bounds:{op.name}"] = Buffer((int(g.n_tiles[i]) + 1,), "i32", "bounds")
        args = RowArgs(op=op, row=r, ins=[out_name(inp.op) for inp in op.inputs],
                       ins_op=[wl.ops[index[inp.op]] for inp in op.inputs], buffers=buffers, cfg=cfg, T=T,
                       kv_len=kv_len, bounds=g.bounds[i], page_B=page_B, topk_op=topk_op)
        out = ROWS[op.kind](args)  # check_supported has refused kinds without one
        buffers[out_name(op.name)] = out
        outputs.append(out_name(op.name))
        rows.append(r)

    o = schedule.options
    k_min = min(op.attrs["k"] for op in wl.ops if op.kind == "matmul")
    x_B = x_region_bytes(schedule)
    n_rows = acc_rows(page_B, k_min)
    depth = o.prefetch_depth
    if depth == 0:  # the ring still needs pages to stream a task through; as many as fit, up to 4
        depth = max(2, min(RING_WITHOUT_PREFETCH, (SMEM_MAX_B - smem_bytes(0, 0, x_B, n_rows, T)) // (page_B + 16)))
    smem = smem_bytes(page_B, depth, x_B, n_rows, T)
    for i, r in enumerate(rows):
        if r["opt"] & OPT_KCHUNK:
            check_kc_slots(wl.ops[i], r["off2"], g.bounds[i], x_B, n_rows, T)
    if smem > SMEM_MAX_B:
        room = (SMEM_MAX_B - smem_bytes(0, 0, x_B, n_rows, T)) // (page_B + 16)
        raise ScheduleError(f"the kernel needs {smem / 1024:.1f} KiB of shared memory per block ({depth} pages of "
                            f"{page_B // 1024} KiB + {(smem - depth * page_B) / 1024:.1f} KiB of inputs and "
                            f"accumulators) > 227 KiB; use prefetch_depth <= {max(room, 0)} or smaller pages")
    if schedule.queues is not None:
        queues = g.queues(schedule) if g is not schedule.graph else schedule.queues
        program = encode_queues(g, queues, o.sync)
    else:  # chains: every task in id order, one block per task
        program = encode_queues(g, [list(range(len(g)))], o.sync)
    sentinel = None
    if o.sync == "sentinel" and schedule.mode == "megakernel":
        sentinel = sentinel_plan(schedule, rows, buffers, program)
    return Plan(schedule=schedule, buffers=buffers, ops=rows, program=program, page_B=page_B, depth=depth,
                ahead=o.prefetch_depth > 0, x_B=x_B, acc_rows=n_rows, smem_B=smem, outputs=outputs,
                sentinel=sentinel, l2_lead_B=l2_lead_B(o.l2_prefetch_KiB), defines=attn_defines(cfg), graph=g)


def kc_slots(kc: int, x_B: int, rows: int, T: int) -> int:
    """The row-group slots of a k-chunked matmul (``mk_matmul_kc``): past its two chunk buffers in
    the x region, then the accumulator region, at most ``MK_MM_SLOTS`` (16)."""
    return min(16, (x_B + 4 * T * rows - 2 * T * kc * 2) // (CONSUMERS * 16 * T * 4))


def check_kc_slots(op: Op, kc: int, bounds, x_B: int, rows: int, T: int) -> None:
    """Refuse, in one line, a k-chunked matmul whose largest task has more 16-row groups than slots:
    every group of a task keeps its slot until the last chunk is in (``mk_matmul_kc``)."""
    ng = int(np.diff(np.asarray(bounds)).max()) * weight_rows_per_output(op) // 16
    S = kc_slots(kc, x_B, rows, T)
    if ng > S or S < 2:
        raise ScheduleError(f"op {op.name}: a task of {ng} row groups with chunked input rows needs a slot each, and "
                            f"shared memory holds {S}; use smaller tiles")


def l2_lead_B(l2_prefetch_KiB: float) -> int:
    """The L2 prefetcher's lead in bytes (MkParams.l2_lead_B) for the schedule option
    ``l2_prefetch_KiB``: whole 16-byte words, below 2 GiB.

    >>> l2_lead_B(0), l2_lead_B(256), l2_lead_B(0.1)
    (0, 262144, 96)
    """
    b = int(l2_prefetch_KiB * 1024) // 16 * 16
    if b >= 2 ** 31:
        raise ScheduleError(f"l2_prefetch_KiB must be below 2 GiB (2097152 KiB), got {l2_prefetch_KiB:g}")
    return b


def rope_table(head_dim: int, theta: float, pos: int) -> np.ndarray:
    """cos and sin of the rotary angles at position ``pos`` (the plain RoPE frequencies)."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = pos * inv
    return np.concatenate([np.cos(ang), np.sin(ang)]).astype(np.float32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 (nearest even), as raw uint16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = (u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16
    return r.astype(np.uint16)


def op_table(plan: Plan, address: dict[str, int]) -> np.ndarray:
    """The op table with buffer names replaced by device addresses."""
    t = np.zeros(len(plan.ops), dtype=OP_FIELDS)
    for i, r in enumerate(plan.ops):
        for f in OP_INT_FIELDS + OP_FLOAT_FIELDS:
            t[i][f] = r[f]
        for f in OP_PTR_FIELDS:
            t[i][f] = address[r[f]] if r[f] is not None else 0
    return t
