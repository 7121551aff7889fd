"""Build the unfused op graph of a decoder-only LLM step (decode or prefill).

The base graph keeps each op separate (norm, projection, RoPE, attention partials and
their reduction, SiLU·mul, ...); fusing is a schedule's choice. Matmul epilogues that
every implementation fuses (the residual add after the O and down projections) are
part of their matmul. The fusions a schedule may choose (``fuse_norm``, ``fuse_rope``,
``fuse_silu``, ``fuse_reduce``) remove an op and fold its arithmetic and bytes into a matmul.
"""

from __future__ import annotations

import math

from mksim.errors import WorkloadError

from ._ops import Input, Op, Workload

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
ACT_BYTES = 2          # activations and the KV cache are bf16
PARTIAL_BYTES = 4      # attention partial outputs (o, max, sum) are fp32
MATMUL_ALIGN = 16      # output rows per tile step of a matmul (an MMA tile)
VEC_ALIGN = 64         # elements per tile step of an elementwise op
KV_SPLIT_MIN_TOKENS = 256  # flash-decoding does not split the KV cache finer than this
MAX_LAYERS = 4096          # far above any model (Llama 3.1 405B has 126); bounds the ops a config can make


def default_kv_splits(kv_heads: int, batch: int, kv_total: int, n_sms: int = 132) -> int:
    """Flash-decoding's split of the KV cache: enough partials to cover the SMs once."""
    want = math.ceil(n_sms / max(1, kv_heads * batch))
    return max(1, min(want, math.ceil(kv_total / KV_SPLIT_MIN_TOKENS)))


