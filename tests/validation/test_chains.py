"""Chains of LLM projections (validation.chains): workloads, plans, predictions, the raw file's
schema and the predictor, without a GPU. Every raw file here is SYNTHETIC test data."""

from __future__ import annotations

import json
import math

import pytest

from mksim.errors import MksimError
from validation.chains import calibrate as K
from validation.chains import cases as C
from validation.chains import cli
from validation.chains import predict as PR
from validation.chains import runner as R
from validation.megakernel import program as P
from validation.megakernel.gpu import PDL_TRIGGERS, compile_options


# -- the chains as workloads ------------------------------------------------------------------------
def test_every_sequence_chains():
    for s in C.SEQUENCES.values():
        C.check_shapes(s.shapes)
        wl = C.chain_workload(s.name, s.batches[0])
        assert [(op.attrs["k"], op.out_size) for op in wl.ops] == list(s.shapes)
        assert wl.ops[0].inputs == ()
        assert all(op.inputs[0].op == wl.ops[i].name and op.inputs[0].full for i, op in enumerate(wl.ops[1:]))
        assert wl.weight_bytes == sum(k * n * 2 for k, n in s.shapes)


def test_shapes_that_do_not_chain_are_refused():
    with pytest.raises(MksimError, match="op 1 reads 2048 inputs but op 0 makes 512"):
        C.check_shapes([(2048, 512), (2048, 2048)])
    with pytest.raises(MksimError, match="multiple of 256"):
        C.check_shapes([(100, 512)])


def test_at_least_40_cases_with_unique_names():
    cs = C.case_list()
    assert len(cs) >= 40
    assert len({c.name for c in cs}) == len(cs)
    assert {c.implementation for c in cs} == {"mksim", "cublas"}
    assert {c.batch for c in cs} == {1, 8}
    assert {c.trigger for c in cs if c.mode == "graph_pdl"} == {"early", "late"}
    assert {c.mode for c in cs if c.implementation == "cublas"} == {"stream", "graph"}


@pytest.mark.parametrize("seq,batch", [(s.name, b) for s in C.SEQUENCES.values() for b in s.batches])
def test_every_case_plans_for_the_generated_kernel(seq, batch):
    wl = C.chain_workload(seq, batch)
    assert C.fits_kernel(C.SEQUENCES[seq].shapes, batch)
    for mode in C.MKSIM_MODES:
        plan = P.plan(C.build_schedule(wl, mode))
        assert plan.smem_B <= P.SMEM_MAX_B
        assert plan.ops[0]["in0"] == "x:m0" and plan.buffers["x:m0"].shape == (batch, wl.ops[0].attrs["k"])
        assert plan.ops[1]["in0"] == "out:m0"
        assert len(plan.program.tasks) == len(C.build_schedule(wl, mode).graph)


def test_a_14336_wide_input_at_batch_8_does_not_fit():
    assert not C.fits_kernel([(14336, 4096)], 8)
    assert C.fits_kernel([(14336, 4096)], 1)


def test_sweep_covers_64KiB_to_256MiB():
    sw = C.sweep_shapes()
    assert [k * n * 2 for k, n in sw] == [1 << e for e in range(16, 29)]
    assert all(n % 16 == 0 for _, n in sw)


def test_pdl_trigger_is_a_compile_flag():
    assert "-DMK_PDL_TRIGGER=0" in compile_options()
    assert "-DMK_PDL_TRIGGER=1" in compile_options("late")
    assert set(PDL_TRIGGERS) == set(C.TRIGGERS)
    with pytest.raises(MksimError, match="unknown PDL trigger"):
        compile_options("never")


