"""The dense gated MLP (SwiGLU): ``down(SiLU(gate(x)) * up(x))`` after an RMS norm, + the residual.

Its ops: ``mlp_norm`` (unless ``fuse_norm``), the gate and up projections as one ``gate_up_proj``
(rows in (gate, up) halves) or, with ``split_gate_up``, as ``gate_proj`` and ``up_proj``; ``silu_mul``
(unless ``fuse_silu`` computes it in ``gate_up_proj``'s epilogue, whose weight rows then come in
(gate, up) pairs, two per output element: ``attrs["weight_rows"]``); ``down_proj`` with the residual
(under tensor parallelism a partial sum of one GPU's ``intermediate / tp`` columns, and
``down_proj.all_reduce`` after it adds the residual).
"""

from __future__ import annotations

from typing import Any

from .._blocks import BLOCKS, BaseBlock
from .._builder import ACT_BYTES, MATMUL_ALIGN, VEC_ALIGN, Builder
from .._ops import Input


@BLOCKS.add
class GatedMLP(BaseBlock):
    """``gated_mlp``: the FFN of Llama, Mistral and Qwen (``intermediate_size`` wide)."""

    name = "gated_mlp"
    role = "ffn"

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        H, I, T, build, p = b.cfg.hidden_size, b.cfg.intermediate_size, b.rows, b.build, f"L{layer}."
        h = b.norm(p + "mlp_norm", x, layer)
        if build.split_gate_up:
            act = _silu_mul(b, layer, (Input(b.matmul(p + "gate_proj", h, H, I, layer, normed=True)),
                                       Input(b.matmul(p + "up_proj", h, H, I, layer, normed=True))))
        elif build.fuse_silu:  # gate_up_proj writes silu(gate) * up: one output element per (gate, up) pair
            act = b.matmul(p + "gate_up_proj", h, H, 2 * I, layer, normed=True, out_size=I, align=MATMUL_ALIGN // 2,
                           extra_flops=5.0 * T * I, attrs={"epilogue": "silu_mul", "weight_rows": 2 * I})
        else:
            gu = b.matmul(p + "gate_up_proj", h, H, 2 * I, layer, normed=True)
            act = _silu_mul(b, layer, (Input(gu, segments=((0, 1, 1), (I, 1, 1))),))
        return b.all_reduce(b.matmul(p + "down_proj", act, I, H, layer, residual=b.residual(x)), layer, x)

    def params(self, cfg: Any, layer: int | None) -> int:  # gate, up, down, and the norm before them
        return 3 * cfg.hidden_size * cfg.intermediate_size + cfg.hidden_size


def _silu_mul(b: Builder, layer: int | None, inputs: tuple[Input, ...]) -> str:
    I, T = b.cfg.intermediate_size, b.rows
    return b.add(name=f"L{layer}.silu_mul", kind="silu_mul", out_size=I, elem_bytes=T * ACT_BYTES,
                 flops=5.0 * T * I, inputs=inputs, layer=layer, align=VEC_ALIGN)
