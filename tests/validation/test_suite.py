"""The validation suite without a GPU: cases, the stored searched schedules, run_suite with a fake
measure (failures, interruptions, resume), the summary's schema and metrics, Kendall's τ, the
report and validate commands, and the docs section's commands and tables."""

from __future__ import annotations

import inspect
import json
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mksim
import validation.suite as vs
import validation.suite.parts as vr
from mksim.errors import MksimError
from validation.calibrate import NoGPUError
from validation.suite.schedules import schedules_table
from validation.suite.targets import design_targets

from .. import clirun
from ..clirun import mksim_inproc
from . import predict_once

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "validation.md"
ISSUE_KEYS = ["model", "batch", "mode", "schedule", "predicted_us", "measured_us", "measured_spread_us", "max_rel_err"]
SMALL = [vs.Case("llama-3.2-1b", 1, "graph"), vs.Case("llama-3.2-1b", 1, "graph_pdl"),
         vs.Case("llama-3.2-1b", 1, "megakernel")]
DEVICE = {"name": "Fake H200", "driver": "0.0", "host": "test"}


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``mksim ARGS`` in a child Python: where a real process is the point (its exit status, no traceback)."""
    return subprocess.run([sys.executable, "-m", "mksim", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.fixture(autouse=True)
def _predict_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every schedule these tests predict (in this process) is simulated once: tests/validation/predict_once.py."""
    predict_once.patch(monkeypatch)


def fake_trace(schedule, path) -> None:
    """Per-task stamps as gpu.measure(raw_trace=) writes them: every task of op o waits 0.2 µs from
    o µs, computes 0.5 µs and is handed over 0.1 µs later (ns from 1 ms)."""
    from validation.megakernel.encode import encode

    prog = encode(schedule)
    o = prog.tasks[:, 1].astype(np.uint64)
    base = 1_000_000 + 1000 * o
    stamps = np.stack([base, base + 200, base + 700, base + 800], axis=1).astype(np.uint64)
    np.savez_compressed(path, stamps=stamps, tasks=prog.tasks, queue_start=prog.queue_start,
                        ops=np.array([op.name for op in schedule.workload.ops]))


def fake_measure(slower: float = 1.1, fail: str | None = None, calls: list | None = None, rel_err: float = 3e-3):
    """A GPU runner that 'measures' the prediction times ``slower``; raises for the case ``fail``;
    writes a :func:`fake_trace` where asked for one."""
    def measure(schedule, *, reps=20, watchdog_s=60.0, source_dir=None, raw_trace=None):
        if calls is not None:
            calls.append(schedule.mode)
        if fail and schedule.mode == fail:
            raise RuntimeError("the kernel hung\nsecond line never shown")
        if raw_trace is not None:
            fake_trace(schedule, raw_trace)
        us = vs.predicted_us(schedule) * slower
        return {"measured_us": us, "measured_spread_us": 0.02 * us, "times_us": [us] * reps, "max_rel_err": rel_err,
                "rel_err": {"lm_head": rel_err}, "bytes_moved": 2.5e9, "kernel": {}, "sources": []}
    return measure


# -- the cases -----------------------------------------------------------------------------------
MK_SCHEDULES = ["megakernel:default", "megakernel:searched", "megakernel:fused", "megakernel:sentinel"]


def test_standard_suite_has_every_mode_and_schedule_for_two_models_and_three_batches():
    cases = vs.CASES
    assert len(cases) == 48 and len({c.name for c in cases}) == 48 and vs.BATCHES == (1, 4, 8)
    assert {c.mode for c in cases} == set(mksim.MODES)
    for model in vs.MODELS:
        for batch in vs.BATCHES:
            group = [c for c in cases if (c.model, c.batch) == (model, batch)]
            assert sorted(c.name.split("/")[-1] for c in group) == sorted(
                ["stream", "graph", "graph_pdl", "persistent_barrier", *MK_SCHEDULES])
            assert all(c.kv_len == 1024 for c in group)
    assert [c.name for c in vs.select(cases, ["1b/b4/mega"])] == [f"llama-3.2-1b/b4/{s}" for s in MK_SCHEDULES]
    with pytest.raises(MksimError, match="no case matches --only gpt"):
        vs.select(cases, ["gpt"])


def test_fused_and_sentinel_cases_build_what_they_say():
    from mksim.workload import build_llm_workload

    params = inspect.signature(build_llm_workload).parameters
    want = tuple((f, True) for f in ("fuse_norm", "fuse_rope", "fuse_silu") if f in params)
    assert vs.fused_workload_options() == want + (("kv_splits", vs.SEARCHED),) and ("fuse_norm", True) in want
    fused = next(c for c in vs.CASES if c.name == "llama-3.2-1b/b1/megakernel:fused")
    s = vs.build(fused)
    searched = json.loads(vs.searched_schedule_path("llama-3.2-1b", 1).read_text())["workload"]
    assert s.workload_spec["kv_splits"] == searched["kv_splits"] and s.workload_spec["fuse_norm"] is True
    assert s.policy == vs.build(vs.Case("llama-3.2-1b", 1, "megakernel")).policy  # the default policy
    assert all(s.workload_spec.get(k) is True for k, _ in want)
    assert fused.record()["workload_options"] == dict(fused.workload_options)
    sentinel = vs.build(next(c for c in vs.CASES if c.name == "llama-3.2-1b/b1/megakernel:sentinel"))
    assert sentinel.options.sync == "sentinel" and sentinel.policy == s.policy
    with pytest.raises(MksimError, match="no searched schedule to take kv_splits from.*mksim validate schedules"):
        vs.workload_options(vs.Case("llama-3.2-1b", 2, "megakernel", "fused", workload_options=(("kv_splits",
                                                                                                   vs.SEARCHED),)))


