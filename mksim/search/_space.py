"""The search space: what a trial chooses, and how a choice becomes a :class:`Schedule`.

A :class:`Candidate` is plain data (JSON-able), so a trial's parameters, a baseline and the
best schedule all go through the same :func:`build` — a baseline is simply a candidate whose
choices are the defaults.

Megakernel choices (conditional on ``mode = megakernel``):

- ``policy``: rr, zigzag, wave, dag, pool; ``order`` (rr and dag: op by op, or by depth in the op
  graph with independent ops interleaved); ``dag_sync_scale`` (the dependency latency the dag
  policy plans with, in units of the GPU's flag latency) and ``pool_compute_fraction``;
- ``grain_<role>``: tasks per SM for each projection (qkv_proj, o_proj, gate_up_proj,
  down_proj, lm_head) and ``grain_small`` for the norms, RoPE, SiLU, reduction and embedding;
- ``kv_split_mult``: the flash-decoding split of the KV cache against its default;
- ``page_KiB`` and ``prefetch_depth``: the loader's shared-memory pages; a choice over the SM's
  shared memory is pruned with its reason. Where the GPU's implementation profile streams through a
  page ring but gives no cost per page for a kind whose bytes go through it (:func:`pages_costed`:
  ``[runtime.kernels.<kind>] page_us``, fitted to single ops at several page sizes), neither is
  searched: every candidate keeps the default ring (32 KiB pages, 4 or as many as fit), the one its
  single ops were timed with;
- ``sync``: one counter per op range, or one flag per tile;
- ``l2_prefetch_KiB``: the L2 prefetcher's lead ahead of each SM's loader (0: none; static dispatch);
- ``fuse_norm``: each RMS norm computed inside the matvec that follows it (no norm ops);
  ``fuse_rope``: RoPE and the KV-cache append in the q/k/v projection's epilogue (no RoPE ops;
  not with ``split_qkv``); ``fuse_silu``: SiLU·mul in the gate/up projection's epilogue (no
  SiLU ops; not with ``split_gate_up``);
- with ``designs`` (:data:`DESIGNS`): ``sync`` may be ``sentinel``; ``dispatch`` static or
  dynamic, and for dynamic ``schedulers`` and ``prelaunch``; dependencies across dies cost their
  crossing and ``policy`` may be ``die``; megakernels move data as their generation does;
  ``split_qkv`` / ``split_gate_up``: separate projections instead of the fused ones.

Chain choices (``mode`` = graph or graph_pdl, for comparison): ``chain_tasks_per_sm`` and
``chain_blocks_per_sm``, and at the default sizes the fused ops (``fuse_norm``, ``fuse_rope`` and
``fuse_silu`` together). They are few (20), so every
study enqueues them all at its start rather than letting the sampler choose a mode: sampled
trials are all megakernels. A chain mode the GPU lacks (graph_pdl without programmatic
dependent launch: :func:`chain_modes`) is never a candidate there.

Fixed options: a study can fix :class:`~mksim.schedule.Options` fields (``fixed``, e.g. the
shared memory a generated kernel reserves, ``{"smem_reserve_KiB": 80}``). A fixed field is
never sampled, every candidate carries it, the shared-memory check counts it, and the default
megakernel baselines keep as many of their four 32 KiB pages as still fit.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from hwmodels import GPUSpec
from mksim import costs, models
from mksim.errors import MksimError, ScheduleError, WorkloadError
from mksim.registry import Names
from mksim.schedule import (
    DESIGN_REGISTRY,
    MODE_DEFAULTS,
    MODES,
    POLICIES,
    SYNCS,
    Options,
    PersistentMode,
    active_designs,
    build_schedule,
    design_names,
    get_design,
    get_mode,
    modes_on,
)
from mksim.schedule.modes.graph_pdl import TRIGGERS
from mksim.workload import KINDS, Build, Step, Tiling, attended_tokens, rank_view, resolved_kv_splits

SPACE_VERSION = 5  # bump when a parameter is added or changes meaning: old studies cannot be resumed


def _searched(kind: str | None = None) -> Names:
    """The registered modes a search takes (``BaseMode.search_order``), in that order; ``kind``: of that kind."""
    def names() -> tuple[str, ...]:
        ms = [get_mode(n) for n in MODES]
        return tuple(m.name for m in sorted((m for m in ms if m.search_order is not None and kind in (None, m.kind)),
                                            key=lambda m: m.search_order or 0))
    return Names(names)


SEARCH_MODES = _searched()  # the megakernel, then the chain modes every study enqueues
CHAIN_MODES = _searched("chain")
ROLES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
ROLE_OF = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
           "up_proj": "gate_up_proj"}  # split projections take their fused projection's granularity
GRAIN = (0.5, 1.0, 2.0, 3.0, 4.0)
SMALL_GRAIN = (0.25, 0.5, 1.0)
KV_SPLIT_MULT = (0.5, 1.0, 2.0, 3.0, 4.0)  # 3 and 4: finer splits, cheap on the tensor-core attention
PAGES_KiB = (8, 16, 32, 64)
MAX_PREFETCH = 16  # 8 KiB pages: 16 fit beside a 44 KiB reserve
L2_PREFETCH_KiB = (0.0, 256.0, 512.0)  # the L2 prefetcher's lead per SM (0: off)


def _choices(names: Names, brought: str, designs: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``names`` (a registry's) that no registered design brings (its ``brought`` attribute:
    ``policies``, ``syncs``), then those the ``designs`` of a study bring."""
    by_designs = {n for d in DESIGN_REGISTRY.values() for n in getattr(d, brought)}
    return tuple(n for n in names if n not in by_designs) + tuple(
        n for name in designs for n in getattr(get_design(name), brought))


