"""The search rows of the second table of bad inputs (shared/notes/bad-inputs-2026-12-02.md):
part A rows 139-155, 168-171 and 181, and the 20 cases of part C (two searches at once, SIGKILL, Ctrl-C).

Part A: every bad input answers with one line, ``error: ...``, exit status 2, in bounded time (``ONE_LINE_S``),
before any work; an output that is the study's own file is refused and the file stays byte-identical; the rows
the note found fine still work.

Part C: each case interrupts a search at a point chosen by progress, not by the clock (a hook in the child that
signals itself after the k-th enqueue, trial or simulation, or a signal sent once the study holds k finished
trials), then runs the same command again, and checks that no baseline and no finished trial was lost and that
the best equals an uninterrupted run's (the trials are the same: ``--trials`` is the least allowed, so every trial
is an enqueued one). The point is the search machinery, not the model: a tiny model (tests/data/tiny-llama.json,
2 layers) on a small GPU (16 SMs) with the chain options fixed keeps a search at 10 trials of about 15 ms of CPU
each; the enqueues, trials and simulations come in the same order as llama-3.2-1b's, so the hooks land where
their names say. Where the point depends on how long a trial lasts — a signal sent from outside once the study
holds k trials, two searches that overlap — each trial of the child is paced (``PACE_S`` of sleep after its
work: wall time, no CPU), as llama-3.2-1b's trials lasted, and an outside signal is checked to have landed before
the search's end. One repetition of the table runs in the slow tests; ``MKSIM_C_TABLE_REPEATS=20`` runs it 20
times in a row (``test_C_table_many_times_in_a_row``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

import hwmodels  # noqa: E402
from mksim.search import baseline_params, search  # noqa: E402
from mksim.search._space import check_fixed, model_label, study_model  # noqa: E402
from tests.clirun import as_from_a_terminal  # noqa: E402
from tests.mksim.searchkit import TINY_MODEL, count  # noqa: E402
from tests.mksim.test_bad_inputs import assert_one_line, run_cli  # noqa: E402
from tests.warmchild import WarmChild  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHILD_S = 240  # a search child must end within this (a resumed search takes about 2 s alone)
C_TABLE_REPEATS = int(os.environ.get("MKSIM_C_TABLE_REPEATS", "0"))  # the 20-in-a-row test runs when set
SMALL_GPU = """extends = "h200-datasheet"
name = "h200-16sm"
[chip.sm]
count = { value = 16, source = "tests", note = "an H200 of 16 SMs: the same space, searched in a fraction of the time" }
[sources.tests]
kind = "estimate"
title = "tests/mksim/test_bad_inputs_2_search.py"
"""
MODEL = str(TINY_MODEL)  # what the searches search: a model of 2 layers (tests/mksim/searchkit.py)
FIX = {"tasks_per_sm": 2, "blocks_per_sm": 2}  # one chain candidate per mode: 10 enqueued trials in all
PACE_S = 0.3  # a paced child's sleep after each trial's work: a search of 10 trials lasts 3 s, as llama-3.2-1b's did
# A child that signals itself at a point of the search: MKSIM_TEST_SIGNAL_AT = "<where>:<k>:<SIGNAL>" sends
# SIGNAL (SIGNAL*2: twice) at the k-th call of <where>: enqueue (after a baseline is enqueued), ask (after a
# trial is taken, before it names its process), simulate (inside a simulation: the fused trial's KV splits
# come first) or storage (as the storage is opened). MKSIM_TEST_PACE_S = "<s>" sleeps that long after each
# trial's work, before the trial ends (it runs, named, meanwhile). The hooks live here, not in mksim.
CHILD = r"""
import os, signal, sys, time
import optuna
from mksim.search import _study
where, k, sig = os.environ.get("MKSIM_TEST_SIGNAL_AT", "none:0:SIGINT").split(":")
pace = float(os.environ.get("MKSIM_TEST_PACE_S", "0"))
calls = [0]

if pace:
    work = _study._Objective.__call__
    def paced(self, trial):
        out = work(self, trial)
        time.sleep(pace)
        return out
    _study._Objective.__call__ = paced

def fire():
    calls[0] += 1
    if calls[0] == int(k):
        for _ in range(2 if sig.endswith("*2") else 1):  # SIGINT*2: Ctrl-C twice
            os.kill(os.getpid(), getattr(signal, sig.removesuffix("*2")))

