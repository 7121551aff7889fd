"""The stacks' pure parts on CPU: shapes from the configs, the decode step (eager and compiled by Inductor
for the CPU) against a loop reference at tiny sizes, the op -> kernel mapping and the ops JSON schema on
synthetic kernel names and traces (test data, not results), the runner's argument errors. The CUDA runs
themselves are marked gpu."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from validation.stacks import (  # noqa: E402
    cli,  # noqa: E402
    measure,
    runner,
)
from validation.stacks import inductor_graph as ig  # noqa: E402
from validation.stacks import ops as sops  # noqa: E402
from validation.stacks import torch_graph as tg  # noqa: E402

TINY = tg.Shape(name="tiny", hidden=32, intermediate=48, layers=2, heads=4, kv_heads=2, head_dim=8,
                vocab=50, eps=1e-6, rope_theta=10000.0)


@pytest.mark.parametrize("name", sorted({p.model for p in runner.FULL_PLAN}))
def test_shapes_match_mksim_configs(name: str) -> None:
    from mksim import models
    s, cfg = tg.load_shape(name), models.get(name)
    assert (s.hidden, s.intermediate, s.layers, s.heads, s.kv_heads, s.head_dim, s.vocab) == (
        cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
        cfg.vocab_size)
    assert (s.qk_norm, s.attention_bias, s.tie_word_embeddings) == (
        cfg.qk_norm, cfg.attention_bias, cfg.tie_word_embeddings)
    assert (s.eps, s.rope_theta) == (cfg.rms_norm_eps, cfg.rope_theta)
    w = tg.make_weights(replace(s, layers=1, vocab=8, hidden=16, intermediate=16, heads=2, kv_heads=1,
                                head_dim=8), "cpu", torch.float32)
    assert w["layers"][0]["wqkv"].shape == (32, 16)


@pytest.mark.parametrize("variant", [{}, {"qk_norm": True}, {"attention_bias": True},
                                     {"tie_word_embeddings": True}, {"kv_heads": 4}])
@pytest.mark.parametrize("batch,kv_len", [(1, 5), (3, 7)])
def test_decode_step_matches_reference(variant: dict, batch: int, kv_len: int) -> None:
    s = replace(TINY, **variant)
    w = tg.make_weights(s, "cpu", torch.float32, seed=3)
    k, v = tg.new_cache(s, batch, kv_len, "cpu", torch.float32)
    k0, v0 = k.clone(), v.clone()
    tokens = torch.tensor([1, 7, 42][:batch])
    pos = torch.full((batch,), kv_len, dtype=torch.long)
    got = tg.decode_step(s, w, tokens, pos, k, v, kv_len)
    want = tg.reference_step(s, w, tokens, k0, v0, kv_len)
    assert got.shape == (batch, s.vocab)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # the step wrote exactly one new slot of the cache
    assert torch.equal(k[:, :, :, :kv_len], k0[:, :, :, :kv_len])
    assert not torch.equal(k[:, :, :, kv_len], k0[:, :, :, kv_len])


def test_weight_bytes_counts_tied_head_once() -> None:
    untied = tg.weight_bytes(tg.make_weights(TINY, "cpu", torch.bfloat16))
    tied = tg.weight_bytes(tg.make_weights(replace(TINY, tie_word_embeddings=True), "cpu", torch.bfloat16))
    assert untied - tied == TINY.vocab * TINY.hidden * 2


def test_percentile() -> None:
    xs = [float(i) for i in range(1, 12)]
    assert tg.percentile(xs, 0.5) == 6.0 and tg.percentile(xs, 0.1) == 2.0 and tg.percentile(xs, 0.9) == 10.0


def tiny_case(s: tg.Shape, batch: int = 2, kv_len: int = 7, dtype: torch.dtype = torch.float32) -> tuple:
    w = tg.make_weights(s, "cpu", dtype, seed=3)
    k, v = tg.new_cache(s, batch, kv_len, "cpu", dtype)
    tokens = torch.tensor([1, 7, 42, 3][:batch])
    return w, k, v, tokens, torch.full((batch,), kv_len, dtype=torch.long)


def test_weight_bytes_read_counts_looked_up_rows() -> None:
    w = tg.make_weights(TINY, "cpu", torch.bfloat16)
    assert measure.weight_bytes_read(TINY, w, 3) == tg.weight_bytes(w) - (TINY.vocab - 3) * TINY.hidden * 2
    tied = replace(TINY, tie_word_embeddings=True)
    wt = tg.make_weights(tied, "cpu", torch.bfloat16)
    assert measure.weight_bytes_read(tied, wt, 3) == tg.weight_bytes(wt)


def test_fp32_reference_of_bf16_step() -> None:
    s = replace(TINY, qk_norm=True)
    w, k, v, tokens, pos = tiny_case(s, dtype=torch.bfloat16)
    k0 = k.clone()
    ref = measure.fp32_logits(s, w, tokens, pos, k, v, 7)
    assert ref.dtype == torch.float32 and torch.equal(k, k0)   # the caches are not written
    want = tg.reference_step(s, w, tokens, k.clone(), v.clone(), 7)
    torch.testing.assert_close(ref.double(), want, rtol=1e-4, atol=1e-4)
    got = tg.decode_step(s, w, tokens, pos, k, v, 7)
    err = measure.max_abs(got, ref)
    assert 0 < err < 0.05 * ref.abs().max().item()
    assert measure.check_rule(err, err, 1.0) and not measure.check_rule(10 * err + 0.02, err, 1.0)


@pytest.mark.slow
def test_inductor_step_matches_eager_on_cpu() -> None:
    """The compiled step (Inductor's CPU backend here; Triton on the GPU) equals the eager step and
    writes the same cache slot; a second case of the same model recompiles without error."""
    ig.configure()
    s = replace(TINY, qk_norm=True, attention_bias=True)
    w, k, v, tokens, pos = tiny_case(s)
    k2, v2 = k.clone(), v.clone()
    with torch.inference_mode():
        want = tg.decode_step(s, w, tokens, pos, k, v, 7)
        step = ig.make_step(s, w, tokens, pos, k2, v2, 7)
        assert ig.compile_step(step) > 0
        got = step()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k2, k, rtol=1e-5, atol=1e-5)
    assert not torch.equal(k2[:, :, :, 7], torch.zeros_like(k2[:, :, :, 7]))


def test_eager_ops_cover_the_step_shapes() -> None:
    for s in (TINY, replace(TINY, qk_norm=True, attention_bias=True)):
        w, k, v, tokens, pos = tiny_case(s, dtype=torch.bfloat16)
        units = sops.eager_ops(s, w, tokens, pos, k, v, 7)
        names = [u.name for u in units]
        assert ("qk_norm" in names) == s.qk_norm
        assert set(names) <= set(sops.op_bytes(s, 2, 7))
        assert sum(u.count for u in units if u.count == s.layers) == s.layers * (len(names) - 4)
        outs = {u.name: u.fn() for u in units}
        assert outs["qkv"].shape == (2, s.q_size + 2 * s.kv_size)
        assert outs["attention"].shape == (2, s.heads, 1, s.head_dim)
        assert outs["lm_head"].shape == (2, s.vocab)
        assert outs["down"].shape == (2, s.hidden)


# Synthetic kernel names in the style of an H200 run (test data, not results).
GEMM = "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_TNT"
REDUCE = "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(...)"
ATTN = "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x128_1x4x1_cga1x1x1_kernel0_0"
BLOCK = ["triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", GEMM, REDUCE,
         "triton_poi_fused_add_cat_mul_neg_slice_scatter_1", ATTN, "void cudnn::fusion::lean_reduction_kernel<>",
         GEMM, "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_2", GEMM, REDUCE,
         "triton_poi_fused_mul_silu_3", "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT"]


def test_inductor_kernels_map_to_ops() -> None:
    got = sops.map_inductor_kernels("block", BLOCK, qk_norm=False)
    assert got == ["residual_add+attn_norm", "qkv", "qkv", "rope+kv_write", "attention", "attention", "o_proj",
                   "mlp_norm", "gate_up", "gate_up", "silu_mul", "down"]
    assert sops.map_inductor_kernels("block", BLOCK, qk_norm=True)[3] == "qk_norm+rope+kv_write"
    # attention lowered to two batched GEMMs and a softmax kernel between them
    math_attn = BLOCK[:4] + [GEMM, "triton_per_fused__softmax_4", GEMM] + BLOCK[6:]
    got = sops.map_inductor_kernels("block", math_attn, qk_norm=False)
    assert got == ["residual_add+attn_norm", "qkv", "qkv", "rope+kv_write", "attention", "attention", "attention",
                   "o_proj", "mlp_norm", "gate_up", "gate_up", "silu_mul", "down"]
    assert sops.map_inductor_kernels("tail", ["triton_per_fused_add_mean_0", GEMM], False) == [
        "residual_add+final_norm", "lm_head"]
    assert sops.map_inductor_kernels("prologue", [
        "triton_poi_fused__to_copy_arange_cat_cos_embedding_sin_0"], False) == ["embed+rope_table"]
    assert sops.map_inductor_kernels("prologue", ["triton_poi_fused_embedding_0", "triton_poi_fused_cos_1"],
                                     False) == ["embed", "rope_table"]
    # the fused-kernel names Inductor gives on the CPU are classified the same way
    assert not sops.is_gemm("cpp_fused__scaled_dot_product_flash_attention_for_cpu_add_cat_1")
    assert sops.is_attention("fmha_cutlassF_bf16_aligned_64x64_rf_sm80") and not sops.is_gemm(
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80")
    with pytest.raises(ValueError):
        sops.map_inductor_kernels("layer", BLOCK, False)


def synthetic_trace(units: list[list[str]], reps: int) -> dict:
    """A torch.profiler-style Chrome trace: per rep and unit an eviction kernel, then the unit's kernels
    (durations 1 us per position + rep), plus CPU events and a memset that must be ignored."""
    ev, ts = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}], 10.0
    ev.append({"ph": "X", "cat": "kernel", "name": "warmup_before_first_sentinel", "ts": 1, "dur": 1, "args": {}})
    for r in range(reps):
        for names in units:
            ev.append({"ph": "X", "cat": "kernel", "name": "void at::native::bitwise_not_kernel", "ts": ts,
                       "dur": 90, "args": {"grid": [1024, 1, 1], "block": [128, 1, 1]}})
            ts += 100
            ev.append({"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "ts": ts, "dur": 1})
            for i, n in enumerate(names):
                ev.append({"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": 1.0 + i + r,
                           "args": {"grid": [132, 1, 1], "block": [256, 1, 1]}})
                ts += 10
    ev.reverse()   # trace order is not launch order
    return {"traceEvents": ev}


def test_trace_split_and_ops_record_schema() -> None:
    units = [["triton_poi_fused_embedding_0"], BLOCK, ["triton_per_fused_add_mean_0", GEMM]]
    reps = 3
    per_rep = sops.split_units(sops.trace_kernels(synthetic_trace(units, reps)), len(units), reps)
    assert [len(u) for u in per_rep[2]] == [1, len(BLOCK), 2]
    profiled = [{"unit": name, "count": count, "deterministic": True,
                 **sops.summarise_unit([per_rep[r][j] for r in range(reps)])}
                for j, (name, count) in enumerate((("prologue", 1), ("block", TINY.layers), ("tail", 1)))]
    assert profiled[1]["kernels"][3]["us_cold"] == 5.0   # median of 4, 5, 6
    assert profiled[1]["kernels"][3]["grid"] == [132, 1, 1]
    labels = {p["unit"]: sops.map_inductor_kernels(p["unit"], [k["name"] for k in p["kernels"]], False)
              for p in profiled}
    rec = sops.ops_record("inductor_graph", TINY, 2, 7, reps, profiled, labels)
    sops.validate_record(rec)
    json.loads(json.dumps(rec))
    assert rec["kernels_per_step"] == 1 + TINY.layers * len(BLOCK) + 2
    assert rec["ops"]["lm_head"]["kernels"][0]["bytes"] == sops.op_bytes(TINY, 2, 7)["lm_head"]
    assert rec["ops"]["qkv"]["kernels"][0]["bytes"] is None   # two kernels: the op's bytes only
    assert rec["ops"]["qkv"]["us_cold"] == 3.0 + 4.0   # positions 1, 2: medians 1 + i + 1
    assert rec["sum_us_cold_per_step"] == pytest.approx(sum(
        op["us_cold"] * op["count_per_step"] for op in rec["ops"].values()), abs=0.1)
    bad = json.loads(json.dumps(rec))
    bad["ops"]["qkv"]["kernels"][0].pop("grid")
    with pytest.raises(ValueError, match="grid"):
        sops.validate_record(bad)
    with pytest.raises(RuntimeError, match="eviction"):
        sops.split_units(sops.trace_kernels(synthetic_trace(units, reps)), len(units), reps + 1)


def test_eager_ops_record_one_unit_per_op() -> None:
    profiled = [{"unit": "qkv", "count": 2, "deterministic": False, "kernels": [
        {"name": GEMM, "grid": [1, 2, 3], "block": [64, 1, 1], "us_cold": 7.5}]}]
    rec = sops.ops_record("torch_graph", TINY, 1, 1024, 5, profiled)
    sops.validate_record(rec)
    assert rec["ops"]["qkv"]["kernels"][0]["bytes"] == sops.op_bytes(TINY, 1, 1024)["qkv"]
    assert rec["sum_us_cold_per_step"] == 15.0 and rec["ops"]["qkv"]["deterministic"] is False


def test_outputs_equal() -> None:
    a = torch.ones(3)
    assert sops.outputs_equal(a, a.clone()) is True
    assert sops.outputs_equal((a, a), (a, a + 1)) is False
    assert sops.outputs_equal(None, None) is None


@pytest.mark.parametrize("argv,msg", [
    (["run", "--out", "X", "--models", "gpt-9"], "unknown model 'gpt-9'"),
    (["run", "--out", "X", "--stacks", "torch_graph,xla"], "unknown stack 'xla'"),
    (["run", "--out", "X", "--batches", "1,zero"], "--batches takes"),
    (["run", "--out", "X", "--kv", "0"], "--kv takes"),
    (["run", "--out", "X", "--timeout", "-1"], "--timeout must be positive"),
    (["run", "--out", "X", "--replays", "5"], "--replays must be >= 20"),
    (["run", "--out", "X", "--ops-models", "nope"], "unknown model 'nope'"),
    (["table", "/nonexistent/dir"], "is not a folder"),
])
def test_argument_errors(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err and err.count("\n") == 1


def test_plans() -> None:
    def plan(*argv: str) -> list[runner.ModelPlan]:
        ap_args = ["run", "--out", "X", *argv]
        import argparse
        ns = argparse.Namespace(quick="--quick" in argv, models=None, batches=None, kv=None, ops_models=None)
        for flag in ("--models", "--batches", "--kv", "--ops-models"):
            if flag in ap_args:
                setattr(ns, flag[2:].replace("-", "_"), ap_args[ap_args.index(flag) + 1])
        return cli.build_plan(ns)
    full = plan()
    assert [p.model for p in full][:2] == ["llama-3.2-1b", "llama-3.1-8b"] and len({p.model for p in full}) == 5
    cases = {(p.model, c) for p in full for c in p.cases}
    assert all((p.model, (b, 1024)) in cases for p in full for b in (1, 8))
    assert {m for m, (_, kv) in cases if kv == 4096} == {"llama-3.2-1b", "llama-3.1-8b"}
    assert {p.model for p in full if p.ops} == {"llama-3.2-1b", "llama-3.1-8b"}
    assert plan("--quick") == [runner.ModelPlan("llama-3.2-1b", ((1, 1024),), True)]
    got = plan("--models", "qwen3-8b,llama-3.2-1b", "--kv", "1024,4096", "--batches", "1")
    assert got == [runner.ModelPlan("qwen3-8b", ((1, 1024), (1, 4096)), False),
                   runner.ModelPlan("llama-3.2-1b", ((1, 1024), (1, 4096)), True)]
    assert not any(p.ops for p in plan("--ops-models", ""))
    assert cli.parse_cases("1,1024;8,4096") == [(1, 1024), (8, 4096)]


def test_table_reads_step_files(tmp_path: Path) -> None:
    row = {"stack": "inductor_graph", "model": "tiny", "batch": 1, "kv_len": 7, "kernels_per_step_graph": 9,
           "step_us": {"median": 10.0, "p10": 9.0, "p90": 11.0}, "implied_GBps": 1.0, "compile_s": 3.0,
           "check": {"ok": True}}   # synthetic test data
    (tmp_path / "step-inductor_graph-tiny-b1-kv7.json").write_text(json.dumps(row))
    lines = runner.table(tmp_path).splitlines()
    assert len(lines) == 2 and "inductor_graph" in lines[1] and "3.0" in lines[1]


def test_run_kills_a_worker_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog: a worker that outlives the budget is killed with its process group; a model that
    cannot start in the time left is skipped; status.json says both."""
    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args.txt") + "\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr(runner.sys, "executable", str(fake))
    monkeypatch.setattr(runner, "environment", lambda: {"gpu": "none (test)"})
    monkeypatch.setattr(runner, "MARGIN_S", 0.0)
    monkeypatch.setattr(runner, "START_MIN_S", 1.0)
    plan = [runner.ModelPlan("llama-3.2-1b", ((1, 1024),), True), runner.ModelPlan("qwen3-8b", ((8, 64),), False)]
    t0 = time.time()
    status = runner.run(plan, ["torch_graph"], tmp_path / "out", 1.5, 20, 2, trace=False)
    assert time.time() - t0 < 10
    assert status["llama-3.2-1b b1/kv1024"].startswith("killed at the deadline")
    assert status["qwen3-8b b8/kv64"] == "skipped: budget"
    args = (tmp_path / "args.txt").read_text().split()
    assert args[:4] == ["-m", "validation", "stacks", "worker"] and "--ops" in args and "1,1024" in args
    saved = json.loads((tmp_path / "out" / "status.json").read_text())
    assert saved["llama-3.2-1b b1/kv1024"] == status["llama-3.2-1b b1/kv1024"]


@pytest.mark.gpu
def test_quick_run_on_gpu(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    assert cli.main(["run", "--out", str(tmp_path), "--quick", "--timeout", "120"]) == 0
    for stack in runner.STACKS:
        step = json.loads((tmp_path / f"step-{stack}-llama-3.2-1b-b1-kv1024.json").read_text())
        assert step["check"]["ok"] and step["kernels_per_step_graph"] > 0
        sops.validate_record(json.loads((tmp_path / f"ops-{stack}-llama-3.2-1b-b1-kv1024.json").read_text()))
