"""Syncs (counter, flag, sentinel) and the sentinel design (Kog's data as its own flag)."""

from __future__ import annotations

from typing import Any

from .._designs import BaseDesign, BaseSync, register_design, register_sync


@register_sync
class Counter(BaseSync):
    """One counter per op range, released by the producers and observed by the consumer."""

    name = "counter"


@register_sync
class Flag(BaseSync):
    """A flag per producer tile, polled 32 at a time by a warp."""

    name = "flag"


@register_sync
class Sentinel(BaseSync):
    """Outputs start as a sentinel (NaN); the consumer polls the data itself."""

    name = "sentinel"


@register_design
class SentinelDesign(BaseDesign):
    """``sync="sentinel"``: no fence, no counter, no reload of the data after a flag."""

    name = "sentinel"
    option = "sync"
    value = "sentinel"
    compare_rows = (("megakernel:sentinel", {"sync": "sentinel"}),)

    def search_options(self) -> dict[str, Any]:
        return {}  # a study samples it as one more sync (mksim.search's space), not on every candidate
