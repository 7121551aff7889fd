"""The transformers stacks' profiles (hf, hf-compiled): the host's costs in mksim, the fits reproduced from
the committed single modules, the committed predictions, and compare with them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hwmodels
import mksim
from mksim.compare import compare_modes
from mksim.costs import host_issue_times, rates
from validation.stacks import hf_fit, hf_host_fit, predict, records
from validation.stacks.fit import STACK_PROFILE

ROOT = Path(__file__).resolve().parents[2]
SINGLES = ROOT / "validation/results/h200-stacks/hf/singles"
HOST = ROOT / "validation/results/h200-stacks/hf-host"


def test_host_issue_times_spread_each_ops_host_time_over_its_kernels():
    r = rates(hwmodels.load("h200-calibrated+hf"))
    kinds = ["rmsnorm", "rmsnorm", "matmul", "embed_unknown_kind"]
    ops = ["L0.attn_norm", "L0.attn_norm", "L0.qkv_proj", "x"]
    t = host_issue_times(kinds, ops, r)
    h = r.host_us
    assert t[0] == pytest.approx(r.host_step_us + h["rmsnorm"] / 2)
    assert t[2] == pytest.approx(r.host_step_us + h["rmsnorm"] + h["matmul"])
    assert t[3] - t[2] == pytest.approx(r.stream_launch_us)          # a kind with no host cost
    assert host_issue_times(kinds, ops, r, default_us=0.0)[3] == pytest.approx(t[2])


@pytest.mark.slow  # a simulated step or more: over 1 s of CPU
def test_the_eager_step_is_the_hosts_chain():
    wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    s = mksim.build_schedule(wl, "h200-calibrated+hf", "stream")
    r = rates(s.gpu)
    host = host_issue_times([o.kind for o in s.workload.ops], [o.name for o in s.workload.ops], r)
    lat = mksim.simulate(s, timeline=False).latency_us
    n_of = {}
    for op in s.workload.ops:
        k = mksim.workload.kernel_of(op)
        n_of[k] = n_of.get(k, 0) + 1
    # every op's host time is paid once: the host's chain is the step, the GPU far behind it
    total = r.host_step_us + sum(r.host_us.get(op.kind, r.stream_launch_us) for op in wl.ops)
    assert total == pytest.approx(14000, rel=0.05) and lat > total
    assert lat - total < 0.05 * lat and len(host) == len(s.graph.ops)
    # without the host's costs the same kernels take a fraction of it
    bare = hwmodels.load("h200-calibrated+torch")
    assert mksim.simulate(mksim.build_schedule(wl, bare, "stream"), timeline=False).latency_us < lat / 4


@pytest.mark.slow  # a simulated step or more: over 1 s of CPU
def test_a_compiled_steps_graph_waits_for_its_hosts_part():
    wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    s = mksim.build_schedule(wl, "h200-calibrated+hf-compiled", "graph")
    r = rates(s.gpu)
    res = mksim.simulate(s, timeline=False)
    first = min(p["start_us"] for p in res.per_op) if "start_us" in res.per_op[0] else None
    host = r.host_step_us + sum(r.host_us.get(op.kind, 0.0) for op in wl.ops) + len(s.graph.ops) * r.host_graph_node_us
    assert res.latency_us > host + r.launch_latency_us
    if first is not None:
        assert first == pytest.approx(host + r.launch_latency_us, abs=1.0)


@pytest.mark.slow  # ~2 s of CPU: four fits
@pytest.mark.parametrize("stack", ["hf", "hf_compiled"])
def test_the_committed_hf_profiles_are_the_fit_of_the_committed_single_modules_and_host_runs(stack, tmp_path):
    run = tmp_path / "singles"
    shutil.copytree(SINGLES, run, ignore=shutil.ignore_patterns("ops-*"))   # the fit extracts them again
    text = hf_fit.profile_text(run, stack, HOST).replace(str(run), str(SINGLES.relative_to(ROOT)))
    text = text.replace(str(HOST), str(HOST.relative_to(ROOT)))
    committed = (ROOT / "hwmodels/profiles" / f"{hf_fit.PROFILE[stack]}.toml").read_text()
    assert text == records.without_record(committed)
    for f in run.glob("ops-*.json"):           # the committed ops files are the extracted ones
        assert f.read_text() == (SINGLES / f.name).read_text()
    assert hwmodels.profile_info(hf_fit.PROFILE[stack])["mode"] == hf_fit.MODE[stack]


def test_the_committed_steps_are_those_of_the_committed_host_runs(tmp_path):
    # every whole step of the transformers stacks in the summary is extracted from hf_host.py's raw files
    names = hf_host_fit.extract_all(HOST, tmp_path)
    assert names == sorted(f.name for f in HOST.glob("step-*.json"))
    for name in names:
        assert (tmp_path / name).read_text() == (HOST / name).read_text()
    # the compiled steps of r3 replaced r2's; the eager ones are r1's, with the kernels the later runs counted
    rec = json.loads((HOST / "step-hf_compiled-llama-3.1-8b-b1-kv1024.json").read_text())
    assert rec["source"] == "hf-host-r3.json"
    rec = json.loads((HOST / "step-hf-mistral-7b-b1-kv1024.json").read_text())
    assert (rec["source"], rec["kernels_source"], rec["kernels_per_step"]) == ("hf-host-r1.json", "hf-host-r3.json",
                                                                               1493)


@pytest.mark.slow  # a simulated step or more: over 1 s of CPU
def test_the_summary_holds_the_committed_profiles_predictions_of_the_host_runs_steps():
    s = json.loads((ROOT / "validation/results/h200-stacks/summary.json").read_text())
    assert s["hf_run"] == str(HOST.relative_to(ROOT)) and s["hf_host"] is True
    hf_cases = [c for c in s["cases"] if c["stack"] in predict.HF_STACKS]
    steps = {(st.stack, st.model, st.batch): st.median_us for st in predict.load_hf_steps(HOST)}
    assert {(c["stack"], c["model"], c["batch"]): c["measured_us"] for c in hf_cases} == steps
    # the host's costs were fitted to llama-3.2-1b and llama-3.1-8b only: every other model is held out
    assert {c["model"] for c in hf_cases if c["held_out"]} == {"mistral-7b", "qwen3-8b", "llama-3.2-3b", "qwen2.5-7b"}
    for stack in predict.HF_STACKS:
        c = next(c for c in hf_cases if c["stack"] == stack and c["held_out"])
        got, _, _ = predict.predict_step(c["model"], c["batch"], c["kv_len"], f"h200-calibrated+{STACK_PROFILE[stack]}",
                                         predict.STACK_MODE.get(stack, "graph"))
        assert round(got, 1) == c["predicted_us"]


@pytest.mark.slow  # a simulated step or more: over 1 s of CPU
def test_compare_runs_each_stack_in_its_own_mode_with_its_interval():
    d = compare_modes("llama-3.2-1b", "h200", stack="hf")
    rec = hwmodels.profile_info("hf")["validation"]
    assert d["stack"]["mode"] == "stream" and d["stack"]["interval"]["half_width_pct"] == rec["p90_abs_pct"] == 8.4
    d = compare_modes("llama-3.2-1b", "h200", stack="hf-compiled")
    assert d["stack"]["mode"] == "graph" and d["stack"]["interval_us"] is not None


def test_a_profile_with_a_bad_mode_is_one_line(tmp_path):
    text = (ROOT / "hwmodels/profiles/hf.toml").read_text().replace('mode = "stream"', 'mode = "eager"')
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(hwmodels.HardwareFileError, match="mode must be one of graph, stream"):
        hwmodels.load("h200-calibrated", profile=str(f))


@pytest.mark.slow  # reads and maps a trace, predicts a megakernel: over 1 s of CPU
def test_a_traced_compiled_transformers_step_is_imported_and_mapped():
    import mksim.trace
    t = mksim.trace.import_trace(SINGLES / "trace-hf_compiled-llama-3.2-1b-b1.json.gz", model="llama-3.2-1b",
                                 batch=1, kv_len=1024)
    assert t.mapped_fraction >= 0.95                       # 97.1 %: Inductor's kernels and cuBLAS's GEMMs
    assert t.replay_us == pytest.approx(t.step_us, rel=0.05)
    assert 1500 < t.step_us < 1700 and t.prediction.megakernel_us < t.step_us
