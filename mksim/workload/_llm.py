"""Build the unfused op graph of a decoder-only LLM step (decode or prefill) from its blocks.

A model is ``embedding`` + ``num_layers`` × (``attention`` + ``ffn``) + ``head``; which block plays each
role comes from the config (:func:`~mksim.workload.blocks_of`), and each block adds its ops
(``mksim/workload/blocks/``, the contract in :mod:`mksim.workload._blocks`). The base graph keeps each
op separate (norm, projection, RoPE, attention partials and their reduction, SiLU·mul, ...); fusing is a
schedule's choice (:class:`~mksim.workload.Build`). Matmul epilogues that every implementation fuses
(the residual add after the O and down projections) are part of their matmul.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from mksim.errors import WorkloadError

from ._blocks import blocks_of
from ._builder import SWITCHES, Build, Builder
from ._ops import Workload
from .parallel import check_parallel, rank_view
from .step import Step

MAX_LAYERS = 4096  # far above any model (Llama 3.1 405B has 126); bounds the ops a config can make
#: the keyword parameters that make the :class:`Step` when none is given (old callers)
STEP_FIELDS = tuple(f.name for f in fields(Step) if f.name != "model")


def build_llm_workload(cfg: Any, step: Step | None = None, *, fuse_norm: bool = False, fuse_rope: bool = False,
                       fuse_silu: bool = False, fuse_reduce: bool = False, split_qkv: bool = False,
                       split_gate_up: bool = False, logit_softcap: float = 0.0, kv_splits: int | None = None,
                       n_sms: int = 132, **step_fields: Any) -> Workload:
    """The op graph of ``step`` (a :class:`Step`) of ``cfg`` (a :class:`~mksim.models.ModelConfig`),
    cut as the keyword choices say (the fields of :class:`Build`, which documents them).

    Without ``step``, ``batch``, ``kv_len``, ``phase``, ``prefill_tokens`` and ``weight_dtype`` make it
    (``batch`` sequences each holding ``kv_len`` tokens in the KV cache; ``decode`` makes one token per
    sequence, ``prefill`` processes ``prefill_tokens`` new tokens per sequence). The workload carries
    both (``wl.step``, ``wl.build``).

    >>> from mksim import models
    >>> wl = build_llm_workload(models.get("llama-3.2-1b"), Step("llama-3.2-1b", batch=2), fuse_norm=True)
    >>> wl.name, len(wl.ops), wl.step.batch, wl.build.fuse_norm
    ('llama-3.2-1b decode b2 kv1024 fused-norm', 130, 2, True)
    """
    build = Build(fuse_norm=fuse_norm, fuse_rope=fuse_rope, fuse_silu=fuse_silu, fuse_reduce=fuse_reduce,
                  split_qkv=split_qkv, split_gate_up=split_gate_up, logit_softcap=logit_softcap,
                  kv_splits=kv_splits, n_sms=n_sms)
    step = _step(cfg, step, step_fields)
    blocks = blocks_of(cfg)
    for block in blocks.values():
        block.check(cfg, build)
    check_parallel(cfg, step.tp, step.ep, step.batch)
    if not 1 <= cfg.num_layers <= MAX_LAYERS:  # before making ops: a few per layer, all in memory
        raise WorkloadError(f"{cfg.name}: num_layers = {cfg.num_layers} is implausible; expected between 1 and "
                            f"{MAX_LAYERS} (the largest models have about 130)")
    if step.kv_total > cfg.max_position_embeddings:
        raise WorkloadError(f"kv_len + new tokens = {step.kv_total} exceeds {cfg.name}'s context of "
                            f"{cfg.max_position_embeddings}; use a smaller --kv-len")
    if step.routing != "uniform" and not getattr(cfg, "num_experts", 0):
        raise WorkloadError(f"{cfg.name} has no experts: routing {step.routing!r} applies to mixture-of-experts "
                            "models only; leave it out")
    # one GPU's ops (rank 0's: the ranks are symmetric): its shard of the model, its share of the batch
    b = Builder(*rank_view(cfg, step), build)
    x = blocks["embedding"].ops(b, None, "")
    for layer in range(cfg.num_layers):
        x = blocks["attention"].ops(b, layer, x)
        x = blocks["ffn"].ops(b, layer, x)
    blocks["head"].ops(b, None, x)
    prefill = step.phase == "prefill"
    routed = "" if step.routing == "uniform" else f" routing={step.routing}"
    name = (f"{cfg.name} {step.phase} b{step.batch} kv{step.kv_len}" + (f" n{step.prefill_tokens}" if prefill else "")
            + build.label + routed + (f" seed{step.routing_seed}" if step.routing_seed and b.routing else "")
            + (f" tp{step.tp}" if step.tp > 1 else "") + (f" ep{step.ep}" if step.ep > 1 else ""))
    return Workload(name=name, ops=tuple(b.ops), tokens=step.rows, batch=step.batch, kv_len=step.kv_len,
                    phase=step.phase, prefill_tokens=step.prefill_tokens if prefill else 0,
                    weight_dtype=step.weight_dtype, **{k: getattr(build, k) for k in SWITCHES}, model=cfg,
                    options=build.options, step=step, build=build, routing=tuple(b.routing))



def _step(cfg: Any, step: Step | None, step_fields: dict[str, Any]) -> Step:
    """``step``, or the one old callers give as keywords (``batch=``, ``kv_len=``, ...)."""
    known = (*STEP_FIELDS, *(f.name for f in fields(Build)))
    for key in step_fields:
        if key not in STEP_FIELDS:
            raise WorkloadError(f"unknown workload parameter {key!r}; known: {', '.join(known)}")
        if step is not None:
            raise WorkloadError(f"{key} is the step's; give it in the Step or give no Step, not both")
    return Step(cfg, **step_fields) if step is None else step
