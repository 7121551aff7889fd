"""``graph_pdl``: a CUDA graph with programmatic dependent launch (PDL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mksim.costs import Rates

from .._modes import ChainMode, register_mode

if TYPE_CHECKING:
    from .._schedule import Options


@register_mode
class GraphPDL(ChainMode):
    """Kernel ``k`` is dispatched ``pdl_node_us`` after kernel ``k - 1`` *starts*; its blocks that find
    a slot prefetch up to ``prefetch_depth`` pages of their weights (the prologue), and their
    dependent part waits until kernel ``k - 1`` ends + ``pdl_node_us``."""

    name = "graph_pdl"
    defaults = {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 2}
    waits_for_previous_end = False
    separate_release = True

    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:
        return r.launch_latency_us if k == 0 else max(prev_start_us + r.pdl_node_us, r.launch_latency_us)

    def release_us(self, k: int, prev_end_us: float, r: Rates) -> float:
        return prev_end_us + r.pdl_node_us

    def prologue_B(self, options: Options) -> float:
        return options.prefetch_bytes
