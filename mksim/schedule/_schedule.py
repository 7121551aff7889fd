"""Schedules: how a workload's tasks run on a GPU, serialisable to JSON."""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import pydantic

from hwmodels import GPUSpec
from hwmodels.files import parse_json, read_bytes
from mksim import models
from mksim.costs import Rates, rates
from mksim.errors import DeadlockError, ScheduleError, WorkloadError
from mksim.target import gpu_spec
from mksim.workload import (
    DTYPE_BYTES,
    KINDS,
    Build,
    Step,
    TaskGraph,
    Tiling,
    Workload,
    expand_kernels,
    kernels_per_op,
    rank_param_count,
)

from ._designs import active_designs, get_sync, registered_designs
from ._modes import PERSISTENT_MODES, get_mode
from ._policies import ORDERS, get_policy

FORMAT = "mksim-schedule"
VERSION = 1  # the schedule file format this code reads and writes
SCHEDULE_LIMIT_B = 256 << 20  # a schedule file holds a few MB at most (its queues); past this it is not one
# what a schedule file's workload holds besides its model: the step's fields and the build's choices
STEP_KEYS = tuple(f.name for f in fields(Step) if f.name != "model")
BUILD_KEYS = tuple(f.name for f in fields(Build))


@dataclass(frozen=True)
class Options:
    """Knobs of a schedule. Sizes carry their unit.

    - ``tasks_per_sm``: tiling granularity (tasks per SM per op) unless ``tiling`` is given;
    - ``blocks_per_sm``: resident blocks per SM in chain modes (they share the SM's bytes
      in flight);
    - ``prefetch_depth``: shared-memory pages of ``page_KiB`` the loader may fill ahead of
      the executing task (persistent modes; graph_pdl uses it for its prologue);
    - ``smem_reserve_KiB``: shared memory kept for activations and bookkeeping;
    - ``sync`` (megakernel): ``counter`` (one atomic counter per op range), ``flag`` (a flag per
      tile) or ``sentinel`` (outputs start as NaN and consumers poll the data itself);
    - ``record``: keep the HBM rate log (tests);
    - ``dispatch`` (megakernel): ``static`` (each SM runs its own queue, known when the kernel
      starts) or ``dynamic`` (MPK: scheduler warps hand each task to a worker SM when the event
      it waits for fires; see :func:`dispatch_layout`);
    - ``schedulers``: scheduler warps of dynamic dispatch (0: MPK's rule for the GPU);
    - ``prelaunch``: events of look-ahead of dynamic dispatch: with 1 (MPK's cross-operator
      pipelining) a task is handed out when its producers are, and its worker streams its weights
      while waiting on its event counter; with 0 only once its producers are done;
    - ``dies`` (megakernel): model the GPU's dies (chiplets): a dependency whose producer ran on
      another die is seen ``chip.cross_die_latency_ns`` later, and the result counts cross-die
      traffic and per-die L2 hits of activations (``SimResult.design_stats["dies"]``);
    - ``movement`` (persistent modes): ``ideal`` (weights arrive as fast as DRAM and the SM allow,
      math costs its FLOPs) or ``native``: the generation's own data movement from the GPU's
      ``[chip.movement]`` (cp.async or TMA issue, tensor-core latency, cluster multicast of shared
      activations), and a prefetch depth filling the shared memory unless given.
    - ``pdl_trigger`` (graph_pdl): where each kernel calls ``launch_dependents``: ``early`` (at its
      start: the next kernel's blocks are placed while it runs), ``late`` (after its main loop:
      once every block's work is done, in this model its end) or ``never`` (placed when it ends; PDL
      then saves only the node interval).
    - ``l2_prefetch_KiB`` (persistent modes): an L2 prefetcher per SM reads the SM's coming DRAM
      bytes into L2 up to this far ahead of what its loader has asked for (0: none); the loader
      then reads them at its share of L2 bandwidth.
    - ``moe_dispatch`` (megakernel, mixture of experts): who runs an MoE layer's expert tiles:
      ``plan`` (the placement policy's queues), ``stride`` (MPK: a fixed grid strides over the
      active-expert slots, the ``moe_stride`` policy) or ``queue`` (a route-finalize step after the
      top-k publishes the tiles to a queue the SMs drain, one atomic claim each); docs/moe.md;
    - ``moe_prefetch_MiB`` (megakernel, mixture of experts): speculative L2 prefetch, during each
      layer's attention, of this much of the experts the routing model makes likeliest (0: none).
    - ``collective`` (a step split over GPUs, ``--tp``/``--ep``): how its collective ops run, one of
      :data:`mksim.costs.COLLECTIVE_ALGORITHMS`; ``""``: the mode's own (a chain mode's ``nccl``, a
      library kernel between kernels; the megakernel's ``one_shot`` through peer memory at the op
      boundary); docs/parallel.md.
    """
    tasks_per_sm: float = 1.0
    blocks_per_sm: int = 1
    prefetch_depth: int = 4
    page_KiB: float = 32.0
    smem_reserve_KiB: float = 32.0
    sync: str = "counter"
    record: bool = False
    dispatch: str = "static"
    schedulers: int = 0
    prelaunch: int = 1
    dies: bool = False
    movement: str = "ideal"
    pdl_trigger: str = "early"
    l2_prefetch_KiB: float = 0.0
    moe_dispatch: str = "plan"
    moe_prefetch_MiB: float = 0.0
    collective: str = ""

    @property
    def prefetch_bytes(self) -> float:
        return self.prefetch_depth * self.page_KiB * 1024

    @classmethod
    def checked(cls, values: Mapping[str, Any], base: Mapping[str, Any] | None = None) -> Options:
        """``Options(**base, **values)`` after checking every name and value type: the one place where
        ``--opt``, ``--fix``, ``build_schedule(**options)`` and a schedule file's options are read.

        >>> Options.checked({"blocks_per_sm": "abc"})
        Traceback (most recent call last):
        ...
        mksim.errors.ScheduleError: schedule option blocks_per_sm must be an integer, got 'abc'
        """
        if not isinstance(values, Mapping):
            raise ScheduleError(f"schedule options must be an object of name: value, got {values!r}")
        types = {f.name: f.type for f in fields(cls)}
        for key, val in values.items():
            kind = types.get(key)
            if kind is None:
                raise ScheduleError(f"unknown schedule option {key!r}; known: {', '.join(sorted(types))}")
            _check_option(key, kind, val)
        return cls(**{**(base or {}), **values})


