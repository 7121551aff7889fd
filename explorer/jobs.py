"""Searches started from the explorer, each in a worker process of its own.

The server stays responsive while a study runs: the search is ``mksim.search.search`` in a spawned
process (safe from a threaded server, where fork is not), and the Search page follows it the way it
opens any study, by reading the study's storage every second (:func:`explorer.data.study_data`).
This module only starts the worker and says whether it is still running, finished, or failed, with
mksim's one-line message. Inputs are checked here before any process starts, so a bad batch or an
unknown GPU answers at once.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import tempfile
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import hwmodels
from explorer.data import storage_url
from mksim.errors import MksimError
from mksim.search import Problem, baseline_params, default_study_name, search

#: What the Search page offers as objectives (``mksim search --objective``).
OBJECTIVE_CHOICES = ("latency", "latency,smem")

_LOCK = threading.Lock()
_IDS = itertools.count(1)
_JOBS: dict[str, tuple[Future, ProcessPoolExecutor]] = {}


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


def start_search(model: str, gpu: str, batch: int, kv_len: int, trials: int, objectives: str = "latency",
                 storage: str | None = None, study: str | None = None, seed: int = 0) -> dict[str, Any]:
    """Start a search in a worker process; returns ``{"job", "storage", "study", "trials"}`` (the study's
    storage URL and name, to follow it). Raises MksimError on bad input, before any process starts."""
    default_name = check_search(model, gpu, batch, kv_len, trials, objectives)
    name = (study or "").strip() or default_name
    url = storage_url(storage or default_storage())
    kwargs = dict(model=model, gpu=gpu, batch=batch, kv_len=kv_len, trials=trials, seed=seed, storage=url,
                  study_name=name, objectives=objectives)
    pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"))
    fut = pool.submit(_run, kwargs)
    job = f"search-{next(_IDS)}"
    with _LOCK:
        _JOBS[job] = (fut, pool)
    fut.add_done_callback(lambda _: pool.shutdown(wait=False))
    return {"job": job, "storage": url, "study": name, "trials": trials}


def job_state(job: str | None) -> tuple[str, str]:
    """``(state, message)``: ``running``, ``done``, ``failed`` (message: the one-line error) or ``none``
    (no such job in this server: an opened study, or a server restarted since)."""
    with _LOCK:
        entry = _JOBS.get(job or "")
    if entry is None:
        return "none", ""
    fut = entry[0]
    if not fut.done():
        return "running", ""
    exc = fut.exception()
    if exc is not None:  # the worker process died (killed, out of memory)
        return "failed", f"the search worker stopped: {type(exc).__name__}"
    out = fut.result()
    return ("failed", out["error"]) if "error" in out else ("done", "")
