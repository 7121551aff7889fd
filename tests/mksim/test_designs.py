"""Closed-form stories of the megakernel designs beyond static queues with counters (times in µs).

Toy GPU (simkit): 2 SMs, DRAM 1e6 B/µs shared, 1 µs DRAM latency, launch 1 µs; a counter or flag
is seen 0.5 µs after its release, data polled as its own flag (sentinel) 0.2 µs after its stores.
Dynamic dispatch: a scheduler warp sees an event 1 µs after its last trigger and hands out a task
every 0.25 µs, which its worker sees 0.5 µs later; the toy's two SMs are one worker and one SM of
four scheduler warps (MPK's rule). Chiplets: a toy of two dies (one SM each) where a dependency
across them costs 0.3 µs more. Data movement: a cp.async-like loader issues 500 B per ns, a
TMA-like one a 64 KiB tile every 50 ns; a tensor-core task ends 0.1 µs after its work.
"""

from __future__ import annotations

import pytest

import hwmodels
import mksim
from mksim.costs import rates, task_times
from mksim.errors import ScheduleError
from mksim.schedule import SYNCS, dispatch_layout, get_sync
from mksim.workload import Tiling

from .simkit import chain, toy_gpu

TOL = 2e-3


def run(gpu, wl, mode="megakernel", tiles=2, **opts):
    s = mksim.build_schedule(wl, gpu, mode, tiling=Tiling(default=tiles), **opts)
    return mksim.simulate(s)


# -- synchronisation: counter, flags, sentinel ---------------------------------------------------
def test_a_sentinel_poll_replaces_the_counter_round_trip(tmp_path):
    # launch 1, latency + 2 MB, the sync, latency + 1 MB: only the sync differs
    gpu = toy_gpu(tmp_path)
    wl = chain(2e6, 1e6)
    lat = {sync: run(gpu, wl, prefetch_depth=0, policy="rr", sync=sync).latency_us for sync in SYNCS}
    assert lat["counter"] == pytest.approx(1 + 3 + 0.5 + 2, abs=TOL)
    assert lat["flag"] == pytest.approx(1 + 3 + 0.5 + 0.02 + 2, abs=TOL)  # 2 flags: one L2 round trip
    assert lat["sentinel"] == pytest.approx(1 + 3 + 0.2 + 2, abs=TOL)


def test_sync_costs_side_by_side_on_every_gpu():
    # per GPU: flags cost a round trip per 32 producers more than a counter; the sentinel, estimated
    # from the L2 latency, is the cheapest edge, but measured (the calibrated H200: 131 waiters
    # polling the same bytes) it takes more than a counter even with nothing to poll
    for name in hwmodels.available():
        g = hwmodels.load(name)
        r = rates(g)
        c = {s: get_sync(s).ready_us(0.0, 132, r) for s in SYNCS}
        assert c["counter"] < c["flag"], name
        assert c["sentinel"] < r.grid_barrier_us, name
        if g.sync.sentinel_poll_ns_per_KiB is None:
            assert c["sentinel"] < c["counter"], name
        else:
            assert c["counter"] < c["sentinel"] < c["flag"], name


def test_unknown_sync_is_one_line():
    with pytest.raises(ScheduleError, match="sync must be one of counter, flag, sentinel"):
        mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "megakernel", sync="nan")


# -- dynamic dispatch (MPK) against static queues (Hazy) -------------------------------------------
def test_the_toy_is_one_worker_and_one_sm_of_schedulers(tmp_path):
    assert dispatch_layout(toy_gpu(tmp_path)) == (1, 4, 1)


def test_dispatch_latency_when_tasks_wait_for_their_event(tmp_path):
    # prelaunch 0: op 0 is handed out as the kernel starts (1 + 0.25 + 0.5), loads (1 + 2); op 1's
    # event is seen 1 µs after op 0 ends, handed out (0.25 + 0.5), then loads (1 + 1)
    gpu = toy_gpu(tmp_path)
    r = run(gpu, chain(2e6, 1e6), tiles=1, dispatch="dynamic", prelaunch=0)
    assert r.latency_us == pytest.approx(1 + 0.75 + 3 + 1 + 0.75 + 2, abs=TOL)
    # the worker waits 0.75 + 1.75 µs for its tasks; the scheduler SM dispatches all along (7.5 µs)
    assert r.breakdown_us["dependency wait"] == pytest.approx((0.75 + 1.75 + 7.5) / 2, abs=TOL)


