"""``mksim trace import``: a torch.profiler trace of a decode step replayed, mapped to ops, predicted.

The real trace is the committed H200 one (validation/results/h200-stacks/raw, llama-3.2-1b batch 1, KV
1024, three CUDA graph replays); tests/data/trace-llama-3.2-1b-b1-step.json.gz is its median step, cut by
``mksim trace cut validation/results/h200-stacks/raw/trace-llama-3.2-1b-b1.json.gz
tests/data/trace-llama-3.2-1b-b1-step.json.gz``. The other traces here are synthetic, written by the tests.
"""

from __future__ import annotations

import doctest
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from mksim import models, trace, trace_cli, trace_map, trace_read
from mksim.cli import main
from mksim.errors import MksimError
from mksim.trace import TraceError, TraceKernel, cut_trace, import_trace, replay_us, short_name
from mksim.trace_map import align, kernel_hint

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "validation/results/h200-stacks/raw/trace-llama-3.2-1b-b1.json.gz"
STEP = ROOT / "tests/data/trace-llama-3.2-1b-b1-step.json.gz"
MEASURED_STEP_US = 1982.3   # the same graph timed with CUDA events, no profiler (raw/README.md)


def kernel(name: str, ts: float, dur: float, stream: int = 7, device: int = 0, corr: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": device, "stream": stream, "correlation": corr, "grid": [1, 1, 1],
                     "block": [128, 1, 1]}}


def write(tmp_path: Path, events: list[dict[str, Any]], name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": "NVIDIA H200", "numSms": 132}],
                             "traceEvents": events}))
    return p


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    cap = capsys.readouterr()
    return code, cap.out, cap.err


# -- replay ----------------------------------------------------------------------------------------------
def test_replay_story_two_streams():
    """Stream 7: a (0-2), b (2.5-5.5); stream 9: c (1-2) then d after 3 µs idle (5-6): ends at 6."""
    ks = [TraceKernel("a", "kernel", 7, 0.0, 2.0, 0.0, None, None, None),
          TraceKernel("c", "kernel", 9, 1.0, 1.0, 1.0, None, None, None),
          TraceKernel("b", "kernel", 7, 2.5, 3.0, 0.5, None, None, None),
          TraceKernel("d", "kernel", 9, 5.0, 1.0, 3.0, None, None, None)]
    assert replay_us(ks) == 6.0


def test_synthetic_two_streams_round_trip(tmp_path):
    ev = [kernel("gemm_a", 100.0, 4.0), kernel("gemm_b", 101.0, 2.0, stream=9), kernel("gemm_c", 106.0, 1.5)]
    t = import_trace(write(tmp_path, ev))
    assert t.steps_by == "whole trace" and t.streams == (7, 9)
    assert t.step_us == pytest.approx(7.5) and t.replay_us == pytest.approx(7.5)
    assert [k.gap_us for k in t.kernels] == pytest.approx([0.0, 1.0, 2.0])   # per stream
    assert t.busy_us == pytest.approx(7.5) and {k.kind for k in t.kernels} == {"matmul"}


@pytest.mark.parametrize("path", [FULL, STEP], ids=["full", "step"])
def test_real_trace_round_trip_within_5_percent(path):
    t = import_trace(path)
    assert t.steps_by == "cuda graph launches"
    assert abs(t.replay_error) < 0.05
    assert len(t.kernels) == 648 and t.streams == (7,)
    assert t.busy_us + t.gaps_us == pytest.approx(t.step_us)
    # the profiled step is slower than the unprofiled one, but not by much
    assert 1.0 < t.step_us / MEASURED_STEP_US < 1.1
    assert t.gpu_name == "NVIDIA H200" and t.n_sms == 132


def test_full_trace_takes_the_median_step():
    t = import_trace(FULL)
    assert len(t.step_spans_us) == 3 and t.left_out == 0
    assert t.step_us == sorted(t.step_spans_us)[1] == t.step_spans_us[t.step_number - 1]
    assert t.step_starts_us[0] == 0 and max(t.step_spans_us) < t.step_period_us < 1.01 * t.step_us
    first = import_trace(FULL, step=1)
    assert first.step_us == t.step_spans_us[0]


