"""The engine piece of the MoE route-finalize and drain queue (Cohere): each SM's static list runs in
task order with the expert ops taken out; where an expert op's tiles would be, the SM drains the
op's queue, claiming tiles as it becomes free (one claim ahead of the tile it runs)."""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections import deque
from functools import partial
from typing import Any

from mksim.schedule.designs.moe_queue import MoEQueue
from mksim.schedule.designs.moe_stride import is_expert_op

from .._actors import Loader, Signal
from .._design_run import DesignRun, Handover, runs
from .moe_stride import moe_stats

AHEAD = 2  # tiles an SM holds claimed: the one it runs and the next (its loader streams it meanwhile)


@runs(MoEQueue)
class MoEQueueRun(DesignRun):
    """Claims go in the order SMs reach the drain; a claim returns one atomic round trip
    (``dispatch_task_us``) after it is made or after the layer's queue is published (the top-k seen,
    then the route-finalize: an L2 read of the top-k and a release atomic), whichever is later. Before
    the queue is published an SM holds one claim, after it two. A claim that finds the queue empty
    ends the SM's drain: the task after it is handed over one atomic later."""

    def setup(self) -> None:
        eng = self.eng
        g, r = eng.g, eng.r
        topk = {op.layer: j for j, op in enumerate(g.ops) if op.kind == "topk"}
        self.pub_op = {j: topk[op.layer] for j, op in enumerate(g.ops) if is_expert_op(op)}
        self.pool = {j: deque(range(eng.op_first[j], eng.op_first[j + 1])) for j in self.pub_op}
        self.claim_us = r.dispatch_task_us
        self.finalize_us = r.l2_latency_us + r.dispatch_task_us
        # each SM's list in task order, without the expert tiles: a copy (the schedule keeps its own)
        expert = bytearray(len(g))
        for j in self.pub_op:
            expert[eng.op_first[j]:eng.op_first[j + 1]] = b"\x01" * (eng.op_first[j + 1] - eng.op_first[j])
        eng.s = s = copy.copy(eng.s)
        s.queues = [sorted(t for t in q if not expert[t]) for q in (s.queues or [])]
        n_sms = len(s.queues)
        self.arrived = bytearray(b"\x01" * len(g))
        self.drains: list[deque[tuple[int, int]]] = []
        for q in s.queues:  # drain op j where its first tile would come in task order
            self.drains.append(deque((j, bisect_left(q, eng.op_first[j])) for j in sorted(self.pub_op)))
            for _j, pos in self.drains[-1]:
                if pos < len(q):
                    self.arrived[q[pos]] = 0
        self.ins = [0] * n_sms      # tiles inserted into each SM's list so far
        self.done_n = [0] * n_sms   # tasks each SM has finished (its next position)
        self.claims = [0] * n_sms
        self.failed = 0
        self.signals: dict[int, Signal] = {}
        self.loaders: dict[int, Loader] = {}
        self.sm_of: dict[int, int] = {}  # the SM each task handed over goes to
        self.parked: set[int] = set()  # SMs whose loader waits at a task not yet handed over
        for sm in range(n_sms):
            self._advance(sm)

    def handover(self) -> Handover:
        return self.arrived, self.arrival, True

    def loader(self, ld: Loader) -> None:
        self.loaders[-1 - ld.lane] = ld
        ld.gate = (self.arrived, self._gated)

    def finished(self, t: int, p: int, lane: int, now_us: float) -> None:
        self.done_n[lane] += 1
        self._advance(lane)

    # -- claims ------------------------------------------------------------------------------
    def _published(self, j: int) -> float | None:
        """When op ``j``'s queue is published, or None while its top-k runs."""
        seen = self.eng.op_seen_at(self.pub_op[j])
        return seen + self.finalize_us if isinstance(seen, float) else None

    def _advance(self, sm: int) -> None:
        """SM ``sm`` claims while it is at a drain and holds fewer than it may."""
        eng, q, drains = self.eng, self.eng.s.queues[sm], self.drains[sm]  # type: ignore[index]
        now = eng.env.now
        while drains:
            j, at = drains[0]
            pos = at + self.ins[sm]
            held = pos - self.done_n[sm]
            pub = self._published(j)
            if held >= (AHEAD if pub is not None and now >= pub else 1):
                return
            self.claims[sm] += 1
            pool = self.pool[j]
            if pool:
                t = pool.popleft()
                q.insert(pos, t)
                self.ins[sm] += 1
                ld = self.loaders.get(sm)
                if ld is not None and ld.i == pos == len(q) - 1:  # its loader had run out of tasks
                    self.parked.add(sm)
                self.arrived[t] = 0
                self._hand(t, j, pub, sm)
                continue
            self.failed += 1
            drains.popleft()
            if pos < len(q) and not any(p == at for _, p in drains):  # the drain is over: the next task
                self._hand(q[pos], j, pub, sm)

    def _hand(self, t: int, j: int, pub: float | None, sm: int) -> None:
        """Task ``t`` reaches SM ``sm`` a claim after now or after op ``j``'s queue is published."""
        env = self.eng.env
        self.sm_of[t] = sm
        if pub is None:
            sig = self.eng.op_seen_at(self.pub_op[j])
            assert not isinstance(sig, float)
            sig.callbacks.append(partial(self._hand_later, t))
            return
        self.arrival(t).succeed_after(max(env.now, pub) + self.claim_us - env.now)

    def _hand_later(self, t: int, _ev: object) -> None:
        self.arrival(t).succeed_after(self.finalize_us + self.claim_us)

    def arrival(self, t: int) -> Signal:
        ev = self.signals.get(t)
        if ev is None:
            ev = self.signals[t] = Signal(self.eng.env)
            ev.callbacks.append(partial(self._arrived, t))
        return ev

    def _arrived(self, t: int, _ev: object = None) -> None:
        self.arrived[t] = 1
        sm = self.sm_of.pop(t)
        if sm in self.parked:  # its loader waits at this task or at the one the drain put before it
            self.parked.discard(sm)
            self.loaders[sm].run()
        self._advance(sm)  # the first claim is back: it may claim the next

    def _gated(self, t: int, loader: Loader) -> None:
        self.parked.add(-1 - loader.lane)

    def result(self) -> dict[str, Any] | None:
        if not hasattr(self, "claims"):
            return None
        return {**moe_stats(self.eng), "claims": sum(self.claims), "empty_claims": self.failed}
