"""The code that is tested is the code that runs: the engine's task times and dependency latencies
are what :mod:`mksim.costs` says, and changing a cost function changes the simulation.

Toy GPU (simkit): 2 SMs; math at 5e10 FLOP/µs per SM on tensor cores, L2 at 5e5 B/µs per SM and
20 ns of latency; a counter is seen 0.5 µs after its release, a sentinel 0.2 µs.
"""

from __future__ import annotations

import pytest

import hwmodels
import mksim
from mksim import costs
from mksim.costs import rates, task_times
from mksim.schedule import CHAIN_MODES, MODES, SYNCS, get_sync
from mksim.workload import Input, Op, Tiling, Workload

from .simkit import toy_gpu


def math_chain(*flops: float) -> Workload:
    """Ops with no DRAM bytes: each task's time is its own work (math, L2, the L2 latency)."""
    ops, prev = [], None
    for i, f in enumerate(flops):
        ops.append(Op(name=f"k{i}", kind="matmul", out_size=64, elem_bytes=2.0, flops=f, weight_bytes=0.0, align=1,
                      inputs=(Input(prev, full=True),) if prev else ()))
        prev = ops[-1].name
    return Workload(name="math", ops=tuple(ops), tokens=1)


@pytest.mark.parametrize("mode", list(MODES))
def test_each_task_runs_for_the_work_the_cost_module_gives(tmp_path, mode):
    gpu = toy_gpu(tmp_path)
    s = mksim.build_schedule(math_chain(2e11, 5e10, 0.0), gpu, mode, tiling=Tiling(default=2), blocks_per_sm=1)
    res = mksim.simulate(s)
    want = task_times(s.graph, rates(gpu), native=False).work_us
    assert want[0] == pytest.approx(1e11 / 5e10 + 20e-3)  # 2 µs of math, then the L2 latency
    got = res.task_end_us - res.task_start_us
    assert got.tolist() == pytest.approx(want.tolist(), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("sync", list(SYNCS))
def test_a_consumer_starts_when_the_sync_says(tmp_path, sync):
    gpu = toy_gpu(tmp_path)
    s = mksim.build_schedule(math_chain(2e11, 5e10), gpu, "megakernel", tiling=Tiling(default=2), sync=sync,
                             prefetch_depth=0)
    res = mksim.simulate(s)
    last = max(res.task_end_us[:2])
    for t in (2, 3):  # each consumer of both producer tiles
        assert res.task_start_us[t] == get_sync(sync).ready_us(last, 2, rates(gpu))


def test_a_sentinel_consumer_waits_for_the_bytes_it_polls(tmp_path):
    """A sentinel's consumer sees its producers' data after the latency plus its polled bytes at the
    idle line's rate (nothing streams DRAM here): 64 elements of 2 bytes at 1000 ns per KiB."""
    from .simkit import TOY
    text = TOY.format(cap=1000).replace("[runtime.sync]\n", "[runtime.sync]\n" + "".join(
        f'{k} = {{ value = {v}, source = "t" }}\n' for k, v in (("sentinel_poll_ns_per_KiB", 1000),
                                                                ("sentinel_loaded_latency_ns", 900),
                                                                ("sentinel_loaded_poll_ns_per_KiB", 3000))))
    (tmp_path / "poll.toml").write_text(text)
    gpu = hwmodels.load(tmp_path / "poll.toml")
    s = mksim.build_schedule(math_chain(2e11, 5e10), gpu, "megakernel", tiling=Tiling(default=2), sync="sentinel",
                             prefetch_depth=0)
    res = mksim.simulate(s)
    last = max(res.task_end_us[:2])
    r = rates(gpu)
    assert s.graph.in_bytes[2] == 128.0
    for t in (2, 3):
        assert res.task_start_us[t] == pytest.approx(last + r.sentinel_latency_us + 128 / 1024)
    # halfway to the loaded lines at half the reachable draw; without them, the idle line plus the load
    assert costs.sentinel_seen_us(1024, r.hbm_Bpus / 2, r) == pytest.approx((0.2 + 0.9) / 2 + (1.0 + 3.0) / 2)
    plain = rates(toy_gpu(tmp_path))
    assert costs.sentinel_seen_us(1024, 1e5, plain) == plain.sentinel_latency_us + costs.sync_load_us(1e5, plain)


def test_the_engine_calls_the_cost_functions(tmp_path, monkeypatch):
    gpu = toy_gpu(tmp_path)
    s = mksim.build_schedule(math_chain(2e11, 5e10), gpu, "megakernel", tiling=Tiling(default=2), prefetch_depth=0)
    before = mksim.simulate(s).latency_us
    compute_us = costs.compute_us
    monkeypatch.setattr(costs, "compute_us", lambda *a, **k: 2 * compute_us(*a, **k))
    slower = mksim.simulate(s).latency_us
    assert slower - before == pytest.approx(2.0 + 0.5, rel=1e-9)  # the math of both ops, again
    monkeypatch.setattr(costs, "counter_ready_us", lambda last, r, *a: last + 10.0)  # the default sync's
    assert mksim.simulate(s).latency_us == pytest.approx(slower - 0.5 + 10.0, rel=1e-9)


def test_chain_launches_follow_the_modes_hooks(tmp_path, monkeypatch):
    # a chain kernel is dispatched when its mode's dispatch_us says: moving it moves the kernel
    from mksim.schedule import get_mode

    gpu = toy_gpu(tmp_path)
    for name in CHAIN_MODES:
        s = mksim.build_schedule(math_chain(5e10, 5e10), gpu, name, tiling=Tiling(default=2), blocks_per_sm=1)
        before = mksim.simulate(s).per_op[1]["start_us"]
        mode = get_mode(name)
        hook = type(mode).dispatch_us
        monkeypatch.setattr(type(mode), "dispatch_us", lambda self, k, a, b, r, hook=hook: hook(self, k, a, b, r) + 7)
        after = mksim.simulate(s).per_op[1]["start_us"]
        monkeypatch.undo()
        assert after >= before + 7 - 1e-9, name


@pytest.mark.parametrize("mode", list(MODES))
def test_without_the_timeline_every_number_is_the_same(mode):
    s = mksim.build_schedule("llama-3.2-1b", "h200-datasheet", mode)
    full, fast = mksim.simulate(s), mksim.simulate(s, timeline=False)
    assert fast.latency_us == full.latency_us and fast.breakdown_us == full.breakdown_us
    assert fast.per_op == full.per_op and fast.dram_bytes == full.dram_bytes
    assert (fast.task_end_us == full.task_end_us).all() and (fast.task_lane == full.task_lane).all()
    assert fast.timeline == [] and fast.task_names == [] and len(full.timeline) > len(s.graph)