def test_reference_of_an_input_less_chain_is_the_matmul_chain():
    """The first op reads its own input buffer; each next op the previous output (torch on the CPU)."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    wl = C.chain_workload(C.Sequence("t", "llama-3.2-1b", ((512, 256), (256, 512))), 2)
    plan = P.plan(C.build_schedule(wl, "graph"))
    g = torch.Generator().manual_seed(0)
    bufs = {n: (torch.randn(b.shape, generator=g) * b.scale).to(torch.bfloat16)
            for n, b in plan.buffers.items() if b.fill == "normal"}
    bufs["rope"] = torch.zeros(64)
    out = reference.run(plan, bufs)
    y0 = (bufs["x:m0"].float() @ bufs["w:m0"].float().t()).to(torch.bfloat16)
    y1 = (y0.float() @ bufs["w:m1"].float().t()).to(torch.bfloat16)
    assert torch.equal(out["out:m0"], y0) and torch.equal(out["out:m1"], y1)


# -- predictions --------------------------------------------------------------------------------------
def test_predictions_are_positive_and_a_graph_beats_a_stream():
    for impl in C.IMPLEMENTATIONS:
        st = PR.predict_case("1b-gqa", 1, "stream", impl, "h200-calibrated")
        gr = PR.predict_case("1b-gqa", 1, "graph", impl, "h200-calibrated")
        assert 0 < gr < st < 1e4
    with pytest.raises(MksimError, match="unknown implementation"):
        PR.predict_case("1b-gqa", 1, "graph", "triton", "h200-calibrated")


def test_a_chain_costs_at_least_its_bytes_at_peak_bandwidth():
    import hwmodels

    g = hwmodels.load("h200-calibrated")
    wl = C.chain_workload("1b-mlp", 1)
    floor_us = wl.weight_bytes / (g.dram.bandwidth_spec_GBps * 1e3)
    for mode in C.MKSIM_MODES:
        assert PR.predict_case("1b-mlp", 1, mode, "mksim", "h200-calibrated") > floor_us


# -- the raw file ---------------------------------------------------------------------------------------
def test_raw_doc_and_case_record_have_the_schema():
    doc = R.new_doc(["1b-gqa"], quick=True, reps=10)
    assert tuple(doc) == R.DOC_KEYS
    assert doc["sequences"]["1b-gqa"]["shapes"][0] == [2048, 512]
    rec = R.case_record(C.Case("1b-gqa", 8, "mksim", "graph_pdl", "late"))
    rec.update(R.stats([3.0, 1.0, 2.0, 4.0, 5.0]), checked=True, rel_err=1e-3)
    assert set(R.CASE_KEYS) <= set(rec)
    assert rec["name"] == "1b-gqa/b8/mksim/graph_pdl:late" and rec["n_kernels"] == 16
    assert rec["measured_us"] == 3.0 and rec["p10_us"] == pytest.approx(1.4) and rec["p90_us"] == pytest.approx(4.6)
    json.dumps(doc)


def test_torch_check_passes_linear_and_flags_a_nan():
    torch = pytest.importorskip("torch")
    ws, x = R.weights([(512, 256), (256, 512)], 8, seed=0, device="cpu")
    assert R.torch_check(ws, x) < 1e-2
    ws[1][3, 5] = float("nan")
    assert R.torch_check(ws, x) == math.inf
    assert ws[0].dtype == torch.bfloat16 and ws[0].shape == (256, 512)


def test_kernels_are_assigned_to_the_range_their_launch_lies_in():
    """A SYNTHETIC chrome trace: two ranges, a launch in each, one kernel per launch, one stray kernel."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "chains:2048x512", "ts": 0, "dur": 10},
          {"ph": "X", "cat": "user_annotation", "name": "chains:512x2048", "ts": 20, "dur": 10},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 5, "args": {"correlation": 1}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 25, "args": {"correlation": 2}},
          {"ph": "X", "cat": "kernel", "name": "gemv_a", "ts": 7, "dur": 3.5,
           "args": {"correlation": 1, "grid": [128, 1, 1], "block": [128, 1, 1], "registers per thread": 40,
                    "shared memory": 0}},
          {"ph": "X", "cat": "kernel", "name": "gemv_b", "ts": 27, "dur": 2.0,
           "args": {"correlation": 2, "grid": [16, 1, 1], "block": [256, 1, 1], "registers per thread": 64}},
          {"ph": "X", "cat": "kernel", "name": "stray", "ts": 50, "dur": 1.0, "args": {"correlation": 9}}]
    ks = R.kernels_from_trace(ev, 8)
    assert [(k["name"], k["K"], k["N"], k["registers"], k["duration_us"]) for k in ks] == [
        ("gemv_a", 2048, 512, 40, 3.5), ("gemv_b", 512, 2048, 64, 2.0)]


