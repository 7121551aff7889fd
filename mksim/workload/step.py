"""A :class:`Step`: which model step is planned — the one value the builder, the schedule file, the
search, ``compare`` and the explorer pass instead of retyping batch, KV length and phase."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mksim.errors import WorkloadError

from .routing import parse_routing

PHASES = ("decode", "prefill")
WEIGHT_DTYPES = ("bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Step:
    """One step of a model: ``batch`` sequences, each with ``kv_len`` tokens in its KV cache, making
    one token each (``decode``) or taking ``prefill_tokens`` new ones (``prefill``), with weights
    stored as ``weight_dtype``, split over ``tp`` GPUs (tensor parallel; 1: one GPU) or, in a mixture of
    experts, its experts over ``ep`` GPUs (expert parallel, :mod:`~mksim.workload.parallel`). In a
    mixture-of-experts model, ``routing`` names the routing model that says which experts the tokens
    pick (:func:`~mksim.workload.routing.parse_routing`: ``uniform``, ``zipf:S`` or a ``.json`` file of
    expert counts) and ``routing_seed`` seeds its draw.

    ``model`` is a built-in model's name or a :class:`~mksim.models.ModelConfig`. Bad values are
    refused as the step is made, in one line (:class:`~mksim.errors.WorkloadError`).

    >>> s = Step("llama-3.2-1b", batch=4, kv_len=512)
    >>> s.new_tokens, s.rows, s.kv_total
    (1, 4, 513)
    >>> Step("llama-3.2-1b", phase="prefill", prefill_tokens=128).rows
    128
    >>> Step("llama-3.2-1b", batch=0)
    Traceback (most recent call last):
    ...
    mksim.errors.WorkloadError: batch must be a positive integer, got 0
    """

    model: Any
    batch: int = 1
    kv_len: int = 1024
    phase: str = "decode"
    prefill_tokens: int = 0
    weight_dtype: str = "bf16"
    tp: int = 1
    routing: str = "uniform"
    ep: int = 1
    routing_seed: int = 0

    def __post_init__(self) -> None:
        b, kv, n = self.batch, self.kv_len, self.prefill_tokens
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise WorkloadError(f"batch must be a positive integer, got {b!r}")
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 0:
            raise WorkloadError(f"kv_len (context already in the KV cache) must be an integer >= 0, got {kv!r}")
        if self.phase not in PHASES:
            raise WorkloadError(f"phase must be 'decode' or 'prefill', got {self.phase!r}")
        if self.phase == "prefill" and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise WorkloadError("prefill needs prefill_tokens >= 1 (new tokens per sequence)")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise WorkloadError(f"weight dtype must be bf16, fp16 or fp8, got {self.weight_dtype!r}")
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise WorkloadError(f"tp (tensor-parallel degree) must be a positive integer, got {self.tp!r}")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise WorkloadError(f"ep (expert-parallel degree) must be a positive integer, got {self.ep!r}")
        parse_routing(self.routing)  # a bad routing (zipf:abc, a file that is not one) is refused here
        if isinstance(self.routing_seed, bool) or not isinstance(self.routing_seed, int) or self.routing_seed < 0:
            raise WorkloadError(f"routing_seed must be an integer >= 0, got {self.routing_seed!r}")

    @property
    def new_tokens(self) -> int:
        """Tokens each sequence adds this step: 1 in decode, ``prefill_tokens`` in prefill."""
        return 1 if self.phase == "decode" else self.prefill_tokens

    @property
    def ranks(self) -> int:
        """GPUs the step is split over: ``tp × ep`` (``ep`` groups of ``tp``, :mod:`~mksim.workload.parallel`;
        1: one GPU)."""
        return self.tp * self.ep

    @property
    def rows(self) -> int:
        """Rows through the projections: ``batch × new_tokens``."""
        return self.batch * self.new_tokens

    @property
    def kv_total(self) -> int:
        """Tokens each sequence attends to: what the cache held plus the new ones."""
        return self.kv_len + self.new_tokens

    @property
    def model_name(self) -> str:
        """The model's name (a config's ``name``)."""
        return self.model if isinstance(self.model, str) else str(getattr(self.model, "name", self.model))

    def with_(self, **changes: Any) -> Step:
        """A copy with ``changes`` (checked again)."""
        return replace(self, **changes)


__all__ = ["PHASES", "Step", "WEIGHT_DTYPES"]
