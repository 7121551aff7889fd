"""The transformers stacks' host measured in interleaved rounds (``hf_host.py``) and fitted to its fit part only
(``hf_host_fit.py``); the q/k norms' host cost in mksim."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import hwmodels
import mksim
from mksim.costs import QK_NORM, host_issue_times, host_kind, rates
from validation.stacks import hf_fit, hf_host_fit, predict

ROOT = Path(__file__).resolve().parents[2]
SINGLES = ROOT / "validation/results/h200-stacks/hf/singles"

#: one fitted case's module medians: the kinds come out as rmsnorm 100 (norms 80 each, half of a layer's
#: rest of 40), matmul 35 (seven projections of 20 over mksim's four), rope_kv 50, attn_partial 100, silu_mul
#: 30, embed 10: a layer's ops sum to 2*100 + 4*35 + 50 + 100 + 30 = 520 us
MODULES = {"q": 20.0, "k": 20.0, "v": 20.0, "o": 20.0, "gate": 20.0, "up": 20.0, "down": 20.0,
           "attn_norm": 80.0, "mlp_norm": 80.0, "attn": 80.0 + 50.0 + 100.0, "mlp": 90.0,
           "rope": 40.0, "cache_update": 10.0, "embed": 10.0}
MODULES["layer"] = MODULES["attn_norm"] + MODULES["attn"] + MODULES["mlp_norm"] + MODULES["mlp"] + 40.0


def raw(slope: float = 1040.0, icpt: float = 700.0, rounds: int = 3) -> dict:
    """A raw file whose small models cost ``icpt + slope x layers`` in every round and whose compiled small
    models spend 100 + 20 x layers before their graph's launch."""
    mods = {k: [v] * rounds for k, v in MODULES.items()} | {f"model{n}": [icpt + slope * n] * rounds
                                                           for n in (1, 2, 4)}
    calls = {f"llama-3.2-1b-{n}L-b1-kv16": [{"step_us": 500.0, "pre_us": 100.0 + 20.0 * n, "graph_us": 300.0,
                                             "host_pre_us": 0.0, "host_launch_us": 0.0, "host_post_us": 0.0}]
             * rounds for n in (1, 2, 4)}
    calls["llama-3.2-1b-b1-kv16"] = [{"step_us": s, "pre_us": 400.0, "graph_us": s - 400.0, "host_pre_us": 0.0,
                                      "host_launch_us": 0.0, "host_post_us": 0.0} for s in (1900.0, 2000.0, 2100.0)]
    cases = {k: {"kind": "small", "model": "llama-3.2-1b", "layers": int(k.split("-")[3][:-1]), "batch": 1}
             for k in calls if "L-" in k}
    cases["llama-3.2-1b-b1-kv16"] = {"kind": "whole", "model": "llama-3.2-1b", "layers": 16, "batch": 1,
                                     "kernels": 325, "gpu_busy_us": 1450.0}
    probe = {"probe": {"python_us": 1000.0, "torch_us": 800.0}, "state": {}}
    return {"env": {"torch": "t", "transformers": "x", "cpu": "c", "date_utc": "2026-12-05T00:00:00Z"},
            "kv_len": 16, "fit_models": ["llama-3.2-1b"], "held_out": ["mistral-7b"], "batches": [1],
            "eager": {"rounds": [probe] * rounds, "modules": {"llama-3.2-1b-b1-kv16": mods},
                      "steps": {"mistral-7b-b1-kv16": [{"step_us": s, "host_us": s - 100.0}
                                                       for s in (30000.0, 31000.0, 32000.0)]}},
            "eager_kernels": {"mistral-7b-b1-kv16": {"kernels": 1493, "gpu_busy_us": 6000.0}},
            "compiled_cases": cases, "compiled": {"rounds": [probe] * rounds, "calls": calls}}


