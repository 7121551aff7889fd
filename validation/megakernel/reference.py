"""The decode step of a :class:`~validation.megakernel.program.Plan`, computed with torch.

Same inputs (the plan's buffers), same formulas and the same roundings as the device functions
(``validation/kernels/mk_ops.cuh``): fp32 arithmetic, every bf16 output rounded to nearest even,
attention partials in fp32 over the same KV splits. Each op reads the *reference's* outputs of its
producers, so the comparison is end to end. Runs on whatever device the tensors live on.
"""

from __future__ import annotations


def run(plan, bufs: dict, local: bool = False) -> dict:
    """Every op's output (``plan.outputs`` names) from the input buffers ``bufs`` (torch tensors:
    bf16 weights and caches as ``torch.bfloat16``, ``tokens`` int32, ``rope`` fp32).

    ``local``: each op reads its inputs from ``bufs`` (the kernel's outputs) rather than from the
    reference's own, so that an op's error is its own and not the amplified rounding of all the
    layers before it (a random network amplifies a one-ulp difference layer after layer)."""
    import torch

    wl = plan.schedule.workload
    cfg = wl.model
    T, hd, nq, nkv = wl.batch, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    G, Q, KV, pos = nq // nkv, nq * hd, nkv * hd, wl.kv_len
    half = hd // 2
    cos, sin = bufs["rope"][:half].float(), bufs["rope"][half:].float()
    out: dict[str, torch.Tensor] = {}
    bf = torch.bfloat16

    def norm(x, w, eps):
        x = x.float()
        inv = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        return ((x * inv).to(bf).float() * w.float()).to(bf)

    def rot(x):  # x: [T, heads, hd] fp32
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    for op, row, name in zip(wl.ops, plan.ops, plan.outputs):
        src = bufs if local else out
        ins = [src[f"out:{i.op}"] for i in op.inputs]
        if op.kind == "embed":
            y = bufs[row["W"]][bufs["tokens"].long()]
        elif op.kind == "rmsnorm":
            y = norm(ins[0], bufs[row["W"]], row["eps"])
        elif op.kind == "matmul":
            x = norm(ins[0], bufs[row["w2"]], row["eps"]) if row["w2"] else ins[0]
            acc = x.float() @ bufs[row["W"]].float().t()
            if len(ins) > 1:
                acc = acc + ins[1].float()
            y = acc.to(bf)
        elif op.kind == "rope_kv":
            qkv = ins[0] if len(ins) == 1 else torch.cat(ins, dim=1)
            qkv = qkv.float()
            q = rot(qkv[:, :Q].reshape(T, nq, hd)).reshape(T, Q)
            k = rot(qkv[:, Q:Q + KV].reshape(T, nkv, hd)).reshape(T, KV)
            y = torch.cat([q, k, qkv[:, Q + KV:]], dim=1).to(bf)
        elif op.kind == "attn_partial":
            C, total = row["splits"], row["kv_total"]
            rope = ins[0]
            q = rope[:, :Q].float().reshape(T, nkv, G, hd) * row["scale"]
            k_new = rope[:, Q:Q + KV].reshape(T, nkv, 1, hd)
            v_new = rope[:, Q + KV:].reshape(T, nkv, 1, hd)
            K = torch.cat([bufs[row["kc"]][:, :, :pos], k_new], dim=2).float()  # [T, nkv, total, hd]
            V = torch.cat([bufs[row["vc"]][:, :, :pos], v_new], dim=2).float()
            parts = []
            for c in range(C):
                p0, p1 = c * total // C, (c + 1) * total // C
                s = torch.einsum("tgjd,tgpd->tgjp", q, K[:, :, p0:p1])
                m = s.amax(dim=-1)
                p = torch.exp(s - m[..., None])
                parts.append(torch.cat([torch.einsum("tgjp,tgpd->tgjd", p, V[:, :, p0:p1]).reshape(T, nkv, G * hd),
                                        m, p.sum(dim=-1)], dim=-1))
            # partial i = (g, b, c), g-major
            y = torch.stack(parts, dim=2).permute(1, 0, 2, 3).reshape(nkv * T * C, G * (hd + 2)).contiguous()
        elif op.kind == "attn_reduce":
            C = row["splits"]
            p = ins[0].reshape(nkv, T, C, G * (hd + 2))
            o, m, l = p[..., :G * hd].reshape(nkv, T, C, G, hd), p[..., G * hd:G * hd + G], p[..., G * hd + G:]
            M = m.amax(dim=2, keepdim=True)
            w = torch.exp(m - M)                                            # [nkv, T, C, G]
            num = (o * w[..., None]).sum(dim=2)                             # [nkv, T, G, hd]
            den = (l * w).sum(dim=2)                                        # [nkv, T, G]
            y = (num / den[..., None]).permute(1, 0, 2, 3).reshape(T, Q).to(bf)
        elif op.kind == "silu_mul":
            if len(ins) == 1:
                I = op.out_size
                g, u = ins[0][:, :I].float(), ins[0][:, I:].float()
            else:
                g, u = ins[0].float(), ins[1].float()
            y = (g / (1 + torch.exp(-g)) * u).to(bf)
        else:
            raise ValueError(f"no reference for op kind {op.kind}")
        out[name] = y
    return out


def rel_err(got, ref) -> float:
    """``|got - ref| / |ref|`` over the whole tensor (inf if ``got`` has a NaN or an infinity)."""
    import torch

    g, r = got.float(), ref.float()
    if not torch.isfinite(g).all():
        return float("inf")
    den = torch.linalg.vector_norm(r).item()
    return torch.linalg.vector_norm(g - r).item() / (den if den > 0 else 1.0)
