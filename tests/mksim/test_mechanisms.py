"""The mechanisms, each with its closed-form story (docs/model.md, "Mechanisms").

- DRAM rate versus bytes in flight and load: Little's law with a latency that grows with load;
- a sync under load takes a share of the DRAM queueing delay more;
- where programmatic dependent launch triggers (early, late, never);
- implementation profiles: a kernel library's task costs applied to a GPU, moved by the clock.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import simpy

import hwmodels
import mksim
from mksim import costs
from mksim.errors import MksimError
from mksim.sim._hbm import HBM
from mksim.workload import Input, Op, Workload

CAL = hwmodels.load("h200-calibrated")
R = costs.rates(CAL)


# -- DRAM: the soft knee ---------------------------------------------------------------------------
@pytest.mark.parametrize("demand_GBps", [10.0, 500.0, 2000.0, 4000.0, 9000.0, 50000.0])
def test_the_knee_keeps_littles_law(demand_GBps):
    """Flows keeping F = demand x L0 bytes in flight draw T with T x L(T) = F, below the peak."""
    d = demand_GBps * 1e3
    t = costs.loaded_total_Bpus(d, R)
    assert 0 < t < R.hbm_Bpus
    assert t * costs.loaded_latency_us(t, R) == pytest.approx(d * R.stream_latency_us, rel=1e-9)
    assert t <= d  # latency never falls below the stream latency


def test_without_a_queue_the_knee_is_hard():
    r = dataclasses.replace(R, queue_us=0.0)
    assert costs.loaded_total_Bpus(1e3, r) == 1e3
    assert costs.loaded_total_Bpus(10 * r.hbm_Bpus, r) == r.hbm_Bpus


def test_the_knee_reproduces_the_chip_sweep_it_was_fitted_on():
    """h200-calibrated's mechanism at the bw sweep's headline points (132 SMs, L1 free): 8, 32 and
    64 KiB in flight per SM drew 1945-2229, 3941-4195 and 4176-4343 GB/s."""
    for kib, lo, hi in ((8, 1945, 2229), (32, 3941, 4195), (64, 4176, 4343)):
        demand = 132 * min(kib * 1024 / R.stream_latency_us, R.sm_port_Bpus)
        got = costs.loaded_total_Bpus(demand, R) / 1e3
        assert lo * 0.9 < got < hi * 1.1, (kib, got)


def test_the_hbm_shares_the_knee_among_its_flows():
    """n equal flows of B bytes, each capped at c: all end at B / (knee(n c) / n)."""
    env = simpy.Environment()
    ends: list[float] = []
    hbm = HBM(env, R.hbm_Bpus, knee=lambda d: costs.loaded_total_Bpus(d, R))
    n, nbytes, cap = 100, 1e6, 60e3
    for _ in range(n):
        hbm.start(nbytes, cap, 0.0, lambda: ends.append(env.now))
    env.run()
    rate = costs.loaded_total_Bpus(n * cap, R) / n
    assert len(ends) == n and max(ends) == pytest.approx(nbytes / rate, rel=1e-9)


def test_a_profile_in_flight_bound_caps_a_block():
    """A block keeping F bytes in flight draws F / L0 at most, within its share of the SM port."""
    f = 16 * 1024
    assert costs.block_dram_cap_Bpus(132, 1, R, inflight_B=f) == pytest.approx(f / R.stream_latency_us)
    big = costs.block_dram_cap_Bpus(264, 2, R, inflight_B=1e9)
    assert big == pytest.approx(R.sm_port_Bpus / 2)


def test_ordinary_loads_in_flight_are_bounded_by_the_l1():
    r = dataclasses.replace(R, l1_load_B=248 * 1024)
    assert costs.inflight_B(1, 1024, 8, 0, r) == 128 * 1024
    assert costs.inflight_B(1, 1024, 8, 220 * 1024, r) == 28 * 1024   # a full page ring leaves 28 KiB


# -- syncs under load ------------------------------------------------------------------------------
def test_a_sync_under_load_takes_its_share_of_the_queueing_delay():
    t = 0.9 * R.hbm_Bpus
    extra = costs.sync_load_us(t, R)
    assert extra == pytest.approx(R.sync_load_share * (costs.loaded_latency_us(t, R) - R.stream_latency_us))
    assert costs.sync_load_us(0.0, R) == 0.0
    assert costs.sync_load_us(t, costs.rates(hwmodels.load("h200-datasheet"))) == 0.0  # a datasheet file: unmeasured


def test_the_engine_charges_the_sync_load(monkeypatch):
    s = mksim.build_schedule("llama-3.2-1b", "h200-calibrated", "persistent_barrier")
    base = mksim.simulate(s, timeline=False).latency_us
    monkeypatch.setattr(costs, "sync_load_us", lambda total, r: 0.0)
    s = mksim.build_schedule("llama-3.2-1b", "h200-calibrated", "persistent_barrier")
    assert mksim.simulate(s, timeline=False).latency_us < base


# -- programmatic dependent launch: where the trigger sits ----------------------------------------
def _chain(n: int = 8, nbytes: float = 4e6) -> Workload:
    ops = tuple(Op(name=f"k{i}", kind="matmul", out_size=132, elem_bytes=4.0, flops=0.0, weight_bytes=nbytes,
                   inputs=(Input(f"k{i - 1}", full=True),) if i else ()) for i in range(n))
    return Workload(name="chain", ops=ops, tokens=1)


def _lat(mode: str, gpu: str = "h200-datasheet", **opts) -> float:
    s = mksim.build_schedule(_chain(), gpu, mode, tasks_per_sm=1.0, blocks_per_sm=2, **opts)
    return mksim.simulate(s, timeline=False).latency_us


def test_a_trigger_never_saves_only_the_node_interval():
    """With the trigger never called, kernel k is placed and released at kernel k-1's end + the
    PDL node interval: the chain differs from a plain graph by the two node intervals, per kernel."""
    g = hwmodels.load("h200-datasheet")
    diff = _lat("graph") - _lat("graph_pdl", pdl_trigger="never", prefetch_depth=0)
    assert diff == pytest.approx(7 * (g.launch.graph_node_us - g.launch.pdl_node_us), rel=1e-6)


def test_an_early_trigger_overlaps_more_than_a_late_one():
    early = _lat("graph_pdl", pdl_trigger="early")
    late = _lat("graph_pdl", pdl_trigger="late")
    never = _lat("graph_pdl", pdl_trigger="never")
    assert early < late <= never


def test_an_unknown_trigger_is_one_line():
    with pytest.raises(MksimError, match="pdl_trigger must be one of early, late, never"):
        mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "graph_pdl", pdl_trigger="sometimes")


# -- implementation profiles -------------------------------------------------------------------------
def test_h200_mk_kernels_is_the_calibrated_h200_with_mksims_profile():
    a = hwmodels.load("h200-mk-kernels")
    b = hwmodels.load("h200-calibrated+mksim")
    assert a.profile == b.profile == "mksim" and b.name == "h200-calibrated+mksim"
    assert a.kernels.per_kind == b.kernels.per_kind
    lat = [mksim.simulate(mksim.build_schedule("llama-3.2-1b", g, "graph"), timeline=False).latency_us
           for g in ("h200-mk-kernels", "h200-calibrated+mksim")]
    assert lat[0] == lat[1]


def test_a_profile_moves_to_another_gpu_by_the_clock():
    """Fixed costs are work on the SM: on a GPU of another clock they scale by the clock ratio;
    rates are kept."""
    h200 = hwmodels.load("h200-calibrated+mksim").kernels.per_kind["matmul"]
    b200 = hwmodels.load("b200", profile="mksim")
    ratio = CAL.sm.clock_boost_MHz / b200.sm.clock_boost_MHz
    got = b200.kernels.per_kind["matmul"]
    assert got.task_fixed_us == pytest.approx(h200.task_fixed_us * ratio)
    assert got.consume_GBps == h200.consume_GBps
    assert b200.provenance["kernels.matmul.task_fixed_us"] == "calibration"  # the profile's source


def test_an_unknown_profile_is_one_line():
    with pytest.raises(MksimError, match="unknown implementation profile 'cudnn'"):
        hwmodels.load("h200-datasheet+cudnn")


def test_without_a_profile_no_kind_has_task_costs():
    assert costs.rates(hwmodels.load("h200-calibrated")).device == {}
    assert math.isinf(costs.DeviceCost().inflight_B)


# -- a user's stack next to the megakernel (--impl) -----------------------------------------------
@pytest.mark.slow  # 1.5 s of CPU
def test_compare_predicts_the_stack_next_to_the_megakernel():
    from mksim.compare import compare_modes

    d = compare_modes("llama-3.2-1b", "h200-calibrated+mksim", stack="torch")
    st = d["stack"]
    assert st["gpu"] == "h200-calibrated+torch" and st["mode"] == "graph"
    assert st["assumes"]["profile"] == "torch" and d["assumes"]["profile"] == "mksim"
    assert st["megakernel_speedup"] == pytest.approx(st["latency_us"] / d["modes"]["megakernel"]["latency_us"])
    same = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200-calibrated+torch", "graph"), timeline=False)
    assert st["latency_us"] == same.latency_us


def test_impl_on_the_command_line(capsys):
    from mksim.cli import main

    with pytest.raises(SystemExit) as e:
        main(["simulate", "--model", "llama-3.2-1b", "--gpu", "h200-calibrated", "--impl", "torch", "--mode", "graph",
              "--json"])
    assert e.value.code in (0, None)
    import json

    got = json.loads(capsys.readouterr().out)
    want = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200-calibrated+torch", "graph"), timeline=False)
    assert got["latency_us"] == pytest.approx(want.latency_us)
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--gpu", "h200-datasheet+mksim", "--impl", "torch"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().startswith("error: --gpu h200-datasheet+mksim already names a profile")
