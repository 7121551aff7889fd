"""Running a search: an Optuna study over :mod:`._space`, persisted in an RDB storage.

The study lives in a database (SQLite by default, PostgreSQL to spread it over machines): a run
that is killed resumes with every finished trial kept, and several processes or machines can
fill one study. ``trials`` counts finished trials (complete or pruned) of the whole study, so the
same command run again stops when the study holds that many; with several workers each stops
once the study holds that many, so it can end with up to (workers - 1) more, finished by workers
that were mid-trial.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing as mp
import os
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

import hwmodels
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
from mksim.schedule import check_fits
from mksim.sim import simulate

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
    is_baseline,
    ring_fixed,
    suggest,
)

OBJECTIVES = {"latency": ("latency_us", "minimize"), "smem": ("smem_KiB", "minimize")}
HEARTBEAT_S = 2
MEMORY = "memory"  # --storage memory: a one-off study in this process (nothing kept, one worker)
GRACE_S = 10
CONNECT_TIMEOUT_S = 10  # a PostgreSQL server that does not answer within this is reported, not waited on


def _optuna() -> ModuleType:
    """Optuna, imported on first use (``import mksim.search`` stays light), or a one-line MissingExtraError."""
    return require("optuna", "search", "mksim search")


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

    def improvement(self) -> dict[str, float]:
        """Best latency's speed-up over each baseline (baseline / best)."""
        b = self.best["latency_us"]
        return {k: v["latency_us"] / b for k, v in self.baselines.items()}

    def to_dict(self) -> dict[str, Any]:
        return {"study": self.study_name, "storage": self.storage, "objectives": list(self.objectives),
                "best": self.best, "baselines": self.baselines, "speedup_vs_baseline": self.improvement(),
                "pareto": self.pareto, "trials": {"complete": self.n_complete, "pruned": self.n_pruned,
                                                  "failed": self.n_failed}, "fixed": self.fixed,
                "designs": list(self.designs)}


def default_study_name(problem: Problem, objectives: tuple[str, ...]) -> str:
    fixed = "".join(f"-{k}={v:g}" if isinstance(v, float) else f"-{k}={v}" for k, v in problem.fixed.items())
    designs = f"-designs={'+'.join(problem.designs)}" if problem.designs else ""
    return (f"{problem.model}-{problem.gpu.name}-b{problem.batch}-kv{problem.kv_len}-"
            f"{'+'.join(objectives)}{fixed}{designs}")


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
            return url, optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, **kw)
        except Exception as exc:  # sqlalchemy's own errors: bad URL, server down, missing driver
            # workers that start together on a new database race to create its tables: the
            # loser's CREATE fails once the winner's exists, and a retry finds them made
            if any(m in str(exc) for m in ("already exists", "UniqueViolation", "duplicate key",
                                             "UNIQUE constraint failed")):  # the last: SQLite's alembic_version
                time.sleep(0.5 * (attempt + 1))
                continue
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MksimError(f"cannot open study storage {url!r}: {first}") from None
    raise MksimError(f"cannot open study storage {url!r}: its tables could not be created; try again")


def _parse_objectives(text: str | tuple[str, ...]) -> tuple[str, ...]:
    objs = tuple(o.strip() for o in text.split(",")) if isinstance(text, str) else tuple(text)
    for o in objs:
        if o not in OBJECTIVES:
            raise UnknownNameError("objective", o, list(OBJECTIVES))
    if not objs or objs[0] != "latency" or len(set(objs)) != len(objs):
        raise MksimError("objectives: give 'latency' or 'latency,smem'")
    return objs


