"""The decode step of a :class:`~validation.megakernel.program.Plan`, computed with torch.

Same inputs (the plan's buffers), same formulas and the same roundings as the device functions
(``validation/kernels/mk_ops.cuh``): fp32 arithmetic, every bf16 output rounded to nearest even,
attention partials in fp32 over the same KV splits. Each op reads the *reference's* outputs of its
producers, so the comparison is end to end. Runs on whatever device the tensors live on.

One function per op kind (:data:`REFERENCES`), called with the step's shapes (:class:`Step`), the
op, its op-table row and its input tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mksim.workload import Op

from . import program as P
from .program import epilogue_rows


@dataclass(frozen=True)
class Step:
    """What every op's reference needs of the step: the buffers, the model's shapes, the RoPE table."""
    bufs: dict
    cfg: Any
    T: int       # rows (sequences)
    pos: int     # tokens in the KV cache before the step
    cos: Any     # fp32 [head_dim / 2]
    sin: Any

    @property
    def Q(self) -> int:
        return self.cfg.num_heads * self.cfg.head_dim

    @property
    def KV(self) -> int:
        return self.cfg.num_kv_heads * self.cfg.head_dim


def run(plan, bufs: dict, local: bool = False) -> dict:
    """Every op's output (``plan.outputs`` names) from the input buffers ``bufs`` (torch tensors:
    bf16 weights and caches as ``torch.bfloat16``, ``tokens`` int32, ``rope`` fp32).

    ``local``: each op reads its inputs from ``bufs`` (the kernel's outputs) rather than from the
    reference's own, so that an op's error is its own and not the amplified rounding of all the
    layers before it (a random network amplifies a one-ulp difference layer after layer)."""
    wl = plan.schedule.workload
    half = wl.model.head_dim // 2
    step = Step(bufs=bufs, cfg=wl.model, T=wl.batch, pos=wl.kv_len, cos=bufs["rope"][:half].float(),
                sin=bufs["rope"][half:].float())
    out: dict = {}
    for op, row, name in zip(wl.ops, plan.ops, plan.outputs, strict=True):
        src = bufs if local else out
        ins = [src[f"out:{i.op}"] for i in op.inputs] or ([bufs[row["in0"]]] if row["in0"] else [])
        if op.kind == "matmul" and row["opt"] & P.OPT_EXPERTS:  # its layer's route table, last
            ins = [ins[0], src[row["tokens"]]]
        out[name] = REFERENCES[op.kind](step, op, row, ins)
    return out


def _norm(x, w, eps: float):
    import torch

    x = x.float()
    inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return ((x * inv).to(torch.bfloat16).float() * w.float()).to(torch.bfloat16)


def _embed(s: Step, op: Op, row: dict, ins: list):
    return s.bufs[row["W"]][s.bufs["tokens"].long()]


def _rmsnorm(s: Step, op: Op, row: dict, ins: list):
    return _norm(ins[0], s.bufs[row["W"]], row["eps"])


def _matmul(s: Step, op: Op, row: dict, ins: list):
    import torch

    if row["opt"] & P.OPT_EXPERTS:
        return _experts(s, op, row, ins)

    x = _norm(ins[0], s.bufs[row["w2"]], row["eps"]) if row["w2"] else ins[0]
    pro = op.attrs.get("prologue")
    if pro is not None:  # a fused prologue (fuse_reduce): the input rows are what the absorbed op made
        x = REFERENCES[pro](s, op, row, [ins[0]])
    acc = x.float() @ s.bufs[row["W"]].float().t()
    if row["bias"]:  # one per weight row, in their stored order (as the weight's rows), before the rounding
        acc = acc + s.bufs[row["bias"]].float()
    if len(ins) > 1:
        acc = acc + ins[1].float()
    y = acc.to(torch.bfloat16)
    epi = op.attrs.get("epilogue")
    if epi is None:
        return y
    # a fused epilogue: the product's rows are stored in the order the epilogue pairs them; back in
    # the model's order, the op the epilogue replaced computes the output from the bf16 product
    rows = epilogue_rows(op, s.cfg)
    assert rows is not None
    y = y[:, torch.as_tensor(np.argsort(rows), device=y.device)]
    return REFERENCES[epi](s, op, row, [y])


def _rope_kv(s: Step, op: Op, row: dict, ins: list):
    import torch

    T, hd, nq, nkv, Q, KV = s.T, s.cfg.head_dim, s.cfg.num_heads, s.cfg.num_kv_heads, s.Q, s.KV
    half = hd // 2

    def rot(x):  # x: [T, heads, hd] fp32
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * s.cos - b * s.sin, b * s.cos + a * s.sin], dim=-1)

    qkv = ins[0] if len(ins) == 1 else torch.cat(ins, dim=1)
    q, k = qkv[:, :Q], qkv[:, Q:Q + KV]
    if op.attrs.get("qk_norm"):  # q/k RMS norms first (ROPE_NORM): over each head, or over all of q and all of k
        per_head = row["opt"] == P.ROPE_NORM["head"]
        q = _norm(q.reshape(T, nq, hd) if per_head else q, s.bufs[row["W"]], row["eps"]).reshape(T, Q)
        k = _norm(k.reshape(T, nkv, hd) if per_head else k, s.bufs[row["w2"]], row["eps"]).reshape(T, KV)
    q = rot(q.float().reshape(T, nq, hd)).reshape(T, Q)
    k = rot(k.float().reshape(T, nkv, hd)).reshape(T, KV)
    return torch.cat([q, k, qkv[:, Q + KV:].float()], dim=1).to(torch.bfloat16)


def _attn_partial(s: Step, op: Op, row: dict, ins: list):
    import torch

    T, hd, nkv, Q, KV, pos = s.T, s.cfg.head_dim, s.cfg.num_kv_heads, s.Q, s.KV, s.pos
    G = s.cfg.num_heads // nkv
    C, total = row["splits"], row["kv_total"]
    w0 = total - row["K"] if 0 < row["K"] < total else 0  # a sliding window: the last K positions (mk_attn_first)
    rope = ins[0]
    q = rope[:, :Q].float().reshape(T, nkv, G, hd) * row["scale"]
    k_new = rope[:, Q:Q + KV].reshape(T, nkv, 1, hd)
    v_new = rope[:, Q + KV:].reshape(T, nkv, 1, hd)
    K = torch.cat([s.bufs[row["kc"]][:, :, :pos], k_new], dim=2).float()  # [T, nkv, total, hd]
    V = torch.cat([s.bufs[row["vc"]][:, :, :pos], v_new], dim=2).float()
    parts = []
    for c in range(C):
        p0, p1 = w0 + c * (total - w0) // C, w0 + (c + 1) * (total - w0) // C
        sc = torch.einsum("tgjd,tgpd->tgjp", q, K[:, :, p0:p1])
        m = sc.amax(dim=-1)
        p = torch.exp(sc - m[..., None])
        parts.append(torch.cat([torch.einsum("tgjp,tgpd->tgjd", p, V[:, :, p0:p1]).reshape(T, nkv, G * hd),
                                m, p.sum(dim=-1)], dim=-1))
    # partial i = (g, b, c), g-major
    return torch.stack(parts, dim=2).permute(1, 0, 2, 3).reshape(nkv * T * C, G * (hd + 2)).contiguous()


def _attn_reduce(s: Step, op: Op, row: dict, ins: list):
    import torch

    T, hd, nkv, Q = s.T, s.cfg.head_dim, s.cfg.num_kv_heads, s.Q
    G = s.cfg.num_heads // nkv
    C = row["splits"]
    p = ins[0].reshape(nkv, T, C, G * (hd + 2))
    o, m, lsum = p[..., :G * hd].reshape(nkv, T, C, G, hd), p[..., G * hd:G * hd + G], p[..., G * hd + G:]
    M = m.amax(dim=2, keepdim=True)
    w = torch.exp(m - M)                                            # [nkv, T, C, G]
    num = (o * w[..., None]).sum(dim=2)                             # [nkv, T, G, hd]
    den = (lsum * w).sum(dim=2)                                        # [nkv, T, G]
    return (num / den[..., None]).permute(1, 0, 2, 3).reshape(T, Q).to(torch.bfloat16)


def _silu_mul(s: Step, op: Op, row: dict, ins: list):
    import torch

    if len(ins) == 1:  # one fused gate_up projection: [gate; up] (with fuse_silu, op is that projection)
        n = op.out_size
        g, u = ins[0][:, :n].float(), ins[0][:, n:].float()
    else:
        g, u = ins[0].float(), ins[1].float()
    return (g / (1 + torch.exp(-g)) * u).to(torch.bfloat16)


def _softcap(s: Step, op: Op, row: dict, ins: list):
    import torch

    cap = row["scale"]
    return (cap * torch.tanh(ins[0].float() / cap)).to(torch.bfloat16)


def route_parts(route, T: int, k: int, C: int) -> dict:
    """A route table (mk_ops.cuh, "mixture of experts") as its parts: the active count, the expert of
    each slot (-1 past the count), each token's slots [T, k] and weights [T, k]."""
    n = int(route[0].item())
    return {"count": n, "experts": route[1:1 + C].long(), "slots": route[1 + C:1 + C + T * k].long().reshape(T, k),
            "weights": route[1 + C + T * k:1 + C + 2 * T * k].reshape(T, k)}


def _topk(s: Step, op: Op, row: dict, ins: list):
    """The top-k of every token as mk_topk makes it: the k largest logits (the lower index first on a
    tie), their scores (softmax over all N, or sigmoid) and weights (renormalised with P.TOPK_NORM), and
    the route table of the distinct experts in ascending order."""
    import torch

    k, C = row["K"], row["pos"]
    logits = ins[0].float()
    order = torch.sort(-logits, dim=-1, stable=True).indices[:, :k]  # descending, lower index on ties
    if row["opt"] & P.TOPK_SIGMOID:
        p = torch.sigmoid(logits)
    else:
        p = torch.softmax(logits, dim=-1)
    w = torch.gather(p, 1, order)
    if row["opt"] & P.TOPK_NORM:
        w = w / w.sum(dim=-1, keepdim=True)
    active = torch.unique(order)  # sorted ascending
    experts = torch.full((C,), -1.0, device=logits.device)
    experts[:len(active)] = active.float()
    slots = torch.searchsorted(active, order.reshape(-1)).float()
    head = torch.tensor([float(len(active))], device=logits.device)
    return torch.cat([head, experts, slots, w.reshape(-1).float()])


def _experts(s: Step, op: Op, row: dict, ins: list):
    """An expert matmul over the layer's slots: slot j < the active count multiplies its input rows by
    its expert's weight rows (stored as the kernel streams them: with the SiLU fused, the (gate, up)
    pairs adjacent); the slots past the count are zero (the kernel writes nothing there, and the
    comparison leaves them out: :func:`op_rel_err`)."""
    import torch

    x = _norm(ins[0], s.bufs[row["w2"]], row["eps"]) if row["w2"] else ins[0]
    n, K, f = row["pos"], row["K"], 2 if row["opt"] & P.OPT_SILU else 1
    C = row["N"] // n
    rt = route_parts(ins[-1], s.T, s.cfg.experts_per_token, C)
    W = s.bufs[row["W"]]
    out = torch.zeros((s.T, C * n), dtype=torch.bfloat16, device=x.device)
    slot_in = x.shape[1] == C * K
    for j in range(rt["count"]):
        e = int(rt["experts"][j])
        xj = x[:, j * K:(j + 1) * K] if slot_in else x
        y = (xj.float() @ W[e * f * n:(e + 1) * f * n].float().t()).to(torch.bfloat16)
        if f == 2:
            g, u = y[:, 0::2].float(), y[:, 1::2].float()
            y = (g / (1 + torch.exp(-g)) * u).to(torch.bfloat16)
        out[:, j * n:(j + 1) * n] = y
    return out


def _combine(s: Step, op: Op, row: dict, ins: list):
    """Each token's k experts' outputs, weighted, in choice order, + the shared expert (times the
    sigmoid of its gate) + the residual, in fp32 and rounded once (mk_combine)."""
    import torch

    T, k, C, H = s.T, row["K"], row["pos"], op.out_size
    rt = route_parts(ins[2], T, k, C)
    y = ins[0].reshape(T, C, H).float()
    rows = torch.arange(T, device=y.device)
    acc = torch.zeros((T, H), device=y.device)
    for i in range(k):
        acc = acc + rt["weights"][:, i:i + 1] * y[rows, rt["slots"][:, i]]
    if row["opt"] & P.COMBINE_SHARED:
        g = torch.sigmoid(ins[4].float()[:, :1]) if row["opt"] & P.COMBINE_GATED else 1.0
        acc = acc + g * ins[3].float()
    return (acc + ins[1].float()).to(torch.bfloat16)


def op_rel_err(op: Op, row: dict, got, ref, bufs: dict) -> float:
    """:func:`rel_err` of one op's output, as the kernel's MoE ops are compared: a top-k's route table
    must hold the same experts, slots and count exactly (else inf), its weights within the error; an
    expert op's slots past the active count (the kernel's, from ``bufs``) are left out."""
    if op.kind == "topk":
        C, T, k = row["pos"], row["T"], row["K"]
        ids = 1 + C + T * k
        if not bool((got[:ids] == ref[:ids]).all()):
            return float("inf")
        return rel_err(got[ids:], ref[ids:])
    if op.kind == "matmul" and row["opt"] & P.OPT_EXPERTS:
        n = int(bufs[row["tokens"]][0].item()) * row["pos"]
        return rel_err(got[:, :n], ref[:, :n])
    return rel_err(got, ref)


# op kind -> its output from (step, op, op-table row, input tensors): one per kind with an opcode
# (a test holds this table, program.ROWS and the opcodes together)
REFERENCES: dict[str, Callable[[Step, Op, dict, list], Any]] = {
    "embed": _embed, "rmsnorm": _rmsnorm, "matmul": _matmul, "rope_kv": _rope_kv, "attn_partial": _attn_partial,
    "attn_reduce": _attn_reduce, "silu_mul": _silu_mul, "softcap": _softcap, "topk": _topk, "combine": _combine,
}


def rel_err(got, ref) -> float:
    """``|got - ref| / |ref|`` over the whole tensor (inf if ``got`` has a NaN or an infinity)."""
    import torch

    g, r = got.float(), ref.float()
    if not torch.isfinite(g).all():
        return float("inf")
    den = torch.linalg.vector_norm(r).item()
    return torch.linalg.vector_norm(g - r).item() / (den if den > 0 else 1.0)
