"""Routing models: which experts the tokens of a mixture-of-experts step pick.

The router of an MoE layer is an op on the GPU (a matmul and a ``topk``); *which* experts its top-k
picks depends on the tokens, so a workload takes it from a routing model, named by one string
(:func:`parse_routing`, ``Step.routing``):

- ``uniform``: every expert equally likely, each token picking ``k`` distinct experts;
- ``zipf:S``: expert popularity falls as ``1 / rank**S`` (``S`` > 0: the larger, the more skewed),
  the ranking shuffled per layer;
- a path to a ``.json`` file of measured expert counts, one list per MoE layer (a histogram of a
  user's traffic; the format is in docs/moe.md).

Each model gives, per MoE layer, the share of routed tokens each expert takes, as inclusion
probabilities ``pi`` (the probability that a token picks the expert: they sum to ``k``, none above 1).
From them, for ``T`` tokens (:func:`route`):

- a concrete draw, seeded and deterministic: each token picks ``k`` distinct experts by randomized
  systematic sampling, which keeps ``pi`` exact; the workload is built from it;
- the expected number of distinct experts, ``sum(1 - (1 - pi)**T)`` (exact: tokens are independent),
  and its standard deviation (exact for ``uniform``; Monte Carlo over fixed-seed replicates otherwise).

>>> r = route(parse_routing("uniform"), layer=0, tokens=8, n_experts=128, top_k=8)
>>> round(r.expected, 1), round(r.std, 2), r.active, sum(r.rows)
(51.6, 2.56, 50, 64)
>>> parse_routing("zipf:-1")
Traceback (most recent call last):
...
mksim.errors.WorkloadError: routing 'zipf:-1': the skew S of zipf:S must be a number > 0 (1.2 is typical), got '-1'
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from hwmodels.files import names_a_file, parse_json, read_bytes
from mksim.errors import WorkloadError
from mksim.registry import Registry

#: a routing file is a few hundred KiB at most (layers x experts counts); anything past this is not one
ROUTING_FILE_LIMIT_B = 16 << 20
#: the keys a routing file may hold
FILE_KEYS = ("counts", "model", "source")
_ONE = 1 << 32  # probabilities in units of 2**-32: the systematic draw in exact integer arithmetic
#: Monte Carlo replicates for the spread of a non-uniform model: at most this many expert draws in all
_MC_BUDGET = 1 << 21


class BaseRouting:
    """A routing model: ``name``, the text it was parsed from (``spec``), and :meth:`probs`."""

    name: ClassVar[str] = ""

    def __init__(self, spec: str):
        self.spec = spec

    @classmethod
    def parse(cls, spec: str, arg: str) -> BaseRouting:
        """The model ``spec`` names (``arg``: what follows ``name:``, or the path); bad ``arg``: one line."""
        return cls(spec)

    def check(self, model: str, moe_layers: int, n_experts: int, top_k: int) -> None:
        """Refuse, in one line, a model this routing cannot describe (a file of another model's counts)."""

    def probs(self, moe_layer: int, n_experts: int, top_k: int) -> np.ndarray:
        """Inclusion probabilities of the ``n_experts`` experts for one token in MoE layer ``moe_layer``
        (0: the model's first MoE layer): they sum to ``top_k``, none is above 1."""
        raise NotImplementedError

    @property
    def exact_uniform(self) -> bool:
        """Whether every expert is equally likely in every layer (the spread is then exact)."""
        return False


ROUTINGS: Registry[type[BaseRouting]] = Registry("routing model")


def _register(cls: type[BaseRouting]) -> type[BaseRouting]:
    ROUTINGS.register(cls.name, cls)
    return cls


@_register
class Uniform(BaseRouting):
    """``uniform``: each token picks ``k`` distinct experts, every set of ``k`` equally likely."""

    name = "uniform"

    @classmethod
    def parse(cls, spec: str, arg: str) -> BaseRouting:
        if arg:
            raise WorkloadError(f"routing {spec!r}: uniform takes no argument; give 'uniform'")
        return cls(spec)

    def probs(self, moe_layer: int, n_experts: int, top_k: int) -> np.ndarray:
        return np.full(n_experts, top_k / n_experts)

    @property
    def exact_uniform(self) -> bool:
        return True


@_register
class Zipf(BaseRouting):
    """``zipf:S``: the expert of popularity rank ``r`` takes a share ``∝ 1 / r**S`` of the routed tokens
    (capped so that no expert is picked by a token more than once); the ranking is shuffled per layer."""

    name = "zipf"

    def __init__(self, spec: str, skew: float):
        super().__init__(spec)
        self.skew = skew

    @classmethod
    def parse(cls, spec: str, arg: str) -> BaseRouting:
        try:
            s = float(arg)
        except ValueError:
            s = math.nan
        if not 0 < s < 100:  # also nan; beyond 100 every token is routed to the same top-k
            raise WorkloadError(f"routing {spec!r}: the skew S of zipf:S must be a number > 0 (1.2 is typical), "
                                f"got {arg!r}")
        return cls(spec, s)

    def probs(self, moe_layer: int, n_experts: int, top_k: int) -> np.ndarray:
        w = 1.0 / np.arange(1, n_experts + 1, dtype=float) ** self.skew
        rank = np.random.default_rng([0x2AF, moe_layer]).permutation(n_experts)  # hot experts differ by layer
        return capped(top_k * w[rank] / w.sum(), top_k)


@_register
class CountsFile(BaseRouting):
    """A JSON file of measured expert counts: ``{"counts": [[c_0, ..., c_{N-1}], ...]}``, one list per
    MoE layer in layer order, ``c_e`` the tokens routed to expert ``e`` over the user's traffic (each
    token counted once per expert it picked). An expert's share of the counts is its share of the routed
    tokens: ``pi_e = k * c_e / sum(c)``, capped at 1 with the excess spread over the others."""

    name = "file"

    def __init__(self, spec: str, counts: tuple[tuple[int, ...], ...]):
        super().__init__(spec)
        self.counts = counts

    @classmethod
    def parse(cls, spec: str, arg: str) -> BaseRouting:
        where = f"routing file {arg if len(arg) <= 120 else arg[:60] + '…'}"
        try:
            st = os.stat(arg)
            key: tuple[Any, ...] = (arg, st.st_mtime_ns, st.st_size)
        except (OSError, ValueError):
            key = (arg, None, None)  # read_bytes says what is wrong with it
        return cls(spec, _read_counts(key, where))

    def check(self, model: str, moe_layers: int, n_experts: int, top_k: int) -> None:
        where = f"routing file {self.spec}"
        if len(self.counts) != moe_layers:
            raise WorkloadError(f"{where}: {len(self.counts)} layers of counts, but {model} has {moe_layers} MoE "
                                "layers; give one list of counts per MoE layer")
        for i, row in enumerate(self.counts):
            if len(row) != n_experts:
                raise WorkloadError(f"{where}: MoE layer {i} has {len(row)} counts, but {model} has {n_experts} "
                                    "experts; give one count per expert")
            if sum(1 for c in row if c > 0) < top_k:
                raise WorkloadError(f"{where}: MoE layer {i} routes tokens to {sum(1 for c in row if c > 0)} "
                                    f"experts, fewer than the {top_k} each token picks")

    def probs(self, moe_layer: int, n_experts: int, top_k: int) -> np.ndarray:
        c = np.asarray(self.counts[moe_layer], dtype=float)
        return capped(top_k * c / c.sum(), top_k)


@lru_cache(maxsize=16)
def _read_counts(key: tuple[Any, ...], where: str) -> tuple[tuple[int, ...], ...]:
    raw = parse_json(read_bytes(key[0], "", limit=ROUTING_FILE_LIMIT_B, error=WorkloadError,
                                missing="no such file; give a JSON file of expert counts (docs/moe.md)"),
                     where, error=WorkloadError)
    if not isinstance(raw, dict) or "counts" not in raw:
        raise WorkloadError(f"{where}: expected a JSON object with \"counts\": one list of expert counts per MoE "
                            "layer (docs/moe.md)")
    for k in raw:
        if k not in FILE_KEYS:
            raise WorkloadError(f"{where}: unknown key {str(k)[:40]!r}; known: {', '.join(FILE_KEYS)}")
    counts = raw["counts"]
    if not isinstance(counts, list) or not counts or not all(isinstance(r, list) for r in counts):
        raise WorkloadError(f"{where}: \"counts\" must be a non-empty list of lists (one per MoE layer)")
    for i, row in enumerate(counts):
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in row):
            bad = next(c for c in row if not (isinstance(c, int) and not isinstance(c, bool) and c >= 0))
            raise WorkloadError(f"{where}: MoE layer {i} has the count {str(bad)[:40]}; counts are whole numbers "
                                ">= 0 (tokens routed to the expert)")
        if not any(row):
            raise WorkloadError(f"{where}: MoE layer {i} has no tokens; every layer needs counts above 0")
    return tuple(tuple(int(c) for c in row) for row in counts)


