"""Dies (chiplets, Fleet): a dependency on a producer of another die is seen the crossing later.

The design's three files: this one (the design, its arithmetic and its ``die`` placement policy),
its engine piece ``mksim/sim/designs/dies.py`` (the consumers' view across dies, and the traffic the
result counts), and its knob, the ``dies`` field of :class:`~mksim.schedule.Options`. What it reads of
the GPU is in :class:`~mksim.costs.Rates` (``dies``, ``cross_die_latency_us``).
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING

from mksim.costs import Rates, task_costs
from mksim.errors import ScheduleError
from mksim.workload import TaskGraph

from .._designs import BaseDesign, register_design
from .._policies import DagList, register_policy, task_order

if TYPE_CHECKING:
    from .._schedule import Schedule


def die_of_sm(sm: int, n_sms: int, dies: int) -> int:
    """The die SM ``sm`` sits on: the SMs split into ``dies`` contiguous groups.

    >>> [die_of_sm(s, 8, 2) for s in range(8)]
    [0, 0, 0, 0, 1, 1, 1, 1]
    """
    return sm * dies // n_sms


def seen_on_die_us(end_us: float, from_die: int, on_die: int, r: Rates) -> float:
    """When the SMs of die ``on_die`` see a producer that ended at ``end_us`` on die ``from_die``
    (before the sync's own latency): ``cross_die_latency_us`` later when the dies differ.

    >>> import hwmodels
    >>> from mksim.costs import rates
    >>> r = rates(hwmodels.load("b200"))
    >>> seen_on_die_us(10.0, 0, 0, r), round(seen_on_die_us(10.0, 0, 1, r), 3)
    (10.0, 10.18)
    """
    return end_us + r.cross_die_latency_us if from_die != on_die else end_us


@register_policy
class DieAware(DagList):
    """Fleet-style placement on a GPU of several dies (chiplets): list scheduling as ``dag``, but a
    task is ready on a die only ``cross_die_latency`` after its producers on other dies, so it goes
    to the die where it can start first — its producers' die, unless another is free sooner by more
    than the crossing. On one die it is ``dag``."""

    name = "die"  # its options, search and baseline: dag's

    def place(self, graph: TaskGraph, r: Rates, n_sms: int) -> list[list[int]]:
        sync = self.options["sync_us"] if self.options["sync_us"] is not None else r.flag_latency_us
        cost = task_costs(graph, r).tolist()
        dies = max(1, min(r.dies, n_sms))
        die_sm = [[s for s in range(n_sms) if die_of_sm(s, n_sms, dies) == d] for d in range(dies)]
        heaps = [[(0.0, s) for s in sms] for sms in die_sm]
        for h in heaps:
            heapq.heapify(h)
        n_tiles, op_first = graph.n_tiles.tolist(), graph.op_first.tolist()
        finish = [0.0] * len(graph)
        die_t = [0] * len(graph)
        op_die_max = [[-math.inf] * dies for _ in graph.ops]  # latest finish of each op on each die
        q: list[list[int]] = [[] for _ in range(n_sms)]
        for t in task_order(graph, self.options["order"]):
            ready = [0.0] * dies
            for p, t0, t1 in graph.deps(t):
                if t1 - t0 == n_tiles[p]:
                    m = op_die_max[p]
                    top = max(m)
                    for d in range(dies):
                        e = max(seen_on_die_us(v, f, d, r) for f, v in enumerate(m)) if top > -math.inf else 0.0
                        if e > ready[d]:
                            ready[d] = e
                else:
                    for k in range(op_first[p] + t0, op_first[p] + t1):
                        for d in range(dies):
                            e = seen_on_die_us(finish[k], die_t[k], d, r)
                            if e > ready[d]:
                                ready[d] = e
            best = min(range(dies), key=lambda d: (max(heaps[d][0][0], ready[d] + sync), d))
            free, sm = heaps[best][0]
            f = max(free, ready[best] + sync) + cost[t]
            heapq.heapreplace(heaps[best], (f, sm))
            finish[t], die_t[t] = f, best
            p = int(graph.op_of[t])
            if f > op_die_max[p][best]:
                op_die_max[p][best] = f
            q[sm].append(t)
        return q


@register_design
class Dies(BaseDesign):
    """``dies=True``: model the GPU's dies; the result counts cross-die traffic
    (``SimResult.design_stats["dies"]``); the ``die`` placement policy goes with it."""

    name = "dies"
    option = "dies"
    value = True
    compare_rows = (("megakernel:dies", {"dies": True}), ("megakernel:die", {"dies": True, "policy": DieAware.name}))
    policies = (DieAware.name,)  # searched with the design only

    def validate(self, schedule: Schedule) -> None:
        o = schedule.options
        if o.dies not in (False, True):
            raise ScheduleError(f"dies must be true or false, got {o.dies!r}")
        if o.dies and not self.applies_to(schedule.mode):
            raise ScheduleError(f"dies models the megakernel's dependencies across dies; mode {schedule.mode} has "
                                "its own (grid barriers, kernel boundaries)")