def test_prelaunch_hands_a_task_out_early_so_its_weights_stream_while_its_producers_run(tmp_path):
    # prelaunch 1: both ops are handed out at the start (op 1 a task slot after op 0: 2.0); op 1's
    # 1e5 bytes stream right behind op 0's (1.75 + 1 + 0.1, + 0.1); op 1 then waits for its event
    # counter: op 0 ends at 2.85, + 0.5
    gpu = toy_gpu(tmp_path)
    r = run(gpu, chain(1e5, 1e5), tiles=1, dispatch="dynamic", prefetch_depth=3, page_KiB=64)
    assert r.latency_us == pytest.approx(2.85 + 0.5, abs=TOL)
    assert r.task_start_us.tolist() == pytest.approx([1.75, 3.35], abs=TOL)


def test_one_scheduler_hands_out_an_events_tasks_one_by_one(tmp_path):
    # two weightless tasks of the first op on the one worker: handed out 0.25 µs apart
    gpu = toy_gpu(tmp_path)
    r = run(gpu, chain(0.0), tiles=2, dispatch="dynamic", prefetch_depth=0)
    assert r.task_start_us.tolist() == pytest.approx([1.75, 2.0], abs=TOL)


@pytest.mark.slow  # 1.0 s of CPU
def test_dynamic_against_static_on_the_same_workload():
    # Hazy-style static queues prefetch across every op boundary; MPK-style dynamic dispatch pays an
    # event hop and a hand-out per boundary and gives 4 SMs of an H100 to schedulers
    static = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h100", "megakernel")).latency_us
    dyn = {k: mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h100", "megakernel", dispatch="dynamic",
                                                  prelaunch=k)).latency_us for k in (0, 1)}
    assert static < dyn[1] < dyn[0]


@pytest.mark.parametrize("opts,match", [
    ({"dispatch": "mpk"}, "dispatch must be one of static, dynamic, got 'mpk'"),
    ({"dispatch": "dynamic", "sync": "flag"}, "sync must be 'counter'"),
    ({"dispatch": "dynamic", "schedulers": 600}, "600 scheduler warps take 150 of the 132 SMs"),
    ({"dispatch": "dynamic", "schedulers": -1}, "schedulers must be a whole number >= 0"),
    ({"schedulers": 8}, "schedulers applies to dispatch='dynamic' only"),
    ({"prelaunch": 0}, "prelaunch applies to dispatch='dynamic' only"),
])
def test_bad_dispatch_options_are_one_line(opts, match):
    with pytest.raises(ScheduleError, match=match):
        mksim.build_schedule("llama-3.2-1b", "h100", "megakernel", **opts)


def test_dynamic_dispatch_is_a_megakernel_design():
    with pytest.raises(ScheduleError, match="megakernel design; mode persistent_barrier"):
        mksim.build_schedule("llama-3.2-1b", "h100", "persistent_barrier", dispatch="dynamic")


