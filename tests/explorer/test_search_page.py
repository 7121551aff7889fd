"""The Search page: searches started, followed, cancelled and listed, studies opened, their data and figures,
with the page's callbacks called directly."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("dash")
pytest.importorskip("optuna")

from dash import no_update  # noqa: E402

from explorer import data, figures, jobs  # noqa: E402
from mksim.errors import MksimError  # noqa: E402


# -- Search ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A two-objective search started from the page and followed by polling until it ends: on the a100, whose
    16 baselines (the h200 has ten graph_pdl chains more) make a study of 16 trials."""
    from explorer.pages.search import poll, start_or_open

    db = tmp_path_factory.mktemp("search") / "studies.db"
    old = os.environ.get("MKSIM_EXPLORER_STORAGE")
    os.environ["MKSIM_EXPLORER_STORAGE"] = str(db)  # the module's storage (mksim explore --storage)
    t0 = time.monotonic()
    job = start_or_open("search-start", "llama-3.2-1b", "a100", 1, 1024, 16, "latency,smem", "")
    started_s = time.monotonic() - t0
    polls = []
    while time.monotonic() - t0 < 180:
        out = poll(job, polls[-1][-1] if polls else None)
        polls.append(out)
        if out[5]:  # polling disabled: the search ended
            break
        time.sleep(0.5)
    _until_exited(job)
    yield {"job": job, "polls": polls, "started_s": started_s, "db": db}
    if old is None:
        del os.environ["MKSIM_EXPLORER_STORAGE"]
    else:
        os.environ["MKSIM_EXPLORER_STORAGE"] = old


@pytest.mark.slow  # 14.3 s of CPU
def test_search_starts_in_the_background_and_is_followed_live(study):
    job, polls = study["job"], study["polls"]
    assert set(job) == {"job", "storage", "study", "trials"}
    assert job["study"] == "llama-3.2-1b-a100-b1-kv1024-latency+smem"
    assert study["started_s"] < 5  # the page answers before the study has run
    assert polls[0][5] is False  # the first poll finds it running
    assert any("running" in p[1] for p in polls[:-1]) or any("starting" in p[1] for p in polls[:-1])
    msg, progress, *figs, disabled, seen = polls[-1]
    assert msg == "" and disabled and progress.startswith("16 / 16 trials finished")
    assert "best found: " in progress
    assert jobs.job_state(job["job"]) == ("done", "")


@pytest.mark.slow  # reads the module's search (16 trials in a background job: ~6 s of CPU)
def test_study_data(study):
    d = data.study_data(study["job"]["storage"], study["job"]["study"])
    assert d["objectives"] == ["latency", "smem"] and d["finished"] == 16
    assert sum(d["counts"].values()) == len(d["trials"]) == 16
    done = [r for r in d["trials"] if r["state"] == "COMPLETE"]
    assert d["best"]["latency_us"] == min(r["latency_us"] for r in done)
    front = [r for r in done if r["number"] in d["pareto"]]
    assert front and all(not any(o["latency_us"] <= r["latency_us"] and o["smem_KiB"] <= r["smem_KiB"]
                                 and (o["latency_us"], o["smem_KiB"]) != (r["latency_us"], r["smem_KiB"])
                                 for o in done) for r in front)
    assert {"policy", "page_KiB", "prefetch_depth"} <= set(d["params"])
    assert data.study_data(str(study["db"]), study["job"]["study"])["finished"] == 16  # a plain path opens it too


@pytest.mark.slow  # reads the module's search (16 trials in a background job: ~6 s of CPU)
def test_study_figures(study):
    d = data.study_data(study["job"]["storage"], study["job"]["study"])
    hist = figures.study_history_figure(d)
    best = hist.data[-1]
    assert best.name == "best so far" and list(best.y) == sorted(best.y, reverse=True)
    assert best.y[-1] == pytest.approx(d["best"]["latency_us"])
    assert {t.name for t in hist.data[:-1]} == {r["mode"] for r in d["trials"] if r["state"] == "COMPLETE"}
    par = figures.study_parallel_figure(d)
    assert [dim.label for dim in par.data[0].dimensions] == d["params"] + ["latency µs"]
    pf = figures.study_pareto_figure(d)
    assert [t.name for t in pf.data] == ["trials", "Pareto front"] and len(pf.data[1].x) == len(d["pareto"])
    one = dict(d, objectives=["latency"], pareto=[])
    assert len(figures.study_pareto_figure(one).data) == 0


