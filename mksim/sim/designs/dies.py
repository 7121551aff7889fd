"""The engine piece of the dies design: a consumer sees a producer on another die the crossing later,
and the result counts the traffic between dies (:func:`die_traffic`, pure arithmetic)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from mksim.schedule.designs.dies import Dies, die_of_sm, seen_on_die_us
from mksim.workload import TaskGraph

from .._design_run import DesignRun, Seen, runs


@runs(Dies)
class DiesRun(DesignRun):
    """Each lane's die, and each op's latest end on each die (kept as tasks finish)."""

    def setup(self) -> None:
        eng = self.eng
        n_d, n = eng.r.dies, eng.r.n_sms
        self.die_of_lane = [die_of_sm(sm, n, n_d) for sm in range(n)]
        self.op_end_die = [[-math.inf] * n_d for _ in eng.g.ops]

    def finished(self, t: int, p: int, lane: int, now_us: float) -> None:
        ends, d = self.op_end_die[p], self.die_of_lane[lane]
        if now_us > ends[d]:
            ends[d] = now_us

    def seen(self) -> Seen:
        r, die_of, op_end_die = self.eng.r, self.die_of_lane, self.op_end_die
        end, lane_of = self.eng.end, self.eng.lane_of

        def on_sm(sm: int) -> tuple[Callable[[int], float], Callable[[int, int], float]]:
            d = die_of[sm]

            def op_seen(p: int) -> float:
                return max(seen_on_die_us(v, e, d, r) for e, v in enumerate(op_end_die[p]))

            def tiles_seen(lo: int, hi: int) -> float:
                return max(seen_on_die_us(end[k], die_of[lane_of[k]], d, r) for k in range(lo, hi))
            return op_seen, tiles_seen
        return on_sm

    def result(self) -> dict[str, Any] | None:
        if not hasattr(self, "die_of_lane"):  # not a persistent run: no die was seen
            return None
        eng = self.eng
        return die_traffic(eng.g, eng.lane_of, eng.r.n_sms, eng.r.dies)


def die_traffic(graph: TaskGraph, lane_of: Sequence[int], n_sms: int, dies: int) -> dict[str, Any]:
    """Dependency edges and activation bytes within and across dies, for tasks run on SMs
    ``lane_of`` (one per task). ``activation_read_B`` counts each consumer's read of each producer
    tile's output; ``cross_die_B`` what the dies fetched from each other (once per producer tile and
    reading die); ``l2_hit_fraction`` the share of the reads their die's L2 already held. A die's L2
    slice holds what its SMs wrote and what they fetched from other dies, so the first reader on a
    die of a producer task's output fetches it across; later readers on that die hit.

    >>> from mksim.workload import Input, Op, TaskGraph, Tiling, Workload
    >>> a = Op(name="a", kind="matmul", out_size=4, elem_bytes=2, flops=1, weight_bytes=8, align=1)
    >>> b = Op(name="b", kind="matmul", out_size=4, elem_bytes=2, flops=1, weight_bytes=8, align=1,
    ...        inputs=(Input("a", full=True),))
    >>> g = TaskGraph(Workload(name="w", ops=(a, b), tokens=1), Tiling(default=2))
    >>> d = die_traffic(g, [0, 1, 0, 1], n_sms=2, dies=2)  # a[i] and b[i] on SM i: die i
    >>> d["edges"], d["cross_die_edges"], d["activation_read_B"], d["cross_die_B"], d["l2_hit_fraction"]
    (4, 2, 16.0, 8.0, 0.5)
    """
    die = [die_of_sm(int(sm), n_sms, dies) for sm in lane_of]
    out_B = graph.out_bytes.tolist()
    n_tiles, op_first = graph.n_tiles.tolist(), graph.op_first.tolist()
    n_ops = len(graph.ops)
    tiles_on = [[0] * dies for _ in range(n_ops)]
    bytes_on = [[0.0] * dies for _ in range(n_ops)]
    for t, d in enumerate(die):
        p = int(graph.op_of[t])
        tiles_on[p][d] += 1
        bytes_on[p][d] += out_B[t]
    total_B = [sum(b) for b in bytes_on]
    edges = cross_edges = 0
    reads = cross = 0.0
    fetched_op: set[tuple[int, int]] = set()
    fetched: set[tuple[int, int]] = set()
    for t, d in enumerate(die):
        for p, a, b in graph.deps(t):
            if b - a == n_tiles[p]:
                edges += n_tiles[p]
                cross_edges += n_tiles[p] - tiles_on[p][d]
                reads += total_B[p]
                if (p, d) not in fetched_op:
                    fetched_op.add((p, d))
                    cross += total_B[p] - bytes_on[p][d]
                continue
            for k in range(op_first[p] + a, op_first[p] + b):
                edges += 1
                reads += out_B[k]
                if die[k] != d:
                    cross_edges += 1
                    if (k, d) not in fetched and (p, d) not in fetched_op:
                        fetched.add((k, d))
                        cross += out_B[k]
    # keyed by the design's name, as ``mksim simulate --json`` has always printed the count of dies
    return {Dies.name: dies, "edges": edges, "cross_die_edges": cross_edges, "activation_read_B": reads,
            "cross_die_B": cross, "l2_hit_fraction": 1.0 - cross / reads if reads else 1.0}