@pytest.mark.slow  # about 1 s of CPU (0.9 s with optuna's import)
def test_search_with_designs_runs_mpk_and_kog_as_baselines_and_can_pick_them():
    pytest.importorskip("optuna")
    from mksim.search import baseline_params, search
    from tests.mksim.searchkit import TINY_MODEL

    n = len(baseline_params(hwmodels.load("b200"), designs=("dies", "dynamic", "movement", "sentinel")))
    # the designs' machinery, not a model's numbers: a Llama of 2 layers (a B200 keeps its two dies)
    res = search(str(TINY_MODEL), "b200", trials=n + 3, seed=0, storage="memory", designs="all")
    assert {"megakernel:dynamic", "megakernel:sentinel", "megakernel:die"} <= set(res.baselines)
    wl = mksim.models.workload(mksim.models.config_from_hf(TINY_MODEL), n_sms=hwmodels.load("b200").sm.count)
    for name, opts in (("megakernel:dynamic", {"policy": "rr", "dispatch": "dynamic"}),
                       ("megakernel:die", {"policy": "die"})):
        direct = mksim.simulate(mksim.build_schedule(wl, "b200", "megakernel", dies=True,
                                                     movement="native", prefetch_depth=4, **opts))
        assert res.baselines[name]["latency_us"] == pytest.approx(direct.latency_us, rel=1e-12)
    assert res.best["latency_us"] <= min(b["latency_us"] for b in res.baselines.values())
    assert res.designs == ("dies", "dynamic", "movement", "sentinel")
    assert "designs=dies+dynamic+movement+sentinel" in res.study_name


def test_unknown_design_is_one_line():
    from mksim.errors import MksimError
    from mksim.search._space import check_designs

    with pytest.raises(MksimError, match="unknown design 'mpk'; known: sentinel, dynamic, dies, movement"):
        check_designs("mpk")


def _cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mksim", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # 4.5 s of CPU
def test_compare_accepts_the_designs_as_rows_and_options():
    import json

    r = _cli("compare", "--model", "llama-3.2-1b", "--gpu", "h100", "--designs", "all", "--json")
    assert r.returncode == 0, r.stderr
    modes = json.loads(r.stdout)["modes"]
    assert {"megakernel:sentinel", "megakernel:dynamic", "megakernel:dies", "megakernel:die",
            "megakernel:native"} <= set(modes)
    assert modes["megakernel:dynamic"]["policy"] == "rr"
    bad = _cli("compare", "--designs", "mpk")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown design 'mpk'" in bad.stderr
    bad = _cli("compare", "--opt", "dispatch=sometimes")
    assert bad.returncode == 2 and "dispatch must be one of static, dynamic" in bad.stderr


# -- chiplets (Fleet) ------------------------------------------------------------------------------
def two_dies(tmp_path):
    return toy_gpu(tmp_path, chip={"dies_count": 2, "cross_die_latency_ns": 300})


def test_a_cross_die_edge_costs_the_crossing(tmp_path):
    # launch 1, latency + 2 MB, the counter, latency + 1 MB, as without dies; op 1 on the other
    # die's SM sees op 0 0.3 µs later
    gpu = two_dies(tmp_path)
    wl = chain(2e6, 1e6)
    across = run(gpu, wl, tiles=1, prefetch_depth=0, queues=[[0], [1]], dies=True)
    local = run(gpu, wl, tiles=1, prefetch_depth=0, queues=[[0, 1], []], dies=True)
    flat = run(gpu, wl, tiles=1, prefetch_depth=0, queues=[[0], [1]])
    assert flat.latency_us == pytest.approx(1 + 3 + 0.5 + 2, abs=TOL)
    assert across.latency_us == pytest.approx(1 + 3 + 0.3 + 0.5 + 2, abs=TOL)
    assert local.latency_us == pytest.approx(1 + 3 + 0.5 + 2, abs=TOL)
    far, near = across.design_stats["dies"], local.design_stats["dies"]
    assert far["cross_die_edges"] == 1 and near["cross_die_edges"] == 0
    assert far["l2_hit_fraction"] == 0.0 and near["l2_hit_fraction"] == 1.0
    assert flat.design_stats == {} and "dies" in across.to_dict()


def test_die_aware_placement_keeps_a_consumer_on_its_producers_die(tmp_path):
    # b needs a; the other die's SM is free at once, so dag puts b there and pays the crossing;
    # the die policy waits for a's SM: 1 + (1 + 2) then the counter, b weightless (its L2 latency)
    gpu = two_dies(tmp_path)
    wl = chain(2e6, 0.0)
    dag = run(gpu, wl, tiles=1, prefetch_depth=0, policy="dag", dies=True)
    die = run(gpu, wl, tiles=1, prefetch_depth=0, policy="die", dies=True)
    assert dag.task_lane.tolist() == [0, 1] and die.task_lane.tolist() == [0, 0]
    assert dag.latency_us == pytest.approx(4 + 0.3 + 0.5 + 0.02, abs=TOL)
    assert die.latency_us == pytest.approx(4 + 0.5 + 0.02, abs=TOL)


