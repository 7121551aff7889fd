"""The what-if overlays: they load, place N queues, and the committed summary has its schema."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

import hwmodels
import validation.suite as vs
import validation.whatif.cli as wi

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "validation" / "results" / "h200-mechanisms" / "whatif"


@pytest.mark.parametrize("n", wi.SMS)
def test_overlay_is_h200_mk_kernels_with_n_sms(n):
    g, base = hwmodels.load(wi.overlay(n)), hwmodels.load("h200-mk-kernels")
    assert g.sm.count == n and g.extends == "h200-mk-kernels"
    assert g.sources["whatif"].kind == "estimate"
    # everything but the SM count is the base's: the DRAM, the launch and the per-op costs
    assert g.dram == base.dram and g.launch == base.launch and g.kernels == base.kernels


@pytest.mark.parametrize("mode", wi.MODES)
@pytest.mark.parametrize("n", (33, 100))
def test_schedule_has_one_queue_per_sm(mode, n):
    s = wi.schedule("llama-3.2-1b", 1, mode, n)
    assert len(s.queues) == n and s.gpu.sm.count == n
    assert s.options.blocks_per_sm == 1


def test_132_sms_predicts_as_the_suite():
    s = wi.schedule("llama-3.2-1b", 1, "megakernel", 132)
    assert vs.predicted_us(s) == vs.predicted_us(vs.build(vs.Case("llama-3.2-1b", 1, "megakernel")))


def test_doctests():
    assert doctest.testmod(wi).failed == 0


def _row(model, batch, mode, sms, us, blocks=None):
    return {"name": wi.case_name(model, batch, mode, sms), "model": model, "batch": batch, "mode": mode, "sms": sms,
            "correct": True, "measured_us": us, "kernel": {"blocks": blocks or sms},
            "trace": {"kinds": {"matmul": {"compute_us": 10.0 * 132 / sms, "GBps_per_sm": 30.0}}}}


def test_summarize_averages_runs_and_refuses_a_wrong_grid():
    runs = [[_row("llama-3.2-1b", 1, "megakernel", 33, 2800.0), _row("llama-3.2-1b", 1, "megakernel", 132, 1200.0)],
            [_row("llama-3.2-1b", 1, "megakernel", 33, 2900.0)]]
    s = wi.summarize(runs)
    assert [c["sms"] for c in s["cases"]] == [33, 132] and s["runs"] == 2
    c33 = s["cases"][0]
    assert c33["measured_us"] == 2850.0 and c33["measured_runs_us"] == [2800.0, 2900.0]
    assert c33["error_pct"] == pytest.approx(100 * (c33["predicted_us"] / 2850.0 - 1), abs=0.01)
    assert s["mape_pct_by_sms"]["66"] is None
    with pytest.raises(wi.MksimError, match="queues predicted"):
        wi.summarize([[_row("llama-3.2-1b", 1, "megakernel", 33, 2800.0, blocks=132)]])


def test_summarize_cli_bad_dir(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        wi.main(["summarize", str(tmp_path)])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: ")


@pytest.mark.slow  # 1.5 s of CPU
def test_committed_summary_schema():
    s = json.loads((RESULTS / "summary.json").read_text())
    assert s["cases"] and s["target_mape_pct"] == 10.0
    keys = {"name", "model", "batch", "mode", "sms", "predicted_us", "measured_us"}
    for c in s["cases"]:
        assert keys <= set(c) and c["sms"] in wi.SMS and c["mode"] in wi.MODES
    mape = sum(abs(100 * (c["predicted_us"] / c["measured_us"] - 1)) for c in s["cases"]) / len(s["cases"])
    assert s["mape_pct"] == pytest.approx(mape, abs=0.02)
    assert {c["sms"] for c in s["cases"]} == set(wi.SMS)
