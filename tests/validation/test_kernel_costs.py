"""validation.kernel_costs: task costs of the device functions from single-op records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hwmodels
import mksim
from mksim.errors import MksimError
from validation import kernel_costs as kc

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "validation" / "results" / "h200" / "measured.json"


def rec(kind: str, B: float, us: float, batch: int = 1, op: str | None = None, **kw) -> dict:
    return {"op": op or f"L0.{kind}", "kind": kind, "N": 2048, "K": None, "tiles": 132, "us": us + 8.0,
            "spread_us": 0.5, "streamed_B": B * 132, "GBps": B * 132 / (us + 8.0) / 1e3, "task_us_mean": us,
            "task_us_max": us * 1.05, "task_B_mean": B, "start_spread_us": 0.1, "batch": batch, **kw}


def matmul_records(fixed=1.5, row=0.4, rate=30.0, row_rate=100.0, batches=(1, 4)):
    """Exact task times of a matmul device function at several sizes and batches (rates in GB/s)."""
    out = []
    for r in batches:
        for i, B in enumerate((65536, 131072, 262144, 889701, 1989911)):
            us = fixed + (r - 1) * row + B / (rate * 1e3) + (r - 1) * B / (row_rate * 1e3)
            out.append(rec("matmul", B, us, r, op=f"L0.m{i}", K=2048, N=B // 4096))
    return out


def flat(params: dict) -> dict:
    """``{"matmul.consume_GBps": {"value", "spread", "note"}, ...}`` of :func:`kc.fit`'s tables."""
    return {f"{kind}.{key}": v for kind, costs in params.items() for key, v in costs.items()}


def values(params: dict) -> dict:
    return {k: v["value"] for k, v in flat(params).items()}


# -- the fit ---------------------------------------------------------------------------------------
def test_recovers_a_streaming_kind_with_rows():
    p = values(kc.fit(matmul_records()))
    assert p == pytest.approx({"matmul.task_fixed_us": 1.5, "matmul.task_row_us": 0.4, "matmul.consume_GBps": 30.0,
                               "matmul.consume_row_GBps": 100.0}, rel=1e-6)


def test_one_batch_fits_no_row_terms():
    p = kc.fit(matmul_records(batches=(1,)))
    assert values(p) == pytest.approx({"matmul.task_fixed_us": 1.5, "matmul.consume_GBps": 30.0}, rel=1e-6)
    note = flat(p)["matmul.consume_GBps"]["note"]
    assert "5 single ops" in note and "m0 16x2048" in note and "residual rms 0.0%" in note
    assert flat(p)["matmul.consume_GBps"]["spread"] == pytest.approx(0.05)  # the ops' max/mean, the fit being exact


def test_recovers_noisy_data_within_the_noise():
    recs = matmul_records()
    for i, r in enumerate(recs):
        r["task_us_mean"] *= 1 + (0.02 if i % 2 else -0.02)
    p = kc.fit(recs)
    assert values(p)["matmul.task_fixed_us"] == pytest.approx(1.5, rel=0.1)
    assert values(p)["matmul.consume_GBps"] == pytest.approx(30.0, rel=0.05)
    assert flat(p)["matmul.task_fixed_us"]["spread"] == pytest.approx(0.05, abs=0.01)


def test_one_byte_size_is_taken_as_all_consumption():
    p = kc.fit([rec("attn_partial", 52428.8, 7.0, 1), rec("attn_partial", 52428.8, 7.4, 4)])
    assert values(p) == pytest.approx({"attn_partial.task_fixed_us": 0.0, "attn_partial.consume_GBps": 52428.8 / 7.2e3},
                                      rel=0.01)
    assert "one byte size only" in flat(p)["attn_partial.consume_GBps"]["note"]


def test_attention_tasks_do_one_sequence_whatever_the_batch():
    p = kc.fit([rec("attn_partial", B, 4.0 + B / 22e3, b) for B in (52428.8, 104857.6) for b in (1, 4)])
    assert values(p) == pytest.approx({"attn_partial.task_fixed_us": 4.0, "attn_partial.consume_GBps": 22.0})