POLICY_CHOICES = Names(lambda: _choices(POLICIES.view(), "policies"))  # a design's own: with it only


def fixed_choices() -> dict[str, Sequence[str]]:
    """The values a fixed option may take, where they are few: the syncs, each design's option
    (``BaseDesign.choices``) and PDL's trigger."""
    out: dict[str, Sequence[str]] = {"sync": SYNCS, "pdl_trigger": TRIGGERS}
    return out | {d.option: d.choices for d in DESIGN_REGISTRY.values() if d.choices}


# Megakernel designs a study may add to the space (``designs``); without them the space is the one
# above, so that a study's seeded trials are what they always were. Each design says what it adds
# (mksim.schedule.BaseDesign's search hooks): the policies and syncs it brings, the options every
# candidate gets (search_options), what it samples (suggest) and decides (settles), its baselines.
DESIGNS = design_names()  # the designs registered when mksim.search is imported (check_designs reads it anew)
FUSE = (False, True)
CHAIN_TASKS = (1.0, 2.0, 4.0)
CHAIN_BLOCKS = (1, 2, 4)
DEFAULT_RESERVE_KiB = 32.0  # Options.smem_reserve_KiB's default
BASELINE_PAGE_KiB, BASELINE_DEPTH = 32, 4  # the megakernel baselines' loader (build_schedule's defaults)
# search parameters that set an Options field: a fixed field is not sampled
SAMPLED_OPTION = {"page_KiB": "page_KiB", "prefetch_depth": "prefetch_depth", "sync": "sync",
                  "l2_prefetch_KiB": "l2_prefetch_KiB",
                  "chain_tasks_per_sm": "tasks_per_sm", "chain_blocks_per_sm": "blocks_per_sm"}


def _megakernel() -> PersistentMode:
    mode = get_mode(SEARCH_MODES[0])
    assert isinstance(mode, PersistentMode)
    return mode


def chain_modes(gpu: GPUSpec) -> tuple[str, ...]:
    """The chain modes of :data:`CHAIN_MODES` that ``gpu`` can run (:func:`mksim.schedule.modes_on`).

    >>> import hwmodels
    >>> chain_modes(hwmodels.load("h200-datasheet")), chain_modes(hwmodels.load("l40s"))
    (('graph_pdl', 'graph'), ('graph',))
    """
    return modes_on(gpu, CHAIN_MODES)[0]


def chain_blocks(gpu: GPUSpec) -> tuple[int, ...]:
    """The blocks per SM a chain candidate may have on ``gpu``: :data:`CHAIN_BLOCKS`, or only the blocks
    the implementation profile's kernels run (``runtime.kernels.blocks_per_sm_count``; mksim's generated
    kernels: one), which is also the chain modes' default there.

    >>> import hwmodels
    >>> chain_blocks(hwmodels.load("h200-datasheet")), chain_blocks(hwmodels.load("h200"))
    ((1, 2, 4), (1,))
    """
    n = gpu.kernels.blocks_per_sm_count
    return CHAIN_BLOCKS if n is None else (int(n),)