class _Objective:
    def __init__(self, problem: Problem, objectives: tuple[str, ...]):
        self.problem, self.objectives = problem, objectives

    def __call__(self, trial) -> float | tuple[float, ...]:
        optuna = _optuna()
        cand = suggest(trial, self.problem.gpu, trial.user_attrs.get("mode", "megakernel"), self.problem.fixed,
                       self.problem.designs)
        try:
            sched = build(cand, self.problem)
            res = simulate(sched, timeline=False)  # a trial needs the numbers only
        except (ScheduleError, DeadlockError) as exc:
            trial.set_user_attr("pruned_reason", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        vals = {"latency_us": res.latency_us, "smem_KiB": cand.smem_KiB()}
        trial.set_user_attr("latency_us", res.latency_us)
        trial.set_user_attr("smem_KiB", vals["smem_KiB"])
        trial.set_user_attr("hbm_util", res.hbm_util)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        out = tuple(vals[OBJECTIVES[o][0]] for o in self.objectives)
        return out[0] if len(out) == 1 else out


def _counted(study) -> int:
    optuna = _optuna()
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                         optuna.trial.TrialState.PRUNED)))


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
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    directions = [OBJECTIVES[o][1] for o in objectives]
    sampler = (optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)
               if len(objectives) == 1 else optuna.samplers.NSGAIISampler(seed=seed))
    study = optuna.create_study(study_name=study_name, storage=storage, directions=directions, sampler=sampler,
                                load_if_exists=True)
    want: dict[str, Any] = {"model": problem.model, "gpu": problem.gpu.name, "batch": problem.batch,
                            "kv_len": problem.kv_len, "phase": problem.phase, "objectives": list(objectives),
                            "space": SPACE_VERSION}
    if problem.fixed:  # recorded only when given: studies made before fixed options still resume
        want["fixed"] = dict(problem.fixed)
    ring = {k: v for k, v in ring_fixed(problem.gpu, problem.fixed).items() if k not in problem.fixed}
    if ring:  # the megakernels' ring, where the model does not price pages: likewise
        want["ring"] = ring
    if problem.designs:  # likewise
        want["designs"] = list(problem.designs)
    have = study.user_attrs.get("problem")
    if study.metric_names is None:  # optuna-dashboard and the plots show these names
        study.set_metric_names([OBJECTIVES[o][0] for o in objectives])
    if have is None:
        study.set_user_attr("problem", want)
    elif have.get("space") != SPACE_VERSION:
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
        raise MksimError(f"study {study_name!r} in this storage searches {have}, not {want}; "
                         "pick another --study name")
    return study


def fused_kv_split(problem: Problem, params: dict[str, Any]) -> dict[str, Any]:
    """The fused trial's parameters (:data:`FUSED_MEGAKERNEL`) at the KV split of
    :data:`KV_SPLIT_MULT` the model predicts fastest (the first where none builds): a sampler rarely
    meets the default megakernel with every fusion at a split other than the default, and the split
    moves the step by 3 % on an H200 (docs/validation.md). Unchanged where the split is fixed."""
    if "kv_split_mult" not in params:
        return params
    optuna = _optuna()
    best, best_us = params, math.inf
    for m in KV_SPLIT_MULT:
        p = {**params, "kv_split_mult": m}
        try:
            cand = suggest(optuna.trial.FixedTrial(p), problem.gpu, "megakernel", problem.fixed, problem.designs)
            us = simulate(build(cand, problem), timeline=False).latency_us
        except (ScheduleError, DeadlockError, optuna.TrialPruned):
            continue
        if us < best_us:
            best, best_us = p, us
    return best


def _enqueue_baselines(study, problem: Problem) -> None:
    """Seed a new study with the baselines, once, so the best can never be worse than them (the
    fused trial at the KV split the model prefers: :func:`fused_kv_split`)."""
    if study.user_attrs.get("baselines_enqueued"):
        return
    study.set_user_attr("baselines_enqueued", True)
    for name, params in baseline_params(problem.gpu, problem.fixed, problem.designs).items():
        if name == FUSED_MEGAKERNEL:
            params = fused_kv_split(problem, params)
        study.enqueue_trial(params, user_attrs={"baseline": name, "mode": params.get("mode", "megakernel")},
                            skip_if_exists=True)


