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
    at ``cap * tanh(logits / cap)``. Under tensor parallelism each GPU's head holds ``vocab / tp`` of the
    vocabulary, and ``logits.all_gather`` gathers the logits on every GPU."""

    name = "lm_head"
    role = "head"

    def ops(self, b: Builder, layer: int | None, x: str) -> str:
        H, V, batch, cap = b.cfg.hidden_size, b.cfg.vocab_size, b.step.batch, b.build.logit_softcap
        logits = b.matmul("lm_head", b.norm("final_norm", x, None), H, V, None, rows=batch, normed=True)
        if cap:
            logits = b.add(name="softcap", kind="softcap", out_size=V, elem_bytes=batch * ACT_BYTES,  # divide, tanh,
                           flops=3.0 * batch * V, inputs=(Input(logits),), layer=None, align=VEC_ALIGN,  # multiply
                           attrs={"rows": batch, "cap": float(cap)})
        if b.tp == 1:
            return logits
        full = V * b.tp  # each GPU holds vocab / tp of each row's logits: gather them all on every GPU
        return b.collective("logits.all_gather", "all_gather", logits, full, batch * ACT_BYTES, None, b.tp,
                            batch * full * ACT_BYTES)

    def params(self, cfg: Any, layer: int | None) -> int:  # the final norm, and the LM head unless tied
        return cfg.hidden_size + (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)