def test_a_qk_normed_rope_pays_the_norms_host_time_too():
    r = replace(rates(hwmodels.load("h200-calibrated+hf")), host_qk_norm_us=30.0)
    kinds = ["rope_kv" + QK_NORM, "rope_kv" + QK_NORM, "rope_kv"]
    ops = ["L0.rope_kv", "L0.rope_kv", "L1.rope_kv"]
    t = host_issue_times(kinds, ops, r)
    h = r.host_us["rope_kv"]
    assert t[0] - r.host_step_us == pytest.approx((h + 30.0) / 2)
    assert t[1] - t[0] == pytest.approx((h + 30.0) / 2) and t[2] - t[1] == pytest.approx(h)
    op = mksim.workload.Op(name="L0.rope_kv", kind="rope_kv", out_size=1, elem_bytes=2, flops=0.0,
                           attrs={"qk_norm": False})
    assert host_kind(op) == "rope_kv"


def test_the_eager_fit_scales_the_modules_to_a_layer_inside_a_model():
    e = hf_host_fit.eager_fit(raw(slope=1040.0, icpt=700.0))
    assert e["scale"] == pytest.approx(2.0)                   # 1040 us a layer in a model, 520 us of modules
    assert e["per_kind"] == {"rmsnorm": 200.0, "matmul": 70.0, "rope_kv": 100.0, "attn_partial": 200.0,
                             "silu_mul": 60.0, "embed": 20.0}
    assert e["host_step_us"] == pytest.approx(700.0 - 200.0 - 70.0 - 20.0)
    assert e["host_qk_norm_us"] == pytest.approx(2 * 160.0)   # two norm calls of 80 us, scaled


def test_the_compiled_fit_is_the_line_of_the_small_models_host_part():
    c = hf_host_fit.compiled_fit(raw())
    assert (c["host_step_us"], c["per_layer_us"]) == (pytest.approx(100.0), pytest.approx(20.0))


def test_the_whole_steps_are_written_for_the_check_and_never_read_by_the_fit(tmp_path):
    r = raw()
    f = tmp_path / "hf-host-r1.json"
    f.write_text(json.dumps(r))
    names = hf_host_fit.extract_steps(f, tmp_path)
    assert names == ["step-hf-mistral-7b-b1-kv16.json", "step-hf_compiled-llama-3.2-1b-b1-kv16.json"]
    steps = predict.load_hf_steps(tmp_path)
    assert [(s.stack, s.model, s.median_us, s.kernels) for s in steps] == [
        ("hf", "mistral-7b", 31000.0, 1493), ("hf_compiled", "llama-3.2-1b", 2000.0, 325)]
    r["eager"]["steps"] = {}                                   # the fit does not move without the steps
    r["compiled_cases"] = {k: v for k, v in r["compiled_cases"].items() if v["kind"] == "small"}
    assert hf_host_fit.eager_fit(r) == hf_host_fit.eager_fit(raw())
    assert hf_host_fit.compiled_fit(r) == hf_host_fit.compiled_fit(raw())
    assert hf_host_fit.host_spread(raw())["eager_python_us"]["off_20_pct"] == 0.0


def eager_only(date: str = "2026-12-05T00:00:00Z") -> dict:
    """A run of the eager part alone: its compiles ran out of budget (cases, no compiled rounds), no profiler."""
    r = raw(slope=1040.0, icpt=700.0)
    r["compiled"] = {"rounds": [], "calls": {k: [] for k in r["compiled"]["calls"]}}
    del r["eager_kernels"]
    return r | {"env": {**r["env"], "date_utc": date}}


def compiled_only(date: str, pre0: float = 100.0, step_us: float = 2500.0) -> dict:
    """A run of the compiled part alone (``--eager-s 0``): small models spending ``pre0`` + 20 x layers before
    the launch, the whole llama-3.2-1b ``step_us`` a call; the profiler counted mistral-7b's eager step."""
    r = raw()
    del r["eager"]
    for k, xs in r["compiled"]["calls"].items():
        n = r["compiled_cases"][k]["layers"]
        r["compiled"]["calls"][k] = ([{**x, "pre_us": pre0 + 20.0 * n} for x in xs] if "L-" in k else
                                     [{**x, "step_us": step_us} for x in xs])
    r["eager_kernels"] = {"mistral-7b-b1-kv16": {"kernels": 1500, "gpu_busy_us": 6100.0}}
    return r | {"env": {**r["env"], "date_utc": date}}


