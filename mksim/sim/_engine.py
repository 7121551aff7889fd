"""The discrete-event engine: SMs as SimPy processes over a shared HBM.

Processes only wait (timeouts, transfers, events); durations come from :mod:`._costs`.
Chain modes run kernels of blocks dispatched to SM slots; persistent modes run per-SM
queues with a loader (weight prefetch into shared-memory pages) and an executor.

The hot loops read plain Python lists rather than numpy arrays (a numpy scalar costs more
than the float it holds), pay a DRAM latency inside the transfer rather than as a separate
wait, and create an event only when a process really has to wait: a task whose pages are
free, whose data is loaded or whose executor has started goes on without one.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from mksim.errors import DeadlockError

if TYPE_CHECKING:
    from mksim.schedule import Schedule

from ._costs import flop_rate, host_issue_us, rates
from ._result import CATEGORIES, SimResult, build_result

CHAIN_MODES = ("stream", "graph", "graph_pdl")


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


class _SM:
    """What a persistent SM's loader and executor tell each other (and wait on)."""

    __slots__ = ("free_B", "want_B", "pages", "n_started", "start_for", "started", "n_loaded", "loaded",
                 "heads")

    def __init__(self, free_B: int):
        self.free_B = free_B     # free shared-memory page bytes
        self.want_B = 0          # bytes the loader waits to be freed (0: not waiting)
        self.pages = None        # event the loader waits on for pages
        self.n_started = 0       # queue positions the executor has started
        self.start_for = -1      # queue position whose start the loader waits for
        self.started = None     # event the loader waits on for that start
        self.n_loaded = 0        # queue positions whose data is in
        self.loaded = None       # event the executor waits on for its data
        self.heads: list[int] = []  # page bytes each loaded task holds