@pytest.mark.slow  # reads the module's search (16 trials in a background job: ~6 s of CPU)
def test_open_best_in_timeline(study):
    from explorer.pages.search import open_best
    from explorer.pages.timeline import show_timeline

    href, msg = open_best(1, study["job"])
    assert msg == "" and href.startswith("/timeline?schedule=")
    token = href.split("=", 1)[1]
    msg, summary, fig, sched = show_timeline(None, None, None, None, None, None, None, None, token=token)
    best = data.study_data(study["job"]["storage"], study["job"]["study"])["best"]
    assert msg == "" and f"{best['latency_us']:.1f} µs" in summary  # the best trial's latency, reproduced
    assert open_best(1, None)[1] == "start a search or open a study first"
    assert open_best(0, study["job"]) == (no_update, "")


@pytest.mark.slow  # reads the module's search (16 trials in a background job: ~6 s of CPU)
def test_open_existing_study(study):
    from explorer.pages.search import poll, start_or_open

    job = start_or_open("search-open", None, None, None, None, None, None, study["job"]["study"])
    assert job["job"] is None
    msg, progress, hist, par, pf, disabled, seen = poll(job)
    assert msg == "" and disabled and progress.startswith("16 trials finished") and len(hist.data) > 0
    # polling again with nothing new leaves the figures alone
    assert poll(job, seen)[2] is no_update


def test_figures_of_a_running_study_are_redrawn_every_few_seconds(tmp_path, monkeypatch):
    """While a study runs the progress line follows every poll, the figures at most every REDRAW_S seconds
    (a redraw costs the browser CPU and resets a zoom); the study's end is drawn at once."""
    import optuna

    from explorer.pages import search

    db = tmp_path / "s.db"
    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(db))
    st = optuna.create_study(storage=f"sqlite:///{db}", study_name="live")
    st.tell(st.ask(), 5.0)
    running = st.ask()  # a trial still running (a mksim search elsewhere filling the study): followed live
    job = search.start_or_open("search-open", *[None] * 6, "live")
    first = search.poll(job)
    assert first[1].startswith("1 trials finished") and first[1].endswith("running… — study live")
    assert first[2] is not no_update and first[5] is False
    st.tell(st.ask(), 4.0)
    again = search.poll(job, first[-1])
    assert again[1].startswith("2 trials finished") and all(f is no_update for f in again[2:5])
    assert again[-1] == first[-1]  # still what was drawn last
    monkeypatch.setattr(search, "REDRAW_S", 0.0)
    redrawn = search.poll(job, again[-1])
    assert redrawn[2] is not no_update and redrawn[-1][2] == 2
    monkeypatch.setattr(search, "REDRAW_S", 3600.0)
    st.tell(running, 3.0)  # the last trial ends: drawn at once, polling stops
    last = search.poll(job, redrawn[-1])
    assert last[5] is True and last[2] is not no_update and last[1].startswith("3 trials finished")
    assert search.poll(job, last[-1])[2] is no_update
    assert search.poll(job, ["hostile", 1, 2, 3, 4, "x"])[2] is not no_update  # a seen it did not make: drawn


def test_open_study_from_the_list_or_the_only_one(tmp_path, monkeypatch):
    """"Open study" without a typed name: the study chosen in the list, else the storage's only study."""
    import optuna

    from explorer.pages.search import start_or_open, study_choices

    db = tmp_path / "s.db"
    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(db))
    assert study_choices() == ([], None)  # no file yet: nothing to list, no error
    assert "no study in sqlite:///" in start_or_open("search-open", *[None] * 6, "")["error"]
    optuna.create_study(storage=f"sqlite:///{db}", study_name="only")
    assert study_choices() == (["only"], "only")
    assert start_or_open("search-open", *[None] * 6, "")["study"] == "only"
    optuna.create_study(storage=f"sqlite:///{db}", study_name="another")
    assert study_choices() == (["another", "only"], None)
    assert start_or_open("search-open", *[None] * 6, " ", "another")["study"] == "another"
    assert start_or_open("search-open", *[None] * 6, "only", "another")["study"] == "only"  # typed wins
    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path))
    assert study_choices() == ([], None)  # unreadable storage


