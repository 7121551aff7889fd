"""Searches started from the explorer: each a process of its own, listed in a registry on disk.

The server stays responsive while a study runs: the search is ``mksim.search.search`` in a worker
process (``python -m explorer.worker``), and the Search page follows it the way it opens any study,
by reading the study's storage every second (:func:`explorer.data.study_data`). This module starts
the worker, lists the searches, says whether each still runs, finished, failed (with mksim's one-line
message), was cancelled or stopped (its process ended without an answer: killed, out of memory, the
machine restarted), and cancels one (its process is terminated; the trial it was running stays
RUNNING in the study, as when ``mksim search`` is interrupted). At most :data:`MAX_RUNNING` searches
run at once: a further one is refused with one line. Inputs are checked here before any process
starts, so a bad batch or an unknown GPU answers at once.

Why a registry on disk and detached workers, not Dash background callbacks (``DiskcacheManager``):
a background callback's job belongs to the browser page whose callback started it, so a restarted
server (or another tab) has no list of the jobs, nothing to re-attach to and nothing to cancel; it
would also need two more packages (``multiprocess``, ``psutil``). Here every search is a folder of
:func:`jobs_dir` (``MKSIM_EXPLORER_JOBS``; default ``jobs/`` in the explorer's own folder,
:func:`explorer.store.home`, mode 0700 and checked to be this user's) holding small files, each written
whole (a temporary file renamed) by one writer only, so no file is ever read half written and no two
processes update the same one:

- ``job.json``: what was asked (model, GPU, study, storage, trials) and the worker's pid with its start time
  (``/proc/<pid>/stat``); the server writes it when it starts the worker. Cancel signals that pid's process
  group only after checking that the process is still that worker: the same start time, this user's, the
  leader of its own group, running ``explorer.worker`` on this folder (:func:`worker_group`). A ``job.json``
  naming any other process (a reused pid, a planted file) is never signalled;
- ``outcome.json``: ``{"state": "done"}`` or ``{"state": "failed", "error": one line}``; the worker
  writes it as it ends;
- ``cancelled``: the server's note that it cancelled the search;
- ``lock``: an ``flock`` the worker holds while it lives. The server takes it before it starts the
  worker and hands it over (the worker inherits the descriptor), so a search is running exactly while
  the lock is held: the kernel releases it however the process ends, and a pid reused by another
  process never reads as a live search;
- ``worker.log``: the worker's output, for a search that went wrong.

The worker runs in a session of its own: stopping the server (Ctrl-C, a restart) leaves it running,
and the next server lists it again, follows it and can cancel it. Its finished trials are in the
study whatever happens to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from explorer import store
from explorer.data import check_gpu, check_model, check_split, storage_url
from mksim.errors import MksimError
from mksim.schedule import check_fits
from mksim.search import Problem, baseline_params, default_study_name, implied_designs
from mksim.target import gpu_spec

try:  # POSIX: the registry's locks; elsewhere the page refuses to start a search, in one line
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

#: What the Search page offers as objectives (``mksim search --objective``).
OBJECTIVE_CHOICES = ("latency", "latency,smem")

#: Searches that run at once (each takes a CPU core), counted over the registry, whichever server started
#: them; a further one is refused until one ends.
MAX_RUNNING = 2

#: Searches the registry remembers; when a new one starts, the oldest ended ones beyond this are forgotten
#: (their studies stay in their storage).
KEEP_JOBS = 20

#: A search takes at most this many trials from the page (``mksim search`` takes any number).
MAX_TRIALS = 2000

#: A search's name in the registry.
_JOB = re.compile(r"search-[0-9]{1,9}")
#: A study name the page takes: letters, digits and ``._+,=@:-``, as mksim search's default names are.
_STUDY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+,=@:-]{0,127}")

#: Why a search without an answer and without a process stopped.
STOPPED = ("its process ended before the search finished (killed, or the machine restarted); the study keeps "
           "every finished trial")

_THREAD_LOCK = threading.Lock()
_CHILDREN: dict[str, subprocess.Popen[bytes]] = {}  # the workers this server started, reaped when they end


def jobs_dir() -> Path:
    """The registry's folder: ``MKSIM_EXPLORER_JOBS``, else ``jobs/`` in the explorer's own folder
    (:func:`explorer.store.home`); made with mode 0700, and refused in one line (MksimError) if it is another
    user's or writable by others (:func:`explorer.store.private_dir`)."""
    env = os.environ.get("MKSIM_EXPLORER_JOBS")
    if env:
        return store.private_dir(Path(env).expanduser(), "MKSIM_EXPLORER_JOBS")
    return store.private_dir(store.home() / "jobs", "the explorer's search registry")


