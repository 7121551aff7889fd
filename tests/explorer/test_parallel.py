"""Tensor and expert parallelism in the explorer: the tp and ep inputs of Compare, Timeline and Search, checked
as ``mksim compare --tp/--ep`` checks them (a bad split is mksim's one line, never a traceback), and the
communication's share shown."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("dash")

import mksim  # noqa: E402
from explorer import data, jobs  # noqa: E402
from explorer.pages.compare import moe_inputs, run_compare  # noqa: E402
from explorer.pages.search import _progress, start_or_open  # noqa: E402
from explorer.pages.timeline import show_timeline  # noqa: E402
from mksim.errors import MksimError  # noqa: E402

GPU = "h200-datasheet"


@pytest.mark.parametrize(("tp", "ep", "says"), [
    (0, 1, "tensor-parallel GPUs must be a whole number from 1 to 64, got 0"),
    (65, 1, "tensor-parallel GPUs must be a whole number from 1 to 64, got 65"),
    (1.5, 1, "tensor-parallel GPUs must be a whole number, got 1.5"),
    ("two", 1, "tensor-parallel GPUs must be a whole number, got 'two'"),
    (1, [2], "expert-parallel GPUs must be a whole number, got a list"),
    (True, 1, "tensor-parallel GPUs must be a whole number, got a bool"),
])
def test_check_split_refuses_in_one_line(tp, ep, says):
    with pytest.raises(MksimError) as err:
        data.check_split(tp, ep)
    assert str(err.value) == says


@pytest.mark.slow  # 2.5 s of CPU: a comparison of llama-3.1-8b at --tp 2
def test_compare_tp2_is_mksim_compare_tp2_with_its_communication():
    msg, *_figs, table, d = run_compare(1, "llama-3.1-8b", GPU, 1, 1024, "decode", None, "none", "none", None, 2, 1)
    ref = mksim.compare.compare(mksim.Step("llama-3.1-8b", tp=2), GPU).to_dict()["modes"]
    assert msg == "" and d["workload"].endswith("tp2") and (d["tp"], d["ep"]) == (2, 1)
    for mode, r in ref.items():
        assert d["modes"][mode]["latency_us"] == r["latency_us"]
        assert d["modes"][mode]["communication_share"] == r["communication_share"]
    page = json.dumps(table.to_plotly_json(), default=str, ensure_ascii=False)
    assert "communication µs (share)" in page
    mk = ref["megakernel"]
    assert f"{mk['breakdown_us']['communication']:.1f} ({mk['communication_share']:.1%})" in page


@pytest.mark.parametrize(("model", "batch", "tp", "ep", "says"), [
    ("llama-3.1-8b", 1, 3, 1, "error: --tp 3 does not divide llama-3.1-8b's 32 attention heads; use one of 1, 2, 4, 8"),
    ("llama-3.1-8b", 1, 16, 1, "error: --tp 16 does not divide llama-3.1-8b's 8 KV heads; use one of 1, 2, 4, 8"),
    ("llama-3.1-8b", 1, 1, 2, "error: --ep 2: llama-3.1-8b is a dense model (no experts to split); use --tp"),
    ("qwen3-30b-a3b", 8, 4, 4, "error: --tp 4 --ep 4 needs 16 GPUs (tp × ep) but a h200-datasheet node has 8; "
                               "use at most 8"),
    ("qwen3-30b-a3b", 1, 1, 2, "error: --ep 2 runs attention data-parallel, batch / 2 sequences a GPU; batch 1 "
                               "does not divide: use a batch that 2 divides"),
    ("llama-3.1-8b", 1, -1, 1, "error: tensor-parallel GPUs must be a whole number from 1 to 64, got -1"),
])
def test_a_bad_split_is_one_line_on_every_page(model, batch, tp, ep, says):
    msg, *_figs, table, d = run_compare(1, model, GPU, batch, 1024, "decode", None, "none", "none", None, tp, ep)
    assert (msg, table, d) == (says, None, None)
    msg, summary, _fig, sched = show_timeline("timeline-run", model, GPU, batch, 1024, "decode", "megakernel", None,
                                              tp=tp, ep=ep)
    assert (msg, summary, sched) == (says, "", None)
    job = start_or_open("search-start", model, GPU, batch, 1024, 60, "latency", None, tp=tp, ep=ep)
    assert job == {"error": says.removeprefix("error: ")}


def test_ep_is_off_for_a_dense_model_and_back_to_1():
    assert moe_inputs("llama-3.2-1b") == (True, True, 1)
    off, ep_off, value = moe_inputs("qwen3-30b-a3b")
    assert (off, ep_off) == (False, False) and value is not None and value != 1  # no_update: kept as it is


@pytest.mark.slow  # 1.5 s of CPU
def test_timeline_says_the_communication_share():
    msg, summary, _fig, sched = show_timeline("timeline-run", "llama-3.2-1b", GPU, 1, 1024, "decode", "megakernel",
                                              None, tp=2)
    res = mksim.simulate(mksim.build_schedule(mksim.models.workload("llama-3.2-1b", tp=2, n_sms=132), GPU,
                                              "megakernel"))
    assert msg == "" and "decode b1 kv1024 tp2 on" in summary
    assert (f"communication {res.communication_us:.1f} µs ({res.communication_us / res.latency_us:.1%} of the step"
            in summary)
    assert json.loads(sched)["workload"]["tp"] == 2  # the schedule file keeps the split


def test_search_checks_the_split_and_names_the_study(tmp_path, monkeypatch):
    monkeypatch.setenv("MKSIM_EXPLORER_HOME", str(tmp_path))
    assert jobs.check_search("llama-3.1-8b", GPU, 1, 1024, 60, "latency", tp=2) == \
        "llama-3.1-8b-h200-datasheet-b1-kv1024-latency-tp2"
    assert jobs.check_search("qwen3-30b-a3b", GPU, 8, 1024, 60, "latency", tp=2, ep=4) == \
        "qwen3-30b-a3b-h200-datasheet-b8-kv1024-latency-tp2-ep4"
    with pytest.raises(MksimError, match="^trials must be at least 28 "):  # two more baselines: overlap, two-shot
        jobs.check_search("llama-3.1-8b", GPU, 1, 1024, 27, "latency", tp=2)
    assert jobs.check_search("llama-3.1-8b", GPU, 1, 1024, 26, "latency") == \
        "llama-3.1-8b-h200-datasheet-b1-kv1024-latency"


@pytest.mark.slow  # a search of the tiny model (its baselines), about 8 s
def test_search_page_shows_the_best_schedules_communication(tmp_path):
    from tests.mksim.searchkit import TINY_MODEL

    url = f"sqlite:///{tmp_path}/s.db"  # on a GPU the page names (Open the best reads it by name)
    res = mksim.search.search(str(TINY_MODEL), GPU, tp=2, trials=28, storage=url, study_name="tp")
    d = data.study_data(url, "tp")
    assert d["best"]["communication_us"] == res.best["communication_us"]
    line = _progress(d, 28, "done")
    b = res.best
    assert f"communication {b['communication_us']:.1f} µs, {b['communication_us'] / b['latency_us']:.1%} of the step" \
        in line
    sched = json.loads(data.best_schedule_json(url, "tp"))  # Open the best in Timeline: the split kept
    assert sched["workload"]["tp"] == 2 and sched["options"]["collective"] == b["candidate"]["options"]["collective"]
