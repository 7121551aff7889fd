"""Searches that outlive a restart of the explorer, in a real headless Chromium: ``mksim explore`` stopped with
Ctrl-C and started again, its list of searches, a search followed and cancelled from the new server.

It starts servers of its own (the browser is the one every browser module shares).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("dash")
# servers, a real browser and searches; one browser and server for every module (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

from tests.explorer.browser.drive import (  # noqa: E402
    click,
    explore,
    free_port,
    search_page,
    shot,
    text,
    type_in,
    wait,
)


def _job_states(driver) -> dict[str, str]:
    """The Search page's list of searches: ``{job: state}``."""
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#search-jobs-table tbody tr')].map(r => "
        "[r.querySelector('td').innerText, r.querySelector('.search-job-state').innerText]));")


def _follow(driver, job: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, f"search-jobs-{job}").find_element(By.TAG_NAME, "button").click()


def test_search_survives_a_restart(browser, tmp_path):
    """Searches go on when the explorer stops (Ctrl-C) and the next one lists them with their state: one
    running (followed and cancelled from the new server), one whose process was killed meanwhile (stopped,
    its finished trials kept); a third is refused while two run."""
    from explorer import jobs

    old_registry = os.environ["MKSIM_EXPLORER_JOBS"]
    os.environ["MKSIM_EXPLORER_JOBS"] = str(tmp_path / "jobs")  # a registry of its own: the searches below only
    port = free_port()
    try:
        with explore(port, tmp_path / "explore-before-restart.log", stop=signal.SIGINT,
                     storage=tmp_path / "restart.db") as url:
            search_page(browser, url)
            type_in(browser, "search-trials", "2000")
            for name in ("kept", "killed", "third"):
                type_in(browser, "search-study", name)
                click(browser, "search-start")
                if name == "third":
                    wait(browser, lambda d: text(d, "search-message").startswith("error: 2 searches are running "
                                                                                   "already"), "the refusal")
                else:
                    wait(browser, lambda d, n=name: "running" in text(d, "search-progress")
                         and f"study {n}" in text(d, "search-progress"), f"search {name} to run")
            states = wait(browser, lambda d: len(_job_states(d)) == 2 and _job_states(d), "the list of searches")
            assert states == {"search-2": "running", "search-1": "running"}
        assert "2 search(es) still run (search-2, search-1)" in (tmp_path / "explore-before-restart.log").read_text()
        killed = json.loads((tmp_path / "jobs" / "search-2" / "job.json").read_text())
        os.killpg(killed["pid"], signal.SIGKILL)  # while no server runs
        deadline = time.monotonic() + 30
        while "search-2" in jobs.running_jobs() and time.monotonic() < deadline:  # until the kernel has ended it
            time.sleep(0.1)
        assert jobs.running_jobs() == ["search-1"]

        with explore(port, tmp_path / "explore-after-restart.log", storage=tmp_path / "restart.db") as url:
            browser.get(url + "/search")
            states = wait(browser, lambda d: len(_job_states(d)) == 2 and _job_states(d), "the list after restart")
            assert states == {"search-2": "stopped", "search-1": "running"}
            shot(browser, "search-jobs", docs=False)
            _follow(browser, "search-1")
            wait(browser, lambda d: "running…" in text(d, "search-progress")
                 and text(d, "search-progress").endswith("study kept"), "the re-attached search")
            click(browser, "search-cancel")
            wait(browser, lambda d: text(d, "search-cancel-message") == "search cancelled", "the cancel")
            wait(browser, lambda d: "; cancelled — study kept" in text(d, "search-progress"), "cancelled")
            wait(browser, lambda d: _job_states(d).get("search-1") == "cancelled", "the list to say cancelled")
            _follow(browser, "search-2")
            progress = wait(browser, lambda d: "; stopped: " in text(d, "search-progress")
                            and text(d, "search-progress"), "the stopped search")
            assert progress.endswith("— study killed") and text(browser, "search-message") == ""
        assert jobs.running_jobs() == []
    finally:
        for job in jobs.running_jobs():
            jobs.cancel(job)
        os.environ["MKSIM_EXPLORER_JOBS"] = old_registry
