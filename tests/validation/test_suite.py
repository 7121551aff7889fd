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
from mksim.errors import MksimError
from validation.calibrate import NoGPUError
from validation.suite_schedules import schedules_table

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "validation.md"
ISSUE_KEYS = ["model", "batch", "mode", "schedule", "predicted_us", "measured_us", "measured_spread_us", "max_rel_err"]
SMALL = [vs.Case("llama-3.2-1b", 1, "graph"), vs.Case("llama-3.2-1b", 1, "graph_pdl"),
         vs.Case("llama-3.2-1b", 1, "megakernel")]
DEVICE = {"name": "Fake H200", "driver": "0.0", "host": "test"}


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mksim", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


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
        assert (model, batch) == ("llama-3.1-8b", 8) and not path.exists()
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


def test_kernel_options_fit_every_default_case_but_the_refused_ones():
    refused = set()
    for c in vs.CASES:
        if c.schedule == "default":
            try:
                opts = vs.kernel_options(c.model, c.batch, c.kv_len, mode=c.mode)
            except vs.Refused as exc:
                assert "does not fit the kernel's shared memory" in str(exc) and "\n" not in str(exc)
                refused.add((c.model, c.batch))
                continue
            assert opts["smem_reserve_KiB"] >= 16
            vs.build(c)  # builds and validates with them (shared memory within the block's budget)
    assert refused <= {("llama-3.1-8b", 8)}  # today exactly this one; a kernel that fits it later is welcome


def test_formula_kernel_options_and_a_schedule_that_no_longer_fits(tmp_path):
    assert vs._formula_kernel_options("llama-3.2-1b", 1) == {"smem_reserve_KiB": 32}  # (8192 * 2 + 16384) / 1024
    assert vs._formula_kernel_options("llama-3.1-8b", 4) == {"smem_reserve_KiB": 128}  # (4 * 14336 * 2 + 16384) / 1024
    s = mksim.build_schedule(mksim.models.workload("llama-3.2-1b", batch=4, n_sms=132), "h200-calibrated",
                             "megakernel", smem_reserve_KiB=8, blocks_per_sm=1)
    with pytest.raises(MksimError, match=r"smem_reserve_KiB=8 but the kernel needs smem_reserve_KiB>=.*mksim "
                                         r"validate schedules"):
        vs.check_kernel_fit(s, "llama-3.2-1b", 4, 1024)
    s.to_json(tmp_path / "small.json")
    r = cli("validate", "--schedule", str(tmp_path / "small.json"))
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


@pytest.mark.parametrize("name", ["h200", "h200-heldout"])
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


def test_plot_data_and_markdown_table(tmp_path):
    from validation import suite_plots

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


# -- the command line ------------------------------------------------------------------------------
@pytest.mark.slow
def test_report_command_rebuilds_summary_plots_table_and_docs(tmp_path):
    vs.run_suite(SMALL[:2], tmp_path / "run", fake_measure(), device=DEVICE)
    page = tmp_path / "page.md"
    page.write_text(f"# t\n\n{vs.DOCS_BEGIN}\nold\n{vs.DOCS_END}\nafter\n")
    r = cli("validate", "report", str(tmp_path / "run"), "--out", str(tmp_path / "rep"), "--docs", str(page))
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
    r = cli(*args)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert match in r.stderr


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(_has_gpu(), reason="checks the answer on a machine without a GPU")
def test_validate_without_gpu_answers_in_one_line(tmp_path):
    for args in (["validate", "--model", "llama-3.2-1b", "--mode", "graph"],
                 ["validate", "suite", "--only", "llama-3.2-1b/b1/graph", "--out", str(tmp_path / "s")]):
        r = cli(*args)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "s").exists()


def test_suite_refuses_to_overwrite_results(tmp_path):
    vs.run_suite(SMALL[:1], tmp_path, fake_measure(), device=DEVICE)
    r = cli("validate", "suite", "--out", str(tmp_path))
    assert r.returncode == 2 and "--resume to go on with it or --force to start over" in r.stderr


def test_dry_run_predicts_without_a_gpu():
    r = cli("validate", "suite", "--dry-run", "--only", "llama-3.2-1b/b1/mega", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["name"] for x in rows] == [f"llama-3.2-1b/b1/{s}" for s in MK_SCHEDULES]
    # the generated kernels on h200-mk-kernels: about 1 ms (measured on the H200: 1.1-1.8 ms)
    assert all(x["error"] is None and 700 < x["predicted_us"] < 2000 for x in rows)
    r = cli("validate", "suite", "--dry-run", "--only", "llama-3.1-8b/b8/mega", "--json")
    rows = json.loads(r.stdout)
    assert r.returncode == 0 and len(rows) == 4 and all("shared memory" in x["refused"] for x in rows)


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
        "regenerate with: python -c 'import validation.suite_schedules as v; print(v.schedules_table())'"


def test_docs_results_table_is_current():
    summary = ROOT / "validation" / "results" / "h200" / "summary.json"
    if not summary.is_file():
        pytest.skip("the suite has not run on the H200 yet")
    assert _between(PAGE.read_text(), vs.DOCS_BEGIN, vs.DOCS_END) == vs.markdown_table(
        json.loads(summary.read_text())), \
        "regenerate with: mksim validate report validation/results/h200 --docs docs/validation.md"


def _doc_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", _suite_section(), re.S)
    return [line for b in blocks for line in b.splitlines() if line.startswith("mksim ")]


def test_docs_section_has_the_commands():
    cmds = _doc_commands()
    assert any(c.startswith("mksim validate suite") for c in cmds)
    assert any("validate report" in c for c in cmds) and any("validate schedules" in c for c in cmds)
    assert any("--schedule" in c for c in cmds) and any("--mode" in c for c in cmds)


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _doc_commands())
def test_docs_section_commands_run(cmd, tmp_path):
    """Each documented command runs here as far as a machine without a GPU can: GPU commands with
    --dry-run, report on its folder if that exists, schedules with the fewest trials into tmp."""
    argv = shlex.split(cmd)[1:]
    if argv[:2] == ["validate", "report"]:
        if not (ROOT / argv[2] / "measured.json").is_file():
            pytest.skip(f"{argv[2]} has no measured.json yet")
        page = tmp_path / "page.md"
        shutil.copy(PAGE, page)
        argv = [a if a != "docs/validation.md" else str(page) for a in argv] + ["--out", str(tmp_path / "r")]
    elif argv[:2] == ["validate", "schedules"]:
        argv = ["validate", "schedules", "--only", "llama-3.2-1b/b1", "--trials", "13", "--out", str(tmp_path)]
    else:
        argv += ["--dry-run"]
    r = cli(*argv)
    assert r.returncode == 0, r.stderr
    if argv[:2] == ["validate", "schedules"]:
        assert mksim.Schedule.from_json(tmp_path / "llama-3.2-1b-b1.json").mode == "megakernel"