@pytest.mark.parametrize("model,batch", [(m, b) for m in vs.MODELS for b in vs.BATCHES])
def test_searched_schedules_load_validate_and_fit_the_kernel(model, batch):
    path = vs.searched_schedule_path(model, batch)
    try:
        vs.kernel_options(model, batch)
    except vs.Refused:  # the kernels cannot hold it: nothing to search
        assert not path.exists()  # today none: the kernels hold every model and batch of the suite
        return
    sched = mksim.Schedule.from_json(path)  # validates: every task once, no deadlock, shared memory in budget
    assert sched.mode == "megakernel" and sched.gpu.name == vs.GPU  # searched on the model the suite predicts with
    assert (sched.workload.model.name, sched.workload.batch, sched.workload.kv_len) == (model, batch, 1024)
    vs.check_kernel_fit(sched, model, batch, 1024)
    info = json.loads(path.with_name(path.stem + ".search.json").read_text())
    assert info["fixed"] == vs.search_fixed(model, batch) or info["fixed"]["smem_reserve_KiB"] >= vs.kernel_options(
        model, batch)["smem_reserve_KiB"]
    assert sched.options.smem_reserve_KiB == info["fixed"]["smem_reserve_KiB"] and sched.options.blocks_per_sm == 1
    assert info["trials"] >= 100 and info["study"]["complete"] >= info["trials"] // 2
    # the search's best is never worse than its baselines (the default megakernel, graph_pdl among them)
    assert info["latency_us"] <= min(info["baselines_latency_us"].values())
    assert {"megakernel:dag", "graph_pdl"} <= set(info["baselines_latency_us"])


@pytest.mark.slow  # 2.7 s of CPU
def test_kernel_options_fit_every_default_case_but_the_refused_ones():
    refused = set()
    for c in vs.CASES:
        if c.schedule == "default":
            try:
                opts = vs.kernel_options(c.model, c.batch, c.kv_len, mode=c.mode)
            except vs.Refused as exc:
                assert "\n" not in str(exc)
                refused.add((c.model, c.batch))
                continue
            assert opts["smem_reserve_KiB"] >= 16
            vs.build(c)  # builds and validates with them (shared memory within the block's budget)
    assert refused == set()  # the 8B at batch 8 fits since its input rows are chunked along k


