"""validation.megakernel.mk_speed: the dense megakernel's speed variants of issue 29, planned on the CPU."""

from __future__ import annotations

import json
import re

import pytest

from tests.validation import nvcc_builds


def test_the_runs_of_a_round_alternate_their_direction_and_skip_what_does_not_apply():
    from validation.megakernel.mk_speed import order

    a, b = ("llama-3.2-1b", 1, "fused"), ("llama-3.2-1b", 8, "sentinel")
    assert order(3, (a, b), ("base", "fence", "acqrel")) == [
        (0, a, "base"), (0, a, "fence"), (0, b, "base"), (0, b, "acqrel"),
        (1, a, "fence"), (1, a, "base"), (1, b, "acqrel"), (1, b, "base"),
        (2, a, "base"), (2, a, "fence"), (2, b, "base"), (2, b, "acqrel")]
    # the 48 KiB pages fit beside llama-3.2-1b b1's reserve only
    assert [v for _r, _c, v in order(1, (("llama-3.2-1b", 8, "fused"),), ("base", "l2g2_p48"))] == ["base"]


def test_a_variant_is_the_suites_schedule_with_its_options():
    from validation.megakernel.mk_speed import schedule

    base, l2 = schedule("llama-3.2-1b", 1, "base"), schedule("llama-3.2-1b", 1, "l2g2")
    for s in (base, l2):  # the suite's fused case: every fusion, the searched schedule's 15 KV splits
        b = s.workload.build
        assert (b.fuse_norm, b.fuse_rope, b.fuse_silu, b.kv_splits) == (True, True, True, 15)
    assert (base.options.l2_prefetch_KiB, l2.options.l2_prefetch_KiB) == (0.0, 256.0)
    assert schedule("llama-3.2-1b", 1, "fence").to_dict() == base.to_dict()  # a kernel define only
    sent = schedule("llama-3.2-1b", 8, "acqrel", "sentinel")  # the suite's sentinel case: default workload
    assert sent.options.sync == "sentinel" and not sent.workload.build.fuse_norm
    with pytest.raises(ValueError, match="fused or sentinel"):
        schedule("llama-3.2-1b", 1, "base", "flag")


def test_the_dry_run_plans_every_run_and_counts_the_builds(tmp_path, monkeypatch, capsys):
    from validation.megakernel import mk_speed

    monkeypatch.setattr(mk_speed, "CASES", (("llama-3.2-1b", 1, "fused"), ("llama-3.2-1b", 1, "sentinel")))
    assert mk_speed.main(["run", str(tmp_path), "--rounds", "1", "--dry-run"]) == 0
    doc = json.loads((tmp_path / "mk_speed.json").read_text())
    # one attention instance; every define set but none for the fused cases, and the sentinel's own
    assert doc["compile"] == {"builds": len({d for d, _o in mk_speed.VARIANTS.values()})}
    fused = [v for v in mk_speed.VARIANTS if v != "acqrel"]
    assert [(r["schedule"], r["variant"]) for r in doc["records"]] == [
        *(("fused", v) for v in fused), ("sentinel", "base"), ("sentinel", "acqrel")]
    pred = {(r["schedule"], r["variant"]): r["predicted_us"] for r in doc["records"]}
    assert pred["fused", "fence"] == pred["fused", "wacq"] == pred["fused", "base"]
    assert pred["fused", "l2g1"] == pred["fused", "l2g2"] != pred["fused", "base"]
    assert pred["sentinel", "acqrel"] == pred["sentinel", "base"] != pred["fused", "base"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"llama-3.2-1b/b1", "llama-3.2-1b/b1/sentinel"}
    assert set(summary["llama-3.2-1b/b1"]) == set(fused)


def test_the_summary_keeps_correct_runs_and_compares_their_median_with_base():
    from validation.megakernel.mk_speed import summarize

    rec = {"model": "m", "batch": 1, "schedule": "fused", "predicted_us": 90.0}
    recs = [{**rec, "variant": "base", "ok": True, "measured_us": 100.0, "max_rel_err": 1e-4},
            {**rec, "variant": "base", "ok": True, "measured_us": 104.0, "max_rel_err": 2e-4},
            {**rec, "variant": "x", "ok": True, "measured_us": 92.0, "max_rel_err": 1e-4},
            {**rec, "variant": "x", "ok": False, "measured_us": 50.0, "max_rel_err": 0.5},
            {**rec, "variant": "y", "failed": "hung"}]
    out = summarize(recs, {"m/b1": {"x": 95}})["m/b1"]
    assert out["base"]["median_us"] == 102.0 and out["base"]["ok"] and out["base"]["max_rel_err"] == 2e-4
    assert out["x"]["runs_us"] == [92.0] and not out["x"]["ok"] and out["x"]["vs_base"] == round(92 / 102, 4)
    assert out["x"]["expected_us"] == 95 and out["x"]["simulator_us"] == 90.0
    assert out["y"]["errors"] == ["hung"] and "median_us" not in out["y"]


def test_the_sentinels_acquire_fence_is_the_default_since_it_was_measured_faster():
    """h200-mk-speed: fence.acquire.gpu after a task's polls (MK_SENTINEL_FENCE=2) was 5.1 % faster than
    fence.acq_rel.gpu at llama-3.2-1b b1 and 1.3 % at b8, correct in both: the kernel's default, the old fence a
    define away (mk_speed's ``acqrel``)."""
    from validation.megakernel import mk_speed
    from validation.megakernel.gpu import SOURCES

    src = SOURCES[0].read_text()
    assert re.search(r"#ifndef MK_SENTINEL_FENCE\n#define MK_SENTINEL_FENCE (\d)", src).group(1) == "2"
    assert 'if (MK_SENTINEL_FENCE == 1) asm volatile("fence.acq_rel.gpu;"' in src
    assert mk_speed.VARIANTS["acqrel"] == ("-DMK_SENTINEL_FENCE=1", {})
    summary = json.loads((nvcc_builds.ROOT / "validation/results/h200-mk-speed/summary.json").read_text())
    for b in (1, 8):
        row = summary[f"llama-3.2-1b/b{b}/sentinel"]
        assert row["sacq"]["ok"] and row["sacq"]["median_us"] < row["base"]["median_us"]


@pytest.mark.parametrize("argv", [[], ["time", "x"], ["run", "x", "--rounds", "0"], ["run", "x", "--rounds"]])
def test_bad_arguments_are_refused_in_one_line(argv, capsys):
    from validation.megakernel.mk_speed import main

    assert main(argv) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) <= 2


@pytest.mark.skipif(nvcc_builds.NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["mk-l2gate1", "mk-l2gate2", "mk-pubfence", "mk-waitacq", "mk-sentinel-acqrel"])
@pytest.mark.slow
@pytest.mark.nvcc
def test_the_speed_variants_build_without_more_spills(name):
    """mk_speed's builds: the gated L2 prefetcher (MK_L2PF_GATE=1, 2), the publisher's release fence
    (MK_PUB_FENCE=1), relaxed polls with one acquire fence (MK_WAIT_ACQ=1) and the sentinel's acq_rel fence
    (MK_SENTINEL_FENCE=1, the default before h200-mk-speed) compile for sm_90 and spill no more than the default
    build may (test_sentinel)."""
    r = nvcc_builds.build(name)
    assert r.returncode == 0, r.stderr
    persistent = r.stderr.split("Function properties for mk_persistent")[1].splitlines()[1]
    assert int(re.search(r"(\d+) bytes spill stores", persistent).group(1)) <= 16, persistent
