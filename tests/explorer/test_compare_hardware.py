"""The explorer's Compare additions (uploaded config, roofline, remembered runs) and the Hardware page:
data, figures and callbacks called directly."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

pytest.importorskip("dash")

import hwmodels  # noqa: E402
from explorer import data, figures  # noqa: E402
from explorer.hwdata import WhatIf, hardware_table, whatif_changes  # noqa: E402
from mksim.compare import compare_modes  # noqa: E402
from mksim.errors import MksimError  # noqa: E402

MODES = ["stream", "graph", "graph_pdl", "persistent_barrier", "megakernel"]
CONFIG = Path(__file__).resolve().parents[2] / "mksim" / "models" / "configs" / "llama-3.2-1b.json"


def _upload(obj: object) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return "data:application/json;base64," + base64.b64encode(raw).decode()


@pytest.fixture(scope="module")
def run():
    return data.compare_run("llama-3.2-1b", "h200-datasheet")


@pytest.fixture(scope="module")
def ref():
    return compare_modes("llama-3.2-1b", "h200-datasheet")


# -- compare_run: what mksim compare computes, plus per-op times ---------------------------
@pytest.mark.slow  # 1.4 s of CPU
def test_compare_run_is_mksim_compare(run, ref):
    assert list(run["modes"]) == MODES
    for mode in MODES:
        for key in ("latency_us", "tokens_per_s", "hbm_util", "speedup_vs_stream", "policy", "breakdown_us"):
            assert run["modes"][mode][key] == ref["modes"][mode][key], (mode, key)
    for key in ("gpu", "workload", "batch", "kv_len", "phase", "bandwidth_floor_us"):
        assert run[key] == ref[key]
    assert len(run["modes"]["graph"]["op_time_us"]) == len(run["ops"])


def test_compare_run_is_remembered_and_copied(run):
    again = data.compare_run("llama-3.2-1b", "h200-datasheet")
    assert again == run and again is not run
    again["modes"]["stream"]["latency_us"] = -1.0  # a caller's change does not reach the remembered run
    remembered = data.compare_run("llama-3.2-1b", "h200-datasheet")
    assert remembered["modes"]["stream"]["latency_us"] == run["modes"]["stream"]["latency_us"]


def test_compare_run_bad_input_raises():
    with pytest.raises(MksimError, match="batch must be a positive integer"):
        data.compare_run("llama-3.2-1b", "h200-datasheet", batch=0)
    with pytest.raises(MksimError, match="unknown GPU"):
        data.compare_run("llama-3.2-1b", "h999")


def test_uploaded_config_compares_as_the_built_in_model(run):
    up = data.parse_config_upload(_upload(json.loads(CONFIG.read_text())), "my-llama.json")
    assert up["name"] == "my-llama"
    assert up["summary"] == "my-llama: llama, 16 layers, hidden 2048, 32 heads (8 KV), 1.24 B parameters"
    mine = data.compare_run(up["name"], "h200-datasheet", config=up["config"])
    assert mine["workload"].startswith("my-llama ")
    assert {m: mine["modes"][m]["latency_us"] for m in MODES} == {m: run["modes"][m]["latency_us"] for m in MODES}


@pytest.mark.parametrize("content,filename,message", [
    (b"{oops", "bad.json", "bad.json: not a readable JSON config: not valid JSON ("),
    (b"[1, 2]", "list.json", "list.json: a config.json must hold a JSON object"),
    ({"model_type": "llama"}, "config.json", "config.json: missing key 'hidden_size' in the config"),
    ({"model_type": "gpt2", "hidden_size": 8}, "gpt2.json", "gpt2.json: model_type 'gpt2' is not supported"),
])
def test_malformed_upload_gives_mksims_one_line_error(content, filename, message):
    with pytest.raises(MksimError) as exc:
        data.parse_config_upload(_upload(content), filename)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


# -- roofline ----------------------------------------------------------------------------
def test_roofline_data(run):
    rd = data.roofline_data(run, "graph")
    g = hwmodels.load("h200-datasheet")
    assert rd["roofs"]["hbm_spec_GBps"] == g.dram.bandwidth_spec_GBps
    assert rd["roofs"]["ridge_flop_per_B"] == pytest.approx(989.5e12 / 4800e9)
    assert len(rd["points"]) + rd["skipped"] == len(run["ops"])
    for p in rd["points"]:
        # nothing runs above the memory roof at its intensity (spec bandwidth) or above the tensor peak
        assert p["attained_TFLOPs"] <= min(p["intensity_flop_per_B"] * 4.8, 989.5) * 1.0001
    qkv = next(p for p in rd["points"] if p["op"] == "L0.qkv_proj")
    op = next(o for o in run["ops"] if o["op"] == "L0.qkv_proj")
    assert qkv["intensity_flop_per_B"] == pytest.approx(op["flops"] / op["bytes"])
    assert qkv["intensity_flop_per_B"] == pytest.approx(1.0, rel=1e-3)  # a bf16 matvec: 2 FLOP per 2-byte weight
    with pytest.raises(MksimError, match="unknown mode"):
        data.roofline_data(run, "warp")


def test_roofline_figure():
    d = {"mode": "graph", "gpu": "g", "workload": "w", "skipped": 1,
         "roofs": {"hbm_spec_GBps": 1000.0, "hbm_reachable_GBps": 900.0, "tensor_TFLOPs": {"bf16": 100.0},
                   "vector_TFLOPs": 10.0, "ridge_flop_per_B": 100.0},
         "points": [{"op": "a", "kind": "matmul", "unit": "tensor", "intensity_flop_per_B": 1.0,
                     "attained_TFLOPs": 0.5, "time_us": 2.0},
                    {"op": "b", "kind": "rmsnorm", "unit": "vector", "intensity_flop_per_B": 2.0,
                     "attained_TFLOPs": 0.1, "time_us": 1.0}]}
    fig = figures.roofline_figure(d)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    roof, reach, vector, *kinds = fig.data
    assert list(roof.x) == [0.25, 100.0, 400.0] and list(roof.y) == pytest.approx([0.25, 100.0, 100.0])
    # 900 GB/s x intensity, up to the peak, which it meets at its own ridge
    assert list(reach.x) == pytest.approx([0.25, 100e12 / 900e9, 400.0])
    assert list(reach.y) == pytest.approx([0.225, 100.0, 100.0])
    assert max(vector.y) == pytest.approx(10.0)
    assert [t.name for t in kinds] == ["matmul", "rmsnorm"] and list(kinds[0].y) == [0.5]
    assert "1 ops without FLOPs left out" in fig.layout.title.text


# -- hardware: the side-by-side table and what-ifs ----------------------------------------
def test_hardware_table_has_every_number_with_unit_and_source():
    t = hardware_table()
    names = hwmodels.available()
    assert [g["name"] for g in t["gpus"]] == names
    specs = {n: hwmodels.load(n) for n in names}
    assert [r["key"] for r in t["rows"]] == list(dict.fromkeys(k for n in names for k in specs[n].numbers()))
    assert "kernels.matmul.consume_GBps" in [r["key"] for r in t["rows"]]
    refs = {s["ref"]: s for s in t["sources"]}
    for r in t["rows"]:
        assert r["unit"]
        for n in names:
            v, cell = specs[n].numbers().get(r["key"]), r["cells"][n]
            assert (cell is None) == (v is None)
            if cell:
                src = specs[n].source_of(r["key"])
                assert cell["value"] == v and refs[cell["ref"]]["title"] == src.title
                assert cell["estimate"] == (src.kind == "estimate")
    row = {r["key"]: r for r in t["rows"]}
    assert row["dram.bandwidth_spec_GBps"]["unit"] == "GB/s (1e9 B/s)"
    assert row["sm.clock_boost_MHz"]["cells"]["h200-calibrated"]["overlay"]  # 1976, measured, over h200's 1980
    assert not row["sm.count"]["cells"]["h200-calibrated"]["overlay"]
    assert [g["extends"] for g in t["gpus"] if g["name"] == "h200-calibrated"] == ["h200-datasheet"]


def test_hardware_table_numbers_refs_as_the_hardware_page_of_the_docs():
    from hwmodels.docs import render

    text = render()  # docs/hardware.md, as its generator writes it
    t = hardware_table()
    h200 = next(r for r in t["rows"] if r["key"] == "dram.bandwidth_spec_GBps")["cells"]["h200-datasheet"]
    assert f"4800 [{h200['ref']}]" in text


def test_whatif_identity_is_the_gpu_itself():
    g = hwmodels.load("h200-datasheet")
    assert WhatIf().apply(g) is g and WhatIf(sm_count=132).apply(g) is g
    assert whatif_changes(g, WhatIf().apply(g)) == []


def test_whatif_overrides():
    g = hwmodels.load("h200-calibrated")
    w = WhatIf(launch_scale=0.0, hbm_scale=2.0, sync_scale=0.5, sm_count=66).apply(g)
    assert w is not g and g.launch.graph_node_us > 0  # the loaded spec is untouched
    assert w.name == "h200-calibrated (what-if)"
    assert (w.launch.stream_launch_us, w.launch.graph_node_us, w.launch.pdl_node_us, w.launch.stream_gap_us,
            w.launch.launch_latency_us, w.launch.block_setup_us) == (0.0,) * 6
    assert w.launch.first_load_us == g.launch.first_load_us  # a memory latency, not a launch cost
    assert w.dram.bandwidth_spec_GBps == 2 * g.dram.bandwidth_spec_GBps
    assert w.dram.reachable_fraction == g.dram.reachable_fraction
    assert w.sync.grid_barrier_us == pytest.approx(g.sync.grid_barrier_us / 2)
    assert w.sync.flag_latency_ns == pytest.approx(g.sync.flag_latency_ns / 2)
    assert w.sm.count == 66
    assert w.compute.tensor_bf16_dense_TFLOPs == pytest.approx(g.compute.tensor_bf16_dense_TFLOPs / 2)
    assert w.l2.bandwidth_GBps == pytest.approx(g.l2.bandwidth_GBps / 2)
    keys = [c["key"] for c in whatif_changes(g, w)]
    assert "launch.graph_node_us" in keys and "sm.count" in keys and "launch.first_load_us" not in keys
    c = next(c for c in whatif_changes(g, w) if c["key"] == "dram.bandwidth_spec_GBps")
    assert c == {"key": "dram.bandwidth_spec_GBps", "unit": "GB/s (1e9 B/s)", "base": 4800.0, "new": 9600.0}


@pytest.mark.parametrize("kw,match", [({"launch_scale": -1}, "launch_scale must be 0 or more"),
                                      ({"hbm_scale": 0}, "hbm_scale must be positive"),
                                      ({"sm_count": 0}, "sm_count must be a positive integer"),
                                      ({"sm_count": 1.5}, "sm_count must be a positive integer")])
def test_whatif_bad_values(kw, match):
    with pytest.raises(MksimError, match=match):
        WhatIf(**kw).apply(hwmodels.load("h200-datasheet"))


def test_free_launches_help_the_chains_most(run):
    d = data.whatif_data("llama-3.2-1b", "h200-datasheet", WhatIf(launch_scale=0.0))
    assert d["base"] == run
    lat = {m: (d["base"]["modes"][m]["latency_us"], d["whatif"]["modes"][m]["latency_us"]) for m in MODES}
    assert all(new <= base for base, new in lat.values())
    gain = {m: 1 - new / base for m, (base, new) in lat.items()}
    assert min(gain["stream"], gain["graph"]) > 0.15 > max(gain["persistent_barrier"], gain["megakernel"])
    assert d["whatif"]["gpu"] == "h200-datasheet (what-if)"


def test_whatif_figure(run):
    d = {"base": run, "whatif": run, "changes": []}
    fig = figures.whatif_figure(d)
    assert [t.name for t in fig.data] == ["as specified", "what-if"] and fig.layout.barmode == "group"
    assert list(fig.data[0].x) == MODES
    assert list(fig.data[1].y) == [run["modes"][m]["latency_us"] for m in MODES]


# -- callbacks, called directly ----------------------------------------------------------
def test_compare_callback_returns_table_and_result(run):
    from explorer.pages.compare import roofline, run_compare

    msg, lat, _tok, _hbm, _brk, div, result = run_compare(1, "llama-3.2-1b", "h200-datasheet", 1, 1024, "decode")
    assert msg == "" and result == run
    table, assumes = div.children  # h200 has every mode: no note of absent modes, no stack
    assert table.id == "compare-results" and assumes.id == "compare-assumes"
    assert assumes.children[0].children[:2] == ["the modes assume ", run["assumes"]["text"].removeprefix("assumes: ")]
    assert assumes.children[0].children[3].startswith(f"± {run['interval']['half_width_pct']:.1f} %: the 90th")
    assert "no implementation profile" in run["assumes"]["text"]
    body = table.children[-1].children
    assert [r.children[0].children for r in body] == MODES
    assert body[0].children[1].children == f"{run['modes']['stream']['latency_us']:.1f}"
    fig = roofline(result, "megakernel")
    assert "in megakernel on h200" in fig.layout.title.text
    assert len(roofline(None, "graph").data) == 0


def test_upload_callback():
    import dash

    from explorer.pages.compare import UPLOADED, run_compare, upload_config

    msg, stored, options, value = upload_config(_upload(json.loads(CONFIG.read_text())), "tiny.json")
    assert msg.startswith("loaded tiny: llama, 16 layers")
    assert value == UPLOADED + "tiny" and options[-1] == value and "llama-3.2-1b" in options
    out = run_compare(1, value, "h200-datasheet", 1, 1024, "decode", stored)
    assert out[0] == "" and out[-1]["workload"].startswith("tiny ")
    assert run_compare(1, value, "h200-datasheet", 1, 1024, "decode",
                       None)[0] == "error: the uploaded config is gone; " \
                                                                       "upload it again"
    msg, stored, options, value = upload_config(_upload(b"{"), "x.json")
    assert msg.children.startswith("error: x.json: not a readable JSON config") and stored is None
    assert value is dash.no_update and UPLOADED + "tiny" not in options


@pytest.mark.slow  # 1.5 s of CPU
def test_hardware_callbacks():
    import xml.etree.ElementTree as ET

    from explorer.pages.hardware import gpu_table, gpu_table_html, run_whatif

    names = ["h200-datasheet", "h200-calibrated"]
    table, sources = (ET.fromstring(h) for h in gpu_table_html(names))  # well-formed: every text escaped
    assert [th.text for th in table.find("thead/tr")] == ["key", "unit", "h200-datasheet", "h200-calibrated"]
    assert table.find("thead/tr")[3].find("small").text == "extends h200-datasheet"
    d = hardware_table(names)
    rows = table.findall("tbody/tr")
    assert [r.find("th/code").text for r in rows] == [r["key"] for r in d["rows"]]
    bw = next(r for r in rows if r.find("th/code").text == "dram.bandwidth_spec_GBps")
    assert bw[1].text == "GB/s (1e9 B/s)" and bw[2].text == "4800" and "datasheet" in bw[2].get("title")
    assert [li.get("value") for li in sources] == [str(s["ref"]) for s in d["sources"]]
    assert all(a.get("href").startswith("https://") for a in sources.iter("a"))
    components = gpu_table(names)  # each one Markdown component of that HTML, not a component per cell
    assert [c.children for c in components] == list(gpu_table_html(names))
    assert all(c.dangerously_allow_html for c in components)
    msg, changes, wtable, fig = run_whatif("llama-3.2-1b", "h200-datasheet", 1, 1024, 1.0, 1.0, 1.0, 1.0)
    assert msg == "" and "No overrides" in changes.children
    assert [t.name for t in fig.data] == ["as specified", "what-if"]
    msg, changes, wtable, fig = run_whatif("llama-3.2-1b", "h200-datasheet", 1, 1024, 1.0, 1.0, 1.0, 0.5)
    assert "sm.count" in str(changes) and "66" in str(changes)
    msg, *rest = run_whatif("llama-3.2-1b", "h200-datasheet", 0, 1024, 1.0, 1.0, 1.0, 1.0)
    assert msg == "error: batch must be a positive integer, got 0" and len(rest[-1].data) == 0


def test_compare_page_leaves_out_what_the_gpu_lacks_with_a_note():
    from explorer.pages.compare import roofline_modes, run_compare

    msg, *_figs, div, result = run_compare(1, "llama-3.2-1b", "l40s", 1, 1024, "decode")
    assert msg == "" and "graph_pdl" not in result["modes"]
    table, _assumes, note = div.children
    assert [r.children[0].children for r in table.children[-1].children] == [m for m in MODES if m != "graph_pdl"]
    assert note.id == "compare-absent" and note.children[0].children[0].children == "graph_pdl"
    assert note.children[0].children[1] == f" left out: {result['absent']['graph_pdl']}"
    assert "no programmatic dependent launch" in result["absent"]["graph_pdl"]
    assert roofline_modes(result, "graph_pdl") == (["stream", "graph", "persistent_barrier", "megakernel"], "graph")
    assert roofline_modes(None, "graph_pdl")[1] == "graph_pdl"


def test_hardware_table_html_escapes_what_the_files_say(monkeypatch):
    """The table is HTML text the browser reads as it is: whatever a hardware file's names, titles and links
    hold stays text (escaped), and only an http(s) link becomes a link."""
    import xml.etree.ElementTree as ET

    from explorer.pages import hardware

    evil = '<img src=x onerror="alert(1)">'
    src = {"ref": 1, "gpu": evil, "kind": "datasheet", "date": "", "title": evil, "url": "javascript:alert(1)",
           "note": evil}
    monkeypatch.setattr(hardware, "hardware_table", lambda names: {
        "gpus": [{"name": evil, "full_name": evil, "extends": evil}],
        "rows": [{"key": evil, "unit": evil, "cells": {evil: {"value": 1.5, "ref": 1, "estimate": True,
                                                              "overlay": True}}}],
        "sources": [src]})
    table, sources = hardware.gpu_table_html(None)
    assert "<img" not in table + sources and "&lt;img" in table and "&lt;img" in sources
    t, s = ET.fromstring(table), ET.fromstring(sources)
    assert t.find("thead/tr")[2].get("title") == evil and t.find("tbody/tr/th/code").text == evil
    assert t.find("tbody/tr")[2].text == "1.5*" and "font-weight:bold" in t.find("tbody/tr")[2].get("style")
    assert not list(s.iter("a")) and evil in "".join(s.itertext())