@pytest.mark.slow  # 1.5 s of CPU
def test_formula_kernel_options_and_a_schedule_that_no_longer_fits(tmp_path):
    formula = vs.core._formula_kernel_options
    assert formula("llama-3.2-1b", 1) == {"smem_reserve_KiB": 32}  # (8192 * 2 + 16384) / 1024
    assert formula("llama-3.1-8b", 4) == {"smem_reserve_KiB": 128}  # (4 * 14336 * 2 + 16384) / 1024
    s = mksim.build_schedule(mksim.models.workload("llama-3.2-1b", batch=4, n_sms=132), "h200-calibrated",
                             "megakernel", smem_reserve_KiB=8, blocks_per_sm=1)
    with pytest.raises(MksimError, match=r"smem_reserve_KiB=8 but the kernel needs smem_reserve_KiB>=.*mksim "
                                         r"validate schedules"):
        vs.check_kernel_fit(s, "llama-3.2-1b", 4, 1024)
    s.to_json(tmp_path / "small.json")
    r = clirun.mksim("validate", "--schedule", str(tmp_path / "small.json"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "smem_reserve_KiB=8" in r.stderr


# -- running ---------------------------------------------------------------------------------------
def test_run_suite_records_a_failure_and_goes_on(tmp_path):
    doc = vs.run_suite(SMALL, tmp_path, fake_measure(fail="graph_pdl"), reps=5, device=DEVICE)
    on_disk = json.loads((tmp_path / "measured.json").read_text())
    assert on_disk == doc and doc["gpu"] == "Fake H200" and doc["driver"] == "0.0" and doc["date"]
    assert [c["name"] for c in doc["cases"]] == [c.name for c in SMALL]
    good, bad, mk = doc["cases"]
    assert bad["error"] == "RuntimeError: the kernel hung" and "measurement" not in bad
    assert bad["schedule_json"]["mode"] == "graph_pdl"  # still predictable
    assert good["measurement"]["times_us"] == [good["measurement"]["measured_us"]] * 5
    assert mk["schedule_json"]["queues"] and mk["schedule"] == "default"


def test_run_suite_writes_after_each_case_and_resumes(tmp_path):
    seen = []

    def measure(schedule, **kw):
        if schedule.mode == "megakernel":  # interrupted during the third case
            seen.extend(c["name"] for c in json.loads((tmp_path / "measured.json").read_text())["cases"])
            raise KeyboardInterrupt
        return fake_measure()(schedule, **kw)

    with pytest.raises(KeyboardInterrupt):
        vs.run_suite(SMALL, tmp_path, measure, device=DEVICE)
    assert seen == [SMALL[0].name, SMALL[1].name]
    assert len(json.loads((tmp_path / "measured.json").read_text())["cases"]) == 2
    calls: list = []
    doc = vs.run_suite(SMALL, tmp_path, fake_measure(calls=calls), resume=True, device=DEVICE)
    assert calls == ["megakernel"] and len(doc["cases"]) == 3 and all("measurement" in c for c in doc["cases"])


def test_no_gpu_stops_the_suite_and_writes_nothing(tmp_path):
    def measure(schedule, **kw):
        raise NoGPUError("no CUDA GPU here")

    with pytest.raises(NoGPUError):
        vs.run_suite(SMALL, tmp_path / "out", measure, device=DEVICE)
    assert not (tmp_path / "out").exists()


REFUSED = vs.Case("llama-3.1-8b", 16, "megakernel")  # the kernels have no batch-16 instance


def test_a_refused_case_is_recorded_not_measured_nor_compared(tmp_path):
    calls: list = []
    dyn = vs.Case("llama-3.2-1b", 1, "megakernel", "dynamic", options=(("dispatch", "dynamic"),))
    doc = vs.run_suite([SMALL[0], REFUSED, vs.Case("llama-3.1-8b", 16, "graph"), dyn], tmp_path,
                       fake_measure(calls=calls), device=DEVICE)
    recs = {r["name"]: r for r in doc["cases"]}
    assert calls == ["graph"]  # nothing refused reached the GPU
    r = recs[REFUSED.name]
    assert "handles batch 1, 2, 4, 8, not 16" in r["refused"] and "\n" not in r["refused"]
    assert not {"measurement", "error", "schedule_json"} & set(r)
    assert recs["llama-3.1-8b/b16/graph"]["refused"] == r["refused"]
    assert "dispatch='dynamic'" in recs[dyn.name]["refused"]  # check_supported's one line
    s = vs.summarize(doc)
    assert (s["metrics"]["cases"], s["metrics"]["compared"], s["metrics"]["refused"]) == (4, 1, 3)
    row = next(x for x in s["cases"] if x["name"] == REFUSED.name)
    assert row["refused"] == r["refused"] and row["error"] is None and row["error_pct"] is None
    table = vs.markdown_table(s)
    assert ("| llama-3.1-8b | 16 | every mode | every schedule | – | – | – | refused: llama-3.1-8b batch 16: the "
            "generated kernel handles batch 1, 2, 4, 8, not 16") in table
    assert f"| llama-3.2-1b | 1 | megakernel | dynamic | – | – | – | refused: {recs[dyn.name]['refused']} |" in table
    assert "MAPE 9.1 % over 1 of 4 cases (3 refused)" in table and "failed" not in table


@pytest.mark.slow  # 1.0 s of CPU
def test_timeout_leaves_cases_not_begun_and_resume_keeps_the_other_parts(tmp_path):
    doc = vs.run_suite(SMALL, tmp_path, fake_measure(), device=DEVICE, timeout_s=-1.0)
    assert doc["cases"] == [] and doc["not_begun"] == [c.name for c in SMALL]
    assert vs.summarize(doc)["not_begun"] == doc["not_begun"]
    assert "- not run (the run's time was up): llama-3.2-1b/b1/graph" in vs.markdown_table(vs.summarize(doc))
    vs.run_suite(SMALL[:2], tmp_path, fake_measure(fail="graph_pdl"), device=DEVICE, resume=True)
    calls: list = []
    doc = vs.run_suite(SMALL[1:], tmp_path, fake_measure(calls=calls), device=DEVICE, resume=True)
    assert calls == ["graph_pdl", "megakernel"]  # the failed case again, the part's new one
    assert [c["name"] for c in doc["cases"]] == [c.name for c in SMALL] and doc["not_begun"] == []
    assert all("measurement" in c for c in doc["cases"]) and doc["cases"][0]["code"] is not None  # kept, with its code


@pytest.mark.slow  # 2.9 s of CPU
def test_persistent_cases_keep_their_op_spans_and_raw_traces(tmp_path):
    doc = vs.run_suite(SMALL, tmp_path, fake_measure(), device=DEVICE, traces=True)
    graph, _, mk = doc["cases"]
    assert "op_trace" not in graph and not (tmp_path / "traces" / vs.trace_file(graph["name"])).exists()
    assert (tmp_path / "traces" / "llama-3.2-1b-b1-megakernel-default.npz").is_file()
    sched = vs.build(SMALL[2])
    ops, tiles = sched.workload.ops, sched.graph.n_tiles
    assert list(mk["op_trace"]["ops"]) == [op.name for op in ops] and mk["op_trace"]["t0_ns"] == 1_000_000
    for i, op in enumerate(ops):  # fake_trace: op i's tasks start at i + 0.2 µs, compute 0.5, end at i + 0.8
        assert mk["op_trace"]["ops"][op.name] == pytest.approx(
            {"start_us": i + 0.2, "end_us": i + 0.8, "tasks": int(tiles[i]), "wait_us": 0.2, "compute_us": 0.5})
    a = vs.summarize(doc)["anatomy"]
    assert list(a) == [mk["name"]]
    layer = [op for op in ops if op.layer == 8]
    assert (a[mk["name"]]["layer"], a[mk["name"]]["layers"]) == (8, 16)
    assert [r["op"] for r in a[mk["name"]]["ops"]] == [op.name.split(".")[1] for op in layer] and \
        "qkv_proj" in [r["op"] for r in a[mk["name"]]["ops"]]
    for k, r in enumerate(a[mk["name"]]["ops"]):  # the layer's ops are consecutive: op k starts k µs after the first
        assert (r["start_us"], r["end_us"], r["span_us"]) == pytest.approx((k, k + 0.6, 0.6))
    moved = sum(op.weight_bytes + op.kv_read_bytes for op in layer)
    hbm = vs.summarize(doc)["metrics"]["hbm_read_GBps"]
    assert a[mk["name"]]["span_us"] == pytest.approx(len(layer) - 1 + 0.6)
    assert a[mk["name"]]["bytes"] == moved and a[mk["name"]]["dram_us"] == pytest.approx(moved / hbm / 1e3, abs=1e-3)


@pytest.mark.slow  # 1.6 s of CPU
def test_the_anatomy_before_and_after_side_by_side(tmp_path):
    fused = next(c for c in vs.CASES if c.name.endswith("1b/b1/megakernel:fused"))
    cases = [vs.Case("llama-3.2-1b", 1, "megakernel"), fused]
    s = vs.summarize(vs.run_suite(cases, tmp_path, fake_measure(), device=DEVICE))
    table = vs.markdown_table(s)
    assert "Per-layer anatomy of llama-3.2-1b batch 1, layer 8 of 16 (default " in table
    assert "| op | kind | default: start–end µs | tasks | wait / compute µs | fused: start–end µs |" in table
    assert "| attn_norm | rmsnorm | 0.0–0.6 | " in table and " | 0.20 / 0.50 | – | – | – |" in table  # fused: no norm
    assert re.search(r"\| qkv_proj \| matmul \| 1\.0–1\.6 \| \d+ \| 0\.20 / 0\.50 \| 0\.0–0\.6 \|", table)
    assert "The layer takes 9.6 µs (default) and " in table and "at the HBM read bandwidth (4558 GB/s)." in table


def test_parts_split_the_suite_by_estimated_time_and_keep_groups_together():
    ref = {c.name: 1.0 for c in vs.CASES}
    assert vr.estimate_s(vs.Case("llama-3.1-8b", 16, "graph"), ref) == 0.0  # refused: no time
    assert vr.estimate_s(vs.CASES[0], {**ref, vs.CASES[0].name: 3.5}) == 3.5
    b4 = {"llama-3.2-1b/b4/graph": 2.0, "llama-3.2-1b/b4/megakernel:default": 1.5}
    assert vr.estimate_s(vs.Case("llama-3.2-1b", 8, "graph"), b4) == 4.0  # the nearest batch, scaled
    assert vr.estimate_s(vs.Case("llama-3.2-1b", 4, "megakernel", "fused"), b4) == 1.5 * vr.NEW_SCHEDULE_X
    assert vr.estimate_s(vs.Case("llama-3.2-1b", 4, "megakernel", "fused"), {}) == vr.UNKNOWN_S
    for n in (1, 2, 3, 7):
        parts = vr.split(vs.CASES, n, ref)
        assert sorted(c.name for p in parts for c in p) == sorted(c.name for c in vs.CASES) and len(parts) == n
        assert all(p == [c for c in vs.CASES if c in p] for p in parts)  # each in the suite's order
        if n <= 6:  # a model and batch in one part
            assert all(len({i for i, p in enumerate(parts) if c in p}) == 1 for c in vs.CASES)
            assert all(sum((c.model, c.batch) == (m, b) for p in parts[:1] for c in p) in (0, 8)
                       for m in vs.MODELS for b in vs.BATCHES)
        loads = [vr.part_estimate_s(p, ref) - vr.START_S for p in parts]
        assert max(loads) - min(loads) <= 8 if n <= 5 else True
    budget = vr.START_S + 20
    n = vr.parts_needed(vs.CASES, budget, ref)
    assert all(vr.part_estimate_s(p, ref) <= budget for p in vr.split(vs.CASES, n, ref))
    assert any(vr.part_estimate_s(p, ref) > budget for p in vr.split(vs.CASES, n - 1, ref))
    assert vr.parts_needed(vs.CASES, 1e6, ref) == 1
    assert vr.select_part(vs.CASES, "2/3", ref) == vr.split(vs.CASES, 3, ref)[1]
    for bad in ("0/2", "3/2", "x/2", "2", ""):
        with pytest.raises(MksimError, match="--part takes K/N"):
            vr.parse_part(bad)


def test_reference_times_leave_out_a_process_start(tmp_path):
    cases = [{"name": f"m/b1/{k}", "model": "m", "elapsed_s": v} for k, v in
             (("a", 22.7), ("b", 0.3), ("c", 0.4), ("d", 0.5))]
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({"cases": cases}))
    assert vr.reference_times(path) == {"m/b1/a": 0.45, "m/b1/b": 0.3, "m/b1/c": 0.4, "m/b1/d": 0.5}
    assert vr.reference_times(tmp_path / "none.json") == {}


@pytest.mark.slow  # 3.0 s of CPU
def test_parts_merge_into_one_measured_json(tmp_path):
    vs.run_suite(SMALL[:2], tmp_path / "p1", fake_measure(fail="graph_pdl"), device=DEVICE)
    vs.run_suite(SMALL[1:], tmp_path / "p2", fake_measure(), device={**DEVICE, "host": "other"})
    doc = vr.merge([tmp_path / "p1", tmp_path / "p2" / "measured.json"], tmp_path / "all")
    assert json.loads((tmp_path / "all" / "measured.json").read_text()) == doc
    assert [c["name"] for c in doc["cases"]] == [c.name for c in SMALL] and doc["format"] == vs.FORMAT
    assert [c["run"] for c in doc["cases"]] == [0, 1, 1] and [r["host"] for r in doc["runs"]] == ["test", "other"]
    back = vr.merge([tmp_path / "p2", tmp_path / "p1"])  # a later failure does not replace a measurement
    assert "measurement" in back["cases"][1] and back["cases"][1]["run"] == 0
    assert vs.summarize(doc)["metrics"]["compared"] == 3
    with pytest.raises(MksimError, match="cannot read measured results"):
        vr.merge([tmp_path / "nowhere"])
    r = clirun.mksim("validate", "merge", str(tmp_path / "p1"), str(tmp_path / "p2"), "--out", str(tmp_path / "cli"))
    assert r.returncode == 0 and json.loads((tmp_path / "cli" / "measured.json").read_text())["cases"] == doc["cases"]


def test_the_light_command_line_plans_and_answers_in_one_line(tmp_path, capsys):
    lines: list[str] = []
    assert vr.main(["parts", "--parts", "2"], say=lines.append) == 0
    assert len(lines) == 2 and lines[0].startswith("part 1/2: ") and " s (" in lines[0]
    assert vr.main(["run", "--part", "3/2", "--out", str(tmp_path)], say=lines.append) == 2
    assert capsys.readouterr().err == "error: --part takes K/N with 1 <= K <= N (part K of N), not '3/2'\n"
    if not _has_gpu():
        assert vr.main(["run", "--only", "llama-3.2-1b/b1/graph", "--out", str(tmp_path / "x")], say=lines.append) == 2
        assert capsys.readouterr().err.startswith("error: ") and not (tmp_path / "x").exists()


# -- comparing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("x,y,tau", [
    ([1, 2, 3], [10, 20, 30], 1.0),
    ([1, 2, 3], [3, 2, 1], -1.0),
    ([1, 2, 3, 4], [1, 3, 2, 4], 4 / 6),           # 5 concordant, 1 discordant of 6 pairs
    ([1, 2, 2, 3], [1, 2, 3, 3], 0.8),             # 4 concordant; one tie each side: 4 / sqrt(5 * 5)
    ([1, 1, 2, 2], [1, 2, 1, 2], 0.0),             # 1 concordant, 1 discordant
    ([1, 2, 3, 4, 5], [2, 1, 4, 3, 5], 0.6),       # 8 - 2 of 10
    ([1, 1, 1], [1, 2, 3], None),                  # one side all tied: undefined
    ([5], [5], None),
])
def test_kendall_tau_b_by_hand(x, y, tau):
    got = vs.kendall_tau_b(x, y)
    assert got == tau if tau is None else got == pytest.approx(tau, abs=1e-12)