@dataclass
class Schedule:
    """A workload placed on a GPU in one execution mode.

    Build one with :func:`mksim.build_schedule`; ``to_json``/``from_json`` round-trip it.
    ``queues`` (persistent modes) holds one list of task ids per SM, in execution order.
    """
    mode: str
    gpu: GPUSpec
    workload: Workload
    graph: TaskGraph
    options: Options = field(default_factory=Options)
    queues: list[list[int]] | None = None
    policy: str | None = None
    policy_options: dict[str, Any] = field(default_factory=dict)
    workload_spec: dict[str, Any] = field(default_factory=dict)

    @property
    def rates(self) -> Rates:
        """The cost model's rates of ``gpu`` (:func:`mksim.costs.rates`), worked out once for the
        schedule: the placement and the engine both read them."""
        held = self.__dict__.get("_rates")
        if held is None or held[0] is not self.gpu:
            held = self.__dict__["_rates"] = (self.gpu, rates(self.gpu))
        return held[1]

    # -- checks -----------------------------------------------------------------------
    def validate(self) -> Schedule:
        """Raise :class:`ScheduleError` (or :class:`DeadlockError`) if the schedule cannot run."""
        self.validate_options()
        persistent = self.mode in PERSISTENT_MODES
        if persistent:
            self._check_queues()
        get_mode(self.mode).validate(self)
        if persistent:
            find_deadlock(self.graph, self.queues or [])
        return self

    def validate_options(self) -> None:
        """Raise :class:`ScheduleError` if the mode and options cannot go together on the GPU: the
        mode is registered, the sync too, every design accepts its options (in registration order),
        then the slots and the shared memory."""
        o = self.options
        get_mode(self.mode)
        get_sync(o.sync)
        for d in registered_designs():
            d.validate(self)
        if o.blocks_per_sm < 1 or o.blocks_per_sm > self.gpu.sm.max_blocks_per_sm_count:
            raise ScheduleError(f"blocks_per_sm must be between 1 and {self.gpu.sm.max_blocks_per_sm_count}"
                                f" on {self.gpu.name}, got {o.blocks_per_sm}")
        if o.prefetch_depth < 0 or o.page_KiB <= 0 or o.smem_reserve_KiB < 0:
            raise ScheduleError("prefetch_depth must be >= 0 and page_KiB > 0")
        if o.l2_prefetch_KiB < 0:
            raise ScheduleError(f"l2_prefetch_KiB must be >= 0, got {o.l2_prefetch_KiB:g}")
        if o.l2_prefetch_KiB > 0 and (self.mode not in PERSISTENT_MODES or o.dispatch != "static"):
            raise ScheduleError(f"l2_prefetch_KiB walks an SM's queue ahead of its loader: it needs a persistent mode "
                                f"({', '.join(PERSISTENT_MODES)}) with static queues, not {self.mode}"
                                + (f" with dispatch={o.dispatch}" if o.dispatch != "static" else ""))
        smem = self.gpu.sm.shared_memory_per_block_KiB
        need = o.prefetch_depth * o.page_KiB + o.smem_reserve_KiB
        if need > smem:
            most = int((smem - o.smem_reserve_KiB) // o.page_KiB)
            raise ScheduleError(f"shared memory over budget: {o.prefetch_depth} pages of {o.page_KiB:g} KiB + "
                                f"{o.smem_reserve_KiB:g} KiB reserved = {need:g} KiB > {smem:g} KiB per block on "
                                f"{self.gpu.name}; use prefetch_depth <= {most}")

    def mark_validated(self) -> Schedule:
        """Note that the schedule passed :meth:`validate` as it is now, so that
        :meth:`is_validated` is true and :func:`mksim.simulate` need not walk its queues for
        deadlocks again; any change to what ``validate`` reads (mode, options, GPU, graph, queues)
        makes it false."""
        self.__dict__[_VALID_AS] = self._as_validated()
        return self

    def is_validated(self) -> bool:
        """True when :meth:`mark_validated` was called and nothing ``validate`` reads changed since."""
        return bool(self.__dict__.get(_VALID_AS) == self._as_validated())

    def _as_validated(self) -> tuple:
        queues = None if self.queues is None else tuple(map(tuple, self.queues))
        return (self.mode, self.options, _Same(self.gpu), _Same(self.graph), queues)

    def _check_queues(self) -> None:
        n, n_sms = len(self.graph), self.gpu.sm.count
        if self.queues is None:
            raise ScheduleError(f"mode {self.mode} needs per-SM queues; build it with build_schedule")
        if len(self.queues) > n_sms:
            raise ScheduleError(f"{len(self.queues)} queues for {n_sms} SMs on {self.gpu.name}; "
                                "one queue per SM at most")
        placed = sum(map(len, self.queues))
        if placed and abs(placed - n) > 1 and min(map(min, filter(None, self.queues))) == 0 \
                and max(map(max, filter(None, self.queues))) == placed - 1 \
                and len({t for q in self.queues for t in q}) == placed:
            # the queues place tasks 0..placed-1 each once: whole, but for a graph of another size
            lost = f"{n - placed} never placed" if placed < n else f"{placed - n} beyond its last task"
            raise ScheduleError(f"this schedule's queues are for a different workload or tiling ({placed} tasks, the "
                                f"workload has {n}: {lost}); build it again with mksim simulate --save")
        tasks = set(chain.from_iterable(self.queues))  # every task once, checked at C speed
        if not (placed == n == len(tasks) and (not n or (min(tasks) == 0 and max(tasks) == n - 1))):
            self._name_misplaced(n)
        for d in active_designs(self.mode, self.options):
            d.check_queues(self)

    def _name_misplaced(self, n: int) -> None:
        """Raise the :class:`ScheduleError` that says which task the queues misplace."""
        where: dict[int, int] = {}
        for sm, q in enumerate(self.queues or []):
            for t in q:
                if not 0 <= t < n:
                    raise ScheduleError(f"SM {sm} lists task {t}, but the graph has tasks 0..{n - 1}")
                if t in where:
                    raise ScheduleError(f"task {self.graph.name(t)} is placed twice (SM {where[t]} and SM {sm})")
                where[t] = sm
        if len(where) != n:
            missing = next(t for t in range(n) if t not in where)
            raise ScheduleError(f"{n - len(where)} task(s) never placed, e.g. {self.graph.name(missing)}")

    # -- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        if not self.workload_spec:
            raise ScheduleError("this workload was not built from a model config (e.g. from_torch or "
                                "hand-made ops), so its schedule cannot be saved as JSON")
        t = self.graph.tiling
        return {
            "format": FORMAT, "version": VERSION, "mode": self.mode,
            "gpu": self.gpu.name if not self.gpu.path or Path(self.gpu.path).parent.name in ("data", "calibrated")
            else self.gpu.path,
            "workload": self.workload_spec,
            "tiling": {"default": t.default, "per_kind": dict(t.per_kind), "per_op": dict(t.per_op)},
            "options": asdict(self.options),
            "policy": self.policy, "policy_options": self.policy_options,
            "queues": self.queues,
        }

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), separators=(",", ":"))
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Schedule:
        """Read a schedule written by :meth:`to_json` (a JSON string or a file path)."""
        text = str(text_or_path)
        if not text.lstrip("\ufeff \t\r\n").startswith("{"):
            data: str | bytes = read_bytes(text, "", limit=SCHEDULE_LIMIT_B, error=ScheduleError,
                                                      missing="no such schedule file")
            what = f"schedule {text if len(text) <= 120 else text[:60] + '…'}"
        else:
            data, what = text, "schedule"
        d = parse_json(data, what, error=ScheduleError)
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ScheduleError(f"not a mksim schedule (expected \"format\": \"{FORMAT}\")")
        try:
            f: Any = _file_model().model_validate(d)  # its fields, checked by type
        except pydantic.ValidationError as exc:
            raise ScheduleError(_file_error(exc)) from None
        gpu = gpu_spec(f.gpu)
        wl = workload_from_spec(f.workload)
        if f.mode not in PERSISTENT_MODES:  # as build_schedule does: a stack's op of k kernels is k kernels
            wl = expand_kernels(wl, kernels_per_op(gpu.kernels.per_kind))
        tl = f.tiling
        _check_tiling_names(tl.per_kind, tl.per_op, wl)
        tiling = Tiling(default=tl.default, per_kind=tl.per_kind, per_op=tl.per_op)
        if f.policy is not None:  # a label of how the queues were made: it must name a policy and its options
            get_policy(f.policy, **f.policy_options)
            order = f.policy_options.get("order")
            if order is not None and order not in ORDERS:
                raise ScheduleError(f"schedule policy_options.order must be one of {', '.join(ORDERS)}, got "
                                    f"{order!r}")
        elif f.policy_options:
            raise ScheduleError("schedule policy_options are given without a policy; name the policy or drop them")
        opts = Options.checked(f.options)
        check_fits(wl, gpu)
        s = cls(mode=f.mode, gpu=gpu, workload=wl, graph=TaskGraph(wl, tiling), options=opts,
                queues=f.queues, policy=f.policy, policy_options=f.policy_options, workload_spec=f.workload)
        return s.validate()