def test_other_kinds_take_the_mean_and_a_line_in_rows():
    p = kc.fit([rec("attn_reduce", 0, 1.8), rec("attn_reduce", 0, 3.0)])
    assert values(p) == pytest.approx({"attn_reduce.task_fixed_us": 2.4})
    assert "mean of the task times" in flat(p)["attn_reduce.task_fixed_us"]["note"]
    p = kc.fit([rec("rmsnorm", 128, 1.3, 1), rec("rmsnorm", 128, 3.5, 4), rec("rmsnorm", 128, 1.32, 1)])
    assert values(p) == pytest.approx({"rmsnorm.task_fixed_us": 1.31, "rmsnorm.task_row_us": (3.5 - 1.31) / 3})


def test_kinds_without_parameters_are_left_out():
    assert flat(kc.fit([rec("add", 0, 1.0), rec("silu_mul", 0, 0.8)])).keys() == {"silu_mul.task_fixed_us"}


def test_a_negative_coefficient_is_fixed_at_zero():
    # time falls with bytes: no consumption limit is seen, the fixed part is the mean
    p = kc.fit([rec("matmul", 65536, 4.0), rec("matmul", 262144, 3.0)])
    assert "matmul.consume_GBps" not in flat(p)
    assert values(p)["matmul.task_fixed_us"] == pytest.approx(3.4, rel=0.05)  # relative weights: nearer 3
    # a line through the origin or below: no fixed part
    p = kc.fit([rec("matmul", 65536, 1.0), rec("matmul", 262144, 5.0)])
    assert values(p)["matmul.task_fixed_us"] == 0.0 and values(p)["matmul.consume_GBps"] > 0


def test_dram_bound_records_are_left_out_of_the_rates():
    recs = matmul_records(batches=(1,))
    recs.append(rec("matmul", 3979823, 116.0, op="lm_head", GBps=4246.0))  # DRAM-bound: faster than the line
    assert values(kc.fit(recs))["matmul.consume_GBps"] != pytest.approx(30.0, rel=0.01)
    p = kc.fit(recs, dram_bound_GBps=3500)
    assert values(p)["matmul.consume_GBps"] == pytest.approx(30.0, rel=1e-6)
    assert "left out as DRAM-bound: lm_head" in flat(p)["matmul.consume_GBps"]["note"]
    with pytest.raises(MksimError, match="every matmul record streamed at 1 GB/s or more"):
        kc.fit(recs, dram_bound_GBps=1)


@pytest.mark.parametrize("bad,match", [
    ([], "no single-op records"),
    ({"op": "x"}, "expected a non-empty list"),
    ([3], "record 0 is int, not an object"),
    ([{"op": "x", "kind": "matmul", "task_us_mean": 1.0}], r"record 0 \(x\) has no 'task_B_mean'"),
    ([rec("matmul", 1.0, 1.0), rec("matmul", 2.0, -1.0)], r"record 1 \(L0.matmul\): task_us_mean = -1.0; expected "
                                                          "a positive number"),
    ([rec("matmul", 1.0, float("nan"))], "task_us_mean = nan"),
    ([{**rec("matmul", 1.0, 1.0), "task_B_mean": "big"}], "task_B_mean = 'big'; expected a non-negative number"),
    ([rec("matmul", 1.0, 1.0, batch=0)], "batch = 0; expected a non-negative number of at least 1"),
    ([{**rec("matmul", 1.0, 1.0), "kind": 7}], "kind must be a string"),
])
def test_bad_input_is_one_line(bad, match):
    with pytest.raises(MksimError, match=match) as exc:
        kc.fit(bad)
    assert "\n" not in str(exc.value)


