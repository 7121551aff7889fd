"""Running a search: an Optuna study over :mod:`._space`, persisted in an RDB storage.

The study lives in a database (SQLite by default, PostgreSQL to spread it over machines): a run
that is killed resumes with every finished trial kept, and several processes or machines can
fill one study. ``trials`` counts finished trials (complete or pruned) of the whole study, so the
same command run again stops when the study holds that many; with several workers each stops
once the study holds that many, so it can end with up to (workers - 1) more, finished by workers
that were mid-trial.

A run that is interrupted at any moment loses nothing for good: every run enqueues the baselines
the study lacks (:func:`_enqueue_baselines`, not a flag set once), a trial left running by a
killed process is failed when the next run starts (:func:`_fail_orphaned_trials`) and its
baseline enqueued again, and a run does not stop while enqueued trials wait.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib.util
import json
import math
import multiprocessing as mp
import os
import re
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hwmodels.files import check_outputs, names_a_file
from mksim.errors import (
    DeadlockError,
    Interrupted,
    MissingExtraError,
    MksimError,
    OutputError,
    ScheduleError,
    UnknownNameError,
    check_writable,
)
from mksim.extras import require
from mksim.models import ModelConfig
from mksim.schedule import check_fits, get_design
from mksim.sim import simulate
from mksim.target import Target
from mksim.workload.routing import CountsFile, parse_routing

from ._report import write_report
from ._space import (
    FUSED_MEGAKERNEL,
    KV_SPLIT_MULT,
    SPACE_VERSION,
    Candidate,
    Problem,
    baseline_params,
    build,
    candidate_from_params,
    check_designs,
    check_fixed,
    check_fixed_on,
    implied_designs,
    is_baseline,
    model_label,
    ring_fixed,
    study_model,
    suggest,
)

OBJECTIVES = {"latency": ("latency_us", "minimize"), "smem": ("smem_KiB", "minimize")}
HEARTBEAT_S = 2
MEMORY = "memory"  # --storage memory: a one-off study in this process (nothing kept, one worker)
GRACE_S = 10
CONNECT_TIMEOUT_S = 10  # a PostgreSQL server that does not answer within this is reported, not waited on
SEED_MAX = 2**32 - 1  # numpy's (and so the samplers') largest seed
OWNERLESS_WAIT_S = 5.0  # a live process names itself on its trial within this of taking it (_fail_orphaned_trials)
PROBLEM_WAIT_S = 10.0  # a study's creator records its problem within this of creating it (_open_study)


def _optuna() -> ModuleType:
    """Optuna, imported on first use (``import mksim.search`` stays light), or a one-line MissingExtraError."""
    return require("optuna", "search", "mksim search")


def _release(storage) -> None:
    from ._storage import release  # imports optuna: not with mksim.search

    release(storage)


@dataclass
class SearchResult:
    """The outcome of :func:`search`: the best schedule, the baselines and the Pareto front."""
    study_name: str
    storage: str
    objectives: tuple[str, ...]
    best: dict[str, Any]                       # {"latency_us", "smem_KiB", "params", "candidate", "trial"}
    baselines: dict[str, dict[str, Any]]       # name -> {"latency_us", "smem_KiB"}
    pareto: list[dict[str, Any]] = field(default_factory=list)
    n_complete: int = 0
    n_pruned: int = 0
    n_failed: int = 0
    fixed: dict[str, Any] = field(default_factory=dict)
    designs: tuple[str, ...] = ()
    tp: int = 1  # the step split over GPUs (Step.tp, Step.ep)
    ep: int = 1
    shape: str = ""  # the step searched in words: ``llama-3.1-8b on h200, batch 1, KV 1024, tp 2``

    def improvement(self) -> dict[str, float]:
        """Best latency's speed-up over each baseline (baseline / best)."""
        b = self.best["latency_us"]
        return {k: v["latency_us"] / b for k, v in self.baselines.items()}

    def to_dict(self) -> dict[str, Any]:
        """``mksim search --json``: a step split over GPUs adds ``tp``/``ep``, and every schedule its
        ``communication_us`` (the collective ops' span, :attr:`mksim.sim.SimResult.communication_us`)."""
        split = {k: v for k, v in (("tp", self.tp), ("ep", self.ep)) if v > 1}
        return {"study": self.study_name, "storage": self.storage, "objectives": list(self.objectives), **split,
                "best": self.best, "baselines": self.baselines, "speedup_vs_baseline": self.improvement(),
                "pareto": self.pareto, "trials": {"complete": self.n_complete, "pruned": self.n_pruned,
                                                  "failed": self.n_failed}, "fixed": self.fixed,
                "designs": list(self.designs)}