def _check_tiling_names(per_kind: Mapping[str, Any], per_op: Mapping[str, Any], wl: Workload) -> None:
    """A hand-edited tiling names only op kinds mksim knows and ops the workload has: a typo in a name
    would otherwise change nothing, without a word."""
    known_kinds = sorted(set(KINDS) | {op.kind for op in wl.ops})
    for kind in per_kind:
        if kind not in known_kinds:
            raise ScheduleError(f"schedule tiling.per_kind names op kind {kind!r}, which mksim does not know; "
                                f"known: {', '.join(known_kinds)}")
    names = wl.index
    for name in per_op:
        if name not in names:
            layers = sum(1 for op in wl.ops if op.kind == "attn_partial")
            raise ScheduleError(f"schedule tiling.per_op names op {name!r}, which the workload does not have (its "
                                f"{len(names)} ops run from {wl.ops[0].name} to {wl.ops[-1].name}, layers L0 to "
                                f"L{max(layers - 1, 0)}, e.g. L0.qkv_proj)")


@functools.cache
def _file_model() -> type[pydantic.BaseModel]:
    """The model of a schedule file's fields, built on first use: building a pydantic model costs about
    0.1 s of CPU, which a process that reads no schedule file (``mksim compare``) should not pay."""

    class FileTiling(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(strict=True, extra="forbid")
        default: Any  # tile counts are checked by Tiling, which names the op
        per_kind: dict[str, Any] = {}
        per_op: dict[str, Any] = {}

    class ScheduleFile(pydantic.BaseModel):
        """The fields of a schedule file (what :meth:`Schedule.to_dict` writes), checked by type; the
        workload, tiling counts and options are then checked by their own readers."""

        model_config = pydantic.ConfigDict(strict=True, extra="forbid")
        format: Literal["mksim-schedule"]
        version: Literal[1] = 1  # VERSION
        mode: str
        gpu: str
        workload: Any
        tiling: FileTiling
        options: dict[str, Any] = {}
        policy: str | None = None
        policy_options: dict[str, Any] = {}
        queues: list[list[int]] | None = None

        @pydantic.field_validator("version", mode="before")
        @classmethod
        def _not_bool(cls, v: Any) -> Any:
            if isinstance(v, bool):  # JSON true == 1 to Python
                raise ValueError("a boolean")
            return v

        @pydantic.field_validator("policy_options", mode="before")
        @classmethod
        def _null_is_empty(cls, v: Any) -> Any:
            return {} if v is None else v

    return ScheduleFile


#: What a schedule file's field must hold, said when it does not (the first bad field is reported).
_FIELD_NEEDS = {
    "version": f"schedule format version {{got!r}} is not one this mksim reads (version {VERSION}); write it "
               "again with this mksim",
    "mode": "schedule mode must be a mode name (e.g. \"megakernel\"), got {got!r}",
    "gpu": "schedule gpu must be a GPU name or a .toml path, got {got!r}",
    "tiling": "schedule tiling must be an object with default, per_kind and per_op",
    "options": "schedule options must be an object of name: value, got {got!r}",
    "policy": "schedule policy must be a policy name or null, got {got!r}",
    "policy_options": "schedule policy_options must be an object of name: value, got {got!r}",
    "queues": "schedule queues must be lists of integer task ids, one list per SM",
}


def _file_error(exc: pydantic.ValidationError) -> str:
    err = exc.errors()[0]
    key = str(err["loc"][0]) if err["loc"] else ""
    if err["type"] == "extra_forbidden":
        where = ".".join(map(str, err["loc"]))
        model: Any = _file_model()
        known = model.model_fields["tiling"].annotation.model_fields if len(err["loc"]) > 1 else model.model_fields
        return f"schedule has unknown key {where!r}; known: {', '.join(known)}"
    if err["type"] == "missing":
        where = ".".join(map(str, err["loc"]))
        return f"schedule is missing key {where!r}"
    got = err["input"] if len(err["loc"]) == 1 else None
    return _FIELD_NEEDS.get(key, "schedule field {key} is malformed ({msg})").format(got=got, key=key,
                                                                                        msg=err["msg"])


def check_fits(workload: Workload, gpu: GPUSpec) -> None:
    """Raise :class:`WorkloadError` if a step's weights and KV cache exceed the GPU's memory
    (``memory.dram.capacity_GB``), with the sizes: such a step cannot run, and its task graph and
    simulation would only grow without end.

    >>> import mksim, hwmodels
    >>> try:
    ...     check_fits(mksim.models.workload("llama-3.2-1b", batch=100000), hwmodels.load("h200"))
    ... except WorkloadError as exc:
    ...     print(str(exc)[:75])
    the step needs 3361.2 GB (weights 2.5 GB + KV cache 3358.7 GB) but h200 has
    """
    check_node(workload, gpu)
    cap = gpu.dram.capacity_GB * 1e9
    cfg = workload.model  # tied embeddings are held once, though the step reads them twice
    step = workload.step  # split over GPUs: one GPU holds its part (mksim.workload.rank_param_count)
    tp, ep = (step.tp, step.ep) if step is not None else (1, 1)
    weights = (rank_param_count(cfg, tp, ep) * DTYPE_BYTES.get(workload.weight_dtype, 2) if cfg is not None
               else workload.weight_bytes)
    kv = workload.kv_bytes
    if weights + kv > cap:
        raise WorkloadError(f"the step needs {_gb(weights + kv)} (weights {_gb(weights)} + KV cache {_gb(kv)}) but "
                            f"{gpu.name} has {gpu.dram.capacity_GB:g} GB of memory; use a smaller --batch or --kv-len, "
                            "or a larger GPU")


def check_node(workload: Workload, gpu: GPUSpec) -> None:
    """Raise :class:`WorkloadError` if a step split over GPUs (``--tp``, ``--ep``) needs more GPUs than
    ``gpu``'s node has (``[interconnect] gpus_count``), or the GPU file has no ``[interconnect]``."""
    step = workload.step
    if step is None or step.ranks == 1:
        return
    flag = " ".join(f"--{k} {v}" for k, v in (("tp", step.tp), ("ep", step.ep)) if v > 1)
    if gpu.node is None:
        raise WorkloadError(f"{flag} splits the step over GPUs, but {gpu.name} has no [interconnect] table; "
                            "add one (docs/parallel.md) or leave the split out")
    if step.ranks > gpu.node.gpus_count:
        both = " (tp × ep)" if step.tp > 1 and step.ep > 1 else ""
        raise WorkloadError(f"{flag} needs {step.ranks} GPUs{both} but a {gpu.name} node has {gpu.node.gpus_count}; "
                            f"use at most {gpu.node.gpus_count}")


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB" if n_bytes < 1e15 else f"{n_bytes / 1e9:.3g} GB"


_VALID_AS = "_mksim_valid_as"

_TYPE_WORDS = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "a name"}


