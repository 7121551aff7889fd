"""Dies (chiplets, Fleet): a dependency on a producer of another die is seen the crossing later."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mksim.errors import ScheduleError

from .._designs import BaseDesign, register_design

if TYPE_CHECKING:
    from .._schedule import Schedule


@register_design
class Dies(BaseDesign):
    """``dies=True``: model the GPU's dies; the result counts cross-die traffic
    (``SimResult.die_stats``); the ``die`` placement policy goes with it."""

    name = "dies"
    option = "dies"
    value = True
    compare_rows = (("megakernel:dies", {"dies": True}), ("megakernel:die", {"dies": True, "policy": "die"}))

    def validate(self, schedule: Schedule) -> None:
        o = schedule.options
        if o.dies not in (False, True):
            raise ScheduleError(f"dies must be true or false, got {o.dies!r}")
        if o.dies and not self.applies_to(schedule.mode):
            raise ScheduleError(f"dies models the megakernel's dependencies across dies; mode {schedule.mode} has "
                                "its own (grid barriers, kernel boundaries)")
