"""``--gpu h200`` is the validated H200: its answer agrees with the suite measured on our H200.

The measured values are read from the committed suite (``validation/results/h200/measured.json``), never
typed in; the predictions are ``mksim compare --json`` as a user runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hwmodels
from mksim.compare import assumptions, compare_modes, interval_bases, interval_basis
from tests.clirun import mksim_inproc

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "validation/results/h200/measured.json"


def _measured(model: str, batch: int) -> dict[str, float]:
    """The suite's measured step (µs) of each mode the README's main job shows, by its row name."""
    cases = json.loads(MEASURED.read_text())["cases"]
    out = {}
    for c in cases:
        if (c["model"], c["batch"], c["schedule"]) == (model, batch, "default") and c.get("measurement"):
            out[c["mode"]] = float(c["measurement"]["measured_us"])
    return out


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b"])
def test_h200_agrees_with_the_suite_within_its_intervals(model):
    r = mksim_inproc("compare", "--model", model, "--gpu", "h200", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    meas = _measured(model, 1)
    assert set(meas) >= {"graph_pdl", "megakernel"}
    for mode in ("graph_pdl", "megakernel"):
        lo, hi = d["modes"][mode]["interval_us"]
        assert lo <= meas[mode] <= hi, (mode, d["modes"][mode]["latency_us"], meas[mode], (lo, hi))
    pred_winner = min(("graph_pdl", "megakernel"), key=lambda m: d["modes"][m]["latency_us"])
    meas_winner = min(("graph_pdl", "megakernel"), key=lambda m: meas[m])
    assert pred_winner == meas_winner
    assert d["gpu"] == "h200" and d["assumes"]["profile"] == "mksim"
    assert d["assumes"]["status"].startswith("validated")


def test_h200_datasheet_is_the_old_h200():
    """The datasheet file kept every number under its new name: its predictions are the old ``h200``'s
    (pinned in test_pinned.py under ``h200-datasheet``), and it has no profile."""
    g = hwmodels.load("h200-datasheet")
    assert g.profile == "" and not g.extends and g.dram.bandwidth_spec_GBps == 4800
    d = compare_modes("llama-3.2-1b", "h200-datasheet")
    # the numbers the README's main job printed before h200 meant the validated target
    assert round(d["modes"]["graph_pdl"]["latency_us"], 1) == 592.8
    assert round(d["modes"]["megakernel"]["latency_us"], 1) == 622.5


def test_the_names_resolve_to_the_same_target():
    """``h200``, ``h200-mk-kernels`` and ``h200-calibrated+mksim`` are one H200: the same numbers."""
    a, b, c = (hwmodels.load(n) for n in ("h200", "h200-mk-kernels", "h200-calibrated+mksim"))
    for attr in ("sm", "dram", "launch", "sync", "kernels", "concurrency"):
        assert getattr(a, attr) == getattr(b, attr) == getattr(c, attr), attr


def test_an_unmeasured_gpu_says_datasheet_unvalidated_with_the_datasheet_interval():
    ds = hwmodels.hardware_validation("h200-datasheet")
    assert ds is not None and ds["cases"] == 40
    for gpu in ("h100", "b200", "mi300x"):
        # what compare prints (one compare end to end; the others the same two functions it calls)
        d = compare_modes("llama-3.2-1b", gpu) if gpu == "h100" else \
            {"assumes": assumptions(hwmodels.load(gpu)), "intervals": interval_bases(hwmodels.load(gpu))}
        assert "(datasheet, unvalidated)" in d["assumes"]["text"]
        for fam in ("chain", "persistent"):
            b = d["intervals"][fam]
            assert b["half_width_pct"] == ds[fam]["p90_abs_pct"] and b["transfer"]
            assert f"{gpu} was never measured" in b["text"] and "h200-datasheet" in b["text"]
    # the datasheet H200 is measured: its own record, not a transfer
    own = interval_basis(hwmodels.load("h200-datasheet"), "chain")
    assert not own["transfer"] and own["half_width_pct"] == ds["chain"]["p90_abs_pct"]


def test_an_overlay_does_not_inherit_its_bases_record():
    assert hwmodels.hardware_validation("h200-calibrated") is None
    assert hwmodels.hardware_validation("h200") is None
    assert "calibrated, unvalidated" in compare_modes("llama-3.2-1b", "h200-calibrated")["assumes"]["text"]