@pytest.mark.slow  # reads the module's search (16 trials in a background job: ~6 s of CPU)
def test_figures_hidden_until_a_study_is_drawn(study):
    """No empty untitled axes before a study is open: the figures show once poll has drawn trials."""
    from explorer.pages.search import HIDDEN, NO_STUDY, figures_shown, poll

    assert figures_shown(poll(None)[-1]) == (HIDDEN, NO_STUDY)
    assert figures_shown(poll({"error": "x"})[-1]) == (HIDDEN, NO_STUDY)
    assert figures_shown(poll(study["job"])[-1]) == ({}, "")


@pytest.mark.parametrize("args,match", [
    (("llama-3.2-1b", "h200-datasheet", 0, 1024, 30, "latency"), "batch must be a positive integer"),
    (("llama-3.2-1b", "h200-datasheet", 1, 1024, 3, "latency"), "trials must be at least 26"),
    (("llama-3.2-1b", "h900", 1, 1024, 30, "latency"), "unknown GPU"),
    (("gpt-9", "h200-datasheet", 1, 1024, 30, "latency"), "unknown model"),
    (("llama-3.2-1b", "h200-datasheet", "x", 1024, 30, "latency"), "batch must be a whole number"),
    (("llama-3.2-1b", "h200-datasheet", 1, 1024, 30, "smem"), "objectives"),
    (("llama-3.2-1b", "h200-datasheet", 1, 1024, 10**12, "latency"), "trials must be at most 2000"),
    (("llama-3.2-1b", "/etc/passwd", 1, 1024, 30, "latency"), "unknown GPU '/etc/passwd': choose one of"),
])
def test_search_bad_input_answers_at_once(args, match, tmp_path, monkeypatch):
    from explorer.pages.search import poll, start_or_open

    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path / "s.db"))
    job = start_or_open("search-start", *args, "")
    assert set(job) == {"error"} and match in job["error"]
    msg, progress, *figs, disabled, _ = poll(job)
    assert msg.startswith("error: ") and "\n" not in msg and disabled and all(len(f.data) == 0 for f in figs)


@pytest.mark.slow  # reads the module's search (16 trials in a background job: ~6 s of CPU)
def test_open_study_errors(study, tmp_path, monkeypatch):
    import optuna

    from explorer.pages.search import poll, start_or_open

    empty = tmp_path / "empty.db"
    optuna.create_study(storage=f"sqlite:///{empty}", study_name="a")
    optuna.create_study(storage=f"sqlite:///{empty}", study_name="b")
    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(empty))
    assert "choose the study to open in the list (2 studies in sqlite:///" \
        in start_or_open("search-open", None, None, None, None, None, None, " ")["error"]
    for storage, name, match in ((str(tmp_path / "none.db"), "x", "no study storage at"),
                                 (str(study["db"]), "nope", "no study 'nope' in sqlite:///"),
                                 (str(study["db"]), "../../x.db", "no study '../../x.db' in sqlite:///")):
        monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", storage)
        msg = poll(start_or_open("search-open", None, None, None, None, None, None, name))[0]
        assert msg.startswith("error: ") and match in msg and "\n" not in msg
    assert poll(None)[5] is True


def _until_exited(job: dict) -> None:
    """Wait until the search's worker has exited (its lock is free; it writes its outcome just before) and
    collect it, so that its CPU counts in the test that ran it (tests/cputime.py), not the next one."""
    import fcntl

    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:
        try:
            with open(jobs.jobs_dir() / job["job"] / "lock") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except FileNotFoundError:
            break
        except OSError:
            time.sleep(0.05)
    jobs.list_jobs()  # collects the exit status of this process's workers that ended


