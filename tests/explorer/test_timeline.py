"""The Timeline page: its data, its figure, and its callbacks called directly."""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("dash")

from dash import no_update  # noqa: E402

import hwmodels  # noqa: E402
from explorer import data, figures, store  # noqa: E402
from mksim.errors import MksimError  # noqa: E402

EPS_US = 1e-9


@pytest.fixture(scope="module")
def mk():
    return data.timeline_data("llama-3.2-1b", "h200-datasheet", mode="megakernel")


def _check_tracks(d):
    t, w = d["tasks"], d["waits"]
    assert sorted(t["task"]) == list(range(d["n_tasks"]))  # every task once
    assert len({len(v) for v in t.values()}) == 1 and len({len(v) for v in w.values()}) == 1
    assert d["tracks"] == sorted(set(t["sm"]))
    for cols in (t, w):
        for a, b in zip(cols["start_us"], cols["end_us"], strict=True):
            assert -EPS_US <= a < b <= d["latency_us"] + EPS_US
        assert all(0 <= s < d["lanes_per_sm"] for s in cols["slot"])
        assert set(cols["sm"]) <= set(range(d["n_sms"]))
    assert set(w["kind"]) <= set(data.WAIT_KINDS)


# -- Timeline data -----------------------------------------------------------------------
def test_timeline_data_megakernel_one_track_per_sm(mk):
    assert mk["n_sms"] == 132 and mk["lanes_per_sm"] == 1
    assert mk["tracks"] == list(range(132))
    _check_tracks(mk)
    assert {"dependency wait"} <= set(mk["waits"]["kind"])
    assert all(b > 0 for b in mk["tasks"]["bytes"])
    i = mk["tasks"]["task"].index(0)
    assert mk["tasks"]["name"][i] == "embed[0]" and mk["tasks"]["kind"][i] == "embed"


@pytest.mark.parametrize("mode,wait", [("graph_pdl", "dependency wait"), ("persistent_barrier", "barrier wait")])
def test_timeline_data_other_modes(mode, wait):
    d = data.timeline_data("llama-3.2-1b", "h200-datasheet", mode=mode)
    _check_tracks(d)
    assert wait in d["waits"]["kind"]
    if mode == "graph_pdl":  # two blocks per SM: the slots share their SM's track
        assert d["lanes_per_sm"] == 2 and set(d["tasks"]["slot"]) == {0, 1}


def test_timeline_data_of_a_schedule_file_reproduces_the_run(mk):
    again = data.timeline_data(schedule=mk["schedule_json"])
    assert again["latency_us"] == pytest.approx(mk["latency_us"])
    assert again["tasks"]["sm"] == mk["tasks"]["sm"]


@pytest.mark.parametrize("kw,match", [
    ({"batch": 0}, "batch must be a positive integer"),
    ({"mode": "warp"}, "unknown mode"),
    ({"gpu": "h900"}, "unknown GPU"),
    ({"schedule": "/etc/passwd"}, "not a schedule file"),
    ({"schedule": '{"format": "other"}'}, "not a mksim schedule"),
])
def test_timeline_data_bad_input(kw, match):
    with pytest.raises(MksimError, match=match):
        data.timeline_data(**kw)


@pytest.mark.slow  # 1.5 s of CPU
def test_perfetto_trace_one_track_per_sm(mk):
    trace = json.loads(data.perfetto_trace(mk["schedule_json"]))
    ev = trace["traceEvents"]
    names = [e["args"]["name"] for e in ev if e["name"] == "thread_name"]
    assert sum(not n.endswith("loader") for n in names) == 132  # an SM track each, and a loader track each
    assert sum(n.endswith("loader") for n in names) == 132
    tasks = [e for e in ev if e.get("cat") == "task"]
    assert len(tasks) == mk["n_tasks"]
    assert max(e["ts"] + e["dur"] for e in tasks) == pytest.approx(mk["latency_us"])


def test_doctests_of_the_data_functions():
    import doctest

    for fn in (data.timeline_data, data.storage_url, data.pareto_front):
        for t in doctest.DocTestFinder().find(fn, globs={"timeline_data": data.timeline_data,
                                                           "storage_url": data.storage_url,
                                                           "pareto_front": data.pareto_front}):
            assert doctest.DocTestRunner().run(t).failed == 0, fn.__name__


