"""The explorer end to end, in a real headless Chromium: ``mksim explore`` serves, a browser uses the pages.

Needs Debian's ``chromium`` and ``chromium-driver`` (CI installs them in ``.ci/run``) and selenium (the
``dev`` extra); without the browser or its driver the tests skip, saying why (in CI they fail instead).
Screenshots are kept in ``$MKSIM_TEST_ARTIFACTS`` (default ``tests/explorer/artifacts/``, ignored by git);
with ``MKSIM_DOCS_SCREENSHOTS=1`` the ones docs/explorer.md shows are written to ``docs/img/`` as well.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("dash")
pytestmark = pytest.mark.slow  # a server and a real browser for every test

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("MKSIM_TEST_ARTIFACTS") or ROOT / "tests" / "explorer" / "artifacts")
DOCS_IMG = ROOT / "docs" / "img"
MODES = ["stream", "graph", "graph_pdl", "persistent_barrier", "megakernel"]
WAIT_S = 90  # a comparison takes about a second; a loaded CI machine may be slower


def _need(what: str) -> None:
    if os.environ.get("CI"):  # CI installs them: a missing browser there is a broken set-up, not a skip
        pytest.fail(f"{what}; .ci/run installs chromium and chromium-driver")
    pytest.skip(what)


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        _need("headless Chromium needs Debian's chromium and chromium-driver (apt-get install chromium "
              "chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _need("selenium is not installed (python -m pip install -c constraints.txt -e '.[dev]')")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        opts.add_argument(arg)
    d = webdriver.Chrome(service=Service(driver), options=opts)
    d.set_page_load_timeout(WAIT_S)
    yield d
    d.quit()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _explore(port: int, log: Path, stop=signal.SIGTERM, storage: Path | None = None):
    """``mksim explore --port PORT`` (with ``--storage STORAGE``) as a user starts it, until it answers;
    stopped with ``stop`` on exit (SIGINT: Ctrl-C) sent to its process group, as a terminal does; its log goes
    to the artifacts."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    more = ["--storage", str(storage)] if storage else []
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mksim", "explore", "--port", str(port), *more], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mksim explore did not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, stop)  # to its process group, as a terminal's Ctrl-C
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, ARTIFACTS / log.name)


@pytest.fixture(scope="module")
def server(browser, tmp_path_factory):
    """``mksim explore`` on a free port, as a user starts it (its studies in a storage of the module's own)."""
    folder = tmp_path_factory.mktemp("explore")
    with _explore(_free_port(), folder / "explore.log", storage=folder / "studies.db") as url:
        yield url


def _shot(driver, name: str, element=None, docs: bool = True) -> None:
    """A screenshot of the page's top, or of ``element``, into the artifacts (and, for ``docs`` ones,
    to docs/img/explorer-<name>.png with MKSIM_DOCS_SCREENSHOTS=1)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"explorer-{name}.png"
    driver.execute_script("window.scrollTo(0, 0)")
    if element is None:
        driver.save_screenshot(str(path))
    else:  # an element is shot within the window: make the window tall enough for all of it
        size = driver.get_window_size()
        bottom = element.rect["y"] + element.rect["height"]
        driver.set_window_size(size["width"], max(size["height"], int(bottom) + 200))
        element.screenshot(str(path))
        driver.set_window_size(size["width"], size["height"])
    if docs and os.environ.get("MKSIM_DOCS_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(exist_ok=True)
        shutil.copy(path, DOCS_IMG / path.name)


def _wait(driver, cond, what: str):
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    # Dash re-renders an element between finding it and reading it: a stale element is not yet the answer
    wait = WebDriverWait(driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,))
    try:
        return wait.until(lambda d: cond(d))
    except TimeoutException:
        _shot(driver, "failure", docs=False)
        pytest.fail(f"timed out waiting for {what}")


def _text(driver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.ID, element_id)
    return found[0].text if found else ""


def _figure(driver, graph_id: str) -> list | None:
    """The plotted traces of a dcc.Graph, read from the page: ``[[name, x, y], ...]``."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "return e && e.data ? e.data.map(t => [t.name || null, t.x || null, t.y || null]) : null;", f"#{graph_id}")