def test_die_policy_on_one_die_is_dag():
    a = mksim.build_schedule("llama-3.2-1b", "h100", "megakernel", policy="die")
    b = mksim.build_schedule("llama-3.2-1b", "h100", "megakernel", policy="dag")
    assert a.queues == b.queues


@pytest.mark.slow  # 1.5 s of CPU
def test_dies_on_real_multi_die_parts():
    # die-aware placement cuts the cross-die edges and fetches of a decode step on B200 and MI300X
    for gpu, extra in (("b200", {}), ("mi300x", {"page_KiB": 16, "prefetch_depth": 2})):
        wl = mksim.models.workload("llama-3.2-1b", n_sms=hwmodels.load(gpu).sm.count, kv_len=256)
        res = {p: mksim.simulate(mksim.build_schedule(wl, gpu, "megakernel", policy=p, dies=True, **extra))
               for p in ("rr", "die")}
        assert res["die"].design_stats["dies"]["cross_die_B"] < res["rr"].design_stats["dies"]["cross_die_B"]
        assert res["die"].latency_us <= res["rr"].latency_us


@pytest.mark.parametrize("opts,mode,match", [
    ({"dies": "yes"}, "megakernel", "dies must be true or false"),
    ({"dies": True}, "graph", "dies models the megakernel's dependencies"),
])
def test_bad_dies_options_are_one_line(opts, mode, match):
    with pytest.raises(ScheduleError, match=match):
        mksim.build_schedule("llama-3.2-1b", "b200", mode, **opts)


# -- per-generation data movement ----------------------------------------------------------------
CP_ASYNC = {"async_copy_B": 500, "async_copy_issue_ns": 1, "mma_latency_ns": 100, "cluster_multicast_count": 1}
TMA = {"async_copy_B": 65536, "async_copy_issue_ns": 50, "mma_latency_ns": 100, "cluster_multicast_count": 8}


def test_cp_async_issue_caps_the_loader_and_the_mma_latency_ends_the_task(tmp_path):
    # one 2 MB matmul tile: latency 1, the first copy's issue 0.001, 2e6 B at the 5e5 B/µs one warp
    # issues (below the SM's 1e6), then the MMA tail 0.1
    gpu = toy_gpu(tmp_path, movement=CP_ASYNC)
    ideal = run(gpu, chain(2e6), tiles=1, prefetch_depth=0)
    native = run(gpu, chain(2e6), tiles=1, prefetch_depth=0, movement="native")
    assert ideal.latency_us == pytest.approx(1 + 1 + 2, abs=TOL)
    assert native.latency_us == pytest.approx(1 + 1 + 0.001 + 4 + 0.1, abs=TOL)


def test_tma_issues_a_tile_at_a_time(tmp_path):
    # a TMA copy per 64 KiB outruns the SM: only the first copy's issue (0.05) and the MMA tail show
    gpu = toy_gpu(tmp_path, movement=TMA)
    native = run(gpu, chain(2e6), tiles=1, prefetch_depth=0, movement="native")
    assert native.latency_us == pytest.approx(1 + 1 + 0.05 + 2 + 0.1, abs=TOL)


def test_native_prefetch_fills_the_shared_memory_of_each_generation():
    depth = {g: mksim.build_schedule("llama-3.2-1b", g, "megakernel", movement="native").options.prefetch_depth
             for g in ("a100", "h100", "b200")}
    assert depth == {"a100": 4, "h100": 6, "b200": 6}  # (163 or 227 KiB - 32 reserved) // 32 KiB pages
    given = mksim.build_schedule("llama-3.2-1b", "h100", "megakernel", movement="native", prefetch_depth=2)
    assert given.options.prefetch_depth == 2