def test_kendall_tau_b_matches_scipy_on_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(1)
    for i in range(60):
        n = rng.randint(2, 30)
        if i % 2:  # integer ranks, many ties
            x = [rng.randint(0, 5) for _ in range(n)]
            y = [rng.randint(0, 5) for _ in range(n)]
        else:  # times in µs, as the suite compares them
            x = [rng.uniform(10, 1e4) for _ in range(n)]
            y = [v * rng.uniform(0.8, 1.2) for v in x]
        want = stats.kendalltau(x, y, variant="b").statistic
        got = vs.kendall_tau_b(x, y)
        assert (got is None) == bool(want != want)  # undefined exactly where scipy answers nan
        if got is not None:
            assert got == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("name", ["h200-datasheet", "h200-heldout"])
def test_committed_kendall_tau_recomputes_exactly_and_agrees_with_scipy(name):
    path = ROOT / "validation" / "results" / name / "summary.json"
    if not path.is_file():
        pytest.skip(f"no committed summary for {name}")
    s = json.loads(path.read_text())
    tau = vs.metrics(s["cases"], s["metrics"]["hbm_read_GBps"])["kendall_tau"]
    assert tau == s["metrics"]["kendall_tau"]  # to the last digit
    stats = pytest.importorskip("scipy.stats")
    ok = [r for r in s["cases"] if r["error_pct"] is not None and not r["error"]]
    want = stats.kendalltau([r["predicted_us"] for r in ok], [r["measured_us"] for r in ok]).statistic
    assert tau["overall"] == pytest.approx(want, abs=1e-12)