def test_cut_keeps_the_median_step(tmp_path):
    n = cut_trace(FULL, tmp_path / "one.json.gz")
    one = import_trace(tmp_path / "one.json.gz")
    full = import_trace(FULL)
    assert n < 1000 and len(one.step_spans_us) == 1
    assert [(k.name, k.dur_us, k.gap_us) for k in one.kernels] == [(k.name, k.dur_us, k.gap_us) for k in full.kernels]
    assert STEP.stat().st_size < 100_000
    # the test data is this cut, unedited (compared uncompressed: zlib builds may compress differently)
    assert gzip.decompress((tmp_path / "one.json.gz").read_bytes()) == gzip.decompress(STEP.read_bytes())


def test_profiler_step_ranges_split_an_eager_trace(tmp_path):
    """Eager launches (one correlation each) split by prof.step() ranges on the GPU timeline."""
    ev = [kernel("gemm", 10.0 + 100 * s + 3 * i, 2.0, corr=10 * s + i) for s in range(3) for i in range(4)]
    ev += [{"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{s}", "pid": 0, "tid": 7,
            "ts": 5.0 + 100 * s, "dur": 90.0} for s in range(3)]
    ev[7]["dur"] = 3.0   # the last kernel of the second step: that step is the longest
    t = import_trace(write(tmp_path, ev))
    assert t.steps_by == "ProfilerStep ranges" and len(t.step_spans_us) == 3
    assert t.step_spans_us == pytest.approx([11.0, 12.0, 11.0]) and t.step_us == pytest.approx(11.0)


def test_graph_launches_leave_other_kernels_out_and_device_picks_a_gpu(tmp_path):
    launch = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 1, "tid": 1, "ts": 50.0 + 100 * s,
               "dur": 5.0, "args": {"correlation": 100 + s}} for s in range(2)]
    ev = launch + [kernel("gemm", 100.0 * (s + 1) + 3 * i, 2.0, corr=100 + s) for s in range(2) for i in range(3)]
    ev += [kernel("eager_copy", 400.0, 1.0, corr=7), kernel("gemm", 10.0, 9.0, device=1, corr=9)]
    p = write(tmp_path, ev)
    t = import_trace(p, device=0)
    assert t.steps_by == "cuda graph launches" and t.step_spans_us == (8.0, 8.0) and t.left_out == 1
    assert t.step_period_us == 100.0 and t.step_number == 1
    one = import_trace(p, device=1)
    assert one.steps_by == "whole trace" and one.step_us == 9.0


# -- mapping ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,hint", [
    ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "matmul"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(int)", "epilogue"),
    ("void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*)", "attn_reduce"),
    ("void flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128> >(Flash_fwd_params)", "attn_reduce"),
    ("void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128> >(Flash_fwd_params)", "attn_partial"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "rmsnorm"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>(int)", "add"),
    ("some_custom_kernel", None),
])
def test_kernel_hints(name, hint):
    assert kernel_hint(name) == hint


def test_align_three_gemms_of_one_fused_op():
    """q, k and v as three GEMMs all belong to the fused qkv_proj; the rope kernels after them to rope_kv."""
    ops = models.workload("llama-3.2-1b").ops[:5]   # embed, attn_norm, qkv_proj, rope_kv, attn_partial
    hints = ["embed", "rmsnorm", "matmul", "matmul", "matmul", "elementwise", "rope_kv", "attn_partial"]
    assert align(hints, ops) == [0, 1, 2, 2, 2, 3, 3, 4]


def test_align_leaves_kinds_with_no_place_unmapped():
    ops = models.workload("llama-3.2-1b").ops[:3]   # embed, attn_norm, qkv_proj
    assert align(["embed", "rope_kv", "elementwise", "rope_kv", "elementwise", "rmsnorm", "matmul"], ops) \
        == [0, None, None, None, 1, 1, 2]


LAYER0 = ["embed", "L0.attn_norm", "L0.qkv_proj", "L0.rope_kv", "L0.attn_partial", "L0.attn_reduce", "L0.o_proj",
          "L0.mlp_norm", "L0.gate_up_proj", "L0.silu_mul", "L0.down_proj", "L1.attn_norm"]