def default_study_name(problem: Problem, objectives: tuple[str, ...]) -> str:
    """``<model>-<gpu>-b<batch>-kv<kv_len>-<objectives>`` and what else sets the problem: fixed options, the
    designs named (not those the step implies: :func:`~mksim.search.implied_designs`), the routing, the
    split over GPUs (``-tp2``, ``-ep4``), so that a study of one problem never resumes another's."""
    fixed = "".join(f"-{k}={v:g}" if isinstance(v, float) else f"-{k}={v}" for k, v in problem.fixed.items())
    named = [d for d in problem.designs if d not in implied_designs(problem.step, problem.gpu)]
    designs = f"-designs={'+'.join(named)}" if named else ""
    routing = "" if problem.routing == "uniform" else f"-routing={Path(problem.routing).name}"  # a file: its name
    split = "".join(f"-{k}{v}" for k, v in (("tp", problem.tp), ("ep", problem.ep)) if v > 1)
    return (f"{problem.label}-{problem.gpu.name}-b{problem.batch}-kv{problem.kv_len}-"
            f"{'+'.join(objectives)}{fixed}{designs}{routing}{split}")


def storage_for(url: str | None, study_name: str):
    """An RDB storage with heartbeats (so a killed worker's running trial is failed, not kept
    running); SQLite waits for the write lock instead of failing when workers share the file."""
    optuna = _optuna()
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    url = url or f"sqlite:///{study_name}.db"
    if url == MEMORY:
        return url, optuna.storages.InMemoryStorage()
    url = _with_driver(url)
    kw: dict[str, Any] = {}
    if url.startswith("sqlite"):
        kw["engine_kwargs"] = {"connect_args": {"timeout": 60}}
    elif url.startswith("postgresql"):  # a server that accepts and never answers: fail, do not hang
        kw["engine_kwargs"] = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    for attempt in range(6):
        try:
            st = optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, **kw)
            if url.startswith("sqlite"):
                from ._storage import prepare_sqlite  # imports optuna: not with mksim.search

                prepare_sqlite(st.engine)
            return url, st
        except Exception as exc:  # sqlalchemy's own errors: bad URL, server down, missing driver
            # workers that start together on a new database race to create its tables: the
            # loser's CREATE fails once the winner's exists, and a retry finds them made
            # (SQLite's alembic_version: "UNIQUE constraint failed"); two connections that switch a new
            # file to WAL at once can get SQLite's transient "locking protocol" (SQLITE_PROTOCOL)
            if any(m in str(exc) for m in ("already exists", "UniqueViolation", "duplicate key",
                                             "UNIQUE constraint failed", "locking protocol")):
                time.sleep(0.5 * (attempt + 1))
                continue
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MksimError(f"cannot open study storage {url!r}: {first}") from None
    raise MksimError(f"cannot open study storage {url!r}: its tables could not be created; try again")


def sqlite_file(url: str | None) -> str | None:
    """The database file of an SQLite storage URL (``sqlite:///v.db`` -> ``v.db``), None for any other.

    >>> sqlite_file("sqlite:////tmp/v.db"), sqlite_file("sqlite:///file:v.db?mode=ro&uri=true"), sqlite_file("memory")
    ('/tmp/v.db', 'v.db', None)
    """
    m = re.match(r"sqlite(\+\w+)?:///", url or "")
    if not m or url is None:
        return None
    path = url[m.end():].split("?", 1)[0]
    path = path[len("file:"):] if path.startswith("file:") else path
    return path if path and path != ":memory:" else None


def _gpu_file(target: Target) -> str | None:
    """The hardware file a target names (``--gpu x.toml`` or ``x.toml+mksim``), None for a GPU name."""
    return target.hardware if names_a_file(target.hardware, ".toml") else None


def _parse_objectives(text: str | tuple[str, ...]) -> tuple[str, ...]:
    objs = tuple(o.strip() for o in text.split(",")) if isinstance(text, str) else tuple(text)
    for o in objs:
        if o not in OBJECTIVES:
            raise UnknownNameError("objective", o, list(OBJECTIVES))
    if not objs or objs[0] != "latency" or len(set(objs)) != len(objs):
        raise MksimError("objectives: give 'latency' or 'latency,smem'")
    return objs


class DuplicateBaseline(Exception):
    """A baseline another trial of the study already ran or runs (two runs that started together each
    enqueued it): failed at once, so it neither runs twice nor counts as a trial."""


def _duplicate_baseline(trial) -> bool:
    name = trial.user_attrs.get("baseline")
    if not isinstance(name, str):
        return False
    TS = _optuna().trial.TrialState
    for t in trial.study.get_trials(deepcopy=False, states=(TS.COMPLETE, TS.PRUNED, TS.RUNNING)):
        if t.number != trial.number and t.user_attrs.get("baseline") == name and (
                t.state != TS.RUNNING or t.number < trial.number):
            return True
    return False


