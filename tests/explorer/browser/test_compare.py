"""The Compare page in a real headless Chromium: the five modes as ``mksim compare --json`` gives them, bad
input, an uploaded config, your stack and an imported trace, and files no page expects."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("dash")
# a server and a real browser; one browser and server for every module (conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

from tests.clirun import mksim  # noqa: E402
from tests.explorer.browser.drive import (  # noqa: E402
    MODES,
    ROOT,
    click,
    figure,
    pick,
    rows,
    shot,
    text,
    type_in,
    upload,
    wait,
)


def _compare_page(driver, server: str, fresh: bool = False) -> None:
    """The Compare page with a comparison: loaded (its first comparison) when the browser shows another page,
    or when the test reads the page as it first shows (``fresh``); else the test goes on from the page the
    test before left (a page load costs Chromium seconds of CPU), with the inputs it left (the first test ends
    on the page's defaults: llama-3.2-1b, h200, batch 1, KV 1024)."""
    if fresh or driver.current_url.rstrip("/") != server or not text(driver, "compare-results"):
        driver.get(server + "/")
        wait(driver, lambda d: text(d, "compare-results"), "the first comparison")


def _run_compare(driver, gpu: str) -> None:
    pick(driver, "compare-gpu", gpu)
    click(driver, "compare-run")
    wait(driver, lambda d: f" on {gpu}:" in text(d, "compare-results")
         and (figure(d, "compare-latency") or [[None]])[0][0] == "stream", f"the comparison on {gpu}")


def _compare_json(*more: str) -> dict:
    r = mksim("compare", "--model", "llama-3.2-1b", "--gpu", "h200", *more, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def cli_json():
    return _compare_json()


def test_compare_shows_the_five_modes_as_mksim_compare_json(browser, server, cli_json):
    from selenium.webdriver.common.by import By

    _compare_page(browser, server)
    pick(browser, "compare-model", "llama-3.2-1b")
    _run_compare(browser, "h100")  # another GPU first, so that the h200 numbers below come from a Run
    _run_compare(browser, "h200")
    lat = figure(browser, "compare-latency")
    assert [t[0] for t in lat] == MODES
    for name, _x, y in lat:
        assert y[0] == pytest.approx(cli_json["modes"][name]["latency_us"], rel=1e-9)
    tokens = {name: y[0] for name, _x, y in figure(browser, "compare-tokens")}
    assert tokens == pytest.approx({m: cli_json["modes"][m]["tokens_per_s"] for m in MODES}, rel=1e-9)
    table = rows(browser, "#compare-results tbody tr")
    assert list(table) == MODES
    for mode, cells in table.items():
        ref = cli_json["modes"][mode]
        assert cells == [f"{ref['latency_us']:.1f}", f"{ref['tokens_per_s']:.0f}", f"{ref['hbm_util']:.1%}",
                         f"{ref['speedup_vs_stream']:.2f}×"]
    assert f"bandwidth floor {cli_json['bandwidth_floor_us']:.1f} µs" in text(browser, "compare-results")
    breakdown = figure(browser, "compare-breakdown")
    assert len(breakdown) == 7 and all(list(x) == MODES for _n, x, _y in breakdown)
    roof = wait(browser, lambda d: (figure(d, "compare-roofline") or [[""]])[0][0].startswith("roof: HBM 4800 GB/s")
                and figure(d, "compare-roofline"), "the roofline of the h200")  # drawn after the comparison
    assert "matmul" in [t[0] for t in roof]
    shot(browser, "compare")
    shot(browser, "roofline", browser.find_element(By.ID, "compare-roofline"))


def test_compare_bad_batch_shows_the_error(browser, server):
    _compare_page(browser, server)
    type_in(browser, "compare-batch", "0")
    click(browser, "compare-run")
    msg = wait(browser, lambda d: text(d, "compare-message").startswith("error: batch")
               and text(d, "compare-message"), "the error message")
    assert msg == "error: batch must be a positive integer, got 0"
    assert figure(browser, "compare-latency") == [] and text(browser, "compare-results") == ""
    shot(browser, "compare-error", docs=False)
    type_in(browser, "compare-batch", "1")  # the server is still up: a good run answers again
    click(browser, "compare-run")
    wait(browser, lambda d: text(d, "compare-message") == "" and text(d, "compare-results"), "a good run")


def test_compare_upload_config(browser, server, cli_json, tmp_path):
    _compare_page(browser, server)
    bad = tmp_path / "broken.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 0}')
    upload(browser, "compare-upload", bad)
    msg = wait(browser, lambda d: "broken.json" in text(d, "compare-upload-message")
               and text(d, "compare-upload-message"), "the upload's error")
    assert msg == "error: broken.json: hidden_size = 0; expected a positive integer"
    good = tmp_path / "my-llama.json"
    good.write_text((ROOT / "mksim" / "models" / "configs" / "llama-3.2-1b.json").read_text())
    upload(browser, "compare-upload", good)
    wait(browser, lambda d: text(d, "compare-upload-message").startswith("loaded my-llama: llama, 16 layers"),
         "the uploaded config")
    assert text(browser, "compare-model").strip() == "uploaded: my-llama"
    click(browser, "compare-run")
    wait(browser, lambda d: text(d, "compare-results").startswith("my-llama decode b1 kv1024 on h200"),
         "the comparison of the uploaded model")
    lat = {name: y[0] for name, _x, y in figure(browser, "compare-latency")}
    assert lat == pytest.approx({m: cli_json["modes"][m]["latency_us"] for m in MODES}, rel=1e-9)


def test_compare_your_stack_and_an_imported_trace(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    ref = _compare_json("--stack", "torch")
    st = ref["stack"]
    _compare_page(browser, server, fresh=True)
    iv = ref["interval"]  # h200 is the validated target: its modes have an interval
    assert text(browser, "compare-assumes").startswith(
        "the modes assume " + ref["assumes"]["text"].removeprefix("assumes: ")
        + f"; ± {iv['half_width_pct']:.1f} %: {iv['text']}")
    assert "implementation profile mksim" in text(browser, "compare-assumes")  # the validated default names its kernels
    assert not browser.find_elements(By.CSS_SELECTOR, "#compare-results tr[data-mode=stack]")
    pick(browser, "compare-stack", "torch")
    click(browser, "compare-run")
    row = wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#compare-results tr[data-mode=stack]"),
               "the stack's row")[0]
    assert row.find_element(By.TAG_NAME, "th").text == "your stack: torch (graph)"
    table = rows(browser, "#compare-results tbody tr")
    assert table["stack"][:2] == [f"{st['latency_us']:.1f}", f"{st['tokens_per_s']:.0f}"]
    assert list(table) == [*MODES, "stack"]
    speedup = text(browser, "compare-stack-speedup")
    assert speedup.startswith(f"The megakernel ({ref['modes']['megakernel']['latency_us']:.1f} µs on h200) is "
                              f"predicted {st['megakernel_speedup']:.2f}× faster than your stack, torch's kernels in "
                              f"one CUDA graph ({st['latency_us']:.1f} µs) (")
    lo, hi = st["speedup_interval"]  # both validated: an interval
    assert speedup.endswith(f"(interval {lo:.2f}–{hi:.2f}×: {st['verdict']}).")
    lines = text(browser, "compare-assumes").splitlines()
    assert lines[0].startswith("the modes assume " + ref["assumes"]["text"].removeprefix("assumes: "))
    assert lines[1].startswith("your stack (torch) assumes " + st["assumes"]["text"].removeprefix("assumes: ")
                               + f"; ± {st['interval']['half_width_pct']:.1f} %")
    lat = figure(browser, "compare-latency")
    assert [t[0] for t in lat] == [*MODES, "your stack: torch"]
    assert lat[-1][2][0] == pytest.approx(st["latency_us"], rel=1e-9)
    shot(browser, "stack", browser.find_element(By.ID, "compare-table"))

    # the committed trace of one torch step on our H200, imported with the page's model, batch, KV and GPU
    trace = ROOT / "tests" / "data" / "trace-llama-3.2-1b-b1-step.json.gz"
    upload(browser, "compare-trace-upload", trace)
    step = wait(browser, lambda d: text(d, "compare-trace-step"), "the imported trace")
    assert step.startswith(f"{trace.name}: NVIDIA H200; step 1 of 1 (by cuda graph launches) 2070.1 µs")
    assert "replay 2070.1 µs (+0.00%)" in step
    assert text(browser, "compare-trace-mapped").startswith("mapped 99.0% of the kernel time to llama-3.2-1b's ops")
    kinds = browser.execute_script("return [...document.querySelectorAll('#compare-trace-kinds tr[data-kind]')]"
                                   ".map(r => r.getAttribute('data-kind')).filter(k => k)")
    assert kinds[0] == "matmul" and "rmsnorm" in kinds and kinds[-1] == "unmapped"
    mk = ref["modes"]["megakernel"]["latency_us"]
    assert text(browser, "compare-trace-prediction") == (
        f"The megakernel of the same ops is predicted {mk:.1f} µs on h200: {2070.1444765625 / mk:.2f}× faster than "
        f"the traced step (2070.1 µs); mksim's own one-kernel-per-op CUDA graph "
        f"{ref['modes']['graph']['latency_us']:.1f} µs.")
    assert text(browser, "compare-trace-assumes") == \
        f"the prediction assumes {ref['assumes']['text'].removeprefix('assumes: ')} (hwmodels/calibrated/h200.toml)"
    shot(browser, "trace", browser.find_element(By.ID, "compare-trace"))
    type_in(browser, "compare-kv-len", "4096")  # Run imports the trace again with the page's inputs as they are
    click(browser, "compare-run")
    wait(browser, lambda d: "(batch 1, KV 4096)" in text(d, "compare-trace-mapped"), "the trace at KV 4096")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    upload(browser, "compare-trace-upload", bad)
    msg = wait(browser, lambda d: text(d, "compare-trace-message").startswith("error: bad.json"),
               "the bad trace's error")
    assert text(browser, "compare-trace-message") == \
        "error: bad.json: not JSON (line 1); give a Chrome trace from prof.export_chrome_trace()"
    assert msg and text(browser, "compare-trace") == ""


def test_hostile_uploads_answer_with_one_line(browser, server, tmp_path_factory):
    """Files no page expects, uploaded as a user would (table B of the 2026-12-02 note, through the browser):
    each answers with the page's one-line error beside its box, and the server keeps serving. The 19 MB gzip
    of a 500 MiB trace (B27) is refused at once (the bound on time and memory: test_hostile_http.py). B28, a
    schedule naming a server file as its GPU, is on the Timeline page (test_pages.py)."""
    from tests.explorer.test_hostile_http import _bomb

    tmp = tmp_path_factory.mktemp("hostile-uploads")
    _compare_page(browser, server)
    nested = tmp / "nested.json"  # B9
    nested.write_text("[" * 50000 + "]" * 50000)
    upload(browser, "compare-upload", nested)
    # the page may still show the test before's message: wait for the one that names this file
    msg = wait(browser, lambda d: "nested.json" in text(d, "compare-upload-message")
               and text(d, "compare-upload-message"), "the nested config's error")
    assert msg.startswith("error: nested.json: ") and "nested more than" in msg and "\n" not in msg
    bomb = _bomb(tmp_path_factory.getbasetemp() / "bomb-500MiB.json.gz")  # B27
    t0 = time.monotonic()
    upload(browser, "compare-trace-upload", bomb)
    msg = wait(browser, lambda d: text(d, "compare-trace-message").startswith("error: bomb-500MiB") and
               text(d, "compare-trace-message"), "the bomb's refusal")
    assert msg.startswith("error: bomb-500MiB.json.gz: over 64 MiB uncompressed") and "\n" not in msg
    assert time.monotonic() - t0 < 60  # the browser reads and sends 19 MB; the server refuses in under 5 s
    type_in(browser, "compare-batch", "2")  # the server still answers
    click(browser, "compare-run")
    wait(browser, lambda d: " b2 " in text(d, "compare-results"), "a good run after the hostile uploads")


def test_compare_split_over_gpus_shows_the_communication(browser, server):
    """tp 2 (Megatron's split over two GPUs of the node): the modes as ``mksim compare --tp 2 --json`` gives
    them, each with its communication and share; a split the model cannot take is mksim's one line; ep is off
    for a dense model."""
    ref = _compare_json("--tp", "2")
    _compare_page(browser, server, fresh=True)
    assert browser.find_element("id", "compare-ep").get_attribute("disabled") is not None  # llama: dense
    type_in(browser, "compare-tp", "2")
    click(browser, "compare-run")
    wait(browser, lambda d: "kv1024 tp2 on h200" in text(d, "compare-results"), "the comparison at tp 2")
    table = rows(browser, "#compare-results tbody tr")
    assert list(table) == MODES
    for mode, cells in table.items():
        r = ref["modes"][mode]
        assert cells == [f"{r['latency_us']:.1f}", f"{r['tokens_per_s']:.0f}", f"{r['hbm_util']:.1%}",
                         f"{r['speedup_vs_stream']:.2f}×",
                         f"{r['breakdown_us']['communication']:.1f} ({r['communication_share']:.1%})"]
    assert "communication µs (share)" in text(browser, "compare-results")
    type_in(browser, "compare-tp", "3")
    click(browser, "compare-run")
    msg = wait(browser, lambda d: text(d, "compare-message").startswith("error: --tp 3") and text(d, "compare-message"),
               "the bad split's error")
    assert msg == "error: --tp 3 does not divide llama-3.2-1b's 32 attention heads; use one of 1, 2, 4, 8"
    assert text(browser, "compare-results") == ""
    type_in(browser, "compare-tp", "1")  # the page as the next test expects it
    click(browser, "compare-run")
    wait(browser, lambda d: text(d, "compare-message") == "" and "tp2" not in text(d, "compare-results")
         and text(d, "compare-results"), "a run on one GPU")