def test_align_qwen3_qk_norms_belong_to_rope():
    """Qwen3's per-head q/k RMS norms run between the q/k/v GEMM and RoPE; mksim's rope_kv does them."""
    ops = models.workload("qwen3-8b").ops
    norm = ["elementwise", "rmsnorm", "rmsnorm", "elementwise", "rmsnorm", "elementwise"]
    hints = ["embed", *norm, "matmul", *norm, *norm, "rope_kv", "elementwise", "attn_partial", "attn_reduce"]
    got = [ops[j].name if j is not None else None for j in align(hints, ops)]
    assert got == ["embed"] + ["L0.attn_norm"] * 6 + ["L0.qkv_proj"] + ["L0.rope_kv"] * 14 + ["L0.attn_partial",
                                                                                           "L0.attn_reduce"]


@pytest.mark.parametrize("names,expected", [
    pytest.param(  # torch.compile: Triton kernels named after what they fuse, cuBLAS GEMMs, cuDNN SDPA
        ["triton_poi_fused_embedding_0", "triton_red_fused__to_copy_mean_mul_pow_rsqrt_1", "nvjet_sm90_tst_TNT",
         "triton_poi_fused_add_cat_index_put_mul_neg_2", "cudnn_generated_fort_native_sdpa_sm80_flash_fprop",
         "void cudnn::fusion::lean_reduction_kernel<false>()", "nvjet_sm90_tst_TNT",
         "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3", "nvjet_sm90_tst_TNT", "triton_poi_fused_mul_silu_4",
         "nvjet_sm90_tst_splitK_TNT", "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3"],
        LAYER0, id="inductor"),
    pytest.param(  # an inference server's fused kernels, flash-decoding with split KV
        ["void vllm::embedding_kernel<bf16>()", "void vllm::rms_norm_kernel<bf16>()", "sm90_xmma_gemm_bf16bf16",
         "void vllm::rotary_embedding_kernel<bf16>()", "void vllm::reshape_and_cache_flash_kernel<bf16>()",
         "void flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits>()", "void flash_fwd_splitkv_combine_kernel<>()",
         "sm90_xmma_gemm_bf16bf16", "void vllm::fused_add_rms_norm_kernel<bf16>()", "sm90_xmma_gemm_bf16bf16",
         "void vllm::act_and_mul_kernel<silu_kernel>()", "sm90_xmma_gemm_bf16bf16",
         "void vllm::fused_add_rms_norm_kernel<bf16>()"],
        LAYER0[:4] + ["L0.rope_kv"] + LAYER0[4:], id="fused-kernels"),
    pytest.param(  # an elementwise kernel that names nothing, between the q/k/v GEMM and attention
        ["nvjet_sm90_tst_TNT", "my_fused_elementwise_kernel", "flash_fwd_kernel<>()", "nvjet_sm90_tst_TNT"],
        ["L0.qkv_proj", "L0.rope_kv", "L0.attn_partial", "L0.o_proj"], id="between-anchors"),
])
def test_align_other_stacks_kernel_names(names, expected):
    ops = models.workload("llama-3.2-1b").ops
    got = [ops[j].name if j is not None else None for j in align([kernel_hint(n) for n in names], ops)]
    assert got == expected


def test_mapping_coverage_on_the_real_trace():
    t = import_trace(FULL, model="llama-3.2-1b", predict=False)
    assert t.mapped_fraction > 0.97 and not t.ops_without_kernels
    gemms = [k.op for k in t.kernels if k.hint == "matmul"]
    wl = models.workload("llama-3.2-1b")
    assert gemms == [op.name for op in wl.ops if op.kind == "matmul"]   # one GEMM per projection, in order
    assert [k.op for k in t.kernels if k.hint == "attn_partial"] == [f"L{i}.attn_partial" for i in range(16)]
    unmapped = {short_name(r["name"]) for r in t.unmapped()}
    assert {"vectorized_elementwise_kernel [cos]", "vectorized_elementwise_kernel [sin]"} <= unmapped  # RoPE table
    assert sum(r["busy_us"] for r in t.unmapped()) == pytest.approx((1 - t.mapped_fraction) * t.busy_us)
    rows = t.by_kind()
    assert sum(r["busy_us"] + r["gaps_us"] for r in rows) == pytest.approx(t.step_us)
    assert rows[0]["kind"] == "matmul" and rows[-1]["kind"] == "unmapped"