class _Objective:
    def __init__(self, problem: Problem, objectives: tuple[str, ...]):
        self.problem, self.objectives = problem, objectives

    def __call__(self, trial) -> float | tuple[float, ...]:
        optuna = _optuna()
        from ._storage import flush  # imports optuna: not with mksim.search

        # first, so that a run after a kill can tell this trial's process is gone (_fail_orphaned_trials)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        flush(trial)  # now, not with the trial's other writes
        if _duplicate_baseline(trial):
            raise DuplicateBaseline(trial.user_attrs["baseline"])
        cand = suggest(trial, self.problem.gpu, trial.user_attrs.get("mode", "megakernel"), self.problem.fixed,
                       self.problem.designs)
        flush(trial)  # its parameters, for the other processes' samplers while it runs
        try:
            latency_us, hbm_util, communication_us = _simulated(cand, self.problem)
        except (ScheduleError, DeadlockError) as exc:
            trial.set_user_attr("pruned_reason", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        vals = {"latency_us": latency_us, "smem_KiB": cand.smem_KiB()}
        trial.set_user_attr("latency_us", latency_us)
        trial.set_user_attr("smem_KiB", vals["smem_KiB"])
        trial.set_user_attr("hbm_util", hbm_util)
        if communication_us is not None:  # a step split over GPUs: its collective ops' span
            trial.set_user_attr("communication_us", communication_us)
        out = tuple(vals[OBJECTIVES[o][0]] for o in self.objectives)
        return out[0] if len(out) == 1 else out


# The candidates this process has simulated for :func:`fused_kv_split` (one problem's, the last): the fused
# trial is one of them, and its trial takes the numbers from here instead of simulating it again.
_SIMULATED: dict[str, Any] = {"problem": None, "results": {}}


def _simulated(cand: Candidate, problem: Problem, remember: bool = False) -> tuple[float, float, float | None]:
    """``cand``'s predicted latency (µs), HBM utilisation and communication (µs, None on one GPU) on
    ``problem`` (raises ScheduleError or DeadlockError); ``remember`` keeps them for a later call with the
    same candidate and problem."""
    key = repr(cand)
    if _SIMULATED["problem"] is problem and key in _SIMULATED["results"]:
        return _SIMULATED["results"][key]
    res = simulate(build(cand, problem), timeline=False)  # a trial needs the numbers only
    if remember:
        if _SIMULATED["problem"] is not problem:
            _SIMULATED.update(problem=problem, results={})
        _SIMULATED["results"][key] = (res.latency_us, res.hbm_util, res.communication_us)
    return res.latency_us, res.hbm_util, res.communication_us


def _counted(study) -> int:
    """The study's finished trials (complete or pruned), what ``trials`` counts."""
    from ._storage import count_trials  # imports optuna: not with mksim.search

    TS = _optuna().trial.TrialState
    return count_trials(study, (TS.COMPLETE, TS.PRUNED))


def _waiting(study) -> int:
    """The study's enqueued trials that no process has taken yet."""
    from ._storage import count_trials

    return count_trials(study, (_optuna().trial.TrialState.WAITING,))


def _with_driver(url: str) -> str:
    """``url`` with a PostgreSQL driver that is installed: SQLAlchemy 2 reads a bare ``postgresql://`` as
    psycopg (3), while ``mksim[search]`` installs psycopg2."""
    if not url.startswith("postgresql://"):
        return url
    if importlib.util.find_spec("psycopg") is None:
        if importlib.util.find_spec("psycopg2") is None:
            raise MissingExtraError(f"cannot open study storage {url!r}: no PostgreSQL driver is installed; "
                                    "pip install 'mksim[search]' (psycopg2) and give postgresql+psycopg2://")
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def _root_cause(exc: BaseException) -> str:
    """The innermost message of an exception chain (optuna wraps SQLAlchemy, which wraps the driver)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _open_study(problem: Problem, objectives: tuple[str, ...], storage, study_name: str, seed: int):
    try:
        return _open_study_unchecked(problem, objectives, storage, study_name, seed)
    except MksimError:
        raise
    except Exception as exc:  # optuna's StorageInternalError hides the cause (a read-only database)
        if type(exc).__module__.split(".")[0] not in ("optuna", "sqlalchemy"):
            raise
        cause = _root_cause(exc)
        hint = ("the database file or its folder is read-only: copy it somewhere writable or give another "
                "--storage" if "readonly" in cause or "read-only" in cause else "check the storage and try again")
        raise MksimError(f"cannot use study {study_name!r} in its storage: {cause}; {hint}") from None


def _open_study_unchecked(problem: Problem, objectives: tuple[str, ...], storage, study_name: str, seed: int):
    optuna = _optuna()
    # errors only: a trial failed by a second Ctrl-C is logged by optuna as a warning with a traceback, and
    # the interrupted run already says what happened in one line
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    directions = [OBJECTIVES[o][1] for o in objectives]
    sampler = (optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
               if len(objectives) == 1 else optuna.samplers.NSGAIISampler(seed=seed))
    from ._storage import batched  # imports optuna: not with mksim.search

    storage = batched(storage)  # one transaction per trial's writes, not one per write
    try:  # the one process that creates the study records its problem; the others read it
        study = optuna.create_study(study_name=study_name, storage=storage, directions=directions, sampler=sampler)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
        created = False
    want: dict[str, Any] = {"model": problem.label, "gpu": problem.gpu.name, "batch": problem.batch,
                            "kv_len": problem.kv_len, "phase": problem.phase, "objectives": list(objectives),
                            "space": SPACE_VERSION}
    if not isinstance(problem.model, str):  # a config: its fields, which rebuild the study's schedules
        want["config"] = json.loads(json.dumps(problem.model.to_dict()))  # as stored: tuples are lists
    if problem.fixed:  # recorded only when given: studies made before fixed options still resume
        want["fixed"] = dict(problem.fixed)
    ring = {k: v for k, v in ring_fixed(problem.gpu, problem.fixed).items() if k not in problem.fixed}
    if ring:  # the megakernels' ring, where the model does not price pages: likewise
        want["ring"] = ring
    if problem.designs:  # likewise
        want["designs"] = list(problem.designs)
    if problem.routing != "uniform":  # likewise: the study's expert counts are the routing's
        want["routing"] = routing_record(problem.routing)
    for k in ("tp", "ep"):  # likewise: a step split over GPUs is another problem
        if getattr(problem, k) > 1:
            want[k] = getattr(problem, k)
    have = None if created else _recorded_problem(study)
    if have is None:
        # The creator writes it; another process only when the creator died before it could. Read back:
        # optuna ignores a second insert of one key, so of two that both take over, the one that finds
        # another problem stops here, before it adds anything to the study.
        study.set_user_attr("problem", want)
        have = study.user_attrs.get("problem", want)
    if have.get("space") != SPACE_VERSION:
        raise MksimError(f"study {study_name!r} in this storage was made with another version of the search space "
                         f"({have.get('space', 1)}, this mksim has {SPACE_VERSION}); pick another --study name or "
                         "--storage")
    elif have.get("fixed", {}) != want.get("fixed", {}):
        def text(f: dict) -> str:
            return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.items()) or "none"

        raise MksimError(f"study {study_name!r} in this storage was made with fixed options "
                         f"{text(have.get('fixed', {}))}, not {text(want.get('fixed', {}))}; pick another --study "
                         "name or --storage")
    elif have.get("designs", []) != want.get("designs", []):
        raise MksimError(f"study {study_name!r} in this storage was made with designs "
                         f"{', '.join(have.get('designs', [])) or 'none'}, not "
                         f"{', '.join(want.get('designs', [])) or 'none'}; pick another --study name or --storage")
    elif have != want:
        raise MksimError(f"study {study_name!r} in this storage searches {_problem_text(have)}, not "
                         f"{_problem_text(want)}; pick another --study name")
    if study.metric_names is None:  # optuna-dashboard and the plots show these names
        study.set_metric_names([OBJECTIVES[o][0] for o in objectives])
    return study


def routing_record(spec: str) -> str:
    """How a study records its routing model: a named one as given (``zipf:1.2``), a file of counts by its
    name and a hash of the counts it holds, so that a study resumes with the same counts wherever the file
    lies and refuses other counts under the same name.

    >>> routing_record("zipf:1.2")
    'zipf:1.2'
    """
    model = parse_routing(spec)
    if isinstance(model, CountsFile):
        digest = hashlib.sha256(json.dumps(model.counts).encode()).hexdigest()[:8]
        return f"file {Path(spec).name} ({digest})"
    return model.spec


def _recorded_problem(study) -> dict[str, Any] | None:
    """The problem a study's creator recorded; waits a little for a creator that is recording it right
    now (another process that started at the same moment). None if it never comes: the creator was
    killed before it wrote anything, and this process takes the study over."""
    deadline = time.monotonic() + PROBLEM_WAIT_S
    while True:
        have = study.user_attrs.get("problem")
        if have is not None or time.monotonic() > deadline:
            return have if isinstance(have, dict) or have is None else {"problem": have}
        time.sleep(0.05)


def _problem_text(p: dict[str, Any]) -> str:
    """A study's problem in words: ``llama-3.2-1b on h200, batch 1, KV 1024, latency`` and what differs."""
    words = (f"{p.get('model')} on {p.get('gpu')}, batch {p.get('batch')}, KV {p.get('kv_len')}, "
             f"{'+'.join(p.get('objectives') or [])}")
    rest = {k: v for k, v in p.items()  # a config's fields: its name in ``model`` has their hash
            if k not in ("model", "gpu", "batch", "kv_len", "objectives", "space", "config")}
    return words + "".join(f", {k} {v}" for k, v in rest.items())


def fused_kv_split(problem: Problem, params: dict[str, Any]) -> dict[str, Any]:
    """The fused trial's parameters (:data:`FUSED_MEGAKERNEL`) at the KV split of
    :data:`KV_SPLIT_MULT` the model predicts fastest (the first where none builds): a sampler rarely
    meets the default megakernel with every fusion at a split other than the default, and the split
    moves the step by 3 % on an H200 (docs/validation-log.md). Unchanged where the split is fixed."""
    if "kv_split_mult" not in params:
        return params
    optuna = _optuna()
    best, best_us = params, math.inf
    for m in KV_SPLIT_MULT:
        p = {**params, "kv_split_mult": m}
        try:
            cand = suggest(optuna.trial.FixedTrial(p), problem.gpu, "megakernel", problem.fixed, problem.designs)
            us = _simulated(cand, problem, remember=True)[0]
        except (ScheduleError, DeadlockError, optuna.TrialPruned):
            continue
        if us < best_us:
            best, best_us = p, us
    return best


def _held_baselines(study) -> set[str]:
    """Names of the enqueued trials (:func:`baseline_params`) the study holds waiting, running or
    finished; a failed one (its process was killed) is not held."""
    TS = _optuna().trial.TrialState
    trials = study.get_trials(deepcopy=False, states=(TS.WAITING, TS.RUNNING, TS.COMPLETE, TS.PRUNED))
    return {b for t in trials if isinstance(b := t.user_attrs.get("baseline"), str)}


def _enqueue_baselines(study, problem: Problem) -> list[str]:
    """Enqueue the trials every study starts with (the baselines, so that the best can never be worse
    than them, and the fused trial at the KV split the model prefers: :func:`fused_kv_split`) that the
    study does not hold (:func:`_held_baselines`); returns their names.

    Every run does this, not only the first: a run killed while enqueueing, or while a baseline ran,
    leaves the study without some, and the next run puts them back. The fused trial's split is found
    before the first enqueue, so the enqueues follow each other closely; a name is looked up again
    just before it is enqueued, so that two runs starting together rarely enqueue one twice (and if
    they do, it is run twice: nothing is lost)."""
    held = _held_baselines(study)
    todo = {name: params for name, params in baseline_params(problem.gpu, problem.fixed, problem.designs).items()
            if name not in held}
    if FUSED_MEGAKERNEL in todo:
        todo[FUSED_MEGAKERNEL] = fused_kv_split(problem, todo[FUSED_MEGAKERNEL])
    done = []
    for i, (name, params) in enumerate(todo.items()):
        if i and name in _held_baselines(study):
            continue
        study.enqueue_trial(params, user_attrs={"baseline": name, "mode": params.get("mode", "megakernel")})
        done.append(name)
    return done


def _await_baselines(study, timeout_s: float = 60.0) -> None:
    """Wait for the baselines that other processes are running on this study (two runs that started
    together share them out), so that the report compares the best with every baseline. One whose process
    has exited is failed (:func:`_fail_orphaned_trials`) and run by the next run; after ``timeout_s``
    the report goes without the rest."""
    TS = _optuna().trial.TrialState
    start = time.monotonic()
    looked_at_ownerless = False
    while True:
        _fail_orphaned_trials(study, wait=False)
        running = [t for t in study.get_trials(deepcopy=False, states=(TS.RUNNING,)) if "baseline" in t.user_attrs]
        if not running or time.monotonic() > start + timeout_s:
            return
        if not looked_at_ownerless and time.monotonic() > start + OWNERLESS_WAIT_S:  # one taken by a process
            _fail_orphaned_trials(study)  # that died before it named itself
            looked_at_ownerless = True
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[:1] not in ([b"Z"], [b"X"])
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): ask the kernel
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _fail_orphaned_trials(study, wait: bool = True) -> list[int]:
    """Fail the study's running trials whose process is gone, and return their numbers: a process
    killed mid-trial (SIGKILL, a power cut) leaves its trial running, and optuna fails such a trial only
    when its heartbeat is ``GRACE_S`` old, so a run started sooner would keep it running for good and
    never run the baseline it held. A trial names its process first thing (``worker``,
    ``host:pid``); one of this machine whose process has exited is failed at once. One that names no
    process yet was just taken (its process names it within milliseconds) or its process died before
    it could: it is looked at again ``OWNERLESS_WAIT_S`` later (not with ``wait`` false). Trials of
    other machines are left to the heartbeat."""
    TS = _optuna().trial.TrialState
    host = socket.gethostname()

    def gone(t) -> bool | None:
        """True: its process has exited; False: it runs, or is on another machine; None: not named yet."""
        w = t.user_attrs.get("worker")
        if not isinstance(w, str):
            return None
        h, _, pid = w.rpartition(":")
        return h == host and pid.isdigit() and not _alive(int(pid))

    failed: list[int] = []

    def fail(t) -> None:
        try:
            if study._storage.set_trial_state_values(t._trial_id, state=TS.FAIL):
                failed.append(t.number)
        except Exception as exc:  # another process finished or failed it meanwhile
            if type(exc).__name__ != "UpdateFinishedTrialError":
                raise

    ownerless = []
    for t in study.get_trials(deepcopy=False, states=(TS.RUNNING,)):
        verdict = gone(t)
        if verdict:
            fail(t)
        elif verdict is None:
            ownerless.append(t.number)
    if ownerless and wait:
        time.sleep(OWNERLESS_WAIT_S)
        for t in study.get_trials(deepcopy=False, states=(TS.RUNNING,)):
            if t.number in ownerless and gone(t) in (None, True):
                fail(t)
    return failed


