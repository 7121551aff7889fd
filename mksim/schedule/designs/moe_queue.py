"""MoE route-finalize and drain queue (Cohere): each SM runs its static list, in task order, to the
point where an MoE layer's expert op would be; there it drains a queue of the op's expert tiles that
a route-finalize step publishes once the layer's top-k is seen (one L2 read of the top-k and one
release atomic after it), claiming tiles one atomic round trip each (``dispatch_task_us``, the
figure dynamic dispatch uses), one ahead of the tile it runs, until a claim finds the queue empty.
Nothing is known of the routing at plan time: which SM runs which expert is decided as the SMs
become free. The design's files: this one, its engine piece ``mksim/sim/designs/moe_queue.py`` and
``Options.moe_dispatch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwmodels import GPUSpec
from mksim.errors import ScheduleError

from .._designs import BaseDesign, register_design
from .._policies import DagList
from .moe_stride import MOE_DISPATCHES, MoEStridePolicy, check_dispatch, refuse_dense, without_experts

if TYPE_CHECKING:
    from .._schedule import Schedule

SAMPLED = ("plan", "queue")  # what a search samples with any policy but moe_stride's


@register_design
class MoEQueue(BaseDesign):
    """``moe_dispatch="queue"``: expert tiles drained from a queue published by a route-finalize
    step; ``design_stats["moe_queue"]`` reports each layer's per-SM imbalance, claims, its top-k's
    serial time and which SM ran which expert."""

    name = "moe_queue"
    option = "moe_dispatch"
    value = "queue"
    compare_rows = (("megakernel:moe_queue", {"moe_dispatch": "queue"}),)
    choices = MOE_DISPATCHES

    def search_options(self) -> dict[str, Any]:
        return {}  # sampled (suggest)

    def suggest(self, trial: Any, fixed: dict[str, Any], gpu: GPUSpec, included: bool) -> dict[str, Any]:
        if not included or self.option in fixed or trial.params.get("policy") == MoEStridePolicy.name:
            return {}
        return {self.option: trial.suggest_categorical(self.option, SAMPLED)}

    def settles(self, options: dict[str, Any]) -> dict[str, Any]:
        # the L2 prefetcher walks the static queues' bytes: the drained tiles are not in them
        return {"l2_prefetch_KiB": 0.0} if options.get(self.option) == self.value else {}

    def baseline_options(self, fixed: dict[str, Any]) -> dict[str, Any]:
        return {} if self.option in fixed else {self.option: SAMPLED[0]}  # the other baselines: as planned

    def baselines(self, fixed: dict[str, Any], megakernel: dict[str, Any]) -> dict[str, dict[str, Any]]:
        if self.option in fixed:
            return {}
        # the default megakernel (dag), its expert tiles drained
        return {f"megakernel:{self.name}": {"policy": DagList.name, **DagList.baseline, **megakernel,
                                            self.option: self.value}}

    def available_for(self, workload: Any) -> str | None:
        return without_experts(workload, f"{self.option}={self.value!r}")

    def validate(self, schedule: Schedule) -> None:
        check_dispatch(schedule)
        o = schedule.options
        if o.moe_dispatch != self.value:
            return
        refuse_dense(self, schedule, "moe_dispatch='queue'")
        if o.dispatch != "static":
            raise ScheduleError("moe_dispatch='queue' drains expert tiles from each SM's static list; "
                                f"dispatch={o.dispatch!r} hands every task out itself: use one or the other")
        if o.l2_prefetch_KiB:
            raise ScheduleError("moe_dispatch='queue': the L2 prefetcher walks the static queues' bytes, and the "
                                "drained expert tiles are not in them; leave l2_prefetch_KiB at 0")