class _Engine:
    def __init__(self, s: Schedule):
        import simpy

        from ._hbm import HBM

        self.s = s
        self.g = s.graph
        self.r = rates(s.gpu)
        self.env = simpy.Environment()
        self.hbm = HBM(self.env, self.r.hbm_Bpus, record=s.options.record)
        g, r = self.g, self.r
        n = len(g)
        pre = g.weight_bytes + g.kv_read_bytes                   # DRAM, independent of activations
        l2_B = g.in_bytes + g.out_bytes + g.kv_write_bytes       # activations, through L2
        comp = np.empty(n)
        for i, op in enumerate(g.ops):
            a, b = int(g.op_first[i]), int(g.op_first[i + 1])
            f = g.flops[a:b]
            comp[a:b] = np.where(f > 0, f / flop_rate(op.unit, op.dtype, r), 0.0)  # compute_us, per op
        tail = np.maximum(comp, l2_B / r.l2_per_sm_Bpus)         # executor work once data is in
        # a task with nothing streamed from DRAM also pays the L2 read latency
        work = np.where(pre <= 0, tail + r.l2_latency_us, tail)
        self.pre_B: list[float] = pre.tolist()
        self.work_us: list[float] = work.tolist()
        self.op_of: list[int] = g.op_of.tolist()
        self.n_tiles: list[int] = g.n_tiles.tolist()
        self.op_first: list[int] = g.op_first.tolist()
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.lane_of = [-1] * n
        self.segs: list[tuple[int, float, float, int, str]] = []  # lane, start, end, task, category
        self.op_done_n = [0] * len(g.ops)
        self.op_end = [0.0] * len(g.ops)
        self.op_events: dict = {}
        self.task_events: dict = {}
        self.n_lanes = 0
        self.t0 = 0.0  # when the (first) kernel starts
        self._chain_times: tuple[list[float], list[float]] | None = None

    # -- shared helpers -------------------------------------------------------------------
    def _finish(self, t: int, lane: int) -> None:
        now = self.env.now
        self.end[t] = now
        self.lane_of[t] = lane
        p = self.op_of[t]
        self.op_done_n[p] += 1
        if now > self.op_end[p]:
            self.op_end[p] = now
        if self.task_events:
            ev = self.task_events.pop(t, None)
            if ev is not None:
                ev.succeed()
        if self.op_done_n[p] == self.n_tiles[p]:
            ev = self.op_events.pop(p, None)
            if ev is not None:
                ev.succeed()

    def _op_event(self, p: int):
        ev = self.op_events.get(p)
        if ev is None:
            ev = self.op_events[p] = self.env.event()
        return ev

    def _task_event(self, t: int):
        ev = self.task_events.get(t)
        if ev is None:
            ev = self.task_events[t] = self.env.event()
        return ev

    # -- chain modes ------------------------------------------------------------------
    def _run_chain(self):
        s, g, r, env = self.s, self.g, self.r, self.env
        slots = s.options.blocks_per_sm
        n_k = len(g.ops)
        self.n_lanes = r.n_sms * slots
        cap = r.sm_cap_Bpus / slots
        lat = r.dram_latency_us
        first = self.op_first
        queues = [deque(range(first[k], first[k + 1])) for k in range(n_k)]
        dispatch = [env.event() for _ in range(n_k)]   # blocks of kernel k may be placed
        release = [env.event() for _ in range(n_k)]    # PDL: dependent part may run
        done = [env.event() for _ in range(n_k)]
        left = list(self.n_tiles)
        start_t = [math.nan] * n_k
        end_t = [math.nan] * n_k
        pdl = s.mode == "graph_pdl"
        head_B = s.options.prefetch_bytes if pdl else 0.0
        pre_B, work_us, start, end, lane_of, segs = (self.pre_B, self.work_us, self.start, self.end,
                                                     self.lane_of, self.segs)
        transfer, timeout = self.hbm.transfer, env.timeout

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
                queue, rel = queues[k], release[k]
                while queue:
                    t = queue.popleft()
                    t_in = env.now
                    pre = pre_B[t]
                    if not rel.triggered:
                        head = min(pre, head_B)
                        if head > 0:  # PDL prologue: stream the first pages while the previous kernel runs
                            yield transfer(head, cap, lat)
                            _flow_segs(segs, lane, t_in, lat, env.now, t)
                            pre -= head
                        if not rel.triggered:
                            w = env.now
                            yield rel
                            segs.append((lane, w, env.now, t, "dependency wait"))
                    since = env.now
                    start[t] = since  # the dependent part starts here (PDL prologue before)
                    if pre > 0:
                        yield transfer(pre, cap, lat)
                        _flow_segs(segs, lane, since, lat, env.now, t)
                    rest = work_us[t] - (env.now - since)
                    if rest > 0:
                        t1 = env.now
                        yield timeout(rest)
                        segs.append((lane, t1, env.now, t, "compute"))
                    now = env.now
                    if now > t_in:
                        segs.append((lane, t_in, now, t, "task"))
                    end[t] = now
                    lane_of[t] = lane
                    left[k] -= 1
                    if left[k] == 0:
                        end_t[k] = now
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
        lat = r.dram_latency_us
        barrier = s.mode == "persistent_barrier"
        flag_sync = s.options.sync == "flag"
        self.t0 = r.launch_latency_us
        n_ops = len(g.ops)
        barrier_done = [env.event() for _ in range(n_ops)]
        pre_B, work_us, start, end, segs = self.pre_B, self.work_us, self.start, self.end, self.segs
        op_of, n_tiles, op_first, op_done_n, op_end = (self.op_of, self.n_tiles, self.op_first, self.op_done_n,
                                                       self.op_end)
        deps_of = g.deps
        transfer, timeout, event = self.hbm.transfer, env.timeout, env.event
        op_event, task_event, finish = self._op_event, self._task_event, self._finish

        def barriers():
            barrier_done[0].succeed()
            for j in range(1, n_ops):
                if op_done_n[j - 1] < n_tiles[j - 1]:
                    yield op_event(j - 1)
                yield env.timeout(r.grid_barrier_us)
                barrier_done[j].succeed()

        def loader(sm, q, st):
            yield env.timeout(self.t0)
            lane = -1 - sm
            last_end = -1.0
            for i, t in enumerate(q):
                pre = pre_B[t]
                # shared memory is counted in whole bytes: float sums would overfill the pages
                head = min(math.ceil(pre), buf_B)
                got = 0
                while got < head:  # fill pages as they free up, as many at a time as are free
                    need = head - got
                    least = min(need, page_B)
                    take = min(need, st.free_B) if st.free_B >= least else least
                    if st.free_B >= take:
                        st.free_B -= take
                    else:  # the executor hands the pages over when it frees them
                        st.want_B, st.pages = take, event()
                        yield st.pages
                    a = env.now
                    d = lat if a > last_end else 0.0
                    yield transfer(take, cap, d)
                    last_end = env.now
                    _flow_segs(segs, lane, a, d, last_end, t)
                    got += take
                st.heads.append(head)
                body = pre - head
                if body > 0.5:  # the rest streams once the executor has started the task
                    if st.n_started <= i:
                        st.start_for, st.started = i, event()
                        yield st.started
                    a = env.now
                    d = lat if a > last_end else 0.0
                    yield transfer(body, cap, d)
                    last_end = env.now
                    _flow_segs(segs, lane, a, d, last_end, t)
                st.n_loaded = i + 1
                if st.loaded is not None:
                    ev, st.loaded = st.loaded, None
                    ev.succeed()

        def executor(sm, q, st):
            yield env.timeout(self.t0)
            for i, t in enumerate(q):
                w = env.now
                if barrier:
                    j = op_of[t]
                    if not barrier_done[j].triggered:
                        yield barrier_done[j]
                    if env.now > w:
                        segs.append((sm, w, env.now, t, "barrier wait"))
                else:  # producers done and visible
                    ready = -1.0
                    n_flags = 0
                    for p, a, b in deps_of(t):
                        if b - a == n_tiles[p]:
                            if op_done_n[p] < b - a:
                                yield op_event(p)
                            e = op_end[p]
                        else:
                            base = op_first[p]
                            for k in range(base + a, base + b):
                                if end[k] != end[k]:  # NaN: not done
                                    yield task_event(k)
                            e = max(end[base + a:base + b])
                        if e > ready:
                            ready = e
                        n_flags += b - a
                    if ready >= 0:
                        ready += r.flag_latency_us
                        if flag_sync:  # poll one flag per producer tile, 32 per warp round trip
                            ready += math.ceil(n_flags / 32) * r.l2_latency_us
                        if ready > env.now:
                            yield timeout(ready - env.now)
                    if env.now > w:
                        segs.append((sm, w, env.now, t, "dependency wait"))
                t_in = env.now
                start[t] = t_in
                st.n_started = i + 1
                if st.start_for == i:
                    ev, st.started, st.start_for = st.started, None, -1
                    ev.succeed()
                if st.n_loaded <= i:
                    st.loaded = event()
                    yield st.loaded
                    if env.now > t_in:
                        segs.append((sm, t_in, env.now, t, "data wait"))
                since = env.now if pre_B[t] <= buf_B else t_in
                rest = work_us[t] - (env.now - since)
                if rest > 0:
                    t1 = env.now
                    yield timeout(rest)
                    segs.append((sm, t1, env.now, t, "compute"))
                head = st.heads[i]
                if head > 0:
                    st.free_B += head
                    if st.want_B and st.free_B >= st.want_B:
                        st.free_B -= st.want_B
                        st.want_B = 0
                        ev, st.pages = st.pages, None
                        ev.succeed()
                if env.now > t_in:
                    segs.append((sm, t_in, env.now, t, "task"))
                finish(t, sm)

        if barrier:
            env.process(barriers())
        for sm, q in enumerate(s.queues or []):
            st = _SM(buf_B)
            env.process(loader(sm, q, st))
            env.process(executor(sm, q, st))

    # -- run and collect -----------------------------------------------------------------
    def run(self) -> None:
        if self.s.mode in CHAIN_MODES:
            self._run_chain()
        else:
            self._run_persistent()
        self.env.run()
        end = np.asarray(self.end)
        if np.isnan(end).any():
            stuck = [self.g.name(int(t)) for t in np.flatnonzero(np.isnan(end))[:3]]
            raise DeadlockError(f"simulation stopped with tasks never run (e.g. {', '.join(stuck)}); "
                                "the schedule deadlocks")

    def result(self) -> SimResult:
        spans = None
        if self._chain_times is not None:
            start_t, end_t = self._chain_times
            spans = list(zip(start_t, end_t))
        return build_result(self.s, self.r, np.asarray(self.start), np.asarray(self.end),
                            np.asarray(self.lane_of, dtype=np.int64), self.segs, self.n_lanes, self.t0, spans,
                            self.hbm)


def _flow_segs(segs: list, lane: int, a: float, lat: float, b: float, t: int) -> None:
    """Record a transfer started at ``a`` that paid ``lat`` of first-byte latency and ended at ``b``."""
    if lat > 0:
        segs.append((lane, a, a + lat, t, "bubble"))
        a = a + lat
    if b > a:
        segs.append((lane, a, b, t, "memory"))


__all__ = ["simulate", "CATEGORIES"]
