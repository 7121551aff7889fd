"""The kernel boundary: a fresh kernel's block sets up, then waits for its first DRAM bytes.

Stories on the toy GPU of :mod:`.simkit` (times in µs: DRAM latency 1, launch 1, graph node 2,
PDL node 0.5, 1e6 B/µs of DRAM) with ``block_setup_us = 0.5`` and ``first_load_us = 1.5``: the
first load of a kernel on an SM waits 2 from a cold start instead of the DRAM latency's 1.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import hwmodels
import mksim
from mksim.costs import first_byte_us, rates
from mksim.workload import Tiling, Workload

from .simkit import chain, mem_op, toy_gpu

TOL = 2e-3
PARTS = {"block_setup_us": 0.5, "first_load_us": 1.5}


def run(tmp_path, wl, mode, tiles=2, **opts):
    gpu = toy_gpu(tmp_path, **PARTS)
    return mksim.simulate(mksim.build_schedule(wl, gpu, mode, tiling=Tiling(default=tiles), **opts))


# -- the pure function -----------------------------------------------------------------------
R = replace(rates(hwmodels.load("h200-datasheet")), dram_latency_us=0.25, block_setup_us=0.5, first_load_us=1.0)


@pytest.mark.parametrize("fresh,now,placed,cold_until,want", [
    (True, 10.0, 10.0, 0.0, 1.5),     # placed now: set-up and first load in a row
    (True, 10.0, 9.75, 0.0, 1.25),    # placed 0.25 ago (waiting for its predecessor): half the set-up is done
    (True, 10.0, 5.0, 0.0, 1.0),      # long resident: only the first load
    (False, 10.0, 10.0, 11.0, 1.0),   # the SM's first load of this kernel is still on its way: wait with it
    (False, 10.0, 10.0, 10.125, 0.25),  # ... arriving sooner than a DRAM latency: the latency
    (False, 10.0, 10.0, 3.0, 0.25),   # a later block on a warm SM: the latency
])
def test_first_byte(fresh, now, placed, cold_until, want):
    assert first_byte_us(fresh, now, placed, cold_until, R) == pytest.approx(want)


def test_rates_default_to_the_dram_latency_without_measured_parts():
    base = rates(hwmodels.load("h200-datasheet"))  # a datasheet file: neither key
    assert base.block_setup_us == 0.0 and base.first_load_us == base.dram_latency_us
    cal = rates(hwmodels.load("h200-calibrated"))
    g = hwmodels.load("h200-calibrated")
    assert (cal.block_setup_us, cal.first_load_us) == (g.launch.block_setup_us, g.launch.first_load_us)
    assert g.source_of("launch.first_load_us").kind == "measured"
    assert cal.block_setup_us + cal.first_load_us > 2 * cal.dram_latency_us  # what the chains showed


# -- stories -----------------------------------------------------------------------------------
def test_one_kernel_pays_set_up_and_first_load(tmp_path):
    # launch 1, set-up 0.5 + first load 1.5, 2e6 B at 1e6 B/µs
    r = run(tmp_path, chain(2e6), "graph", blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + (0.5 + 1.5) + 2, abs=TOL)
    assert r.breakdown_us["bubble"] == pytest.approx(2, abs=TOL)


def test_every_kernel_of_a_graph_chain_starts_cold(tmp_path):
    r = run(tmp_path, chain(2e6, 1e6), "graph", blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + (2 + 2) + 2 + (2 + 1), abs=2 * TOL)
    assert r.breakdown_us["bubble"] == pytest.approx(4, abs=2 * TOL)


def test_a_second_wave_on_a_warm_sm_pays_the_dram_latency(tmp_path):
    # 3 blocks on 2 SMs: a cold wave of 2 sharing DRAM (2 µs), then 1 block alone, latency 1 + 1 µs
    wl = Workload(name="tail", ops=(mem_op("k0", 3e6, out=60),), tokens=1)
    r = run(tmp_path, wl, "graph", tiles=3, blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + (2 + 2) + (1 + 1), abs=TOL)


def test_two_blocks_of_a_fresh_kernel_on_one_sm_wait_together(tmp_path):
    # 4 blocks, two on each SM: an SM's second block waits for the same cold start, not less
    r = run(tmp_path, chain(2e6), "graph", tiles=4, blocks_per_sm=2)
    assert sorted(r.task_lane.tolist()) == [0, 1, 2, 3]
    assert r.latency_us == pytest.approx(1 + 2 + 2, abs=TOL)


def test_blocks_spread_over_the_sms_before_they_share_one(tmp_path):
    # two slots per SM, two blocks: one on each SM (lanes 0 and 2), as the block scheduler places them
    r = run(tmp_path, chain(2e6, 1e6), "graph", tiles=2, blocks_per_sm=2)
    assert [r.task_lane.tolist()[t] // r.lanes_per_sm for t in range(4)] == [0, 1, 0, 1]


def test_pdl_hides_the_set_up_of_a_resident_block(tmp_path):
    # kernel 1's blocks are placed on free slots at 1 + 0.5 and set up while kernel 0 runs
    # (1 .. 5); released at 5 + 0.5 they wait only the first load: 5.5 + 1.5 + 1e6 B at 1e6 B/µs
    r = run(tmp_path, chain(2e6, 1e6), "graph_pdl", blocks_per_sm=2, prefetch_depth=0)
    assert r.latency_us == pytest.approx(5.5 + 1.5 + 1, abs=2 * TOL)


def test_a_compute_only_kernel_has_no_first_load(tmp_path):
    wl = Workload(name="math", ops=(mem_op("k0", 0.0),), tokens=1)
    plain = mksim.simulate(mksim.build_schedule(wl, toy_gpu(tmp_path), "graph", tiling=Tiling(default=2)))
    assert run(tmp_path, wl, "graph").latency_us == pytest.approx(plain.latency_us, abs=1e-9)


def test_the_persistent_kernel_starts_cold_once(tmp_path):
    # launch 1, cold first load 2 + 2, flag 0.5, then the SM is idle: the DRAM latency 1 + 1
    r = run(tmp_path, chain(2e6, 1e6), "megakernel", prefetch_depth=0, policy="rr")
    assert r.latency_us == pytest.approx(1 + (2 + 2) + 0.5 + (1 + 1), abs=2 * TOL)