# -- records, the fragment, the command line ---------------------------------------------------------
def suite_doc(recs: list[dict]) -> dict:
    """A measured.json as validation.suite writes it: single ops under graph cases, batch on the case."""
    cases = []
    for b in sorted({r["batch"] for r in recs}):
        ops = [{k: v for k, v in r.items() if k != "batch"} for r in recs if r["batch"] == b]
        cases.append({"name": f"toy/b{b}/graph", "model": "toy", "batch": b, "mode": "graph",
                      "measurement": {"measured_us": 100.0, "single_ops": ops}})
        cases.append({"name": f"toy/b{b}/megakernel", "model": "toy", "batch": b, "mode": "megakernel",
                      "measurement": {"measured_us": 90.0, "single_ops": []}})
    cases.append({"name": "toy/b1/stream", "model": "toy", "batch": 1, "mode": "stream", "error": "hung"})
    return {"format": "mksim-validation-measured", "version": 1, "cases": cases}


def all_kinds() -> list[dict]:
    recs = matmul_records()
    recs += [rec("attn_partial", B, 4.9 + B / 22.8e3, b) for B in (52428.8, 104857.6) for b in (1, 4)]
    recs += [rec(k, 0.0, t + (b - 1) * row, b) for k, t, row in (("embed", 0.9, 0.25), ("rmsnorm", 1.3, 0.72),
                                                                 ("rope_kv", 1.03, 0.54), ("silu_mul", 0.8, 0.33),
                                                                 ("attn_reduce", 2.4, 0.0)) for b in (1, 4)]
    return recs


def test_records_take_batch_and_model_from_the_case():
    recs = kc.records([suite_doc(matmul_records())])
    assert len(recs) == 10 and {r["batch"] for r in recs} == {1, 4} and {r["model"] for r in recs} == {"toy"}
    assert kc.records([[rec("silu_mul", 0, 1.0)]])[0]["kind"] == "silu_mul"
    with pytest.raises(MksimError, match="expected a validation measured.json"):
        kc.records([{"format": "x"}])


def with_fragment(tmp_path: Path, fragment: str) -> Path:
    """An overlay of the calibrated H200 whose [runtime.kernels] table is ``fragment`` (its
    source, ``calibration``, comes from the base)."""
    p = tmp_path / "h200-costed.toml"
    p.write_text(f'name = "h200-costed"\nfull_name = "test"\nextends = "{hwmodels.load("h200-calibrated").path}"\n'
                 f"[runtime.kernels]\n{fragment}")
    return p


def test_cli_writes_a_fragment_the_calibrated_overlay_takes(tmp_path, monkeypatch, capsys):
    src = tmp_path / "run"
    src.mkdir()
    (src / "measured.json").write_text(json.dumps(suite_doc(all_kinds())))
    out = tmp_path / "kernels.toml-fragment"
    assert kc.main([str(src), "--out", str(out)]) == 0
    frag = out.read_text()
    assert frag.startswith("# [runtime.kernels.<kind>] task costs fitted to single ops")
    assert "\n[runtime.kernels.matmul]\ntask_fixed_us = { value = " in frag
    g = hwmodels.load(with_fragment(tmp_path, frag))
    costs = g.kernels.per_kind
    assert costs["matmul"].consume_GBps == pytest.approx(30.0, rel=1e-3)
    assert costs["attn_partial"].task_fixed_us == pytest.approx(4.9, rel=1e-3)
    assert costs["rope_kv"].task_row_us == pytest.approx(0.54, rel=1e-3)
    assert g.kernels.matvec_fixed_us == hwmodels.load("h200-calibrated").kernels.matvec_fixed_us  # kept
    assert g.source_of("kernels.matmul.task_fixed_us").kind == "measured"
    # every kind's costs reach the simulator, and the hardware page renders with them
    from mksim.costs import rates
    assert set(rates(g).device) == {"embed", "rmsnorm", "matmul", "rope_kv", "attn_partial", "attn_reduce", "silu_mul"}
    wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    res = mksim.simulate(mksim.build_schedule(wl, g, "megakernel"))
    assert res.latency_us > res.bandwidth_floor_us + 16 * 7  # an attention partial per layer, at least
    import hwmodels.docs as docs
    monkeypatch.setattr(docs, "available", lambda: ["h200-datasheet", str(tmp_path / "h200-costed.toml")])
    page = docs.render()
    assert "| `kernels.matmul.consume_GBps` | GB/s (1e9 B/s) | – | 30 [" in page


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "measured.json"
    bad.write_text(json.dumps(suite_doc([rec("matmul", 1.0, -1.0)])))
    assert kc.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: single-op record 0") and err.count("\n") == 1
    assert kc.main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.startswith("error: ")