def build_llm_workload(cfg, *, batch: int = 1, kv_len: int = 1024, phase: str = "decode",
                       prefill_tokens: int = 0, weight_dtype: str = "bf16",
                       kv_splits: int | None = None, n_sms: int = 132, fuse_norm: bool = False,
                       fuse_rope: bool = False, fuse_silu: bool = False, fuse_reduce: bool = False,
                       split_qkv: bool = False, split_gate_up: bool = False,
                       logit_softcap: float = 0.0) -> Workload:
    """The op graph of one step of ``cfg`` (a :class:`~mksim.models.ModelConfig`).

    ``batch`` sequences each hold ``kv_len`` tokens in the KV cache. ``decode`` makes one
    token per sequence; ``prefill`` processes ``prefill_tokens`` new tokens per sequence.
    ``fuse_norm`` folds each RMS norm into the matvec that follows it: no norm op (and no
    op boundary); the matvec reads the residual stream and the norm's weight and does its
    arithmetic. ``fuse_rope`` applies RoPE in the fused q/k/v projection's epilogue: no ``rope_kv``
    op; ``qkv_proj`` writes the rotated q, k, v, appends k and v to the KV cache, and attention
    reads it. ``fuse_silu`` computes SiLU(gate) * up in the gate/up projection's epilogue: no
    ``silu_mul`` op; ``gate_up_proj`` writes the ``intermediate_size``-wide product (its weight rows
    come in (gate, up) pairs, two per output element: ``attrs["weight_rows"]``) and ``down_proj``
    reads it. A fused matmul's ``attrs["epilogue"]`` names the kind of the op it absorbed.
    ``fuse_reduce`` merges the attention partials of the KV splits (flash-decoding's combine) while
    ``o_proj`` loads its input rows: no ``attn_reduce`` op; ``o_proj`` reads every partial of every
    kv head and sequence (its input bytes), does the merge's arithmetic once per op like a fused
    norm, and names the op it absorbed in ``attrs["prologue"]`` (with ``attrs["kv_splits"]`` and
    ``attrs["prologue_bytes"]``, the partials each of its tasks reads before its product starts).
    ``split_qkv`` and ``split_gate_up`` make separate q/k/v (gate/up) matvecs of the
    fused projections: independent ops a megakernel can interleave (not with ``fuse_rope`` and
    ``fuse_silu``, whose epilogues need the fused projection). ``logit_softcap`` > 0 caps the
    logits at ``cap * tanh(logits / cap)`` in a ``softcap`` op after the LM head (Gemma 2 uses 30).
    """
    for key, val in (("fuse_norm", fuse_norm), ("fuse_rope", fuse_rope), ("fuse_silu", fuse_silu),
                     ("fuse_reduce", fuse_reduce), ("split_qkv", split_qkv), ("split_gate_up", split_gate_up)):
        if not isinstance(val, bool):
            raise WorkloadError(f"{key} must be true or false, got {val!r}")
    _check_fusions(cfg, fuse_rope=fuse_rope, fuse_silu=fuse_silu, split_qkv=split_qkv, split_gate_up=split_gate_up)
    _check(batch=batch, kv_len=kv_len, phase=phase, prefill_tokens=prefill_tokens,
           weight_dtype=weight_dtype, kv_splits=kv_splits, n_sms=n_sms)
    if isinstance(logit_softcap, bool) or not isinstance(logit_softcap, (int, float)) or not logit_softcap >= 0:
        raise WorkloadError(f"logit_softcap must be a number >= 0 (0: no soft-capping), got {logit_softcap!r}")
    if not 1 <= cfg.num_layers <= MAX_LAYERS:  # before making ops: a few per layer, all in memory
        raise WorkloadError(f"{cfg.name}: num_layers = {cfg.num_layers} is implausible; expected between 1 and "
                            f"{MAX_LAYERS} (the largest models have about 130)")
    new = 1 if phase == "decode" else prefill_tokens
    T = batch * new                      # rows through the projections
    kv_total = kv_len + new              # tokens attended to, per sequence
    if kv_total > cfg.max_position_embeddings:
        raise WorkloadError(f"kv_len + new tokens = {kv_total} exceeds {cfg.name}'s context of "
                            f"{cfg.max_position_embeddings}; use a smaller --kv-len")
    wb = DTYPE_BYTES[weight_dtype]
    H, I, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    hd, nq, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    Q, KV, G = cfg.q_size, cfg.kv_size, nq // nkv
    windows = {w for w in map(_layer_window(cfg), range(cfg.num_layers))}
    # tokens a layer attends to at most: a sliding window (Mistral, Qwen2) caps it in every layer that has one
    kv_attn = kv_total if None in windows else min(kv_total, max(w for w in windows if w is not None))
    C = kv_splits or default_kv_splits(nkv, batch, kv_attn, n_sms)
    C = min(C, kv_attn)
    # attention FLOPs: QK^T and PV, 2 FLOP per multiply-add; causal for the new tokens
    attended = batch * (new * kv_len + new * (new + 1) / 2)
    attn_flops = 4.0 * nq * hd * attended
    kv_read = batch * kv_len * 2 * KV * ACT_BYTES

    ops: list[Op] = []

    def add(**kw) -> str:
        ops.append(Op(**kw))
        return kw["name"]

    def norm(name: str, src: str, layer: int | None) -> str:
        if fuse_norm:
            return src  # the next matmul (normed=True) does the norm
        return add(name=name, kind="rmsnorm", out_size=H, elem_bytes=T * ACT_BYTES,
                   flops=4.0 * T * H, weight_bytes=H * ACT_BYTES, inputs=(Input(src, full=True),),
                   layer=layer, align=VEC_ALIGN)

    def matmul(name: str, src: str, k: int, n: int, layer: int | None, residual: str | None = None,
               rows: int = T, bias: bool = False, normed: bool = False, epilogue: str | None = None,
               prologue: str | None = None) -> str:
        inputs = [Input(src, full=True)]
        if residual:
            inputs.append(Input(residual))
        fused = fuse_norm and normed  # the norm's arithmetic and weight, once per op
        attrs: dict = {"k": k, "rows": rows, "fused_norm": fused}
        out_size, align, kv_write = n, MATMUL_ALIGN, 0.0
        extra = 0.0  # the prologue's and the epilogue's arithmetic
        if prologue == "attn_reduce":  # what the attn_reduce op did, its arithmetic once per op (as a
            # fused norm's); every task reads all of src's partials (a full input: in its input bytes),
            # before its product can start: prologue_bytes, for a cost that puts them first
            extra = 3.0 * T * Q * C
            part_B = next(o for o in reversed(ops) if o.name == src).out_bytes
            attrs.update(prologue=prologue, kv_splits=C, prologue_bytes=part_B)
        if epilogue == "rope_kv":  # what the rope_kv op did: rotate q and k, append k and v to the cache
            extra, kv_write = T * (Q + KV) * 6.0, T * 2 * KV * ACT_BYTES
            attrs["epilogue"] = epilogue
        elif epilogue == "silu_mul":  # weight rows in (gate, up) pairs: one output element per pair
            out_size, align, extra = n // 2, MATMUL_ALIGN // 2, 5.0 * T * (n // 2)
            attrs.update(epilogue=epilogue, weight_rows=n)
        return add(name=name, kind="matmul", out_size=out_size, elem_bytes=rows * ACT_BYTES,
                   flops=2.0 * rows * k * n + (rows * n if residual else 0) + (4.0 * T * k if fused else 0) + extra,
                   weight_bytes=k * n * wb + (n * ACT_BYTES if bias else 0) + (k * ACT_BYTES if fused else 0),
                   kv_write_bytes=kv_write, inputs=tuple(inputs), layer=layer, align=align, dtype=weight_dtype,
                   attrs=attrs)

    def rope_kv(layer: int, inputs: tuple[Input, ...]) -> str:
        return add(name=f"L{layer}.rope_kv", kind="rope_kv", out_size=Q + 2 * KV, elem_bytes=T * ACT_BYTES,
                   flops=T * (Q + KV) * (6.0 + (4.0 if cfg.qk_norm else 0.0)),
                   weight_bytes=(2 * hd * ACT_BYTES if cfg.qk_norm else 0.0),
                   kv_write_bytes=T * 2 * KV * ACT_BYTES, inputs=inputs, layer=layer, align=hd,
                   attrs={"qk_norm": cfg.qk_norm})

    def silu_mul(layer: int, inputs: tuple[Input, ...]) -> str:
        return add(name=f"L{layer}.silu_mul", kind="silu_mul", out_size=I, elem_bytes=T * ACT_BYTES,
                   flops=5.0 * T * I, inputs=inputs, layer=layer, align=VEC_ALIGN)

    resid = add(name="embed", kind="embed", out_size=H, elem_bytes=T * ACT_BYTES, flops=0.0,
                weight_bytes=T * H * ACT_BYTES, layer=None, align=VEC_ALIGN)
    for l in range(cfg.num_layers):
        p = f"L{l}."
        x = norm(p + "attn_norm", resid, l)
        if split_qkv:  # rope's element i of [q; k; v] comes from whichever projection holds it
            q = matmul(p + "q_proj", x, H, Q, l, bias=cfg.attention_bias, normed=True)
            k = matmul(p + "k_proj", x, H, KV, l, bias=cfg.attention_bias, normed=True)
            v = matmul(p + "v_proj", x, H, KV, l, bias=cfg.attention_bias, normed=True)
            rope = rope_kv(l, (Input(q), Input(k, segments=((-Q, 1, 1),)), Input(v, segments=((-Q - KV, 1, 1),))))
        else:
            qkv = matmul(p + "qkv_proj", x, H, Q + 2 * KV, l, bias=cfg.attention_bias, normed=True,
                         epilogue="rope_kv" if fuse_rope else None)
            rope = qkv if fuse_rope else rope_kv(l, (Input(qkv),))  # fused: qkv_proj wrote the rotated [q; k; v]
        # partials over (kv head g, sequence b, split c), g-major so a head's partials are adjacent
        window = _layer_window(cfg)(l)
        flops, kv_bytes, attrs = attn_flops, kv_read, {"kv_splits": C, "kv_total": kv_total, "group": G}
        if window is not None and window < kv_total:  # a sliding window: the last `window` tokens only
            flops = 4.0 * nq * hd * batch * _windowed_attended(kv_len, new, window)
            kv_bytes = batch * min(kv_len, window) * 2 * KV * ACT_BYTES
            attrs["window"] = window
        part = add(name=p + "attn_partial", kind="attn_partial", out_size=nkv * batch * C,
                   elem_bytes=G * new * (hd + 2) * PARTIAL_BYTES, flops=flops,
                   kv_read_bytes=kv_bytes,
                   inputs=(Input(rope, group=batch * C,
                                 segments=((0, G * hd, G * hd), (Q, hd, hd), (Q + KV, hd, hd))),),
                   layer=l, attrs=attrs)
        if fuse_reduce:  # o_proj merges the partials of each of its input rows while it loads them
            o = matmul(p + "o_proj", part, Q, H, l, residual=resid, prologue="attn_reduce")
        else:
            red = add(name=p + "attn_reduce", kind="attn_reduce", out_size=nkv * batch,
                      elem_bytes=G * new * hd * ACT_BYTES, flops=3.0 * T * Q * C,
                      inputs=(Input(part, group=1, segments=((0, C, C),)),), layer=l,
                      attrs={"kv_splits": C})
            o = matmul(p + "o_proj", red, Q, H, l, residual=resid)
        x = norm(p + "mlp_norm", o, l)
        if split_gate_up:
            act = silu_mul(l, (Input(matmul(p + "gate_proj", x, H, I, l, normed=True)),
                               Input(matmul(p + "up_proj", x, H, I, l, normed=True))))
        elif fuse_silu:  # gate_up_proj writes silu(gate) * up
            act = matmul(p + "gate_up_proj", x, H, 2 * I, l, normed=True, epilogue="silu_mul")
        else:
            gu = matmul(p + "gate_up_proj", x, H, 2 * I, l, normed=True)
            act = silu_mul(l, (Input(gu, segments=((0, 1, 1), (I, 1, 1))),))
        resid = matmul(p + "down_proj", act, I, H, l, residual=o)
    x = norm("final_norm", resid, None)
    # prefill needs logits of each sequence's last token only
    logits = matmul("lm_head", x, H, V, None, rows=batch, normed=True)
    if logit_softcap:  # divide, tanh, multiply per logit
        add(name="softcap", kind="softcap", out_size=V, elem_bytes=batch * ACT_BYTES, flops=3.0 * batch * V,
            inputs=(Input(logits),), layer=None, align=VEC_ALIGN, attrs={"rows": batch, "cap": float(logit_softcap)})
    name = (f"{cfg.name} {phase} b{batch} kv{kv_len}" + (f" n{prefill_tokens}" if phase == "prefill" else "")
            + (" fused-norm" if fuse_norm else "") + (" fused-rope" if fuse_rope else "")
            + (" fused-silu" if fuse_silu else "") + (" fused-reduce" if fuse_reduce else "")
            + (" split-qkv" if split_qkv else "")
            + (" split-gate-up" if split_gate_up else "") + (f" softcap{logit_softcap:g}" if logit_softcap else ""))
    return Workload(name=name, ops=tuple(ops), tokens=batch if phase == "decode" else T, batch=batch,
                    kv_len=kv_len, phase=phase, prefill_tokens=prefill_tokens if phase == "prefill" else 0,
                    weight_dtype=weight_dtype, fuse_norm=fuse_norm, fuse_rope=fuse_rope, fuse_silu=fuse_silu,
                    fuse_reduce=fuse_reduce, split_qkv=split_qkv, split_gate_up=split_gate_up, model=cfg,
                    options=(("logit_softcap", float(logit_softcap)),) if logit_softcap else ())


