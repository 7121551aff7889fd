"""The tasks the generated kernel runs for a mixture-of-experts step (pure numpy; no GPU).

The simulator's task graph of an MoE layer is built from one concrete routing draw: its grouped expert
ops have a group per expert the draw made active (``D`` of them) and its ``topk`` a task per token. The
kernel cannot know the routing before its router runs, so it runs, per MoE layer:

- one ``topk`` task (all ``T`` tokens; a tiny serial step), which writes the layer's *route table*
  (``mk_topk`` in mk_ops.cuh): the active experts' count, the expert of each slot, each token's slots
  and weights; the kernel's task stands where the graph's first ``topk`` task is, the others are dropped;
- every expert op as ``C = min(N, T k)`` *slots* (``moe_stride.layer_capacity``), each the per-expert
  tiles of the graph: slot tile ``s = j * per + r`` is tile ``r`` of slot ``j``'s expert, read from the
  route table at run time; ``s < D * per`` is the graph's tile ``s`` (same place in the same SM's
  queue), the others are the *phantom* slots ``moe_stride`` models: on SM ``s mod grid``, before that
  SM's first task after the op (where the simulator charges their early exit). A slot past the
  kernel's own active count exits early, whichever it is: the kernel's routing (from its logits) is
  not the simulator's draw;
- dependencies as the kernel needs them for any routing: an expert op's slot ``j`` waits for the
  top-k (its one task) and for slot ``j`` of the expert op before it; ``combine`` for every slot.

:class:`KernelGraph` is that task list, with the attributes of :class:`~mksim.workload.TaskGraph` the
encoder (``encode.encode_queues``) and the runner read. A workload without experts runs its own graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mksim.schedule.designs.moe_stride import MoEStridePolicy, is_expert_op, layer_capacity
from mksim.workload import TaskGraph

Dep = tuple[int, int, int]


class KernelGraph:
    """The kernel's tasks of an MoE step (see the module docstring): per op its tiles (``n_tiles``,
    ``op_first``, ``bounds``), per task its op, tile, weight and KV bytes, and :meth:`deps`."""

    def __init__(self, g: TaskGraph):
        self.g = g
        self.ops = g.ops
        self.workload = g.workload
        cap = layer_capacity(g)
        self.capacity = cap
        n_ops = len(g.ops)
        kt = g.n_tiles.copy()
        self.per = np.zeros(n_ops, dtype=np.int64)       # an expert op's tiles per slot
        self.groups = np.zeros(n_ops, dtype=np.int64)    # ... and per the graph's draw (D)
        bounds = list(g.bounds)
        for i, op in enumerate(g.ops):
            if op.kind == "topk":
                kt[i] = 1
                bounds[i] = np.array([0, op.out_size], dtype=np.int64)
            elif is_expert_op(op):
                G = int(op.attrs["groups"])
                per, n_e, C = int(g.n_tiles[i]) // G, op.out_size // G, cap[op.layer]
                rel = g.bounds[i][:per + 1]
                if rel[-1] != n_e:
                    raise ValueError(f"op {op.name}: its tiles do not end on its first expert's outputs")
                self.per[i], self.groups[i], kt[i] = per, G, C * per
                bounds[i] = np.concatenate([j * n_e + rel[:-1] for j in range(C)] + [[C * n_e]]).astype(np.int64)
        self.n_tiles = kt
        self.op_first = np.concatenate([[0], np.cumsum(kt)]).astype(np.int64)
        self.bounds = bounds
        n = int(self.op_first[-1])
        self.op_of = np.repeat(np.arange(n_ops), kt)
        self.tile_of = np.arange(n) - self.op_first[self.op_of]
        # the graph's task of each kernel task (a slot tile: the tile of the same place in its first group)
        src = np.empty(n, dtype=np.int64)
        for i in range(n_ops):
            a, z = int(self.op_first[i]), int(self.op_first[i + 1])
            t = np.arange(z - a)
            src[a:z] = g.op_first[i] + (t % self.per[i] if self.per[i] else t)
        self.graph_task = src
        self.weight_bytes = g.weight_bytes[src]
        self.kv_read_bytes = g.kv_read_bytes[src]
        self._deps = [self._deps_of(t) for t in range(n)]

    def __len__(self) -> int:
        return int(self.op_first[-1])

    def _map(self, p: int, t0: int, t1: int) -> Dep:
        """A graph dependency on op ``p``'s tiles ``[t0, t1)`` as the kernel's, for a task outside ``p``'s layer
        experts: the top-k's one task, an expert op's every slot."""
        if self.ops[p].kind == "topk" or self.per[p]:
            return (p, 0, int(self.n_tiles[p]))
        return (p, t0, t1)

    def _deps_of(self, t: int) -> tuple[Dep, ...]:
        i, s = int(self.op_of[t]), int(self.tile_of[t])
        gt = int(self.graph_task[t])
        if self.ops[i].kind == "topk":  # every token's dependencies
            a, z = int(self.g.op_first[i]), int(self.g.op_first[i + 1])
            raw = [d for u in range(a, z) for d in self.g.deps(u)]
        else:
            raw = list(self.g.deps(gt))
        out: list[Dep] = []
        for p, t0, t1 in raw:
            if self.per[i] and self.per[p]:  # expert op after expert op: the same slot
                j = s // int(self.per[i])
                d = (p, j * int(self.per[p]), (j + 1) * int(self.per[p]))
            else:
                d = self._map(p, t0, t1)
            if d not in out:
                out.append(d)
        return tuple(out)

    def deps(self, task: int) -> tuple[Dep, ...]:
        return self._deps[task]

    def queues(self, schedule: Any) -> list[list[int]]:
        """The schedule's per-SM queues as kernel tasks: each graph task in its place (a top-k's first
        task only), and the phantom slot tiles as ``moe_stride`` places them (its ``grid``, else every SM)."""
        g, queues = self.g, schedule.queues
        n_sms = len(queues)
        grid = n_sms
        if schedule.policy == MoEStridePolicy.name:
            grid = schedule.policy_options.get("grid") or n_sms
        to_kernel: dict[int, int] = {}
        for i, op in enumerate(self.ops):
            a = int(g.op_first[i])
            if op.kind == "topk":
                to_kernel[a] = int(self.op_first[i])
                continue
            for r in range(int(g.n_tiles[i])):
                to_kernel[a + r] = int(self.op_first[i]) + r
        out = [[to_kernel[t] for t in q if t in to_kernel] for q in queues]
        for i in range(len(self.ops)):
            if not self.per[i]:
                continue
            real, last = int(self.groups[i] * self.per[i]), int(g.op_first[i + 1]) - 1
            for s in range(real, int(self.n_tiles[i])):
                sm = s % grid
                q, gq = out[sm], queues[sm]
                # before the SM's first task after the op (the graph's order), as the simulator charges it
                nxt = next((t for t in gq if t > last and t in to_kernel), None)
                pos = len(q) if nxt is None else q.index(to_kernel[nxt])
                q.insert(pos, int(self.op_first[i]) + s)
        return out


def kernel_graph(schedule: Any) -> Any:
    """The tasks the kernel runs for ``schedule``: its own graph, or an MoE step's :class:`KernelGraph`."""
    g = schedule.graph
    if not any(is_expert_op(op) or op.kind == "topk" for op in g.ops):
        return g
    return KernelGraph(g)


def capacity(cfg: Any, T: int) -> int:
    """Expert slots of an MoE layer of ``cfg`` at ``T`` tokens: ``min(N, T k)``."""
    return int(min(cfg.num_experts, T * cfg.experts_per_token))