@contextmanager
def _sigint_noted() -> Iterator[list[int]]:
    """Inside, Ctrl-C (SIGINT) is noted in the yielded list instead of raising KeyboardInterrupt in the
    middle of a trial, which optuna logs with a traceback and records as a failed trial; the caller stops
    after the current trial. A second Ctrl-C interrupts at once. Only the main thread takes signals: in
    another thread, or where SIGINT is ignored, this changes nothing."""
    got: list[int] = []
    old = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or old is signal.SIG_IGN:
        yield got
        return
    restore = old if old is not None else signal.SIG_DFL

    def note(signum: int, frame: Any) -> None:
        got.append(signum)
        signal.signal(signal.SIGINT, restore)

    signal.signal(signal.SIGINT, note)
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, restore)


def _interrupted(url: str) -> Interrupted:
    if url == MEMORY:
        return Interrupted("interrupted; --storage memory keeps nothing")
    return Interrupted(f"interrupted; the study in {url} keeps every finished trial: run the same command "
                       "again to resume")


def _work_in_child(*args: Any) -> None:
    """A worker process: Ctrl-C ends it with status 130 and no traceback; the parent reports it."""
    try:
        _work(*args)
    except Interrupted:
        sys.exit(130)


def _work(problem: Problem, objectives, url: str, study_name: str, seed: int, trials: int,
          timeout: float | None, progress: bool, storage=None) -> None:
    """One worker: run trials until the study holds ``trials`` finished ones (or time runs out).
    ``storage`` is given for the in-memory storage, which a URL cannot reopen."""
    optuna = _optuna()
    if storage is None:
        _, storage = storage_for(url, study_name)
    study = _open_study(problem, objectives, storage, study_name, seed)
    if url != MEMORY:
        optuna.storages.fail_stale_trials(study)
    left = trials - _counted(study)
    if left <= 0:
        return
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    with _sigint_noted() as interrupted:
        study.optimize(_Objective(problem, objectives), n_trials=left, timeout=timeout,
                       callbacks=[optuna.study.MaxTrialsCallback(trials, states=states),
                                  lambda st, _: st.stop() if interrupted else None],
                       show_progress_bar=progress, gc_after_trial=False)
    if interrupted:
        raise _interrupted(url)