def pages_costed(gpu: GPUSpec) -> bool:
    """Whether the model prices the loader's page size and ring depth on ``gpu``: it has no page
    ring (without an implementation profile's ``ring_copies_in_flight_count`` pages cost what their
    bytes do), or its profile gives a cost per page (``page_us``) for every kind whose bytes go
    through the pages (:func:`mksim.costs.ring_page_us`).

    >>> import hwmodels
    >>> pages_costed(hwmodels.load("h200-datasheet")), pages_costed(hwmodels.load("h200-calibrated+mksim-mm1"))
    (True, False)
    """
    if costs.ring_page_us(1.0, costs.rates(gpu)) <= 0:
        return True
    return all(c.page_us is not None for kind, c in gpu.kernels.per_kind.items()
               if kind in KINDS and KINDS[kind].pages)


def ring_fixed(gpu: GPUSpec, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """``fixed`` with the page ring every megakernel candidate keeps where the model does not price pages
    (:func:`pages_costed`): the default ring (``page_KiB`` 32 and ``prefetch_depth`` 4, or as many
    pages as fit beside the fixed ``smem_reserve_KiB``), the one the profile's single ops ran with;
    ``fixed`` itself where it does, or where it fixes both.

    >>> import hwmodels
    >>> ring_fixed(hwmodels.load("h200-calibrated+mksim-mm1"), {"smem_reserve_KiB": 137.0})
    {'smem_reserve_KiB': 137.0, 'page_KiB': 32.0, 'prefetch_depth': 2}
    >>> ring_fixed(hwmodels.load("h200-datasheet"), {"smem_reserve_KiB": 137.0})
    {'smem_reserve_KiB': 137.0}
    """
    fixed = dict(fixed or {})
    if ("page_KiB" in fixed and "prefetch_depth" in fixed) or pages_costed(gpu):
        return fixed
    page = float(fixed.get("page_KiB", BASELINE_PAGE_KiB))
    room = gpu.sm.shared_memory_per_block_KiB - fixed.get("smem_reserve_KiB", DEFAULT_RESERVE_KiB)
    return {**fixed, "page_KiB": page,
            "prefetch_depth": fixed.get("prefetch_depth", max(1, min(BASELINE_DEPTH, int(room // page))))}


def check_fixed(fixed: dict[str, Any] | None) -> dict[str, Any]:
    """``fixed`` as Options fields of the right types (sorted); one-line MksimError otherwise.

    >>> check_fixed({"smem_reserve_KiB": "80", "blocks_per_sm": 1.0})
    {'blocks_per_sm': 1, 'smem_reserve_KiB': 80.0}
    """
    types = {f.name: type(f.default) for f in fields(Options) if f.name != "record"}
    out: dict[str, Any] = {}
    for k, v in sorted((fixed or {}).items()):
        if k not in types:
            raise MksimError(f"cannot fix {k!r}: fixed options are schedule options, one of {', '.join(sorted(types))}")
        want = types[k]
        try:
            if want is str:
                val: Any = str(v)
            elif want is bool:
                val = {"true": True, "false": False, "1": True, "0": False}[str(v).lower()]
            elif want is int:
                val = int(float(v))
                if val != float(v):
                    raise ValueError
            else:
                val = float(v)
        except (TypeError, ValueError, OverflowError, KeyError):  # OverflowError: int(inf)
            need = {int: "an integer", bool: "true or false"}.get(want, "a number")
            raise MksimError(f"fixed option {k} needs {need}, got {v!r}") from None
        if isinstance(val, float) and not math.isfinite(val):
            raise MksimError(f"fixed option {k} needs a finite number, got {v!r}")
        choices = fixed_choices()
        if k in choices and val not in choices[k]:
            raise MksimError(f"fixed option {k} must be one of {', '.join(choices[k])}, got {val!r}")
        out[k] = val
    return out


def check_fixed_on(gpu: GPUSpec, fixed: dict[str, Any]) -> None:
    """Refuse, in one line naming the option, fixed values (:func:`check_fixed`'s output) that no
    candidate can run with on ``gpu``: counts below their least, more blocks than an SM holds, or a
    loader that cannot fit one page beside the reserve in a block's shared memory (a search would
    otherwise prune every megakernel and report a chain with an absurd shared memory).

    >>> import hwmodels
    >>> try:
    ...     check_fixed_on(hwmodels.load("h200-datasheet"), {"page_KiB": 1e9})
    ... except MksimError as exc:
    ...     print(str(exc).split(": ")[0], "->", str(exc).split("; ")[-1])
    --fix page_KiB=1e+09 -> give page_KiB <= 195
    """
    def text(k: str) -> str:
        v = fixed[k]
        return f"--fix {k}={v:g}" if isinstance(v, float) else f"--fix {k}={v}"

    least = {"tasks_per_sm": (0.0, False), "blocks_per_sm": (1, True), "prefetch_depth": (1, True),
             "page_KiB": (0.0, False), "smem_reserve_KiB": (0.0, True), "l2_prefetch_KiB": (0.0, True),
             "schedulers": (0, True), "prelaunch": (0, True)}
    for k, (low, inclusive) in least.items():
        if k in fixed and (fixed[k] < low or (not inclusive and fixed[k] == low)):
            raise MksimError(f"{text(k)}: {k} must be {'at least' if inclusive else 'above'} {low:g}; "
                             "give another value or drop the --fix")
    most = gpu.sm.max_blocks_per_sm_count
    if fixed.get("blocks_per_sm", 1) > most:
        raise MksimError(f"{text('blocks_per_sm')}: an SM of {gpu.name} holds at most {most} blocks; give "
                         f"blocks_per_sm <= {most}")
    budget = gpu.sm.shared_memory_per_block_KiB
    reserve = fixed.get("smem_reserve_KiB", DEFAULT_RESERVE_KiB)
    page = fixed.get("page_KiB", min(PAGES_KiB))
    depth = fixed.get("prefetch_depth", 1)
    if depth * page + reserve > budget:
        named = [k for k in ("prefetch_depth", "page_KiB", "smem_reserve_KiB") if k in fixed]
        pages = f"{depth} page{'s' if depth > 1 else ''} of {page:g} KiB"
        room = budget - reserve
        hint = (f"give smem_reserve_KiB <= {budget - depth * page:g}" if named == ["smem_reserve_KiB"] or room < 0
                else f"give page_KiB <= {room // depth:g}" if "page_KiB" in fixed
                else f"give prefetch_depth <= {max(0, room // page):g}")
        raise MksimError(f"{', '.join(text(k) for k in named)}: {pages} + {reserve:g} KiB reserved exceed the "
                         f"{budget:g} KiB of shared memory a block may use on {gpu.name}; {hint}")


def check_designs(designs: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """``designs`` as a sorted tuple of :data:`DESIGNS` (``"all"`` for every one); one line otherwise.

    >>> check_designs("dynamic,sentinel"), check_designs(None)
    (('dynamic', 'sentinel'), ())
    """
    if not designs:
        return ()
    items = [d.strip() for d in designs.split(",")] if isinstance(designs, str) else list(designs)
    known = design_names()
    if items == ["all"]:
        return tuple(sorted(known))
    for d in items:
        if d not in known:
            raise MksimError(f"unknown design {d!r}; known: {', '.join(known)} (or all)")
    return tuple(sorted(set(items)))


def implied_designs(step: Step, gpu: GPUSpec) -> tuple[str, ...]:
    """The designs a search of ``step`` on ``gpu`` includes unasked (:meth:`~mksim.schedule.BaseDesign.implied_by`:
    a tensor-parallel step's ways of running its all-reduces), those ``gpu`` can take, sorted.

    >>> import hwmodels
    >>> implied_designs(Step("llama-3.1-8b", tp=2), hwmodels.load("h200-datasheet"))
    ('tp_boundary', 'tp_overlap', 'tp_two_shot')
    >>> implied_designs(Step("llama-3.1-8b"), hwmodels.load("h200-datasheet"))
    ()
    """
    return tuple(sorted(n for n in design_names() if get_design(n).implied_by(step)
                        and get_design(n).available_on(gpu) is None))


def study_model(model: str | models.ModelConfig) -> str | models.ModelConfig:
    """The model a search takes: a built-in's name as given; a Hugging Face ``config.json`` path
    (:func:`mksim.models.is_config_path`) read into its :class:`~mksim.models.ModelConfig` (parsed as JSON,
    never executed; a bad file is one-line :class:`~mksim.errors.WorkloadError`); a config equal to a
    built-in, that built-in's name (so that its study and schedule file are the built-in's).

    >>> from mksim import models
    >>> study_model(models.get("llama-3.2-1b")), study_model("llama-3.2-1b")
    ('llama-3.2-1b', 'llama-3.2-1b')
    """
    if isinstance(model, str):
        return models.config_from_hf(model) if models.is_config_path(model) else model
    if not isinstance(model, models.ModelConfig):
        raise MksimError(f"model: give a built-in model's name, a config.json path or a ModelConfig, not a "
                         f"{type(model).__name__}")
    if model.name in models.names() and models.get(model.name) == model:
        return model.name
    return model


def model_label(model: str | models.ModelConfig) -> str:
    """What a study calls its model: a built-in's name, or a config's name (letters, digits and ``._+=@-``)
    and the first 8 hex digits of a hash of its fields, so that two different configs of one name (two
    files ``config.json``) never share a default study, and the same config always finds its own.

    >>> from dataclasses import replace
    >>> from mksim import models
    >>> cfg = replace(models.get("llama-3.2-1b"), name="org/tiny llama", num_layers=2)
    >>> model_label(cfg)[:-8], len(model_label(cfg)), model_label(replace(cfg, num_layers=3)) != model_label(cfg)
    ('org_tiny_llama-', 23, True)
    """
    if isinstance(model, str):
        return model
    digest = hashlib.sha256(json.dumps(model.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9._+=@-]', '_', model.name)[:80]}-{digest}"


@dataclass(frozen=True)
class Problem:
    """What is being scheduled: a model step on a GPU (:attr:`step`).

    >>> import hwmodels
    >>> p = Problem("llama-3.2-1b", hwmodels.load("h200-datasheet"), batch=4)
    >>> p.step.rows, p.workload(kv_split_mult=2.0).build.kv_splits
    (4, 10)
    """
    model: Any  # a built-in model's name or a ModelConfig (a study names it by :func:`model_label`)
    gpu: GPUSpec
    batch: int = 1
    kv_len: int = 1024
    phase: str = "decode"
    fixed: dict[str, Any] = field(default_factory=dict)  # Options fields every candidate keeps (check_fixed)
    designs: tuple[str, ...] = ()  # megakernel designs added to the space (check_designs)
    prefill_tokens: int = 0  # new tokens per sequence in prefill
    routing: str = "uniform"  # a mixture of experts' routing model (Step.routing)
    tp: int = 1  # the step split over GPUs (Step.tp, Step.ep)
    ep: int = 1

    @property
    def label(self) -> str:
        """The model's name in the study (:func:`model_label`)."""
        return model_label(self.model)

    @property
    def step(self) -> Step:
        """The model step scheduled."""
        return Step(self.model, batch=self.batch, kv_len=self.kv_len, phase=self.phase,
                    prefill_tokens=self.prefill_tokens, tp=self.tp, routing=self.routing, ep=self.ep)

    def workload(self, kv_split_mult: float = 1.0, fuse_norm: bool = False, split_qkv: bool = False,
                 split_gate_up: bool = False, fuse_rope: bool = False, fuse_silu: bool = False):
        """The step's workload with these choices; ``kv_split_mult`` scales the KV split the builder would
        choose (:func:`~mksim.workload.resolved_kv_splits`: windows and prefill included)."""
        step = self.step
        build = Build(fuse_norm=fuse_norm, fuse_rope=fuse_rope, fuse_silu=fuse_silu, split_qkv=split_qkv,
                      split_gate_up=split_gate_up, n_sms=self.gpu.sm.count)
        if kv_split_mult != 1.0:
            cfg = models.get(self.model) if isinstance(self.model, str) else self.model
            default = resolved_kv_splits(*rank_view(cfg, step), build)  # one GPU's heads and sequences
            build = replace(build, kv_splits=max(1, min(attended_tokens(cfg, step), round(default * kv_split_mult))))
        return models.workload(step, **asdict(build))


@dataclass(frozen=True)
class Candidate:
    """One point of the search space (defaults: ``build_schedule``'s defaults for the mode)."""
    mode: str = "megakernel"
    policy: str | None = field(default_factory=lambda: _megakernel().default_policy)
    policy_options: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    grain: dict[str, float] = field(default_factory=dict)
    small_grain: float = 1.0
    kv_split_mult: float = 1.0
    fuse_norm: bool = False
    split_qkv: bool = False
    split_gate_up: bool = False
    fuse_rope: bool = False
    fuse_silu: bool = False

    def smem_KiB(self) -> float:
        """Shared memory per SM the schedule reserves (loader pages and the fixed reserve)."""
        o = Options(**{**MODE_DEFAULTS[self.mode], **self.options})
        return o.prefetch_bytes / 1024 + o.smem_reserve_KiB

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def suggest(trial, gpu: GPUSpec, mode: str = "megakernel", fixed: dict[str, Any] | None = None,
            designs: tuple[str, ...] = ()) -> Candidate:
    """Ask ``trial`` (an Optuna trial) for one candidate of ``mode``; raises ``optuna.TrialPruned``
    with the reason when the choice cannot run (shared memory over the SM's budget).

    The sampler searches megakernels; chain candidates are few (20) and are all enqueued, so
    they never draw the sampler away from the large megakernel space. ``fixed`` Options fields
    (see :func:`check_fixed`) are not sampled and go into every candidate's options."""
    import optuna

    fx: dict[str, Any] = dict(fixed or {})

    def pick(param: str, choose):
        """A sampled option, or its fixed value (not sampled)."""
        return fx[SAMPLED_OPTION[param]] if SAMPLED_OPTION[param] in fx else choose()

    if mode != "megakernel":
        mode = trial.suggest_categorical("mode", chain_modes(gpu))
        return Candidate(mode=mode, policy=None, options={
            "tasks_per_sm": pick("chain_tasks_per_sm", lambda: trial.suggest_categorical("chain_tasks_per_sm",
                                                                                          CHAIN_TASKS)),
            "blocks_per_sm": pick("chain_blocks_per_sm", lambda: trial.suggest_categorical("chain_blocks_per_sm",
                                                                                            chain_blocks(gpu))),
            **fx}, fuse_norm=trial.suggest_categorical("fuse_norm", FUSE),
            fuse_rope=trial.suggest_categorical("fuse_rope", FUSE),
            fuse_silu=trial.suggest_categorical("fuse_silu", FUSE))
    fx = ring_fixed(gpu, fx)  # a megakernel's ring, where the model does not price pages
    policy = trial.suggest_categorical("policy", _choices(POLICIES.view(), "policies", designs))
    popts = POLICIES[policy].suggest(trial, gpu)
    grain = {role: trial.suggest_categorical(f"grain_{role}", GRAIN) for role in ROLES}
    small = trial.suggest_categorical("grain_small", SMALL_GRAIN)
    kv = trial.suggest_categorical("kv_split_mult", KV_SPLIT_MULT)
    fuse = trial.suggest_categorical("fuse_norm", FUSE)
    split_qkv = trial.suggest_categorical("split_qkv", FUSE)
    split_gu = trial.suggest_categorical("split_gate_up", FUSE)
    # an epilogue needs the fused projection: no choice with the split one
    fuse_rope = False if split_qkv else trial.suggest_categorical("fuse_rope", FUSE)
    fuse_silu = False if split_gu else trial.suggest_categorical("fuse_silu", FUSE)
    page = pick("page_KiB", lambda: trial.suggest_categorical("page_KiB", PAGES_KiB))
    depth = pick("prefetch_depth", lambda: trial.suggest_int("prefetch_depth", 1, MAX_PREFETCH))
    design_opts: dict[str, Any] = {}
    given: dict[str, list[Any]] = {}  # what each design gives every candidate (dies=True, movement="native", ...)
    for name in designs:
        for k, v in get_design(name).search_options().items():
            if k not in fx and v not in given.setdefault(k, []):
                given[k].append(v)
    for k, vs in given.items():  # designs that give one option different values (collective): a choice
        design_opts[k] = vs[0] if len(vs) == 1 else trial.suggest_categorical(k, tuple(vs))
    for d in DESIGN_REGISTRY.values():  # what the designs sample (dispatch, its schedulers, ...)
        design_opts |= d.suggest(trial, fx, gpu, d.name in designs)
    settled: dict[str, Any] = {}
    for d in DESIGN_REGISTRY.values():  # what they decide (dynamic dispatch: counters, no L2 prefetcher)
        settled |= d.settles({**fx, **design_opts})
    sync = settled["sync"] if "sync" in settled else pick("sync", lambda: trial.suggest_categorical(
        "sync", _choices(SYNCS, "syncs", designs)))
    l2 = settled["l2_prefetch_KiB"] if "l2_prefetch_KiB" in settled else pick(
        "l2_prefetch_KiB", lambda: trial.suggest_categorical("l2_prefetch_KiB", L2_PREFETCH_KiB))
    if l2:  # static queues only: an L2 prefetcher walks them ahead of the loader
        design_opts["l2_prefetch_KiB"] = float(l2)
    reserve = fx.get("smem_reserve_KiB", DEFAULT_RESERVE_KiB)
    budget = gpu.sm.shared_memory_per_block_KiB
    if depth * page + reserve > budget:
        reason = (f"{depth} pages of {page} KiB + {reserve:g} KiB reserved exceed the {budget:g} KiB of shared "
                  f"memory a block may use on {gpu.name}")
        trial.set_user_attr("pruned_reason", reason)
        raise optuna.TrialPruned(reason)
    return Candidate(mode="megakernel", policy=policy, policy_options=popts,
                     options={"prefetch_depth": depth, "page_KiB": float(page), "sync": sync, **design_opts,
                              **fx},
                     grain={r: g for r, g in grain.items() if g != 1.0}, small_grain=small, kv_split_mult=kv,
                     fuse_norm=fuse, split_qkv=split_qkv, split_gate_up=split_gu, fuse_rope=fuse_rope,
                     fuse_silu=fuse_silu)


FUSED_MEGAKERNEL = "fused:megakernel:dag"  # the enqueued trial of the default megakernel with every fusion


def baseline_params(gpu: GPUSpec, fixed: dict[str, Any] | None = None,
                    designs: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """Optuna parameters of the trials every study starts with: each policy with its defaults,
    the default megakernel with every fusion (:data:`FUSED_MEGAKERNEL`, a trial, not a baseline),
    and every chain candidate (``graph`` and ``graph_pdl`` at the defaults are the baselines) of
    the chain modes ``gpu`` can run (:func:`chain_modes`).

    With ``fixed`` options, their parameters are left out (chain candidates that become the same
    are listed once), and the megakernel baselines keep as many of their 4 pages as fit. Where the
    model does not price pages (:func:`ring_fixed`), the ring is fixed too."""
    fixed = ring_fixed(gpu, fixed)  # chain candidates have no ring parameters to leave out
    page = fixed.get("page_KiB", BASELINE_PAGE_KiB)
    room = gpu.sm.shared_memory_per_block_KiB - fixed.get("smem_reserve_KiB", DEFAULT_RESERVE_KiB)
    depth = max(1, min(BASELINE_DEPTH, int(room // page)))
    mk = {f"grain_{r}": 1.0 for r in ROLES} | {"grain_small": 1.0, "kv_split_mult": 1.0, "page_KiB": BASELINE_PAGE_KiB,
                                                "prefetch_depth": depth, "sync": Options.sync, "fuse_norm": False,
                                                "split_qkv": False, "split_gate_up": False, "fuse_rope": False,
                                                "fuse_silu": False, "l2_prefetch_KiB": 0.0}

    for name in designs:  # what every megakernel baseline gets with the design (dispatch static, ...)
        mk |= get_design(name).baseline_options(fixed)

    def unfixed(params: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if SAMPLED_OPTION.get(k) not in fixed}

    def megakernel(p: str) -> dict[str, Any]:
        """The baseline trial of policy ``p``: its own parameters, the defaults' for the rest."""
        return {"policy": p, **POLICIES[p].baseline, **mk}

    out = {f"megakernel:{p}": unfixed(megakernel(p)) for p in POLICY_CHOICES}
    default = megakernel(_megakernel().default_policy)  # the default megakernel
    for name in designs:  # the designs' own baselines (MPK's dynamic dispatch), then their policies' and syncs'
        out |= {k: unfixed(v) for k, v in get_design(name).baselines(fixed, mk).items()}
    for name in designs:
        out |= {f"megakernel:{p}": unfixed(megakernel(p)) for p in get_design(name).policies}
    if "sync" not in fixed:
        for name in designs:
            out |= {f"megakernel:{y}": unfixed({**default, "sync": y}) for y in get_design(name).syncs}
    plain = {"fuse_norm": False, "fuse_rope": False, "fuse_silu": False}
    # the default megakernel with every fusion: a search trial (not a baseline), so that the best is
    # never worse than what fusing alone gives (a model that cannot take one prunes it with its reason)
    out[FUSED_MEGAKERNEL] = unfixed({**default, **{k: True for k in plain}})
    tasks = (fixed["tasks_per_sm"],) if "tasks_per_sm" in fixed else CHAIN_TASKS
    blocks = (fixed["blocks_per_sm"],) if "blocks_per_sm" in fixed else chain_blocks(gpu)
    b_default = 2 if len(chain_blocks(gpu)) > 1 else chain_blocks(gpu)[0]  # the chain modes' default there
    for m in chain_modes(gpu):
        for t in tasks:
            for b in blocks:
                plain_default = (t == 2.0 or "tasks_per_sm" in fixed) and (b == b_default or "blocks_per_sm" in fixed)
                name = m if plain_default else f"{m}:{t:g}x{b}"
                out[name] = unfixed({"mode": m, "chain_tasks_per_sm": t, "chain_blocks_per_sm": b, **plain})
        t = fixed.get("tasks_per_sm", 2.0)
        b = fixed.get("blocks_per_sm", b_default)
        out[f"{m}:fused"] = unfixed({"mode": m, "chain_tasks_per_sm": t, "chain_blocks_per_sm": b,
                                     **{k: True for k in plain}})
    return out


def is_baseline(name: str) -> bool:
    """Baselines are the built-in defaults; the other enqueued chain candidates are search trials."""
    return name.startswith("megakernel:") or name in CHAIN_MODES


def candidate_from_params(params: dict[str, Any], gpu: GPUSpec, fixed: dict[str, Any] | None = None,
                          designs: tuple[str, ...] = ()) -> Candidate:
    """The candidate a finished trial chose, from its stored parameters (no sampling)."""
    import optuna

    trial = optuna.trial.FixedTrial(params)
    return suggest(trial, gpu, params.get("mode", "megakernel"), fixed, designs)


def build(c: Candidate, problem: Problem):
    """The :class:`Schedule` of a candidate (validated; raises ScheduleError/DeadlockError)."""
    try:  # a fusion the model cannot take (fuse_rope with q/k norms) prunes the trial, with its reason
        wl = problem.workload(c.kv_split_mult, c.fuse_norm, c.split_qkv, c.split_gate_up, c.fuse_rope, c.fuse_silu)
    except WorkloadError as exc:
        raise ScheduleError(str(exc)) from None
    n = problem.gpu.sm.count
    options = Options(**{**MODE_DEFAULTS[c.mode], **c.options})
    for d in active_designs(c.mode, options):  # grains count the SMs the designs leave (dynamic: the workers)
        n = d.tile_sms(problem.gpu, options, n)
    tiling = None
    if c.mode == "megakernel" and (c.grain or c.small_grain != 1.0):
        per_op = {op.name: max(1, round(n * c.grain[role])) for op in wl.ops if op.kind == "matmul"
                  and (role := ROLE_OF.get(op.name.rsplit(".", 1)[-1], op.name.rsplit(".", 1)[-1])) in c.grain}
        tiling = Tiling(default=max(1, round(n * c.small_grain)),
                        per_kind={"attn_partial": 0, "attn_reduce": 0, "matmul": n}, per_op=per_op)
    return build_schedule(wl, problem.gpu, c.mode, policy=c.policy, policy_options=c.policy_options or None,
                          tiling=tiling, **c.options)
