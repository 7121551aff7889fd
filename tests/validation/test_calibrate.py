"""Calibration fitting on synthetic raw results (no GPU), the overlay it writes, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import hwmodels
from validation.calibrate import fit
from validation.calibrate._params import base_model, combine, overlay_text, params, run_to_run

from .. import clirun

TRUTH = {"read_GBps": 4300.0, "copy_GBps": 4000.0, "l2_GBps": 9000.0, "l2_ns": 260.0, "dram_ns": 620.0,
         "lat_load_ns": 900.0, "per_sm_GBps": 55.0, "chip_GBps": 4350.0, "host_us": 2.1, "gap_us": 1.9,
         "graph_us": 1.1, "pdl_us": 0.8, "single_us": 6.0, "sync_us": 1.4, "flag_ns": 800.0, "atomic_ns": 700.0,
         "fma_TF": 60.0, "bf16_TF": 780.0, "fixed_alone_us": 6.0, "fixed_graph_us": 3.0, "matvec_frac": 0.85,
         "matvec_fixed_us": 4.0}


def noisy(x: float, rng, n: int = 5, rel: float = 0.01) -> list[float]:
    return [float(x * (1 + rel * rng.standard_normal())) for _ in range(n)]


def synthetic_raw(seed: int = 0, scale: float = 1.0) -> dict:
    """Raw results as `mksim calibrate` writes them, generated from TRUTH (times scaled by 1/scale)."""
    rng = np.random.default_rng(seed)
    T = {k: v * scale if k.endswith("GBps") or k.endswith("TF") else v for k, v in TRUTH.items()}
    us = lambda nbytes, gbps: nbytes / (gbps * 1e3)  # noqa: E731  (1 GB/s = 1e3 B/µs)
    conc = fit.ConcurrencyFit(T["lat_load_ns"], T["per_sm_GBps"], T["chip_GBps"], 0.0)
    pts = []
    for sms in (1, 2, 4, 8, 16, 33, 66, 132):
        for inflight in (512, 2048, 8192, 32768, 65536, 131072):
            bw = float(conc.predict(sms, inflight))
            nbytes = sms * 4 << 20
            pts.append({"sms": sms, "warps": 4, "ilp": 1, "inflight_bytes": inflight, "bytes": nbytes,
                        "us": noisy(us(nbytes, bw), rng, 3)})
    sizes = [64 << 10, 1 << 20, 16 << 20, 256 << 20]
    return {
        "meta": {"device": "NVIDIA H200", "sms": 132, "l2_bytes": 60 << 20, "cc": "9.0", "driver_version": 13000,
                 "runtime_version": 13000, "quick": False, "base": "h200-datasheet", "date": "2026-11-29T20:00:00Z",
                 "driver": "580.159.04, CUDA 13.0"},
        "memory": {"read_bytes": 2 << 30, "read_us": noisy(us(2 << 30, T["read_GBps"]), rng),
                   "copy_bytes": 2 << 30, "copy_us": noisy(us(2 << 30, T["copy_GBps"]), rng),
                   "l2_bytes": 800 << 20, "l2_region_bytes": 16 << 20, "l2_us": noisy(us(800 << 20, T["l2_GBps"]), rng),
                   "buffer_bytes": 2 << 30},
        "latency": {"chase": [{"size_bytes": s << 20, "steps": 20000,
                               "ns_per_load": noisy(T["l2_ns"] if s < 60 else T["dram_ns"], rng)}
                              for s in (2, 8, 32, 128, 1024, 4096)]},
        "concurrency": {"points": pts},
        "boundary": {"boundary": [{"bytes": b, "chain": 16,
                                   "alone_us": noisy(T["fixed_alone_us"] + us(b, T["read_GBps"]), rng),
                                   "graph_per_kernel_us": noisy(T["fixed_graph_us"] + us(b, T["read_GBps"]), rng)}
                                  for b in sizes]},
        "launch": {"device": "NVIDIA H200", "sms": 132, "driver_version": 13000,
                   "host_launch_us": noisy(T["host_us"], rng), "stream_gap_us": noisy(T["gap_us"], rng),
                   "stream_gap_1block_us": noisy(T["gap_us"] * 0.8, rng), "graph_node_us": noisy(T["graph_us"], rng),
                   "graph_pdl_node_us": noisy(T["pdl_us"], rng), "stream_pdl_gap_us": noisy(T["pdl_us"] * 1.2, rng),
                   "single_launch_us": noisy(T["single_us"], rng),
                   "grid_sync": [{"blocks_per_sm": b, "us": noisy(T["sync_us"] * (1 + 0.2 * (b - 1)), rng)}
                                 for b in (1, 2, 4, 8)]},
        "sync": {"counter_barrier_us": noisy(2.0, rng), "flag_one_way_ns": noisy(T["flag_ns"], rng),
                 "atomic_roundtrip_ns": noisy(T["atomic_ns"], rng)},
        "compute": {"fma_flops": 1e12, "fma_us": noisy(1e12 / T["fma_TF"] / 1e6, rng), "sm_clock_MHz": 1980.0,
                    "gemm": {"bf16": {"n": 8192, "flops": 2 * 8192**3, "rel_err": 2e-3,
                                      "us": noisy(2 * 8192**3 / T["bf16_TF"] / 1e6, rng)}}},
        "device_functions": {"device_functions": [
            {"fn": "matvec", "N": n, "K": 4096, "bytes": n * 8192,
             "us": noisy(T["matvec_fixed_us"] + us(n * 8192, T["read_GBps"] * T["matvec_frac"]), rng)}
            for n in (256, 4096, 65536)]},
    }


def synthetic_parts(node=0.6, pdl_node=0.65, start=3.0, setup=0.3, first=0.6, read_GBps=4800.0, seed=0) -> dict:
    """A boundary_parts.cu run: empty chains 1..200 long and 64 KiB read chains, from round numbers."""
    rng = np.random.default_rng(seed)
    rows = []
    for mode, nd in (("graph", node), ("pdl_wait_first", pdl_node)):
        for n in (1, 2, 4, 16, 64, 200):
            rows.append({"part": "empty", "kernel": "k_empty", "chain": n, "mode": mode, "bytes": 0, "threads": 128,
                         "us": noisy((start + (n - 1) * nd) / n, rng, 11, 0.002)})
        base = (start + 15 * nd) / 16 + 65536 / (read_GBps * 1e3)
        extra = setup + first if mode == "graph" else first
        rows.append({"part": "read", "kernel": "read_nowrite", "chain": 16, "mode": mode, "bytes": 65536,
                     "threads": 512, "us": noisy(base + extra, rng, 11, 0.002)})
    return {"meta": {"device": "NVIDIA H200", "sms": 132, "base": "h200-datasheet", "host": "machine t",
                     "date": "2026-11-29T22:00:00Z"}, "boundary_parts": {"device": "NVIDIA H200", "rows": rows}}


def test_boundary_parts_give_the_set_up_and_the_first_load():
    f = fit.fit_boundary_parts(synthetic_parts()["boundary_parts"]["rows"], 4800.0)
    assert f.node_us["graph"] == pytest.approx(0.6, rel=0.02)
    assert f.node_us["pdl_wait_first"] == pytest.approx(0.65, rel=0.02)
    assert f.graph_start_us["graph"] == pytest.approx(3.0, rel=0.03)
    assert (f.block_setup_us, f.first_load_us) == (pytest.approx(0.3, abs=0.02), pytest.approx(0.6, abs=0.02))
    ps, fits = params(synthetic_parts(), 4800.0)
    p = by_key(ps)
    assert set(p) == {"runtime.launch.block_setup_us", "runtime.launch.first_load_us"}
    assert p["runtime.launch.first_load_us"].value == pytest.approx(0.6, abs=0.02)
    assert "machine t" in p["runtime.launch.block_setup_us"].note and fits["boundary_parts"]["read_bytes"] == 65536
    with pytest.raises(ValueError, match="16-kernel"):
        fit.fit_boundary_parts([r for r in synthetic_parts()["boundary_parts"]["rows"] if r["chain"] != 16], 4800.0)


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """``finish`` without its plots (2 s of matplotlib), for tests of the overlay: test_plot_series_and_files
    and test_cli_fits_saved_runs_without_a_gpu make them."""
    import validation.calibrate

    monkeypatch.setattr(validation.calibrate, "write_plots", lambda *a, **k: [])


def test_a_boundary_parts_run_joins_the_calibration_runs(tmp_path, no_plots):
    """Its two parameters join the overlay of the runs it is given with (as for our H200)."""
    paths = []
    for i, raw in enumerate((synthetic_raw(5), synthetic_parts())):
        paths.append(tmp_path / f"r{i}.raw.json")
        paths[-1].write_text(json.dumps(raw))
    from validation.calibrate import finish

    ps, _ = finish(paths, tmp_path / "h200-x.toml", say=lambda _m: None)
    g = hwmodels.load(tmp_path / "h200-x.toml")
    assert g.launch.block_setup_us == pytest.approx(0.3, abs=0.02)
    assert g.launch.graph_node_us == pytest.approx(TRUTH["graph_us"], rel=0.02)


def run(*args: str) -> subprocess.CompletedProcess:
    """``mksim ARGS`` in a child Python: where a real process is the point (its exit status, one line)."""
    return subprocess.run([sys.executable, "-m", "mksim", *args], capture_output=True, text=True, timeout=300)


def by_key(ps):
    return {p.key: p for p in ps}


def test_stat_and_line():
    s = fit.stat([2.0, 1.0, 3.0])
    assert (s.median, s.spread, s.n) == (2.0, pytest.approx(0.8), 3)  # (p90 - p10) / median
    with pytest.raises(ValueError):
        fit.stat([1.0, float("nan")])
    line = fit.fit_line([1, 2, 3], [5, 7, 9])
    assert line.intercept == pytest.approx(3) and line.slope == pytest.approx(2) and line.max_rel_err < 1e-12
    with pytest.raises(ValueError):
        fit.fit_line([1, 1], [2, 3])


def test_boundary_fit_recovers_fixed_cost_and_bandwidth():
    rng = np.random.default_rng(1)
    x = np.geomspace(64e3, 256e6, 8)
    t = [(3.0 + b / 4.2e6) * (1 + 0.005 * rng.standard_normal()) for b in x]
    f = fit.fit_boundary(x, t)
    assert f.fixed_us == pytest.approx(3.0, rel=0.05)
    assert f.bandwidth_GBps == pytest.approx(4200, rel=0.02)
    with pytest.raises(ValueError, match="no memory traffic"):
        fit.fit_boundary([1e3, 1e6], [5.0, 4.0])


@pytest.mark.parametrize("lat,cap,chip", [(640.0, 45.0, 4400.0), (900.0, 80.0, 2000.0), (400.0, 20.0, 900.0)])
def test_concurrency_fit_recovers_littles_law(lat, cap, chip):
    rng = np.random.default_rng(2)
    truth = fit.ConcurrencyFit(lat, cap, chip, 0.0)
    S, F, B = [], [], []
    for s in (1, 2, 4, 8, 16, 32, 66, 132):
        for f in (512, 2048, 8192, 32768, 131072):
            S.append(s)
            F.append(f)
            B.append(float(truth.predict(s, f)) * (1 + 0.02 * rng.standard_normal()))
    got = fit.fit_concurrency(S, F, B)
    assert got.latency_ns == pytest.approx(lat, rel=0.06)
    assert got.per_sm_max_GBps == pytest.approx(cap, rel=0.06)
    assert got.chip_max_GBps == pytest.approx(chip, rel=0.05)
    assert got.knee_KiB == pytest.approx(lat * cap / 1024, rel=0.1)
    assert got.rms_log_err < 0.04


def test_params_recover_every_parameter_from_synthetic_raw():
    ps, fits = params(synthetic_raw(), spec_GBps=4800.0)
    p = by_key(ps)
    T = TRUTH
    assert p["memory.dram.reachable_fraction"].value == pytest.approx(T["read_GBps"] / 4800, rel=0.02)
    assert p["memory.l2.bandwidth_GBps"].value == pytest.approx(T["l2_GBps"], rel=0.02)
    assert p["memory.l2.latency_ns"].value == pytest.approx(T["l2_ns"], rel=0.02)
    assert p["memory.dram.latency_ns"].value == pytest.approx(T["dram_ns"], rel=0.02)
    assert p["memory.concurrency.per_sm_bandwidth_max_GBps"].value == pytest.approx(T["per_sm_GBps"], rel=0.05)
    assert p["memory.concurrency.max_inflight_per_sm_KiB"].value == pytest.approx(
        T["per_sm_GBps"] * T["lat_load_ns"] / 1024, rel=0.1)
    for key, t in (("stream_launch_us", "host_us"), ("stream_gap_us", "gap_us"), ("graph_node_us", "graph_us"),
                   ("pdl_node_us", "pdl_us"), ("launch_latency_us", "single_us")):
        assert p[f"runtime.launch.{key}"].value == pytest.approx(T[t], rel=0.02), key
    assert p["runtime.sync.grid_barrier_us"].value == pytest.approx(T["sync_us"], rel=0.02)
    assert p["runtime.sync.flag_latency_ns"].value == pytest.approx(T["flag_ns"], rel=0.02)
    assert p["runtime.sync.atomic_roundtrip_ns"].value == pytest.approx(T["atomic_ns"], rel=0.02)
    assert p["chip.compute.vector_fp32_TFLOPs"].value == pytest.approx(T["fma_TF"], rel=0.02)
    assert p["chip.compute.tensor_bf16_dense_TFLOPs"].value == pytest.approx(T["bf16_TF"], rel=0.02)
    assert p["runtime.kernels.matvec_bw_fraction"].value == pytest.approx(T["matvec_frac"], rel=0.03)
    assert p["runtime.kernels.matvec_fixed_us"].value == pytest.approx(T["matvec_fixed_us"], rel=0.1)
    assert fits["boundary_alone"]["fixed_us"] == pytest.approx(T["fixed_alone_us"], rel=0.1)
    assert fits["boundary_graph"]["fixed_us"] == pytest.approx(T["fixed_graph_us"], rel=0.1)
    assert all(0 <= q.spread < 0.2 and q.note for q in ps)


def test_combine_takes_mean_and_reports_run_to_run_spread():
    a, _ = params(synthetic_raw(seed=1), 4800.0)
    b, _ = params(synthetic_raw(seed=2, scale=1.04), 4800.0)  # bandwidths and rates 4 % higher
    c = by_key(combine([a, b]))
    rr = run_to_run([a, b])
    assert rr["memory.l2.bandwidth_GBps"] == pytest.approx(0.04, abs=0.015)
    assert rr["runtime.launch.graph_node_us"] < 0.03
    assert c["memory.l2.bandwidth_GBps"].spread >= rr["memory.l2.bandwidth_GBps"]
    mean = (by_key(a)["memory.l2.bandwidth_GBps"].value + by_key(b)["memory.l2.bandwidth_GBps"].value) / 2
    assert c["memory.l2.bandwidth_GBps"].value == pytest.approx(mean, rel=1e-3)
    assert "2 runs" in c["memory.l2.bandwidth_GBps"].note


def test_overlay_loads_as_a_measured_model_that_extends_the_base(tmp_path):
    ps, _ = params(synthetic_raw(), 4800.0)
    text = overlay_text(ps, base="h200-datasheet", name="h200-test", full_name="NVIDIA H200 (calibrated)",
                        device="NVIDIA H200", driver="580.159.04", date="2026-11-29", raw_files=["r.raw.json"])
    path = tmp_path / "h200-test.toml"
    path.write_text(text)
    g = hwmodels.load(path)
    base = hwmodels.load("h200-datasheet")
    assert g.name == "h200-test" and g.extends == "h200-datasheet"
    assert g.dram.latency_ns == pytest.approx(TRUTH["dram_ns"], rel=0.02)
    assert g.launch.stream_gap_us == pytest.approx(TRUTH["gap_us"], rel=0.02)
    assert g.source_of("dram.latency_ns").kind == "measured"
    assert "580.159.04" in g.source_of("dram.latency_ns").title
    assert g.sm.count == base.sm.count and g.source_of("sm.count").kind != "measured"  # kept from the base


def test_base_model_from_device_name():
    assert base_model("NVIDIA H200") == "h200-datasheet"
    assert base_model("NVIDIA H100 80GB HBM3") == "h100"
    with pytest.raises(Exception, match="--base"):
        base_model("Some Future GPU")


@pytest.mark.slow
def test_cli_fits_saved_runs_without_a_gpu(tmp_path):
    raws = []
    for seed in (3, 4):
        p = tmp_path / f"run{seed}.raw.json"
        p.write_text(json.dumps(synthetic_raw(seed)))
        raws += ["--from-raw", str(p)]
    out = tmp_path / "h200-cal.toml"
    r = clirun.mksim("calibrate", *raws, "--out", str(out), "--json")  # in this process (tests/clirun.py)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert math.isclose(got["params"]["runtime.launch.graph_node_us"]["value"], TRUTH["graph_us"], rel_tol=0.02)
    assert set(got["run_to_run"]) == set(got["params"])
    assert hwmodels.load(out).launch.graph_node_us == pytest.approx(TRUTH["graph_us"], rel=0.02)
    summary = json.loads((tmp_path / "h200-cal.fits.json").read_text())
    assert summary["datasheet"]["memory.dram.latency_ns"] == hwmodels.load("h200-datasheet").dram.latency_ns
    # the simulator takes the calibrated model by path
    r = clirun.mksim("simulate", "--model", "llama-3.2-1b", "--gpu", str(out), "--mode", "graph", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["latency_us"] > 0


def test_cli_without_gpu_says_so_in_one_line():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here; the no-GPU message is for machines without it")
    except ImportError:
        pass
    r = run("calibrate", "--quick")
    assert r.returncode == 2
    err = r.stderr.strip()
    assert err.count("\n") == 0 and "CUDA GPU" in err and "CuPy" in err


@pytest.mark.slow  # 1.2 s of CPU
def test_cli_from_raw_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.raw.json"
    bad.write_text("{not json")
    r = run("calibrate", "--from-raw", str(bad), "--out", str(tmp_path / "x.toml"))  # a real child
    assert r.returncode == 2 and "cannot read raw calibration results" in r.stderr
    assert r.stderr.strip().count("\n") == 0
    r = clirun.mksim("calibrate", "--from-raw", str(bad))
    assert r.returncode == 2 and "--out" in r.stderr


@pytest.mark.slow  # 1.9 s of CPU
def test_plot_series_and_files(tmp_path):
    from validation.calibrate import plots

    raw = synthetic_raw()
    series = plots.concurrency_series(raw)
    assert sorted(series) == [512, 2048, 8192, 32768, 65536, 131072]
    xs, ys = series[131072]
    assert xs == sorted(xs) and ys[-1] > ys[0]
    x, y = plots.barrier_series(raw)
    assert x == [1, 2, 4, 8] and y == sorted(y)
    pytest.importorskip("matplotlib")
    _, fits = params(raw, 4800.0)
    made = plots.write_plots([raw], [fits], tmp_path, "t")
    assert len(made) == 4 and all(p.stat().st_size > 1000 for p in made)


@pytest.mark.gpu
def test_quick_calibration_on_a_real_gpu(tmp_path):
    pytest.importorskip("cupy")
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        pytest.skip("no CUDA GPU")
    from validation.calibrate import calibrate

    ps, _ = calibrate(tmp_path / "gpu-calibrated.toml", quick=True, say=lambda _m: None)
    g = hwmodels.load(tmp_path / "gpu-calibrated.toml")
    assert 0.3 < g.dram.reachable_fraction <= 1.0 and len(ps) > 15


def test_calibration_page_table_matches_the_shipped_results():
    from pathlib import Path

    from validation.calibrate.report import markdown_table

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "calibration.md").read_text()
    table = page.split("<!-- h200-table:", 1)[1].split("-->", 1)[1].split("<!-- /h200-table -->")[0]
    fits = root / "validation" / "results" / "h200-2026-11-29" / "h200-calibrated.fits.json"
    assert table.strip() == markdown_table(fits).strip(), \
        "regenerate the table with: python -m validation calibrate-report " + str(fits.relative_to(root))


@pytest.mark.slow  # 1.4 s of CPU
def test_shipped_overlay_is_what_the_raw_runs_give(tmp_path, no_plots):
    """The committed h200-calibrated.toml is reproduced exactly from the committed raw runs (two
    calibration runs and the boundary-parts run) and the mechanism sweeps (the poll sweep of a later
    call among them)."""
    from pathlib import Path

    from validation.calibrate import finish

    root = Path(__file__).resolve().parents[2]
    res = root / "validation" / "results" / "h200-2026-11-29"
    out = tmp_path / "h200-calibrated.toml"
    finish([res / "run1.raw.json", res / "run2.raw.json", res / "boundary-parts.raw.json"], out,
           mechanisms=root / "validation" / "results" / "h200-mechanisms" / "raw",
           poll=root / "validation" / "results" / "h200-mechanisms" / "poll" / "poll.json", say=lambda _m: None)
    shipped = (root / "hwmodels" / "calibrated" / "h200-calibrated.toml").read_text()
    assert out.read_text() == shipped


@pytest.mark.slow  # 1.4 s of CPU
def test_microchain_check_is_reproduced_by_its_script():
    """The committed predicted-vs-measured chain numbers come from validation/microchain.py as it is."""
    from pathlib import Path

    from validation import microchain

    root = Path(__file__).resolve().parents[2]
    committed = json.loads((root / "validation" / "results" / "h200-2026-11-29" / "microchain.json").read_text())
    rows = microchain.compare([json.loads(p.read_text()) for p in microchain.DEFAULT_RAW], committed["gpu"])
    key = ("machine", "kernel", "mode", "bytes", "set")
    assert [tuple(r[k] for k in key) for r in rows] == [tuple(r[k] for k in key) for r in committed["rows"]]
    for got, want in zip(rows, committed["rows"], strict=True):
        assert got["predicted_us"] == pytest.approx(want["predicted_us"], rel=1e-9)
        assert got["measured_us"] == want["measured_us"]
    summary = microchain.summary(rows)
    assert set(committed["summary"]) == set(summary)
    for name, s in summary.items():
        assert committed["summary"][name] == pytest.approx(s, rel=1e-9), name