@contextmanager
def _sigint_noted(also_term: bool = False) -> Iterator[list[int]]:
    """Inside, Ctrl-C (SIGINT) is noted in the yielded list instead of raising KeyboardInterrupt in the
    middle of a trial, which optuna logs with a traceback and records as a failed trial; the caller stops
    after the current trial. A second Ctrl-C interrupts at once. Only the main thread takes signals: in
    another thread, or where SIGINT is ignored, this changes nothing. ``also_term`` (a worker process)
    notes SIGTERM too, which a worker gets when its parent dies (:func:`_die_with_parent`)."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    olds: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM) if also_term else (signal.SIGINT,):
        old = signal.getsignal(sig)
        if old is not signal.SIG_IGN:
            olds[sig] = old if old is not None else signal.SIG_DFL

    def note(signum: int, frame: Any) -> None:
        got.append(signum)
        signal.signal(signum, olds[signum])

    for signum in olds:
        signal.signal(signum, note)
    try:
        yield got
    finally:
        for signum, old in olds.items():
            signal.signal(signum, old)


def _interrupted(url: str) -> Interrupted:
    if url == MEMORY:
        return Interrupted("interrupted; --storage memory keeps nothing")
    return Interrupted(f"interrupted; the study in {url} keeps every finished trial: run the same command "
                       "again to resume")


def _die_with_parent(parent: int) -> None:
    """Have the kernel send this worker SIGTERM when its parent dies (Linux), so that a search whose
    parent is killed does not go on filling the study; elsewhere the worker checks between trials."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the line above
        sys.exit(130)


