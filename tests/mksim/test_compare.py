"""mksim.compare: the one comparison of modes and designs that the CLI and the explorer call."""

from __future__ import annotations

import os

import pytest

import hwmodels
from mksim.compare import (
    ModeSummary,
    compare_modes,
    compare_workload,
    make_workload,
    parallel_map,
    parse_designs,
)
from mksim.errors import UnknownNameError
from mksim.schedule import MODES, design_rows


def _square_or_fail(x: int) -> int:
    if x == 3:
        raise UnknownNameError("policy", "foo", ["rr"])
    return x * x


def test_parallel_map_keeps_order():
    assert parallel_map(_square_or_fail, [5, 4, 2, 1]) == [25, 16, 4, 1]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: the map runs serially")
def test_parallel_map_raises_a_workers_error_in_the_caller():
    with pytest.raises(UnknownNameError, match="unknown policy 'foo'") as info:
        parallel_map(_square_or_fail, [1, 2, 3, 4])
    assert info.value.known == ("rr",)


def test_parse_designs():
    assert parse_designs("all") == list(design_rows()) == ["sentinel", "dynamic", "dies", "movement", "moe_stride",
                                                           "moe_queue", "moe_prefetch", "tp_boundary", "tp_overlap",
                                                           "tp_two_shot", "tp_multicast"]
    assert parse_designs(" dies ,sentinel,dies") == ["dies", "sentinel"]
    with pytest.raises(UnknownNameError, match="unknown design 'warp'; known: sentinel"):
        parse_designs("warp")


@pytest.mark.slow  # 2.5 s of CPU
def test_compare_workload_rows_and_json():
    g = hwmodels.load("h200-datasheet")
    wl = make_workload("llama-3.2-1b", n_sms=g.sm.count)
    rows = compare_workload(wl, g, designs="dies")
    assert list(rows) == [*MODES, "megakernel:dies", "megakernel:die"]
    assert all(isinstance(r, ModeSummary) and len(r.op_time_us) == len(wl.ops) for r in rows.values())
    assert rows["megakernel:die"].policy == "die"
    d = compare_modes("llama-3.2-1b", "h200-datasheet", designs="dies")
    assert {m: r["latency_us"] for m, r in d["modes"].items()} == {m: r.latency_us for m, r in rows.items()}
    assert d["modes"]["graph"]["speedup_vs_stream"] == rows["stream"].latency_us / rows["graph"].latency_us