@pytest.mark.slow  # 1.2 s of CPU
def test_another_model_is_doubted(capsys):
    t = import_trace(STEP, model="llama-3.1-8b", predict=False)
    assert t.warnings == ("the trace has 16 attention kernels, llama-3.1-8b has 32 layers: is --model the traced "
                          "model?",)
    assert len(t.ops_without_kernels) > 100
    assert not import_trace(STEP, model="llama-3.2-1b", predict=False).warnings
    code, stdout, _ = run_cli(["trace", "import", str(STEP), "-m", "llama-3.1-8b"], capsys)
    assert code == 0 and "warning  the trace has 16 attention kernels" in stdout and "x slower than" in stdout


def test_without_a_model_kinds_come_from_names():
    t = import_trace(STEP)
    assert t.prediction is None and t.model is None
    assert {k.kind for k in t.kernels if k.hint == "matmul"} == {"matmul"}
    assert all(k.op is None for k in t.kernels)
    assert 0.5 < t.mapped_fraction < 1.0   # elementwise kernels need the model's ops to be placed


def test_prediction_on_the_traces_gpu():
    t = import_trace(STEP, model="llama-3.2-1b", batch=1, kv_len=1024)
    p = t.prediction
    assert p is not None and p.gpu == "h200-calibrated" and p.hardware_file.endswith("h200-calibrated.toml")
    assert p.megakernel_us < p.graph_us < t.step_us
    assert p.speedup == pytest.approx(t.step_us / p.megakernel_us)
    # mksim's own graph: every op kind of the trace, each far below torch's many small kernels for norms
    assert set(p.graph_by_kind_us) == {r["kind"] for r in t.by_kind()} - {"unmapped"}
    assert sum(p.graph_by_kind_us.values()) < p.graph_us
    traced = {r["kind"]: r["busy_us"] for r in t.by_kind()}
    assert p.graph_by_kind_us["rmsnorm"] < traced["rmsnorm"] / 5
    other = import_trace(STEP, model="llama-3.2-1b", gpu="h100")
    assert other.prediction is not None and "NVIDIA H100" in (other.prediction.note or "")


# -- command line and bad files --------------------------------------------------------------------------
def test_cli_json_schema(tmp_path, capsys):
    out = tmp_path / "t.json"
    code, stdout, err = run_cli(["trace", "import", str(STEP), "-m", "llama-3.2-1b", "--json", str(out)], capsys)
    assert code == 0, err
    assert "megakernel" in stdout and f"written to {out}" in stdout
    d = json.loads(out.read_text())
    assert {"step_us", "replay_us", "replay_error", "n_kernels", "busy_us", "gaps_us", "mapped_fraction",
            "by_kind", "unmapped", "ops_without_kernels", "prediction", "kernels", "steps_by", "warnings",
            "step_period_us"} <= set(d)
    assert set(d["prediction"]) == {"gpu", "hardware_file", "megakernel_us", "graph_us", "speedup", "note",
                                    "graph_by_kind_us", "graph_node_us"}
    assert set(d["by_kind"][0]) == {"kind", "kernels", "busy_us", "gaps_us", "share"}
    assert set(d["kernels"][0]) == {"name", "category", "stream", "start_us", "dur_us", "gap_us", "grid", "block",
                                    "hint", "op", "kind"}
    assert d["n_kernels"] == len(d["kernels"]) == 648 and abs(d["replay_error"]) < 0.05
    code, stdout, _ = run_cli(["trace", "import", str(STEP), "--json", "-"], capsys)
    assert code == 0 and json.loads(stdout)["prediction"] is None