@pytest.mark.skipif(not MEASURED.is_file(), reason="no H200 suite results in this checkout")
def test_the_h200_single_ops_fit_within_the_schema(tmp_path):
    params = kc.fit(kc.records([json.loads(MEASURED.read_text())]))
    assert {"matmul.task_fixed_us", "matmul.consume_GBps", "attn_partial.task_fixed_us"} <= flat(params).keys()
    g = hwmodels.load(with_fragment(tmp_path, kc.fragment(params)))  # every value within its plausible range
    assert g.kernels.per_kind["matmul"].task_fixed_us == pytest.approx(params["matmul"]["task_fixed_us"]["value"],
                                                                      rel=1e-3)


def test_the_examples_hold():
    import doctest
    assert doctest.testmod(kc).failed == 0


def test_ops_timed_with_l2_flushed_are_preferred_over_warm_ones():
    from validation.kernel_costs import fit

    warm = [{"op": "n", "kind": "silu_mul", "task_us_mean": 0.8, "task_B_mean": 0.0}]
    cold = [{"op": "n", "kind": "silu_mul", "task_us_mean": 1.4, "task_B_mean": 0.0, "l2": "flushed"}]
    assert fit(warm)["silu_mul"]["task_fixed_us"]["value"] == 0.8
    assert fit(warm + cold)["silu_mul"]["task_fixed_us"]["value"] == 1.4


def test_a_kind_is_fitted_in_the_form_its_description_declares():
    # softcap (added as docs/extending.md's example) does every row: fixed + (rows - 1) * row, no rate
    p = kc.fit([rec("softcap", 0.0, 1.2 + (b - 1) * 0.3, b) for b in (1, 4)])
    assert values(p) == pytest.approx({"softcap.task_fixed_us": 1.2, "softcap.task_row_us": 0.3})
    assert tuple(p["softcap"]) == mksim.workload.get_kind("softcap").cost_fields


# -- the cost per page of the weight ring -----------------------------------------------------------
RING = mksim.costs.rates(hwmodels.load("h200-calibrated+mksim"))  # one bulk copy in flight, 380.6 ns + B / 117.9 GB/s
RINGS = ((8, 16), (8, 4), (16, 8), (16, 2), (32, 4), (32, 2), (64, 2), (64, 1))  # page KiB, depth