def _layer_window(cfg):
    """``layer -> window in tokens or None`` of ``cfg`` (an object without :meth:`ModelConfig.window`, such
    as a test's stand-in, has no window)."""
    window = getattr(cfg, "window", None)
    return window if callable(window) else (lambda layer: None)


def _windowed_attended(kv_len: int, new: int, window: int) -> float:
    """Keys attended to by ``new`` tokens after ``kv_len`` cached ones, each token seeing at most the
    last ``window`` positions (itself included): the sum over j = kv_len+1 .. kv_len+new of min(j, window)."""
    first = kv_len + 1
    below = max(0, min(kv_len + new, window) - first + 1)  # tokens whose causal span is shorter than the window
    return below * first + below * (below - 1) / 2 + (new - below) * window


def _check_fusions(cfg, *, fuse_rope: bool, fuse_silu: bool, split_qkv: bool, split_gate_up: bool) -> None:
    """Refuse the fusions whose epilogue has nothing to work on, in one line."""
    if fuse_rope and split_qkv:
        raise WorkloadError("fuse_rope rotates q and k in the fused q/k/v projection's epilogue; it cannot go "
                            "with split_qkv (choose one)")
    if fuse_rope and cfg.qk_norm:
        raise WorkloadError(f"{cfg.name}: fuse_rope is not built for models with q/k norms (the norm needs the "
                            "whole head before the rotation); leave fuse_rope off")
    if fuse_silu and split_gate_up:
        raise WorkloadError("fuse_silu computes SiLU(gate) * up in the fused gate/up projection's epilogue; it "
                            "cannot go with split_gate_up (choose one)")