def _work_in_child(parent: int, *args: Any) -> None:
    """A worker process: Ctrl-C, SIGTERM or its parent's death ends it after its trial, with status 130
    and no traceback; the parent reports it."""
    _die_with_parent(parent)
    try:
        _work(*args, parent=parent)  # type: ignore[misc]  # args end before ``storage``
    except Interrupted:
        sys.exit(130)


def _work(problem: Problem, objectives, url: str, study_name: str, seed: int, trials: int,
          timeout: float | None, progress: bool, storage=None, parent: int | None = None) -> None:
    """One worker: run trials until the study holds ``trials`` finished ones and no enqueued trial
    waits (or time runs out). ``storage`` is given for the in-memory storage, which a URL cannot
    reopen; ``parent``, in a worker process, is the pid of the search that started it."""
    optuna = _optuna()
    try:
        if storage is None:
            _, storage = storage_for(url, study_name)
        study = _open_study(problem, objectives, storage, study_name, seed)
        if url != MEMORY:
            optuna.storages.fail_stale_trials(study)

        left = trials - _counted(study)
        if left <= 0 and not _waiting(study):
            return

        def enough(st, _) -> None:
            # optuna's MaxTrialsCallback, but a trial that waits (a baseline enqueued by another run
            # that started at the same moment) is run before stopping
            if _counted(st) >= trials and not _waiting(st):
                st.stop()

        with _sigint_noted(also_term=parent is not None) as interrupted:
            study.optimize(_Objective(problem, objectives), n_trials=None, timeout=timeout,
                           callbacks=[enough, lambda st, _: st.stop() if interrupted else None,
                                      lambda st, _: st.stop() if parent and os.getppid() != parent else None],
                           show_progress_bar=progress, gc_after_trial=False, catch=(DuplicateBaseline,))
    except KeyboardInterrupt:  # before the trials, while the study is opened
        raise _interrupted(url) from None
    if interrupted or (parent is not None and os.getppid() != parent):
        raise _interrupted(url)