# -- the predictor on a SYNTHETIC raw file ---------------------------------------------------------------
def synthetic_raw(scale: float = 1.1) -> dict:
    """SYNTHETIC test data, not a measurement: every case 'measured' at ``scale`` x its ideal-kernel
    prediction, except graph_pdl late, 'measured' 20 % slower than graph (PDL losing); each
    implementation's single 'measured' (graph-timed) at twice its prediction."""
    raw = R.new_doc(["1b-gqa"], quick=True, reps=10)
    raw["synthetic"] = True
    raw["gpu"] = "SYNTHETIC"
    graph = scale * PR.predict_case("1b-gqa", 1, "graph", "mksim", "h200-calibrated", profiles=False)
    for c in C.case_list(["1b-gqa"]):
        if c.batch != 1:
            continue
        rec = R.case_record(c)
        pred = PR.predict_case(c.sequence, c.batch, c.mode, c.implementation, "h200-calibrated", c.trigger,
                               profiles=False)
        meas = 1.2 * graph if c.trigger == "late" else scale * pred
        rec.update(measured_us=meas, p10_us=meas, p90_us=meas, checked=True, rel_err=0.0)
        raw["cases"].append(rec)
    for impl in C.IMPLEMENTATIONS:
        meas = 2 * PR.predict_single(2048, 512, 1, impl, "h200-calibrated", profiles=False)
        raw["singles"].append(R.single_record(impl, 1, 2048, 512, None, [meas + 10] * 3, [meas + 5] * 3, [30.0] * 3,
                                              [5.0] * 3, 2, True, 0.0))
    return raw


def test_predictor_on_synthetic_raw():
    rep = PR.report(synthetic_raw(), "h200-calibrated", profiles=False)
    assert rep["synthetic"]
    rows = {r["name"]: r for r in rep["rows"]}
    assert len(rows) == 8
    assert rows["1b-gqa/b1/cublas/graph"]["error"] == pytest.approx(1 / 1.1 - 1)
    pdl = {p["name"]: p for p in rep["pdl"]}
    assert pdl["1b-gqa/b1/mksim/graph_pdl:late"]["measured_effect"] == pytest.approx(0.2)
    assert pdl["1b-gqa/b1/mksim/graph_pdl:late"]["sign_right"] is False  # the model has PDL win
    early = pdl["1b-gqa/b1/mksim/graph_pdl:early"]
    assert early["counted"] and early["sign_right"] and early["measured_effect"] == pytest.approx(
        early["predicted_effect"])
    s = rep["summary"]
    assert s["pdl_sign"] == {"threshold": 0.03, "counted": 2, "right": 1}
    late_err = abs(rows["1b-gqa/b1/mksim/graph_pdl:late"]["error"])
    assert s["mape"] == pytest.approx((7 * (1 - 1 / 1.1) + late_err) / 8)
    assert s["by_implementation"]["cublas"] == pytest.approx(1 - 1 / 1.1)
    assert "SYNTHETIC" in PR.format_report(rep)
    assert s["singles"] == {"mksim": pytest.approx(0.5), "cublas": pytest.approx(0.5)}
    assert [r["error"] for r in rep["singles"]] == [pytest.approx(-0.5)] * 2


def test_a_bigger_single_kernel_is_predicted_slower():
    for impl in C.IMPLEMENTATIONS:
        ts = [PR.predict_single(k, n, 1, impl, "h200-calibrated") for k, n in C.sweep_shapes()]
        assert ts == sorted(ts) and ts[-1] > 10 * ts[0]


def test_unchecked_cases_are_left_out_of_the_mape():
    raw = synthetic_raw()
    raw["cases"][0]["checked"] = False
    s = PR.report(raw, "h200-calibrated", profiles=False)["summary"]
    assert s["n"] == 7 and s["n_unchecked"] == 1 and math.isfinite(s["mape"])


def test_predict_cli_writes_json(tmp_path, capsys):
    raw = tmp_path / "chains.json"
    raw.write_text(json.dumps(synthetic_raw()))
    assert cli.main(["predict", str(raw), "--no-profiles", "--json", str(tmp_path / "out.json"),
                     "--summary", str(tmp_path / "summary.json")]) == 0
    assert "PDL sign right in 1 of 2" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())["summary"]["n"] == 8
    summ = json.loads((tmp_path / "summary.json").read_text())
    assert summ["synthetic"] and summ["pdl_sign"]["right"] == 1 and summ["pdl_sign"]["of"] == 2
    assert {c["gpu"] for c in summ["cases"]} == {"h200-calibrated"}


