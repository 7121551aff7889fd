"""Syncs (counter, flag, sentinel) and the sentinel design (Kog's data as its own flag).

Each sync computes when a consumer sees its producers from its own function of :mod:`mksim.costs`
(read from the module as it is called: the tests swap one to see the engine follow).

>>> import hwmodels
>>> from mksim.costs import rates
>>> from mksim.schedule import SYNCS, get_sync
>>> r = rates(hwmodels.load("h200-calibrated"))
>>> [(s, round(get_sync(s).ready_us(0.0, 132, r), 3)) for s in SYNCS]
[('counter', 0.558), ('flag', 1.287), ('sentinel', 0.936)]
"""

from __future__ import annotations

from typing import Any

from mksim import costs
from mksim.costs import Rates

from .._designs import BaseDesign, BaseSync, register_design, register_sync


@register_sync
class Counter(BaseSync):
    """One counter per op range, released by the producers and observed by the consumer."""

    name = "counter"

    def ready_us(self, last_end_us: float, n_producer_tiles: int, r: Rates, polled_B: float = 0.0,
                 draw_Bpus: float = 0.0) -> float:
        return costs.counter_ready_us(last_end_us, r, draw_Bpus)


@register_sync
class Flag(BaseSync):
    """A flag per producer tile, polled 32 at a time by a warp."""

    name = "flag"

    def ready_us(self, last_end_us: float, n_producer_tiles: int, r: Rates, polled_B: float = 0.0,
                 draw_Bpus: float = 0.0) -> float:
        return costs.flag_ready_us(last_end_us, n_producer_tiles, r, draw_Bpus)


@register_sync
class Sentinel(BaseSync):
    """Outputs start as a sentinel (NaN); the consumer polls the data itself: no fence, no counter,
    no reload of the data after a flag, but its waiter passes over every byte it reads."""

    name = "sentinel"

    def ready_us(self, last_end_us: float, n_producer_tiles: int, r: Rates, polled_B: float = 0.0,
                 draw_Bpus: float = 0.0) -> float:
        return last_end_us + costs.sentinel_seen_us(polled_B, draw_Bpus, r)


@register_design
class SentinelDesign(BaseDesign):
    """``sync="sentinel"``: no fence, no counter, no reload of the data after a flag."""

    name = "sentinel"
    option = "sync"
    value = Sentinel.name
    compare_rows = (("megakernel:sentinel", {"sync": Sentinel.name}),)
    syncs = (Sentinel.name,)  # a study samples it as one more sync, not on every candidate

    def search_options(self) -> dict[str, Any]:
        return {}