def search(model: str | ModelConfig, gpu: str, *, batch: int = 1, kv_len: int = 1024, trials: int = 100,
           timeout: float | None = None, seed: int = 0, storage: str | None = None, study_name: str | None = None,
           objectives: str | tuple[str, ...] = "latency", workers: int = 1, out: str | Path | None = None,
           report: str | Path | None = None, progress: bool = False,
           fixed: dict[str, Any] | None = None, best_mode: str | None = None,
           designs: str | tuple[str, ...] | None = None, say: Callable[[str], None] | None = None,
           routing: str = "uniform", tp: int = 1, ep: int = 1) -> SearchResult:
    """Search megakernel (and, for comparison, chain) schedules of ``model`` on ``gpu``.

    ``model``: a built-in model's name, the path of a Hugging Face ``config.json`` or a
    :class:`~mksim.models.ModelConfig` (:func:`~mksim.search._space.study_model`); the default study
    name names a config by its name and a hash of its fields (:func:`~mksim.search._space.model_label`).

    Seeds the study with the baselines, runs until the study holds ``trials`` finished trials
    (``workers`` processes on this machine share it), writes the best schedule to ``out`` and an
    HTML report to ``report``, and returns a :class:`SearchResult`. ``fixed`` Options fields
    (``{"smem_reserve_KiB": 80}``: what a generated kernel needs) are kept by every candidate and
    recorded in the study: resuming it with other fixed values is refused. Where the model does not
    price pages (:func:`~mksim.search.pages_costed`), the megakernels keep the default page ring
    (:func:`~mksim.search.ring_fixed`), recorded likewise. ``best_mode``
    (``"megakernel"``) makes the best the best trial of that mode, when the chain baselines must
    stay comparisons only (the validation suite's searched megakernels). ``designs`` (``"sentinel,dynamic"``
    or ``"all"``) adds megakernel designs to the space and their baselines (``megakernel:dynamic``,
    ``megakernel:sentinel``); recorded in the study like ``fixed``. ``routing``: a mixture of experts'
    routing model (``Step.routing``). ``tp``, ``ep``: the step split over GPUs (``Step.tp``, ``Step.ep``,
    docs/parallel.md), recorded in the study and its default name; a tensor-parallel step adds the designs
    of its all-reduces to the space (:func:`~mksim.search.implied_designs`), and every trial records its
    ``communication_us``.
    """
    objs = _parse_objectives(objectives)
    shown = model  # as given: a built-in's name, a config's path
    model = study_model(model)  # a config file is read (a bad one: one line) before anything else
    split = "".join(f", {k} {v}" for k, v in (("tp", tp), ("ep", ep)) if v > 1)
    shape = f"{shown if isinstance(shown, str) else model_label(model)} on {gpu}, batch {batch}, KV {kv_len}{split}"
    if out:  # before the work: a typo in a path must not cost a finished search
        check_writable(out, "--out")
    if report:
        check_writable(report, "--report")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise MksimError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise MksimError(f"--seed must be a whole number from 0 to {SEED_MAX} (2**32 - 1), got {seed!r}")
    target = Target.parse(gpu)
    spec = target.spec
    fixed = check_fixed(fixed)
    check_fixed_on(spec, fixed)
    designs_t = check_designs(designs)
    probe = Problem(model=model, gpu=spec, batch=batch, kv_len=kv_len, routing=routing, tp=tp, ep=ep)
    if designs_t:  # a design the model cannot have (an MoE design, a dense model): left out of all, else refused
        wl = probe.workload()
        why = {d: get_design(d).available_for(wl) for d in designs_t}
        if designs != "all" and any(why.values()):
            raise MksimError(next(w for w in why.values() if w))
        designs_t = tuple(d for d in designs_t if why[d] is None)
    designs_t = tuple(sorted({*designs_t, *implied_designs(probe.step, spec)}))  # --tp: how its all-reduces run
    n_first = len(baseline_params(spec, fixed, designs_t))
    if trials < n_first:
        raise MksimError(f"--trials must be at least {n_first} (the baselines run first)")
    if workers < 1:
        raise MksimError("--workers must be at least 1")
    problem = Problem(model=model, gpu=spec, batch=batch, kv_len=kv_len, fixed=fixed, designs=designs_t,
                      routing=routing, tp=tp, ep=ep)
    check_fits(problem.workload(), spec)  # unknown model, impossible shape or too big: before any study is made
    name = study_name or default_study_name(problem, objs)
    if storage == MEMORY and workers > 1:
        raise MksimError("--storage memory runs in one process; give a sqlite:/// or postgresql:// URL for --workers")
    # before the study is opened: an output that is the study's own file (or the GPU file) would destroy it
    check_outputs({"--out": out, "--report": report},
                  [("study storage", sqlite_file(storage or f"sqlite:///{name}.db")),
                   ("hardware file", _gpu_file(target))])
    new_default = storage is None and not Path(f"{name}.db").exists()
    url = storage or f"sqlite:///{name}.db"
    st = None
    try:  # Ctrl-C at any moment, before the first trial or after the last, says how to resume
        url, st = storage_for(storage, name)
        if new_default and say is not None:  # once it could be made: a refusal stays one line
            say(f"creating study storage sqlite:///{name}.db in {Path.cwd()} (--storage puts it elsewhere)")
        study = _open_study(problem, objs, st, name, seed)
        if url != MEMORY:  # a process killed mid-trial left it running: fail it, and run its baseline again
            _fail_orphaned_trials(study)
        _enqueue_baselines(study, problem)
        if workers == 1:
            _work(problem, objs, url, name, seed, trials, timeout, progress, storage=st if url == MEMORY else None)
        else:
            # The workers share the enqueued trials (the baselines) out too: a process takes a waiting
            # trial in a transaction that holds the write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL:
            # SELECT ... FOR UPDATE), so no two evaluate the same one.
            ctx = mp.get_context("fork") if os.name == "posix" else mp.get_context("spawn")
            _release(st)  # a forked worker must not inherit an open SQLite file (_storage.release),
            gc.collect()  # nor a leaked one it would close, with its locks, once its own collector runs
            procs = [ctx.Process(target=_work_in_child, args=(os.getpid(), problem, objs, url, name,
                                                              (seed + i) % (SEED_MAX + 1), trials, timeout,
                                                              progress and i == 0)) for i in range(workers)]
            for p in procs:
                p.start()
            with _sigint_noted() as interrupted:  # Ctrl-C reaches the workers too: wait for them to stop
                for p in procs:
                    p.join()
            if interrupted or any(p.exitcode == 130 for p in procs):
                raise _interrupted(url)
            if any(p.exitcode for p in procs):
                raise MksimError(f"{sum(1 for p in procs if p.exitcode)} search worker(s) failed; the study keeps "
                                 "every finished trial: run the same command again to resume")
        if url != MEMORY:
            _await_baselines(study)
        result = summarize(study, problem, objs, url, best_mode)
        result.shape = shape
        for path, flag, write in ((out, "--out", lambda p: save_best(result, problem, p)),
                                  (report, "--report", lambda p: write_report(study, result, p))):
            if path:
                try:
                    write(path)
                except OSError as exc:  # the folder went away during the search: keep the result for the caller
                    raise OutputError(f"{flag} {path}: cannot write the result ({exc.strerror}); the study keeps every "
                                      "trial: run the same command again with another path", result) from None
        return result
    except KeyboardInterrupt:
        raise _interrupted(url) from None
    finally:
        if st is not None:
            _release(st)


