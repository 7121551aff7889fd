"""A design's engine piece: what a megakernel design changes in one run, and when the engine asks.

A design (:class:`mksim.schedule.BaseDesign`) lives in the schedule layer, which never imports the
engine; what it changes in a run is a :class:`DesignRun` subclass in ``mksim/sim/designs/<name>.py``,
registered against the design's class with :func:`runs` (so it names the design through its class,
never as a string). A design that only combines existing mechanisms has none. The engine names no
design: it makes one piece per run for each design that is on (:func:`mksim.schedule.active_designs`,
registration order) that has one, and calls its hooks

- as the run starts, before any time is computed: :meth:`~DesignRun.task_times_options`, keyword
  arguments for :func:`mksim.costs.task_times` (native movement: ``native=True``);
- in a persistent mode, once, after the engine holds its per-task lists and before any process
  starts: :meth:`~DesignRun.setup` (dynamic dispatch starts its schedulers here), then
  :meth:`~DesignRun.seen` and :meth:`~DesignRun.handover`, which hand the executors closures
  (called per dependency and per task: the hot loop pays no hook call per dependency where no
  design replaces the default); of the designs that are on, one at most may give each (the run is
  refused in one line otherwise);
- once per SM, as its loader is made: :meth:`~DesignRun.loader` (an issue cost, a cap, a gate);
- once per finished task, when the piece overrides it: :meth:`~DesignRun.finished`;
- once the run is over (every task ran): :meth:`~DesignRun.after_run` (a breakdown to adjust), and
  as the result is built: :meth:`~DesignRun.result`, what ``SimResult.design_stats`` holds under the
  design's name (``None``: nothing).

The engine keeps the state a piece reads (``eng.end``, ``eng.op_end``, ``eng.lane_of``,
``eng.op_signal``...); a piece keeps its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from mksim.registry import Registry
from mksim.schedule import BaseDesign

if TYPE_CHECKING:
    from simpy.events import Event

    from ._actors import Loader
    from ._engine import _Engine

# how a consumer on SM sm sees its producers: seen(sm) gives, once per SM, (whole op p) -> when it
# is seen there, and (tasks lo..hi-1 of one op) -> when the last is seen (before the sync's latency)
Seen = Callable[[int], tuple[Callable[[int], float], Callable[[int, int], float]]]
# tasks handed to their SM (truthy by task id), the event of a task's hand-over, and whether the
# executor still waits for the task's producers itself once it has it
Handover = tuple[Sequence[int], Callable[[int], "Event"], bool]


class DesignRun:
    """What one design changes in one run (see the module's documentation for when the engine calls
    each hook). ``design`` is the design's class; one instance per run."""

    design: ClassVar[type[BaseDesign]]

    def __init__(self, eng: _Engine):
        self.eng = eng

    def task_times_options(self) -> dict[str, Any]:
        """Keyword arguments for :func:`mksim.costs.task_times`."""
        return {}

    def setup(self) -> None:
        """Persistent modes: set up before any process starts."""

    def seen(self) -> Seen | None:
        """Persistent modes: when a consumer sees its producers, if not when they end."""
        return None

    def handover(self) -> Handover | None:
        """Persistent modes: tasks reach their SM when handed over, not from the start of its queue."""
        return None

    def loader(self, ld: Loader) -> None:
        """Persistent modes: set up SM's loader ``ld`` (made once per SM)."""

    def finished(self, t: int, p: int, lane: int, now_us: float) -> None:
        """Task ``t`` of op ``p`` ended on ``lane`` at ``now_us`` (called only where overridden)."""

    def after_run(self) -> None:
        """The run is over: adjust the engine's timeline or breakdown."""

    def result(self) -> dict[str, Any] | None:
        """What the result reports for the design (``SimResult.design_stats[name]``), or ``None``."""
        return None


RUNS: Registry[type[DesignRun]] = Registry("design's engine piece")
R = TypeVar("R", bound=type[DesignRun])


def runs(design: type[BaseDesign]) -> Callable[[R], R]:
    """Class decorator: register a :class:`DesignRun` as the engine piece of ``design`` (a class)."""
    def register(cls: R) -> R:
        cls.design = design
        RUNS.register(design.name, cls)
        return cls
    return register


def overrides(piece: DesignRun, hook: str) -> bool:
    """Whether ``piece`` has its own ``hook`` (the engine calls a per-task hook only then)."""
    return getattr(type(piece), hook) is not getattr(DesignRun, hook)


__all__ = ["RUNS", "DesignRun", "Handover", "Seen", "overrides", "runs"]