def _pick(driver, dropdown_id: str, value: str) -> None:
    """Choose ``value`` in a dcc.Dropdown as a user does: open it, click the option."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, dropdown_id).click()
    option = _wait(driver, lambda d: next((o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]")
                                           if o.text.strip() == value), None), f"option {value} of {dropdown_id}")
    option.click()
    _wait(driver, lambda d: _text(d, dropdown_id).strip() == value, f"{dropdown_id} to show {value}")


def _type(driver, input_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, input_id)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE, text)


def _nav(driver, name: str) -> None:
    """Follow the navigation bar's link to a page (the bar is drawn by the page's scripts: wait for it)."""
    from selenium.webdriver.common.by import By

    _wait(driver, lambda d: d.find_elements(By.LINK_TEXT, name), f"the link to {name}")[0].click()


def _results(driver) -> dict[str, list[str]]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#compare-results tbody tr")
    return {r.get_attribute("data-mode"): [c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows}


def _run_compare(driver, gpu: str) -> None:
    from selenium.webdriver.common.by import By

    _pick(driver, "compare-gpu", gpu)
    driver.find_element(By.ID, "compare-run").click()
    _wait(driver, lambda d: f" on {gpu}:" in _text(d, "compare-results")
          and (_figure(d, "compare-latency") or [[None]])[0][0] == "stream", f"the comparison on {gpu}")


@pytest.fixture(scope="module")
def cli_json():
    r = subprocess.run([sys.executable, "-m", "mksim", "compare", "--model", "llama-3.2-1b", "--gpu", "h200",
                        "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_compare_shows_the_five_modes_as_mksim_compare_json(browser, server, cli_json):
    browser.get(server + "/")
    _wait(browser, lambda d: _text(d, "compare-results"), "the first comparison")
    _pick(browser, "compare-model", "llama-3.2-1b")
    _run_compare(browser, "h100")  # another GPU first, so that the h200 numbers below come from a Run
    _run_compare(browser, "h200")
    lat = _figure(browser, "compare-latency")
    assert [t[0] for t in lat] == MODES
    for name, _x, y in lat:
        assert y[0] == pytest.approx(cli_json["modes"][name]["latency_us"], rel=1e-9)
    tokens = {name: y[0] for name, _x, y in _figure(browser, "compare-tokens")}
    assert tokens == pytest.approx({m: cli_json["modes"][m]["tokens_per_s"] for m in MODES}, rel=1e-9)
    rows = _results(browser)
    assert list(rows) == MODES
    for mode, cells in rows.items():
        ref = cli_json["modes"][mode]
        assert cells == [f"{ref['latency_us']:.1f}", f"{ref['tokens_per_s']:.0f}", f"{ref['hbm_util']:.1%}",
                         f"{ref['speedup_vs_stream']:.2f}×"]
    assert f"bandwidth floor {cli_json['bandwidth_floor_us']:.1f} µs" in _text(browser, "compare-results")
    breakdown = _figure(browser, "compare-breakdown")
    assert len(breakdown) == 7 and all(list(x) == MODES for _n, x, _y in breakdown)
    roof = _wait(browser, lambda d: _figure(d, "compare-roofline"), "the roofline")
    assert "matmul" in [t[0] for t in roof] and roof[0][0].startswith("roof: HBM 4800 GB/s")
    from selenium.webdriver.common.by import By

    _shot(browser, "compare")
    _shot(browser, "roofline", browser.find_element(By.ID, "compare-roofline"))


def test_compare_bad_batch_shows_the_error(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    _wait(browser, lambda d: _text(d, "compare-results"), "the first comparison")
    _type(browser, "compare-batch", "0")
    browser.find_element(By.ID, "compare-run").click()
    msg = _wait(browser, lambda d: _text(d, "compare-message"), "the error message")
    assert msg == "error: batch must be a positive integer, got 0"
    assert _figure(browser, "compare-latency") == [] and _text(browser, "compare-results") == ""
    _shot(browser, "compare-error", docs=False)
    _type(browser, "compare-batch", "1")  # the server is still up: a good run answers again
    browser.find_element(By.ID, "compare-run").click()
    _wait(browser, lambda d: _text(d, "compare-message") == "" and _text(d, "compare-results"), "a good run")


def test_compare_upload_config(browser, server, cli_json, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(server + "/")
    _wait(browser, lambda d: _text(d, "compare-results"), "the first comparison")
    upload = browser.find_element(By.CSS_SELECTOR, "#compare-upload input[type=file]")
    bad = tmp_path / "broken.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 0}')
    upload.send_keys(str(bad))
    msg = _wait(browser, lambda d: _text(d, "compare-upload-message"), "the upload's error")
    assert msg == "error: broken.json: hidden_size = 0; expected a positive integer"
    good = tmp_path / "my-llama.json"
    good.write_text((ROOT / "mksim" / "models" / "configs" / "llama-3.2-1b.json").read_text())
    upload.send_keys(str(good))
    _wait(browser, lambda d: _text(d, "compare-upload-message").startswith("loaded my-llama: llama, 16 layers"),
          "the uploaded config")
    assert _text(browser, "compare-model").strip() == "uploaded: my-llama"
    browser.find_element(By.ID, "compare-run").click()
    _wait(browser, lambda d: _text(d, "compare-results").startswith("my-llama decode b1 kv1024 on h200"),
          "the comparison of the uploaded model")
    lat = {name: y[0] for name, _x, y in _figure(browser, "compare-latency")}
    assert lat == pytest.approx({m: cli_json["modes"][m]["latency_us"] for m in MODES}, rel=1e-9)


def test_compare_your_stack_and_an_imported_trace(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    r = subprocess.run([sys.executable, "-m", "mksim", "compare", "--model", "llama-3.2-1b", "--gpu", "h200",
                        "--stack", "torch", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    ref = json.loads(r.stdout)
    st = ref["stack"]
    browser.get(server + "/")
    _wait(browser, lambda d: _text(d, "compare-results"), "the first comparison")
    assert _text(browser, "compare-assumes").startswith(
        "the modes assume " + ref["assumes"]["text"].removeprefix("assumes: ") + "; interval unknown")
    assert "no implementation profile: the best kernels the chip allows" in _text(browser, "compare-assumes")
    assert not browser.find_elements(By.CSS_SELECTOR, "#compare-results tr[data-mode=stack]")
    _pick(browser, "compare-stack", "torch")
    browser.find_element(By.ID, "compare-run").click()
    row = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#compare-results tr[data-mode=stack]"),
                "the stack's row")[0]
    assert row.find_element(By.TAG_NAME, "th").text == "your stack: torch (graph)"
    assert [c.text for c in row.find_elements(By.TAG_NAME, "td")][:2] == [f"{st['latency_us']:.1f}",
                                                                           f"{st['tokens_per_s']:.0f}"]
    assert list(_results(browser)) == [*MODES, "stack"]
    speedup = _text(browser, "compare-stack-speedup")
    assert speedup.startswith(f"The megakernel ({ref['modes']['megakernel']['latency_us']:.1f} µs on h200) is "
                              f"predicted {st['megakernel_speedup']:.2f}× faster than your stack, torch's kernels in "
                              f"one CUDA graph ({st['latency_us']:.1f} µs) (")
    assert speedup.endswith(f"({st['verdict']}).") and "interval unknown" in st["verdict"]  # no profile: no interval
    lines = _text(browser, "compare-assumes").splitlines()
    assert lines[0].startswith("the modes assume " + ref["assumes"]["text"].removeprefix("assumes: "))
    assert lines[1].startswith("your stack (torch) assumes " + st["assumes"]["text"].removeprefix("assumes: ")
                               + f"; ± {st['interval']['half_width_pct']:.1f} %")
    lat = _figure(browser, "compare-latency")
    assert [t[0] for t in lat] == [*MODES, "your stack: torch"]
    assert lat[-1][2][0] == pytest.approx(st["latency_us"], rel=1e-9)
    _shot(browser, "stack", browser.find_element(By.ID, "compare-table"))

    # the committed trace of one torch step on our H200, imported with the page's model, batch, KV and GPU
    trace = ROOT / "tests" / "data" / "trace-llama-3.2-1b-b1-step.json.gz"
    upload = browser.find_element(By.CSS_SELECTOR, "#compare-trace-upload input[type=file]")
    upload.send_keys(str(trace))
    step = _wait(browser, lambda d: _text(d, "compare-trace-step"), "the imported trace")
    assert step.startswith(f"{trace.name}: NVIDIA H200; step 1 of 1 (by cuda graph launches) 2070.1 µs")
    assert "replay 2070.1 µs (+0.00%)" in step
    assert _text(browser, "compare-trace-mapped").startswith("mapped 99.0% of the kernel time to llama-3.2-1b's ops")
    kinds = [r.get_attribute("data-kind") for r in browser.find_elements(By.CSS_SELECTOR, "#compare-trace-kinds tr")
             if r.get_attribute("data-kind")]
    assert kinds[0] == "matmul" and "rmsnorm" in kinds and kinds[-1] == "unmapped"
    mk = ref["modes"]["megakernel"]["latency_us"]
    assert _text(browser, "compare-trace-prediction") == (
        f"The megakernel of the same ops is predicted {mk:.1f} µs on h200: {2070.1444765625 / mk:.2f}× faster than "
        f"the traced step (2070.1 µs); mksim's own one-kernel-per-op CUDA graph "
        f"{ref['modes']['graph']['latency_us']:.1f} µs.")
    assert _text(browser, "compare-trace-assumes") == \
        f"the prediction assumes {ref['assumes']['text'].removeprefix('assumes: ')} (hwmodels/data/h200.toml)"
    _shot(browser, "trace", browser.find_element(By.ID, "compare-trace"))
    _type(browser, "compare-kv-len", "4096")  # Run imports the trace again with the page's inputs as they are
    browser.find_element(By.ID, "compare-run").click()
    _wait(browser, lambda d: "(batch 1, KV 4096)" in _text(d, "compare-trace-mapped"), "the trace at KV 4096")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    upload.send_keys(str(bad))
    msg = _wait(browser, lambda d: _text(d, "compare-trace-message").startswith("error"), "the bad trace's error")
    assert _text(browser, "compare-trace-message") == \
        "error: bad.json: not JSON (line 1); give a Chrome trace from prof.export_chrome_trace()"
    assert msg and _text(browser, "compare-trace") == ""


def test_hostile_uploads_answer_with_one_line(browser, server, tmp_path_factory):
    """Files no page expects, uploaded as a user would (table B of the 2026-12-02 note, through the browser):
    each answers with the page's one-line error beside its box, and the server keeps serving. The 19 MB gzip
    of a 500 MiB trace (B27) is refused at once (the bound on time and memory: test_hostile_http.py)."""
    from selenium.webdriver.common.by import By

    from tests.explorer.test_hostile_http import SCHEDULE, _bomb

    tmp = tmp_path_factory.mktemp("hostile-uploads")
    browser.get(server + "/")
    _wait(browser, lambda d: _text(d, "compare-results"), "the first comparison")
    nested = tmp / "nested.json"  # B9
    nested.write_text("[" * 50000 + "]" * 50000)
    browser.find_element(By.CSS_SELECTOR, "#compare-upload input[type=file]").send_keys(str(nested))
    msg = _wait(browser, lambda d: _text(d, "compare-upload-message"), "the nested config's error")
    assert msg.startswith("error: nested.json: ") and "nested more than" in msg and "\n" not in msg
    bomb = _bomb(tmp_path_factory.getbasetemp() / "bomb-500MiB.json.gz")  # B27
    t0 = time.monotonic()
    browser.find_element(By.CSS_SELECTOR, "#compare-trace-upload input[type=file]").send_keys(str(bomb))
    msg = _wait(browser, lambda d: _text(d, "compare-trace-message").startswith("error") and
                _text(d, "compare-trace-message"), "the bomb's refusal")
    assert msg.startswith("error: bomb-500MiB.json.gz: over 64 MiB uncompressed") and "\n" not in msg
    assert time.monotonic() - t0 < 60  # the browser reads and sends 19 MB; the server refuses in under 5 s
    _type(browser, "compare-batch", "2")  # the server still answers
    browser.find_element(By.ID, "compare-run").click()
    _wait(browser, lambda d: " b2 " in _text(d, "compare-results"), "a good run after the hostile uploads")

    browser.get(server + "/timeline")  # B28: a schedule naming a server file as its GPU
    _wait(browser, lambda d: _text(d, "timeline-summary"), "the first timeline")
    sched = tmp / "s.json"
    sched.write_text(json.dumps({**SCHEDULE, "gpu": "/etc/passwd"}))
    browser.find_element(By.CSS_SELECTOR, "#timeline-upload input[type=file]").send_keys(str(sched))
    msg = _wait(browser, lambda d: _text(d, "timeline-message"), "the schedule's error")
    assert msg.startswith("error: schedule unknown GPU '/etc/passwd'") and "\n" not in msg


def test_validation_page(browser, server):

    browser.get(server + "/")
    _nav(browser, "Validation")
    line = _wait(browser, lambda d: _text(d, "validation-metrics"), "the validation metrics")
    assert "MAPE" in line and "Kendall" in line
    scatter = _wait(browser, lambda d: _figure(d, "validation-scatter"), "the scatter")
    assert set(MODES) <= {t[0] for t in scatter}
    _shot(browser, "validation")


def test_hardware_page_and_a_what_if(browser, server):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    import hwmodels
    from explorer.data import whatif_data
    from explorer.hwdata import WhatIf

    browser.get(server + "/")
    _nav(browser, "Hardware")
    _wait(browser, lambda d: _text(d, "hardware-numbers"), "the hardware table")
    heads = [th.text.split("\n")[0] for th in browser.find_elements(By.CSS_SELECTOR, "#hardware-numbers thead th")]
    assert heads == ["key", "unit", *hwmodels.available()]
    row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#hardware-numbers tbody tr")
               if r.find_element(By.TAG_NAME, "th").text == "dram.bandwidth_spec_GBps")
    cells = row.find_elements(By.TAG_NAME, "td")
    assert cells[0].text == "GB/s (1e9 B/s)"
    h200 = cells[1 + hwmodels.available().index("h200")]
    assert h200.text.startswith("4800") and "datasheet" in h200.get_attribute("title")
    _wait(browser, lambda d: "No overrides" in _text(d, "hardware-changes"), "the unchanged what-if")
    _shot(browser, "hardware")
    browser.find_element(By.CSS_SELECTOR, "#hardware-launch [role=slider]").send_keys(Keys.HOME)  # launches free
    _wait(browser, lambda d: "launch.stream_launch_us: 2.5 → 0 µs" in _text(d, "hardware-changes"),
          "the what-if with free launches")
    ref = whatif_data("llama-3.2-1b", "h200", WhatIf(launch_scale=0.0))
    rows = {r.get_attribute("data-mode"): [c.text for c in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, "#hardware-whatif-results tbody tr")}
    assert list(rows) == MODES
    for mode, (base, new, _change) in rows.items():
        assert base == f"{ref['base']['modes'][mode]['latency_us']:.1f}"
        assert new == f"{ref['whatif']['modes'][mode]['latency_us']:.1f}"
    assert float(rows["stream"][1]) < float(rows["stream"][0])
    browser.execute_script("document.getElementById('hardware-launch').scrollIntoView()")
    _shot(browser, "whatif", browser.find_element(By.ID, "hardware-whatif-section"))


def _tracks(driver, graph_id: str) -> int | None:
    """How many SM tracks a Timeline chart draws: distinct rows of its bars' hover points."""
    return driver.execute_script(
        "const e = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "if (!e || !e.data || !e.data.length) return null;"
        "const rows = new Set();"
        "for (const t of e._fullData) if (t.mode === 'markers') for (const y of t.y) rows.add(Math.round(y));"
        "return rows.size;", f"#{graph_id}")