def default_storage() -> str:
    """The storage URL the Search page keeps its studies in: ``MKSIM_EXPLORER_STORAGE`` (what ``mksim
    explore --storage`` sets: the server's owner chooses it, the browser cannot), else ``studies.db`` in the
    explorer's own folder."""
    env = os.environ.get("MKSIM_EXPLORER_STORAGE")
    return storage_url(env) if env else storage_url(str(store.home() / "studies.db"))


def check_study_name(name: object, new: bool = True) -> str:
    """A study name from the page, checked: a name in the explorer's storage, never a path or a URL. A ``new``
    study's name (a search to start) is letters, digits and ``._+,=@:-`` (at most 128); a study to open
    may be any name ``mksim search --study`` gave (printable, at most 256 characters): it is only looked up."""
    ok = isinstance(name, str) and (_STUDY.fullmatch(name.strip()) if new else
                                    0 < len(name.strip()) <= 256 and name.isprintable())
    if not ok:
        shown = repr(name)[:60] if isinstance(name, str) else f"a {type(name).__name__}"
        raise MksimError(f"study name {shown}: give a name of letters, digits and ._+,=@:- (at most 128), "
                         "not a path")
    return str(name).strip()


def check_job_name(job: object) -> str | None:
    """``job`` if it names a search of the registry's form (``search-N``), else ``None``."""
    return job if isinstance(job, str) and _JOB.fullmatch(job) else None


def check_search(model: str, gpu: str, batch: int, kv_len: int, trials: int, objectives: str,
                 routing: str = "uniform", tp: int = 1, ep: int = 1) -> str:
    """Check a search's inputs as :func:`mksim.search.search` would (one-line MksimError); returns the
    default study name. The model and GPU must be names the page lists (:func:`explorer.data.check_model`,
    :func:`explorer.data.check_gpu`), the trials at most :data:`MAX_TRIALS`; ``tp`` and ``ep`` split the
    step over GPUs (:func:`explorer.data.check_split`; a tensor-parallel study adds the designs of its
    all-reduces and their baselines, :func:`mksim.search.implied_designs`)."""
    if objectives not in OBJECTIVE_CHOICES:
        raise MksimError(f"objectives: give {' or '.join(repr(o) for o in OBJECTIVE_CHOICES)}")
    check_model(model)
    spec = gpu_spec(check_gpu(gpu))
    tp, ep = check_split(tp, ep)
    probe = Problem(model=model, gpu=spec, batch=batch, kv_len=kv_len, routing=routing, tp=tp, ep=ep)
    designs = implied_designs(probe.step, spec)
    first = len(baseline_params(spec, designs=designs))
    if trials < first:
        raise MksimError(f"trials must be at least {first} (the baselines run first)")
    if trials > MAX_TRIALS:
        raise MksimError(f"trials must be at most {MAX_TRIALS} from the explorer; run mksim search for more")
    problem = replace(probe, designs=designs)
    check_fits(problem.workload(), spec)  # unknown model, impossible shape or split, more GPUs than the node has
    return default_study_name(problem, tuple(objectives.split(",")))


# -- the registry's files ---------------------------------------------------------------------
def write_json(path: Path, value: Any) -> None:
    """Write ``value`` to ``path`` whole: a reader sees the old file or the new one, never a part."""
    store.write_private(path, json.dumps(value))


def _read_json(path: Path) -> Any:
    text = store.read_private(path, 1 << 20)
    try:
        return None if text is None else json.loads(text)
    except (ValueError, RecursionError):
        return None


