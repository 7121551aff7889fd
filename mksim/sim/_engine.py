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

import gc
import math
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import numpy as np
from simpy.core import NORMAL
from simpy.events import Event

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
    if schedule.__dict__.get(_VALID_AS) != _as_validated(schedule):
        schedule.validate()
    with gc_paused():
        eng = _Engine(schedule)
        eng.run()
        return eng.result()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off Python's cycle collector. A run allocates a few objects per task that reference
    counting frees at once; the collector would still walk the whole (growing) heap every few
    ten thousand of them, and wall time would grow faster than the number of tasks."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_VALID_AS = "_mksim_valid_as"


def mark_validated(schedule: Schedule) -> Schedule:
    """Note that ``schedule`` passed :meth:`Schedule.validate` as it is now, so that
    :func:`simulate` need not walk its queues for deadlocks again; any change to what
    ``validate`` reads (mode, options, GPU, graph, queues) makes ``simulate`` check anew."""
    schedule.__dict__[_VALID_AS] = _as_validated(schedule)
    return schedule


def _as_validated(s: Schedule) -> tuple:
    queues = None if s.queues is None else tuple(map(tuple, s.queues))
    return (s.mode, s.options, _Same(s.gpu), _Same(s.graph), queues)


class _Same:
    """Compares equal to a wrapper of the very same object (GPUs and graphs are big)."""

    __slots__ = ("obj",)

    def __init__(self, obj: object):
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


_NEW, _HEAD, _BODY, _IN = range(4)  # where a loader is with its current task


class _Lanes:
    """Per-lane record of what each stretch of time was spent on (the timeline), and each
    category's total over the SM lanes (the breakdown), kept as the stretches are recorded."""

    def __init__(self) -> None:
        self.segs: list[tuple[int, float, float, int, str]] = []  # lane, start, end, task, category
        self.us = dict.fromkeys(CATEGORIES, 0.0)

    def add(self, lane: int, a: float, b: float, t: int, cat: str) -> None:
        if b > a:
            self.segs.append((lane, a, b, t, cat))
            self.us[cat] += b - a

    def task(self, lane: int, a: float, b: float, t: int) -> None:
        if b > a:
            self.segs.append((lane, a, b, t, "task"))

    def flow(self, lane: int, a: float, lat: float, b: float, t: int, count: bool = True) -> None:
        """A transfer started at ``a`` that paid ``lat`` of first-byte latency and ended at ``b``;
        ``count=False`` for a loader, whose time counts only through its executor's waits."""
        if lat > 0:
            self.segs.append((lane, a, a + lat, t, "bubble"))
            if count:
                self.us["bubble"] += lat
            a = a + lat
        if b > a:
            self.segs.append((lane, a, b, t, "memory"))
            if count:
                self.us["memory"] += b - a

    def data_wait(self, lane: int, a: float, b: float, t: int, bubbles: list[tuple[float, float]]) -> None:
        """The executor waited on its loader: bubble where the loader was, memory otherwise."""
        if b > a:
            self.segs.append((lane, a, b, t, "data wait"))
            bub = sum(max(0.0, min(b, y) - max(a, x)) for x, y in bubbles)
            self.us["bubble"] += bub
            self.us["memory"] += (b - a) - bub


class _Signal(Event):
    """An event its trigger can schedule for later: a producer's finish, visible after the
    flag latency, wakes every consumer at that instant without a timeout each."""

    def succeed_after(self, delay_us: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, NORMAL, delay_us)