def test_timeline_one_track_per_sm(browser, server):
    from selenium.webdriver.common.by import By

    browser.get(server + "/timeline")
    summary = _wait(browser, lambda d: _text(d, "timeline-summary"), "the first timeline")
    assert summary.startswith("default schedule: llama-3.2-1b decode b1 kv1024 on h200, megakernel")
    assert " on 132 SMs" in summary
    assert _tracks(browser, "timeline-graph") == 132  # h200 has 132 SMs, every one runs tasks
    _shot(browser, "timeline")
    _pick(browser, "timeline-gpu", "a100")  # no PDL: the mode menu offers graph_pdl disabled, saying why
    note = _wait(browser, lambda d: _text(d, "timeline-mode-note"), "the note on a100's modes")
    assert note.startswith("graph_pdl: a100 has no programmatic dependent launch")
    browser.find_element(By.ID, "timeline-mode").click()
    pdl = _wait(browser, lambda d: [o for o in d.find_elements(By.CSS_SELECTOR, "[role=option]")
                                    if o.text.startswith("graph_pdl")], "the mode menu")[0]
    assert pdl.text == "graph_pdl (not on a100)"
    assert pdl.find_element(By.TAG_NAME, "input").get_attribute("disabled") is not None
    assert "programmatic dependent launch" in pdl.find_element(By.CSS_SELECTOR, "[title]").get_attribute("title")


