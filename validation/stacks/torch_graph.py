"""The ``torch_graph`` stack: a plain torch (eager) decode step captured in one CUDA graph.

A Llama-style decoder (HF layout: RMSNorm, fused q/k/v linear, RoPE, static KV cache, SDPA with GQA,
o proj, RMSNorm, fused gate/up, SiLU*mul, down; final norm; lm_head) with random bf16 weights. One decode
step = one new token for each of B sequences that already hold ``kv_len`` cached positions. Needs only
torch (+ the standard library); the shapes come from mksim's model configs (JSON read directly, so no
mksim import is needed on the device machine).

Mixture-of-experts models (``mixtral``, ``olmoe``, ``qwen2_moe``, ``qwen3_moe``) replace the gated MLP of
their sparse layers by ``moe_ffn``: the router linear, softmax in float32, top-k (renormalised where the
config says so), the tokens sorted by expert and the experts' gate/up and down projections as two grouped
GEMMs over the stacked expert weights (``torch._grouped_mm`` with the per-expert offsets on the GPU: no
host synchronisation, so the step captures in one CUDA graph, and an expert no token chose is not read),
then the weighted sum of each token's k outputs, plus qwen2_moe's shared expert and its sigmoid gate.
This is the grouped-GEMM form of Hugging Face transformers' experts (its ``grouped_mm`` implementation);
the float32 reference runs the experts one by one (``_experts_loop``). OLMoE's q/k norms span all heads
(``qk_norm_full``); Qwen's are per head. Which experts each layer's tokens chose is read back by
``routing_counts``.

The step is cut into ``embed_and_rope``, ``block`` (one layer, its residual add deferred to the next)
and ``tail``, the pieces ``inductor_graph`` compiles. Measured by ``python3 -m validation stacks run``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

CONFIGS = Path(__file__).resolve().parents[2] / "mksim" / "models" / "configs"

@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    eps: float = 1e-5
    rope_theta: float = 10000.0
    qk_norm: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    # mixture of experts (experts = 0: dense)
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0      # qwen2_moe's shared expert (0: none)
    shared_gate: bool = False         # qwen2_moe: sigmoid(Linear(hidden, 1)) scales the shared expert
    norm_topk: bool = False           # renormalise the top-k weights to sum to 1
    qk_norm_full: bool = False        # OLMoE: one RMSNorm over all q heads (and one over all k heads)
    dense_layers: tuple[int, ...] = ()  # layers of an MoE model that keep the dense gated MLP

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def sparse(self, layer: int) -> bool:
        """Whether ``layer``'s FFN is the mixture of experts."""
        return self.moe and layer not in self.dense_layers

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


#: the mixture-of-experts model types the step builds (DeepSeek's latent attention is not built)
MOE_TYPES = ("mixtral", "olmoe", "qwen2_moe", "qwen3_moe")


def shape_from_config(raw: dict[str, Any], name: str) -> Shape:
    """The fields of a Hugging Face config.json that the step needs (qwen3 adds q/k RMSNorm; the MoE types
    of :data:`MOE_TYPES` their experts, as transformers reads them)."""
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    layers, mt = int(raw["num_hidden_layers"]), raw.get("model_type", "llama")
    moe: dict[str, Any] = {}
    if mt in MOE_TYPES:
        experts = int(raw.get("num_local_experts") or raw.get("num_experts") or 0)
        step = int(raw.get("decoder_sparse_step") or 1)
        only = set(raw.get("mlp_only_layers") or ())
        moe = {"experts": experts, "top_k": int(raw["num_experts_per_tok"]),
               "expert_intermediate": int(raw.get("moe_intermediate_size") or raw["intermediate_size"]),
               "shared_intermediate": int(raw.get("shared_expert_intermediate_size") or 0),
               "shared_gate": mt == "qwen2_moe" and bool(raw.get("shared_expert_intermediate_size")),
               "norm_topk": True if mt == "mixtral" else bool(raw.get("norm_topk_prob", False)),
               "qk_norm_full": mt == "olmoe",
               "dense_layers": tuple(i for i in range(layers) if i in only or (i + 1) % step != 0)}
    bias_default = mt in ("qwen2", "qwen2_moe")
    return Shape(
        name=name, hidden=hidden, intermediate=int(raw["intermediate_size"]),
        layers=layers, heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads), vocab=int(raw["vocab_size"]),
        eps=float(raw.get("rms_norm_eps", 1e-5)), rope_theta=float(raw.get("rope_theta", 10000.0)),
        qk_norm=mt in ("qwen3", "qwen3_moe", "olmoe"),
        attention_bias=bool(raw.get("attention_bias", raw.get("qkv_bias", bias_default))),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), **moe)


