"""Grouped-query attention (multi-head attention is the case of one query head per KV head), with the
variants a config selects: biases on q, k and v (``attention_bias``), RMS norms of q and k per head
(``qk_norm``; over the whole q and k where ``qk_norm_scope`` is ``"all"``, OLMoE's: each head's
rotation then waits for the whole projection), sliding windows (``ModelConfig.window``). Decoding splits the KV cache
(flash-decoding): ``attn_partial`` makes one partial per (KV head, sequence, split) and ``attn_reduce``
merges them.

Its ops: ``attn_norm`` (unless ``fuse_norm``); ``qkv_proj`` (or, with ``split_qkv``, ``q_proj``,
``k_proj``, ``v_proj``); ``rope_kv`` (RoPE, and k and v appended to the KV cache; with ``fuse_rope``
none: ``qkv_proj``'s epilogue does it and names it in ``attrs["epilogue"]``); ``attn_partial``;
``attn_reduce`` (with ``fuse_reduce`` none: ``o_proj`` merges the partials of each of its input rows
while it loads them, its arithmetic once per op, and names it in ``attrs["prologue"]`` with
``attrs["kv_splits"]`` and ``attrs["prologue_bytes"]``, the partials each of its tasks reads first);
``o_proj`` with the residual (under tensor parallelism a partial sum, and ``o_proj.all_reduce`` after it
adds the residual: :mod:`mksim.workload.parallel`; the block sees one GPU's heads).
"""

from __future__ import annotations

from typing import Any

from mksim.errors import WorkloadError

from .._blocks import BLOCKS, BaseBlock
from .._builder import ACT_BYTES, PARTIAL_BYTES, Build, Builder, layer_window
from .._ops import Input


@BLOCKS.add
class GroupedQueryAttention(BaseBlock):
    """``gqa``: the attention of Llama, Mistral and Qwen."""

    name = "gqa"
    role = "attention"

    def check(self, cfg: Any, build: Build) -> None:
        if build.fuse_rope and cfg.qk_norm:
            raise WorkloadError(f"{cfg.name}: fuse_rope is not built for models with q/k norms (the norm needs the "
                                "whole head before the rotation); leave fuse_rope off")

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        cfg, step, build, p = b.cfg, b.step, b.build, f"L{layer}."
        H, hd, nq, nkv, bias = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.attention_bias
        Q, KV, G = cfg.q_size, cfg.kv_size, nq // nkv
        T, C, batch, kv_len, new = b.rows, b.kv_splits, step.batch, step.kv_len, step.new_tokens
        h = b.norm(p + "attn_norm", x, layer)
        if build.split_qkv:  # rope's element i of [q; k; v] comes from whichever projection holds it
            q = b.matmul(p + "q_proj", h, H, Q, layer, bias=bias, normed=True)
            k = b.matmul(p + "k_proj", h, H, KV, layer, bias=bias, normed=True)
            v = b.matmul(p + "v_proj", h, H, KV, layer, bias=bias, normed=True)
            rope = _rope_kv(b, layer, (Input(q), Input(k, segments=((-Q, 1, 1),)),
                                       Input(v, segments=((-Q - KV, 1, 1),))))
        elif build.fuse_rope:  # qkv_proj writes the rotated [q; k; v] and appends k and v to the cache
            rope = b.matmul(p + "qkv_proj", h, H, Q + 2 * KV, layer, bias=bias, normed=True,
                            extra_flops=T * (Q + KV) * 6.0, kv_write_bytes=T * 2 * KV * ACT_BYTES,
                            attrs={"epilogue": "rope_kv"})
        else:
            rope = _rope_kv(b, layer, (Input(b.matmul(p + "qkv_proj", h, H, Q + 2 * KV, layer, bias=bias,
                                                      normed=True)),))
        # QK^T and PV, 2 FLOP per multiply-add, causal for the new tokens; a sliding window (Mistral,
        # Qwen2) keeps the last `window` tokens only
        window = layer_window(cfg, layer)  # type: ignore[arg-type]
        attrs: dict[str, Any] = {"kv_splits": C, "kv_total": step.kv_total, "group": G}
        if window is not None and window < step.kv_total:
            flops = 4.0 * nq * hd * batch * _windowed_attended(kv_len, new, window)
            kv_bytes = batch * min(kv_len, window) * 2 * KV * ACT_BYTES
            attrs["window"] = window
        else:
            flops = 4.0 * nq * hd * (batch * (new * kv_len + new * (new + 1) / 2))
            kv_bytes = batch * kv_len * 2 * KV * ACT_BYTES
        # partials over (kv head g, sequence b, split c), g-major so a head's partials are adjacent
        part = b.add(name=p + "attn_partial", kind="attn_partial", out_size=nkv * batch * C,
                     elem_bytes=G * new * (hd + 2) * PARTIAL_BYTES, flops=flops, kv_read_bytes=kv_bytes,
                     inputs=(Input(rope, group=batch * C,
                                   segments=((0, G * hd, G * hd), (Q, hd, hd), (Q + KV, hd, hd))),),
                     layer=layer, attrs=attrs)
        if build.fuse_reduce:  # every o_proj task reads all the partials before its product can start
            o = b.matmul(p + "o_proj", part, Q, H, layer, residual=b.residual(x), extra_flops=3.0 * T * Q * C,
                         attrs={"prologue": "attn_reduce", "kv_splits": C, "prologue_bytes": b.op(part).out_bytes})
            return b.all_reduce(o, layer, x)
        red = b.add(name=p + "attn_reduce", kind="attn_reduce", out_size=nkv * batch,
                    elem_bytes=G * new * hd * ACT_BYTES, flops=3.0 * T * Q * C,
                    inputs=(Input(part, group=1, segments=((0, C, C),)),), layer=layer, attrs={"kv_splits": C})
        return b.all_reduce(b.matmul(p + "o_proj", red, Q, H, layer, residual=b.residual(x)), layer, x)

    def params(self, cfg: Any, layer: int | None) -> int:  # q, k, v, o (+ biases), the norm, q/k norms
        h, q, kv = cfg.hidden_size, cfg.q_size, cfg.kv_size
        return h * (q + 2 * kv) + q * h + ((q + 2 * kv) if cfg.attention_bias else 0) + h + _qk_norm_params(cfg)