def _pid(job: str) -> int:
    return json.loads((jobs.jobs_dir() / job / "job.json").read_text())["pid"]


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _until_trials(job, at_least: int = 1) -> None:
    """Wait until the followed search has finished ``at_least`` trials (it is cancelled mid-study then)."""
    from explorer.pages.search import poll

    t0 = time.monotonic()
    while time.monotonic() - t0 < 90:
        progress = poll(job)[1]
        if "trials finished" in progress and int(progress.split(" ")[0]) >= at_least:
            return
        time.sleep(0.3)
    pytest.fail(f"no finished trial in 90 s: {poll(job)}")


@pytest.mark.slow  # 6.4 s of CPU
def test_search_limit_and_cancel(tmp_path, monkeypatch):
    """Beyond MAX_RUNNING searches a new one is refused in one line; Cancel terminates the worker."""
    from explorer.pages.search import cancel_search, poll, start_or_open

    monkeypatch.setattr(jobs, "MAX_RUNNING", 1)
    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path / "s.db"))
    args = ("llama-3.2-1b", "h200-datasheet", 1, 1024, 2000, "latency")
    first = start_or_open("search-start", *args, "first")
    assert jobs.running_jobs() == [first["job"]]
    refused = start_or_open("search-start", *args, "second")
    assert refused == {"error": "1 searches are running already (at most 1 at once): wait for one to end or "
                                "cancel it"}
    _until_trials(first)  # cancelled mid-study
    pid = _pid(first["job"])
    assert cancel_search(1, first) == "search cancelled"
    assert not _alive(pid) and jobs.job_state(first["job"]) == ("cancelled", "the search was cancelled")
    assert cancel_search(1, first) == "no running search to cancel" and cancel_search(0, first) == ""
    assert cancel_search(1, None) == "no running search to cancel"
    msg, progress, *_figs, disabled, _seen = poll(first)
    assert msg == "" and disabled and progress.endswith(f"; cancelled — study {first['study']}")
    second = start_or_open("search-start", *args, "second")  # the slot is free again
    assert "error" not in second and cancel_search(1, second) == "search cancelled"
    assert jobs.running_jobs() == []