def test_cluster_multicast_reads_a_matvecs_input_once_per_cluster():
    s = mksim.build_schedule("llama-3.2-1b", "h100", "megakernel", prefetch_depth=4, movement="native")
    r, g = rates(s.gpu), s.graph
    ideal, native = task_times(g, r), task_times(g, r, native=True)
    t = g.task_id("L0.gate_up_proj", 0)   # a matvec tile: its input vector is read once per 8 SMs
    l2 = (g.in_bytes[t] / 8 + g.out_bytes[t]) / r.l2_per_sm_Bpus
    comp = g.flops[t] / r.tensor_per_sm["bf16"]
    assert native.work_us[t] == pytest.approx(max(l2, comp) + r.mma_latency_us, rel=1e-12)
    assert ideal.work_us[t] > native.work_us[t] - r.mma_latency_us


@pytest.mark.slow  # 1.3 s of CPU
def test_the_same_schedule_on_three_generations():
    # native movement changes each prediction for its own reason: A100 only the issue and MMA tails
    # (its 163 KiB hold 4 pages, as the default), H100 and B200 two more pages of prefetch
    out = {}
    for g in ("a100", "h100", "b200"):
        ideal = mksim.simulate(mksim.build_schedule("llama-3.2-1b", g, "megakernel")).latency_us
        native = mksim.simulate(mksim.build_schedule("llama-3.2-1b", g, "megakernel", movement="native")).latency_us
        out[g] = native / ideal
    assert out["a100"] > 1.0 > out["h100"] and out["b200"] < 1.0


@pytest.mark.parametrize("opts,mode,match", [
    ({"movement": "fast"}, "megakernel", "movement must be one of ideal, native, got 'fast'"),
    ({"movement": "native"}, "graph_pdl", "movement='native' models the persistent modes' loader"),
])
def test_bad_movement_is_one_line(opts, mode, match):
    with pytest.raises(ScheduleError, match=match):
        mksim.build_schedule("llama-3.2-1b", "h100", mode, **opts)


def test_native_movement_needs_the_gpus_movement_table():
    from dataclasses import replace

    from hwmodels._schema import MovementSpec

    bare = replace(hwmodels.load("h100"), movement=MovementSpec(None, None, None, None))
    with pytest.raises(ScheduleError, match=r"has no \[chip.movement\] table"):
        mksim.build_schedule("llama-3.2-1b", bare, "megakernel", movement="native")


def test_hbm_ends_flows_whose_last_bytes_are_below_the_clocks_resolution():
    # the state dynamic dispatch of qwen3-8b on A100 reached: 24 flows of one class, 2.7e-8 B each
    # from their end, which at 73 GB/s takes 3.7e-13 µs, below what the clock resolves at 4208.6 µs;
    # the HBM serves them now instead of waking at the same instant for ever
    import simpy

    from mksim.sim._hbm import HBM

    env = simpy.Environment(initial_time=4208.618327513217)
    hbm = HBM(env, 24 * 73064.16666666667)
    done: list[float] = []
    for _ in range(24):
        hbm.start(11.0, 84020.51282051281, 0.0, lambda: done.append(env.now))
    hbm.classes[84020.51282051281].v = 10.999999973296326
    for _ in range(1000):  # a livelock would step for ever at one instant
        if env.peek() == float("inf"):
            break
        env.step()
    assert done == [4208.618327513217] * 24


@pytest.mark.slow  # 1.3 s of CPU
def test_simulate_takes_the_designs_as_options():
    import json

    r = _cli("simulate", "--gpu", "b200", "--opt", "dies=true", "--opt", "policy=die", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["policy"] == "die" and 0 < d["dies"]["l2_hit_fraction"] < 1
    bad = _cli("simulate", "--gpu", "b200", "--policy", "rr", "--opt", "policy=die")
    assert bad.returncode == 2 and bad.stderr == "error: two policies: --policy rr and --opt policy=die; give one\n"