class _Loader:
    """One SM's loader: walks the SM's queue, fills free shared-memory pages with each task's
    first bytes, and streams the rest of a bigger task once the executor has started it.

    It waits on only three things — a DRAM flow, pages freed by the executor, the executor
    starting the task — and each of them calls it back (:meth:`run`, :meth:`free`,
    :meth:`started`), so it is a small state machine rather than a SimPy process: a process
    would pay an event and a resume for each of its three or four steps per task.
    """

    __slots__ = ("env", "hbm", "q", "lane", "pre_B", "lanes", "buf_B", "page_B", "cap", "lat", "i", "phase",
                 "head", "got", "body", "free_B", "want_B", "n_started", "waits_start", "n_loaded", "loaded",
                 "heads", "bubbles", "last_end", "flow_a", "flow_d", "flow_n")

    def __init__(self, eng: _Engine, sm: int, q: list[int], buf_B: int, page_B: int):
        self.env, self.hbm, self.q = eng.env, eng.hbm, q
        self.lane = -1 - sm
        self.pre_B, self.lanes = eng.pre_B, eng.lanes
        self.buf_B, self.page_B = buf_B, page_B
        self.cap, self.lat = eng.r.sm_cap_Bpus, eng.r.dram_latency_us
        self.i = 0               # queue position being loaded
        self.phase = _NEW
        self.head = self.got = 0  # page bytes of the current task: wanted, streamed
        self.body = 0.0          # bytes streamed after the pages
        self.free_B = buf_B      # free page bytes
        self.want_B = 0          # page bytes waited for (0: not waiting)
        self.n_started = 0       # queue positions the executor has started
        self.waits_start = False
        self.n_loaded = 0        # queue positions whose data is in
        self.loaded: Event | None = None  # what the executor waits on for its data
        self.heads: list[int] = []        # page bytes each loaded task holds
        self.bubbles: list[tuple[float, float]] = []  # DRAM-latency bubbles of the current task
        self.last_end = -1.0     # when the last flow ended: later starts pay the DRAM latency
        self.flow_a = self.flow_d = 0.0
        self.flow_n = 0

    def run(self, _ev: object = None) -> None:
        """Load as far as possible; return when waiting for a flow, pages or the executor."""
        q = self.q
        while self.i < len(q):
            if self.phase == _NEW:
                # shared memory is counted in whole bytes: float sums would overfill the pages
                self.head = min(math.ceil(self.pre_B[q[self.i]]), self.buf_B)
                self.got = 0
                self.bubbles = []
                self.phase = _HEAD
            if self.phase == _HEAD:
                if self.got < self.head:  # fill pages as they free up, as many at a time as are free
                    need = self.head - self.got
                    least = min(need, self.page_B)
                    take = min(need, self.free_B) if self.free_B >= least else least
                    if self.free_B < take:
                        self.want_B = take  # free() hands them over
                        return
                    self.free_B -= take
                    self._flow(take)
                    return
                self.heads.append(self.head)
                self.body = self.pre_B[q[self.i]] - self.head
                self.phase = _BODY
            if self.phase == _BODY:
                if self.body > 0.5:  # the rest streams once the executor has started the task
                    if self.n_started <= self.i:
                        self.waits_start = True
                        return
                    self.phase = _IN
                    self._flow(self.body)
                    return
                self.phase = _IN
            self.i += 1
            self.n_loaded = self.i
            self.phase = _NEW
            if self.loaded is not None:
                ev, self.loaded = self.loaded, None
                ev.succeed(self.bubbles)

    def free(self, nbytes: int) -> None:
        """The executor freed ``nbytes`` of pages."""
        self.free_B += nbytes
        if self.want_B and self.free_B >= self.want_B:
            # one page is what the loader waited for; if the rest of the head is free too, it
            # would stream it the instant that page is in: one flow does both
            need = self.head - self.got
            take = need if self.free_B >= need else self.want_B
            self.want_B = 0
            self.free_B -= take
            self._flow(take)

    def started(self, i: int) -> None:
        """The executor started the task at queue position ``i``."""
        self.n_started = i + 1
        if self.waits_start and self.i == i:
            self.waits_start = False
            self.run()

    def _flow(self, nbytes: float) -> None:
        a = self.env.now
        self.flow_a, self.flow_d, self.flow_n = a, (self.lat if a > self.last_end else 0.0), nbytes
        self.hbm.start(nbytes, self.cap, self.flow_d, self._flowed)

    def _flowed(self) -> None:
        self.last_end = now = self.env.now
        a, d = self.flow_a, self.flow_d
        self.lanes.flow(self.lane, a, d, now, self.q[self.i], count=False)
        if d > 0:
            self.bubbles.append((a, a + d))
        if self.phase == _HEAD:
            self.got += self.flow_n
        self.run()


class _Chain:
    """What the block slots of a chain mode share: the kernels' queues and events, and the
    slots that wait for blocks.

    Kernels' queues drain in order, so every slot takes from the first queue that still has
    blocks, once that kernel is dispatched; a slot that finds none waits in a FIFO, and a
    dispatch wakes only as many slots as the kernel has blocks.
    """

    def __init__(self, eng: _Engine, queues: list[deque[int]], dispatch: list[Event], release: list[Event],
                 done: list[Event], end_t: list[float], cap: float, head_B: float):
        self.env, self.hbm, self.lanes = eng.env, eng.hbm, eng.lanes
        self.pre_B, self.work_us, self.start, self.end, self.lane_of = (eng.pre_B, eng.work_us, eng.start, eng.end,
                                                                        eng.lane_of)
        self.queues, self.dispatch, self.release, self.done = queues, dispatch, release, done
        self.left = list(eng.n_tiles)   # blocks of each kernel not yet finished
        self.end_t = end_t
        self.cap, self.lat, self.head_B = cap, eng.r.dram_latency_us, head_B
        self.k = 0                      # the first kernel with blocks not yet taken
        self.idle: deque[_Slot] = deque()
        for ev in dispatch:
            ev.callbacks.append(self._dispatched)

    def take(self) -> tuple[int, int] | None:
        """The next block ``(kernel, task)``, or None if none is dispatched."""
        while self.k < len(self.queues):
            if not self.dispatch[self.k].triggered:
                return None
            q = self.queues[self.k]
            if q:
                return self.k, q.popleft()
            self.k += 1
        return None

    def _dispatched(self, _ev: Event) -> None:
        while self.idle:
            kt = self.take()
            if kt is None:
                return
            self.idle.popleft().begin(*kt)