# -- Timeline figure ---------------------------------------------------------------------
def test_timeline_figure_few_traces_every_bar_drawn(mk):
    fig = figures.timeline_figure(mk)
    kinds = sorted(set(mk["tasks"]["kind"]))
    waits = [k for k in data.WAIT_KINDS if k in mk["waits"]["kind"]]
    lines = [t for t in fig.data if t.mode == "lines"]
    assert [t.name for t in lines] == kinds + waits
    assert len(fig.data) == 2 * len(lines)  # a line and a trace of hover points per kind
    assert all(t.type == "scattergl" for t in fig.data)
    n_bars = sum(len(t.x) for t in lines) // 3  # a, b and a gap per bar
    assert n_bars == mk["n_tasks"] + len(mk["waits"]["kind"])
    hover = [t for t in fig.data if t.mode == "markers"]
    assert sum(len(t.x) for t in hover) == n_bars
    assert "task %{customdata[0]}" in hover[0].hovertemplate and "KiB" in hover[0].hovertemplate
    assert list(fig.layout.yaxis.range) == [131.5, -0.5]  # SM 0 on top
    assert list(fig.layout.xaxis.range) == [0, mk["latency_us"]]


def test_timeline_figure_slots_stay_inside_their_sm_track():
    d = data.timeline_data("llama-3.2-1b", "h200-datasheet", mode="graph")
    fig = figures.timeline_figure(d)
    import numpy as np

    ys = np.concatenate([np.asarray(t.y, dtype=float) for t in fig.data if t.mode == "markers"])
    assert np.all(np.abs(ys - np.round(ys)) < 0.45)
    assert len(set(np.round(ys).astype(int))) == len(d["tracks"])


# -- Timeline callbacks ------------------------------------------------------------------
def test_timeline_callback_form(mk):
    from explorer.pages.timeline import show_timeline

    msg, summary, fig, sched = show_timeline("timeline-run", "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode",
                                             "megakernel", None)
    assert msg == "" and "on 132 SMs" in summary and len(fig.data) > 0
    assert json.loads(sched)["format"] == "mksim-schedule"
    assert summary.startswith("default schedule: ")


def test_timeline_mode_menu_follows_the_gpu():
    """A GPU without PDL shows graph_pdl disabled with mksim's reason; a chosen mode it lacks falls back."""
    from explorer.pages.timeline import MODES, mode_options
    from mksim.schedule import modes_on

    options, value, note = mode_options("a100", "graph_pdl")
    assert [o["value"] for o in options] == list(MODES) and value == "megakernel"
    off = [o for o in options if o.get("disabled")]
    reason = modes_on(hwmodels.load("a100"))[1]["graph_pdl"]
    assert [o["value"] for o in off] == ["graph_pdl"] and off[0]["title"] == reason
    assert off[0]["label"] == "graph_pdl (not on a100)" and note == f"graph_pdl: {reason}"
    options, value, note = mode_options("h200-datasheet", "graph_pdl")
    assert not any(o.get("disabled") for o in options) and value == "graph_pdl" and note == ""
    assert mode_options("a100", "stream")[1] == "stream"
    assert mode_options("no-such-gpu", "graph")[1:] == ("graph", "")  # running says the GPU is unknown


def test_timeline_callback_prefill():
    from explorer.pages.timeline import show_timeline

    msg, summary, fig, _ = show_timeline("timeline-run", "llama-3.2-1b", "h200-datasheet", 1, 1024, "prefill",
                                         "megakernel",
                                         None, prefill_tokens=16)
    assert msg == "" and "prefill" in summary
    msg, *_ = show_timeline("timeline-run", "llama-3.2-1b", "h200-datasheet", 1, 1024, "prefill", "megakernel", None,
                            prefill_tokens=0)
    assert msg.startswith("error: prefill needs prefill_tokens >= 1")


@pytest.mark.parametrize("batch,kv_len,mode,match", [
    (0, 1024, "megakernel", "batch must be a positive integer"),
    (None, 1024, "megakernel", "batch must be a whole number"),
    (1, 10_000_000, "megakernel", "exceeds llama-3.2-1b's context"),
    (1, 1024, None, "choose a model, a GPU, a phase and a mode"),
])
def test_timeline_callback_bad_input_one_line(batch, kv_len, mode, match):
    from explorer.pages.timeline import show_timeline

    msg, summary, fig, sched = show_timeline("timeline-run", "llama-3.2-1b", "h200-datasheet", batch, kv_len, "decode",
                                             mode, None)
    assert msg.startswith("error: ") and match in msg and "\n" not in msg
    assert summary == "" and len(fig.data) == 0 and sched is None


