"""Megakernel designs: the contract every design keeps, and the registries the rest of mksim reads.

A **design** is a way of building a persistent kernel that one :class:`~mksim.schedule.Options`
field turns on (``option`` = ``value``): static or dynamic dispatch, dependencies across dies,
each generation's data movement, a sentinel instead of a counter. It is a :class:`BaseDesign`
registered with :func:`register_design` (one file per design in :mod:`mksim.schedule.designs`),
and its hooks are called

- by :meth:`Schedule.validate`, for every registered design in registration order, whatever the
  options: :meth:`~BaseDesign.validate` checks the design's option values and that the mode allows
  them (it raises :class:`~mksim.errors.ScheduleError`, one line);
- by :func:`~mksim.schedule.build_schedule`, for the designs that are on (:meth:`~BaseDesign.on`),
  in order: :meth:`~BaseDesign.adjust` (options the design sets unless given, before validation),
  :meth:`~BaseDesign.tile_sms` (the SMs each op is cut for), :meth:`~BaseDesign.placement` (the
  SMs that run tasks and the default placement policy);
- by :meth:`Schedule.validate` on persistent schedules, for the designs that are on, after the
  queues' coverage: :meth:`~BaseDesign.check_queues`;
- by ``mksim compare --designs``: ``compare_rows``, the rows a design adds to the comparison, each
  a label and the options it builds (:func:`design_rows`);
- by ``mksim search --designs`` (which takes :func:`design_names`): :meth:`~BaseDesign.search_options`,
  the options every megakernel candidate gets.

What a design changes in a run the engine (:mod:`mksim.sim`) reads from the designs that are on;
a design that only combines existing mechanisms (a placement, options) needs no engine change.

How a megakernel's consumers see their producers is a **sync** (:class:`BaseSync`, registered with
:func:`register_sync`): its ``name`` is a value of ``Options.sync``, and the engine asks it when a
task whose last producer ended at ``t`` may start (:meth:`~BaseSync.ready_us`), and when a finished
producer wakes its consumers (:meth:`~BaseSync.visible_us`), both from :mod:`mksim.costs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hwmodels import GPUSpec
from mksim import costs
from mksim.costs import Rates
from mksim.errors import ScheduleError, UnknownNameError
from mksim.registry import Names

from ._modes import check_available, get_mode

if TYPE_CHECKING:
    from ._schedule import Options, Schedule


class BaseSync:
    """How a megakernel task sees that its producers are done (``Options.sync``)."""

    name: ClassVar[str] = ""

    def ready_us(self, last_end_us: float, n_producer_tiles: int, r: Rates, polled_B: float = 0.0,
                 draw_Bpus: float = 0.0) -> float:
        """When a task may start whose last producer (of ``n_producer_tiles``) ended at
        ``last_end_us``, the task reading ``polled_B`` bytes of its producers' outputs and the chip
        drawing ``draw_Bpus`` from DRAM (:func:`mksim.costs.sync_ready_us`)."""
        return costs.sync_ready_us(self.name, last_end_us, n_producer_tiles, r, polled_B, draw_Bpus)

    def visible_us(self, r: Rates) -> float:
        """How long after a producer ends its waiting consumers wake (:func:`mksim.costs.sync_us`)."""
        return costs.sync_us(self.name, 0, r)


class BaseDesign:
    """A megakernel design (see the module's documentation for when each hook is called)."""

    name: ClassVar[str] = ""
    option: ClassVar[str] = ""
    value: ClassVar[Any] = None
    compare_rows: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = ()

    def on(self, options: Options) -> bool:
        """Whether ``options`` turn the design on."""
        return bool(getattr(options, self.option) == self.value)

    def applies_to(self, mode: str) -> bool:
        """Whether the design can be on in ``mode`` (:meth:`validate` says why not)."""
        return mode == "megakernel"

    def available_on(self, gpu: GPUSpec) -> str | None:
        """``None`` when the design can be on for ``gpu``; otherwise why not (``mksim compare --designs``
        leaves its rows out with the reason; :meth:`validate` refuses it)."""
        return None

    def validate(self, schedule: Schedule) -> None:
        """Raise :class:`ScheduleError` if the design's options are bad or the mode forbids them."""

    def adjust(self, options: Options, gpu: GPUSpec, mode: str, given: set[str]) -> Options:
        """``options`` with what the design sets unless the caller gave it (``given``)."""
        return options

    def tile_sms(self, gpu: GPUSpec, options: Options, n_sms: int) -> int:
        """The SMs each op is cut for (``n_sms``: the GPU's, or an earlier design's)."""
        return n_sms

    def placement(self, schedule: Schedule, n_sms: int, default_policy: str) -> tuple[int, str]:
        """The SMs that run tasks and the placement policy used unless the caller names one."""
        return n_sms, default_policy

    def check_queues(self, schedule: Schedule) -> None:
        """Raise :class:`ScheduleError` if the queues cannot run with the design."""

    def search_options(self) -> dict[str, Any]:
        """The options every megakernel candidate of a search that includes the design gets (``mksim
        search --designs``; an option the study fixes wins): by default the design is on."""
        return {self.option: self.value}


_DESIGNS: dict[str, BaseDesign] = {}
_SYNCS: dict[str, BaseSync] = {}
D = TypeVar("D", bound=type[BaseDesign])
S = TypeVar("S", bound=type[BaseSync])


def register_design(cls: D) -> D:
    """Class decorator: register a megakernel design under ``cls.name``. Returns the class."""
    if not cls.name or not cls.option:
        raise ValueError(f"a design needs a name and an option, got {cls.name!r}, {cls.option!r}")
    _DESIGNS[cls.name] = cls()
    return cls


def unregister_design(name: str) -> None:
    """Remove design ``name`` from the registry (tests that register a design of their own)."""
    _DESIGNS.pop(name, None)


def register_sync(cls: S) -> S:
    """Class decorator: register a sync under ``cls.name`` (a value of ``Options.sync``)."""
    if not cls.name:
        raise ValueError("a sync needs a name")
    _SYNCS[cls.name] = cls()
    return cls


def get_design(name: str) -> BaseDesign:
    """The registered design ``name``; :class:`UnknownNameError` (one line) otherwise."""
    d = _DESIGNS.get(name)
    if d is None:
        raise UnknownNameError("design", name, tuple(_DESIGNS))
    return d


def get_sync(name: str) -> BaseSync:
    """The registered sync ``name``; :class:`ScheduleError` (one line) otherwise."""
    s = _SYNCS.get(name)
    if s is None:
        raise ScheduleError(f"sync must be one of {', '.join(_SYNCS)}, got {name!r}")
    return s


def registered_designs() -> tuple[BaseDesign, ...]:
    """Every registered design, in registration order."""
    return tuple(_DESIGNS.values())


def active_designs(mode: str, options: Options) -> tuple[BaseDesign, ...]:
    """The registered designs ``options`` turn on in ``mode``, in registration order."""
    return tuple(d for d in _DESIGNS.values() if d.applies_to(mode) and d.on(options))


def design_names() -> tuple[str, ...]:
    """The names of the registered designs (``mksim search --designs``, ``mksim compare --designs``).

    >>> design_names()
    ('sentinel', 'dynamic', 'dies', 'movement')
    """
    return tuple(_DESIGNS)


def design_rows(names: Sequence[str] | None = None) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """``{design: [(row label, build_schedule options), ...]}``: the rows ``mksim compare --designs``
    adds for each design (``names``: those designs, default all).

    >>> design_rows(["dies"])
    {'dies': [('megakernel:dies', {'dies': True}), ('megakernel:die', {'dies': True, 'policy': 'die'})]}
    """
    chosen = list(_DESIGNS) if names is None else [get_design(n).name for n in names]
    return {n: [(label, dict(opts)) for label, opts in _DESIGNS[n].compare_rows] for n in chosen}


SYNCS = Names(lambda: tuple(_SYNCS))


def with_defaults(options: Options, gpu: GPUSpec, mode: str, given: set[str]) -> Options:
    """``options`` after the mode has fitted its defaults to ``gpu`` (:meth:`BaseMode.fit_defaults`; a
    mode the GPU lacks is refused here, :meth:`BaseMode.available_on`) and every design that is on has
    set what it sets (:meth:`BaseDesign.adjust`)."""
    m = get_mode(mode)
    check_available(m, gpu)
    options = m.fit_defaults(options, gpu, given)
    for d in active_designs(mode, options):
        options = d.adjust(options, gpu, mode, given)
    return options


__all__ = ["BaseDesign", "BaseSync", "SYNCS", "active_designs", "design_names", "design_rows",
           "get_design", "get_sync", "register_design", "register_sync", "registered_designs", "unregister_design",
           "with_defaults"]