@pytest.mark.slow  # 1.6 s of CPU
def test_summary_schema_predictions_and_metrics(tmp_path):
    vs.run_suite(SMALL, tmp_path, fake_measure(slower=1.25, fail="graph_pdl"), device=DEVICE)
    s = vs.summarize(tmp_path / "measured.json")
    assert list(s)[:3] == ["gpu", "date", "cases"] and s["gpu"] == "Fake H200"
    assert s["predicted_with"] == vs.GPU == "h200-mk-kernels"
    for row in s["cases"]:
        assert list(row)[:8] == ISSUE_KEYS
    graph, pdl, mk = s["cases"]
    sched = mksim.build_schedule(mksim.models.workload("llama-3.2-1b", n_sms=132), vs.GPU, "graph",
                                 **vs.kernel_options("llama-3.2-1b", 1, mode="graph"))
    want = mksim.simulate(sched).latency_us - sched.gpu.launch.launch_latency_us
    assert graph["predicted_us"] == pytest.approx(want, rel=1e-12)
    assert graph["error_pct"] == pytest.approx((1 / 1.25 - 1) * 100)
    assert graph["achieved_GBps"] == pytest.approx(2.5e9 / graph["measured_us"] / 1e3) and graph["correct"] is True
    assert pdl["error"] == "RuntimeError: the kernel hung" and pdl["measured_us"] is None and pdl["predicted_us"] > 0
    m = s["metrics"]
    assert m["cases"] == 3 and m["compared"] == 2 and m["mape_pct"] == pytest.approx(20.0)
    assert set(m["by_mode"]) == {"graph", "megakernel"}
    assert m["kendall_tau"]["overall"] == 1.0 and m["kendall_tau"]["by_group"] == {"llama-3.2-1b/b1": 1.0}
    assert m["targets"]["mape_le_10pct"] is False and m["targets"]["kendall_tau_ge_0_8"] is True
    assert m["targets"]["megakernel_bandwidth_fraction"] == pytest.approx(mk["bandwidth_fraction"])
    json.dumps(s)  # JSON-able as it is


@pytest.mark.slow  # 1.8 s of CPU
def test_plot_data_and_markdown_table(tmp_path):
    from validation.suite import plots as suite_plots

    vs.run_suite(SMALL, tmp_path, fake_measure(fail="graph_pdl"), device=DEVICE)
    s = vs.summarize(tmp_path)
    pts = suite_plots.scatter_data(s)
    assert list(pts) == ["graph", "megakernel (default)"] and pts["graph"]["names"] == ["llama-3.2-1b/b1/graph"]
    errs = suite_plots.error_data(s)
    assert errs["graph"]["errors_pct"] == [pytest.approx((1 / 1.1 - 1) * 100)]
    bw = suite_plots.bandwidth_data(s)
    assert bw["hbm_read_GBps"] == pytest.approx(4557.6, rel=1e-3) and len(bw["names"]) == 2
    table = vs.markdown_table(s)
    assert "| llama-3.2-1b | 1 | graph | default |" in table and "-9.1 %" in table
    assert "- llama-3.2-1b/b1/graph_pdl failed: RuntimeError: the kernel hung" in table
    pytest.importorskip("matplotlib")
    made = suite_plots.write_plots(s, tmp_path / "plots")
    assert [p.name for p in made] == ["predicted-vs-measured.png", "error-by-mode.png", "bandwidth.png"]
    assert all(p.stat().st_size > 1000 for p in made)


def _row(model, batch, mode, schedule="default", us=None, *, frac=None, err=1.0, rel=1e-4, refused=None,
         error=None):
    measured = us is not None and not refused and not error
    return {"model": model, "batch": batch, "mode": mode, "schedule": schedule, "kv_len": 1024,
            "name": f"{model}/b{batch}/{mode}" + (f":{schedule}" if mode == "megakernel" else ""),
            "predicted_us": us * (1 + err / 100) if measured else None, "measured_us": us if measured else None,
            "error_pct": err if measured else None, "max_rel_err": rel if measured else None,
            "correct": (rel <= 1e-2) if measured else None, "error": error, "refused": refused,
            "achieved_GBps": frac * 4557.6 if frac and measured else None,
            "bandwidth_fraction": frac if measured else None, "measured_spread_us": 1.0}


