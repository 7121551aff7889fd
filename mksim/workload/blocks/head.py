"""The head: the final RMS norm, the LM head (each sequence's last token only) and, where the build
asks for it, logit soft-capping (Gemma 2's ``final_logit_softcapping``)."""

from __future__ import annotations

from typing import Any

from .._blocks import BLOCKS, BaseBlock
from .._builder import ACT_BYTES, VEC_ALIGN, Builder
from .._ops import Input


@BLOCKS.add
class LMHead(BaseBlock):
    """``lm_head``: ``final_norm``, ``lm_head`` (``batch`` rows: prefill needs the logits of each
    sequence's last token only) and, with ``logit_softcap`` > 0, a ``softcap`` op that caps the logits
    at ``cap * tanh(logits / cap)``."""

    name = "lm_head"
    role = "head"

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        H, V, batch, cap = b.cfg.hidden_size, b.cfg.vocab_size, b.step.batch, b.build.logit_softcap
        logits = b.matmul("lm_head", b.norm("final_norm", x, None), H, V, None, rows=batch, normed=True)
        if not cap:
            return logits
        return b.add(name="softcap", kind="softcap", out_size=V, elem_bytes=batch * ACT_BYTES,  # divide, tanh,
                     flops=3.0 * batch * V, inputs=(Input(logits),), layer=None, align=VEC_ALIGN,  # multiply
                     attrs={"rows": batch, "cap": float(cap)})

    def params(self, cfg: Any, layer: int | None) -> int:  # the final norm, and the LM head unless tied
        return cfg.hidden_size + (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
