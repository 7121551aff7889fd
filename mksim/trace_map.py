"""Which op of a model step each kernel of a profiler trace belongs to (:mod:`mksim.trace`).

Two steps. First each kernel name gets a *hint*, the op kind its name suggests (:func:`kernel_hint`):
cuBLAS/cuBLASLt/CUTLASS GEMMs (``nvjet``, ``gemm``, ``gemv``) are ``matmul``; flash / SDPA / FMHA kernels
``attn_partial`` and their combine or reduction kernels ``attn_reduce``; ``indexSelect`` / embedding
``embed``; mean, rsqrt, ``x.pow(2)`` or a fused RMS norm ``rmsnorm``; ``neg``, ``cat``, ``cos``, ``sin``
and rotary kernels ``rope_kv``; SiLU ``silu_mul``; a split-K reduction an ``epilogue`` of its GEMM; a
bf16 ``add`` the residual add; other elementwise kernels (copies, casts, multiplies) ``elementwise``.

Then the kernels with a specific hint are aligned with the ops of mksim's workload in order
(:func:`align`): a monotone assignment that maximises agreement (a GEMM on a matmul op scores most,
another kernel on an op of its kind less, a kernel on an op of another kind nothing: it stays unmapped).
A kernel whose kind has no op where it runs (torch's RoPE table, computed once per step) stays
unmapped. ``elementwise`` and ``add`` kernels follow their neighbours: the op of the specific
kernel after them when it can hold elementwise work (an ``x.float()`` copy before a norm's mean), else
the one before (the multiply after SiLU), else, between two GEMM or attention kernels, the elementwise
op between their ops (an Inductor RoPE kernel between the q/k/v GEMM and attention); the residual add
joins the GEMM it follows.

>>> kernel_hint("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT")
'matmul'
>>> kernel_hint("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x64_1x4x1_cga1x1x1_kernel0_0")
'attn_partial'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from mksim.workload import KINDS, Op

__all__ = ["ANCHOR_KINDS", "HINTS", "TRITON_WORDS", "align", "kernel_hint"]

#: (hint, pattern) in the order tried; the first pattern found in the lower-cased name wins.
HINTS: tuple[tuple[str, str], ...] = (
    ("memory", r"^memset|^memcpy"),
    ("epilogue", r"splitkreduce|splitk_reduce|split_k_reduce"),
    ("rope_kv", r"reshape_and_cache|concat_and_cache|kv_cache|cache_kernel"),   # the KV write (before "flash")
    ("attn_reduce", r"lean_reduction|combine|flash_fwd_splitkv_combine|reduce_attn|attn_reduce"),
    ("attn_partial", r"flash|fmha|sdpa|attention|attn|paged_attention|decode_kernel"),
    ("matmul", r"nvjet|gemm|gemv|cutlass|xmma|cublas|matmul|_mm_|\bmm\b"),
    ("rope_kv", r"rope|rotary|neg_kernel|catarray|cos_kernel|sin_kernel|arange|reciprocal|pow_tensor_tensor"),
    ("embed", r"indexselect|index_select|embedding"),
    ("rmsnorm", r"rms|layer_?norm|meanops|rsqrt|pow_tensor_scalar"),
    ("silu_mul", r"silu|swiglu|gelu|act_and_mul|swish"),
    ("sample", r"argmax|softmax|topk|sampl"),
    ("add", r"cudafunctor_add<c10::bfloat16>|cudafunctor_add<c10::half>"),
    ("elementwise", r"elementwise|copy|fill|mul|add|functor|cast|triton|vectorized"),
)
_COMPILED = tuple((h, re.compile(p)) for h, p in HINTS)
#: Kinds whose kernels anchor the alignment: few, unmistakable, and one (or a few) per op (``OpKind.anchor``).
ANCHOR_KINDS = KINDS.view(lambda k: k.anchor)
#: Catch-all kinds of traced models whose kernels join a neighbouring op (``OpKind.generic``).
_GENERIC = KINDS.view(lambda k: k.generic)
ANCHOR_SCORE, ANCHOR_REPEAT_SCORE, KIND_SCORE = 10.0, 3.0, 2.0


#: Inductor's Triton kernels are named after the ATen ops they fuse (``triton_red_fused_add_mean_pow_rsqrt_0``):
#: (hint, any of these words), tried in order.
TRITON_WORDS: tuple[tuple[str, frozenset[str]], ...] = (
    ("matmul", frozenset({"mm", "addmm", "bmm", "gemm"})),
    ("embed", frozenset({"embedding"})),
    ("rmsnorm", frozenset({"rsqrt", "mean"})),
    ("rope_kv", frozenset({"neg", "cos", "sin", "rotary"})),
    ("silu_mul", frozenset({"silu", "sigmoid", "gelu"})),
    ("sample", frozenset({"argmax", "softmax", "topk"})),
)


def kernel_hint(name: str) -> str | None:
    """The op kind a kernel's name suggests (see :data:`HINTS` and :data:`TRITON_WORDS`), or ``None``.

    >>> kernel_hint("triton_poi_fused_add_cat_mul_neg_slice_2"), kernel_hint("triton_poi_fused_mul_silu_3")
    ('rope_kv', 'silu_mul')
    """
    low = name.lower()
    if low.startswith("triton_") and "flash" not in low and "attn" not in low:
        words = set(low.split("_"))
        for hint, group in TRITON_WORDS:
            if words & group:
                return hint
        return "elementwise"
    for hint, pat in _COMPILED:
        if pat.search(low):
            return hint
    return None


def _slot(op: Op) -> str:
    """What kernels an op can take: its kind, or ``rope_kv+rmsnorm`` for a RoPE that also does Qwen3's
    per-head q/k RMS norms (torch runs those as norm kernels between the q/k/v GEMM and RoPE): the
    kernels of either kind."""
    return f"{op.kind}+rmsnorm" if op.kind == "rope_kv" and op.attrs.get("qk_norm") else op.kind


def _score(hint: str, kind: str) -> float:
    if "+" in kind and hint in kind.split("+"):
        return KIND_SCORE
    if hint == kind:
        return ANCHOR_SCORE if kind in ANCHOR_KINDS else KIND_SCORE
    if hint == "epilogue" and kind == "matmul":
        return KIND_SCORE
    return 0.0


def align(hints: Sequence[str | None], ops: Sequence[Op]) -> list[int | None]:
    """The index into ``ops`` of each kernel (``None``: unmapped), kernels and ops both in step order.

    >>> from mksim import models
    >>> ops = models.workload("llama-3.2-1b").ops[:4]   # embed, L0.attn_norm, L0.qkv_proj, L0.rope_kv
    >>> align(["embed", "rope_kv", "elementwise", "rmsnorm", "matmul", "elementwise", "rope_kv"], ops)
    [0, None, 1, 1, 2, 3, 3]
    """
    kinds = [_slot(op) for op in ops]
    spec = [i for i, h in enumerate(hints) if h is not None and h not in _GENERIC and h != "memory"]
    out: list[int | None] = [None] * len(hints)
    if spec and kinds:
        for i, j in zip(spec, _monotone([hints[i] or "" for i in spec], kinds), strict=True):
            out[i] = j
    _fill_generic(hints, kinds, out)
    return out


def _monotone(hints: list[str], kinds: list[str]) -> list[int | None]:
    """The best non-decreasing assignment of kernels to ops (dynamic programming over kernels, vectorised
    over ops): a kernel on an op of its kind scores; a second anchor kernel on the same op scores less
    (q, k and v as three GEMMs of one fused op are possible, but one GEMM per op is likelier)."""
    m = len(kinds)
    table = {h: np.array([_score(h, k) for k in kinds]) for h in set(hints)}
    anchor = {h: h in ANCHOR_KINDS for h in table}
    best = table[hints[0]].copy()
    # came_from[i, j]: the op of kernel i - 1 on the best path that puts kernel i on op j
    came_from = np.zeros((len(hints), m), dtype=np.int32)
    idx = np.arange(m)
    for i in range(1, len(hints)):
        sc = table[hints[i]]
        same = best + (np.minimum(sc, ANCHOR_REPEAT_SCORE) if anchor[hints[i]] else sc)
        # best over ops strictly before j, and where it was
        run_arg = np.maximum.accumulate(np.where(best == np.maximum.accumulate(best), idx, 0))
        prev_best = np.concatenate(([-np.inf], np.maximum.accumulate(best)[:-1]))
        prev_arg = np.concatenate(([0], run_arg[:-1]))
        fresh = prev_best + sc
        take_same = same >= fresh
        came_from[i] = np.where(take_same, idx, prev_arg)
        best = np.where(take_same, same, fresh)
    j = int(np.argmax(best))
    path = [j]
    for i in range(len(hints) - 1, 0, -1):
        j = int(came_from[i, j])
        path.append(j)
    path.reverse()
    return [j if _score(h, kinds[j]) > 0 else None for h, j in zip(hints, path, strict=True)]


def _fill_generic(hints: Sequence[str | None], kinds: list[str], out: list[int | None]) -> None:
    """Elementwise kernels join the op of a specific neighbour (see the module's docstring)."""
    n = len(hints)
    prev_spec: list[int | None] = [None] * n
    next_spec: list[int | None] = [None] * n
    last: int | None = None
    for i in range(n):
        prev_spec[i] = last
        if hints[i] not in _GENERIC:
            last = i
    last = None
    for i in range(n - 1, -1, -1):
        next_spec[i] = last
        if hints[i] not in _GENERIC:
            last = i
    for i, h in enumerate(hints):
        if h not in _GENERIC:
            continue
        p, q = prev_spec[i], next_spec[i]
        before = out[p] if p is not None else None
        after = out[q] if q is not None else None
        if h == "add" and before is not None and kinds[before] == "matmul":
            out[i] = before            # the residual add after the O or down projection
        elif after is not None and kinds[after] not in ANCHOR_KINDS:
            out[i] = after
        elif before is not None and kinds[before] not in ANCHOR_KINDS:
            out[i] = before
        elif before is not None and after is not None:  # between two anchors: the elementwise op between
            between = [j for j in range(before + 1, after) if kinds[j] not in ANCHOR_KINDS]
            if between:
                out[i] = between[0]