S, L = vs.MODELS


def _targets(rows, stacks=None):
    m = vs.metrics(rows, 4557.6)
    return {t["id"]: t for t in design_targets(rows, m, vs.MODELS, 4557.6, stacks)}


def test_design_targets_met():
    rows = [_row(S, 1, "megakernel", "default", 800.0), _row(S, 1, "megakernel", "searched", 700.0, frac=0.5),
            _row(S, 1, "graph", us=1300.0, err=-9.0), _row(S, 8, "megakernel", "fused", 800.0),
            _row(L, 1, "megakernel", "default", 3000.0), _row(L, 1, "megakernel", "searched", 2800.0, frac=0.86),
            _row(L, 8, "megakernel", "sentinel", 3220.0), _row(L, 8, "megakernel", "default", 3300.0)]
    t = _targets(rows)
    assert list(t) == ["step_us", "bandwidth", "batch8", "searched", "prediction", "correct"]
    assert all(g["met"] is True for g in t.values()), t
    assert t["step_us"]["detail"] == "700.0 µs (searched)"
    assert t["bandwidth"]["detail"] == "86 %: 3.92 of 4.56 TB/s, 2800.0 µs (searched)"
    assert t["batch8"]["detail"] == f"{S} 1.14× (800.0 / 700.0 µs); {L} 1.15× (3220.0 / 2800.0 µs)"
    assert t["searched"]["detail"] == f"{S} 1.143× (700.0 against 800.0 µs); {L} 1.071× (2800.0 against 3000.0 µs)"
    assert t["prediction"]["detail"] == f"MAPE 2.0 % over 8 cases; largest -9.0 % ({S}/b1/graph)"


def test_design_targets_missed_refused_failed_and_not_measured():
    why = "llama-3.1-8b batch 8 does not fit the kernel's shared memory"
    rows = [_row(S, 1, "megakernel", "default", 900.0), _row(S, 1, "megakernel", "searched", 880.0, err=11.0),
            _row(S, 1, "megakernel", "fused", 700.0, rel=2e-2),  # fastest, but wrong: not counted
            _row(S, 8, "megakernel", "default", 2000.0),
            _row(L, 1, "megakernel", "searched", 2800.0, frac=0.7), _row(L, 1, "megakernel", "default", error="hung"),
            _row(L, 8, "megakernel", "default", refused=why), _row(L, 8, "graph", refused=why)]
    t = _targets(rows)
    assert t["step_us"]["met"] is False and t["step_us"]["detail"] == "880.0 µs (searched)"
    assert t["bandwidth"]["met"] is False and t["bandwidth"]["detail"].startswith("70 %: ")
    assert t["batch8"]["met"] is False
    assert t["batch8"]["detail"] == f"{S} 2.27× (2000.0 / 880.0 µs); {L} b8: refused ({why})"
    assert t["searched"]["met"] is False and t["searched"]["detail"].endswith(f"{L} b1 default: failed (hung)")
    assert t["prediction"]["met"] is False and "largest +11.0 %" in t["prediction"]["detail"]
    assert t["correct"]["met"] is False and t["correct"]["detail"].endswith(
        f"{S}/b1/megakernel:fused wrong, {L}/b1/megakernel:default failed")
    t = _targets([_row(S, 1, "megakernel", "default", 700.0)])
    assert t["bandwidth"]["met"] is None and t["bandwidth"]["detail"] == f"{L} b1: not measured"
    assert t["batch8"]["met"] is None and t["searched"]["met"] is None and t["step_us"]["met"] is True


def test_the_target_against_inductor_reads_a_stacks_run(tmp_path):
    from validation.suite.targets import read_stacks

    with pytest.raises(MksimError, match="no step-.*json files"):
        read_stacks(tmp_path)
    for stack, model, batch, kv, us in (("inductor_graph", S, 1, 1024, 1267.0), ("inductor_graph", S, 1, 4096, 9.0),
                                        ("torch_graph", S, 1, 1024, 1923.5), ("inductor_graph", L, 1, 1024, 4838.5)):
        (tmp_path / "run2").mkdir(exist_ok=True)
        (tmp_path / "run2" / f"step-{stack}-{model}-b{batch}-kv{kv}.json").write_text(json.dumps(
            {"stack": stack, "model": model, "batch": batch, "kv_len": kv,
             "step_us": {"median": us, "p10": us, "p90": us}}))
    st = read_stacks(tmp_path)
    assert len(st["steps"]) == 4 and st["source"] == str(tmp_path)
    rows = [_row(S, 1, "megakernel", "searched", 700.0), _row(L, 1, "megakernel", "default", 4000.0)]
    t = _targets(rows, st)["inductor"]
    assert t["met"] is False  # 8b: 1.21x
    assert t["detail"] == f"{S} b1 1.81× (1267.0 against 700.0 µs); {L} b1 1.21× (4838.5 against 4000.0 µs)"
    summary = {"gpu": "g", "date": "d", "predicted_with": vs.GPU, "cases": rows, "metrics": vs.metrics(rows, 4557.6),
               "design_targets": list(_targets(rows, st).values())}
    table = vs.markdown_table(summary)
    assert "| megakernel ≥ 1.5× faster than torch.compile in a CUDA graph (inductor_graph, " in table
    assert f"| {S} batch 1 step ≤ 730 µs | **met** | 700.0 µs (searched) |" in table
    (tmp_path / "run2" / "step-bad.json").write_text("{}")
    with pytest.raises(MksimError, match="not a step record"):
        read_stacks(tmp_path)


