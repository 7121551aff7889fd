"""What the blocks of a model write into: a :class:`Build` (how the op graph is cut), the quantities a
step derives (:func:`attended_tokens`, :func:`resolved_kv_splits`: computed here only, and read from here
by the builder, the schedule file and the search), and the :class:`Builder` that collects the ops.

>>> from mksim import models
>>> from mksim.workload import Step
>>> cfg = models.get("llama-3.2-1b")
>>> resolved_kv_splits(cfg, Step(cfg, batch=1, kv_len=1024), Build(n_sms=132))
5
>>> resolved_kv_splits(cfg, Step(cfg, batch=1, kv_len=1024), Build(kv_splits=4096))  # at most one token each
1025
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mksim.errors import WorkloadError

from ._ops import Input, Op
from .parallel import COLLECTIVE_ALIGN, collective_attrs
from .step import Step

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
ACT_BYTES = 2          # activations and the KV cache are bf16
PARTIAL_BYTES = 4      # attention partial outputs (o, max, sum) are fp32
MATMUL_ALIGN = 16      # output rows per tile step of a matmul (an MMA tile)
VEC_ALIGN = 64         # elements per tile step of an elementwise op
KV_SPLIT_MIN_TOKENS = 256  # flash-decoding does not split the KV cache finer than this
#: the fusion and split switches of :class:`Build`, in the order a workload's name lists them
SWITCHES = ("fuse_norm", "fuse_rope", "fuse_silu", "fuse_reduce", "split_qkv", "split_gate_up")


@dataclass(frozen=True)
class Build:
    """How a model step's op graph is cut: the choices a schedule makes about the ops themselves.

    ``fuse_norm`` folds each RMS norm into the matmul that follows it; ``fuse_rope`` applies RoPE (and
    the KV-cache append) in the fused q/k/v projection's epilogue; ``fuse_silu`` computes SiLU(gate) * up
    in the fused gate/up projection's epilogue; ``fuse_reduce`` merges the attention partials while
    ``o_proj`` loads its input; ``split_qkv`` / ``split_gate_up`` make separate projections (not with the
    epilogue that needs the fused one); ``logit_softcap`` > 0 caps the logits (Gemma 2 uses 30);
    ``kv_splits`` (None: :func:`default_kv_splits`) is flash-decoding's split of the KV cache, for
    ``n_sms`` SMs. Bad values are refused as the value is made, in one line.

    >>> Build(fuse_norm=True).label
    ' fused-norm'
    >>> Build(kv_splits=0)
    Traceback (most recent call last):
    ...
    mksim.errors.WorkloadError: kv_splits must be a positive integer, got 0
    """

    fuse_norm: bool = False
    fuse_rope: bool = False
    fuse_silu: bool = False
    fuse_reduce: bool = False
    split_qkv: bool = False
    split_gate_up: bool = False
    logit_softcap: float = 0.0
    kv_splits: int | None = None
    n_sms: int = 132

    def __post_init__(self) -> None:
        for key in SWITCHES:
            if not isinstance(getattr(self, key), bool):
                raise WorkloadError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if self.fuse_rope and self.split_qkv:
            raise WorkloadError("fuse_rope rotates q and k in the fused q/k/v projection's epilogue; it cannot go "
                                "with split_qkv (choose one)")
        if self.fuse_silu and self.split_gate_up:
            raise WorkloadError("fuse_silu computes SiLU(gate) * up in the fused gate/up projection's epilogue; it "
                                "cannot go with split_gate_up (choose one)")
        c, n, cap = self.kv_splits, self.n_sms, self.logit_softcap
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise WorkloadError(f"kv_splits must be a positive integer, got {c!r}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise WorkloadError(f"n_sms (SMs the workload is tiled for) must be a positive integer, got {n!r}")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 0:
            raise WorkloadError(f"logit_softcap must be a number >= 0 (0: no soft-capping), got {cap!r}")

    @property
    def label(self) -> str:
        """What a workload's name adds for these choices (`` fused-norm split-qkv softcap30``)."""
        words = "".join(f" {k.replace('fuse_', 'fused-').replace('_', '-')}" for k in SWITCHES if getattr(self, k))
        return words + (f" softcap{self.logit_softcap:g}" if self.logit_softcap else "")

    @property
    def options(self) -> tuple[tuple[str, Any], ...]:
        """The choices :class:`~mksim.workload.Workload` records beyond its own fields (``options``)."""
        return (("logit_softcap", float(self.logit_softcap)),) if self.logit_softcap else ()


def default_kv_splits(kv_heads: int, batch: int, kv_total: int, n_sms: int = 132) -> int:
    """Flash-decoding's split of the KV cache: enough partials to cover the SMs once."""
    want = math.ceil(n_sms / max(1, kv_heads * batch))
    return max(1, min(want, math.ceil(kv_total / KV_SPLIT_MIN_TOKENS)))


def layer_window(cfg: Any, layer: int) -> int | None:
    """The attention window of ``layer`` in tokens, or None (an object without
    :meth:`~mksim.models.ModelConfig.window`, such as a test's stand-in, has none)."""
    window = getattr(cfg, "window", None)
    return window(layer) if callable(window) else None


def attended_tokens(cfg: Any, step: Step) -> int:
    """Tokens a layer attends to at most in ``step``: the KV cache plus the new tokens, capped by a
    sliding window (Mistral, Qwen2) where every layer has one."""
    windows = {layer_window(cfg, layer) for layer in range(cfg.num_layers)}
    if None in windows:
        return step.kv_total
    return min(step.kv_total, max(w for w in windows if w is not None))