def paged_records(page_us=0.2, fixed=3.4, rate=30.0, row=0.6, row_rate=300.0, batches=(1, 8), rings=RINGS):
    """Exact task times of a matmul whose workers wait for the ring, as the simulator costs them."""
    cost = mksim.costs.DeviceCost(fixed_us=fixed, row_us=row, consume_Bpus=rate * 1e3, row_consume_Bpus=row_rate * 1e3)
    out = []
    for page, depth in rings:
        for b in batches:
            for i, B in enumerate((65536, 262144, 889701, 1989911)):
                ring = mksim.costs.ring_page_us(page * 1024, RING, page_us)
                us = float(mksim.costs.device_task_us(0.0, B, b, cost, 1.0, page * 1024, ring, depth)[0])
                out.append(rec("matmul", B, us, b, op=f"L0.m{i}", K=2048, N=B // 4096, page_KiB=page, depth=depth))
    return out


def test_recovers_the_cost_per_page_from_several_page_sizes_and_depths():
    p = kc.fit(paged_records(), ring=RING)
    assert values(p) == pytest.approx({"matmul.task_fixed_us": 3.4, "matmul.task_row_us": 0.6,
                                       "matmul.consume_GBps": 30.0, "matmul.consume_row_GBps": 300.0,
                                       "matmul.page_us": 0.2}, rel=1e-3)
    note = flat(p)["matmul.page_us"]["note"]
    assert "rings 8x4, 8x16, 16x2, 16x8, 32x2, 32x4, 64x1, 64x2" in note and "held back by the ring (8, 16" in note
    assert "residual rms 0.0%" in note
    # with 2 % noise, within a few hundredths of a µs
    noisy = paged_records()
    for i, r in enumerate(noisy):
        r["task_us_mean"] *= 1 + (0.02 if i % 3 else -0.02)
    assert values(kc.fit(noisy, ring=RING))["matmul.page_us"] == pytest.approx(0.2, abs=0.04)


def test_no_cost_per_page_from_one_page_size_or_without_the_ring():
    recs = paged_records(rings=((8, 16), (32, 4)))
    assert "matmul.page_us" in values(kc.fit(recs, ring=RING))
    assert "matmul.page_us" not in values(kc.fit(recs))  # no GPU's ring to fit it beside
    assert "matmul.page_us" not in values(kc.fit(paged_records(rings=((32, 4),)), ring=RING))
    # pages the ring never holds back bound the cost from above only: 0
    p = kc.fit(paged_records(page_us=0.0, rings=((32, 4), (64, 2))), ring=RING)
    assert values(p)["matmul.page_us"] == 0.0 and "none held back" in flat(p)["matmul.page_us"]["note"]


def runner_rows(recs: list[dict]) -> list[dict]:
    """``python -m validation megakernel --json`` rows: one graph row per ring, with its single ops."""
    rows = []
    for page, depth in sorted({(r["page_KiB"], r["depth"]) for r in recs}):
        for b in sorted({r["batch"] for r in recs}):
            ops = [{k: v for k, v in r.items() if k not in ("batch", "page_KiB", "depth")} for r in recs
                   if (r["page_KiB"], r["depth"], r["batch"]) == (page, depth, b)]
            rows.append({"mode": "graph", "model": "toy", "batch": b, "measured_us": 1.0, "single_ops": ops,
                         "kernel": {"page_B": page * 1024, "depth": depth}})
    return rows


def test_records_of_the_runner_rows_take_their_ring_model_and_batch():
    recs = kc.records([runner_rows(paged_records())])
    assert len(recs) == len(paged_records()) and {r["model"] for r in recs} == {"toy"}
    assert {(r["page_KiB"], r["depth"]) for r in recs} == set(RINGS) and {r["batch"] for r in recs} == {1, 8}
    # a record's own ring wins; a measurement without one leaves it to the fit's default (32 KiB, 4)
    row = {"batch": 1, "single_ops": [rec("silu_mul", 0, 1.0, page_KiB=16.0)], "kernel": {"page_B": 8192}}
    assert kc.records([[row]])[0]["page_KiB"] == 16.0
    assert "page_KiB" not in kc.records([[{"single_ops": [rec("silu_mul", 0, 1.0)]}]])[0]


@pytest.mark.parametrize("header", kc.COMMAND_PREFIXES, ids=("today", "old-module-path"))
def test_the_refit_writes_the_profile_in_place(header, tmp_path, capsys):
    """A profile whose header names the command of today or the module path fitted profiles named
    before ``python -m validation`` (history): the refit replaces it with its own command."""
    prof = tmp_path / "mksim.toml"
    prof.write_text(hwmodels.resolve_profile("mksim").read_text().replace(kc.COMMAND_PREFIXES[0], header))
    before = hwmodels.load("h200-calibrated", profile=str(prof)).kernels
    run = tmp_path / "pages.json"  # batch 1 only: the row terms are kept from the profile
    run.write_text(json.dumps(runner_rows(paged_records(batches=(1,))) + [
        {"mode": "graph", "model": "toy", "batch": 1, "single_ops": [rec("silu_mul", 0, 1.25)],
         "kernel": {"page_B": 32768, "depth": 4}}]))
    assert kc.main([str(run), "--profile", str(prof)]) == 0
    out = capsys.readouterr().out
    assert f"into {prof}; kept from it (these records cannot determine them): matmul.consume_row_GBps, " \
           "matmul.task_row_us, silu_mul.task_row_us" in out
    g = hwmodels.load("h200-calibrated", profile=str(prof))
    m = g.kernels.per_kind["matmul"]
    assert (m.task_fixed_us, m.consume_GBps, m.page_us) == pytest.approx((3.4, 30.0, 0.2), rel=1e-3)
    assert m.task_row_us == before.per_kind["matmul"].task_row_us  # kept
    assert g.kernels.per_kind["silu_mul"].task_fixed_us == 1.25
    assert g.kernels.per_kind["rope_kv"] == before.per_kind["rope_kv"]  # not measured: untouched
    assert g.kernels.ring_copies_in_flight_count == 1
    text = prof.read_text()
    assert f"#   python -m validation kernel-costs {run} --profile {prof}" in text.replace(" \\\n#     ", " ")
    assert [text.count(c) for c in kc.COMMAND_PREFIXES] == [1, 0]
    assert text.count("[runtime.kernels.matmul]") == 1 and "[validation]" in text
    from mksim.search import pages_costed
    assert pages_costed(g)
    # a fit out of range is refused and the profile left as it was
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([rec("silu_mul", 0, 5000.0)]))
    assert kc.main([str(bad), "--profile", str(prof)]) == 2
    assert "error: the refitted profile does not load" in capsys.readouterr().err
    assert prof.read_text() == text


def test_a_refit_of_some_kinds_keeps_the_others_and_adds_its_command(tmp_path, capsys):
    prof = tmp_path / "mksim.toml"
    prof.write_text(hwmodels.resolve_profile("mksim").read_text())
    before = hwmodels.load("h200-calibrated", profile=str(prof)).kernels
    run = tmp_path / "attn.json"  # attention single ops at two sizes, and a matmul the refit must ignore
    run.write_text(json.dumps([{"mode": "graph", "model": "toy", "batch": 1, "single_ops": [
        rec("attn_partial", 50_000, 2.0 + 50_000 / 40e3, op="L0.attn_partial"),
        rec("attn_partial", 100_000, 2.0 + 100_000 / 40e3, op="L1.attn_partial"),
        rec("attn_reduce", 0, 2.5), rec("matmul", 4 << 20, 99.0)], "kernel": {"page_B": 32768, "depth": 4}}]))
    old_text = prof.read_text()
    assert kc.main([str(run), "--profile", str(prof), "--kinds", "attn_partial,attn_reduce"]) == 0
    assert "tables of attn_partial, attn_reduce into" in capsys.readouterr().out
    g = hwmodels.load("h200-calibrated", profile=str(prof)).kernels
    a = g.per_kind["attn_partial"]
    assert (a.task_fixed_us, a.consume_GBps) == pytest.approx((2.0, 40.0), rel=1e-3)
    assert g.per_kind["attn_reduce"].task_fixed_us == 2.5
    assert g.per_kind["matmul"] == before.per_kind["matmul"]  # its record was left out
    text = prof.read_text().replace(" \\\n#     ", " ")
    first = old_text.replace(" \\\n#     ", " ").split("#   python -m validation kernel-costs")[1].split("\n")[0]
    assert first in text  # the other tables' command is kept ...
    assert f"#   python -m validation kernel-costs {run} --profile {prof} --kinds attn_partial,attn_reduce" in text
    # ... and a refit of every kind writes one command again
    assert kc.main([str(run), "--profile", str(prof), "--kinds", "attn_reduce"]) == 0
    assert kc.main([str(run), "--profile", str(prof)]) == 0
    assert [prof.read_text().count(c) for c in kc.COMMAND_PREFIXES] == [1, 0]  # the old module path replaced too
    capsys.readouterr()
    for kinds, msg in (("attn_reduce,nope", "unknown op kind 'nope'"), ("rmsnorm", "no single op of kind 'rmsnorm'"),
                       (" , ", "--kinds is empty")):
        assert kc.main([str(run), "--profile", str(prof), "--kinds", kinds]) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1
