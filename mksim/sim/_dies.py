"""Traffic between the dies (chiplets) of a GPU, from where each task ran: pure arithmetic, no SimPy.

A die's L2 slice holds what its SMs wrote and what they fetched from other dies, so the first
reader on a die of a producer task's output fetches it across; later readers on that die hit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mksim.costs import die_of_sm
from mksim.workload import TaskGraph


def die_traffic(graph: TaskGraph, lane_of: Sequence[int], n_sms: int, dies: int) -> dict[str, Any]:
    """Dependency edges and activation bytes within and across dies, for tasks run on SMs
    ``lane_of`` (one per task). ``activation_read_B`` counts each consumer's read of each producer
    tile's output; ``cross_die_B`` what the dies fetched from each other (once per producer tile and
    reading die); ``l2_hit_fraction`` the share of the reads their die's L2 already held.

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
    return {"dies": dies, "edges": edges, "cross_die_edges": cross_edges, "activation_read_B": reads,
            "cross_die_B": cross, "l2_hit_fraction": 1.0 - cross / reads if reads else 1.0}
