"""What the generated kernels' CPU tests share: a plan's input buffers filled as torch tensors."""

from __future__ import annotations

from validation.megakernel import program as P


def cpu_buffers(plan, torch, seed: int = 0) -> dict:
    """Every buffer of ``plan`` that the host fills (tokens, the RoPE table, weights, norm weights),
    random but reproducible from ``seed``, as CPU tensors for :func:`validation.megakernel.reference.run`."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, b in plan.buffers.items():
        if b.fill == "tokens":
            out[name] = torch.randint(0, int(b.scale), b.shape, generator=g, dtype=torch.int32)
        elif b.fill == "rope":
            out[name] = torch.from_numpy(P.rope_table(b.shape[0], b.scale, plan.schedule.workload.kv_len))
        elif b.fill == "normal":
            out[name] = (torch.randn(b.shape, generator=g) * b.scale).to(torch.bfloat16)
        elif b.fill == "norm":
            out[name] = (1 + 0.1 * torch.randn(b.shape, generator=g)).to(torch.bfloat16)
    return out
