"""MoE static striding (MPK): an MoE layer's expert tiles striped by *slot* over a fixed grid of SMs.

A static queue is built before the router runs, so it cannot know which experts a step picks, nor how
many: it assigns expert *slots* (tile ``s`` of an expert op is the ``s mod r``-th tile of the
``s // r``-th active expert) to SM ``s mod grid``, for as many slots as the step could need (``min(N, T k)``
experts); the slots beyond the active count cost their SM an early exit (one L2 read of the active
list each). The per-SM imbalance comes from the active tiles not dividing the grid (at batch 1, 8
experts' tiles over 132 SMs). The design's files: this one (the design, the ``moe_stride`` policy and
what the MoE designs share), its engine piece ``mksim/sim/designs/moe_stride.py`` and the knob
``Options.moe_dispatch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwmodels import GPUSpec
from mksim.costs import Rates
from mksim.errors import ScheduleError
from mksim.workload import Op, TaskGraph

from .._designs import BaseDesign, register_design
from .._policies import BasePolicy, register_policy

if TYPE_CHECKING:
    from .._schedule import Schedule

MOE_DISPATCHES = ("plan", "stride", "queue")


def is_expert_op(op: Op) -> bool:
    """An MoE layer's grouped expert op (its tasks' weights are known only after the top-k)."""
    return bool(op.attrs.get("grouped") == "experts")


def layer_capacity(graph: TaskGraph) -> dict[int | None, int]:
    """Per MoE layer, the experts a static plan provides slots for: ``min(N, T k)`` from its top-k."""
    return {op.layer: int(min(op.attrs["experts"], op.out_size * op.attrs["top_k"]))
            for op in graph.ops if op.kind == "topk"}


def stride_slots(graph: TaskGraph, j: int, grid: int) -> list[int]:
    """Per SM of the grid, the phantom slots (beyond the active experts) op ``j`` gives it.

    >>> from mksim import models
    >>> from mksim.workload import Tiling
    >>> g = TaskGraph(models.workload("qwen3-30b-a3b", batch=8), Tiling(default=132))
    >>> j = next(i for i, op in enumerate(g.ops) if op.name == "L0.experts_down")
    >>> g.ops[j].attrs["groups"], int(g.n_tiles[j]), sum(stride_slots(g, j, 132))  # 64 slots of 3 tiles, 50 active
    (50, 150, 42)
    """
    op = graph.ops[j]
    n, groups = int(graph.n_tiles[j]), op.attrs["groups"]
    per = n // groups
    cap = layer_capacity(graph).get(op.layer, groups) * per
    out = [0] * grid
    for s in range(n, max(n, cap)):
        out[s % grid] += 1
    return out


def without_experts(workload: Any, what: str) -> str | None:
    """Why ``what`` cannot be on for ``workload`` (a model without experts), else None."""
    if any(is_expert_op(op) for op in workload.ops):
        return None
    name = workload.model.name if workload.model is not None else workload.name
    return f"{what} places a mixture of experts' expert tiles; {name} has no experts"


def refuse_dense(design: BaseDesign, schedule: Schedule, what: str) -> None:
    """One line where ``design`` is on for a model without experts, or in a mode it is not for."""
    if not design.applies_to(schedule.mode):
        raise ScheduleError(f"{what} is a megakernel design; mode {schedule.mode} runs the MoE ops as its own "
                            "kernels or queues")
    why = without_experts(schedule.workload, what)
    if why is not None:
        raise ScheduleError(why)


def check_dispatch(schedule: Schedule) -> None:
    o = schedule.options
    if o.moe_dispatch not in MOE_DISPATCHES:
        raise ScheduleError(f"moe_dispatch must be one of {', '.join(MOE_DISPATCHES)}, got {o.moe_dispatch!r}")


@register_policy
class MoEStridePolicy(BasePolicy):
    """MPK's placement with a mixture of experts: every task round robin in task order (``rr``), but
    an expert op's tile ``s`` (its slot) goes to SM ``s mod grid`` (``grid``: 0, every SM)."""

    name = "moe_stride"
    baseline = {"grid": 0}

    @classmethod
    def params(cls) -> dict[str, Any]:
        return {"grid": 0}

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        grid = self.options["grid"]
        if isinstance(grid, bool) or not isinstance(grid, int) or not 0 <= grid <= n_sms:
            raise ScheduleError(f"moe_stride's grid must be a whole number of SMs from 1 to {n_sms} (0: all), "
                                f"got {grid!r}")
        grid = grid or n_sms
        q: list[list[int]] = [[] for _ in range(n_sms)]
        first, i = graph.op_first.tolist(), 0
        for j, op in enumerate(graph.ops):
            expert = is_expert_op(op)
            for s, t in enumerate(range(first[j], first[j + 1])):
                if expert:
                    q[s % grid].append(t)
                else:
                    q[i % n_sms].append(t)
                    i += 1
        return q


@register_design
class MoEStride(BaseDesign):
    """``moe_dispatch="stride"``: expert tiles by slot over a fixed grid (the ``moe_stride`` policy);
    slots beyond the active experts cost an early exit; ``design_stats["moe_stride"]`` reports each
    layer's per-SM imbalance, its top-k's serial time and which SM ran which expert."""

    name = "moe_stride"
    option = "moe_dispatch"
    value = "stride"
    compare_rows = (("megakernel:moe_stride", {"moe_dispatch": "stride"}),)
    policies = (MoEStridePolicy.name,)
    choices = MOE_DISPATCHES

    def search_options(self) -> dict[str, Any]:
        return {}  # on with its policy (suggest)

    def suggest(self, trial: Any, fixed: dict[str, Any], gpu: GPUSpec, included: bool) -> dict[str, Any]:
        # the policy is sampled before the designs: the stride policy is this design
        if included and self.option not in fixed and trial.params.get("policy") == MoEStridePolicy.name:
            return {self.option: self.value}
        return {}

    def available_for(self, workload: Any) -> str | None:
        return without_experts(workload, f"{self.option}={self.value!r}")

    def validate(self, schedule: Schedule) -> None:
        check_dispatch(schedule)
        if schedule.options.moe_dispatch == self.value:
            refuse_dense(self, schedule, "moe_dispatch='stride'")

    def placement(self, schedule: Schedule, n_sms: int, default_policy: str) -> tuple[int, str]:
        return n_sms, MoEStridePolicy.name

    def check_queues(self, schedule: Schedule) -> None:
        if schedule.policy not in (None, MoEStridePolicy.name):
            raise ScheduleError(f"moe_dispatch='stride' places expert tiles by slot: policy must be "
                                f"{MoEStridePolicy.name}, not {schedule.policy}")
