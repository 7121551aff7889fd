"""Tensor and expert parallelism: one GPU's part of a step split over the GPUs of a node, and the
collective op kinds that join the parts.

Tensor parallel (``Step.tp``, Megatron's split): q/k/v and gate/up by columns (each GPU holds
``heads / tp`` query and KV heads and ``intermediate / tp`` of the MLP), o and down by rows (each GPU's
product is a partial sum of the whole hidden state, so an ``all_reduce`` follows, which adds the residual
once), the LM head by vocabulary (an ``all_gather`` of the logits follows); norms and the embedding are
replicated. Expert parallel (``Step.ep``): each GPU holds ``experts / ep`` experts and runs attention and
the dense layers for ``batch / ep`` of the sequences (data parallel); an MoE layer sends each token to the
GPUs of its experts (``all_to_all`` dispatch) and back (``all_to_all`` combine). Both at once (``tp`` x ``ep``
GPUs): ``ep`` groups of ``tp`` GPUs, attention and the dense layers tensor-parallel inside a group over its
``batch / ep`` sequences, the experts split over the groups and each expert's width over a group's GPUs
(Megatron's expert tensor parallelism); dispatch and combine run among the ``ep`` GPUs of one
tensor-parallel rank, and an ``all_reduce`` over the group's ``tp`` GPUs follows the combine. All ranks are
symmetric: a workload is rank 0's ops, and a collective op's time comes from :func:`mksim.costs.collective_us`.

>>> from mksim import models
>>> shard_config(models.get("llama-3.1-8b"), 2).num_kv_heads, shard_config(models.get("llama-3.1-8b"), 2).vocab_size
(4, 64128)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mksim.errors import WorkloadError

from .kinds import KINDS, OpKind

#: the collective op kinds: simulated only (no device function of the generated kernel yet); their tasks
#: run side by side, each taking what the collective takes (mksim.costs.collective_us)
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "all_to_all")
for _name, _what in (("all_reduce", "the sum over the GPUs of a tensor-parallel partial (+ the residual)"),
                     ("all_gather", "each GPU's slice of a tensor-parallel output gathered on every GPU"),
                     ("all_to_all", "an expert-parallel MoE layer's dispatch or combine: each GPU's tokens to "
                                    "and from the GPUs of their experts")):
    KINDS.register(_name, OpKind(_name, "vector", _what, collective=True))
del _name, _what

COLLECTIVE_ALIGN = 8  # elements per tile step of a collective op (16 bytes of bf16)


def check_parallel(cfg: Any, tp: int, ep: int, batch: int) -> None:
    """Refuse, in one line each, a split the model cannot take: ``tp`` that does not divide the query or
    KV heads, ``ep`` on a dense model or not dividing the experts or the batch."""
    if tp > 1:
        for what, n in (("attention heads", cfg.num_heads), ("KV heads", cfg.num_kv_heads)):
            if n % tp:
                raise WorkloadError(f"--tp {tp} does not divide {cfg.name}'s {n} {what}; use one of "
                                    f"{', '.join(map(str, divisors(cfg.num_kv_heads, cfg.num_heads)))}")
    if ep > 1:
        if not cfg.num_experts:
            raise WorkloadError(f"--ep {ep}: {cfg.name} is a dense model (no experts to split); use --tp")
        if cfg.num_experts % ep:
            raise WorkloadError(f"--ep {ep} does not divide {cfg.name}'s {cfg.num_experts} experts; use one of "
                                f"{', '.join(map(str, divisors(cfg.num_experts)))}")
        if batch % ep:
            raise WorkloadError(f"--ep {ep} runs attention data-parallel, batch / {ep} sequences a GPU; "
                                f"batch {batch} does not divide: use a batch that {ep} divides")


def divisors(*counts: int) -> list[int]:
    """The degrees that divide every one of ``counts`` (1 included).

    >>> divisors(8, 32)
    [1, 2, 4, 8]
    """
    return [d for d in range(1, min(counts) + 1) if all(c % d == 0 for c in counts)]


def shard_config(cfg: Any, tp: int) -> Any:
    """One GPU's part of ``cfg`` under tensor parallelism: heads, the MLP's (and each expert's and the
    shared expert's) intermediate width divided by ``tp``, the vocabulary rounded up (Megatron pads it).
    ``cfg`` itself at ``tp`` 1."""
    if tp == 1:
        return cfg
    return replace(cfg, num_heads=cfg.num_heads // tp, num_kv_heads=cfg.num_kv_heads // tp,
                   intermediate_size=-(-cfg.intermediate_size // tp), vocab_size=-(-cfg.vocab_size // tp),
                   expert_intermediate_size=-(-cfg.expert_intermediate_size // tp),
                   shared_expert_intermediate_size=-(-cfg.shared_expert_intermediate_size // tp))


def rank_view(cfg: Any, step: Any) -> tuple[Any, Any]:
    """What one GPU builds of ``step`` (a :class:`~mksim.workload.Step`) of ``cfg``: its shard of the model
    (:func:`shard_config`) and its step (``batch / ep`` sequences under expert parallelism)."""
    local = step.with_(batch=step.batch // step.ep) if step.ep > 1 else step
    return shard_config(cfg, step.tp), local


def rank_param_count(cfg: Any, tp: int, ep: int) -> int:
    """Parameters one GPU holds: the tensor-parallel shard's, the embedding whole (replicated), and
    ``1 / ep`` of the routed experts (of their shard's width, under both).

    >>> from mksim import models
    >>> cfg = models.get("qwen3-30b-a3b")
    >>> rank_param_count(cfg, 2, 4) == rank_param_count(cfg, 2, 1) - 3 * rank_experts(cfg, 2) // 4
    True
    """
    if tp == 1 and ep == 1:
        return int(cfg.param_count())
    shard = shard_config(cfg, tp)
    n = shard.param_count() + (cfg.vocab_size - shard.vocab_size) * cfg.hidden_size  # the whole embedding
    experts = rank_experts(cfg, tp)
    return int(n - experts * (1 - 1 / ep))


def rank_experts(cfg: Any, tp: int) -> int:
    """The routed experts' parameters of every MoE layer, each expert at its tensor-parallel width."""
    return len(cfg.moe_layers) * cfg.num_experts * 3 * cfg.hidden_size * shard_config(cfg, tp).expert_intermediate_size


def collective_attrs(kind: str, ranks: int, message_B: float) -> dict[str, Any]:
    """What a collective op's ``attrs`` hold: the GPUs it spans and the bytes of its message (an
    all-reduce: the tensor each GPU holds; an all-gather: the gathered output; an all-to-all: what each
    GPU sends)."""
    return {"collective": kind, "ranks": ranks, "message_B": float(message_B)}


__all__ = ["COLLECTIVE_ALIGN", "COLLECTIVE_KINDS", "check_parallel", "collective_attrs", "divisors",
           "rank_experts", "rank_param_count", "rank_view", "shard_config"]