def test_search_runs_live_and_opens_its_best_in_timeline(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(server + "/search")
    _wait(browser, lambda d: d.find_elements(By.ID, "search-start"), "the search page")
    _wait(browser, lambda d: _text(d, "search-hint").startswith("Start a search or open a study"), "the hint")
    assert not browser.find_element(By.ID, "search-figures").is_displayed()  # no empty axes before a study
    _type(browser, "search-trials", "26")
    _pick(browser, "search-objectives", "latency,smem")
    browser.find_element(By.ID, "search-start").click()
    _wait(browser, lambda d: "running" in _text(d, "search-progress") or "starting" in _text(d, "search-progress"),
          "the search to run")
    progress = _wait(browser, lambda d: "best found: " in _text(d, "search-progress") and _text(d, "search-progress"),
                     "the search to end")
    assert progress.startswith("26 / 26 trials finished") and _text(browser, "search-message") == ""
    assert _wait(browser, lambda d: _figure(d, "search-pareto"), "the Pareto front")[-1][0] == "Pareto front"
    _shot(browser, "search")
    browser.find_element(By.ID, "search-best").click()
    summary = _wait(browser, lambda d: _text(d, "timeline-summary").startswith("schedule from Search: ")
                    and _text(d, "timeline-summary"), "the best schedule on Timeline")
    assert "/timeline?schedule=" in browser.current_url
    best = progress.split("best found: ")[1].split(" µs")[0]
    assert f", {best} µs, " in summary  # the best trial's latency, simulated again

    # the study opens again from the list of the storage's studies, no name typed
    browser.get(server + "/search")
    _wait(browser, lambda d: d.find_elements(By.ID, "search-open"), "the search page")
    _wait(browser, lambda d: "latency+smem" in _text(d, "search-studies"), "the study in the list")
    browser.find_element(By.ID, "search-open").click()
    _wait(browser, lambda d: _text(d, "search-progress").startswith("26 trials finished"), "the opened study")
    assert _text(browser, "search-message") == "" and browser.find_element(By.ID, "search-figures").is_displayed()


def test_unknown_path_is_a_404_page(browser, server):
    """An unknown path answers HTTP 404 and the browser shows "Page not found" with the pages' links."""
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server + "/no-such-page", timeout=10)
    assert err.value.code == 404
    browser.get(server + "/no-such-page")
    _wait(browser, lambda d: "Page not found" in d.find_element("tag name", "body").text, "the not-found page")
    _nav(browser, "Search")
    _wait(browser, lambda d: d.current_url.endswith("/search"), "the Search page")


