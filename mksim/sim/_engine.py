"""The discrete-event engine: SMs as SimPy processes over a shared HBM.

Processes only wait (timeouts, transfers, events); durations come from :mod:`._costs`.
Chain modes run kernels of blocks dispatched to SM slots; persistent modes run per-SM
queues with a loader (weight prefetch into shared-memory pages) and an executor.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import simpy

from typing import TYPE_CHECKING

from mksim.errors import DeadlockError

if TYPE_CHECKING:
    from mksim.schedule import Schedule

from ._costs import compute_us, host_issue_us, l2_us, rates
from ._hbm import HBM
from ._result import CATEGORIES, SimResult, build_result


class _Lanes:
    """Per-lane (SM or SM slot) record of what each stretch of time was spent on."""

    def __init__(self) -> None:
        self.segs: list[tuple[int, float, float, int, str]] = []  # lane, start, end, task, category

    def add(self, lane: int, start: float, end: float, task: int, cat: str) -> None:
        if end > start:
            self.segs.append((lane, start, end, task, cat))


def simulate(schedule: Schedule) -> SimResult:
    """Run ``schedule`` and return its :class:`SimResult` (latency in µs, breakdown, timeline).

    Example::

        >>> import mksim
        >>> res = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200", "graph"))
        >>> res.latency_us > res.bandwidth_floor_us
        True
    """
    schedule.validate()
    eng = _Engine(schedule)
    eng.run()
    return eng.result()


class _Engine:
    def __init__(self, s: Schedule):
        self.s = s
        self.g = s.graph
        self.r = rates(s.gpu)
        self.env = simpy.Environment()
        self.hbm = HBM(self.env, self.r.hbm_Bpus, record=s.options.record)
        g, r = self.g, self.r
        n = len(g)
        self.pre_B = g.weight_bytes + g.kv_read_bytes           # DRAM, independent of activations
        l2_B = g.in_bytes + g.out_bytes + g.kv_write_bytes       # activations, through L2
        comp = np.empty(n)
        for i, op in enumerate(g.ops):
            a, b = int(g.op_first[i]), int(g.op_first[i + 1])
            comp[a:b] = [compute_us(f, op.unit, op.dtype, r) for f in g.flops[a:b]]
        self.tail_us = np.maximum(comp, l2_B / r.l2_per_sm_Bpus)  # executor work once data is in
        self.start = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.lane_of = np.full(n, -1, dtype=np.int64)
        self.lanes = _Lanes()
        self.op_done_n = np.zeros(len(g.ops), dtype=np.int64)
        self.op_end = np.zeros(len(g.ops))
        self.op_events: dict[int, simpy.Event] = {}
        self.task_events: dict[int, simpy.Event] = {}
        self.kernel_spans: list[tuple[float, float]] = []
        self.n_lanes = 0
        self.t0 = 0.0  # when the (first) kernel starts

    # -- shared helpers -------------------------------------------------------------------
    def _flow(self, nbytes: float, cap: float, lane: int, task: int, idle: bool):
        """Load ``nbytes`` from DRAM; pay the first-byte latency if the pipe had drained."""
        env = self.env
        if nbytes <= 0:
            return
        if idle:
            t = env.now
            yield env.timeout(self.r.dram_latency_us)
            self.lanes.add(lane, t, env.now, task, "bubble")
        t = env.now
        yield self.hbm.transfer(nbytes, cap)
        self.lanes.add(lane, t, env.now, task, "memory")

    def _finish(self, t: int, lane: int) -> None:
        now = self.env.now
        self.end[t] = now
        self.lane_of[t] = lane
        p = int(self.g.op_of[t])
        self.op_done_n[p] += 1
        self.op_end[p] = max(self.op_end[p], now)
        ev = self.task_events.pop(t, None)
        if ev is not None:
            ev.succeed()
        if self.op_done_n[p] == self.g.n_tiles[p]:
            ev = self.op_events.pop(p, None)
            if ev is not None:
                ev.succeed()

    def _op_event(self, p: int) -> simpy.Event:
        ev = self.op_events.get(p)
        if ev is None:
            ev = self.op_events[p] = self.env.event()
        return ev

    def _task_event(self, t: int) -> simpy.Event:
        ev = self.task_events.get(t)
        if ev is None:
            ev = self.task_events[t] = self.env.event()
        return ev

    def _compute(self, t: int, lane: int, since: float):
        """The executor's own work (math, L2 traffic) not yet overlapped with loading."""
        env = self.env
        rest = self.tail_us[t] - (env.now - since)
        if self.pre_B[t] <= 0:  # nothing streamed: the L2 read latency is exposed
            rest = self.tail_us[t] + self.r.l2_latency_us - (env.now - since)
        if rest > 0:
            t1 = env.now
            yield env.timeout(rest)
            self.lanes.add(lane, t1, env.now, t, "compute")

    # -- chain modes ------------------------------------------------------------------
    def _run_chain(self):
        s, g, r, env = self.s, self.g, self.r, self.env
        slots = s.options.blocks_per_sm
        n_k = len(g.ops)
        self.n_lanes = r.n_sms * slots
        cap = r.sm_cap_Bpus / slots
        queues = [deque(range(int(g.op_first[k]), int(g.op_first[k + 1]))) for k in range(n_k)]
        dispatch = [env.event() for _ in range(n_k)]   # blocks of kernel k may be placed
        release = [env.event() for _ in range(n_k)]    # PDL: dependent part may run
        done = [env.event() for _ in range(n_k)]
        left = [int(g.n_tiles[k]) for k in range(n_k)]
        start_t = [math.nan] * n_k
        end_t = [math.nan] * n_k
        pdl = s.mode == "graph_pdl"
        head_B = s.options.prefetch_bytes if pdl else 0.0

        def launcher():
            for k in range(n_k):
                if k == 0:
                    at = r.launch_latency_us
                elif pdl:
                    at = max(start_t[k - 1] + r.pdl_node_us, r.launch_latency_us)
                else:
                    if not done[k - 1].triggered:
                        yield done[k - 1]
                    at = end_t[k - 1] + r.graph_node_us
                if s.mode == "stream":
                    at = max(at, host_issue_us(k, "stream", r) + r.launch_latency_us)
                if at > env.now:
                    yield env.timeout(at - env.now)
                start_t[k] = env.now
                dispatch[k].succeed()
                if pdl:
                    env.process(releaser(k))
                else:
                    release[k].succeed()

        def releaser(k):
            if k > 0:
                if not done[k - 1].triggered:
                    yield done[k - 1]
                at = end_t[k - 1] + r.pdl_node_us
                if at > env.now:
                    yield env.timeout(at - env.now)
            release[k].succeed()

        def lane_worker(lane):
            for k in range(n_k):
                if not dispatch[k].triggered:
                    yield dispatch[k]
                while queues[k]:
                    t = queues[k].popleft()
                    t_in = env.now
                    pre = self.pre_B[t]
                    head = min(pre, head_B)
                    if head > 0 and not release[k].triggered:
                        yield from self._flow(head, cap, lane, t, idle=True)
                        pre -= head
                        if not release[k].triggered:
                            w = env.now
                            yield release[k]
                            self.lanes.add(lane, w, env.now, t, "dependency wait")
                    elif not release[k].triggered:
                        w = env.now
                        yield release[k]
                        self.lanes.add(lane, w, env.now, t, "dependency wait")
                    since = env.now
                    self.start[t] = since  # the dependent part starts here (PDL prologue before)
                    yield from self._flow(pre, cap, lane, t, idle=True)
                    yield from self._compute(t, lane, since)
                    self.lanes.add(lane, t_in, env.now, t, "task")
                    self._finish(t, lane)
                    left[k] -= 1
                    if left[k] == 0:
                        end_t[k] = env.now
                        done[k].succeed()

        env.process(launcher())
        for lane in range(self.n_lanes):
            env.process(lane_worker(lane))
        self.t0 = r.launch_latency_us
        self._chain_times = (start_t, end_t)

    # -- persistent modes -------------------------------------------------------------
    def _run_persistent(self):
        s, g, r, env = self.s, self.g, self.r, self.env
        n_sms = r.n_sms
        self.n_lanes = n_sms
        buf_B = int(s.options.prefetch_bytes)
        page_B = int(s.options.page_KiB * 1024)
        cap = r.sm_cap_Bpus
        barrier = s.mode == "persistent_barrier"
        data_ready: dict[int, simpy.Event] = {}
        exec_started: dict[int, simpy.Event] = {}
        self.t0 = r.launch_latency_us
        n_ops = len(g.ops)
        barrier_done = [env.event() for _ in range(n_ops)]

        def barriers():
            barrier_done[0].succeed()
            for j in range(1, n_ops):
                if self.op_done_n[j - 1] < g.n_tiles[j - 1]:
                    yield self._op_event(j - 1)
                yield env.timeout(r.grid_barrier_us)
                barrier_done[j].succeed()

        def loader(sm, q):
            yield env.timeout(self.t0)
            buf = simpy.Container(env, capacity=buf_B, init=buf_B) if buf_B > 0 else None
            last_end = -1.0
            for t in q:
                pre = self.pre_B[t]
                # shared memory is counted in whole bytes: float sums would overfill the pages
                head = min(math.ceil(pre), buf_B)
                got = 0
                while got < head:  # fill pages as they free up, as many at a time as are free
                    need = head - got
                    take = min(need, buf.level) if buf.level >= min(need, page_B) else min(need, page_B)
                    yield buf.get(take)
                    yield from self._flow(take, cap, -1 - sm, t, idle=env.now > last_end)
                    last_end = env.now
                    got += take
                body = pre - head
                if body > 0.5:
                    ev = exec_started[t]
                    if not ev.triggered:
                        yield ev
                    yield from self._flow(body, cap, -1 - sm, t, idle=env.now > last_end)
                    last_end = env.now
                data_ready[t].succeed((buf, head))

        def deps_ready(t):
            """Yield until ``t``'s producers are done and visible; return nothing."""
            ready = -1.0
            n_flags = 0
            for p, t0, t1 in g.deps(t):
                if t1 - t0 == g.n_tiles[p]:
                    if self.op_done_n[p] < t1 - t0:
                        yield self._op_event(p)
                    ready = max(ready, self.op_end[p])
                else:
                    base = int(g.op_first[p])
                    for k in range(base + t0, base + t1):
                        if np.isnan(self.end[k]):
                            yield self._task_event(k)
                    ready = max(ready, float(self.end[base + t0:base + t1].max()))
                n_flags += t1 - t0
            if ready < 0:
                return
            ready += r.flag_latency_us
            if s.options.sync == "flag":  # poll one flag per producer tile, 32 per warp round trip
                ready += math.ceil(n_flags / 32) * r.l2_latency_us
            if ready > env.now:
                yield env.timeout(ready - env.now)

        def executor(sm, q):
            yield env.timeout(self.t0)
            for t in q:
                w = env.now
                if barrier:
                    j = int(g.op_of[t])
                    if not barrier_done[j].triggered:
                        yield barrier_done[j]
                    self.lanes.add(sm, w, env.now, t, "barrier wait")
                else:
                    yield from deps_ready(t)
                    self.lanes.add(sm, w, env.now, t, "dependency wait")
                t_in = env.now
                self.start[t] = t_in
                exec_started[t].succeed()
                ev = data_ready[t]
                if not ev.triggered:
                    yield ev
                    self.lanes.add(sm, t_in, env.now, t, "data wait")
                since = env.now if self.pre_B[t] <= buf_B else t_in
                yield from self._compute(t, sm, since)
                buf, head = ev.value
                if head > 0:
                    yield buf.put(head)
                self.lanes.add(sm, t_in, env.now, t, "task")
                self._finish(t, sm)

        for t in range(len(g)):
            data_ready[t] = env.event()
            exec_started[t] = env.event()
        if barrier:
            env.process(barriers())
        for sm, q in enumerate(s.queues or []):
            env.process(loader(sm, q))
            env.process(executor(sm, q))

    # -- run and collect -----------------------------------------------------------------
    def run(self) -> None:
        if self.s.mode in ("stream", "graph", "graph_pdl"):
            self._run_chain()
        else:
            self._run_persistent()
        self.env.run()
        if np.isnan(self.end).any():
            stuck = [self.g.name(int(t)) for t in np.flatnonzero(np.isnan(self.end))[:3]]
            raise DeadlockError(f"simulation stopped with tasks never run (e.g. {', '.join(stuck)}); "
                                "the schedule deadlocks")

    def result(self) -> SimResult:
        spans = None
        if self.s.mode in ("stream", "graph", "graph_pdl"):
            start_t, end_t = self._chain_times
            spans = list(zip(start_t, end_t))
        return build_result(self.s, self.r, self.start, self.end, self.lane_of, self.lanes.segs, self.n_lanes,
                            self.t0, spans, self.hbm)


__all__ = ["simulate", "CATEGORIES"]
