"""The Search page in a real headless Chromium: a search started, followed live and opened in Timeline, and one
cancelled (searches that outlive a restart of the explorer: test_restart.py).

The search the page follows to its end runs on the a100: a study starts with its baselines, 16 there and 26 on
the h200 (ten graph_pdl chains the a100 cannot run), so a finished study is 16 trials, 6 s of CPU instead of
10; the page is the same.
"""

from __future__ import annotations

import pytest

pytest.importorskip("dash")
# a server, a real browser and searches; one browser and server for every module (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

from tests.explorer.browser.drive import (  # noqa: E402
    click,
    figure,
    nav,
    pick,
    search_page,
    shot,
    text,
    type_in,
    wait,
)


def test_search_runs_live_and_opens_its_best_in_timeline(browser, server):
    search_page(browser, server)
    wait(browser, lambda d: text(d, "search-hint").startswith("Start a search or open a study"), "the hint")
    assert not browser.find_element("id", "search-figures").is_displayed()  # no empty axes before a study
    pick(browser, "search-gpu", "a100")
    type_in(browser, "search-trials", "16")
    pick(browser, "search-objectives", "latency,smem")
    click(browser, "search-start")
    wait(browser, lambda d: "running" in text(d, "search-progress") or "starting" in text(d, "search-progress"),
         "the search to run")
    progress = wait(browser, lambda d: "best found: " in text(d, "search-progress") and text(d, "search-progress"),
                    "the search to end")
    assert progress.startswith("16 / 16 trials finished") and text(browser, "search-message") == ""
    assert wait(browser, lambda d: figure(d, "search-pareto"), "the Pareto front")[-1][0] == "Pareto front"
    shot(browser, "search")
    click(browser, "search-best")
    summary = wait(browser, lambda d: text(d, "timeline-summary").startswith("schedule from Search: ")
                   and text(d, "timeline-summary"), "the best schedule on Timeline")
    assert "/timeline?schedule=" in browser.current_url and " on a100, " in summary
    best = progress.split("best found: ")[1].split(" µs")[0]
    assert f", {best} µs, " in summary  # the best trial's latency, simulated again

    # the study opens again from the list of the storage's studies, no name typed
    nav(browser, "Search")
    wait(browser, lambda d: "latency+smem" in text(d, "search-studies"), "the study in the list")
    click(browser, "search-open")
    wait(browser, lambda d: text(d, "search-progress").startswith("16 trials finished"), "the opened study")
    assert text(browser, "search-message") == "" and browser.find_element("id", "search-figures").is_displayed()


def test_search_cancel(browser, server):
    """A search started from the page stops on Cancel search; the page says so (from the page the test before
    left, if it is the Search page)."""
    search_page(browser, server, fresh=False)
    type_in(browser, "search-trials", "2000")
    click(browser, "search-start")
    wait(browser, lambda d: "running" in text(d, "search-progress"), "the search to run")
    click(browser, "search-cancel")
    wait(browser, lambda d: text(d, "search-cancel-message") == "search cancelled", "the cancel")
    wait(browser, lambda d: "; cancelled — study " in text(d, "search-progress"), "the progress to say cancelled")
    assert text(browser, "search-message") == ""
