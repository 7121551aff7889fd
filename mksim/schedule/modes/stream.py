"""``stream``: one kernel per op, each launched by the host on a stream."""

from __future__ import annotations

from mksim.costs import Rates, host_issue_times, host_issue_us

from .._modes import ChainMode, register_mode


@register_mode
class Stream(ChainMode):
    """The host issues a kernel every ``stream_launch_us``; a kernel starts ``launch_latency_us``
    after it is issued, and not before the previous one ended + ``stream_gap_us``."""

    name = "stream"
    defaults = {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 0}

    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:
        at = r.launch_latency_us if k == 0 else prev_end_us + r.stream_gap_us
        return max(at, host_issue_us(k, r) + r.launch_latency_us)

    def host_ready_us(self, kinds: list[str], ops_of: list[str], r: Rates) -> list[float]:
        """Each kernel once the host has issued it (:func:`~mksim.costs.host_issue_times`): an eager
        stack's Python, module calls and launches, kernel by kernel."""
        return host_issue_times(kinds, ops_of, r)