def summarize(study, problem: Problem, objectives: tuple[str, ...], url: str,
              best_mode: str | None = None) -> SearchResult:
    """The study's outcome; ``best_mode`` (e.g. ``"megakernel"``) takes the best among that mode's
    trials only (the chain baselines are still reported)."""
    optuna = _optuna()
    TS = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TS.COMPLETE]
    pruned = [t for t in trials if t.state == TS.PRUNED]
    if not done and pruned and problem.fixed:  # nothing runs with the fixed options: say so, not "run more"
        fixed = " ".join(f"--fix {k}={v:g}" if isinstance(v, float) else f"--fix {k}={v}"
                         for k, v in problem.fixed.items())
        why = pruned[0].user_attrs.get("pruned_reason", "")
        raise MksimError(f"every trial of study {study.study_name!r} was pruned: no schedule runs with {fixed} on "
                         f"{problem.gpu.name}" + (f" ({why})" if why else "") + "; change or drop the --fix")
    if not done:
        raise MksimError(f"study {study.study_name!r} has no completed trial yet; run more trials")
    pool = [t for t in done if best_mode is None or t.params.get("mode", "megakernel") == best_mode]
    if not pool:
        raise MksimError(f"study {study.study_name!r} has no completed {best_mode} trial yet; run more trials")

    def numbers(t) -> dict[str, Any]:
        """A trial's predictions: latency, shared memory, and its communication on a step split over GPUs."""
        return {"latency_us": t.user_attrs["latency_us"], "smem_KiB": t.user_attrs["smem_KiB"],
                **{k: t.user_attrs[k] for k in ("communication_us",) if k in t.user_attrs}}

    def row(t) -> dict[str, Any]:
        return {"trial": t.number, **numbers(t), "params": dict(t.params)}

    best_t = min(pool, key=lambda t: (t.user_attrs["latency_us"], t.number))
    baselines: dict[str, dict[str, Any]] = {}
    for t in done:
        b = t.user_attrs.get("baseline")
        if b and is_baseline(b) and b not in baselines:
            baselines[b] = numbers(t)
    pareto = []
    if len(objectives) > 1:
        pareto = sorted((row(t) for t in study.best_trials), key=lambda r: r["latency_us"])
    best = row(best_t)
    best["candidate"] = candidate_from_params(best_t.params, problem.gpu, problem.fixed, problem.designs).to_dict()
    return SearchResult(study_name=study.study_name, storage=url, objectives=objectives, best=best,
                        baselines=baselines, pareto=pareto, n_complete=len(done),
                        n_pruned=sum(t.state == TS.PRUNED for t in trials),
                        n_failed=sum(t.state == TS.FAIL for t in trials), fixed=dict(problem.fixed),
                        designs=problem.designs, tp=problem.tp, ep=problem.ep)


def save_best(result: SearchResult, problem: Problem, path: str | Path) -> Path:
    """Write the best schedule as a schedule file (``mksim simulate --schedule`` reproduces it)."""
    c = Candidate(**result.best["candidate"])
    sched = build(c, problem)
    p = Path(path)
    sched.to_json(p)
    return p
