"""A megakernel that spans the GPUs of a node: how its collective ops (tensor and expert parallelism)
run inside the kernel, through the peers' memory, instead of as a library kernel between kernels.

``collective`` (an :class:`~mksim.schedule.Options` field) names the algorithm, one of
:data:`mksim.costs.COLLECTIVE_ALGORITHMS`; its time is :func:`mksim.costs.collective_us`, which the
engine asks for every run (no engine piece). Four designs:

- ``tp_boundary`` (``one_shot``, the megakernel's own): the reduction synchronises at the op boundary:
  after the producer's last tile every GPU pushes its partial into each peer and raises a flag;
- ``tp_overlap`` (``push``): each producer tile pushes its partial into the peers as it finishes
  (sharing the links with the producer's other tiles), and the reduction waits only for the last flag;
- ``tp_two_shot`` (``two_shot``): at the op boundary too, a reduce-scatter then an all-gather (two
  hops, a fraction ``2 (n-1) / n`` of the message each way instead of ``n - 1``: the larger messages
  of 8 GPUs);
- ``tp_multicast`` (``multicast``): the switch reduces and broadcasts (NVLink SHARP): a datasheet
  what-if on a GPU whose ``[interconnect]`` gives ``multicast_GBps``; never run on our machines.

A search of a tensor-parallel step (``mksim search --tp``) includes the designs that run on our
machines unasked (:meth:`~mksim.schedule.BaseDesign.implied_by`): its megakernels sample
``collective`` among ``one_shot``, ``push`` and ``two_shot``, and each has a baseline trial; the
what-if joins only when named (``--designs tp_multicast``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hwmodels import GPUSpec
from mksim.costs import COLLECTIVE_ALGORITHMS
from mksim.errors import ScheduleError
from mksim.workload import COLLECTIVE_KINDS

from .._designs import BaseDesign, register_design
from .._modes import CHAIN_MODES, PersistentMode
from .._policies import DagList

if TYPE_CHECKING:
    from .._schedule import Options, Schedule

LIBRARY = COLLECTIVE_ALGORITHMS[0]  # a library kernel between kernels: what the chain modes run


def one_gpu(workload: Any) -> str | None:
    """Why a design of collectives does not apply to ``workload`` (a step on one GPU), or None."""
    if any(op.kind in COLLECTIVE_KINDS for op in workload.ops):
        return None
    return "the step runs on one GPU (no --tp or --ep): nothing to communicate"


class _Collective(BaseDesign):
    """What the designs share: the option, its values, where they apply and how a search takes them
    (the designs a study includes make ``collective`` a sampled choice; the baselines run the
    megakernel's own, and each other design adds the default megakernel running its algorithm)."""

    option = "collective"
    choices = ("", *COLLECTIVE_ALGORITHMS)

    def available_for(self, workload: Any) -> str | None:
        return one_gpu(workload)

    def implied_by(self, step: Any) -> bool:
        return bool(step.tp > 1)  # an expert-parallel step's all-to-alls run directly whatever the choice

    def search_options(self) -> dict[str, Any]:
        return {self.option: self.value}

    def baseline_options(self, fixed: dict[str, Any]) -> dict[str, Any]:
        return {} if self.option in fixed else {self.option: PersistentMode.collective}

    def baselines(self, fixed: dict[str, Any], megakernel: dict[str, Any]) -> dict[str, dict[str, Any]]:
        if self.option in fixed or self.value == PersistentMode.collective:
            return {}
        return {self.compare_rows[0][0]: {"policy": DagList.name, **DagList.baseline, **megakernel,
                                          self.option: self.value}}


@register_design
class Boundary(_Collective):
    """``collective="one_shot"`` (the megakernel's own, also when ``collective`` is left empty): a
    one-shot all-reduce through peer memory once the producer op's last tile is done; it checks every
    schedule's ``collective``."""

    name = "tp_boundary"
    value = "one_shot"

    def on(self, options: Options) -> bool:
        return options.collective in ("", self.value)

    def validate(self, schedule: Schedule) -> None:
        c = schedule.options.collective
        if c not in self.choices:
            raise ScheduleError(f"collective must be one of {', '.join(COLLECTIVE_ALGORITHMS)}, got {c!r}")
        if not c:
            return
        if schedule.mode in CHAIN_MODES and c != LIBRARY:
            raise ScheduleError(f"collective={c!r} runs inside a megakernel; mode {schedule.mode} runs a library "
                                f"collective between its kernels ({LIBRARY!r})")
        if schedule.mode not in CHAIN_MODES and c == LIBRARY:
            raise ScheduleError(f"a megakernel cannot call {LIBRARY} inside its kernel; choose one of "
                                f"{', '.join(COLLECTIVE_ALGORITHMS[1:])}")


@register_design
class Overlap(_Collective):
    """``collective="push"``: producer tiles push their partials as they finish; the reduction waits
    only for the last flag."""

    name = "tp_overlap"
    value = "push"
    compare_rows = (("megakernel:overlap", {"collective": "push"}),)


@register_design
class TwoShot(_Collective):
    """``collective="two_shot"``: at the op boundary, a reduce-scatter then an all-gather."""

    name = "tp_two_shot"
    value = "two_shot"
    compare_rows = (("megakernel:two_shot", {"collective": "two_shot"}),)


@register_design
class Multicast(_Collective):
    """``collective="multicast"``: the switch reduces and broadcasts; a datasheet what-if, searched
    only where a study names it."""

    name = "tp_multicast"
    value = "multicast"
    compare_rows = (("megakernel:multicast", {"collective": "multicast"}),)

    def implied_by(self, step: Any) -> bool:
        return False

    def available_on(self, gpu: GPUSpec) -> str | None:
        if gpu.node is None or gpu.node.multicast_GBps is None:
            return f"{gpu.name}'s node has no switch multicast ([interconnect] multicast_GBps)"
        return None

    def validate(self, schedule: Schedule) -> None:
        why = self.available_on(schedule.gpu) if schedule.options.collective == self.value else None
        if why is not None:
            raise ScheduleError(f"{why}; collective='multicast' needs it")