def test_search_cancel(browser, server, tmp_path):
    """A search started from the page stops on Cancel search; the page says so."""
    from selenium.webdriver.common.by import By

    browser.get(server + "/search")
    _wait(browser, lambda d: d.find_elements(By.ID, "search-start"), "the search page")
    _type(browser, "search-trials", "2000")
    browser.find_element(By.ID, "search-start").click()
    _wait(browser, lambda d: "running" in _text(d, "search-progress"), "the search to run")
    browser.find_element(By.ID, "search-cancel").click()
    _wait(browser, lambda d: _text(d, "search-cancel-message") == "search cancelled", "the cancel")
    _wait(browser, lambda d: "; cancelled — study " in _text(d, "search-progress"), "the progress to say cancelled")
    assert _text(browser, "search-message") == ""


def _job_states(driver) -> dict[str, str]:
    """The Search page's list of searches: ``{job: state}``."""
    from selenium.webdriver.common.by import By

    return {r.find_element(By.TAG_NAME, "td").text: r.find_element(By.CLASS_NAME, "search-job-state").text
            for r in driver.find_elements(By.CSS_SELECTOR, "#search-jobs-table tbody tr")}


def test_search_survives_a_restart(browser, tmp_path):
    """Searches go on when the explorer stops (Ctrl-C) and the next one lists them with their state: one
    running (followed and cancelled from the new server), one whose process was killed meanwhile (stopped,
    its finished trials kept); a third is refused while two run."""
    from selenium.webdriver.common.by import By

    from explorer import jobs

    old_registry = os.environ["MKSIM_EXPLORER_JOBS"]
    os.environ["MKSIM_EXPLORER_JOBS"] = str(tmp_path / "jobs")  # a registry of its own: the searches below only
    port = _free_port()
    try:
        with _explore(port, tmp_path / "explore-before-restart.log", stop=signal.SIGINT,
                      storage=tmp_path / "restart.db") as url:
            browser.get(url + "/search")
            _wait(browser, lambda d: d.find_elements(By.ID, "search-start"), "the search page")
            _type(browser, "search-trials", "2000")
            for name in ("kept", "killed", "third"):
                _type(browser, "search-study", name)
                browser.find_element(By.ID, "search-start").click()
                if name == "third":
                    _wait(browser, lambda d: _text(d, "search-message").startswith("error: 2 searches are running "
                                                                                     "already"), "the refusal")
                else:
                    _wait(browser, lambda d, n=name: "running" in _text(d, "search-progress")
                          and f"study {n}" in _text(d, "search-progress"), f"search {name} to run")
            states = _wait(browser, lambda d: len(_job_states(d)) == 2 and _job_states(d), "the list of searches")
            assert states == {"search-2": "running", "search-1": "running"}
        assert "2 search(es) still run (search-2, search-1)" in (tmp_path / "explore-before-restart.log").read_text()
        killed = json.loads((tmp_path / "jobs" / "search-2" / "job.json").read_text())
        os.killpg(killed["pid"], signal.SIGKILL)  # while no server runs
        deadline = time.monotonic() + 30
        while "search-2" in jobs.running_jobs() and time.monotonic() < deadline:  # until the kernel has ended it
            time.sleep(0.1)
        assert jobs.running_jobs() == ["search-1"]

        with _explore(port, tmp_path / "explore-after-restart.log", storage=tmp_path / "restart.db") as url:
            browser.get(url + "/search")
            states = _wait(browser, lambda d: len(_job_states(d)) == 2 and _job_states(d), "the list after restart")
            assert states == {"search-2": "stopped", "search-1": "running"}
            _shot(browser, "search-jobs", docs=False)
            browser.find_element(By.ID, "search-jobs-search-1").find_element(By.TAG_NAME, "button").click()
            _wait(browser, lambda d: "running…" in _text(d, "search-progress")
                  and _text(d, "search-progress").endswith("study kept"), "the re-attached search")
            browser.find_element(By.ID, "search-cancel").click()
            _wait(browser, lambda d: _text(d, "search-cancel-message") == "search cancelled", "the cancel")
            _wait(browser, lambda d: "; cancelled — study kept" in _text(d, "search-progress"), "cancelled")
            _wait(browser, lambda d: _job_states(d).get("search-1") == "cancelled", "the list to say cancelled")
            browser.find_element(By.ID, "search-jobs-search-2").find_element(By.TAG_NAME, "button").click()
            progress = _wait(browser, lambda d: "; stopped: " in _text(d, "search-progress")
                             and _text(d, "search-progress"), "the stopped search")
            assert progress.endswith("— study killed") and _text(browser, "search-message") == ""
        assert jobs.running_jobs() == []
    finally:
        for job in jobs.running_jobs():
            jobs.cancel(job)
        os.environ["MKSIM_EXPLORER_JOBS"] = old_registry
