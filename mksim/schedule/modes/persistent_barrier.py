"""``persistent_barrier``: one persistent kernel, a grid barrier between ops."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mksim.errors import ScheduleError

from .._modes import PersistentMode, register_mode

if TYPE_CHECKING:
    from .._schedule import Schedule


@register_mode
class PersistentBarrier(PersistentMode):
    """One block per SM runs its queue; every task of op ``n`` waits for all of op ``n - 1`` and a
    grid barrier (``grid_barrier_us``). Queues come from ``rr`` unless told otherwise."""

    name = "persistent_barrier"
    defaults = {"tasks_per_sm": 1.0, "blocks_per_sm": 1, "prefetch_depth": 0}
    waits_for = "barrier"
    default_policy = "rr"

    def validate(self, schedule: Schedule) -> None:
        super().validate(schedule)
        op_of = schedule.graph.op_of
        for sm, q in enumerate(schedule.queues or []):
            ops = [int(op_of[t]) for t in q]
            if ops != sorted(ops):
                raise ScheduleError(f"SM {sm}: with a grid barrier per op, a queue must list ops in order")