def write_runs(folder: Path, **runs: dict) -> Path:
    folder.mkdir(exist_ok=True)
    for name, r in runs.items():
        (folder / f"hf-host-{name}.json").write_text(json.dumps(r))
    return folder


def test_each_stack_reads_the_newest_run_that_holds_its_part(tmp_path):
    # r1: eager only; r2, r3: compiled only (r3 newer by its date, though its name sorts first: "a" < "r")
    d = write_runs(tmp_path, r1=eager_only("2026-12-04T17:00:00Z"), r2=compiled_only("2026-12-04T18:00:00Z"),
                   a3=compiled_only("2026-12-04T19:00:00Z", pre0=300.0))
    assert [f.name for f in hf_host_fit.raw_files(d)] == ["hf-host-r1.json", "hf-host-r2.json", "hf-host-a3.json"]
    assert hf_host_fit.newest(d, "eager")[0].name == "hf-host-r1.json"       # the newer runs have no eager part
    assert hf_host_fit.newest(d, "compiled")[0].name == "hf-host-a3.json"    # r1's compiled cases have no rounds
    assert hf_host_fit.compiled_fit(hf_host_fit.newest(d, "compiled")[1])["host_step_us"] == pytest.approx(300.0)
    assert hf_host_fit.fit_models(d) == {"hf": ["llama-3.2-1b"], "hf_compiled": ["llama-3.2-1b"]}
    with pytest.raises(hf_fit.fit.FitError, match="no hf-host-\\*.json run holds the eager part"):
        hf_host_fit.newest(write_runs(tmp_path / "c", r2=compiled_only("2026-12-04T18:00:00Z")), "eager")


def test_the_steps_of_every_run_are_written_a_later_runs_case_replacing_an_earlier_ones(tmp_path):
    d = write_runs(tmp_path, r1=raw(), r2=eager_only("2026-12-06T00:00:00Z"),
                   r3=compiled_only("2026-12-07T00:00:00Z", step_us=2500.0))
    names = hf_host_fit.extract_all(d)
    assert names == ["step-hf-mistral-7b-b1-kv16.json", "step-hf_compiled-llama-3.2-1b-b1-kv16.json"]
    steps = {(s.stack, s.model): s for s in predict.load_hf_steps(d)}
    assert steps["hf_compiled", "llama-3.2-1b"].median_us == 2500.0          # r3's, not r1's 2000
    # r2's eager step (the newest) with the kernels of the newest run that counted them (r3)
    assert (steps["hf", "mistral-7b"].median_us, steps["hf", "mistral-7b"].kernels) == (31000.0, 1500)
    rec = json.loads((d / "step-hf-mistral-7b-b1-kv16.json").read_text())
    assert (rec["source"], rec["kernels_source"]) == ("hf-host-r2.json", "hf-host-r3.json")


def test_an_eager_step_no_run_counted_is_predicted_without_a_gap_per_kernel(tmp_path):
    d = write_runs(tmp_path, r1=eager_only())
    hf_host_fit.extract_all(d)
    (s,) = [s for s in predict.load_hf_steps(d) if s.stack == "hf"]
    assert s.kernels == 0
    c = {"model": s.model, "batch": 1, "kv_len": 16, "stack": "hf", "error_pct": -20.0, "predicted_us": 24800.0,
         "measured_us": 31000.0, "kernels_per_step": 0, "predicted_kernels_per_step": 1425, "measured_kernel_us": 0.0,
         "measured_gap_us_per_kernel": None}
    assert "not counted" in predict.miss(c, 0.7)["effect"]