def load_shape(name: str) -> Shape:
    return shape_from_config(json.loads((CONFIGS / f"{name}.json").read_text()), name)


def make_weights(s: Shape, device: str | torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """Random weights (std 0.02, norms near 1), HF layout with q/k/v and gate/up fused."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rnd(*size: int, std: float = 0.02) -> torch.Tensor:
        return (torch.randn(*size, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + rnd(n, std=0.1).float()).to(dtype)

    def stacked(e: int, rows: int, cols: int) -> torch.Tensor:  # one expert at a time: bounded float32 scratch
        out = torch.empty(e, rows, cols, device=device, dtype=dtype)
        for i in range(e):
            out[i] = rnd(rows, cols)
        return out

    qn, kn = (s.q_size, s.kv_size) if s.qk_norm_full else (s.head_dim, s.head_dim)
    layers = []
    for i in range(s.layers):
        layer = {
            "in_norm": norm(s.hidden), "wqkv": rnd(s.q_size + 2 * s.kv_size, s.hidden),
            "bqkv": rnd(s.q_size + 2 * s.kv_size) if s.attention_bias else None,
            "q_norm": norm(qn) if s.qk_norm else None, "k_norm": norm(kn) if s.qk_norm else None,
            "wo": rnd(s.hidden, s.q_size), "post_norm": norm(s.hidden)}
        if s.sparse(i):
            ei, si = s.expert_intermediate, s.shared_intermediate
            layer.update({"router": rnd(s.experts, s.hidden), "wgu_e": stacked(s.experts, 2 * ei, s.hidden),
                          "wdown_e": stacked(s.experts, s.hidden, ei),
                          "wgu_s": rnd(2 * si, s.hidden) if si else None, "wdown_s": rnd(s.hidden, si) if si else None,
                          "wsg": rnd(1, s.hidden) if s.shared_gate else None})
        else:
            layer.update({"wgu": rnd(2 * s.intermediate, s.hidden), "wdown": rnd(s.hidden, s.intermediate)})
        layers.append(layer)
    embed = rnd(s.vocab, s.hidden)
    return {"embed": embed, "layers": layers, "final_norm": norm(s.hidden),
            "lm_head": embed if s.tie_word_embeddings else rnd(s.vocab, s.hidden)}


def weight_bytes(w: dict[str, Any]) -> int:
    """Bytes of all distinct weight tensors (a tied lm_head counted once)."""
    seen: dict[int, int] = {}
    tensors = [w["embed"], w["final_norm"], w["lm_head"]]
    tensors += [t for layer in w["layers"] for t in layer.values() if t is not None]
    for t in tensors:
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in float32, cast back, scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [B, head_dim] for integer positions ``pos`` [B] (HF rotary, computed in float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def new_cache(s: Shape, batch: int, kv_len: int, device: str | torch.device, dtype: torch.dtype,
              seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V caches [layers, B, kv_heads, kv_len + 1, head_dim]; the first kv_len positions random."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (s.layers, batch, s.kv_heads, kv_len + 1, s.head_dim)
    k = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    v = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
    k[:, :, :, kv_len:] = 0
    v[:, :, :, kv_len:] = 0
    return k, v


def embed_and_rope(s: Shape, embed: torch.Tensor, tokens: torch.Tensor,
                   pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's prologue: x [B, H] = embedding rows of ``tokens``; cos, sin [B, 1, 1, head_dim]."""
    x = F.embedding(tokens, embed)
    cos, sin = rope_cos_sin(pos, s.head_dim, s.rope_theta, x.dtype)
    return x, cos[:, None, None, :], sin[:, None, None, :]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def block(s: Shape, lw: dict[str, Any], x: torch.Tensor, dres: torch.Tensor | None, cos: torch.Tensor,
          sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
          kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer, cut after the down projection: returns (x, down_out) with the residual add
    ``x + down_out`` left to the next block (or the tail). ``dres`` is the previous block's down_out
    (None for layer 0); ``k_cache``/``v_cache`` are this layer's [B, kv_heads, kv_len + 1, head_dim]."""
    b = x.shape[0]
    if dres is not None:
        x = x + dres
    h = rms_norm(x, lw["in_norm"], s.eps)
    qkv = F.linear(h, lw["wqkv"], lw["bqkv"])
    q, k, v = qkv.split([s.q_size, s.kv_size, s.kv_size], dim=-1)
    q = q.view(b, s.heads, 1, s.head_dim)
    k = k.view(b, s.kv_heads, 1, s.head_dim)
    v = v.view(b, s.kv_heads, 1, s.head_dim)
    if s.qk_norm_full:  # OLMoE: one norm over every head's q (and k), before the heads are split
        q = rms_norm(q.reshape(b, s.q_size), lw["q_norm"], s.eps).view(b, s.heads, 1, s.head_dim)
        k = rms_norm(k.reshape(b, s.kv_size), lw["k_norm"], s.eps).view(b, s.kv_heads, 1, s.head_dim)
    elif s.qk_norm:
        q, k = rms_norm(q, lw["q_norm"], s.eps), rms_norm(k, lw["k_norm"], s.eps)
    q, k = rope(q, cos, sin), rope(k, cos, sin)
    k_cache[:, :, kv_len: kv_len + 1] = k
    v_cache[:, :, kv_len: kv_len + 1] = v
    attn = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=s.kv_heads != s.heads)
    x = x + F.linear(attn.reshape(b, s.q_size), lw["wo"])
    h = rms_norm(x, lw["post_norm"], s.eps)
    if "router" in lw:
        return x, moe_ffn(s, lw, h)
    gate, up = F.linear(h, lw["wgu"]).chunk(2, dim=-1)
    return x, F.linear(F.silu(gate) * up, lw["wdown"])


def route(s: Shape, lw: Any, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The router: (top-k weights [T, k] float32, expert ids [T, k]) of each token, as transformers
    computes them (logits in the activations' dtype, softmax in float32, renormalised if ``norm_topk``)."""
    return select(s, lw, F.linear(h, lw["router"]))


def select(s: Shape, lw: Any, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax, top-k and renormalisation of the router's ``logits``. A layer dict holding ``topi`` (the
    expert ids another run chose: :func:`routing_choices`) keeps those experts and weighs them with these
    probabilities: a reference that differs from the step only in arithmetic, not in routing."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    forced = lw.get("topi")
    if forced is not None:
        topi = forced
        topw = probs.gather(-1, topi)
    else:
        topw, topi = probs.topk(s.top_k, dim=-1)
    if s.norm_topk:
        topw = topw / topw.sum(-1, keepdim=True)
    return topw, topi


def moe_ffn(s: Shape, lw: Any, h: torch.Tensor) -> torch.Tensor:
    """One sparse layer's FFN output [T, H] (the residual add is the caller's): the routed experts, each
    token's k outputs weighted and summed, plus the shared expert."""
    topw, topi = route(s, lw, h)
    if h.dtype == torch.bfloat16:
        y = _experts_grouped(s, lw, h, topi)
    else:
        y = _experts_loop(s, lw, h, topi)
    out = (y.float() * topw[..., None]).sum(1).to(h.dtype)
    if lw["wgu_s"] is not None:
        gate, up = F.linear(h, lw["wgu_s"]).chunk(2, dim=-1)
        shared = F.linear(F.silu(gate) * up, lw["wdown_s"])
        if lw["wsg"] is not None:
            shared = torch.sigmoid(F.linear(h, lw["wsg"])) * shared
        out = out + shared
    return out


def sort_by_expert(s: Shape, h: torch.Tensor, topi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The T*k (token, slot) rows sorted by expert: (the order, tokens per expert [experts], the rows of
    ``h`` in that order), on the GPU without a host synchronisation."""
    flat = topi.reshape(-1)
    order = flat.argsort(stable=True)
    counts = torch.zeros(s.experts, dtype=torch.int64, device=h.device).scatter_add_(0, flat, torch.ones_like(flat))
    return order, counts, h.index_select(0, order // topi.shape[1])


def _experts_grouped(s: Shape, lw: Any, h: torch.Tensor, topi: torch.Tensor) -> torch.Tensor:
    """Every (token, slot)'s expert output [T, k, H]: the T*k rows sorted by expert, two grouped GEMMs
    whose groups are the experts (offsets computed on the GPU), the rows put back in order."""
    t, k = topi.shape
    order, counts, xs = sort_by_expert(s, h, topi)
    offs = counts.cumsum(0).to(torch.int32)
    gu = torch._grouped_mm(xs, lw["wgu_e"].transpose(1, 2), offs=offs)
    gate, up = gu.chunk(2, dim=-1)
    ys = torch._grouped_mm(F.silu(gate) * up, lw["wdown_e"].transpose(1, 2), offs=offs)
    return torch.empty_like(ys).index_copy_(0, order, ys).view(t, k, s.hidden)


def _experts_loop(s: Shape, lw: Any, h: torch.Tensor, topi: torch.Tensor) -> torch.Tensor:
    """The same as :func:`_experts_grouped`, one chosen expert at a time (any dtype; synchronises)."""
    t, k = topi.shape
    y = torch.zeros(t, k, s.hidden, device=h.device, dtype=h.dtype)
    wgu, wdown = lw["wgu_e"], lw["wdown_e"]  # read once (an upcasting mapping copies on every read)
    for e in topi.unique().tolist():
        tok, slot = (topi == e).nonzero(as_tuple=True)
        gate, up = F.linear(h[tok], wgu[e]).chunk(2, dim=-1)
        y[tok, slot] = F.linear(F.silu(gate) * up, wdown[e])
    return y


def routing_choices(s: Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, kv_len: int) -> list[torch.Tensor]:
    """Per sparse layer, the expert ids [T, k] the step's tokens choose (the step run eagerly once more;
    it writes the same cache slot with the same values)."""
    chosen: list[torch.Tensor] = []
    x, cos, sin = embed_and_rope(s, w["embed"], tokens, pos)
    dres = None
    for i, lw in enumerate(w["layers"]):
        x, dres = block(s, lw, x, dres, cos, sin, k_cache[i], v_cache[i], kv_len)
        if "router" in lw:  # x is now the post-attention residual: the router's input after the norm
            chosen.append(route(s, lw, rms_norm(x, lw["post_norm"], s.eps))[1])
    return chosen


def routing_counts(s: Shape, chosen: list[torch.Tensor]) -> list[list[int]]:
    """Per sparse layer, how many tokens chose each expert, from :func:`routing_choices`."""
    return [torch.bincount(c.reshape(-1), minlength=s.experts).tolist() for c in chosen]


def tail(s: Shape, x: torch.Tensor, dres: torch.Tensor, final_norm: torch.Tensor,
         lm_head: torch.Tensor) -> torch.Tensor:
    """The last residual add, the final norm and the LM head: logits [B, vocab]."""
    return F.linear(rms_norm(x + dres, final_norm, s.eps), lm_head)


def decode_step(s: Shape, w: dict[str, Any], tokens: torch.Tensor, pos: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, kv_len: int) -> torch.Tensor:
    """One decode step: tokens [B] at positions pos [B] (all = kv_len); writes slot kv_len of the caches,
    attends over kv_len + 1 positions; returns logits [B, vocab]."""
    x, cos, sin = embed_and_rope(s, w["embed"], tokens, pos)
    dres = None
    for i, lw in enumerate(w["layers"]):
        x, dres = block(s, lw, x, dres, cos, sin, k_cache[i], v_cache[i], kv_len)
    assert dres is not None
    return tail(s, x, dres, w["final_norm"], w["lm_head"])


def reference_step(s: Shape, w: dict[str, Any], tokens: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, kv_len: int) -> torch.Tensor:
    """A straightforward float64 loop version of ``decode_step`` for tests (tiny shapes, CPU)."""
    def f(t: torch.Tensor) -> torch.Tensor:
        return t.double()

    def norm(x: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
        return f(wt) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + s.eps)

    kc, vc = f(k_cache).clone(), f(v_cache).clone()
    half = s.head_dim // 2
    freqs = [kv_len / s.rope_theta ** (2 * j / s.head_dim) for j in range(half)]
    cos = torch.tensor([math.cos(a) for a in freqs * 2], dtype=torch.float64)
    sin = torch.tensor([math.sin(a) for a in freqs * 2], dtype=torch.float64)

    def rope(v: torch.Tensor) -> torch.Tensor:
        rot = torch.cat((-v[half:], v[:half]))
        return v * cos + rot * sin

    out = []
    group = s.heads // s.kv_heads
    for bi, tok in enumerate(tokens.tolist()):
        x = f(w["embed"][tok])
        for i, lw in enumerate(w["layers"]):
            h = norm(x, lw["in_norm"])
            qkv = f(lw["wqkv"]) @ h + (f(lw["bqkv"]) if lw["bqkv"] is not None else 0)
            q = qkv[: s.q_size].view(s.heads, s.head_dim)
            k = qkv[s.q_size: s.q_size + s.kv_size].view(s.kv_heads, s.head_dim)
            v = qkv[s.q_size + s.kv_size:].view(s.kv_heads, s.head_dim)
            heads_out = []
            if s.qk_norm_full:
                q = norm(q.reshape(-1), lw["q_norm"]).view(s.heads, s.head_dim)
                k = norm(k.reshape(-1), lw["k_norm"]).view(s.kv_heads, s.head_dim)
            per_head = s.qk_norm and not s.qk_norm_full
            for kh in range(s.kv_heads):
                kk = norm(k[kh], lw["k_norm"]) if per_head else k[kh]
                kc[i, bi, kh, kv_len] = rope(kk)
                vc[i, bi, kh, kv_len] = v[kh]
            for qh in range(s.heads):
                qq = norm(q[qh], lw["q_norm"]) if per_head else q[qh]
                qq = rope(qq)
                kh = qh // group
                scores = kc[i, bi, kh, : kv_len + 1] @ qq / math.sqrt(s.head_dim)
                p = torch.softmax(scores, dim=0)
                heads_out.append(p @ vc[i, bi, kh, : kv_len + 1])
            x = x + f(lw["wo"]) @ torch.cat(heads_out)
            h = norm(x, lw["post_norm"])
            x = x + (_reference_moe(s, lw, h, f) if "router" in lw else _reference_mlp(lw["wgu"], lw["wdown"], h, f))
        out.append(f(w["lm_head"]) @ norm(x, w["final_norm"]))
    return torch.stack(out)


def _reference_mlp(wgu: torch.Tensor, wdown: torch.Tensor, h: torch.Tensor, f: Any) -> torch.Tensor:
    gu = f(wgu) @ h
    gate, up = gu[: gu.shape[0] // 2], gu[gu.shape[0] // 2:]
    return f(wdown) @ (gate * torch.sigmoid(gate) * up)


def _reference_moe(s: Shape, lw: Any, h: torch.Tensor, f: Any) -> torch.Tensor:
    """One token's sparse FFN in float64: softmax over the router's logits, the top k, each chosen expert."""
    p = torch.softmax(f(lw["router"]) @ h, dim=0)
    top = torch.topk(p, s.top_k)
    wts = top.values / top.values.sum() if s.norm_topk else top.values
    chosen = zip(wts, top.indices.tolist(), strict=True)
    y = sum(wt * _reference_mlp(lw["wgu_e"][e], lw["wdown_e"][e], h, f) for wt, e in chosen)
    if lw["wgu_s"] is not None:
        shared = _reference_mlp(lw["wgu_s"], lw["wdown_s"], h, f)
        y = y + (torch.sigmoid(f(lw["wsg"]) @ h) * shared if lw["wsg"] is not None else shared)
    return y


def percentile(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    k = (len(ys) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def count_kernels(run: Any) -> dict[str, Any]:
    """GPU activities seen by torch.profiler during ``run()``: kernels, memcpy/memset, by name."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names: dict[str, int] = {}
    gpu_us = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            names[e.name] = names.get(e.name, 0) + 1
            gpu_us += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    kernels = {n: c for n, c in names.items() if not n.lower().startswith(("memcpy", "memset"))}
    return {"kernels": sum(kernels.values()), "other_gpu_ops": sum(names.values()) - sum(kernels.values()),
            "gpu_busy_us": round(gpu_us, 1),
            "by_name": dict(sorted(names.items(), key=lambda kv: -kv[1]))}