def test_run_cli_refuses_an_unknown_sequence(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--out", "/nonexistent", "--sequences", "1b-gqa,70b"])
    assert exc.value.code == 2 and "unknown sequence '70b'" in capsys.readouterr().err


@pytest.mark.parametrize("text,msg", [("not json", "not JSON"), ('{"cases": 3}', "no 'cases' list"),
                                      ('{"cases": [{"name": "x"}]}', "case 0: missing implementation"),
                                      (None, "No such file")])
def test_predict_cli_bad_input_is_one_line(tmp_path, capsys, text, msg):
    raw = tmp_path / "chains.json"
    if text is not None:
        raw.write_text(text)
    with pytest.raises(SystemExit) as exc:
        cli.main(["predict", str(raw)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and msg in err and err.count("\n") == 1


# -- the runner's orchestration, with the GPU parts replaced by fakes --------------------------------
@pytest.fixture
def fake_gpu(monkeypatch):
    """FAKE measurements (no GPU): every case and single 'measures' fixed numbers; cuBLAS's stream
    case at batch 8 fails."""
    import sys
    import types

    torch = pytest.importorskip("torch")
    cupy = types.ModuleType("cupy")
    cupy.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    cupy.empty = lambda *a, **k: None
    cupy.float32 = "float32"
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **k: empty(4))

    def torch_case(case, *_):
        if case.mode == "stream" and case.batch == 8:
            raise RuntimeError("boom\nsecond line")
        return {**R.stats([2.0]), "checked": True, "rel_err": 0.0}

    def singles(impl):
        return lambda b, shapes, *_: [{"implementation": impl, "batch": b, "K": k, "N": n, "measured_us": 1.0}
                                      for k, n in shapes]

    monkeypatch.setattr(R, "mk_case", lambda *_: {**R.stats([1.0, 2.0, 3.0]), "checked": True, "rel_err": 0.0})
    monkeypatch.setattr(R, "torch_case", torch_case)
    monkeypatch.setattr(R, "mk_singles", lambda *a: (singles("mksim")(*a), {"name": "mk_chain"}))
    monkeypatch.setattr(R, "torch_singles", singles("cublas"))
    monkeypatch.setattr(R, "profile_kernels", lambda b, shapes: [{"name": "gemv", "batch": b}])


def test_run_writes_every_case_and_one_line_per_failure(fake_gpu, tmp_path):
    doc = R.run(tmp_path, 100, quick=True)
    disk = json.loads((tmp_path / R.RAW).read_text())
    assert disk["cases"] == doc["cases"] and len(doc["cases"]) == 15
    assert doc["errors"] == ["1b-gqa/b8/cublas/stream: RuntimeError: boom"] and doc["skipped"] == []
    n_shapes = len(set(C.SEQUENCES["1b-gqa"].shapes)) + len(C.sweep_shapes(quick=True))
    assert len(doc["singles"]) == 2 * 2 * n_shapes and len(doc["kernels"]) == 4
    assert all(set(R.CASE_KEYS) <= set(c) for c in doc["cases"])


def test_run_past_its_timeout_skips_the_rest(fake_gpu, tmp_path):
    doc = R.run(tmp_path, 1e-9, quick=True)
    assert doc["cases"] == [] and len(doc["skipped"]) == 16 + 6


# -- single kernels: how the runner times them, what the first run's measure ------------------------------
def test_a_single_is_its_graph_replay_less_an_empty_kernel():
    """A story: 8 copies take 1 + 8 * 3 µs of replay, one takes 1 + 3, an empty kernel 2: the
    marginal cost is 3 µs and the kernel alone costs 2 µs more than an empty kernel."""
    r = R.single_record("cublas", 8, 4096, 1024, None, [25.0, 24.0, 26.0], [4.0] * 3, [40.0] * 3, [2.0] * 3, 8,
                        True, 1e-3)
    assert set(R.SINGLE_KEYS) <= set(r) and r["method"] == R.SINGLES_METHOD == "graph"
    assert r["kernel_us"] == pytest.approx(3.0) and r["alone_us"] == r["measured_us"] == pytest.approx(2.0)
    assert r["event"]["measured_us"] == 40.0 and r["graph_n"]["p10_us"] < 25.0 < r["graph_n"]["p90_us"]
    json.dumps(r)
    with pytest.raises(MksimError, match="at least 2 copies"):
        R.single_record("mksim", 1, 2048, 16, 1, [1.0], [1.0], [1.0], [1.0], 1, True, 0.0)


def test_copies_keep_at_most_a_GiB_of_weights_and_at_least_two():
    assert R.copies_for(64 << 10) == R.SINGLE_COPIES == 8
    assert R.copies_for(128 << 20) == 8 and R.copies_for(256 << 20) == 4 and R.copies_for(4 << 30) == 2


def test_graph_times_flush_and_drain_before_every_replay_and_drop_two_warm_ones():
    log: list[str] = []

    def record():  # replay i 'takes' i µs
        log.append("start")
        i = log.count("start") - 1
        return (lambda: log.append("stop") or "e1"), lambda: float(i)

    out = R.graph_times(lambda: log.append("launch"), lambda: log.append("sync"), record,
                        lambda i: log.append(f"flush {i}"), 3, lambda e1: log.append(f"wait {e1}"))
    assert out == [2.0, 3.0, 4.0]
    assert log[:6] == ["flush 1", "sync", "start", "launch", "stop", "wait e1"] and len(log) == 5 * 6


def first_run_raw() -> dict:
    """SYNTHETIC test data shaped like the first run: event singles and profiler kernels."""
    raw = R.new_doc(["1b-gqa"], quick=True, reps=10)
    raw["synthetic"] = True
    raw["singles"] = [{"implementation": "cublas", "batch": 1, "K": 4096, "N": 1024, "measured_us": 30.0},
                      {"implementation": "cublas", "batch": 1, "K": 2048, "N": 512, "measured_us": 28.0},
                      {"implementation": "mksim", "batch": 1, "K": 2048, "N": 512, "measured_us": 12.0}]
    raw["kernels"] = [{"implementation": "cublas", "batch": 1, "K": 4096, "N": 1024, "duration_us": 4.0,
                       "name": "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT"},
                      {"implementation": "cublas", "batch": 1, "K": 4096, "N": 1024, "duration_us": 1.5,
                       "name": "void cublasLt::splitKreduce_kernel<32, 16>"},
                      {"implementation": "cublas", "batch": 1, "K": 2048, "N": 512, "duration_us": 5.0,
                       "name": "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"},
                      {"implementation": "cublas", "batch": 1, "K": 1024, "N": 4096, "duration_us": 5.0,
                       "name": "nvjet_sm90_tst_128x8_64x12_2x1_v_bz_TNT"},
                      {"implementation": "mksim", "batch": 1, "name": "mk_chain"}]
    return raw


def test_the_first_runs_singles_hold_a_host_gap_and_only_cublas_has_gpu_times():
    raw = first_run_raw()
    gaps = K.host_gaps(raw)
    assert [(g["K"], g["gpu_us"], g["gap_us"]) for g in gaps] == [(4096, 5.5, 24.5), (2048, 5.0, 23.0)]
    assert K.gap_summary(gaps) == {"cublas b1": {"n": 2, "median_us": 23.75, "min_us": 23.0, "max_us": 24.5}}
    gs = K.gpu_singles(raw)
    assert [(g["implementation"], g["us"], g["source"]) for g in gs] == [("cublas", 5.5, "profiler"),
                                                                         ("cublas", 5.0, "profiler")]
    graph = synthetic_raw()  # graph-timed singles: their alone_us, both implementations
    assert {(g["implementation"], g["source"]) for g in K.gpu_singles(graph)} == {("mksim", "graph"),
                                                                                  ("cublas", "graph")}


def test_inflight_is_the_stage_ring_of_the_kernels_cublas_picks():
    kib, note = K.inflight_from_kernels(first_run_raw())
    assert kib == 128 and "2 of 3" in note and "192" in note  # 64 x 64 x 2 B x 16; 128 x 64 x 2 B x 12
    assert K.inflight_from_kernels({"kernels": []})[0] is None


def test_the_cublas_profile_loads_and_every_value_says_where_it_comes_from():
    import tomllib

    import hwmodels

    g = hwmodels.load("h200-calibrated+cublas")
    c = g.kernels.per_kind["matmul"]
    assert g.profile == "cublas" and c.task_fixed_us > 0 and c.consume_GBps > 0 and c.inflight_KiB == 128
    doc = tomllib.loads(hwmodels.resolve_profile("cublas").read_text())
    assert doc["measured_on"] == "h200-calibrated"
    for key, v in doc["runtime"]["kernels"]["matmul"].items():
        assert v["source"] in doc["sources"] and len(v["note"]) > 40, key
    assert "single kernels" in doc["runtime"]["kernels"]["matmul"]["task_fixed_us"]["note"]


@pytest.mark.slow  # 3.2 s of CPU
def test_a_fit_to_singles_made_by_a_known_cost_recovers_it():
    """SYNTHETIC singles: each 'measured' at what mksim predicts with fixed 3 µs and 40 GB/s."""
    pytest.importorskip("scipy")
    import hwmodels
    from hwmodels import KernelCost

    truth = K.with_matmul(hwmodels.load("h200-calibrated"), KernelCost(task_fixed_us=3.0, consume_GBps=40.0))
    raw = first_run_raw()
    raw["singles"] = [R.single_record("cublas", 1, 2048, n, None, [9.0] * 3, [K.predict_alone(2048, n, 1, truth) + 1]
                                      * 3, [30.0] * 3, [1.0] * 3, 2, True, 0.0) for n in (16, 4096, 32768)]
    fit = K.fit_cublas(raw)
    assert fit.cost.task_fixed_us == pytest.approx(3.0, rel=0.05)
    assert fit.cost.consume_GBps == pytest.approx(40.0, rel=0.1) and fit.rms < 0.01


def test_fit_cli_refuses_a_file_without_singles(tmp_path, capsys):
    raw = tmp_path / "chains.json"
    raw.write_text('{"cases": []}')
    with pytest.raises(SystemExit) as exc:
        cli.main(["fit", str(raw)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "no 'singles' list" in err and err.count("\n") == 1


# -- profiles, triggers and the committed summary -------------------------------------------------------
def test_each_implementation_is_predicted_with_its_profile():
    assert PR.model_for("mksim", "h200-calibrated")[0] == "h200-calibrated+mksim-mm1"  # the chains ran MK_MM=1
    assert PR.model_for("cublas", "h200-calibrated")[0] == "h200-calibrated+cublas"
    assert PR.model_for("cublas", "h200-calibrated", profiles=False) == ("h200-calibrated", "ideal kernels (no "
                                                                                           "implementation profile)")
    assert PR.model_for("cublas", "h200-calibrated+mksim")[0] == "h200-calibrated+mksim"


def test_the_trigger_reaches_the_schedule():
    """With ideal kernels, a late trigger lets the next kernel prefetch later: slower than early."""
    early = PR.predict_case("1b-gqa", 1, "graph_pdl", "mksim", "h200-calibrated", "early", profiles=False)
    late = PR.predict_case("1b-gqa", 1, "graph_pdl", "mksim", "h200-calibrated", "late", profiles=False)
    assert late > early


RESULTS = "validation/results/h200-mechanisms"


@pytest.mark.slow  # 2.9 s of CPU
def test_the_committed_summary_is_what_the_committed_raw_file_gives():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    raw_path = f"{RESULTS}/chains/chains.json"
    raw = json.loads((root / raw_path).read_text())
    committed = json.loads((root / RESULTS / "summary.json").read_text())
    # the committed "command" is history: it ran as the module path the runner had then
    committed["command"] = committed["command"].replace("-m validation.chains ", "-m validation chains ")
    assert PR.summary_json(PR.report(raw, "h200-calibrated"), raw_path) == committed
    assert committed["n"] == 56 and not committed["synthetic"]
    assert {c["implementation"]: c["gpu"] for c in committed["cases"]} == {"mksim": "h200-calibrated+mksim-mm1",
                                                                          "cublas": "h200-calibrated+cublas"}


def test_doctests():
    import doctest

    assert doctest.testmod(C).failed == 0
    assert doctest.testmod(R).failed == 0
