"""The stacks' profiles and predictions: ops of several kernels as a closed-form story, the
profile fits reproduced from the committed single-op files, the summary and docs/stacks.md's tables
reproduced from the committed step files. No GPU, no torch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import hwmodels
import mksim
from mksim.costs import rates
from mksim.errors import WorkloadError
from mksim.workload import (
    CONTINUATION_KIND,
    Input,
    Op,
    Workload,
    expand_kernels,
    kernel_counts,
    kernel_of,
    kernels_per_op,
)
from validation.stacks import cli, fit, predict, records

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "validation/results/h200-stacks/run2"
SUMMARY = ROOT / "validation/results/h200-stacks/summary.json"
TOL = 1e-6


def gpu_with(**tables: hwmodels.KernelCost) -> hwmodels.GPUSpec:
    g = hwmodels.load("h200-calibrated")
    return replace(g, kernels=replace(g.kernels, per_kind=dict(tables)))


def vec_op(name: str, kind: str, *inputs: str, weight_bytes: float = 0.0) -> Op:
    return Op(name=name, kind=kind, out_size=1024, elem_bytes=2, flops=0.0, weight_bytes=weight_bytes,
              inputs=tuple(Input(i) for i in inputs), align=8)


def latency(wl: Workload, g: hwmodels.GPUSpec, mode: str = "graph") -> tuple[float, int]:
    s = mksim.build_schedule(wl, g, mode)
    return mksim.simulate(s, timeline=False).latency_us, len(s.graph.ops)


# -- ops of several kernels ------------------------------------------------------------------------


def test_an_op_of_three_kernels_costs_two_more_graph_nodes_and_fixed_parts():
    # one RMS-norm op whose kernel costs 2 µs: alone it is the launch + 2 µs; as 3 kernels, 3 x 2 µs
    # and 2 more graph nodes between them
    wl = Workload(name="norm", ops=(vec_op("n", "rmsnorm"),), tokens=1)
    one = gpu_with(rmsnorm=hwmodels.KernelCost(task_fixed_us=2.0))
    three = gpu_with(rmsnorm=hwmodels.KernelCost(task_fixed_us=2.0, kernels_per_op_count=3))
    r = rates(one)
    t1, n1 = latency(wl, one)
    t3, n3 = latency(wl, three)
    assert (n1, n3) == (1, 3)
    assert t1 == pytest.approx(r.launch_latency_us + 2.0, abs=TOL)
    assert t3 == pytest.approx(r.launch_latency_us + 3 * 2.0 + 2 * r.graph_node_us, abs=TOL)
    assert t3 - t1 == pytest.approx(2 * (2.0 + r.graph_node_us), abs=TOL)


def test_after_a_streaming_kernel_the_others_cost_the_elementwise_fixed_part():
    wl = Workload(name="mm", ops=(vec_op("x", "rmsnorm"), vec_op("mm", "matmul", "x", weight_bytes=1e6),
                                  vec_op("y", "rmsnorm", "mm")), tokens=1)
    base = {"rmsnorm": hwmodels.KernelCost(task_fixed_us=1.0),
            CONTINUATION_KIND: hwmodels.KernelCost(task_fixed_us=0.5)}
    t1, _ = latency(wl, gpu_with(**base, matmul=hwmodels.KernelCost(task_fixed_us=3.0, consume_GBps=50)))
    t2, n = latency(wl, gpu_with(**base, matmul=hwmodels.KernelCost(task_fixed_us=3.0, consume_GBps=50,
                                                                     kernels_per_op_count=2)))
    r = rates(gpu_with())
    assert n == 4
    assert t2 - t1 == pytest.approx(0.5 + r.graph_node_us, abs=TOL)


def test_persistent_modes_ignore_kernels_per_op():
    wl = Workload(name="norm", ops=(vec_op("a", "rmsnorm"), vec_op("b", "rmsnorm", "a")), tokens=1)
    one = gpu_with(rmsnorm=hwmodels.KernelCost(task_fixed_us=2.0))
    eight = gpu_with(rmsnorm=hwmodels.KernelCost(task_fixed_us=2.0, kernels_per_op_count=8))
    assert latency(wl, one, "megakernel") == latency(wl, eight, "megakernel")
    assert latency(wl, eight, "stream")[1] == 16


def test_a_schedule_file_of_a_stack_keeps_its_kernels():
    wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    s = mksim.build_schedule(wl, "h200-calibrated+torch", "graph")
    back = mksim.Schedule.from_json(s.to_json())
    assert len(back.graph.ops) == len(s.graph.ops) == 655
    assert mksim.simulate(back, timeline=False).latency_us == pytest.approx(
        mksim.simulate(s, timeline=False).latency_us, abs=TOL)
    assert kernels_per_op(hwmodels.load("h200-calibrated+inductor").kernels.per_kind)["rope_kv"] == 3


def test_expand_kernels_chains_the_kernels_and_rewires_the_consumers():
    wl = Workload(name="w", ops=(vec_op("a", "rmsnorm"), vec_op("b", "matmul", "a", weight_bytes=100),
                                 vec_op("c", "rmsnorm", "b")), tokens=4)
    ex = expand_kernels(wl, {"rmsnorm": 2, "matmul": 3})
    assert [(op.name, op.kind, [i.op for i in op.inputs]) for op in ex.ops] == [
        ("a", "rmsnorm", []), ("a~2", "rmsnorm", ["a"]), ("b", "matmul", ["a~2"]),
        ("b~2", "elementwise", ["b"]), ("b~3", "elementwise", ["b~2"]), ("c", "rmsnorm", ["b~3"]),
        ("c~2", "rmsnorm", ["c"])]
    assert [kernel_of(op) for op in ex.ops] == ["a", "a", "b", "b", "b", "c", "c"]
    assert sum(op.weight_bytes for op in ex.ops) == 100          # only the first kernel streams
    assert ex.ops[3].attrs["rows"] == 4
    assert expand_kernels(wl, {"rmsnorm": 1}) is wl
    assert expand_kernels(ex, {"elementwise": 2, "rmsnorm": 1}) is ex   # continuations are never expanded again


def test_kernel_counts_add_up_and_refuse_less_than_one():
    for n, m in ((65, 1.618), (33, 8.489), (16, 12.0), (1, 14.0)):
        ks = kernel_counts(n, m)
        assert len(ks) == n and set(ks) <= {int(m), int(m) + 1} and sum(ks) == int(n * m + 1e-9)
    with pytest.raises(WorkloadError, match="kernels per op"):
        kernel_counts(3, 0.5)


# -- the profiles ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["inductor_graph", "torch_graph"])   # hf: test_stacks_hf_profiles.py
def test_the_committed_profiles_are_the_fit_of_the_committed_single_ops(stack):
    f = fit.fit_profile(RUN, stack)
    committed = ROOT / "hwmodels/profiles" / f"{fit.STACK_PROFILE[stack]}.toml"
    assert fit.to_toml(f, RUN.relative_to(ROOT)) == records.without_record(committed.read_text())
    assert all(name.startswith("ops-") for name in f.files)               # never the whole steps
    g = hwmodels.load(f"h200-calibrated+{fit.STACK_PROFILE[stack]}")
    assert set(g.kernels.per_kind) == set(f.tables)


@pytest.mark.slow  # 1.2 s of CPU
def test_the_torch_fit_sees_the_stacks_kernels():
    f = fit.fit_profile(RUN, "torch_graph")
    k = {kind: t["kernels_per_op_count"].value for kind, t in f.tables.items() if "kernels_per_op_count" in t}
    # HF RMS norm: 8 kernels (and the residual add before the attention norm); RoPE + KV write: 10 + 2;
    # the RoPE table's 13 kernels join the embedding
    assert k["rmsnorm"] == pytest.approx(8.49, abs=0.01) and k["rope_kv"] == 12 and k["embed"] == 14
    # the GEMMs: in-step rate near the chip's, the cold single ops' L2 write-back fitted apart
    for what, meas, fitted in f.residuals["matmul"]:
        assert fitted == pytest.approx(meas, rel=0.1), what
    note = f.tables["matmul"]["task_fixed_us"].note
    assert "dirty" in note and "residual rms" in note


def test_fit_refuses_a_folder_without_single_ops(tmp_path):
    with pytest.raises(fit.FitError, match="no ops-torch_graph"):
        fit.fit_profile(tmp_path, "torch_graph")
    assert fit.kind_of("qk_norm+rope+kv_write") == "rope_kv"
    with pytest.raises(fit.FitError, match="no mksim op kind"):
        fit.kind_of("mystery")


# -- predictions -----------------------------------------------------------------------------------


@pytest.mark.slow  # 2.1 s of CPU
def test_summary_is_reproduced_from_the_committed_steps():
    s = json.loads(SUMMARY.read_text())
    hf = ROOT / s["hf_run"]   # the transformers stacks' steps: hf_host.py's runs (h200-stacks/hf-host)
    steps = {(st.stack, st.model, st.batch, st.kv_len): st
             for st in predict.load_steps(RUN) + predict.load_hf_steps(hf)}
    assert len(s["cases"]) == len(steps) >= 48 + 16
    for c in s["cases"]:
        st = steps[(c["stack"], c["model"], c["batch"], c["kv_len"])]
        assert (c["measured_us"], c["measured_spread_us"], c["kernels_per_step"]) == (
            st.median_us, st.spread_us, st.kernels)
        assert c["error_pct"] == pytest.approx((c["predicted_us"] - c["measured_us"]) / c["measured_us"] * 100,
                                               abs=0.06)
        assert c["held_out"] == (c["model"] not in s["fit_models"][c["stack"]])
    assert s["mape_pct"] == pytest.approx(sum(abs(c["error_pct"]) for c in s["cases"]) / len(s["cases"]), abs=0.06)
    assert set(s["held_out_models"]) == {"llama-3.2-3b", "mistral-7b", "qwen2.5-7b", "qwen3-8b"}
    # two cases simulated again: a fitted model and a held-out one
    for c in (s["cases"][4], next(c for c in s["cases"] if c["held_out"] and c["stack"] == "torch_graph")):
        prof = fit.STACK_PROFILE[c["stack"]]
        pred, n_k, _ = predict.predict_step(c["model"], c["batch"], c["kv_len"], f"h200-calibrated+{prof}",
                                            predict.STACK_MODE.get(c["stack"], "graph"))
        assert (round(pred, 1), n_k) == (c["predicted_us"], c["predicted_kernels_per_step"])
        assert round(predict.megakernel_us(c["model"], c["batch"], c["kv_len"], "h200-calibrated"), 1) == \
            c["megakernel_us"]


def test_docs_tables_are_generated_from_the_summary():
    text = (ROOT / "docs/stacks.md").read_text()
    s = json.loads(SUMMARY.read_text())
    body = text.split(predict.TABLE_START)[1].split(predict.TABLE_END)[0]
    assert body.strip() == predict.table(s)
    layer = text.split(predict.LAYER_START)[1].split(predict.LAYER_END)[0]
    assert predict.per_layer("llama-3.2-1b", 1, 1024, run=RUN) in layer


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    assert cli.main(["predict", str(tmp_path / "nope")]) == 2
    assert cli.main(["profile", str(tmp_path), "--stack", "torch_graph", "--out", str(tmp_path / "p.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("error: ") for e in err)
