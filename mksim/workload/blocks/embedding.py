"""The token embedding: one row of the embedding table per token (a gather, no arithmetic)."""

from __future__ import annotations

from typing import Any

from .._blocks import BLOCKS, BaseBlock
from .._builder import ACT_BYTES, VEC_ALIGN, Builder


@BLOCKS.add
class Embed(BaseBlock):
    """``embed``: reads ``rows`` rows of ``hidden_size`` from the table; they start the residual stream."""

    name = "embed"
    role = "embedding"

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        H, T = b.cfg.hidden_size, b.rows
        return b.add(name="embed", kind="embed", out_size=H, elem_bytes=T * ACT_BYTES, flops=0.0,
                     weight_bytes=T * H * ACT_BYTES, layer=None, align=VEC_ALIGN)

    def params(self, cfg: Any, layer: int | None) -> int:
        return cfg.vocab_size * cfg.hidden_size
