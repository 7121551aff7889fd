"""Execution modes: the contract every mode keeps, and the registry the rest of mksim reads.

A mode is a small class registered by name with :func:`register_mode` (one file per mode in
:mod:`mksim.schedule.modes`). There are two kinds, and the engine runs each kind with its own
machinery; what differs between the modes of a kind is what the hooks below say.

Every mode (:class:`BaseMode`) has

- ``name``: what ``build_schedule``, the schedule file and the command line call it;
- ``search_order``: where ``mksim search`` takes the mode (``None``: it does not; the lowest
  first: the persistent mode it samples, then the chain modes whose candidates every study
  enqueues, in that order);
- ``collective``: how it runs a step's collective ops (``--tp``, ``--ep``) unless ``Options.collective``
  says: a chain mode a library kernel between its kernels (``nccl``), a persistent one in the kernel
  through peer memory (``one_shot``); read by the engine once per run (docs/parallel.md);
- ``defaults``: the :class:`~mksim.schedule.Options` fields it sets unlike ``Options``' own
  defaults (read by ``build_schedule`` before the caller's options are applied: ``MODE_DEFAULTS``);
- :meth:`~BaseMode.available_on`: ``None`` when the mode can run on a GPU, else the reason it
  cannot (``graph_pdl`` needs programmatic dependent launch); ``build_schedule`` and
  :meth:`~BaseMode.validate` refuse the mode there in one line, and ``mksim compare``, the search
  and the explorer leave it out with that reason as a note (:func:`modes_on`);
- :meth:`~BaseMode.fit_defaults`: called by ``build_schedule`` with the mode's defaults and the
  caller's options merged, before the designs' own defaults and validation: the options with the
  defaults fitted to the GPU (by default a ``prefetch_depth`` the caller did not give is lowered to
  the pages that fit beside the reserve in the GPU's shared memory; options that fit are kept);
- :meth:`~BaseMode.validate`: called by :meth:`Schedule.validate` after the checks common to every
  mode (option values, designs, shared memory) and, for persistent modes, after the queues are
  checked for coverage; it raises :class:`~mksim.errors.ScheduleError` for what the mode forbids
  (the base class refuses a GPU :meth:`~BaseMode.available_on` rules out: an override calls it).

A **chain** mode (:class:`ChainMode`) runs one kernel per op, in op order, each kernel's blocks
spread over ``blocks_per_sm`` slots per SM. The launcher asks, for each kernel ``k`` in turn:

1. once kernel ``k - 1`` is dispatched, and also ended if :meth:`~ChainMode.dispatch_after` says so:
   :meth:`~ChainMode.dispatch_us` — when kernel ``k``'s blocks may be placed on SMs;
2. if ``separate_release`` (PDL), once kernel ``k - 1`` has ended: :meth:`~ChainMode.release_us` —
   when the blocks' dependent part may run; until then a placed block streams at most
   :meth:`~ChainMode.prologue_B` of its bytes. Without it a kernel is released as it is dispatched.

A **persistent** mode (:class:`PersistentMode`) launches once; each SM runs its own queue of tasks
with a loader prefetching weights into shared-memory pages. ``build_schedule`` calls
:meth:`~PersistentMode.place` once to make the queues (from a placement policy, ``default_policy``
unless the caller or a design names another, on the SMs the designs leave for tasks). Before each
task the executor waits for what ``waits_for`` says: ``"barrier"`` (a grid barrier after every op,
``grid_barrier_us``) or ``"dependencies"`` (its own producers, seen as the schedule's sync says).

A new mode is one file in ``mksim/schedule/modes/`` that subclasses :class:`ChainMode` or
:class:`PersistentMode`, decorated with :func:`register_mode`; that package imports every module
in it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hwmodels import GPUSpec
from mksim.costs import Rates, host_issue_times
from mksim.errors import ScheduleError
from mksim.registry import Registry

from ._policies import BasePolicy

if TYPE_CHECKING:
    from ._schedule import Options, Schedule

KINDS = ("chain", "persistent")
WAITS = ("dependencies", "barrier")  # what a persistent mode's task may wait for (the engine runs both)


class BaseMode:
    """An execution mode (see the module's documentation for when each hook is called)."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    search_order: ClassVar[int | None] = None
    #: how the mode runs a step's collective ops (tensor and expert parallelism) unless
    #: ``Options.collective`` says: one of :data:`mksim.costs.COLLECTIVE_ALGORITHMS`, read by the engine
    collective: ClassVar[str] = "one_shot"

    def available_on(self, gpu: GPUSpec) -> str | None:
        """``None`` when the mode can run on ``gpu``; otherwise why not, as a clause that reads after
        the mode's name (``"l40s has no programmatic dependent launch (compute capability 8.9)"``)."""
        return None

    def fit_defaults(self, options: Options, gpu: GPUSpec, given: set[str]) -> Options:
        """``options`` (the mode's defaults under the caller's, ``given`` naming the caller's) fitted
        to ``gpu``: a ``prefetch_depth`` not given is lowered to the pages of ``page_KiB`` that fit
        beside ``smem_reserve_KiB`` in the shared memory of a block; what fits is left as it is."""
        depth, page, reserve = options.prefetch_depth, options.page_KiB, options.smem_reserve_KiB
        numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                      for x in (depth, page, reserve))
        if "prefetch_depth" in given or not numbers or page <= 0 or reserve < 0:
            return options  # validation says what is wrong with them
        fits = max(0, int((gpu.sm.shared_memory_per_block_KiB - reserve) // page))
        return options if depth <= fits else replace(options, prefetch_depth=fits)

    def validate(self, schedule: Schedule) -> None:
        """Raise :class:`ScheduleError` if ``schedule`` (its options, its queues) cannot run in this
        mode; the common checks have passed. The base refuses a GPU :meth:`available_on` rules out."""
        check_available(self, schedule.gpu)


class ChainMode(BaseMode, ABC):
    """A mode of one kernel per op, launched in op order."""

    kind = "chain"
    collective = "nccl"  # a library kernel (NCCL) between the chain's kernels
    waits_for_previous_end: ClassVar[bool] = True
    separate_release: ClassVar[bool] = False

    def fit_defaults(self, options: Options, gpu: GPUSpec, given: set[str]) -> Options:
        """The base's fit, and a ``blocks_per_sm`` not given set to the blocks the implementation
        profile's kernels keep on an SM (``runtime.kernels.blocks_per_sm_count``: mksim's generated
        kernels run one), where the profile says: its kernels run that way, and their task costs were
        measured that way."""
        blocks = gpu.kernels.blocks_per_sm_count
        if "blocks_per_sm" not in given and blocks is not None and blocks != options.blocks_per_sm:
            options = replace(options, blocks_per_sm=int(blocks))
        return super().fit_defaults(options, gpu, given)

    @abstractmethod
    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:
        """When kernel ``k``'s blocks may be placed: ``prev_start_us`` is when kernel ``k - 1`` was
        dispatched and ``prev_end_us`` when it ended (NaN where not known: ``k = 0``, or the mode
        does not wait for it)."""

    def host_ready_us(self, kinds: list[str], ops_of: list[str], r: Rates) -> list[float]:
        """When the host of a stack has done what kernel ``k`` waits for (where the profile gives the
        host's costs, :attr:`~mksim.costs.Rates.host_bound`; a kernel is dispatched no sooner than that
        plus ``launch_latency_us``): one CUDA graph launched a step, its first kernel after all of the
        step's host work (``host_step_us`` and every op's ``host_us``: a compiled stack's guards and
        checks of its inputs, before its graph is launched) and the graph's launch (kernels x
        ``host_graph_node_us``), the others whenever the graph runs them. ``kinds``/``ops_of``: each
        kernel's model op kind and op."""
        first = host_issue_times(kinds, ops_of, r, default_us=0.0)[-1] + len(kinds) * r.host_graph_node_us
        return [first] + [-math.inf] * (len(kinds) - 1)

    def dispatch_after(self, options: Options) -> str:
        """What of kernel ``k - 1`` the launcher waits for before asking :meth:`dispatch_us`:
        ``"start"`` (its dispatch) or ``"end"``."""
        return "end" if self.waits_for_previous_end else "start"

    def release_us(self, k: int, prev_end_us: float, r: Rates) -> float:
        """When kernel ``k``'s dependent part may run, kernel ``k - 1`` having ended at
        ``prev_end_us`` (``separate_release`` modes, ``k >= 1``)."""
        return prev_end_us

    def prologue_B(self, options: Options) -> float:
        """Bytes a block may stream before its kernel is released (``separate_release``)."""
        return 0.0


class PersistentMode(BaseMode):
    """A mode of one launch, each SM running a queue of tasks."""

    kind = "persistent"
    collective = "one_shot"  # in the kernel, through peer memory, after the op's last tile
    waits_for: ClassVar[str] = "dependencies"
    default_policy: ClassVar[str] = "dag"

    def place(self, schedule: Schedule, r: Rates, policy: BasePolicy, n_sms: int) -> list[list[int]]:
        """The queues of ``schedule``: one per SM that runs tasks (``n_sms``, fewer than the GPU's
        where a design takes SMs for itself), made by ``policy`` (the caller's, else a design's or
        the mode's ``default_policy``)."""
        return policy.place(schedule.graph, r, n_sms)


def check_available(mode: BaseMode, gpu: GPUSpec) -> None:
    """Raise :class:`ScheduleError` (one line, naming the modes the GPU has) if ``mode`` cannot run
    on ``gpu`` (:meth:`BaseMode.available_on`)."""
    reason = mode.available_on(gpu)
    if reason is not None:
        have = ", ".join(modes_on(gpu)[0])
        raise ScheduleError(f"mode {mode.name}: {reason}; modes on {gpu.name}: {have}")


def modes_on(gpu: GPUSpec, names: Sequence[str] | None = None) -> tuple[tuple[str, ...], dict[str, str]]:
    """The modes of ``names`` (default: every registered mode, in order) that ``gpu`` can run, and
    ``{mode: why not}`` for the others (:meth:`BaseMode.available_on`).

    >>> import hwmodels
    >>> modes_on(hwmodels.load("l40s"))[1]
    {'graph_pdl': 'l40s has no programmatic dependent launch (compute capability 8.9; PDL needs 9.0 or later)'}
    """
    have: list[str] = []
    absent: dict[str, str] = {}
    for name in (MODES if names is None else names):
        reason = get_mode(name).available_on(gpu)
        if reason is None:
            have.append(name)
        else:
            absent[name] = reason
    return tuple(have), absent


def _check_mode(mode: BaseMode) -> None:
    if mode.kind not in KINDS:
        raise ValueError(f"mode {mode.name!r} needs a kind in {KINDS}, got {mode.kind!r}")
    if isinstance(mode, PersistentMode) and mode.waits_for not in WAITS:
        raise ValueError(f"mode {mode.name}: waits_for must be one of {WAITS}, got {mode.waits_for!r}")


REGISTRY: Registry[BaseMode] = Registry("mode", check=_check_mode)
"""Every execution mode, by name, in registration order (:mod:`mksim.schedule.modes`)."""
M = TypeVar("M", bound=type[BaseMode])


def register_mode(cls: M) -> M:
    """Class decorator: register an execution mode under ``cls.name`` (a later one of the same name
    replaces it). Returns the class."""
    return REGISTRY.add(cls)


def unregister_mode(name: str) -> None:
    """Remove mode ``name`` from the registry (tests that register a mode of their own)."""
    REGISTRY.remove(name)


def get_mode(name: str) -> BaseMode:
    """The registered mode ``name``; :class:`UnknownNameError` (one line) otherwise."""
    return REGISTRY.get(name)


class ModeDefaults(Mapping[str, dict[str, Any]]):
    """``{mode name: its Options defaults}``, read from the registry."""

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in REGISTRY:
            raise KeyError(name)
        return dict(REGISTRY[name].defaults)

    def __iter__(self) -> Iterator[str]:
        return iter(REGISTRY)

    def __len__(self) -> int:
        return len(REGISTRY)


MODES = REGISTRY.view()
CHAIN_MODES = REGISTRY.view(lambda m: m.kind == "chain")
PERSISTENT_MODES = REGISTRY.view(lambda m: m.kind == "persistent")
MODE_DEFAULTS = ModeDefaults()