def parse_routing(text: Any) -> BaseRouting:
    """The routing model ``text`` names: ``uniform``, ``zipf:S``, or the path of a ``.json`` file of
    expert counts; anything else is refused in one line.

    >>> parse_routing("zipf:1.2").skew, parse_routing("uniform").name
    (1.2, 'uniform')
    """
    if not isinstance(text, str) or not text:
        raise WorkloadError(f"routing must be 'uniform', 'zipf:S' or a .json file of expert counts, got {text!r}")
    name, _, arg = text.partition(":")
    if name in ROUTINGS and name != CountsFile.name:
        return _parse_named(text)
    if name == CountsFile.name and arg:
        return CountsFile.parse(text, arg)  # read again if the file changed (its counts are cached by date)
    if names_a_file(text, ".json"):
        return CountsFile.parse(text, text)
    shown = text if len(text) <= 60 else text[:60] + "…"
    raise WorkloadError(f"unknown routing {shown!r}; give uniform, zipf:S (S > 0) or a .json file of expert counts")


@lru_cache(maxsize=64)
def _parse_named(text: str) -> BaseRouting:
    name, _, arg = text.partition(":")
    return ROUTINGS[name].parse(text, arg)


def capped(pi: np.ndarray, top_k: int) -> np.ndarray:
    """``pi`` (summing to ``top_k``) with no entry above 1: an expert a token picks at most once; the
    excess goes to the others in proportion to their share.

    >>> capped(np.array([3.0, 0.5, 0.5]), 2).tolist()
    [1.0, 0.5, 0.5]
    """
    pi = np.array(pi, dtype=float)
    for _ in range(len(pi)):
        over = pi > 1.0
        if not over.any():
            break
        free = ~over & (pi < 1.0)
        pi[over] = 1.0
        rest = top_k - pi[~free].sum()
        pi[free] *= rest / pi[free].sum()
    return pi


