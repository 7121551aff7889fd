"""Megakernel designs and syncs: the contract each keeps, and the registries the rest of mksim reads.

A **design** is a way of building a persistent kernel that one :class:`~mksim.schedule.Options`
field turns on (``option`` = ``value``): static or dynamic dispatch, dependencies across dies,
each generation's data movement, a sentinel instead of a counter. It is a :class:`BaseDesign`
registered with :func:`register_design` (one file per design in :mod:`mksim.schedule.designs`).
Its hooks are called at four moments, by four callers, and never by name: every caller iterates
the registry (:func:`registered_designs`) or the designs that are on (:func:`active_designs`).

**Building a schedule.**

- :meth:`Schedule.validate` calls :meth:`~BaseDesign.validate` of every registered design, in
  registration order, whatever the options: the design checks its option values and that the mode
  allows them (it raises :class:`~mksim.errors.ScheduleError`, one line);
- :func:`~mksim.schedule.build_schedule` calls, for the designs that are on (:meth:`~BaseDesign.on`
  and :meth:`~BaseDesign.applies_to`), in order: :meth:`~BaseDesign.adjust` (options the design
  sets unless given, before validation), :meth:`~BaseDesign.tile_sms` (the SMs each op is cut
  for), :meth:`~BaseDesign.placement` (the SMs that run tasks and the default placement policy);
- :meth:`Schedule.validate` on persistent schedules calls :meth:`~BaseDesign.check_queues` of the
  designs that are on, after the queues' coverage.

**Running it.** The engine (:mod:`mksim.sim`) cannot be imported from here (the schedule layer does
not reach the engine), so what a design changes in a run is its **engine piece**: a class in
``mksim/sim/designs/<name>.py`` registered against the design's class (``mksim/sim/_design_run.py``
says when the engine calls each of its hooks: once per run, once per SM's loader, once per task
finished, never per dependency). A design that only combines existing mechanisms (a placement,
options) has no piece. The engine asks the schedule's sync (below) when a dependency is seen.

**Searching.** ``mksim search --designs`` (:func:`design_names`) builds its space from these hooks,
so the search space names no design, no sync and no policy:

- :meth:`~BaseDesign.implied_by` (every registered design, with the study's step): whether the study
  includes the design though ``--designs`` does not name it (a step split over GPUs by ``--tp``: how
  its all-reduces run);
- ``policies`` and ``syncs``: registered placement policies and syncs the design brings; the search
  samples them only in a study that includes the design (the others always);
- :meth:`~BaseDesign.search_options` (a study that includes the design): the options every
  megakernel candidate gets, before anything is sampled — by default the design on; where the
  designs a study includes give one option different values (``collective``: ``one_shot``,
  ``push``, ...), the option is sampled among them, a parameter named after it;
- :meth:`~BaseDesign.suggest`, called for every registered design in registration order after the
  loader's parameters, with whether the study includes it: the parameters it samples (a trial's
  parameter names, their order and their choices are what make a seeded study repeatable: a hook
  must keep them);
- :meth:`~BaseDesign.settles`, with the candidate's options so far: the options it decides that
  the space would otherwise sample (dynamic dispatch waits on counters: no ``sync`` is sampled);
- :meth:`~BaseDesign.baseline_options` and :meth:`~BaseDesign.baselines` (a study that includes the
  design): what every megakernel baseline trial gets, and the baseline trials it adds. A policy or
  a sync it brings adds its own baseline (``megakernel:<name>``) without a hook.

**Comparing.** ``mksim compare --designs`` reads ``compare_rows``: the rows a design adds, each a
label and the options it builds (:func:`design_rows`); :meth:`~BaseDesign.available_on` says why a
GPU cannot take the design (its rows are left out with the reason).

How a megakernel's consumers see their producers is a **sync** (:class:`BaseSync`, registered with
:func:`register_sync`): its ``name`` is a value of ``Options.sync`` (:data:`SYNCS`). The engine
asks the schedule's sync once per run how long after a producer ends its waiting consumers wake
(:meth:`~BaseSync.visible_us`), and once per task when it may start, its last producer seen at
``t`` (:meth:`~BaseSync.ready_us`); each sync computes both from its own pure function of
:mod:`mksim.costs`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hwmodels import GPUSpec
from mksim.costs import Rates
from mksim.errors import ScheduleError
from mksim.registry import Registry

from ._modes import check_available, get_mode

if TYPE_CHECKING:
    from ._schedule import Options, Schedule


class BaseSync(ABC):
    """How a megakernel task sees that its producers are done (``Options.sync``)."""

    name: ClassVar[str] = ""

    @abstractmethod
    def ready_us(self, last_end_us: float, n_producer_tiles: int, r: Rates, polled_B: float = 0.0,
                 draw_Bpus: float = 0.0) -> float:
        """When a task may start whose last producer (of ``n_producer_tiles``) ended at
        ``last_end_us``, the task reading ``polled_B`` bytes of its producers' outputs and the chip
        drawing ``draw_Bpus`` from DRAM. Called by the engine once per task that has producers."""

    def visible_us(self, r: Rates) -> float:
        """How long after a producer ends its waiting consumers wake: :meth:`ready_us` from 0, with
        no producer tile counted, nothing polled, an idle chip. Called by the engine once per run."""
        return self.ready_us(0.0, 0, r)


class BaseDesign:
    """A megakernel design (see the module's documentation for when each hook is called)."""

    name: ClassVar[str] = ""
    option: ClassVar[str] = ""
    value: ClassVar[Any] = None
    compare_rows: ClassVar[tuple[tuple[str, dict[str, Any]], ...]] = ()
    policies: ClassVar[tuple[str, ...]] = ()  # placement policies searched only with the design
    syncs: ClassVar[tuple[str, ...]] = ()     # syncs searched only with the design
    choices: ClassVar[tuple[Any, ...]] = ()   # the values of ``option`` where they are few (a search's --fix)

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

    def available_for(self, workload: Any) -> str | None:
        """``None`` when the design can be on for ``workload`` (a :class:`~mksim.workload.Workload`);
        otherwise why not, one line (the MoE designs: a model without experts). ``mksim compare
        --designs`` leaves its rows out with the reason, ``mksim search --designs all`` leaves the design
        out, and naming it is refused."""
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

    # -- the search space (mksim.search) ---------------------------------------------------
    def implied_by(self, step: Any) -> bool:
        """Whether a search of ``step`` (a :class:`~mksim.workload.Step`) includes the design though the
        study does not name it: a choice the step cannot be planned without. False by default."""
        return False

    def search_options(self) -> dict[str, Any]:
        """The options every megakernel candidate of a search that includes the design gets (``mksim
        search --designs``; an option the study fixes wins): by default the design on."""
        return {self.option: self.value}

    def suggest(self, trial: Any, fixed: dict[str, Any], gpu: GPUSpec, included: bool) -> dict[str, Any]:
        """The options the design samples from ``trial`` (an Optuna trial) for a megakernel candidate,
        ``included`` when the study includes the design (a study may also turn it on through
        ``fixed``, which is never sampled). None by default."""
        return {}

    def settles(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options the design decides for a candidate whose options so far (fixed ones included)
        are ``options``, which the space then does not sample. None by default."""
        return {}

    def baseline_options(self, fixed: dict[str, Any]) -> dict[str, Any]:
        """Parameters every megakernel baseline trial of a study that includes the design gets."""
        return {}

    def baselines(self, fixed: dict[str, Any], megakernel: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The baseline trials the design adds to a study that includes it, by name, given the
        default megakernel's parameters ``megakernel``. None by default (a policy or a sync the
        design brings adds its own)."""
        return {}


def _check_design(d: BaseDesign) -> None:
    if not d.name or not d.option:
        raise ValueError(f"a design needs a name and an option, got {d.name!r}, {d.option!r}")


def _check_sync(s: BaseSync) -> None:
    if not s.name:
        raise ValueError("a sync needs a name")


DESIGN_REGISTRY: Registry[BaseDesign] = Registry("design", check=_check_design)
SYNC_REGISTRY: Registry[BaseSync] = Registry("sync", check=_check_sync)
D = TypeVar("D", bound=type[BaseDesign])
S = TypeVar("S", bound=type[BaseSync])


def register_design(cls: D) -> D:
    """Class decorator: register a megakernel design under ``cls.name``. Returns the class."""
    return DESIGN_REGISTRY.add(cls)


def unregister_design(name: str) -> None:
    """Remove design ``name`` from the registry (tests that register a design of their own)."""
    DESIGN_REGISTRY.remove(name)


def register_sync(cls: S) -> S:
    """Class decorator: register a sync under ``cls.name`` (a value of ``Options.sync``)."""
    return SYNC_REGISTRY.add(cls)


def get_design(name: str) -> BaseDesign:
    """The registered design ``name``; :class:`UnknownNameError` (one line) otherwise."""
    return DESIGN_REGISTRY.get(name)


def get_sync(name: str) -> BaseSync:
    """The registered sync ``name``; :class:`ScheduleError` (one line) otherwise."""
    s = SYNC_REGISTRY.get(name, None)
    if s is None:
        raise ScheduleError(f"sync must be one of {', '.join(SYNC_REGISTRY)}, got {name!r}")
    return s


def registered_designs() -> tuple[BaseDesign, ...]:
    """Every registered design, in registration order."""
    return tuple(DESIGN_REGISTRY.values())


def active_designs(mode: str, options: Options) -> tuple[BaseDesign, ...]:
    """The registered designs ``options`` turn on in ``mode``, in registration order."""
    return tuple(d for d in DESIGN_REGISTRY.values() if d.applies_to(mode) and d.on(options))


def design_names() -> tuple[str, ...]:
    """The names of the registered designs (``mksim search --designs``, ``mksim compare --designs``).

    >>> design_names()[-4:]
    ('tp_boundary', 'tp_overlap', 'tp_two_shot', 'tp_multicast')
    """
    return DESIGN_REGISTRY.names()


def design_rows(names: Sequence[str] | None = None) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """``{design: [(row label, build_schedule options), ...]}``: the rows ``mksim compare --designs``
    adds for each design (``names``: those designs, default all).

    >>> design_rows(["dies"])
    {'dies': [('megakernel:dies', {'dies': True}), ('megakernel:die', {'dies': True, 'policy': 'die'})]}
    """
    chosen = list(DESIGN_REGISTRY) if names is None else [get_design(n).name for n in names]
    return {n: [(label, dict(opts)) for label, opts in DESIGN_REGISTRY[n].compare_rows] for n in chosen}


SYNCS = SYNC_REGISTRY.view()


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


__all__ = ["BaseDesign", "BaseSync", "DESIGN_REGISTRY", "SYNCS", "SYNC_REGISTRY", "active_designs", "design_names",
           "design_rows", "get_design", "get_sync", "register_design", "register_sync", "registered_designs",
           "unregister_design", "with_defaults"]
