"""Searches started from the explorer, each in a worker process of its own.

The server stays responsive while a study runs: the search is ``mksim.search.search`` in a spawned
process (safe from a threaded server, where fork is not), and the Search page follows it the way it
opens any study, by reading the study's storage every second (:func:`explorer.data.study_data`).
This module only starts the worker, says whether it is still running, finished, failed (with
mksim's one-line message) or cancelled, and cancels it (the worker process is terminated; the trial
it was running stays RUNNING in the study, as when ``mksim search`` is interrupted). At most
:data:`MAX_RUNNING` searches run at once: a further one is refused with one line. Inputs are checked
here before any process starts, so a bad batch or an unknown GPU answers at once.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import tempfile
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import hwmodels
from explorer.data import storage_url
from mksim.errors import MksimError
from mksim.search import Problem, baseline_params, default_study_name, search

#: What the Search page offers as objectives (``mksim search --objective``).
OBJECTIVE_CHOICES = ("latency", "latency,smem")

#: Searches one server runs at once (each takes a CPU core); a further one is refused until one ends.
MAX_RUNNING = 2


@dataclass
class _Job:
    process: BaseProcess
    results: Connection  # the worker sends one dict: {"result": ...} or {"error": one line}
    out: dict[str, Any] | None = None
    cancelled: bool = False

    def running(self) -> bool:
        """Whether the worker still runs (reading its result if it has sent it)."""
        if self.out is None and not self.cancelled and self.results.poll():
            try:
                self.out = self.results.recv()
            except (EOFError, OSError):
                pass
        return self.out is None and not self.cancelled and self.process.is_alive()


_LOCK = threading.Lock()
_IDS = itertools.count(1)
_JOBS: dict[str, _Job] = {}


def default_storage() -> str:
    """The SQLite file the Search page keeps its studies in unless told otherwise."""
    d = Path(tempfile.gettempdir()) / "mksim-explorer"
    d.mkdir(parents=True, exist_ok=True)
    return str(d / "studies.db")


def check_search(model: str, gpu: str, batch: int, kv_len: int, trials: int, objectives: str) -> str:
    """Check a search's inputs as :func:`mksim.search.search` would (one-line MksimError); returns the
    default study name."""
    if objectives not in OBJECTIVE_CHOICES:
        raise MksimError(f"objectives: give {' or '.join(repr(o) for o in OBJECTIVE_CHOICES)}")
    spec = hwmodels.load(gpu)
    first = len(baseline_params(spec))
    if trials < first:
        raise MksimError(f"trials must be at least {first} (the baselines run first)")
    problem = Problem(model=model, gpu=spec, batch=batch, kv_len=kv_len)
    problem.workload()  # unknown model or impossible shape
    return default_study_name(problem, tuple(objectives.split(",")))


def _run(kwargs: dict[str, Any]) -> dict[str, Any]:
    """In the worker: run the search; errors come back as one line (exceptions need not pickle)."""
    try:
        return {"result": search(**kwargs).to_dict()}
    except MksimError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - shown in the page rather than lost in a worker
        return {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}


def _worker(kwargs: dict[str, Any], results: Connection) -> None:
    """The worker process's entry: run the search, send its outcome."""
    results.send(_run(kwargs))
    results.close()


def running_jobs() -> list[str]:
    """The searches of this server that still run."""
    with _LOCK:
        return [job for job, j in _JOBS.items() if j.running()]


def start_search(model: str, gpu: str, batch: int, kv_len: int, trials: int, objectives: str = "latency",
                 storage: str | None = None, study: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Start a search in a worker process; returns ``{"job", "storage", "study", "trials"}`` (the study's
    storage URL and name, to follow it). Raises MksimError on bad input, or when :data:`MAX_RUNNING`
    searches run already, before any process starts."""
    default_name = check_search(model, gpu, batch, kv_len, trials, objectives)
    name = (study or "").strip() or default_name
    url = storage_url(storage or default_storage())
    kwargs = dict(model=model, gpu=gpu, batch=batch, kv_len=kv_len, trials=trials, seed=seed, storage=url,
                  study_name=name, objectives=objectives)
    ctx = mp.get_context("spawn")
    with _LOCK:
        if sum(j.running() for j in _JOBS.values()) >= MAX_RUNNING:
            raise MksimError(f"{MAX_RUNNING} searches are running already (at most {MAX_RUNNING} at once): "
                             "wait for one to end or cancel it")
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(kwargs, send), daemon=True, name="mksim-explorer-search")
        proc.start()
        send.close()  # the worker holds its end: the pipe reports EOF if the worker dies
        job = f"search-{next(_IDS)}"
        _JOBS[job] = _Job(proc, receive)
    return {"job": job, "storage": url, "study": name, "trials": trials}


def cancel(job: str | None) -> str:
    """Stop a search of this server: its worker process is terminated. Returns a one-line message."""
    with _LOCK:
        j = _JOBS.get(job or "")
        if j is None or not j.running():
            return "no running search to cancel"
        j.cancelled = True
    j.process.terminate()
    j.process.join(timeout=10)
    if j.process.is_alive():
        j.process.kill()
        j.process.join(timeout=10)
    return "search cancelled"


def job_state(job: str | None) -> tuple[str, str]:
    """``(state, message)``: ``running``, ``done``, ``failed`` (message: the one-line error), ``cancelled``
    or ``none`` (no such job in this server: an opened study, or a server restarted since)."""
    with _LOCK:
        j = _JOBS.get(job or "")
        if j is None:
            return "none", ""
        if j.running():
            return "running", ""
    if j.cancelled:
        return "cancelled", "the search was cancelled"
    if j.out is None:  # the worker process died without an answer (killed, out of memory)
        j.process.join(timeout=5)
        return "failed", f"the search worker stopped (exit code {j.process.exitcode})"
    return ("failed", j.out["error"]) if "error" in j.out else ("done", "")