def _units(pi: np.ndarray, top_k: int) -> np.ndarray:
    """``pi`` in integer units of 2**-32, summing to exactly ``top_k`` units of 2**32, none above 2**32."""
    u = np.floor(pi * _ONE).astype(np.int64)
    u = np.minimum(u, _ONE)
    short = top_k * _ONE - int(u.sum())
    if short > 0:  # give the rounding's remainder to the largest fractions that have room
        room = np.flatnonzero(u < _ONE)
        frac = pi[room] * _ONE - u[room]
        take = room[np.argsort(-frac, kind="stable")][:short]
        u[take] += 1
        short -= len(take)
    if short != 0:
        raise WorkloadError(f"routing probabilities do not sum to {top_k} (got {pi.sum():.6f})")
    return u


def draw(pi: np.ndarray, tokens: int, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """``(tokens, top_k)`` expert indices: each token's ``top_k`` distinct experts, drawn by randomized
    systematic sampling (a random order of the experts, then every unit step from a random start along
    their cumulated ``pi``), which picks expert ``e`` with probability exactly ``pi[e]``."""
    n = len(pi)
    units = _units(pi, top_k)
    order = rng.permuted(np.tile(np.arange(n), (tokens, 1)), axis=1)
    cum = np.cumsum(units[order], axis=1)
    start = rng.integers(0, _ONE, size=(tokens, 1), dtype=np.int64)
    prev = np.concatenate([np.zeros((tokens, 1), dtype=np.int64), cum[:, :-1]], axis=1)
    hit = (cum - start) // _ONE > (prev - start) // _ONE  # the unit points start + j fall in [prev, cum)
    return order[hit].reshape(tokens, top_k)


def distinct_expected(pi: np.ndarray, tokens: int) -> float:
    """Expected number of experts at least one of ``tokens`` tokens picks: ``sum(1 - (1 - pi)**T)``."""
    return float(np.sum(1.0 - (1.0 - pi) ** tokens))


def distinct_std_uniform(n: int, k: int, tokens: int) -> float:
    """Standard deviation of the distinct experts ``tokens`` tokens pick, each ``k`` of ``n`` uniformly:
    per token an expert is missed with probability ``(n-k)/n``, a pair with ``(n-k)(n-k-1)/(n(n-1))``."""
    p0 = ((n - k) / n) ** tokens
    q0 = ((n - k) * (n - k - 1) / (n * (n - 1))) ** tokens if n > 1 else 0.0
    var = n * p0 * (1 - p0) + n * (n - 1) * (q0 - p0 * p0)
    return math.sqrt(max(var, 0.0))


@lru_cache(maxsize=256)
def _std_mc(units_key: bytes, n: int, k: int, tokens: int) -> float:
    pi = np.frombuffer(units_key, dtype=np.int64) / _ONE
    reps = int(min(256, max(16, _MC_BUDGET // max(1, tokens * n))))
    rng = np.random.default_rng(0x5EED)
    d = [len(np.unique(draw(pi, tokens, k, rng))) for _ in range(reps)]
    return float(np.std(d, ddof=1))


@dataclass(frozen=True)
class RoutedLayer:
    """The routing of one MoE layer for a step: ``experts`` (the active experts, ascending) and ``rows``
    (tokens routed to each) of the concrete draw; ``expected`` and ``std``, the number of distinct
    experts the routing model expects for ``tokens`` tokens and its spread."""
    layer: int
    tokens: int
    experts: tuple[int, ...]
    rows: tuple[int, ...]
    expected: float
    std: float

    @property
    def active(self) -> int:
        """Distinct experts in the draw."""
        return len(self.experts)

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "tokens": self.tokens, "active": self.active, "expected": self.expected,
                "std": self.std, "experts": list(self.experts), "rows": list(self.rows)}


def route(model: BaseRouting, *, layer: int, tokens: int, n_experts: int, top_k: int, moe_layer: int | None = None,
          seed: int = 0) -> RoutedLayer:
    """The routing of ``tokens`` tokens in ``layer`` (``moe_layer``: its index among the MoE layers, for
    a file's counts; default ``layer``): the seeded draw, and the expected distinct experts with their
    standard deviation."""
    m = layer if moe_layer is None else moe_layer
    pi = model.probs(m, n_experts, top_k)
    picks = draw(pi, tokens, top_k, np.random.default_rng([seed, layer]))
    counts = np.bincount(picks.ravel(), minlength=n_experts)
    active = np.flatnonzero(counts)
    if model.exact_uniform:
        std = distinct_std_uniform(n_experts, top_k, tokens)
    else:  # the spread depends on pi's values only, not on which expert holds which: cached across layers
        std = _std_mc(np.sort(_units(pi, top_k)).tobytes(), n_experts, top_k, tokens)
    return RoutedLayer(layer=layer, tokens=tokens, experts=tuple(int(e) for e in active),
                       rows=tuple(int(counts[e]) for e in active), expected=distinct_expected(pi, tokens), std=std)


__all__ = ["BaseRouting", "CountsFile", "FILE_KEYS", "ROUTINGS", "ROUTING_FILE_LIMIT_B", "RoutedLayer", "Uniform",
           "Zipf", "capped", "distinct_expected", "distinct_std_uniform", "draw", "parse_routing", "route"]
