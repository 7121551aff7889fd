"""validation.megakernel.mk_speed: the dense megakernel's speed variants of issue 29, planned on the CPU."""

from __future__ import annotations

import json
import re

import pytest

from tests.validation import nvcc_builds


def test_the_runs_of_a_round_alternate_their_direction():
    from validation.megakernel.mk_speed import order

    assert order(3, (("m", 1), ("n", 8)), ("a", "b")) == [
        (0, "m", 1, "a"), (0, "m", 1, "b"), (0, "n", 8, "a"), (0, "n", 8, "b"),
        (1, "m", 1, "b"), (1, "m", 1, "a"), (1, "n", 8, "b"), (1, "n", 8, "a"),
        (2, "m", 1, "a"), (2, "m", 1, "b"), (2, "n", 8, "a"), (2, "n", 8, "b")]


def test_a_variant_is_the_suites_fused_schedule_with_its_options():
    from validation.megakernel.mk_speed import schedule

    base, l2 = schedule("llama-3.2-1b", 1, "base"), schedule("llama-3.2-1b", 1, "l2g2")
    for s in (base, l2):  # the suite's fused case: every fusion, the searched schedule's 15 KV splits
        b = s.workload.build
        assert (b.fuse_norm, b.fuse_rope, b.fuse_silu, b.kv_splits) == (True, True, True, 15)
    assert (base.options.l2_prefetch_KiB, l2.options.l2_prefetch_KiB) == (0.0, 256.0)
    assert schedule("llama-3.2-1b", 1, "fence").to_dict() == base.to_dict()  # a kernel define only


def test_the_dry_run_plans_every_run_and_counts_the_builds(tmp_path, monkeypatch, capsys):
    from validation.megakernel import mk_speed

    monkeypatch.setattr(mk_speed, "CASES", (("llama-3.2-1b", 1),))
    assert mk_speed.main(["run", str(tmp_path), "--rounds", "1", "--dry-run"]) == 0
    doc = json.loads((tmp_path / "mk_speed.json").read_text())
    assert doc["compile"] == {"builds": 5}  # five distinct define sets, one attention instance
    assert [(r["variant"], r["defines"]) for r in doc["records"]] == [
        (v, d) for v, (d, _o) in mk_speed.VARIANTS.items()]
    pred = {r["variant"]: r["predicted_us"] for r in doc["records"]}
    assert pred["fence"] == pred["base"] and pred["l2g1"] == pred["l2g2"] != pred["base"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["llama-3.2-1b/b1"]) == set(mk_speed.VARIANTS)


def test_the_summary_keeps_correct_runs_and_compares_their_median_with_base():
    from validation.megakernel.mk_speed import summarize

    rec = {"model": "m", "batch": 1, "predicted_us": 90.0}
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


@pytest.mark.parametrize("argv", [[], ["time", "x"], ["run", "x", "--rounds", "0"], ["run", "x", "--rounds"]])
def test_bad_arguments_are_refused_in_one_line(argv, capsys):
    from validation.megakernel.mk_speed import main

    assert main(argv) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) <= 2


@pytest.mark.skipif(nvcc_builds.NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["mk-l2gate1", "mk-l2gate2", "mk-pubfence"])
@pytest.mark.slow
@pytest.mark.nvcc
def test_the_speed_variants_build_without_more_spills(name):
    """mk_speed's builds: the gated L2 prefetcher (MK_L2PF_GATE=1, 2) and the publisher's acq_rel fence
    (MK_PUB_FENCE=1) compile for sm_90 and spill no more than the default build may (test_sentinel)."""
    r = nvcc_builds.build(name)
    assert r.returncode == 0, r.stderr
    persistent = r.stderr.split("Function properties for mk_persistent")[1].splitlines()[1]
    assert int(re.search(r"(\d+) bytes spill stores", persistent).group(1)) <= 16, persistent