@pytest.mark.slow  # 1.5 s of CPU (matplotlib)
def test_plots_by_batch(tmp_path):
    from validation.suite import plots as suite_plots

    rows = [_row(S, b, "megakernel", sch, us, frac=0.4) for b, sch, us in
            ((1, "default", 1200.0), (4, "default", 1800.0), (8, "default", 2400.0), (1, "searched", 1100.0),
             (8, "searched", 2200.0))] + [_row(S, 1, "graph", us=1500.0), _row(L, 1, "graph", us=6000.0),
                                          _row(L, 8, "graph", refused="no")]
    summary = {"gpu": "g", "predicted_with": vs.GPU, "cases": rows, "metrics": vs.metrics(rows, 4557.6)}
    by = suite_plots.batch_data(summary)
    assert by == {S: {"graph": {1: 1500.0}, "megakernel (default)": {1: 1200.0, 4: 1800.0, 8: 2400.0},
                      "megakernel (searched)": {1: 1100.0, 8: 2200.0}}, L: {"graph": {1: 6000.0}}}
    assert suite_plots.scatter_data(summary)["megakernel (default)"]["batches"] == [1, 4, 8]
    pytest.importorskip("matplotlib")
    made = suite_plots.write_plots(summary, tmp_path)
    assert [p.name for p in made] == ["predicted-vs-measured.png", "error-by-mode.png", "bandwidth.png",
                                      "by-batch.png"] and all(p.stat().st_size > 1000 for p in made)


def test_the_anatomy_examples_hold():
    import doctest

    from validation.suite import anatomy as suite_anatomy

    assert doctest.testmod(suite_anatomy).failed == 0


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.slow
def test_report_command_rebuilds_summary_plots_table_and_docs(tmp_path):
    vs.run_suite(SMALL[:2], tmp_path / "run", fake_measure(), device=DEVICE)
    page = tmp_path / "page.md"
    page.write_text(f"# t\n\n{vs.DOCS_BEGIN}\nold\n{vs.DOCS_END}\nafter\n")
    r = clirun.mksim("validate", "report", str(tmp_path / "run"), "--out", str(tmp_path / "rep"), "--docs", str(page))
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert [c["mode"] for c in summary["cases"]] == ["graph", "graph_pdl"]
    assert (tmp_path / "rep" / "table.md").read_text() == vs.markdown_table(summary) and "| graph_pdl |" in r.stdout
    text = page.read_text()
    assert text.startswith("# t\n\n") and text.endswith(f"{vs.DOCS_END}\nafter\n") and "old" not in text
    assert vs.markdown_table(summary) in text
    assert not vs.splice_docs(page, vs.markdown_table(summary))  # already current


@pytest.mark.parametrize("args,match", [
    (["validate", "--model", "llama-3.2-1b"], "give --schedule FILE, or --model NAME and --mode MODE"),
    (["validate", "--model", "llama-3.2-1b", "--mode", "graf"], "unknown mode 'graf'"),
    (["validate", "--model", "gpt-9", "--mode", "graph"], "unknown model 'gpt-9'"),
    (["validate", "--model", "llama-3.2-1b", "--mode", "graph", "--policy", "rr"], "policies apply to megakernel"),
    (["validate", "--schedule", "x.json", "--mode", "graph"], "not both"),
    (["validate", "--reps", "3", "suite"], "--reps goes after the subcommand"),
    (["validate", "suite", "--only", "gpt-9"], "no case matches --only gpt-9"),
    (["validate", "report", "/nonexistent/dir"], "cannot read measured results"),
    (["validate", "schedules", "--only", "gpt-9"], "no model and batch matches --only gpt-9"),
])
def test_validate_bad_arguments_answer_in_one_line(args, match):
    r = clirun.mksim(*args)  # in this process; test_validate_without_gpu_answers_in_one_line runs real children
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert match in r.stderr


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(_has_gpu(), reason="checks the answer on a machine without a GPU")
@pytest.mark.slow  # 1.7 s of CPU
def test_validate_without_gpu_answers_in_one_line(tmp_path):
    suite = ["validate", "suite", "--only", "llama-3.2-1b/b1/graph", "--out", str(tmp_path / "s")]
    for run, args in ((cli, ["validate", "--model", "llama-3.2-1b", "--mode", "graph"]), (clirun.mksim, suite)):
        r = run(*args)  # the first in a real child: its exit status, and no traceback
        assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "s").exists()


@pytest.mark.slow  # 1.0 s of CPU
def test_suite_refuses_to_overwrite_results(tmp_path):
    vs.run_suite(SMALL[:1], tmp_path, fake_measure(), device=DEVICE)
    r = clirun.mksim("validate", "suite", "--out", str(tmp_path))
    assert r.returncode == 2 and "--resume to go on with it or --force to start over" in r.stderr


@pytest.mark.slow  # 3.0 s of CPU
def test_dry_run_predicts_without_a_gpu():
    r = clirun.mksim("validate", "suite", "--dry-run", "--only", "llama-3.2-1b/b1/mega", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["name"] for x in rows] == [f"llama-3.2-1b/b1/{s}" for s in MK_SCHEDULES]
    # the generated kernels on h200-mk-kernels: about 1 ms (measured on the H200: 1.1-1.8 ms)
    assert all(x["error"] is None and 700 < x["predicted_us"] < 2000 for x in rows)
    r = clirun.mksim("validate", "suite", "--dry-run", "--only", "llama-3.1-8b/b8/mega", "--json")
    rows = json.loads(r.stdout)  # the 8B at batch 8 runs since the kernel chunks its input rows along k
    assert r.returncode == 0 and len(rows) == 4 and all(x.get("refused") is None and x["error"] is None for x in rows)


