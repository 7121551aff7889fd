"""The mechanism sweeps' pure parts: schema, fits, summaries, the CLI on saved files; the GPU run is marked."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from validation.mechanisms import (
    SWEEPS,
    RawError,
    check_raw,
    fit_line,
    headline_markdown,
    ldg_runs,
    nvcc_command,
    ptxas_registers,
    summarize,
    table,
)
from validation.mechanisms.cli import main

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "validation" / "results" / "h200-mechanisms" / "raw"
HEAD = {"device": "NVIDIA H200", "sms": 132, "driver_version": 13000, "runtime_version": 13000}


def bw_raw() -> dict:
    """A toy chip: each SM draws inflight / 600 ns, capped at 80 GB/s; the chip caps at 4000 GB/s."""
    pts = []
    for ilp, threads, bps in [(1, 256, 1), (4, 256, 1), (4, 256, 2), (2, 1024, 1), (4, 1024, 2)]:
        inflight = ilp * threads * bps * 16
        for sms in (1, 8, 132):
            gbps = min(sms * min(inflight / 600.0, 80.0), 4000.0)
            nbytes = gbps * 1e3 * 250
            pts.append({"set": "smem_pad", "smem_per_sm_B": 225 << 10, "ilp": ilp, "minb": 2, "threads": threads,
                        "bps": bps, "sms": sms, "stride": 1, "regs": 32, "resident_bps": bps,
                        "inflight_per_sm_B": inflight, "bytes": nbytes, "us": [250.0, 251.0, 249.0]})
    pts.append({"set": "smem_pad", "smem_per_sm_B": 225 << 10, "ilp": 8, "minb": 1, "threads": 1024, "bps": 2,
                "sms": 1, "stride": 1, "regs": 56,
                "resident_bps": 1, "inflight_per_sm_B": 262144})
    return {"sweep": "bw", **HEAD, "points": pts}


def bwl1_raw() -> dict:
    """Unpadded rows as in bw_raw, and one L1 series: 128 KiB in flight, the draw falling as shared
    memory takes the L1 (the toy: in flight capped at the L1 left, 256 KiB - shared)."""
    raw = bw_raw()
    pts = [{**p, "set": "no_pad", "smem_per_sm_B": 2048} for p in raw["points"]]
    for smem_kib in (0, 128, 224):
        for sms in (1, 132):
            inflight = min(128, 256 - smem_kib) * 1024
            gbps = min(sms * inflight / 600.0, 4000.0)
            pts.append({"set": "l1", "ilp": 4, "minb": 2, "threads": 1024, "bps": 2, "sms": sms, "stride": 1,
                        "regs": 32, "resident_bps": 2, "inflight_per_sm_B": 131072, "smem_per_sm_B": smem_kib << 10,
                        "bytes": gbps * 1e3 * 250, "us": [250.0]})
    return {**raw, "sweep": "bwl1", "points": pts}


def tma_raw() -> dict:
    pts = [{"stage_B": 16384, "depth": d, "sms": n, "threads": 256, "inflight_per_sm_B": 16384 * d,
            "bytes": min(n * 16384 * d / 700.0, 4500.0) * 1e3 * 200, "us": [199.0, 200.0, 201.0]}
           for d in (1, 4, 8) for n in (1, 132)]
    pts.append({"stage_B": 4096, "depth": 1, "sms": 8, "threads": 256, "inflight_per_sm_B": 4096,
                "placement_errors": 3})
    return {"sweep": "tma", **HEAD, "points": pts}


def cost_raw() -> dict:
    pts = []
    for shape, a in (("1/SM", 2.0), ("4/SM", 3.0)):
        for mib in (0.0625, 1, 16, 256):
            b = mib * 2**20
            t = a + b / 4e3
            pts.append({"bytes": b, "shape": shape, "blocks": 132, "threads": 512, "n": 16,
                        "graph_n_us": [16 * t + 3.0], "graph_1_us": [t + 3.0], "event_us": [t + 5.0, t + 5.2]})
    return {"sweep": "cost", **HEAD, "points": pts}


def chain_raw() -> dict:
    pts = []
    for mode, per in (("graph", 5.0), ("pdl_never", 4.8), ("pdl_late", 4.7), ("pdl_early", 5.5),
                      ("pdl_early_readfirst", 4.5)):
        pts.append({"bytes": 4 << 20, "shape": "1/SM", "mode": mode, "blocks": 132, "threads": 512, "kernels": 32,
                    "us": [32 * per]})
    return {"sweep": "chain", **HEAD, "points": pts}


def opb_raw() -> dict:
    base = {"n_ops": 100, "blocks": 132, "threads": 512}
    pts = [
        {**base, "mode": "idle", "work_ns": 2000, "region_B": 0, "us": [300.0], "lat_first_ns": [700.0],
         "lat_last_ns": [900.0], "release_skew_ns": [100.0], "bg_GBps": [0.0]},
        {**base, "mode": "drain", "work_ns": 0, "region_B": 65536, "us": [600.0], "lat_first_ns": [800.0],
         "lat_last_ns": [1000.0], "release_skew_ns": [300.0], "bg_GBps": [0.0]},
        {**base, "mode": "single", "work_ns": 0, "region_B": 65536, "us": [250.0], "lat_first_ns": [],
         "lat_last_ns": [], "release_skew_ns": [], "bg_GBps": [0.0]},
    ]
    return {"sweep": "opb", **HEAD, "globaltimer_step_ns": 32, "points": pts}


def test_fit_line_recovers_intercept_and_bandwidth():
    x = [2.0**16, 2.0**20, 2.0**24, 2.0**28]
    f = fit_line(x, [3.0 + b / 4.5e3 for b in x])
    assert f.intercept_us == pytest.approx(3.0) and f.bandwidth_GBps == pytest.approx(4.5)
    assert f.max_rel_residual < 1e-9 and f.predict_us(1e6) == pytest.approx(3.0 + 1e6 / 4.5e3)
    with pytest.raises(RawError):
        fit_line([1.0], [1.0])
    with pytest.raises(RawError):
        fit_line([1.0, 2.0], [5.0, 4.0])  # time falling with bytes


def test_schema_rejects_what_mech_bench_never_writes():
    assert check_raw(bw_raw()) == "bw"
    with pytest.raises(RawError, match="lacks points"):
        check_raw({"sweep": "bw", **HEAD})
    with pytest.raises(RawError, match="unknown sweep"):
        check_raw({"sweep": "nope", **HEAD, "points": []})
    bad = chain_raw()
    del bad["points"][0]["mode"]
    with pytest.raises(RawError, match="point 0 lacks mode"):
        check_raw(bad)


def test_bw_summary_finds_cap_knee_and_unequal_draw():
    s = summarize({"bw": bw_raw()})["bw"]
    one = {(r["ilp"], r["threads"], r["bps"]): r for r in s["rows"] if r["sms"] == 1}
    # 1 SM: 4 KiB in flight draws 4096 / 600 B/ns; 64 KiB hits the 80 GB/s cap
    assert one[(1, 256, 1)]["GBps"] == pytest.approx(4096 / 600.0)
    assert one[(4, 1024, 2)]["GBps"] == pytest.approx(80.0)
    assert one[(1, 256, 1)]["little_latency_ns"] == pytest.approx(600.0)
    assert s["best_one_sm"]["GBps"] == pytest.approx(80.0)
    knee90, knee95 = s["knee_all_sms"]
    # 16 KiB/SM: 132 x 16384 / 600 = 3604 GB/s, just over 90 % of 4000; 95 % needs 32 KiB
    assert knee90["max_GBps"] == pytest.approx(4000.0) and knee90["inflight_per_sm_KiB"] == 16.0
    assert knee95["inflight_per_sm_KiB"] == 32.0
    assert s["not_resident"] == [{"ilp": 8, "minb": 1, "regs": 56, "threads": 1024, "bps": 2, "resident_bps": 1}]
    # 32 KiB in flight two ways (4 x 256 x 2 blocks and 2 x 1024 x 1): the toy model draws the same
    same = {g["inflight_per_sm_KiB"]: g for g in s["same_inflight_one_sm"]}
    assert same[32.0]["ratio"] == pytest.approx(1.0)


def test_bwl1_summary_keeps_the_unpadded_rows_and_the_l1_series():
    s = summarize({"bwl1": bwl1_raw()})["bwl1"]
    assert {r["set"] for r in s["rows"]} == {"no_pad"}
    (one, chip) = s["l1"]
    assert one["sms"] == 1 and one["smem_per_sm_KiB"] == [0, 128, 224]
    assert one["GBps_per_sm"] == pytest.approx([131072 / 600.0, 131072 / 600.0, 32768 / 600.0])
    assert chip["GBps_per_sm"][0] == pytest.approx(4000.0 / 132)


def test_tma_summary_reads_littles_law():
    rows = summarize({"tma": tma_raw()})["tma"]
    assert len(rows) == 6  # the point whose blocks were misplaced has no data
    r = next(r for r in rows if r["depth"] == 4 and r["sms"] == 1)
    assert r["GBps_per_sm"] == pytest.approx(65536 / 700.0) and r["little_latency_ns"] == pytest.approx(700.0)
    assert "16 KiB x  8 =  128 KiB" in table({"tma": rows})


def test_cost_summary_separates_fixed_cost_from_bytes():
    s = summarize({"cost": cost_raw()})["cost"]
    assert set(s) == {"1/SM", "4/SM"}
    m = s["4/SM"]["fits"]["marginal_us"]
    assert m["intercept_us"] == pytest.approx(3.0) and m["bandwidth_GBps"] == pytest.approx(4.0)
    # the graph's own start (3 us) spreads over 16 kernels; one launch with events adds its 5 us
    assert s["1/SM"]["fits"]["graph_per_kernel_us"]["intercept_us"] == pytest.approx(2.0 + 3.0 / 16)
    assert s["1/SM"]["fits"]["event_us"]["intercept_us"] == pytest.approx(7.0, abs=0.2)
    assert "marginal_us_from_16MiB" in s["1/SM"]["fits"]


def test_chain_summary_signs_pdl_against_the_plain_graph():
    (c,) = summarize({"chain": chain_raw()})["chain"]
    assert c["graph"] == pytest.approx(5.0)
    assert c["pdl_early_delta_us"] == pytest.approx(0.5) and c["pdl_early_delta_pct"] == pytest.approx(10.0)
    assert c["pdl_late_delta_pct"] == pytest.approx(-6.0)


def test_opb_summary_prices_a_drained_boundary():
    s = summarize({"opb": opb_raw()})["opb"]
    (d,) = s["drained_boundary"]
    assert d["boundary_us"] == pytest.approx(3.5) and d["single_per_op_us"] == pytest.approx(2.5)
    assert d["stream_GBps"] == pytest.approx(65536 * 132 / 2.5 / 1e3)
    idle = s["rows"][0]
    assert idle["lat_first_ns"] == 700.0 and idle["per_op_us"] == pytest.approx(3.0)


def test_table_and_cli_on_saved_files(tmp_path, capsys):
    for raw in (bw_raw(), bwl1_raw(), tma_raw(), cost_raw(), chain_raw(), opb_raw()):
        (tmp_path / f"{raw['sweep']}.json").write_text(json.dumps(raw))
    (tmp_path / "extra.json").write_text("{}")  # not a sweep: ignored
    assert main(["summarize", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "knee: 90% of 4000 GB/s from 16 KiB/SM" in out and "drained boundary" in out
    assert set(json.loads((tmp_path / "analysis.json").read_text())) == {"bw", "bwl1", "tma", "cost", "chain", "opb"}
    assert "l1 ilp 4 1024x2 (128 KiB) on 1 SMs" in out
    assert main(["summarize", str(tmp_path), "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("| mechanism | measured | value |") and "pdl_late vs plain graph, 1 chains" in md
    assert "idle chip: last release -> first / last resume | 700 / 900 ns" in md
    assert table({}) == ""


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["summarize", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no sweep results") and err.count("\n") == 1
    assert main(["run", "--out", str(tmp_path), "--sweeps", "bw,warp"]) == 2
    assert "unknown sweep 'warp'" in capsys.readouterr().err
    (tmp_path / "bw.json").write_text(json.dumps({"sweep": "cost", **HEAD, "points": []}))
    assert main(["summarize", str(tmp_path)]) == 2
    assert "holds sweep 'cost'" in capsys.readouterr().err


def test_build_report_parsers():
    rep = ("ptxas info    : Compiling entry function '_Z4k_bwILi8ELi1EEvv' for 'sm_90'\n"
           "ptxas info    : Used 56 registers, used 1 barriers, 132 bytes smem\n"
           "ptxas info    : Compiling entry function '_Z6k_fillv' for 'sm_90'\n"
           "ptxas info    : Used 15 registers, used 0 barriers\n")
    assert ptxas_registers(rep) == {"_Z4k_bwILi8ELi1EEvv": 56, "_Z6k_fillv": 15}
    sass = "\n".join(["Function : a"] + ["LDG.E.128 R4, desc[UR4][R2.64] ;"] * 8 + ["LOP3.LUT R0 ;"]
                     + ["Function : b", "LDG.E.128 R4 ;", "LOP3.LUT R0 ;", "LDG.E.128 R4 ;", "LOP3.LUT R0 ;"])
    assert ldg_runs(sass) == {"a": 8, "b": 1}
    cmd = nvcc_command(Path("x"))
    assert cmd[0] == "nvcc" and "-arch=sm_90" in cmd and cmd[-1].endswith("mech_bench.cu")


@pytest.mark.slow  # 7.6 s of CPU
@pytest.mark.nvcc
def test_mech_bench_compiles_for_sm90(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc")
    from validation.mechanisms import runner

    binary, report = runner.build(tmp_path)
    regs = ptxas_registers(report)

    def of(prefix: str) -> int:
        (n,) = [v for k, v in regs.items() if k.startswith(prefix)]
        return n

    # the register budgets the sweep relies on: 32 registers let 2048 threads share an SM
    assert of("_Z4k_bwILi4ELi2E") <= 32 and of("_Z7k_chainILi4E") <= 32
    assert of("_Z4k_bwILi8ELi1E") > 32  # room for 8 loads in flight
    assert binary.exists()


def test_committed_results_and_their_readme_agree():
    raws = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json")) if p.stem in SWEEPS}
    assert set(raws) == set(SWEEPS) and not any("error" in r for r in raws.values())
    s = summarize(raws)
    page = (RESULTS / "README.md").read_text()
    block = page.split("<!-- mech-headline:", 1)[1].split("-->", 1)[1].split("<!-- /mech-headline -->")[0]
    assert block.strip() == headline_markdown(s).strip(), (
        "regenerate with: python -m validation mechanisms summarize validation/results/h200-mechanisms/raw --markdown")
    # the findings the README states in words, held to the data
    chain = {(c["shape"], round(c["bytes"] / 2**20)): c for c in s["chain"]}
    assert all(c["pdl_early_delta_pct"] < 0 for c in chain.values())  # early trigger never lost here
    slower = {k for k, c in chain.items() if c["pdl_late_delta_pct"] > 3}
    assert slower == {("2/SM", 16), ("2/SM", 64), ("4/SM", 64)}
    placed = {(p["shape"], round(p["bytes"] / 2**20), p["mode"]): p["max_blocks_per_sm"]
              for p in raws["chain"]["points"]}
    assert all(placed[(sh, mib, "pdl_late")] > placed[(sh, mib, "graph")] + 1 for sh, mib in slower)
    one_sm = [r for r in s["bwl1"]["rows"] if r["sms"] == 1 and r["ilp"] == 4 and r["bps"] >= 2]
    assert max(r["GBps"] for r in one_sm) > 1.5 * 94.66  # well over the calibrated per-SM cap
    l1 = next(d for d in s["bwl1"]["l1"] if d["sms"] == 1 and (d["ilp"], d["threads"], d["bps"]) == (4, 1024, 2))
    assert l1["GBps_per_sm"][-1] < 0.3 * l1["GBps_per_sm"][0]  # 224 KiB of shared memory starves the L1


@pytest.mark.gpu
def test_quick_sweeps_on_a_real_gpu(tmp_path):
    if shutil.which("nvcc") is None or shutil.which("nvidia-smi") is None:
        pytest.skip("no nvcc or no NVIDIA GPU")
    r = subprocess.run([sys.executable, "-m", "validation", "mechanisms", "run", "--out", str(tmp_path), "--quick"],
                       check=False, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for s in SWEEPS:
        raw = json.loads((tmp_path / f"{s}.json").read_text())
        assert "error" not in raw and check_raw(raw) == s


def test_the_sentinel_poll_lines_of_the_h200_overlay_are_the_committed_sweeps_fit():
    """hwmodels' calibrated H200 takes its sentinel lines from mech_bench's poll sweep, refitted
    here from the committed raw file; the lines reproduce every size within 13 %."""
    import hwmodels
    from validation.mechanisms.fit import fit_sentinel_poll
    raw = json.loads((Path(__file__).resolve().parents[2] / "validation/results/h200-mechanisms/poll/poll.json")
                     .read_text())
    f = fit_sentinel_poll(raw)
    sync = hwmodels.load("h200-calibrated").sync
    assert sync.sentinel_latency_ns == pytest.approx(f.latency_ns, abs=0.06)
    assert sync.sentinel_poll_ns_per_KiB == pytest.approx(f.per_KiB_ns, abs=0.06)
    assert sync.sentinel_loaded_latency_ns == pytest.approx(f.loaded_latency_ns, abs=0.06)
    assert sync.sentinel_loaded_poll_ns_per_KiB == pytest.approx(f.loaded_per_KiB_ns, abs=0.06)
    assert f.sizes_KiB == (4.0, 16.0, 64.0, 256.0) and f.max_rel_err < 0.13
    assert f.loaded_per_KiB_ns > 1.5 * f.per_KiB_ns  # a waiter polls slower while DRAM is busy
    streams = {p["shared"]: statistics.median(p["stream_GBps"]) for p in raw["points"] if p["mode"] == "pending"
               and p["poll_B"] == 256 * 1024}
    alone = statistics.median(next(p for p in raw["points"] if p["mode"] == "stream")["stream_GBps"])
    assert all(abs(v / alone - 1) < 0.03 for v in streams.values())  # polling does not slow the stream