@pytest.mark.slow  # two fits of the committed single modules: over 1 s of CPU
@pytest.mark.parametrize("stack", ["hf", "hf_compiled"])
def test_a_profile_takes_its_host_costs_from_a_host_run(stack, tmp_path):
    run = tmp_path / "singles"
    shutil.copytree(SINGLES, run, ignore=shutil.ignore_patterns("ops-*"))
    # the eager part from r1, the compiled part from r2 (newer, compiled only: its eager part would differ)
    host = write_runs(tmp_path / "host", r1=raw(), r2=compiled_only("2026-12-06T00:00:00Z", pre0=150.0))
    f = tmp_path / "p.toml"
    f.write_text(hf_fit.profile_text(run, stack, host))
    r = rates(hwmodels.load("h200-calibrated", profile=str(f)))
    if stack == "hf":
        assert r.host_us["matmul"] == pytest.approx(70.0) and r.host_qk_norm_us == pytest.approx(320.0)
        assert r.host_step_us == pytest.approx(410.0)
    else:
        assert r.host_step_us == pytest.approx(150.0) and r.host_us["matmul"] == pytest.approx(2.0)   # r2's
    text = f.read_text()
    assert 'source = "hostrounds"' in text and f"--stack {stack} --host {host} --out" in text
    assert f"hf-host-{'r1' if stack == 'hf' else 'r2'}.json (hf_host.py, its fit part only)" in text


@pytest.mark.slow  # builds a qwen3-8b schedule: over 1 s of CPU
def test_qwen3s_eager_step_pays_its_q_and_k_norm_calls_each_layer():
    wl = mksim.models.workload("qwen3-8b", batch=1, kv_len=1024)
    s = mksim.build_schedule(wl, "h200-calibrated+hf", "stream")
    r = rates(s.gpu)
    by = {op.name: op for op in s.graph.ops}
    ops_of = [mksim.workload.kernel_of(op) for op in s.graph.ops]
    kinds = [host_kind(by.get(o, op)) for o, op in zip(ops_of, s.graph.ops, strict=True)]
    with_qk = host_issue_times(kinds, ops_of, r)[-1]
    without = host_issue_times(kinds, ops_of, replace(r, host_qk_norm_us=0.0))[-1]
    assert r.host_qk_norm_us > 0
    assert with_qk - without == pytest.approx(mksim.models.get("qwen3-8b").num_layers * r.host_qk_norm_us)


@pytest.mark.slow  # builds small transformers models on the CPU and runs rounds: ~20 s
def test_the_rounds_run_end_to_end_on_the_cpu(tmp_path, monkeypatch):
    from validation.stacks import hf, hf_host
    orig = hf.hf_config

    def tiny(name, *a, **k):
        c = orig(name, *a, **k)
        c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size = 64, 128, 3, 256
        c.num_attention_heads, c.num_key_value_heads, c.head_dim = 4, 2, 16
        return c
    monkeypatch.setattr(hf, "hf_config", tiny)
    out = tmp_path / "hf-host-cpu.json"
    assert hf_host.main(["--out", str(out), "--device", "cpu", "--kv", "8", "--eager-s", "60", "--rounds", "2",
                         "--fit-models", "llama-3.2-1b", "--held-out", "qwen3-8b", "--batches", "1"]) == 0
    d = json.loads(out.read_text())
    assert d["errors"] == {} and len(d["eager"]["rounds"]) == 2
    assert set(d["eager"]["rounds"][0]) == {"probe", "modules_s", "state"}
    mods = d["eager"]["modules"]["llama-3.2-1b-b1-kv8"]
    assert {"layer", "attn", "q", "rope", "cache_update", "model1", "model2", "model4"} <= set(mods)
    assert all(len(v) == 2 for v in mods.values())
    assert set(d["eager"]["steps"]) == {"llama-3.2-1b-b1-kv8", "qwen3-8b-b1-kv8"}
    e = hf_host_fit.eager_fit(d)
    # the machinery, not the numbers: two rounds of a 3-layer toy on a loaded CPU can time the 4-layer model
    # faster than the 1-layer one, so the scale's sign is the machine's (it failed so under load)
    assert math.isfinite(e["scale"])
    assert set(e["per_kind"]) == {"rmsnorm", "matmul", "rope_kv", "attn_partial", "silu_mul", "embed"}