def search(model: str, gpu: str, *, batch: int = 1, kv_len: int = 1024, trials: int = 100,
           timeout: float | None = None, seed: int = 0, storage: str | None = None, study_name: str | None = None,
           objectives: str | tuple[str, ...] = "latency", workers: int = 1, out: str | Path | None = None,
           report: str | Path | None = None, progress: bool = False,
           fixed: dict[str, Any] | None = None, best_mode: str | None = None,
           designs: str | tuple[str, ...] | None = None, say: Callable[[str], None] | None = None) -> SearchResult:
    """Search megakernel (and, for comparison, chain) schedules of ``model`` on ``gpu``.

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
    ``megakernel:sentinel``); recorded in the study like ``fixed``.
    """
    objs = _parse_objectives(objectives)
    if out:  # before the work: a typo in a path must not cost a finished search
        check_writable(out, "--out")
    if report:
        check_writable(report, "--report")
    if timeout is not None and not 0 < timeout < float("inf"):
        raise MksimError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    spec = hwmodels.load(gpu)
    fixed = check_fixed(fixed)
    designs_t = check_designs(designs)
    n_first = len(baseline_params(spec, fixed, designs_t))
    if trials < n_first:
        raise MksimError(f"--trials must be at least {n_first} (the baselines run first)")
    if workers < 1:
        raise MksimError("--workers must be at least 1")
    problem = Problem(model=model, gpu=spec, batch=batch, kv_len=kv_len, fixed=fixed, designs=designs_t)
    check_fits(problem.workload(), spec)  # unknown model, impossible shape or too big: before any study is made
    name = study_name or default_study_name(problem, objs)
    if storage == MEMORY and workers > 1:
        raise MksimError("--storage memory runs in one process; give a sqlite:/// or postgresql:// URL for --workers")
    if storage is None and say is not None and not Path(f"{name}.db").exists():
        say(f"creating study storage sqlite:///{name}.db in {Path.cwd()} (--storage puts it elsewhere)")
    url, st = storage_for(storage, name)
    study = _open_study(problem, objs, st, name, seed)
    _enqueue_baselines(study, problem)
    if workers == 1:
        _work(problem, objs, url, name, seed, trials, timeout, progress, storage=st if url == MEMORY else None)
    else:
        # Enqueued trials (the baselines) run here first: SQLite cannot hand a waiting trial to
        # exactly one of several processes, so two could evaluate the same one.
        optuna = _optuna()
        waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
        if waiting:
            _work(problem, objs, url, name, seed, min(trials, _counted(study) + waiting), timeout, progress)
        ctx = mp.get_context("fork") if os.name == "posix" else mp.get_context("spawn")
        procs = [ctx.Process(target=_work_in_child, args=(problem, objs, url, name, seed + i, trials, timeout,
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
    result = summarize(study, problem, objs, url, best_mode)
    for path, flag, write in ((out, "--out", lambda p: save_best(result, problem, p)),
                              (report, "--report", lambda p: write_report(study, result, p))):
        if path:
            try:
                write(path)
            except OSError as exc:  # the folder went away during the search: keep the result for the caller
                raise OutputError(f"{flag} {path}: cannot write the result ({exc.strerror}); the study keeps every "
                                  "trial: run the same command again with another path", result) from None
    return result


def summarize(study, problem: Problem, objectives: tuple[str, ...], url: str,
              best_mode: str | None = None) -> SearchResult:
    """The study's outcome; ``best_mode`` (e.g. ``"megakernel"``) takes the best among that mode's
    trials only (the chain baselines are still reported)."""
    optuna = _optuna()
    TS = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TS.COMPLETE]
    if not done:
        raise MksimError(f"study {study.study_name!r} has no completed trial yet; run more trials")
    pool = [t for t in done if best_mode is None or t.params.get("mode", "megakernel") == best_mode]
    if not pool:
        raise MksimError(f"study {study.study_name!r} has no completed {best_mode} trial yet; run more trials")

    def row(t) -> dict[str, Any]:
        return {"trial": t.number, "latency_us": t.user_attrs["latency_us"], "smem_KiB": t.user_attrs["smem_KiB"],
                "params": dict(t.params)}

    best_t = min(pool, key=lambda t: (t.user_attrs["latency_us"], t.number))
    baselines: dict[str, dict[str, Any]] = {}
    for t in done:
        b = t.user_attrs.get("baseline")
        if b and is_baseline(b) and b not in baselines:
            baselines[b] = {"latency_us": t.user_attrs["latency_us"], "smem_KiB": t.user_attrs["smem_KiB"]}
    pareto = []
    if len(objectives) > 1:
        pareto = sorted((row(t) for t in study.best_trials), key=lambda r: r["latency_us"])
    best = row(best_t)
    best["candidate"] = candidate_from_params(best_t.params, problem.gpu, problem.fixed, problem.designs).to_dict()
    return SearchResult(study_name=study.study_name, storage=url, objectives=objectives, best=best,
                        baselines=baselines, pareto=pareto, n_complete=len(done),
                        n_pruned=sum(t.state == TS.PRUNED for t in trials),
                        n_failed=sum(t.state == TS.FAIL for t in trials), fixed=dict(problem.fixed),
                        designs=problem.designs)


def save_best(result: SearchResult, problem: Problem, path: str | Path) -> Path:
    """Write the best schedule as a schedule file (``mksim simulate --schedule`` reproduces it)."""
    c = Candidate(**result.best["candidate"])
    sched = build(c, problem)
    p = Path(path)
    sched.to_json(p)
    return p