def _qk_norm_params(cfg: Any) -> int:
    """The q and k norms' weights: one head's each (Qwen3), or the whole q's and k's (OLMoE)."""
    if not cfg.qk_norm:
        return 0
    return cfg.q_size + cfg.kv_size if getattr(cfg, "qk_norm_scope", "head") == "all" else 2 * cfg.head_dim


def _rope_kv(b: Builder, layer: int | None, inputs: tuple[Input, ...]) -> str:
    cfg, T = b.cfg, b.rows
    Q, KV, hd = cfg.q_size, cfg.kv_size, cfg.head_dim
    if cfg.qk_norm and getattr(cfg, "qk_norm_scope", "head") == "all":  # a norm over all of q (k): every head
        inputs = tuple(dict.fromkeys(Input(i.op, full=True) for i in inputs))  # waits for the whole projection
    return b.add(name=f"L{layer}.rope_kv", kind="rope_kv", out_size=Q + 2 * KV, elem_bytes=T * ACT_BYTES,
                 flops=T * (Q + KV) * (6.0 + (4.0 if cfg.qk_norm else 0.0)),
                 weight_bytes=float(_qk_norm_params(cfg) * ACT_BYTES),
                 kv_write_bytes=T * 2 * KV * ACT_BYTES, inputs=inputs, layer=layer, align=hd,
                 attrs={"qk_norm": cfg.qk_norm})


def _windowed_attended(kv_len: int, new: int, window: int) -> float:
    """Keys attended to by ``new`` tokens after ``kv_len`` cached ones, each token seeing at most the
    last ``window`` positions (itself included): the sum over j = kv_len+1 .. kv_len+new of min(j, window)."""
    first = kv_len + 1
    below = max(0, min(kv_len + new, window) - first + 1)  # tokens whose causal span is shorter than the window
    return below * first + below * (below - 1) / 2 + (new - below) * window
