"""Your stack and an imported trace on the Compare page: explorer.stacks and the page's callbacks, called
directly."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("dash")

import hwmodels  # noqa: E402
from explorer import data, figures, stacks  # noqa: E402
from mksim.compare import compare_modes  # noqa: E402
from mksim.errors import MksimError  # noqa: E402
from mksim.trace import import_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "tests" / "data" / "trace-llama-3.2-1b-b1-step.json.gz"
CONFIG = ROOT / "mksim" / "models" / "configs" / "llama-3.2-1b.json"


def _upload(raw: bytes, kind: str = "application/gzip") -> str:
    return f"data:{kind};base64," + base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def trace_upload() -> str:
    return _upload(TRACE.read_bytes())


@pytest.fixture(scope="module")
def ref():
    return compare_modes("llama-3.2-1b", "h200-datasheet", stack="torch")


# -- choices -------------------------------------------------------------------------------------
def test_choices_name_every_profile_and_none():
    values = [o["value"] for o in stacks.stack_options()]
    assert values[0] == stacks.NONE and sorted(values[1:]) == sorted(hwmodels.profiles())
    assert values[1:7] == ["cublas", "hf", "hf-compiled", "inductor", "torch", "mksim"]  # stacks, then megakernels
    prof = stacks.profile_options()
    assert prof[0] == {"label": "none: the best kernels the chip allows", "value": "none"}
    assert [o["value"] for o in prof[1:]] == values[1:]
    assert "torch.compile" in next(o["label"] for o in prof if o["value"] == "inductor")
    assert stacks.chosen("none") is None and stacks.chosen(None) is None and stacks.chosen("torch") == "torch"
    assert stacks.megakernel_gpu("h200", "torch") == "h200+torch" and stacks.megakernel_gpu("h200", None) == "h200"


# -- your stack -------------------------------------------------------------------------------------
@pytest.mark.slow  # 1.5 s of CPU
def test_stack_data_is_mksim_compare_impl(ref):
    run = data.compare_run("llama-3.2-1b", "h200-datasheet")
    st = stacks.stack_data(run, "torch")
    for key in ("impl", "gpu", "mode", "latency_us", "tokens_per_s", "assumes"):
        assert st[key] == ref["stack"][key], key
    assert st["megakernel_speedup"] == pytest.approx(ref["stack"]["megakernel_speedup"], rel=1e-12)
    assert st["speedup_vs_stream"] == pytest.approx(run["modes"]["stream"]["latency_us"] / st["latency_us"])
    assert st["assumes"]["profile"] == "torch" and run["assumes"]["profile"] is None
    assert st["megakernel_speedup"] > 1  # plain torch's hundreds of kernels against one persistent kernel


@pytest.mark.slow  # 2.2 s of CPU
def test_stack_of_a_profiled_megakernel_runs_on_the_same_hardware():
    run = data.compare_run("llama-3.2-1b", "h200-calibrated+mksim")
    st = stacks.stack_data(run, "inductor")
    assert run["gpu"] == "h200-calibrated+mksim" and run["assumes"]["profile"] == "mksim"
    assert st["gpu"] == "h200-calibrated+inductor" and st["assumes"]["hardware"] == "h200-calibrated"
    ref = compare_modes("llama-3.2-1b", "h200-calibrated+mksim", stack="inductor")["stack"]
    assert st["latency_us"] == ref["latency_us"]
    assert st["megakernel_speedup"] == pytest.approx(ref["megakernel_speedup"], rel=1e-12)


def test_stack_unknown_profile():
    known = "cublas, hf, hf-compiled, inductor, torch, mksim"
    with pytest.raises(MksimError, match=f"unknown stack 'tensorrt'; known: {known}"):
        stacks.stack_data(data.compare_run("llama-3.2-1b", "h200-datasheet"), "tensorrt")


def test_latency_figure_shows_the_stack_beside_the_modes(ref):
    fig = figures.latency_figure(ref)
    assert [t.name for t in fig.data][-1] == "your stack: torch"
    assert fig.data[-1].y[0] == ref["stack"]["latency_us"]
    no_stack = {k: v for k, v in ref.items() if k != "stack"}
    assert "your stack: torch" not in [t.name for t in figures.latency_figure(no_stack).data]


@pytest.mark.slow  # 2.1 s of CPU
def test_compare_callback_with_a_stack_and_a_profile(ref):
    from explorer.pages.compare import run_compare

    msg, lat, *_f, div, result = run_compare(1, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", None, "none",
                                             "torch")
    assert msg == "" and result["stack"]["latency_us"] == ref["stack"]["latency_us"]
    assert lat.data[-1].name == "your stack: torch"
    table, speedup, assumes = div.children
    last = table.children[-1].children[-1]
    assert last.children[0].children == "your stack: torch (graph)" and getattr(last, "data-mode") == "stack"
    assert last.children[1].children == f"{ref['stack']['latency_us']:.1f}"
    assert speedup.id == "compare-stack-speedup"
    assert f"predicted {ref['stack']['megakernel_speedup']:.2f}× faster than your stack" in speedup.children
    modes_li, stack_li = assumes.children
    assert modes_li.children[:2] == ["the modes assume ", ref["assumes"]["text"].removeprefix("assumes: ")]
    assert modes_li.children[1].startswith("hardware h200-datasheet (datasheet, held against the steps measured")
    assert modes_li.children[3].startswith(f"± {ref['interval']['half_width_pct']:.1f} %: the 90th")
    assert stack_li.children[:2] == ["your stack (torch) assumes ", ref["stack"]["assumes"]["text"][len("assumes: "):]]
    h = ref["stack"]["interval"]["half_width_pct"]
    assert stack_li.children[3].startswith(f"± {h:.1f} %")  # torch on h200: a transfer, wider
    assert stack_li.children[1].startswith("hardware h200-datasheet; implementation profile torch (plain torch")
    msg, *_f, div, result = run_compare(1, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", None, "mksim", "none")
    assert result["gpu"] == "h200-datasheet+mksim" and "stack" not in result
    assert "implementation profile mksim" in div.children[-1].children[0].children[1]
    assert result["modes"]["megakernel"]["latency_us"] == \
        compare_modes("llama-3.2-1b", "h200-datasheet+mksim")["modes"]["megakernel"]["latency_us"]


def test_compare_callback_with_a_stack_and_bad_input():
    from explorer.pages.compare import run_compare

    msg, *_f, table, result = run_compare(1, "llama-3.2-1b", "h200-datasheet", 0, 1024, "decode", None, "none", "torch")
    assert msg == "error: batch must be a positive integer, got 0" and table is None and result is None


# -- an uploaded trace ------------------------------------------------------------------------------
@pytest.mark.slow  # 1.6 s of CPU
def test_trace_data_is_mksim_trace_import(trace_upload):
    t = stacks.trace_data(trace_upload, TRACE.name, "llama-3.2-1b", "h200-datasheet")
    ref = import_trace(TRACE, model="llama-3.2-1b", batch=1, kv_len=1024, gpu="h200-datasheet").to_dict(kernels=False)
    for key in ("step_us", "replay_us", "n_kernels", "busy_us", "gaps_us", "mapped_fraction", "by_kind",
                "model"):
        assert t[key] == ref[key], key
    assert t["prediction"] == {**ref["prediction"], "hardware_file": "hwmodels/data/h200-datasheet.toml"}
    assert t["path"] == TRACE.name and t["step_us"] == pytest.approx(2070.1, abs=0.05)
    mk = compare_modes("llama-3.2-1b", "h200-datasheet")["modes"]["megakernel"]["latency_us"]
    assert t["prediction"]["megakernel_us"] == mk
    assert t["assumes"].startswith("assumes: hardware h200-datasheet (datasheet, held")


@pytest.mark.slow  # 1.1 s of CPU
def test_trace_data_plain_json_and_an_uploaded_config(trace_upload):
    plain = _upload(gzip.decompress(TRACE.read_bytes()), "application/json")
    cfg = json.loads(CONFIG.read_text())
    t = stacks.trace_data(plain, "step.json", "my-llama", "h200-datasheet+mksim", config=cfg)
    ref = stacks.trace_data(trace_upload, TRACE.name, "llama-3.2-1b", "h200-datasheet+mksim")
    assert t["model"] == "my-llama" and t["mapped_fraction"] == ref["mapped_fraction"]
    assert t["prediction"]["megakernel_us"] == ref["prediction"]["megakernel_us"]
    assert "implementation profile mksim" in t["assumes"]


# mtime=0: the bytes are the test id, which every pytest-xdist worker must collect the same
@pytest.mark.parametrize("raw,name,match", [
    (b"{", "bad.json", r"^bad\.json: not JSON \(line 1\); give a Chrome trace"),
    (b'{"traceEvents": []}', "empty.json", r"^empty\.json: no GPU activities|^empty\.json: .*kernel"),
    (b"\x1f\x8b\x08" + bytes(6) + b"\xff\xff\xff", "bad.json.gz", r"^bad\.json\.gz: not a readable gzip file"),
    (gzip.compress(b'{"traceEvents": [', mtime=0)[:-6], "cut.json.gz", r"^cut\.json\.gz: a truncated gzip file"),
    (b"", "nothing.json", r"^nothing\.json: an empty file"),
    (b'{"a": 1}', "other.json", r"^other\.json: JSON without a 'traceEvents' list"),
])
def test_bad_trace_uploads_give_one_line(raw, name, match):
    with pytest.raises(MksimError, match=match) as err:
        stacks.trace_data(_upload(raw), name, "llama-3.2-1b", "h200-datasheet")
    assert "\n" not in str(err.value) and "mksim-trace-" not in str(err.value)  # no temporary path


def test_trace_upload_size_bounds():
    raw = gzip.compress(b'{"traceEvents": []}' + b" " * 5000)
    cap = len(raw) - 10
    with pytest.raises(MksimError, match=rf"^big\.json\.gz: \d+ bytes; the explorer takes traces up to {cap} bytes: "
                                         "gzip it, or keep one step with mksim trace cut$"):
        stacks.read_trace_upload(_upload(raw), "big.json.gz", max_upload=len(raw) - 10)
    with pytest.raises(MksimError, match=r"^big\.json\.gz: over 1000 bytes uncompressed; keep one step"):
        stacks.read_trace_upload(_upload(raw), "big.json.gz", max_trace=1000)
    assert stacks.read_trace_upload(_upload(raw), "big.json.gz").startswith(b'{"traceEvents"')
    with pytest.raises(MksimError, match=r"^x\.json: not a readable upload \(bad base64\)"):
        stacks.read_trace_upload("data:application/json;base64,@@@", "x.json")


@pytest.mark.slow  # 1.3 s of CPU
def test_trace_callback(trace_upload):
    from explorer.pages.compare import import_trace_upload

    assert import_trace_upload(None, None, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode") == ("", None)
    msg, view = import_trace_upload(trace_upload, TRACE.name, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode")
    assert msg == f"imported {TRACE.name}"
    parts = {getattr(p, "id", None): p for p in view.children}
    assert "step 1 of 1 (by cuda graph launches) 2070.1 µs" in parts["compare-trace-step"].children
    assert "replay 2070.1 µs (+0.00%)" in parts["compare-trace-step"].children
    assert parts["compare-trace-mapped"].children.startswith("mapped 99.0% of the kernel time to llama-3.2-1b")
    kinds = [getattr(r, "data-kind") for r in parts["compare-trace-kinds"].children[-1].children]
    assert kinds[0] == "matmul" and kinds[-1] == "unmapped"
    mk = compare_modes("llama-3.2-1b", "h200-datasheet")["modes"]["megakernel"]["latency_us"]
    assert parts["compare-trace-prediction"].children.startswith(
        f"The megakernel of the same ops is predicted {mk:.1f} µs on h200-datasheet: "
        f"{2070.1444765625 / mk:.2f}× faster")
    assert parts["compare-trace-assumes"].children.startswith("the prediction assumes hardware h200-datasheet (datas")
    assert "hwmodels/data/h200-datasheet.toml" in parts["compare-trace-assumes"].children
    msg, view = import_trace_upload(_upload(b"{"), "bad.json", "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode")
    assert msg.children.startswith("error: bad.json: not JSON") and view is None
    msg, view = import_trace_upload(trace_upload, TRACE.name, "llama-3.2-1b", "h200-datasheet", 0, 1024, "decode")
    assert msg.children == "error: batch must be a positive integer, got 0" and view is None
    msg, _ = import_trace_upload(trace_upload, TRACE.name, "llama-3.2-1b", "h200-datasheet", 1, 1024, "prefill")
    assert msg.children == "error: a trace is imported as a decode step: choose the decode phase"


@pytest.mark.slow  # 1.7 s of CPU
def test_trace_callback_with_an_uploaded_config_and_a_profile(trace_upload):
    from explorer.pages.compare import UPLOADED, import_trace_upload, upload_config

    _msg, stored, _options, value = upload_config(_upload(CONFIG.read_bytes(), "application/json"), "my-llama.json")
    msg, view = import_trace_upload(trace_upload, TRACE.name, value, "h200-datasheet", 1, 1024, "decode", stored,
                                    "mksim")
    assert value == UPLOADED + "my-llama" and msg == f"imported {TRACE.name}"
    parts = {getattr(p, "id", None): p for p in view.children}
    assert parts["compare-trace-mapped"].children.startswith("mapped 99.0% of the kernel time to my-llama's ops")
    mk = compare_modes("llama-3.2-1b", "h200-datasheet+mksim")["modes"]["megakernel"]["latency_us"]
    assert f"predicted {mk:.1f} µs on h200-datasheet+mksim" in parts["compare-trace-prediction"].children
    assert "implementation profile mksim" in parts["compare-trace-assumes"].children
    msg, view = import_trace_upload(trace_upload, TRACE.name, value, "h200-datasheet", 1, 1024, "decode", None)
    assert msg.children == "error: the uploaded config is gone; upload it again" and view is None
