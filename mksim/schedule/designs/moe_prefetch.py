"""MoE speculative prefetch: during each MoE layer's attention, read into L2 the experts the routing
model makes likeliest, as many as ``moe_prefetch_MiB`` holds, before the top-k says which are picked.

The experts are ranked by the probability that the step's tokens pick them (``1 - (1 - pi)**T`` from
:mod:`mksim.workload.routing`); the prefetch is one DRAM flow per layer, started as the layer's
attention starts (the layer's first op), sharing the HBM with everything else. An expert tile then
finds in L2 the expected share of its expert's weights that was prefetched (the expected hit rate:
the probability mass of the prefetched experts among the expected active ones) if the prefetch is
in, and not evicted (more than the L2 of DRAM traffic since), when the layer's top-k is seen; that
share comes at the SM's L2 rate, the rest streams from DRAM as without it. Combinable with
``moe_dispatch`` stride or queue. The design's files: this one, its engine piece
``mksim/sim/designs/moe_prefetch.py`` and ``Options.moe_prefetch_MiB``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from hwmodels import GPUSpec
from mksim.errors import ScheduleError

from .._designs import BaseDesign, register_design
from .._policies import DagList
from .moe_stride import refuse_dense, without_experts

if TYPE_CHECKING:
    from .._schedule import Options, Schedule

L2_SHARES = (0.0, 0.25, 0.5)  # of the L2, what a search samples


def prefetch_plan(pi: np.ndarray, tokens: int, expert_B: float, budget_B: float) -> tuple[list[int], float, float]:
    """The experts a prefetch of ``budget_B`` reads (likeliest first, whole experts of ``expert_B``),
    their expected hits among the active experts and the expected hit rate (hits / expected active).

    >>> prefetch_plan(np.array([0.5, 0.5, 0.5, 0.5]), 1, 10.0, 25.0)  # uniform top-2 of 4, one token
    ([0, 1], 1.0, 0.5)
    """
    p_active = 1.0 - (1.0 - np.minimum(pi, 1.0)) ** tokens
    n = int(min(len(pi), budget_B // expert_B)) if expert_B > 0 else 0
    chosen = sorted(int(e) for e in np.argsort(-p_active, kind="stable")[:n])
    hits = float(p_active[chosen].sum())
    expected = float(p_active.sum())
    return chosen, hits, hits / expected if expected > 0 else 0.0


@register_design
class MoEPrefetch(BaseDesign):
    """``moe_prefetch_MiB > 0``: speculative L2 prefetch of the likeliest experts during attention;
    ``design_stats["moe_prefetch"]`` reports the experts prefetched, the expected hit rate, the hits
    and the bytes prefetched per layer."""

    name = "moe_prefetch"
    option = "moe_prefetch_MiB"
    value = 0.0
    compare_rows = (("megakernel:moe_prefetch", {"moe_prefetch_MiB": 16.0}),
                    ("megakernel:moe_queue+prefetch", {"moe_prefetch_MiB": 16.0, "moe_dispatch": "queue"}))

    def on(self, options: Options) -> bool:
        return bool(options.moe_prefetch_MiB > 0)

    def search_options(self) -> dict[str, Any]:
        return {}  # sampled (suggest)

    def suggest(self, trial: Any, fixed: dict[str, Any], gpu: GPUSpec, included: bool) -> dict[str, Any]:
        if not included or self.option in fixed:
            return {}
        share = trial.suggest_categorical("moe_prefetch_l2", L2_SHARES)
        return {self.option: float(share * gpu.l2.size_MiB)} if share else {}

    def baseline_options(self, fixed: dict[str, Any]) -> dict[str, Any]:
        return {} if self.option in fixed else {"moe_prefetch_l2": L2_SHARES[0]}  # the other baselines: none

    def baselines(self, fixed: dict[str, Any], megakernel: dict[str, Any]) -> dict[str, dict[str, Any]]:
        if self.option in fixed:
            return {}
        # the default megakernel (dag), prefetching into half the L2
        return {f"megakernel:{self.name}": {"policy": DagList.name, **DagList.baseline, **megakernel,
                                            "moe_prefetch_l2": L2_SHARES[-1]}}

    def available_on(self, gpu: GPUSpec) -> str | None:
        return None if gpu.l2.size_MiB >= 16.0 else f"{gpu.name} has {gpu.l2.size_MiB:g} MiB of L2, under the 16 MiB " \
            "its compare rows prefetch"

    def available_for(self, workload: Any) -> str | None:
        return without_experts(workload, self.option)

    def validate(self, schedule: Schedule) -> None:
        v = schedule.options.moe_prefetch_MiB
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
            raise ScheduleError(f"moe_prefetch_MiB must be a number of MiB >= 0, got {v!r}")
        if v > 0:
            refuse_dense(self, schedule, "moe_prefetch_MiB")
            if v > schedule.gpu.l2.size_MiB:
                raise ScheduleError(f"moe_prefetch_MiB={v:g} exceeds the {schedule.gpu.l2.size_MiB:g} MiB L2 of "
                                    f"{schedule.gpu.name}")
