"""``graph``: one kernel per op, in a CUDA graph launched once."""

from __future__ import annotations

from mksim.costs import Rates

from .._modes import ChainMode, register_mode


@register_mode
class Graph(ChainMode):
    """One graph launch (``launch_latency_us``), then ``graph_node_us`` from a kernel's end to the
    next one's start."""

    name = "graph"
    search_order = 2
    defaults = {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 0}

    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:
        return r.launch_latency_us if k == 0 else prev_end_us + r.graph_node_us