def _check_option(key: str, kind: Any, val: Any) -> None:
    kind = getattr(kind, "__name__", kind)  # a type, or its name under postponed annotations
    ok = {"int": isinstance(val, int) and not isinstance(val, bool),
          "float": isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val),
          "bool": isinstance(val, bool),
          "str": isinstance(val, str)}.get(kind, True)
    if not ok:
        raise ScheduleError(f"schedule option {key} must be {_TYPE_WORDS[kind]}, got {val!r}")


class _Same:
    """Compares equal to a wrapper of the very same object (GPUs and graphs are big)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def workload_from_spec(spec: dict[str, Any]) -> Workload:
    """Rebuild a workload from the spec stored in a schedule file."""
    if not isinstance(spec, dict) or "model" not in spec:
        raise ScheduleError("schedule workload must be an object with a 'model' (name or HF config)")
    known = ("model", *STEP_KEYS, *BUILD_KEYS)
    for key in spec:
        if key not in known:
            raise ScheduleError(f"schedule workload has unknown key {key!r}; known: {', '.join(known)}")
    model = spec["model"]
    cfg = models.config_from_hf(model) if isinstance(model, dict) else models.get(model)
    step = Step(cfg, **{k: spec[k] for k in STEP_KEYS if spec.get(k) is not None})
    # None is a missing choice (the build's default), except for n_sms, whose check refuses it
    build = {k: v for k, v in spec.items() if k in BUILD_KEYS and (v is not None or k == "n_sms")}
    return models.workload(step, **build)


def _in_task_order(graph: TaskGraph, queues: list[list[int]]) -> bool:
    """True when every queue runs its tasks in increasing id and every dependency points to an
    earlier op: then running all tasks in id order is an execution, so none can deadlock (what
    every built-in policy produces; the walk below is for everything else). A task's dependencies are
    tiles of its op's inputs, so the second holds when every op's inputs come before it."""
    lt = operator.lt
    for q in queues:
        if not all(map(lt, q, q[1:])):
            return False
    index = graph.workload.index
    return all(index[inp.op] < i for i, op in enumerate(graph.ops) for inp in op.inputs)


def find_deadlock(graph: TaskGraph, queues: list[list[int]]) -> None:
    """Run the queues abstractly (an SM runs its head task once its producers are done);
    raise :class:`DeadlockError` naming the SMs and tasks of a cycle if some SM can never
    proceed."""
    if _in_task_order(graph, queues):
        return
    n_ops = len(graph.ops)
    done_count = [0] * n_ops
    done = bytearray(len(graph))
    head = [0] * len(queues)
    sm_of = {}
    for sm, q in enumerate(queues):
        for i, t in enumerate(q):
            sm_of[t] = (sm, i)
    waiting_on: dict[int, list[int]] = {}   # producer task -> SMs whose head waits for it
    op_waiters: dict[int, list[int]] = {}   # op -> SMs whose head waits for the whole op
    ready = list(range(len(queues)))

    def blocker(t: int) -> tuple[str, int] | None:
        for p, t0, t1 in graph.deps(t):
            if t1 - t0 == graph.n_tiles[p]:
                if done_count[p] < t1 - t0:
                    return ("op", p)
            else:
                base = int(graph.op_first[p])
                for k in range(base + t0, base + t1):
                    if not done[k]:
                        return ("task", k)
        return None

    while ready:
        sm = ready.pop()
        q = queues[sm]
        while head[sm] < len(q):
            t = q[head[sm]]
            b = blocker(t)
            if b is not None:
                (op_waiters if b[0] == "op" else waiting_on).setdefault(b[1], []).append(sm)
                break
            done[t] = 1
            p = int(graph.op_of[t])
            done_count[p] += 1
            head[sm] += 1
            ready.extend(waiting_on.pop(t, ()))
            if done_count[p] == graph.n_tiles[p]:
                ready.extend(op_waiters.pop(p, ()))
    stuck = [sm for sm, q in enumerate(queues) if head[sm] < len(q)]
    if not stuck:
        return
    # follow "SM a's head waits for task x, which sits on SM b behind b's head" until a repeat
    def first_missing(t: int) -> int:
        for p, t0, t1 in graph.deps(t):
            base = int(graph.op_first[p])
            for k in range(base + t0, base + t1):
                if not done[k]:
                    return k
        raise AssertionError("stuck task has no missing producer")

    path: list[tuple[int, int, int]] = []
    seen: dict[int, int] = {}
    sm = stuck[0]
    while sm not in seen:
        seen[sm] = len(path)
        t = queues[sm][head[sm]]
        x = first_missing(t)
        path.append((sm, t, x))
        sm = sm_of[x][0]
    cycle = path[seen[sm]:]
    parts = [f"SM {a} runs {graph.name(t)}, which waits for {graph.name(x)} queued behind it on SM {sm_of[x][0]}"
             for a, t, x in cycle]
    raise DeadlockError("deadlock: " + "; ".join(parts) + "; reorder the queues so producers come first")
