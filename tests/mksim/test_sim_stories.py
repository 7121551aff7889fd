"""Small stories with closed-form answers (times in µs).

Toy GPU: 2 SMs, DRAM 1e6 B/µs shared, 1 µs DRAM latency, launch latency 1 µs, 2 µs between
graph nodes, 0.5 µs flag latency, 3 µs grid barrier; math and L2 take (almost) no time.
"""

from __future__ import annotations

import pytest

import mksim
from mksim.workload import Tiling, Workload

from .simkit import chain, mem_op, toy_gpu

B = 1e6        # bytes per µs
TOL = 2e-3     # µs: what the vanishing math and L2 time may add


def run(tmp_path, wl, mode, tiles=2, cap=1000, **opts):
    gpu = toy_gpu(tmp_path, cap)
    s = mksim.build_schedule(wl, gpu, mode, tiling=Tiling(default=tiles), **opts)
    return mksim.simulate(s)


def test_one_memory_bound_kernel(tmp_path):
    # launch 1 + latency 1 + 2e6 bytes at 1e6 B/µs
    r = run(tmp_path, chain(2e6), "graph", blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + 1 + 2, abs=TOL)
    assert r.breakdown_us["memory"] == pytest.approx(2, abs=TOL)
    assert r.breakdown_us["bubble"] == pytest.approx(1, abs=TOL)
    assert r.breakdown_us["launch"] == pytest.approx(1, abs=TOL)


def test_two_kernel_chain_pays_launch_and_bubble_between(tmp_path):
    r = run(tmp_path, chain(2e6, 1e6), "graph", blocks_per_sm=1)
    # launch, bubble + 2, node gap 2, bubble + 1
    assert r.latency_us == pytest.approx(1 + (1 + 2) + 2 + (1 + 1), abs=2 * TOL)
    assert r.breakdown_us["launch"] == pytest.approx(1 + 2, abs=2 * TOL)
    assert r.breakdown_us["bubble"] == pytest.approx(2, abs=2 * TOL)


def test_stream_is_bounded_by_the_host_launch_rate(tmp_path):
    # 4 tiny kernels: the host issues one every 2 µs; the GPU cannot start kernel 3 before 6 + 1
    r = run(tmp_path, chain(1, 1, 1, 1), "stream", blocks_per_sm=1)
    assert r.per_op[3]["start_us"] >= 3 * 2 + 1 - 1e-9


def test_megakernel_without_prefetch(tmp_path):
    # launch 1, latency + 2, flag 0.5, latency + 1: the second op loads only after its dependency
    r = run(tmp_path, chain(2e6, 1e6), "megakernel", prefetch_depth=0, policy="rr")
    assert r.latency_us == pytest.approx(1 + (1 + 2) + 0.5 + (1 + 1), abs=2 * TOL)
    assert r.breakdown_us["dependency wait"] == pytest.approx(0.5, abs=2 * TOL)


def test_megakernel_with_prefetch_hides_the_second_load(tmp_path):
    # 3 pages of 64 KiB hold both tasks' weights (1e5 + 9e4 B per SM): the second task's
    # weights stream in right behind the first's, so the boundary costs only the flag latency
    wl = chain(2e5, 1.8e5)
    r = run(tmp_path, wl, "megakernel", prefetch_depth=3, page_KiB=64, policy="rr")
    assert r.latency_us == pytest.approx(1 + (1 + 0.2) + 0.5, abs=2 * TOL)
    no = run(tmp_path, wl, "megakernel", prefetch_depth=0, policy="rr")
    assert no.latency_us == pytest.approx(1 + (1 + 0.2) + 0.5 + (1 + 0.18), abs=2 * TOL)


def test_grid_barrier(tmp_path):
    r = run(tmp_path, chain(2e6, 1e6), "persistent_barrier", prefetch_depth=0)
    assert r.latency_us == pytest.approx(1 + (1 + 2) + 3 + (1 + 1), abs=2 * TOL)
    assert r.breakdown_us["barrier wait"] == pytest.approx(3, abs=2 * TOL)


def test_tail_wave(tmp_path):
    # 3 blocks on 2 SMs: a wave of 2 sharing DRAM, then 1 alone (it may draw it all)
    wl = Workload(name="tail", ops=(mem_op("k0", 3e6, out=60),), tokens=1)  # 3 equal tiles
    r = run(tmp_path, wl, "graph", tiles=3, blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + (1 + 2) + (1 + 1), abs=TOL)
    # one SM idles through the last block: the tail
    assert r.breakdown_us["tail idle"] == pytest.approx((1 + 1) / 2, abs=TOL)


def test_same_task_is_slower_on_fewer_sms(tmp_path):
    # per-SM cap 250 GB/s (2.5e5 B/µs): 1 SM streaming 2e6 B takes 8 µs; 2 SMs take 4
    one = run(tmp_path, chain(2e6), "graph", tiles=1, cap=250, blocks_per_sm=1)
    two = run(tmp_path, chain(2e6), "graph", tiles=2, cap=250, blocks_per_sm=1)
    assert one.latency_us == pytest.approx(1 + 1 + 8, abs=TOL)
    assert two.latency_us == pytest.approx(1 + 1 + 4, abs=TOL)


def test_blocks_of_a_kernel_share_an_sm_only_when_they_outnumber_the_sms(tmp_path):
    # two slots per SM at 2.5e5 B/µs per SM. 2 blocks: one per SM, each draws the whole SM (2 µs);
    # 4 blocks: two per SM, each draws half (1e6 B / 4 at 1.25e5 B/µs: 2 µs)
    two = run(tmp_path, chain(1e6), "graph", tiles=2, cap=250, blocks_per_sm=2)
    four = run(tmp_path, chain(1e6), "graph", tiles=4, cap=250, blocks_per_sm=2)
    assert two.latency_us == pytest.approx(1 + 1 + 2, abs=TOL)
    assert four.latency_us == pytest.approx(1 + 1 + 2, abs=TOL)


def test_pdl_overlaps_the_next_prologue(tmp_path):
    graph = run(tmp_path, chain(2e6, 1e6), "graph", blocks_per_sm=1)
    pdl = run(tmp_path, chain(2e6, 1e6), "graph_pdl", blocks_per_sm=1)
    assert pdl.latency_us < graph.latency_us