def _check(*, batch, kv_len, phase, prefill_tokens, weight_dtype, kv_splits, n_sms) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise WorkloadError(f"batch must be a positive integer, got {batch!r}")
    if isinstance(kv_len, bool) or not isinstance(kv_len, int) or kv_len < 0:
        raise WorkloadError(f"kv_len (context already in the KV cache) must be an integer >= 0, "
                            f"got {kv_len!r}")
    if phase not in ("decode", "prefill"):
        raise WorkloadError(f"phase must be 'decode' or 'prefill', got {phase!r}")
    if phase == "prefill" and (not isinstance(prefill_tokens, int) or prefill_tokens < 1):
        raise WorkloadError("prefill needs prefill_tokens >= 1 (new tokens per sequence)")
    if weight_dtype not in ("bf16", "fp16", "fp8"):
        raise WorkloadError(f"weight dtype must be bf16, fp16 or fp8, got {weight_dtype!r}")
    if kv_splits is not None and (isinstance(kv_splits, bool) or not isinstance(kv_splits, int) or kv_splits < 1):
        raise WorkloadError(f"kv_splits must be a positive integer, got {kv_splits!r}")
    if isinstance(n_sms, bool) or not isinstance(n_sms, int) or n_sms < 1:
        raise WorkloadError(f"n_sms (SMs the workload is tiled for) must be a positive integer, got {n_sms!r}")