_TAKE, _PROLOGUE, _RELEASE, _RELEASED, _LOAD, _COMPUTE, _COMPUTED, _END = range(8)


class _Slot:
    """One block slot of an SM in a chain mode: takes the next block (or waits for a kernel's
    dispatch), streams its weights — under PDL the first pages before the previous kernel has
    ended — computes, and takes the next.

    Like :class:`_Loader` it is a state machine called back by the HBM and by events, not a
    process: :meth:`run` advances through the steps of a block until one has to wait.
    """

    __slots__ = ("ch", "lane", "k", "phase", "t", "t_in", "since", "pre", "w")

    def __init__(self, ch: _Chain, lane: int):
        self.ch, self.lane = ch, lane
        self.k = 0               # kernel whose blocks it takes
        self.phase = _TAKE
        self.t = -1              # the block (task) it runs
        self.t_in = self.since = self.w = 0.0  # taken, dependent part started, began waiting
        self.pre = 0.0           # DRAM bytes still to stream

    def begin(self, k: int, t: int) -> None:
        """Run block ``t`` of kernel ``k``."""
        self.k, self.t = k, t
        self.t_in = self.ch.env.now
        self.pre = self.ch.pre_B[t]
        self.phase = _PROLOGUE
        self.run()

    def run(self, _ev: object = None) -> None:
        ch, env = self.ch, self.ch.env
        while True:
            ph = self.phase
            if ph == _TAKE:
                kt = ch.take()
                if kt is None:
                    ch.idle.append(self)
                    return
                self.k, self.t = kt
                self.t_in = env.now
                self.pre = ch.pre_B[self.t]
                self.phase = _PROLOGUE
            elif ph == _PROLOGUE:
                self.phase = _RELEASE
                if not ch.release[self.k].triggered:
                    head = min(self.pre, ch.head_B)
                    if head > 0:  # PDL prologue: stream the first pages while the previous kernel runs
                        self.pre -= head
                        ch.hbm.start(head, ch.cap, ch.lat, self._prologue_in)
                        return
            elif ph == _RELEASE:
                rel = ch.release[self.k]
                if not rel.triggered:
                    self.w = env.now
                    self.phase = _RELEASED
                    rel.callbacks.append(self.run)
                    return
                self.phase = _LOAD
            elif ph == _RELEASED:
                ch.lanes.add(self.lane, self.w, env.now, self.t, "dependency wait")
                self.phase = _LOAD
            elif ph == _LOAD:
                self.since = env.now
                ch.start[self.t] = self.since  # the dependent part starts here (PDL prologue before)
                self.phase = _COMPUTE
                if self.pre > 0:
                    ch.hbm.start(self.pre, ch.cap, ch.lat, self._loaded)
                    return
            elif ph == _COMPUTE:
                rest = ch.work_us[self.t] - (env.now - self.since)
                if rest > 0:
                    self.w = env.now
                    self.phase = _COMPUTED
                    env.timeout(rest).callbacks.append(self.run)
                    return
                self.phase = _END
            elif ph == _COMPUTED:
                ch.lanes.add(self.lane, self.w, env.now, self.t, "compute")
                self.phase = _END
            else:  # _END
                now, t, k = env.now, self.t, self.k
                ch.lanes.task(self.lane, self.t_in, now, t)
                ch.end[t] = now
                ch.lane_of[t] = self.lane
                ch.left[k] -= 1
                if ch.left[k] == 0:
                    ch.end_t[k] = now
                    ch.done[k].succeed()
                self.phase = _TAKE

    def _prologue_in(self) -> None:
        self.ch.lanes.flow(self.lane, self.t_in, self.ch.lat, self.ch.env.now, self.t)
        self.run()

    def _loaded(self) -> None:
        self.ch.lanes.flow(self.lane, self.since, self.ch.lat, self.ch.env.now, self.t)
        self.run()


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
        self.lanes = _Lanes()
        self.op_done_n = [0] * len(g.ops)
        self.op_end = [0.0] * len(g.ops)
        self.op_events: dict[int, _Signal] = {}
        self.task_events: dict[int, _Signal] = {}
        self.visible_us = 0.0  # from a producer's end to its consumers seeing it
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
                ev.succeed_after(self.visible_us)
        if self.op_done_n[p] == self.n_tiles[p]:
            ev = self.op_events.pop(p, None)
            if ev is not None:
                ev.succeed_after(self.visible_us)

    def _op_signal(self, p: int) -> _Signal:
        """Fires when every task of op ``p`` is done and visible."""
        ev = self.op_events.get(p)
        if ev is None:
            ev = self.op_events[p] = _Signal(self.env)
        return ev

    def _task_signal(self, t: int) -> _Signal:
        """Fires when task ``t`` is done and visible."""
        ev = self.task_events.get(t)
        if ev is None:
            ev = self.task_events[t] = _Signal(self.env)
        return ev

    # -- chain modes ------------------------------------------------------------------
    def _run_chain(self):
        s, g, r, env = self.s, self.g, self.r, self.env
        slots = s.options.blocks_per_sm
        n_k = len(g.ops)
        self.n_lanes = r.n_sms * slots
        cap = r.sm_cap_Bpus / slots
        first = self.op_first
        queues = [deque(range(first[k], first[k + 1])) for k in range(n_k)]
        dispatch = [env.event() for _ in range(n_k)]   # blocks of kernel k may be placed
        release = [env.event() for _ in range(n_k)]    # PDL: dependent part may run
        done = [env.event() for _ in range(n_k)]
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

        env.process(launcher())
        chain = _Chain(self, queues, dispatch, release, done, end_t, cap, head_B)
        chain.idle.extend(_Slot(chain, lane) for lane in range(self.n_lanes))
        self.t0 = r.launch_latency_us
        self._chain_times = (start_t, end_t)

    # -- persistent modes -------------------------------------------------------------
    def _run_persistent(self):
        s, g, r, env = self.s, self.g, self.r, self.env
        self.n_lanes = r.n_sms
        buf_B = int(s.options.prefetch_bytes)
        page_B = int(s.options.page_KiB * 1024)
        barrier = s.mode == "persistent_barrier"
        flag_sync = s.options.sync == "flag"
        self.t0 = r.launch_latency_us
        # consumers wake when a producer becomes visible; a grid barrier has its own cost
        self.visible_us = 0.0 if barrier else r.flag_latency_us
        n_ops = len(g.ops)
        barrier_done = [env.event() for _ in range(n_ops)]
        pre_B, work_us, start, end, lanes = self.pre_B, self.work_us, self.start, self.end, self.lanes
        op_of, n_tiles, op_first, op_done_n, op_end = (self.op_of, self.n_tiles, self.op_first, self.op_done_n,
                                                       self.op_end)
        deps_of = g.deps
        timeout, event = env.timeout, env.event
        op_signal, task_signal, finish = self._op_signal, self._task_signal, self._finish

        def barriers():
            barrier_done[0].succeed()
            for j in range(1, n_ops):
                if op_done_n[j - 1] < n_tiles[j - 1]:
                    yield op_signal(j - 1)
                yield env.timeout(r.grid_barrier_us)
                barrier_done[j].succeed()

        def executor(sm, q, ld):
            yield env.timeout(self.t0)
            for i, t in enumerate(q):
                w = env.now
                if barrier:
                    j = op_of[t]
                    if not barrier_done[j].triggered:
                        yield barrier_done[j]
                    lanes.add(sm, w, env.now, t, "barrier wait")
                else:  # producers done and visible
                    ready = -1.0
                    n_flags = 0
                    for p, a, b in deps_of(t):
                        if b - a == n_tiles[p]:
                            if op_done_n[p] < b - a:
                                yield op_signal(p)
                            e = op_end[p]
                        else:
                            base = op_first[p]
                            for k in range(base + a, base + b):
                                if end[k] != end[k]:  # NaN: not done
                                    yield task_signal(k)
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
                    lanes.add(sm, w, env.now, t, "dependency wait")
                t_in = env.now
                start[t] = t_in
                ld.started(i)
                if ld.n_loaded <= i:
                    ld.loaded = ev = event()
                    bubbles = yield ev
                    lanes.data_wait(sm, t_in, env.now, t, bubbles)
                since = env.now if pre_B[t] <= buf_B else t_in
                rest = work_us[t] - (env.now - since)
                if rest > 0:
                    t1 = env.now
                    yield timeout(rest)
                    lanes.add(sm, t1, env.now, t, "compute")
                head = ld.heads[i]
                if head > 0:
                    ld.free(head)
                lanes.task(sm, t_in, env.now, t)
                finish(t, sm)

        if barrier:
            env.process(barriers())
        for sm, q in enumerate(s.queues or []):
            ld = _Loader(self, sm, q, buf_B, page_B)
            env.timeout(self.t0).callbacks.append(ld.run)
            env.process(executor(sm, q, ld))

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
                            np.asarray(self.lane_of, dtype=np.int64), self.lanes.segs, self.lanes.us, self.n_lanes,
                            self.t0, spans, self.hbm)


__all__ = ["CATEGORIES", "gc_paused", "mark_validated", "simulate"]
