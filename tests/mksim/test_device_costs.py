"""Device-function costs (``[runtime.kernels.<kind>]`` ``task_*``, ``consume_*``): what a
task of each kind costs once its inputs are visible, on the toy GPU of :mod:`.simkit` (times in µs:
DRAM 1e6 B/µs shared by 2 SMs, latency 1, launch 1; math and L2 vanish).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import hwmodels
import mksim
from hwmodels import KERNEL_COST_KEYS
from mksim.costs import DeviceCost, device_costs, device_task_us, rates, resident_blocks
from mksim.errors import MksimError
from mksim.schedule import MODES
from mksim.workload import KINDS, Op, Tiling, Workload

from .simkit import chain, mem_op, toy_gpu

TOL = 2e-3
PAGE = 32 * 1024  # the default page_KiB


def run(tmp_path, wl, mode, kernels=None, tiles=2, **opts):
    gpu = toy_gpu(tmp_path, kernels=kernels)
    return mksim.simulate(mksim.build_schedule(wl, gpu, mode, tiling=Tiling(default=tiles), **opts))


# -- the pure functions --------------------------------------------------------------------------
def test_device_costs_read_the_kernels_table(tmp_path):
    gpu = toy_gpu(tmp_path, kernels={"matmul_task_fixed_us": 1.5, "matmul_consume_GBps": 25,
                                     "matmul_task_row_us": 0.5, "matmul_consume_row_GBps": 100,
                                     "attn_partial_consume_GBps": 8, "silu_mul_task_fixed_us": 0.8})
    c = device_costs(gpu.kernels)
    assert set(c) == {"matmul", "attn_partial", "silu_mul"}
    assert c["matmul"] == DeviceCost(1.5, 0.5, 25e3, 100e3)
    assert c["attn_partial"] == DeviceCost(0.0, 0.0, 8e3, math.inf)
    assert c["silu_mul"] == DeviceCost(0.8, 0.0, math.inf, math.inf)
    assert rates(gpu).device == c


@pytest.mark.parametrize("name", sorted(hwmodels.available()))
def test_device_costs_where_the_keys_are(name):
    # datasheet files have none; the standalone-kernel efficiencies (matvec_*, ...) are not task costs
    g = hwmodels.load(name)
    given = {kind for kind, c in g.kernels.per_kind.items()
             if c.task_fixed_us is not None or c.consume_GBps is not None}
    assert set(rates(g).device) == given
    if Path(g.path).parent.name == "data":  # a datasheet file
        assert given == set()


def test_kinds_tables_and_the_old_prefixed_keys_cost_the_same(tmp_path):
    old = {"matmul_task_fixed_us": 1.5, "matmul_consume_GBps": 25, "silu_mul_task_fixed_us": 0.8}
    new = {"matmul": {"task_fixed_us": 1.5, "consume_GBps": 25}, "silu_mul": {"task_fixed_us": 0.8}}
    a, b = toy_gpu(tmp_path, kernels=old), toy_gpu(tmp_path)
    text = Path(b.path).read_text() + "".join(f"[runtime.kernels.{k}]\n" + "".join(
        f'{f} = {{ value = {v}, source = "t" }}\n' for f, v in t.items()) for k, t in new.items())
    Path(b.path).write_text(text)
    assert device_costs(a.kernels) == device_costs(hwmodels.load(b.path).kernels) != {}


def test_a_kind_mksim_does_not_know_is_refused_in_one_line(tmp_path):
    gpu = toy_gpu(tmp_path, kernels={"matvec2_task_fixed_us": 1.0})
    assert set(gpu.kernels.per_kind) == {"matvec2"}  # hwmodels reads any kind
    with pytest.raises(MksimError, match=r"\[runtime.kernels.matvec2\]: 'matvec2' is not an op kind; known: embed, "
                                         "rmsnorm, matmul") as exc:
        device_costs(gpu.kernels)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("base,B,rows,share,want_work,want_tail", [
    (0.5, 50e3, 1, 1, 1 + 2.0, PAGE / 25e3),             # fixed + bytes at 25 GB/s
    (9.0, 50e3, 1, 1, 9.0, PAGE / 25e3),                 # the math takes longer
    (0.5, 50e3, 1, 2, 1 + 4.0, 2 * PAGE / 25e3),         # two blocks share the SM's workers
    (0.5, 50e3, 4, 1, 1 + 3 * 0.5 + 2.0 + 3 * 0.5, PAGE * (1 / 25e3 + 3 / 100e3)),  # 4 rows
    (0.5, 1e3, 1, 1, 1 + 0.04, 1e3 / 25e3),              # smaller than a page: all of it is the tail
    (0.5, 0.0, 1, 1, 1.0, 0.0),                          # nothing streamed: the fixed part
])
def test_device_task_us(base, B, rows, share, want_work, want_tail):
    c = DeviceCost(fixed_us=1.0, row_us=0.5, consume_Bpus=25e3, row_consume_Bpus=100e3)
    work, tail = device_task_us(base, B, rows, c, share, PAGE)
    assert float(work) == pytest.approx(want_work)
    assert float(tail) == pytest.approx(want_tail)


def test_resident_blocks():
    assert [resident_blocks(n, 132, 2) for n in (1, 132, 133, 264, 1000)] == [1, 1, 2, 2, 2]
    assert resident_blocks(1000, 132, 1) == 1


# -- stories ---------------------------------------------------------------------------------------
def test_absent_keys_change_nothing(tmp_path):
    wl = chain(2e6, 1e6)
    for mode in MODES:
        opts = {"policy": "rr"} if mode == "megakernel" else {}
        plain = run(tmp_path, wl, mode, **opts)
        other = run(tmp_path, wl, mode, kernels={"rmsnorm_task_fixed_us": 5.0}, **opts)  # no rmsnorm here
        assert other.latency_us == plain.latency_us
        assert other.breakdown_us == plain.breakdown_us


def test_a_consumer_bound_kernel(tmp_path):
    # each block's 1e6 B are in 1 + 2 after its start, but its workers need 1 + 1e6 B at 2.5e5 B/µs
    r = run(tmp_path, chain(2e6), "graph", {"matmul_task_fixed_us": 1, "matmul_consume_GBps": 250}, blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + (1 + 4), abs=TOL)
    assert r.breakdown_us["compute"] == pytest.approx(5 - 3, abs=TOL)


def test_a_data_bound_kernel_consumes_its_last_page_after_it_is_in(tmp_path):
    # fixed 1 + 1e6 B at 1e6 B/µs = 2 < bytes in at 1 + 2; then the last page: 32 KiB at 1e6 B/µs
    r = run(tmp_path, chain(2e6), "graph", {"matmul_task_fixed_us": 1, "matmul_consume_GBps": 1000}, blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + (1 + 2) + PAGE / 1e6, abs=TOL)


def test_blocks_sharing_an_sm_share_its_workers(tmp_path):
    # 4 blocks of 5e5 B, two per SM: each consumes at half of 2.5e5 B/µs: 1 + 4 after the release
    k = {"matmul_task_fixed_us": 1, "matmul_consume_GBps": 250}
    r = run(tmp_path, chain(2e6), "graph", k, tiles=4, blocks_per_sm=2)
    assert r.latency_us == pytest.approx(1 + (1 + 4), abs=TOL)
    # two blocks on two SMs with two slots each: one per SM, each with the SM's workers to itself
    r = run(tmp_path, chain(2e6), "graph", k, tiles=2, blocks_per_sm=2)
    assert r.latency_us == pytest.approx(1 + (1 + 4), abs=TOL)


def test_a_fixed_cost_without_bytes(tmp_path):
    wl = Workload(name="math", ops=(mem_op("k0", 0.0),), tokens=1)
    r = run(tmp_path, wl, "graph", {"matmul_task_fixed_us": 1.5}, blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + 1.5)


def test_rows_add_to_the_fixed_part_and_to_the_consumption(tmp_path):
    op = Op(name="k0", kind="matmul", out_size=64, elem_bytes=1e-6, flops=1.0, weight_bytes=2e6, align=1,
            attrs={"rows": 3})
    wl = Workload(name="rows", ops=(op,), tokens=3)
    k = {"matmul_task_fixed_us": 1, "matmul_task_row_us": 0.25, "matmul_consume_GBps": 500,
         "matmul_consume_row_GBps": 2000}
    # per block: 1 + 2 * 0.25 + 1e6 B * (1 / 5e5 + 2 / 2e6) = 1.5 + 3
    r = run(tmp_path, wl, "graph", k, blocks_per_sm=1)
    assert r.latency_us == pytest.approx(1 + 4.5, abs=TOL)


def test_the_megakernel_overlaps_the_fixed_part_with_the_data_wait(tmp_path):
    # 1e5 B per SM fits the pages; the loader's flow lands at 1 + 1 + 0.2 while the executor,
    # started at 1, has done its fixed 1 by 2: it ends when the last page is consumed, not at 3.2
    k = {"matmul_task_fixed_us": 1, "matmul_consume_GBps": 10_000}
    r = run(tmp_path, chain(2e5), "megakernel", k, policy="rr", prefetch_depth=4)
    assert r.latency_us == pytest.approx(1 + 1 + 0.2 + PAGE / 1e7, abs=TOL)
    # a fixed part longer than the wait: it and the consumption follow the task's start
    k = {"matmul_task_fixed_us": 3, "matmul_consume_GBps": 100}
    r = run(tmp_path, chain(2e5), "megakernel", k, policy="rr", prefetch_depth=4)
    assert r.latency_us == pytest.approx(1 + 3 + 1e5 / 1e5, abs=TOL)


def test_the_fixed_part_follows_the_dependency(tmp_path):
    # op 1's pages are in early (prefetched), its fixed part waits for op 0 (flag at 0.5 after its end)
    k = {"matmul_task_fixed_us": 2}
    wl = Workload(name="dep", ops=(mem_op("k0", 2e5), mem_op("k1", 2e4, "k0")), tokens=1)
    r = run(tmp_path, wl, "megakernel", k, policy="rr", prefetch_depth=4)
    # the fixed 2 was measured on a fresh kernel: it holds the cold start, here the first load
    # (1, the DRAM latency; mksim.costs.cold_start_us). op 0 pays it: its first bytes are in at 2
    # (1 + 1), then 2 - 1 more: ends at 3. op 1's pages are in long before: from 3.5 it takes 2 - 1
    assert r.latency_us == pytest.approx(3 + 0.5 + 1, abs=TOL)


def test_every_kind_of_the_llm_steps_is_costed_on_the_h200():
    # the fitted overlay has a table per kind of the llm workloads, all kinds the generated kernel runs;
    # other kinds keep their FLOP/L2 cost
    per_kind = hwmodels.load("h200-mk-kernels").kernels.per_kind
    assert {op.kind for op in mksim.models.workload("llama-3.2-1b").ops} <= set(per_kind)
    assert set(per_kind) <= {k.name for k in KINDS.values() if k.opcode is not None}
    for kind, cost in per_kind.items():  # each with the keys its fit form declares (page_us where the single
        want = set(KINDS[kind].cost_fields)  # ops were timed at several page sizes)
        assert want - {"page_us"} <= {f for f in KERNEL_COST_KEYS if getattr(cost, f) is not None} <= want


def test_the_h200_with_task_costs_is_slower(tmp_path):
    # the real device functions' order of magnitude: every mode slows down, none gets faster
    p = tmp_path / "h200-costed.toml"
    p.write_text("\n".join([
        'name = "h200-costed"', 'full_name = "test"', f'extends = "{hwmodels.load("h200-datasheet").path}"',
        "[runtime.kernels]",
        'matmul_task_fixed_us = { value = 1.4, source = "t" }',
        'matmul_consume_GBps = { value = 30, source = "t" }',
        'attn_partial_task_fixed_us = { value = 7, source = "t" }',
        'rmsnorm_task_fixed_us = { value = 1.3, source = "t" }',
        "[sources.t]", 'kind = "estimate"', 'title = "round numbers for tests"', ""]))
    wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    for mode in ("graph", "megakernel"):
        plain = mksim.simulate(mksim.build_schedule(wl, "h200-datasheet", mode)).latency_us
        costed = mksim.simulate(mksim.build_schedule(wl, str(p), mode)).latency_us
        assert costed > plain + 16 * 7  # at least one attention partial per layer on the path



def test_under_pdl_the_fixed_part_starts_at_the_release_while_the_prologue_streams(tmp_path):
    # kernel 0 (no device cost, no bytes) ends at 1.02; kernel 1's blocks are placed at 1.5 and
    # released at 1.52, while their 192 KiB prologues stream until 1.5 + 1 + 0.39; their fixed 5,
    # less the cold start it was measured with (the first load, 1), counts from the release and
    # their first bytes (1.5 + 1): 6.5 (the rest of their bytes is in by 5.5)
    add = Op(name="k0", kind="add", out_size=64, elem_bytes=1e-6, flops=1.0, align=1)
    wl = Workload(name="pdl", ops=(add, mem_op("k1", 2e6, "k0")), tokens=1)
    r = run(tmp_path, wl, "graph_pdl", {"matmul_task_fixed_us": 5}, blocks_per_sm=1, prefetch_depth=3,
            page_KiB=64)
    assert r.latency_us == pytest.approx(2.5 + 4, abs=TOL)


def test_the_cost_functions_examples_hold():
    import doctest

    from mksim import costs
    assert doctest.testmod(costs).failed == 0


# -- the page ring ---------------------------------------------------------------------------------
RING_PAGE = 50e3  # bytes: 20 pages per block of chain(2e6) on 2 tiles
RING = {"bulk_copy_latency_ns": 500, "bulk_copy_GBps": 100}  # a page's copy: 0.5 + 0.5 µs


def ring_run(tmp_path, mode, kernels, **opts):
    gpu = toy_gpu(tmp_path, kernels={"matmul_task_fixed_us": 2, "matmul_consume_GBps": 250, **kernels},
                  movement=RING)
    return mksim.simulate(mksim.build_schedule(chain(2e6), gpu, mode, tiling=Tiling(default=2),
                                               page_KiB=RING_PAGE / 1024, **opts))


@pytest.mark.parametrize("mode", ["graph", "megakernel"])
def test_the_workers_consume_no_faster_than_the_ring_delivers_pages(tmp_path, mode):
    opts = {"blocks_per_sm": 1} if mode == "graph" else {"policy": "rr"}
    # no ring (a profile without ring_copies_in_flight_count): fixed 2 + 1e6 B at 2.5e5 B/µs
    assert ring_run(tmp_path, mode, {}, prefetch_depth=2, **opts).latency_us == pytest.approx(1 + 2 + 4, abs=TOL)
    # one copy in flight: a page per 1 µs, 20 pages: the fixed 2, then 20 (the DRAM flow is in at 1 + 1 + 20)
    ring = {"ring_copies_in_flight_count": 1}
    assert ring_run(tmp_path, mode, ring, prefetch_depth=2, **opts).latency_us == pytest.approx(1 + 2 + 20, abs=TOL)
    # a cost per page of 0.5 µs on top of the copy: 1.5 µs a page
    ring["matmul_page_us"] = 0.5
    assert ring_run(tmp_path, mode, ring, prefetch_depth=2, **opts).latency_us == pytest.approx(1 + 2 + 30, abs=TOL)
    # a ring of one page is refilled once it is read: 1.5 + 0.2 µs a page
    assert ring_run(tmp_path, mode, ring, prefetch_depth=1, **opts).latency_us == pytest.approx(1 + 2 + 34, abs=TOL)


def test_only_kinds_whose_bytes_go_through_the_pages_pay_the_page_cost(tmp_path):
    assert [k.name for k in KINDS.values() if k.pages] == ["matmul"]
    c = device_costs(toy_gpu(tmp_path, kernels={"matmul_page_us": 0.25, "silu_mul_task_fixed_us": 1}).kernels)
    assert c["matmul"].page_us == 0.25 and c["silu_mul"].page_us == 0.0
