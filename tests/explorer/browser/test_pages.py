"""The Timeline, Validation and Hardware pages in a real headless Chromium, and the page an unknown path shows."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("dash")
# a server and a real browser; one browser and server for every module (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

from tests.explorer.browser.drive import (  # noqa: E402
    MODES,
    figure,
    nav,
    open_page,
    pick,
    rows,
    shot,
    text,
    upload,
    wait,
)


def _tracks(driver, graph_id: str) -> int | None:
    """How many SM tracks a Timeline chart draws: distinct rows of its bars' hover points."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "if (!e || !e.data || !e.data.length) return null;"
        "const rows = new Set();"
        "for (const t of e._fullData) if (t.mode === 'markers') for (const y of t.y) rows.add(Math.round(y));"
        "return rows.size;", f"#{graph_id}")


def test_timeline_one_track_per_sm(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    from tests.explorer.test_hostile_http import SCHEDULE

    browser.get(server + "/timeline")
    summary = wait(browser, lambda d: text(d, "timeline-summary"), "the first timeline")
    assert summary.startswith("default schedule: llama-3.2-1b decode b1 kv1024 on h200, megakernel")
    assert " on 132 SMs" in summary
    assert wait(browser, lambda d: _tracks(d, "timeline-graph"), "the chart") == 132  # every h200 SM runs tasks
    shot(browser, "timeline")
    pick(browser, "timeline-gpu", "a100")  # no PDL: the mode menu offers graph_pdl disabled, saying why
    note = wait(browser, lambda d: text(d, "timeline-mode-note"), "the note on a100's modes")
    assert note.startswith("graph_pdl: a100 has no programmatic dependent launch")
    browser.find_element(By.ID, "timeline-mode").click()
    pdl = wait(browser, lambda d: [o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]")
                                   if o.text.startswith("graph_pdl")], "the mode menu")[0]
    assert pdl.text == "graph_pdl (not on a100)"
    assert pdl.find_element(By.TAG_NAME, "input").get_attribute("disabled") is not None
    assert "programmatic dependent launch" in pdl.find_element(By.CSS_SELECTOR, "[title]").get_attribute("title")

    # B28 of the 2026-12-02 note: a schedule file naming a server file as its GPU answers with one line
    sched = tmp_path / "s.json"
    sched.write_text(json.dumps({**SCHEDULE, "gpu": "/etc/passwd"}))
    upload(browser, "timeline-upload", sched)
    msg = wait(browser, lambda d: text(d, "timeline-message"), "the schedule's error")
    assert msg.startswith("error: schedule unknown GPU '/etc/passwd'") and "\n" not in msg


def test_validation_page(browser, server):
    open_page(browser, server, "Validation")
    line = wait(browser, lambda d: text(d, "validation-metrics"), "the validation metrics")
    assert "MAPE" in line and "Kendall" in line
    scatter = wait(browser, lambda d: figure(d, "validation-scatter"), "the scatter")
    assert set(MODES) <= {t[0] for t in scatter}
    shot(browser, "validation")


def test_hardware_page_and_a_what_if(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    import hwmodels
    from explorer.data import whatif_data
    from explorer.hwdata import WhatIf

    open_page(browser, server, "Hardware")
    wait(browser, lambda d: text(d, "hardware-numbers"), "the hardware table")
    heads, table = browser.execute_script(
        "const t = document.getElementById('hardware-numbers');"
        "return [[...t.tHead.rows[0].cells].map(c => c.innerText.split('\\n')[0]),"
        "        Object.fromEntries([...t.tBodies[0].rows].map(r => [r.cells[0].innerText,"
        "                            [...r.cells].slice(1).map(c => [c.innerText, c.title])]))];")
    assert heads == ["key", "unit", *hwmodels.available()]
    cells = table["dram.bandwidth_spec_GBps"]
    assert cells[0][0] == "GB/s (1e9 B/s)"
    h200, title = cells[1 + hwmodels.available().index("h200")]
    assert h200.startswith("4800") and "datasheet" in title
    wait(browser, lambda d: "No overrides" in text(d, "hardware-changes"), "the unchanged what-if")
    shot(browser, "hardware")
    browser.find_element(By.CSS_SELECTOR, "#hardware-launch [role=slider]").send_keys(Keys.HOME)  # launches free
    launch = f"{hwmodels.load('h200').launch.stream_launch_us:g}"  # the default GPU's (h200: calibrated)
    wait(browser, lambda d: f"launch.stream_launch_us: {launch} → 0 µs" in text(d, "hardware-changes"),
         "the what-if with free launches")
    ref = whatif_data("llama-3.2-1b", "h200", WhatIf(launch_scale=0.0))
    table = rows(browser, "#hardware-whatif-results tbody tr")
    assert list(table) == MODES
    for mode, (base, new, _change) in table.items():
        assert base == f"{ref['base']['modes'][mode]['latency_us']:.1f}"
        assert new == f"{ref['whatif']['modes'][mode]['latency_us']:.1f}"
    assert float(table["stream"][1]) < float(table["stream"][0])
    browser.execute_script("document.getElementById('hardware-launch').scrollIntoView()")
    shot(browser, "whatif", browser.find_element(By.ID, "hardware-whatif-section"))


def test_unknown_path_is_a_404_page(browser, server):
    """An unknown path answers HTTP 404 and the browser shows "Page not found" with the pages' links."""
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server + "/no-such-page", timeout=10)
    assert err.value.code == 404
    browser.get(server + "/no-such-page")
    wait(browser, lambda d: "Page not found" in d.execute_script("return document.body.innerText"),
         "the not-found page")
    nav(browser, "Search")
    wait(browser, lambda d: d.current_url.endswith("/search"), "the Search page")
