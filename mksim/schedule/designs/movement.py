"""Data movement per generation: the GPU's own copies, tensor-core latency and multicast."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from hwmodels import GPUSpec
from mksim.errors import ScheduleError

from .._designs import BaseDesign, register_design
from .._modes import PERSISTENT_MODES

if TYPE_CHECKING:
    from .._schedule import Options, Schedule

MOVEMENTS = ("ideal", "native")


@register_design
class NativeMovement(BaseDesign):
    """``movement="native"`` (persistent modes): the loader issues the generation's copies
    (``[chip.movement]``), tensor-core tasks end their MMA latency later, a cluster's matvecs read
    their input once, and the pages fill the shared memory unless ``prefetch_depth`` is given."""

    name = "movement"
    option = "movement"
    value = "native"
    compare_rows = (("megakernel:native", {"movement": "native"}),)
    choices = MOVEMENTS

    def applies_to(self, mode: str) -> bool:
        return mode in PERSISTENT_MODES

    def validate(self, schedule: Schedule) -> None:
        o = schedule.options
        if o.movement not in MOVEMENTS:
            raise ScheduleError(f"movement must be one of {', '.join(MOVEMENTS)}, got {o.movement!r}")
        if o.movement == "native":
            if not self.applies_to(schedule.mode):
                raise ScheduleError(f"movement='native' models the persistent modes' loader; mode {schedule.mode} "
                                    "loads in its kernels' blocks")
            why = self.available_on(schedule.gpu)
            if why is not None:
                raise ScheduleError(f"{why}; movement='native' needs it")

    def available_on(self, gpu: GPUSpec) -> str | None:
        mv = gpu.movement
        if None in (mv.async_copy_B, mv.async_copy_issue_ns, mv.mma_latency_ns):
            return f"{gpu.name} has no [chip.movement] table (async_copy_B, async_copy_issue_ns, mma_latency_ns)"
        return None

    def adjust(self, options: Options, gpu: GPUSpec, mode: str, given: set[str]) -> Options:
        if "prefetch_depth" in given:
            return options
        # a kernel of its generation fills the shared memory left beside its reserve with pages
        room = gpu.sm.shared_memory_per_block_KiB - options.smem_reserve_KiB
        return replace(options, prefetch_depth=max(0, int(room // options.page_KiB)))