@pytest.mark.slow  # 8.7 s of CPU
def test_search_survives_a_restart_and_is_cancelled_by_the_next_server(tmp_path, monkeypatch):
    """A search goes on when its server stops: another server process (the same registry) lists it as
    running, follows it and cancels it; its finished trials stay in the study. The other process starts with
    the search (its imports and the search's first trial side by side) and waits for a finished trial: the
    search is cancelled mid-study as soon as it can be, not after the seconds of that process's start."""
    import subprocess
    import sys

    from explorer.pages.search import start_or_open

    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path / "s.db"))
    job = start_or_open("search-start", "llama-3.2-1b", "h200-datasheet", 1, 1024, 2000, "latency", "restart")
    code = """if True:
        import json, sys, time
        from explorer import jobs
        from explorer.pages.search import jobs_rows, poll
        followed = jobs.follow(sys.argv[1])
        t0 = time.monotonic()
        while time.monotonic() - t0 < 90:  # until the search has finished a trial
            progress = poll(followed)[1]
            if "trials finished" in progress and int(progress.split(" ")[0]) >= 1:
                break
            time.sleep(0.1)
        listed = {j["job"]: j["state"] for j in jobs.list_jobs()}
        print(json.dumps({"listed": listed, "followed": followed, "progress": progress,
                          "rows": jobs_rows(), "cancel": jobs.cancel(sys.argv[1]),
                          "after": jobs.job_state(sys.argv[1])}))
    """
    r = subprocess.run([sys.executable, "-c", code, job["job"]], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["listed"][job["job"]] == "running" and got["followed"] == job
    assert "running…" in got["progress"] and int(got["progress"].split(" ")[0]) >= 1
    assert got["cancel"] == "search cancelled"
    assert [row for row in got["rows"] if row[0] == job["job"]][0][1:3] == ["restart", "2000"]
    assert got["after"] == ["cancelled", "the search was cancelled"]
    assert jobs.job_state(job["job"]) == ("cancelled", "the search was cancelled")  # here too
    d = data.study_data(job["storage"], job["study"])
    assert d["finished"] >= 1  # the trials it finished are kept


@pytest.mark.slow  # 4.0 s of CPU
def test_a_search_whose_process_died_is_stopped(tmp_path, monkeypatch):
    """A worker killed without a word (kill -9, out of memory) reads as stopped, not running nor failed;
    its finished trials stay in the study and the page says so."""
    import os
    import signal

    from explorer.pages.search import cancel_search, poll, start_or_open

    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path / "s.db"))
    job = start_or_open("search-start", "llama-3.2-1b", "h200-datasheet", 1, 1024, 2000, "latency", "killed")
    _until_trials(job)
    pid = _pid(job["job"])
    os.killpg(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while jobs.job_state(job["job"])[0] == "running" and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    assert jobs.job_state(job["job"]) == ("stopped", jobs.STOPPED)
    assert job["job"] not in jobs.running_jobs()
    msg, progress, *_figs, disabled, _seen = poll(job)
    assert msg == "" and disabled and f"; stopped: {jobs.STOPPED} — study killed" in progress
    assert int(progress.split(" ")[0]) >= 1
    assert cancel_search(1, job) == "no running search to cancel"


@pytest.mark.slow  # 2.8 s of CPU
def test_jobs_list_and_follow(study, tmp_path, monkeypatch):
    """The page's list of searches: one row each, newest first, a failed one with its line; Follow
    follows a listed search; the registry forgets the oldest ended ones beyond KEEP_JOBS. The searches fail
    in their worker: a study named for another problem, which the worker's search refuses to resume; the
    page says why in one line."""
    from explorer.pages.search import jobs_rows, jobs_table, poll, start_or_open

    monkeypatch.setenv("MKSIM_EXPLORER_JOBS", str(tmp_path / "jobs"))
    monkeypatch.setattr(jobs, "KEEP_JOBS", 2)
    assert jobs.list_jobs() == [] and jobs_table(jobs_rows()) == ""
    made = []
    for _ in range(3):  # searches that fail in their worker at once: the study was made for batch 1
        job = start_or_open("search-start", "llama-3.2-1b", "a100", 2, 1024, 16, "latency,smem",
                            study["job"]["study"])
        assert "error" not in job
        made.append(job["job"])
        t0 = time.monotonic()
        while jobs.job_state(job["job"])[0] == "running" and time.monotonic() - t0 < 120:
            time.sleep(0.2)
        _until_exited(job)
    assert made == ["search-1", "search-2", "search-3"]
    msg = poll(job)[0]
    assert msg.startswith("error: ") and "searches" in msg and "pick another --study name" in msg and "\n" not in msg
    listed = jobs.list_jobs()
    assert [j["job"] for j in listed] == ["search-3", "search-2"]  # search-1 forgotten when search-3 started
    assert not (jobs.jobs_dir() / "search-1").exists()
    rows = jobs_rows(listed)
    assert [r[:3] for r in rows] == [[j, study["job"]["study"], "16"] for j in ("search-3", "search-2")]
    assert all(r[4].startswith("failed: ") and "pick another --study name" in r[4] for r in rows)
    table = jobs_table(rows)
    assert "at most 2 run at once" in table.children[0].children
    assert start_or_open({"type": "search-follow", "job": "search-3"}, *(None,) * 8) == {
        "job": "search-3", "storage": study["job"]["storage"], "study": study["job"]["study"], "trials": 16}
    assert start_or_open({"type": "search-follow", "job": "search-99"}, *(None,) * 8) == {
        "error": f"no search 'search-99' in {jobs.jobs_dir()}"}
    assert jobs.job_state("search-99") == ("none", "") and jobs.job_state("../x") == ("none", "")


def test_a_storage_is_opened_once_and_read_as_it_is_now(tmp_path, monkeypatch):
    """The page reads a followed study every second: its storage is opened (its schema checked) once, and each
    read sees the file as it is now, a file deleted and made again included."""
    import optuna

    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    real, opened = optuna.storages.RDBStorage, []

    class Counted(real):
        def __init__(self, url, *args, **kw):
            opened.append(url)
            super().__init__(url, *args, **kw)

    optuna.create_study(storage=real(url), study_name="a")
    monkeypatch.setattr(optuna.storages, "RDBStorage", Counted)
    for _ in range(3):
        assert data.study_names(str(db)) == ["a"] and data.study_data(str(db), "a")["finished"] == 0
    assert opened == [url]
    db.unlink()
    optuna.create_study(storage=real(url), study_name="b")
    assert data.study_names(str(db)) == ["b"] and opened == [url]  # no connection kept to the old file
    db.unlink()
    db.write_bytes(b"")  # an empty file: the kept storage fails, is opened anew, which makes the tables
    assert data.study_names(str(db)) == [] and opened == [url, url]
    db.write_text("not a database")
    with pytest.raises(MksimError, match="cannot open study storage .*: .*file is not a database"):
        data.study_names(str(db))


def test_a_new_sqlite_storage_read_while_it_is_made_is_retried(tmp_path, monkeypatch):
    """The page reads a search's new SQLite storage while its worker makes it: the two race to create the
    tables, and SQLite's loser fails on alembic_version ("UNIQUE constraint failed"; seen in the browser
    test, the search then failed at once). The worker tries again and finds the tables made."""
    import optuna

    from mksim.search import _study

    real, calls = optuna.storages.RDBStorage, []

    def raced(*args, **kw):
        calls.append(args[0])
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.IntegrityError) UNIQUE constraint failed: alembic_version.version_num")
        return real(*args, **kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", raced)
    monkeypatch.setattr(_study.time, "sleep", lambda s: None)
    url, storage = _study.storage_for(f"sqlite:///{tmp_path / 's.db'}", "s")
    assert len(calls) == 2 and isinstance(storage, real)


def test_routing_is_on_for_a_mixture_of_experts_only():
    from explorer.pages.search import routing_off

    assert routing_off("llama-3.2-1b") and routing_off("gpt-9") and routing_off(None)
    assert not routing_off("olmoe-1b-7b")
    # the routing names the default study: a search with another routing is another study
    assert jobs.check_search("olmoe-1b-7b", "a100", 1, 1024, 40, "latency", "zipf:1.2") == \
        "olmoe-1b-7b-a100-b1-kv1024-latency-routing=zipf:1.2"
    assert jobs.check_search("olmoe-1b-7b", "a100", 1, 1024, 40, "latency") == "olmoe-1b-7b-a100-b1-kv1024-latency"


def test_a_bad_routing_is_one_line_before_any_search(tmp_path, monkeypatch):
    from explorer.pages.search import start_or_open

    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path / "s.db"))
    got = start_or_open("search-start", "olmoe-1b-7b", "a100", 1, 1024, 40, "latency", "", None, "/etc/passwd")
    assert got == {"error": "routing '/etc/passwd': give uniform or zipf:S (S > 0, 1.2 is typical)"}
    assert jobs.running_jobs() == [] and not (tmp_path / "s.db").exists()