def _upload(text: bytes) -> str:
    return "data:application/json;base64," + base64.b64encode(text).decode()


def test_timeline_callback_upload(mk):
    from explorer.pages.timeline import show_timeline

    msg, summary, fig, sched = show_timeline("timeline-upload", None, None, None, None, None, None, None,
                                             _upload(mk["schedule_json"].encode()), "s.json")
    assert msg == "" and summary.startswith("schedule file s.json: ") and sched == mk["schedule_json"]
    for contents, match in ((_upload(b"\xff\xfe\x00"), "not a text file"), ("garbage", "not an uploaded file"),
                            (_upload(b"[1, 2]"), "not a schedule file"),
                            (_upload(b'{"format": "mksim-schedule"}'), "missing key")):
        msg, _, fig, sched = show_timeline("timeline-upload", None, None, None, None, None, None, None,
                                           contents, "bad.json")
        assert msg.startswith("error: ") and match in msg and "\n" not in msg and sched is None


def test_timeline_callback_token(mk):
    from explorer.pages.timeline import show_timeline

    token = store.put_schedule(mk["schedule_json"])
    assert store.put_schedule(mk["schedule_json"]) == token and store.get_schedule(token) == mk["schedule_json"]
    msg, summary, _, sched = show_timeline(None, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", "megakernel",
                                           None,
                                           token=token)
    assert msg == "" and summary.startswith("schedule from Search: ") and sched == mk["schedule_json"]
    msg, *_ = show_timeline(None, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", "megakernel", None, token="nope")
    assert msg.startswith("error: no schedule kept under 'nope'")


@pytest.mark.slow  # 1.1 s of CPU
def test_timeline_downloads(mk):
    from explorer.pages.timeline import schedule_download, trace_download

    assert schedule_download(1, None) is no_update and trace_download(0, mk["schedule_json"]) is no_update
    s = schedule_download(1, mk["schedule_json"])
    assert s["content"] == mk["schedule_json"] and s["filename"].endswith(".json")
    t = trace_download(1, mk["schedule_json"])
    assert "traceEvents" in json.loads(t["content"])


def test_timeline_layout_takes_the_token_from_the_query():
    from explorer.pages.timeline import layout

    def find(node, id_):
        if getattr(node, "id", None) == id_:
            return node
        for child in (node.children if isinstance(getattr(node, "children", None), list) else []):
            if (hit := find(child, id_)) is not None:
                return hit
        return None

    assert find(layout(schedule="abc"), "timeline-token").data == "abc"
    assert find(layout(), "timeline-token").data is None


def _find(node, id_):
    if getattr(node, "id", None) == id_:
        return node
    children = getattr(node, "children", None)
    for child in children if isinstance(children, list) else [children] if children is not None else []:
        if (hit := _find(child, id_)) is not None:
            return hit
    return None


def test_the_chart_box_starts_as_tall_as_the_first_chart(mk):
    """The page's chart box is as tall as the chart it draws first (h200's 132 SMs, or the GPU of the schedule
    Search kept), so the chart is not drawn a second time as it grows its box; each chart sets the height anew."""
    from explorer.pages.timeline import graph_style, layout, show_timeline

    first = show_timeline(None, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode", "megakernel", None)[2]
    assert _find(layout(), "timeline-graph").style == graph_style(first.layout.height) == {"height": "1014px"}
    a100 = data.timeline_data("llama-3.2-1b", "a100", mode="megakernel")
    token = store.put_schedule(a100["schedule_json"])
    shown = show_timeline(None, None, None, None, None, None, None, None, token=token)[2]
    assert _find(layout(schedule=token), "timeline-graph").style == graph_style(shown.layout.height) \
        == {"height": f"{figures.timeline_height(108)}px"}
    hostile = store.put_schedule(json.dumps({**json.loads(a100["schedule_json"]), "gpu": "/etc/passwd"}))
    for token in ("0" * 32, hostile, None):  # nothing kept, or a GPU it does not know: the default
        assert _find(layout(schedule=token), "timeline-graph").style == {"height": "1014px"}
    assert graph_style(None) == {}  # no chart (an error): the default box