def _number(job: str) -> int:
    try:
        return int(job.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0


def _job_dirs() -> list[Path]:
    """The registry's searches, newest first."""
    try:
        found = [d for d in jobs_dir().iterdir() if d.is_dir() and d.name.startswith("search-")]
    except OSError:
        return []
    return sorted(found, key=lambda d: _number(d.name), reverse=True)


def _alive(folder: Path) -> bool:
    """Whether the search's worker still lives: it holds the folder's lock."""
    if fcntl is None:
        return False
    try:
        fd = os.open(folder / "lock", os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing also releases the lock if we got it
    return False


def _reap() -> None:
    """Collect the exit status of this server's workers that ended (no zombie processes)."""
    for job, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[job]


@contextlib.contextmanager
def _starting() -> Iterator[None]:
    """One start at a time, across threads and servers sharing the registry: the count of running
    searches and the new one's number stay right."""
    jobs_dir().mkdir(parents=True, exist_ok=True)
    with _THREAD_LOCK, open(jobs_dir() / "start.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _state(folder: Path) -> tuple[str, str]:
    outcome = _read_json(folder / "outcome.json")
    if isinstance(outcome, dict) and outcome.get("state") in ("done", "failed"):
        return outcome["state"], str(outcome.get("error", ""))
    if (folder / "cancelled").exists():
        return "cancelled", "the search was cancelled"
    if _alive(folder):
        return "running", ""
    return "stopped", STOPPED


# -- what the page calls ---------------------------------------------------------------------
def job_state(job: str | None) -> tuple[str, str]:
    """``(state, message)``: ``running``, ``done``, ``failed`` (message: the one-line error), ``cancelled``,
    ``stopped`` (message: why) or ``none`` (no such search in the registry: an opened study)."""
    if check_job_name(job) is None:
        return "none", ""
    folder = jobs_dir() / str(job)
    if not (folder / "job.json").is_file():
        return "none", ""
    with _THREAD_LOCK:
        _reap()
    return _state(folder)


def list_jobs() -> list[dict[str, Any]]:
    """The registry's searches, newest first: ``{"job", "model", "gpu", "study", "storage", "trials",
    "objectives", "started" (Unix time), "state", "message"}``."""
    with _THREAD_LOCK:
        _reap()
    jobs = []
    for folder in _job_dirs():
        record = _read_json(folder / "job.json")
        if isinstance(record, dict):
            state, message = _state(folder)
            jobs.append({**{k: v for k, v in record.items() if k != "pid"}, "state": state, "message": message})
    return jobs


def running_jobs() -> list[str]:
    """The searches that still run (whichever server started them)."""
    return [j["job"] for j in list_jobs() if j["state"] == "running"]


def follow(job: str) -> dict[str, Any]:
    """What the page follows for a search of the registry: ``{"job", "storage", "study", "trials"}``."""
    record = _read_json(jobs_dir() / job / "job.json") if check_job_name(job) else None
    if not isinstance(record, dict):
        raise MksimError(f"no search {str(job)[:60]!r} in {jobs_dir()}")
    return {k: record[k] for k in ("job", "storage", "study", "trials")}


def _forget_old() -> None:
    """Forget the oldest ended searches beyond :data:`KEEP_JOBS` (their studies stay)."""
    for folder in _job_dirs()[KEEP_JOBS:]:
        if _state(folder)[0] != "running":
            shutil.rmtree(folder, ignore_errors=True)


def start_search(model: str, gpu: str, batch: int, kv_len: int, trials: int, objectives: str = "latency",
                 study: str | None = None, seed: int = 0, routing: str = "uniform", tp: int = 1,
                 ep: int = 1) -> dict[str, Any]:
    """Start a search in a worker process, its study in :func:`default_storage`; returns ``{"job",
    "storage", "study", "trials"}`` (the study's storage URL and name, to follow it). ``routing``: a mixture
    of experts' routing model, checked by the caller (:func:`explorer.data.routing_for`); ``tp``, ``ep``: the
    step split over GPUs. Raises MksimError on bad input, or when :data:`MAX_RUNNING` searches run already,
    before any process starts."""
    default_name = check_search(model, gpu, batch, kv_len, trials, objectives, routing, tp, ep)
    name = check_study_name(study) if (study or "").strip() else default_name
    url = default_storage()
    tp, ep = check_split(tp, ep)
    kwargs = dict(model=model, gpu=gpu, batch=batch, kv_len=kv_len, trials=trials, seed=seed, storage=url,
                  study_name=name, objectives=objectives, **({"routing": routing} if routing != "uniform" else {}),
                  **{k: v for k, v in (("tp", tp), ("ep", ep)) if v > 1})
    if fcntl is None:
        raise MksimError("the explorer runs searches on Linux or macOS only; run mksim search here")
    try:
        with _starting():
            return _start_locked(kwargs)
    except OSError as exc:
        raise MksimError(f"cannot start the search in {jobs_dir()}: {exc.strerror or exc}") from None


def _start_locked(kwargs: dict[str, Any]) -> dict[str, Any]:
    _reap()
    dirs = _job_dirs()
    if sum(_state(d)[0] == "running" for d in dirs) >= MAX_RUNNING:
        raise MksimError(f"{MAX_RUNNING} searches are running already (at most {MAX_RUNNING} at once): "
                         "wait for one to end or cancel it")
    job = f"search-{(_number(dirs[0].name) if dirs else 0) + 1}"
    folder = jobs_dir() / job
    folder.mkdir()
    lock = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # held from now on: the search reads as running from the start
        package_root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        with open(folder / "worker.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "explorer.worker", str(folder), json.dumps(kwargs)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                pass_fds=(lock,),  # the worker inherits the lock and holds it while it lives
                start_new_session=True)  # not stopped with the server (Ctrl-C reaches its group only)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        os.close(lock)  # the worker's copy keeps the lock
    _CHILDREN[job] = proc
    ident = _identity(proc.pid)
    record = {"job": job, "pid": proc.pid, "pid_start": ident[0] if ident else None, "uid": os.getuid(),
              "model": kwargs["model"], "gpu": kwargs["gpu"],
              "study": kwargs["study_name"], "storage": kwargs["storage"], "trials": kwargs["trials"],
              "objectives": kwargs["objectives"], "routing": kwargs.get("routing", "uniform"),
              "tp": kwargs.get("tp", 1), "ep": kwargs.get("ep", 1), "started": time.time()}
    write_json(folder / "job.json", record)
    _forget_old()
    return {k: record[k] for k in ("job", "storage", "study", "trials")}


def _identity(pid: int) -> tuple[int, int] | None:
    """``(start time, uid)`` of process ``pid`` (its start in clock ticks since boot, from ``/proc/<pid>/stat``),
    ``None`` where it cannot be read (no such process, no ``/proc``)."""
    try:
        stat_text = Path(f"/proc/{pid}/stat").read_text()
        uid = os.stat(f"/proc/{pid}").st_uid
        return int(stat_text.rsplit(")", 1)[1].split()[19]), uid  # field 22; the name in () may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def worker_group(job: str, record: Any) -> int | None:
    """The process group to signal to cancel ``job``: the worker's pid, if the process is the worker this
    registry started (this server's own child still running, or the process ``record`` names with the same
    start time, this user's, the leader of its group and running ``explorer.worker`` on the job's folder);
    ``None`` otherwise (a pid reused by another process, or a ``job.json`` that names one)."""
    child = _CHILDREN.get(job)
    if child is not None and child.poll() is None:  # not reaped: its pid cannot be another process's yet
        return child.pid
    if not isinstance(record, dict):
        return None
    pid, start = record.get("pid"), record.get("pid_start")
    if type(pid) is not int or type(start) is not int or pid <= 1 or pid == os.getpid():
        return None
    if _identity(pid) != (start, os.getuid()):
        return None
    try:
        if os.getpgid(pid) != pid:
            return None
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    folder = os.path.realpath(jobs_dir() / job)
    if b"explorer.worker" not in argv or not any(os.path.realpath(os.fsdecode(a)) == folder for a in argv if a):
        return None
    return pid


def cancel(job: str | None) -> str:
    """Stop a running search, whichever server started it: its worker is terminated. Returns one line.
    Only the worker is ever signalled (:func:`worker_group`)."""
    if job_state(job)[0] != "running":
        return "no running search to cancel"
    folder = jobs_dir() / str(job)
    with _THREAD_LOCK:
        pid = worker_group(str(job), _read_json(folder / "job.json"))
    if pid is None:
        return (f"cannot cancel {job}: its process is not a search worker this explorer started (job.json names "
                "another process); stop it from the shell")
    try:
        (folder / "cancelled").touch()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _alive(folder):  # the lock says the worker (the leader of process group ``pid``) still lives
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + 10
            while _alive(folder) and time.monotonic() < deadline:
                time.sleep(0.05)
    except OSError as exc:
        return f"cannot cancel {job}: {exc.strerror or exc}"
    with _THREAD_LOCK:
        child = _CHILDREN.pop(str(job), None)
    if child is not None:
        child.wait(timeout=10)
    return "search cancelled"