@pytest.mark.slow
def test_a_search_of_a_mixture_of_experts_records_its_routing(tmp_path, monkeypatch):
    """The routing chosen on the page is the study's (mksim search --routing): recorded in its problem, so
    that resuming it with another is refused; a dense model searched with a routing ignores it."""
    import optuna

    from explorer.pages.search import cancel_search, start_or_open

    monkeypatch.setenv("MKSIM_EXPLORER_STORAGE", str(tmp_path / "s.db"))
    job = start_or_open("search-start", "olmoe-1b-7b", "a100", 1, 1024, 2000, "latency", "", None, "zipf:1.2")
    assert job["study"] == "olmoe-1b-7b-a100-b1-kv1024-latency-routing=zipf:1.2"
    _until_trials(job)
    assert cancel_search(1, job) == "search cancelled"
    problem = optuna.load_study(study_name=job["study"], storage=job["storage"]).user_attrs["problem"]
    assert problem["routing"] == "zipf:1.2" and problem["model"] == "olmoe-1b-7b"
    dense = start_or_open("search-start", "llama-3.2-1b", "a100", 1, 1024, 2000, "latency", "", None, "zipf:1.2")
    assert dense["study"] == "llama-3.2-1b-a100-b1-kv1024-latency"  # no router: the routing is not asked
    assert cancel_search(1, dense) == "search cancelled"