def test_import_mksim_stays_light():
    code = ("import sys, mksim, mksim.cli; heavy = [m for m in ('matplotlib', 'cupy', 'torch', 'optuna') "
            "if m in sys.modules]; print(heavy)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


@pytest.mark.gpu
def test_one_case_on_a_real_gpu(tmp_path):
    if not _has_gpu():
        pytest.skip("no CUDA GPU")
    doc = vs.run_suite([vs.Case("llama-3.2-1b", 1, "megakernel")], tmp_path, reps=5)
    rec = doc["cases"][0]
    assert "error" not in rec, rec.get("error")
    row = vs.summarize(doc)["cases"][0]
    assert row["max_rel_err"] <= 1e-2 and row["measured_us"] > 0


# -- the docs --------------------------------------------------------------------------------------
def _suite_section() -> str:
    return PAGE.read_text().split("## The validation suite", 1)[1]


def _between(text: str, begin: str, end: str) -> str:
    return text.split(begin, 1)[1].split(end, 1)[0].lstrip("\n")


def test_docs_schedules_table_is_current():
    assert _between(PAGE.read_text(), "<!-- validation-schedules:begin -->", "<!-- validation-schedules:end -->") \
        == schedules_table(), \
        "regenerate with: python -c 'import validation.suite.schedules as v; print(v.schedules_table())'"


#: how validation/results/h200's summary and this page's table were made (validation/results/README.md)
REPORT_H200 = ("mksim validate report validation/results/h200 --docs docs/validation.md "
               "--stacks validation/results/evidence/h200-mk18-suite10/inductor")


def test_docs_results_table_is_current():
    summary = ROOT / "validation" / "results" / "h200" / "summary.json"
    if not summary.is_file():
        pytest.skip("the suite has not run on the H200 yet")
    assert _between(PAGE.read_text(), vs.DOCS_BEGIN, vs.DOCS_END) == vs.markdown_table(
        json.loads(summary.read_text())), \
        f"regenerate with: {REPORT_H200}"


def _doc_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", _suite_section(), re.S)
    return [line for b in blocks for line in b.splitlines() if line.startswith("mksim ")]


def test_docs_section_has_the_commands():
    cmds = _doc_commands()
    assert any(c.startswith("mksim validate suite") for c in cmds)
    assert any("validate report" in c for c in cmds) and any("validate schedules" in c for c in cmds)
    assert any("--part 1/2" in c for c in cmds) and any("validate merge" in c for c in cmds)
    assert any("--schedule" in c for c in cmds) and any("--mode" in c for c in cmds)


#: (case, gpu) -> schedule: the documented commands build the same cases again and again (the whole
#: suite, then it resumed, then in two parts); each is built once per test process (and predicted once:
#: predict_once, for the whole module)
_BUILT: dict = {}


@pytest.fixture
def builds_once(monkeypatch: pytest.MonkeyPatch) -> None:
    real_build = vs.build

    def build(case, gpu=vs.GPU):
        if (case, gpu) not in _BUILT:
            _BUILT[case, gpu] = real_build(case, gpu)
        return _BUILT[case, gpu]

    monkeypatch.setattr(vs, "build", build)


@pytest.mark.slow
@pytest.mark.xdist_group("suite-doc-commands")  # one worker: the predictions made once serve every command
@pytest.mark.parametrize("cmd", _doc_commands())
def test_docs_section_commands_run(cmd, tmp_path, builds_once):
    """Each documented command runs here as far as a machine without a GPU can: GPU commands with
    --dry-run, report on its folder if that exists, schedules with the fewest trials into tmp. In
    this process (tests/clirun.py), with each case predicted once across the commands."""
    argv = shlex.split(cmd)[1:]
    if argv[:2] == ["validate", "report"]:
        if not (ROOT / argv[2] / "measured.json").is_file():
            pytest.skip(f"{argv[2]} has no measured.json yet")
        page = tmp_path / "page.md"
        shutil.copy(PAGE, page)
        argv = [a if a != "docs/validation.md" else str(page) for a in argv] + ["--out", str(tmp_path / "r")]
    elif argv[:2] == ["validate", "schedules"]:
        argv = ["validate", "schedules", "--only", "llama-3.2-1b/b1", "--trials", "14", "--out", str(tmp_path)]
    elif argv[:2] == ["validate", "merge"]:
        sources = [str(tmp_path / f"part{k}") for k in range(len(argv[2:argv.index("--out")]))]
        for k, src in enumerate(sources):  # the parts, as a GPU run would leave them (small fakes)
            vs.run_suite(SMALL[k::len(sources)], src, fake_measure(), device=DEVICE)
        argv = ["validate", "merge", *sources, "--out", str(tmp_path / "merged")]
    elif argv[:2] == ["validate", "parts"]:
        pass
    else:
        argv += ["--dry-run"]
    r = mksim_inproc(*argv)
    assert r.returncode == 0, r.stderr
    if "--dry-run" in argv:  # every case predicted or refused: none failed to build or simulate
        assert "error: " not in r.stdout, r.stdout
    if argv[:2] == ["validate", "report"]:
        summary = json.loads((tmp_path / "r" / "summary.json").read_text())
        table = vs.markdown_table(summary)
        assert (tmp_path / "r" / "table.md").read_text() == table and table in page.read_text()
        committed = ROOT / argv[2] / "summary.json"
        if committed.resolve().is_relative_to(ROOT) and committed.is_file():
            # what the repository holds is what the model predicts today, to the last digit
            want = {c["name"]: c["predicted_us"] for c in json.loads(committed.read_text())["cases"]}
            assert {c["name"]: c["predicted_us"] for c in summary["cases"]} == want, \
                f"regenerate with: {REPORT_H200}"
    if argv[:2] == ["validate", "merge"]:
        assert len(json.loads((tmp_path / "merged" / "measured.json").read_text())["cases"]) == len(SMALL)
    if argv[:2] == ["validate", "schedules"]:
        assert mksim.Schedule.from_json(tmp_path / "llama-3.2-1b-b1.json").mode == "megakernel"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="the dry run's workers are forked")
def test_the_dry_run_on_every_core_gives_the_rows_of_one_process_in_order(monkeypatch):
    from validation import cli as vcli

    cases = vs.select(vs.CASES, ["llama-3.2-1b/b1/"])[:3] + [vs.Case("llama-3.1-8b", 64, "megakernel")]
    alone = [vcli._dry_row(c, vcli.PRED_GPU) for c in cases]
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    assert vcli._dry_rows(cases, vcli.PRED_GPU) == alone
    assert alone[-1]["predicted_us"] is None and (alone[-1].get("refused") or alone[-1]["error"])  # crossed too