def resolved_kv_splits(cfg: Any, step: Step, build: Build) -> int:
    """The KV split the attention ops of ``cfg`` in ``step`` use: ``build.kv_splits`` or
    :func:`default_kv_splits` for ``build.n_sms``, never finer than one token a split."""
    kv_attn = attended_tokens(cfg, step)
    return min(build.kv_splits or default_kv_splits(cfg.num_kv_heads, step.batch, kv_attn, build.n_sms), kv_attn)


class Builder:
    """The ops of one step as its blocks add them, in order, with the step's derived quantities:
    ``rows`` (tokens through the projections), ``kv_splits`` (:func:`resolved_kv_splits`), ``weight_B``
    (bytes per weight). :meth:`norm` and :meth:`matmul` make the two ops every block uses, honouring
    ``build.fuse_norm``; a block's own ops go through :meth:`add`. A mixture-of-experts block appends
    each MoE layer's routing (:class:`~mksim.workload.routing.RoutedLayer`) to ``routing``; the
    workload keeps it."""

    def __init__(self, cfg: Any, step: Step, build: Build):
        self.cfg, self.step, self.build = cfg, step, build
        self.ops: list[Op] = []
        self.rows = step.rows
        self.kv_splits = resolved_kv_splits(cfg, step, build)
        self.weight_B = DTYPE_BYTES[step.weight_dtype]
        self.routing: list[Any] = []
        self.tp, self.ep = step.tp, step.ep

    def residual(self, x: str) -> str | None:
        """The residual a row-parallel product adds itself: ``x`` on one GPU; under tensor parallelism
        none (its output is a partial sum: :meth:`all_reduce` adds the residual once)."""
        return x if self.tp == 1 else None

    def all_reduce(self, src: str, layer: int | None, residual: str) -> str:
        """After a row-parallel product ``src`` (o_proj, down_proj): its partial sums reduced over the ``tp``
        GPUs, + the residual ``x``; ``src`` itself on one GPU (whose product added the residual)."""
        if self.tp == 1:
            return src
        H, T = self.cfg.hidden_size, self.rows
        return self.collective(f"{src}.all_reduce", "all_reduce", src, H, T * ACT_BYTES, layer, self.tp,
                               T * H * ACT_BYTES, flops=T * H * self.tp, extra=(Input(residual),))

    def collective(self, name: str, kind: str, src: str, out_size: int, elem_bytes: float, layer: int | None,
                   ranks: int, message_B: float, *, flops: float = 0.0, extra: tuple[Input, ...] = ()) -> str:
        """A collective op of ``kind`` after the whole of ``src`` (:mod:`mksim.workload.parallel`)."""
        return self.add(name=name, kind=kind, out_size=out_size, elem_bytes=elem_bytes, flops=flops,
                        inputs=(Input(src, full=True), *extra), layer=layer, align=COLLECTIVE_ALIGN,
                        attrs=collective_attrs(kind, ranks, message_B))

    def add(self, **fields: Any) -> str:
        """Append ``Op(**fields)``; returns its name."""
        self.ops.append(Op(**fields))
        return fields["name"]

    def op(self, name: str) -> Op:
        """The op called ``name`` (the latest of that name)."""
        return next(o for o in reversed(self.ops) if o.name == name)

    def norm(self, name: str, src: str, layer: int | None) -> str:
        """An RMS norm of ``src``'s rows; with ``fuse_norm`` none (the next matmul, ``normed``, does it)."""
        if self.build.fuse_norm:
            return src
        H, T = self.cfg.hidden_size, self.rows
        return self.add(name=name, kind="rmsnorm", out_size=H, elem_bytes=T * ACT_BYTES, flops=4.0 * T * H,
                        weight_bytes=H * ACT_BYTES, inputs=(Input(src, full=True),), layer=layer, align=VEC_ALIGN)

    def matmul(self, name: str, src: str, k: int, n: int, layer: int | None, *, residual: str | None = None,
               rows: int | None = None, bias: bool = False, normed: bool = False, extra_flops: float = 0.0,
               kv_write_bytes: float = 0.0, out_size: int | None = None, align: int = MATMUL_ALIGN,
               attrs: dict[str, Any] | None = None) -> str:
        """``rows`` (default :attr:`rows`) times a ``k`` × ``n`` weight, + ``residual`` where given; a
        ``normed`` one does the norm before it under ``fuse_norm``. A fused prologue or epilogue adds its
        arithmetic (``extra_flops``), its KV-cache writes, its output size and alignment and its ``attrs``."""
        T = self.rows
        rows = T if rows is None else rows
        inputs = [Input(src, full=True)] + ([Input(residual)] if residual else [])
        fused = self.build.fuse_norm and normed  # the norm's arithmetic and weight, once per op
        op_attrs: dict[str, Any] = {"k": k, "rows": rows, "fused_norm": fused, **(attrs or {})}
        return self.add(name=name, kind="matmul", out_size=n if out_size is None else out_size,
                        elem_bytes=rows * ACT_BYTES,
                        flops=2.0 * rows * k * n + (rows * n if residual else 0) + (4.0 * T * k if fused else 0)
                        + extra_flops,
                        weight_bytes=k * n * self.weight_B + (n * ACT_BYTES if bias else 0)
                        + (k * ACT_BYTES if fused else 0),
                        kv_write_bytes=kv_write_bytes, inputs=tuple(inputs), layer=layer, align=align,
                        dtype=self.step.weight_dtype, attrs=op_attrs)


__all__ = ["ACT_BYTES", "Build", "Builder", "DTYPE_BYTES", "MATMUL_ALIGN", "PARTIAL_BYTES", "SWITCHES", "VEC_ALIGN",
           "attended_tokens", "default_kv_splits", "layer_window", "resolved_kv_splits"]
