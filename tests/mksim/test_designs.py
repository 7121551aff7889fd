"""Closed-form stories of the megakernel designs beyond static queues with counters (times in µs).

Toy GPU (simkit): 2 SMs, DRAM 1e6 B/µs shared, 1 µs DRAM latency, launch 1 µs; a counter or flag
is seen 0.5 µs after its release, data polled as its own flag (sentinel) 0.2 µs after its stores.
"""

from __future__ import annotations

import pytest

import hwmodels
import mksim
from mksim.errors import ScheduleError
from mksim.sim._costs import SYNCS, rates, sync_us
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
    # per GPU: the sentinel is the cheapest edge, flags cost a round trip per 32 producers more
    for name in hwmodels.available():
        r = rates(hwmodels.load(name))
        c = {s: sync_us(s, 132, r) for s in SYNCS}
        assert c["sentinel"] < c["counter"] < c["flag"], name
        assert c["sentinel"] < r.grid_barrier_us, name


def test_unknown_sync_is_one_line():
    with pytest.raises(ScheduleError, match="sync must be one of counter, flag, sentinel"):
        mksim.build_schedule("llama-3.2-1b", "h200", "megakernel", sync="nan")