def after(owner, name):
    orig = getattr(owner, name)
    def wrapped(*a, **kw):
        out = orig(*a, **kw)
        fire()
        return out
    setattr(owner, name, wrapped)

def before(owner, name):
    orig = getattr(owner, name)
    def wrapped(*a, **kw):
        fire()
        return orig(*a, **kw)
    setattr(owner, name, wrapped)

{"enqueue": lambda: after(optuna.study.Study, "enqueue_trial"), "ask": lambda: after(optuna.study.Study, "ask"),
 "simulate": lambda: before(_study, "simulate"), "storage": lambda: before(_study, "storage_for"),
 "none": lambda: None}[where]()
from mksim.cli import main
main(sys.argv[1:])
"""


# -- helpers ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def gpu_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("gpu") / "h200-16sm.toml"
    p.write_text(SMALL_GPU)
    return p


def fast(gpu_file: Path) -> list[str]:
    """The options of every part C search (and the cheap accepted rows): a tiny model, a small GPU, short KV,
    chains fixed."""
    return ["--model", MODEL, "--gpu", str(gpu_file), "--kv-len", "64",
            *[a for k, v in FIX.items() for a in ("--fix", f"{k}={v}")]]


def least_trials(gpu_file: Path) -> int:
    return len(baseline_params(hwmodels.load(str(gpu_file)), check_fixed(FIX)))


@pytest.fixture(scope="session")
def reference(gpu_file: Path) -> Callable[[int], dict[str, Any]]:
    """An uninterrupted search's result (best latency and baselines) for a batch, made once per worker."""
    made: dict[int, dict[str, Any]] = {}

    def get(batch: int) -> dict[str, Any]:
        if batch not in made:
            res = search(MODEL, str(gpu_file), batch=batch, kv_len=64, trials=least_trials(gpu_file),
                         storage="memory", fixed=dict(FIX))
            made[batch] = {"best": res.best["latency_us"],
                           "baselines": {k: v["latency_us"] for k, v in res.baselines.items()}}
        return made[batch]

    return get


def start(argv: list[str], signal_at: str | None = None, paced: bool = False) -> subprocess.Popen[str]:
    """``mksim argv`` as a child in a session of its own (so that a signal reaches it as Ctrl-C would); with
    ``signal_at`` or ``paced``, the hooks of CHILD."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "mksim", *argv]
    if signal_at or paced:
        env["MKSIM_TEST_SIGNAL_AT"] = signal_at or "none:0:SIGINT"
        env["MKSIM_TEST_PACE_S"] = str(PACE_S if paced else 0)
        cmd = [sys.executable, "-c", CHILD, *argv]
    return WarmChild(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     start_new_session=True, preexec_fn=as_from_a_terminal)


def finish(p: subprocess.Popen[str], timeout_s: float = CHILD_S) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=timeout_s)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, out, err


def wait_for(what: str, cond: Callable[[], bool], p: subprocess.Popen[str] | None = None,
             timeout_s: float = CHILD_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if p is not None and p.poll() is not None:
            pytest.fail(f"the search ended before {what}: {p.stderr.read() if p.stderr else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s} s")
        time.sleep(0.01)


def trials_of(db: Path, study: str = "s") -> list[Any]:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{db}").get_trials(deepcopy=False)


def finished(db: Path) -> dict[int, tuple[str, float | None]]:
    """Every finished trial of the study: number -> (state, latency)."""
    return {t.number: (t.state.name, t.user_attrs.get("latency_us")) for t in trials_of(db)
            if t.state.name in ("COMPLETE", "PRUNED")}


def assert_whole(db: Path, ref: dict[str, Any], gpu_file: Path) -> None:
    """No baseline lost: each enqueued trial has finished, none waits or runs, and the baselines and the best
    are an uninterrupted run's."""
    trials = trials_of(db)
    names = set(baseline_params(hwmodels.load(str(gpu_file)), check_fixed(FIX)))
    done = {t.user_attrs.get("baseline") for t in trials if t.state.name == "COMPLETE"}
    assert names <= done, f"baselines lost: {sorted(names - done)}"
    left = [(t.number, t.state.name) for t in trials if t.state.name in ("WAITING", "RUNNING")]
    assert not left, left
    lat = {t.user_attrs["baseline"]: t.user_attrs["latency_us"] for t in trials
           if t.state.name == "COMPLETE" and "baseline" in t.user_attrs}
    assert {k: lat[k] for k in ref["baselines"]} == ref["baselines"]
    assert min(t.user_attrs["latency_us"] for t in trials if t.state.name == "COMPLETE") == ref["best"]