def _bad_files(d: Path) -> dict[str, tuple[list[str], str]]:
    (d / "text.json").write_text("hello")
    (d / "bad.json.gz").write_bytes(b"\x1f\x8b" + b"garbage")
    (d / "array.json").write_text("[1, 2]")
    (d / "obj.json").write_text('{"a": 1}')
    write(d, [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1}], "nokernels.json")
    write(d, [kernel("gemm", 0, 1, device=0), kernel("gemm", 0, 1, device=1)], "twogpus.json")
    write(d, [kernel("gemm", 0, -1)], "negdur.json")
    write(d, [kernel("gemm", 5, 0)], "zerodur.json")
    write(d, [kernel("gemm", "soon", 1)], "strts.json")  # type: ignore[arg-type]
    write(d, [kernel("gemm", 0, 1)], "ok.json")
    (d / "ok.json.gz").write_bytes(gzip.compress((d / "ok.json").read_bytes()))
    step = str(STEP)
    return {
        "missing": (["trace", "import", f"{d}/nope.json"], "no such file"),
        "not-json": (["trace", "import", f"{d}/text.json"], "not JSON"),
        "bad-gzip": (["trace", "import", f"{d}/bad.json.gz"], "cannot read"),
        "array": (["trace", "import", f"{d}/array.json"], "no GPU kernel events"),
        "no-traceEvents": (["trace", "import", f"{d}/obj.json"], "'traceEvents'"),
        "no-kernels": (["trace", "import", f"{d}/nokernels.json"], "no GPU kernel events"),
        "two-gpus": (["trace", "import", f"{d}/twogpus.json"], "kernels on 2 GPUs (0, 1); pick one with --device"),
        "device-absent": (["trace", "import", f"{d}/ok.json", "--device", "3"], "no kernels on GPU 3"),
        "neg-dur": (["trace", "import", f"{d}/negdur.json"], "dur = -1"),
        "zero-span": (["trace", "import", f"{d}/zerodur.json"], "step 1 lasts 0 µs"),
        "str-ts": (["trace", "import", f"{d}/strts.json"], "ts = 'soon'"),
        "step-range": (["trace", "import", step, "--step", "2"], "step 2 out of range: the trace has 1 step(s)"),
        "model": (["trace", "import", step, "-m", "gpt-9"], "unknown model 'gpt-9'"),
        "gpu": (["trace", "import", step, "-m", "llama-3.2-1b", "-g", "h900"], "unknown GPU 'h900'"),
        "batch": (["trace", "import", step, "-m", "llama-3.2-1b", "-b", "0"], "batch must be"),
        "json-dir": (["trace", "import", step, "--json", f"{d}/no/x.json"], "--json"),
        "cut-dest": (["trace", "cut", step, f"{d}/no/x.json"], "DEST"),
    }


def test_bad_files_are_one_line_exit_2(tmp_path, capsys):
    for case, (argv, match) in _bad_files(tmp_path).items():
        code, stdout, err = run_cli(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, err)
        assert match in lines[0], (case, lines[0])
        assert stdout == "", case


@pytest.mark.parametrize("name,gpu", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
                                      ("NVIDIA H200", "h200-calibrated"), ("NVIDIA GeForce RTX 4090", "rtx4090")])
def test_the_traces_gpu_picks_the_hardware_file(tmp_path, name, gpu):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"deviceProperties": [{"id": 0, "name": name, "numSms": 7}],
                             "traceEvents": [kernel("gemm", 0, 1)]}))
    t = import_trace(p, model="llama-3.2-1b")
    assert t.prediction is not None and t.prediction.gpu == gpu
    assert "the trace ran on 7 SMs" in (t.prediction.note or "")


def test_gzipped_and_plain_read_alike_and_gpu_needs_a_name(tmp_path):
    _bad_files(tmp_path)
    assert import_trace(tmp_path / "ok.json").step_us == import_trace(tmp_path / "ok.json.gz").step_us == 1.0
    (tmp_path / "anon.json").write_text(json.dumps({"traceEvents": [kernel("gemm", 0, 1)]}))
    with pytest.raises(TraceError, match="does not name its GPU; give --gpu"):
        import_trace(tmp_path / "anon.json", model="llama-3.2-1b")
    assert import_trace(tmp_path / "anon.json", model="llama-3.2-1b", gpu="h200-datasheet").prediction is not None
    assert issubclass(TraceError, MksimError)


@pytest.mark.parametrize("module", [trace, trace_map, trace_cli, trace_read], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0