def row(row_id: str) -> pytest.MarkDecorator:
    """A test of one row of the note: its pytest id starts with the row id (coverage is checked by id)."""
    return pytest.mark.parametrize("row", [row_id])


# -- part A: one line, before any work, no file destroyed ---------------------------------------------------
def _victim(path: Path) -> bytes:
    """An SQLite file standing for a study (any bytes do: the refusal comes before it is opened)."""
    with closing(sqlite3.connect(path)) as c, c:  # closed: see searchkit.count
        c.execute("CREATE TABLE notes (text)")
        c.execute("INSERT INTO notes VALUES ('a finished study')")
    return path.read_bytes()


@pytest.mark.parametrize("outputs", [
    pytest.param(["--out", "{v}"], id="A139-out-is-storage"),
    pytest.param(["--out", "{d}/./victim.db"], id="A139-out-is-storage-dot"),
    pytest.param(["--out", "{d}/link.db"], id="A139-out-is-storage-symlink"),
    pytest.param(["--report", "{v}"], id="A140-report-is-storage"),
    pytest.param(["--out", "{d}/best.json", "--report", "{d}/link.db"], id="A140-report-is-storage-symlink"),
])
def test_an_output_that_is_the_study_is_refused(outputs: list[str], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.db"
    before = _victim(victim)
    (tmp_path / "link.db").symlink_to(victim)
    argv = [a.replace("{v}", str(victim)).replace("{d}", str(tmp_path)) for a in outputs]
    code, _, err = run_cli(["search", "--trials", "30", "--storage", f"sqlite:///{victim}", *argv], capsys)
    assert_one_line(code, err, "is the study storage this command reads")
    assert victim.read_bytes() == before
    assert not (tmp_path / "best.json").exists()


@row("A139-out-is-the-default-storage")
def test_out_is_the_default_storage(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --storage the study is ``<study>.db`` here: that file is protected too."""
    monkeypatch.chdir(tmp_path)
    victim = tmp_path / "mine.db"
    before = _victim(victim)
    code, _, err = run_cli(["search", "--trials", "30", "--study", "mine", "--out", "mine.db"], capsys)
    assert_one_line(code, err, "study storage")
    assert victim.read_bytes() == before


@row("A168-out-is-report")
def test_out_and_report_are_one_file(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    both = tmp_path / "both.out"
    both.write_text("kept")
    code, _, err = run_cli(["search", "--trials", "30", "--storage", "memory", "--out", str(both),
                            "--report", str(both)], capsys)
    assert_one_line(code, err, "both name")
    assert both.read_text() == "kept"


@row("A168-report-is-the-gpu-file")
def test_gpu_file_is_an_input(row: str, gpu_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = gpu_file.read_bytes()
    code, _, err = run_cli(["search", "--storage", "memory", "--gpu", str(gpu_file), "--report", str(gpu_file)],
                           capsys)
    assert_one_line(code, err, "hardware file")
    assert gpu_file.read_bytes() == before


@pytest.mark.parametrize("argv,fragment", [
    pytest.param(["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295", id="A141-seed-negative"),
    pytest.param(["--seed", "1099511627776"], "--seed must be", id="A142-seed-2e40"),
    pytest.param(["--seed", "4294967296"], "--seed must be", id="A142-seed-2e32"),
    pytest.param(["--objective", "latency,latency"], "objectives: give", id="A145-objective-twice"),
    pytest.param(["--objective", "smem"], "objectives: give", id="A146-objective-smem-alone"),
    pytest.param(["--timeout", "0"], "--timeout must be a positive", id="A147-timeout-0"),
    pytest.param(["--timeout", "nan"], "--timeout must be a positive", id="A148-timeout-nan"),
    pytest.param(["--fix", "policy=zigzag"], "cannot fix 'policy'", id="A149-fix-policy"),
    pytest.param(["--fix", "sync=bogus"], "sync must be one of", id="A150-fix-sync-bogus"),
    pytest.param(["--fix", "page_KiB=nan"], "page_KiB needs a finite number", id="A151-fix-page-nan"),
    pytest.param(["--fix", "page_KiB=inf"], "page_KiB needs a finite number", id="A151-fix-page-inf"),
    pytest.param(["--fix", "prefetch_depth=inf"], "prefetch_depth needs an integer", id="A151-fix-depth-inf"),
    pytest.param(["--fix", "blocks_per_sm=0"], "--fix blocks_per_sm=0: blocks_per_sm must be at least 1",
                 id="A152-fix-blocks-0"),
    pytest.param(["--fix", "blocks_per_sm=1000"], "at most 32 blocks", id="A152-fix-blocks-1000"),
    pytest.param(["--fix", "tasks_per_sm=0"], "tasks_per_sm must be above 0", id="A152-fix-tasks-0"),
    pytest.param(["--fix", "prefetch_depth=0"], "prefetch_depth must be at least 1", id="A152-fix-depth-0"),
    pytest.param(["--fix", "dispatch=warp"], "dispatch must be one of", id="A152-fix-dispatch"),
    pytest.param(["--storage", "sqlite:///{d}/nodir/x.db"], "cannot open study storage", id="A153-sqlite-nodir"),
    pytest.param(["--fix", "page_KiB=1e9"], "227 KiB of shared memory a block may use on h200; give page_KiB <= 195",
                 id="A170-fix-page-1e9"),
    pytest.param(["--fix", "smem_reserve_KiB=300"], "give smem_reserve_KiB <= 219", id="A170-fix-reserve-300"),
    pytest.param(["--fix", "prefetch_depth=16", "--fix", "page_KiB=64"], "give page_KiB <= 12",
                 id="A170-fix-ring-too-big"),
])
def test_search_options_answer_in_one_line(argv: list[str], fragment: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a default storage must not land in the checkout
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    code, _, err = run_cli(["search", "--trials", "30", *argv], capsys)
    assert_one_line(code, err, fragment)
    assert not list(tmp_path.glob("*.db"))  # refused before a study was made


@row("A155-storage-is-a-text-file")
def test_storage_that_is_a_text_file_stays_intact(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("important notes\n")
    code, _, err = run_cli(["search", "--trials", "30", "--storage", f"sqlite:///{notes}"], capsys)
    assert_one_line(code, err, "file is not a database")
    assert notes.read_text() == "important notes\n"


@row("A169-study-with-a-slash")
def test_study_with_a_slash_is_one_line(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The default storage of study a/b/c is a/b/c.db, whose folder is missing: one line (the note about
    creating the storage is said only once it could be made)."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["search", "--trials", "30", "--study", "a/b/c"], capsys)
    assert_one_line(code, err, "cannot open study storage")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere: the row needs an ordinary user")
@row("A181-default-storage-in-ro-cwd")
def test_default_storage_in_a_read_only_folder(row: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    monkeypatch.chdir(ro)
    try:
        code, _, err = run_cli(["search", "--trials", "30"], capsys)
    finally:
        ro.chmod(0o755)
    assert_one_line(code, err, "cannot open study storage")


@row("A152-every-trial-pruned-names-the-fix")
def test_all_pruned_by_a_fix_names_the_fix(row: str, gpu_file: Path) -> None:
    """A fix that passes the up-front checks but prunes every trial: the answer names the fixed options."""
    from mksim.errors import MksimError
    from mksim.search import _study

    class Study:  # what summarize reads: one pruned trial, nothing complete
        study_name = "s"

        def get_trials(self, deepcopy: bool = False) -> list[Any]:
            t = optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED,
                                          user_attrs={"pruned_reason": "too big"})
            return [t]

    problem = _study.Problem("llama-3.2-1b", hwmodels.load(str(gpu_file)), fixed={"smem_reserve_KiB": 190.0})
    with pytest.raises(MksimError, match=r"every trial of study 's' was pruned: no schedule runs with "
                                         r"--fix smem_reserve_KiB=190 on h200-16sm \(too big\); change or drop"):
        _study.summarize(Study(), problem, ("latency",), "memory")


@pytest.mark.slow
@pytest.mark.parametrize("study,storage", [
    pytest.param("", "s.db", id="A143-study-empty"),
    pytest.param("s" * 10_000, "s.db", id="A144-study-10k-characters"),
    pytest.param("e", "empty.db", id="A154-storage-empty-file"),
])
def test_accepted_rows_still_work(study: str, storage: str, gpu_file: Path, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    """An empty --study takes the default name, a 10,000-character one is kept, an empty file becomes the study."""
    db = tmp_path / storage
    if storage == "empty.db":
        db.write_bytes(b"")
    code, out, err = run_cli(["search", *fast(gpu_file), "--trials", str(least_trials(gpu_file)), "--storage",
                              f"sqlite:///{db}", "--study", study, "--json"], capsys)
    assert code == 0, err
    default = f"{model_label(study_model(MODEL))}-h200-16sm-b1-kv64-latency-blocks_per_sm=2-tasks_per_sm=2"
    assert json.loads(out)["study"] == (study or default)
    assert optuna.get_all_study_names(f"sqlite:///{db}") == [study or default]


WORKER = r"""
import multiprocessing as mp, os, sys, time
from mksim.search import _study

def worker(parent, path):
    _study._die_with_parent(parent)
    with open(path, "w") as f:
        f.write(str(os.getpid()))
    with _study._sigint_noted(also_term=True) as got:  # as a worker's trials are: SIGTERM is noted
        while not got:
            time.sleep(0.01)
    sys.exit(130)

mp.get_context("fork").Process(target=worker, args=(os.getpid(), sys.argv[1])).start()
time.sleep(60)
"""


@row("A171-workers-die-with-their-parent")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_their_parent(row: str, tmp_path: Path) -> None:
    """The mechanism of C20, alone: a worker process gets SIGTERM when its parent is killed, and stops."""
    pid_file = tmp_path / "worker.pid"
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(pid_file)], cwd=ROOT, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for("the worker", lambda: pid_file.exists() and pid_file.read_text() != "", p, timeout_s=60)
        worker = int(pid_file.read_text())
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        wait_for("the worker's exit", lambda: not _study_alive(worker), timeout_s=10)
    finally:
        try:  # whatever of the session is left
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def _study_alive(pid: int) -> bool:
    from mksim.search._study import _alive

    return _alive(pid)


# -- part C: races, SIGKILL and Ctrl-C, then the same command again --------------------------------------------
def search_argv(db: Path, gpu_file: Path, batch: int = 1, trials: int | None = None,
                extra: tuple[str, ...] = ()) -> list[str]:
    return ["search", *fast(gpu_file), "--batch", str(batch), "--trials", str(trials or least_trials(gpu_file)),
            "--storage", f"sqlite:///{db}", "--study", "s", "--json", *extra]


def resume(db: Path, gpu_file: Path, trials: int | None = None) -> Any:
    """The same search again, in this process (what `mksim search` with the same options runs, without the
    second or so a child takes to start). Every process of the interrupted search has exited by now, so a
    trial it took but had not named yet is failed after 0.2 s instead of the 5 s a live process gets to
    name it (``OWNERLESS_WAIT_S``)."""
    from mksim.search import _study

    wait, _study.OWNERLESS_WAIT_S = _study.OWNERLESS_WAIT_S, 0.2
    try:
        return search(MODEL, str(gpu_file), kv_len=64, trials=trials or least_trials(gpu_file),
                      storage=f"sqlite:///{db}", study_name="s", fixed=dict(FIX))
    finally:
        _study.OWNERLESS_WAIT_S = wait


def race(tmp_path: Path, gpu_file: Path, ref: Callable[[int], dict[str, Any]], batches: tuple[int, int],
         stagger: bool = False) -> None:
    """Two searches on one study, started together (or the second once the first has made the study); paced, so
    that each lasts as long as llama-3.2-1b's did and the two overlap."""
    db = tmp_path / "race.db"
    a = start(search_argv(db, gpu_file, batches[0]), paced=True)
    if stagger:
        wait_for("the first search's study", lambda: count(db, ("WAITING", "RUNNING", "COMPLETE")) > 0, a)
    b = start(search_argv(db, gpu_file, batches[1]), paced=True)
    (ca, oa, ea), (cb, ob, eb) = finish(a), finish(b)
    trials = trials_of(db)
    if batches[0] != batches[1]:  # one clean refusal, and the study holds only the other's trials
        assert sorted([ca, cb]) == [0, 2], (ea, eb)
        won, out, err = (batches[0], oa, eb) if ca == 0 else (batches[1], ob, ea)
        assert_one_line(2, err, "pick another --study name")
        res = json.loads(out)
        assert sum(res["trials"].values()) == len(trials)  # the refused one added nothing
        assert res["best"]["latency_us"] == ref(won)["best"]
        assert optuna.load_study(study_name="s", storage=f"sqlite:///{db}").user_attrs["problem"]["batch"] == won
        assert {k: v["latency_us"] for k, v in res["baselines"].items()} == ref(won)["baselines"]
        assert not [t for t in trials if t.state.name in ("WAITING", "RUNNING", "FAIL")]
    else:  # both finish, each waits for the baselines the other runs: the same best, nothing lost or left
        assert (ca, cb) == (0, 0), (ea, eb)
        for out in (oa, ob):
            assert json.loads(out)["best"]["latency_us"] == ref(batches[0])["best"]
        assert_whole(db, ref(batches[0]), gpu_file)


@dataclass(frozen=True)
class Interrupt:
    """Where a search is interrupted: a hook in the child (``at``, see CHILD), or a signal to its process group
    once the study holds ``after`` finished trials."""
    sig: str
    at: str | None = None
    after: int | None = None


def interrupt_and_resume(tmp_path: Path, gpu_file: Path, ref: dict[str, Any], how: Interrupt) -> None:
    db = tmp_path / "k.db"
    argv = search_argv(db, gpu_file)
    p = start(argv, f"{how.at}:{how.sig}" if how.at else None, paced=how.after is not None)
    if how.after is not None:
        wait_for(f"{how.after} finished trials", lambda: count(db) >= how.after, p)
        os.killpg(p.pid, getattr(signal, how.sig))
    code, _, err = finish(p)
    if how.after is not None:  # the signal landed where the case says: after k trials, before the search's end
        landed = count(db, ("COMPLETE", "PRUNED"))
        assert how.after <= landed < least_trials(gpu_file) and code != 0, (landed, code, err[-2000:])
    if how.sig == "SIGKILL":
        assert code == -signal.SIGKILL, err[-2000:]
    elif code != 0:  # a Ctrl-C after the last trial may find the search done
        assert_one_line(code, err, "interrupted", status=130)
        assert "run the same command again to resume" in err
    kept = finished(db) if db.exists() and optuna.get_all_study_names(f"sqlite:///{db}") else {}
    assert resume(db, gpu_file).best["latency_us"] == ref["best"]
    now = finished(db)
    assert {n: now.get(n) for n in kept} == kept  # no finished trial lost or changed
    assert_whole(db, ref, gpu_file)


N_FUSED = 5  # simulations of the fused trial's KV splits, before the first trial's (KV_SPLIT_MULT)
C_RACES = {  # the race x4: another batch (either started first), then the same problem (together, and joining)
    "C1-race-other-batch": ((1, 8), False),
    "C2-race-other-batch-swapped": ((8, 1), False),
    "C3-race-same-problem": ((1, 1), False),
    "C4-race-same-problem-joining": ((1, 1), True),
}
C_INTERRUPTS = {
    # SIGKILL: at 0.9 and 1.3 s the note's searches were enqueueing their baselines (the lost-baselines bug);
    # at 1.7-3.0 s they ran trials, and one stayed running for good
    "C5-sigkill-0.9s-first-enqueue": Interrupt("SIGKILL", "enqueue:1"),
    "C6-sigkill-1.3s-mid-enqueue": Interrupt("SIGKILL", "enqueue:5"),
    "C7-sigkill-1.7s-first-trials": Interrupt("SIGKILL", after=1),
    "C8-sigkill-2.2s-trial-just-taken": Interrupt("SIGKILL", "ask:3"),  # it names no process yet
    "C9-sigkill-3.0s-mid-trial": Interrupt("SIGKILL", f"simulate:{N_FUSED + 6}"),
    # Ctrl-C (SIGINT) at ten points, from before the study exists to the last trials
    "C10-sigint-0.6s-opening-storage": Interrupt("SIGINT", "storage:1"),
    "C11-sigint-0.9s-before-a-trial": Interrupt("SIGINT", "simulate:1"),
    "C12-sigint-1.2s-first-enqueue": Interrupt("SIGINT", "enqueue:1"),
    "C13-sigint-1.5s-mid-enqueue": Interrupt("SIGINT", "enqueue:5"),
    "C14-sigint-1.8s-last-enqueue": Interrupt("SIGINT", "enqueue:10"),
    "C15-sigint-2.1s-trial-just-taken": Interrupt("SIGINT", "ask:1"),
    "C16-sigint-2.5s-mid-trial": Interrupt("SIGINT", f"simulate:{N_FUSED + 3}"),
    "C17-sigint-3.0s-after-3-trials": Interrupt("SIGINT", after=3),
    "C18-sigint-3.5s-near-the-end": Interrupt("SIGINT", after=8),
    # twice, inside a trial: the second Ctrl-C stops it at once (optuna fails it), still in one line
    "C19-sigint-4.5s-twice-mid-trial": Interrupt("SIGINT*2", f"simulate:{N_FUSED + 5}"),
}


def workers_parent_killed(tmp_path: Path, gpu_file: Path, ref: Callable[[int], dict[str, Any]]) -> None:
    """C20: SIGKILL of the parent of --workers 3: its workers finish their trial and exit (Linux), leaving no
    trial running, and the same study resumes whole."""
    db = tmp_path / "w.db"
    n = least_trials(gpu_file)
    p = start(search_argv(db, gpu_file, trials=n + 400, extra=("--workers", "3")))

    def alone() -> bool:  # no process of the search's session is left
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[3]) == p.pid and fields[0] not in ("Z", "X"):
                return False
        return True

    try:
        wait_for("trials of the workers", lambda: count(db) >= n + 3, p)
        os.kill(p.pid, signal.SIGKILL)  # the parent only, as `kill -9 $pid` does
        p.wait()
        wait_for("the workers' exit after their parent's death", alone, timeout_s=30)
    finally:
        if p.poll() is None or not alone():
            os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
    running = [(t.number, t.user_attrs.get("worker"), t.system_attrs, str(t.datetime_start)) for t in trials_of(db)
               if t.state.name == "RUNNING"]
    assert not running, (f"trials left running after the workers' exit (number, worker, system attrs, start): "
                         f"{running}; the search's stderr ends: {err[-1500:]!r}")
    kept = finished(db)
    best = resume(db, gpu_file, trials=len(kept) + 1).best["latency_us"]
    now = finished(db)
    assert {k: now.get(k) for k in kept} == kept
    assert best <= ref(1)["best"]  # sampled trials may beat the baselines
    names = set(baseline_params(hwmodels.load(str(gpu_file)), check_fixed(FIX)))
    assert names <= {t.user_attrs.get("baseline") for t in trials_of(db) if t.state.name == "COMPLETE"}


C_CASES = [*C_RACES, *C_INTERRUPTS, "C20-workers-parent-sigkill"]


def run_case(case: str, tmp_path: Path, gpu_file: Path, ref: Callable[[int], dict[str, Any]]) -> None:
    if case in C_RACES:
        batches, stagger = C_RACES[case]
        race(tmp_path, gpu_file, ref, batches, stagger)
    elif case in C_INTERRUPTS:
        interrupt_and_resume(tmp_path, gpu_file, ref(1), C_INTERRUPTS[case])
    else:
        workers_parent_killed(tmp_path, gpu_file, ref)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and /proc as on Linux")
@pytest.mark.parametrize("case", C_CASES)
def test_C_table(case: str, tmp_path: Path, gpu_file: Path, reference: Callable[[int], dict[str, Any]]) -> None:
    run_case(case, tmp_path, gpu_file, reference)


@pytest.mark.slow
@pytest.mark.skipif(C_TABLE_REPEATS == 0, reason="MKSIM_C_TABLE_REPEATS=20 runs the table 20 times in a row "
                                                 "(75 s of CPU a repetition, 2 minutes on 2 loaded cores)")
def test_C_table_many_times_in_a_row(tmp_path: Path, gpu_file: Path,
                                     reference: Callable[[int], dict[str, Any]]) -> None:
    for rep in range(C_TABLE_REPEATS):
        for case in C_CASES:
            d = tmp_path / f"{rep}-{case}"
            d.mkdir()
            try:
                run_case(case, d, gpu_file, reference)
            except BaseException as exc:
                raise AssertionError(f"repetition {rep + 1} of {C_TABLE_REPEATS}, {case}: {exc}") from exc
