"""The discrete-event engine: SMs over a shared HBM, on a SimPy environment.

Durations come from :mod:`._costs`. Chain modes run kernels of blocks dispatched to SM
slots; persistent modes run per-SM queues with a loader (weight prefetch into shared-memory
pages) and an executor. The launcher, the grid barriers and the executors are SimPy
processes; the block slots and the loaders, which wait several times per task, are state
machines called back by the HBM and by events (:mod:`._actors`).

For speed the hot loops read plain Python lists rather than numpy arrays (a numpy scalar
costs more than the float it holds), a flow's DRAM latency is waited out inside the HBM, and
an event is made only when something really has to wait.
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import numpy as np
import simpy

from mksim.errors import DeadlockError

if TYPE_CHECKING:
    from mksim.schedule import Schedule

from ._actors import Chain, Loader, Signal
from ._costs import copy_issue_Bpus, die_of_sm, device_task_us, dispatch_times_us, flop_rate, host_issue_us, rates, resident_blocks
from ._hbm import HBM
from ._result import CATEGORIES, SimResult, Timeline, build_result

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


class _Engine:
    def __init__(self, s: Schedule):
        self.s = s
        self.g = s.graph
        self.r = rates(s.gpu)
        self.env = simpy.Environment()
        self.hbm = HBM(self.env, self.r.hbm_Bpus, record=s.options.record)
        g, r = self.g, self.r
        n = len(g)
        pre = g.weight_bytes + g.kv_read_bytes                   # DRAM, independent of activations
        l2_B = g.in_bytes + g.out_bytes + g.kv_write_bytes       # activations, through L2
        native = s.options.movement == "native" and s.mode not in CHAIN_MODES
        if native and r.multicast > 1:  # a cluster's matvecs read their common input vector once
            in_B = g.in_bytes.copy()
            for i, op in enumerate(g.ops):
                if op.kind == "matmul":
                    in_B[int(g.op_first[i]):int(g.op_first[i + 1])] /= r.multicast
            l2_B = in_B + g.out_bytes + g.kv_write_bytes
        comp = np.empty(n)
        for i, op in enumerate(g.ops):
            a, b = int(g.op_first[i]), int(g.op_first[i + 1])
            f = g.flops[a:b]
            comp[a:b] = np.where(f > 0, f / flop_rate(op.unit, op.dtype, r), 0.0)  # compute_us, per op
        tail = np.maximum(comp, l2_B / r.l2_per_sm_Bpus)         # executor work once data is in
        # a task with nothing streamed from DRAM also pays the L2 read latency
        work = np.where(pre <= 0, tail + r.l2_latency_us, tail)
        # device-function costs ([runtime.kernels]): work counts from when the inputs are visible
        # and the last page's consumption follows its arrival (device_task_us)
        self.on_device = np.zeros(n, dtype=bool)
        consume_tail = np.zeros(n)
        if r.device:
            slots = s.options.blocks_per_sm if s.mode in CHAIN_MODES else 1
            page_B = s.options.page_KiB * 1024
            for i, op in enumerate(g.ops):
                cost = r.device.get(op.kind)
                if cost is None:
                    continue
                a, b = int(g.op_first[i]), int(g.op_first[i + 1])
                share = resident_blocks(int(g.n_tiles[i]), r.n_sms, slots)
                work[a:b], consume_tail[a:b] = device_task_us(work[a:b], pre[a:b], op.attrs.get("rows", g.workload.tokens),
                                                              cost, share, page_B)
                self.on_device[a:b] = True
        if native:  # a tensor-core task ends its MMA latency after its work and after its last bytes are
            for i, op in enumerate(g.ops):  # in (measured device costs include it already)
                if op.unit == "tensor":
                    a, b = int(g.op_first[i]), int(g.op_first[i + 1])
                    mma = np.where(self.on_device[a:b], 0.0, r.mma_latency_us)
                    work[a:b] += mma
                    consume_tail[a:b] += mma
        self.native = native
        self.pre_B: list[float] = pre.tolist()
        self.work_us: list[float] = work.tolist()
        self.tail_us: list[float] = consume_tail.tolist()
        self.op_of: list[int] = g.op_of.tolist()
        self.n_tiles: list[int] = g.n_tiles.tolist()
        self.op_first: list[int] = g.op_first.tolist()
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.lane_of = [-1] * n
        self.timeline = Timeline()
        self.op_done_n = [0] * len(g.ops)
        self.op_end = [0.0] * len(g.ops)
        self.op_events: dict[int, Signal] = {}
        self.task_events: dict[int, Signal] = {}
        self.visible_us = 0.0  # from a producer's end to its consumers seeing it
        self.n_lanes = 0
        self.t0 = 0.0  # when the (first) kernel starts
        self._chain_times: tuple[list[float], list[float]] | None = None
        self.dispatch_lanes: tuple[int, int] | None = None  # dynamic dispatch: the scheduler SMs' lanes
        # dies option: each lane's die, and each op's latest end on each die
        self.die_of_lane: list[int] | None = None
        self.op_end_die: list[list[float]] | None = None
        self._gate_wait: dict[int, Loader] = {}

    # -- shared helpers -------------------------------------------------------------------
    def _finish(self, t: int, lane: int) -> None:
        now = self.env.now
        self.end[t] = now
        self.lane_of[t] = lane
        p = self.op_of[t]
        self.op_done_n[p] += 1
        if now > self.op_end[p]:
            self.op_end[p] = now
        if self.op_end_die is not None:
            ends, d = self.op_end_die[p], self.die_of_lane[lane]
            if now > ends[d]:
                ends[d] = now
        if self.task_events:
            ev = self.task_events.pop(t, None)
            if ev is not None:
                ev.succeed_after(self.visible_us)
        if self.op_done_n[p] == self.n_tiles[p]:
            ev = self.op_events.pop(p, None)
            if ev is not None:
                ev.succeed_after(self.visible_us)

    def _op_signal(self, p: int) -> Signal:
        """Fires when every task of op ``p`` is done and visible."""
        ev = self.op_events.get(p)
        if ev is None:
            ev = self.op_events[p] = Signal(self.env)
        return ev

    def _task_signal(self, t: int) -> Signal:
        """Fires when task ``t`` is done and visible."""
        ev = self.task_events.get(t)
        if ev is None:
            ev = self.task_events[t] = Signal(self.env)
        return ev

    # -- chain modes ------------------------------------------------------------------
    def _run_chain(self):
        s, g, r, env = self.s, self.g, self.r, self.env
        slots = s.options.blocks_per_sm
        n_k = len(g.ops)
        self.n_lanes = r.n_sms * slots
        # an SM's bytes in flight are shared by the blocks of a kernel resident on it: one each
        # where the kernel has no more blocks than SMs (they spread over the SMs first)
        cap = [r.sm_cap_Bpus / resident_blocks(int(b), r.n_sms, slots) for b in g.n_tiles]
        dispatch = [env.event() for _ in range(n_k)]   # blocks of kernel k may be placed
        release = [env.event() for _ in range(n_k)]    # PDL: dependent part may run
        done = [env.event() for _ in range(n_k)]
        start_t = [math.nan] * n_k
        end_t = [math.nan] * n_k
        released_at = [math.inf] * n_k                   # set as release[k] triggers
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
                    at = end_t[k - 1] + (r.stream_gap_us if s.mode == "stream" else r.graph_node_us)
                if s.mode == "stream":
                    at = max(at, host_issue_us(k, "stream", r) + r.launch_latency_us)
                if at > env.now:
                    yield env.timeout(at - env.now)
                start_t[k] = env.now
                dispatch[k].succeed()
                if pdl:
                    env.process(releaser(k))
                else:
                    released_at[k] = env.now
                    release[k].succeed()

        def releaser(k):
            if k > 0:
                if not done[k - 1].triggered:
                    yield done[k - 1]
                at = end_t[k - 1] + r.pdl_node_us
                if at > env.now:
                    yield env.timeout(at - env.now)
            released_at[k] = env.now
            release[k].succeed()

        env.process(launcher())
        Chain(self, self.n_lanes, dispatch, release, done, end_t, cap, head_B, released_at)  # its slots wake on dispatch
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
        # a counter or flags are seen after the flag latency; data polled as its own flag (a sentinel)
        # after the sentinel latency
        sync_latency_us = r.sentinel_latency_us if s.options.sync == "sentinel" else r.flag_latency_us
        self.t0 = r.launch_latency_us
        # consumers wake when a producer becomes visible; a grid barrier has its own cost
        self.visible_us = 0.0 if barrier else sync_latency_us
        dies = s.options.dies and not barrier
        if dies:  # a producer on another die is seen cross_die_latency later
            n_d = r.dies
            self.die_of_lane = die_of = [die_of_sm(sm, r.n_sms, n_d) for sm in range(r.n_sms)]
            self.op_end_die = [[-math.inf] * n_d for _ in g.ops]
            xdie, lane_of, op_end_die = r.cross_die_latency_us, self.lane_of, self.op_end_die

            def die_end(p: int, d: int) -> float:
                """When op ``p``'s last task is visible on die ``d`` (before the sync latency)."""
                ends = op_end_die[p]
                m = ends[d]
                for e, v in enumerate(ends):
                    if e != d and v + xdie > m:
                        m = v + xdie
                return m
        dynamic = s.options.dispatch == "dynamic"
        prelaunched = dynamic and s.options.prelaunch > 0
        if dynamic:  # workers see their tasks when schedulers hand them out (_dispatcher)
            arrived, arrival = self._dispatcher()
        n_ops = len(g.ops)
        barrier_done = [env.event() for _ in range(n_ops)]
        pre_B, work_us, start, end, timeline = self.pre_B, self.work_us, self.start, self.end, self.timeline
        tail_us = self.tail_us
        # work counts from the task's start where its bytes stream after it (more than the pages
        # hold) or a device function's fixed part overlaps the wait for them; else from its data
        from_start = ((np.asarray(pre_B) > buf_B) | self.on_device).tolist()
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
                    timeline.add(sm, w, env.now, t, "barrier wait")
                elif dynamic and not prelaunched:  # its producers are done when a scheduler hands it over
                    if not arrived[t]:
                        yield arrival(t)
                    timeline.add(sm, w, env.now, t, "dependency wait")
                else:  # producers done and visible
                    if dynamic and not arrived[t]:  # handed over early: then wait for its event counter
                        yield arrival(t)
                    ready = -1.0
                    n_flags = 0
                    for p, a, b in deps_of(t):
                        if b - a == n_tiles[p]:
                            if op_done_n[p] < b - a:
                                yield op_signal(p)
                            e = op_end[p] if not dies else die_end(p, die_of[sm])
                        else:
                            base = op_first[p]
                            for k in range(base + a, base + b):
                                if end[k] != end[k]:  # NaN: not done
                                    yield task_signal(k)
                            if not dies:
                                e = max(end[base + a:base + b])
                            else:
                                e = max(end[k] + (xdie if die_of[lane_of[k]] != die_of[sm] else 0.0)
                                        for k in range(base + a, base + b))
                        if e > ready:
                            ready = e
                        n_flags += b - a
                    if ready >= 0:
                        ready += sync_latency_us
                        if flag_sync:  # poll one flag per producer tile, 32 per warp round trip
                            ready += math.ceil(n_flags / 32) * r.l2_latency_us
                        if ready > env.now:
                            yield timeout(ready - env.now)
                    timeline.add(sm, w, env.now, t, "dependency wait")
                t_in = env.now
                start[t] = t_in
                ld.started(i)
                if ld.n_loaded <= i:
                    ld.loaded = ev = event()
                    bubbles = yield ev
                    timeline.data_wait(sm, t_in, env.now, t, bubbles)
                rest = work_us[t] - (env.now - (t_in if from_start[t] else env.now))
                if rest < tail_us[t]:  # the last page is consumed after it is in
                    rest = tail_us[t]
                if rest > 0:
                    t1 = env.now
                    yield timeout(rest)
                    timeline.add(sm, t1, env.now, t, "compute")
                head = ld.heads[i]
                if head > 0:
                    ld.free(head)
                timeline.task(sm, t_in, env.now, t)
                finish(t, sm)

        if barrier:
            env.process(barriers())
        for sm, q in enumerate(s.queues or []):
            ld = Loader(self, sm, q, buf_B, page_B)
            if dynamic:  # a loader cannot stream a task's weights before the task is in its queue
                ld.gate = (arrived, self._gated)
            if self.native:  # one loader warp issues every copy: a pipeline starts a copy late, and no
                ld.issue_us = r.async_copy_issue_us  # faster than the copies are issued
                ld.cap = min(ld.cap, copy_issue_Bpus(r))
            env.timeout(self.t0).callbacks.append(ld.run)
            env.process(executor(sm, q, ld))

    def _dispatcher(self) -> tuple[bytearray, object]:
        """Dynamic dispatch (MPK): each op's tasks wait for one event, fired by the last of their
        producers; the scheduler warps that own the tasks' worker SMs see it and hand the tasks out
        one by one (:func:`~mksim.sim._costs.dispatch_times_us`). Returns the tasks that have
        arrived and a function giving the signal of a task's arrival."""
        from mksim.schedule import dispatch_layout

        s, g, r, env = self.s, self.g, self.r, self.env
        workers, n_sched, sched_sms = dispatch_layout(s.gpu, s.options.schedulers)
        self.dispatch_lanes = (workers, r.n_sms)  # scheduler SMs: no tasks, their time is dispatch
        sched_of_sm = [w * n_sched // workers for w in range(workers)] if workers else []
        sm_of = [0] * len(g)
        for sm, q in enumerate(s.queues or []):
            for t in q:
                sm_of[t] = sm
        arrived = bytearray(len(g))
        signals: dict[int, Signal] = {}
        free = [0.0] * n_sched
        op_first, n_tiles, op_done_n, op_end, end = self.op_first, self.n_tiles, self.op_done_n, self.op_end, self.end

        def arrival(t: int) -> Signal:
            ev = signals.get(t)
            if ev is None:
                ev = signals[t] = Signal(env)
                ev.callbacks.append(lambda _e, t=t: self._arrive(t, arrived))
            return ev

        def producers(j: int) -> dict[int, tuple[int, int]]:
            """The producer tile range each producer op of op ``j``'s tasks covers (one event)."""
            out: dict[int, tuple[int, int]] = {}
            for t in range(op_first[j], op_first[j + 1]):
                for p, a, b in g.deps(t):
                    lo, hi = out.get(p, (a, b))
                    out[p] = (min(lo, a), max(hi, b))
            return out

        prods = [producers(j) for j in range(len(g.ops))]

        def launchers(j: int, ahead: int) -> dict[int, tuple[int, int]]:
            """What op ``j``'s launch event waits for: its producers, or with ``ahead`` events of
            prelaunch, whole ops that many levels further up (nothing: handed out at the start)."""
            if ahead == 0:
                return prods[j]
            out: dict[int, tuple[int, int]] = {}
            for p in prods[j]:
                for q in launchers(p, ahead - 1):
                    out[q] = (0, n_tiles[q])
            return out

        ahead = s.options.prelaunch

        def dispatch(j: int):
            last = -1.0
            for p, (a, b) in launchers(j, ahead).items():
                if b - a == n_tiles[p]:
                    if op_done_n[p] < b - a:
                        yield self._op_signal(p)
                    e = op_end[p]
                else:
                    base = op_first[p]
                    for k in range(base + a, base + b):
                        if end[k] != end[k]:
                            yield self._task_signal(k)
                    e = max(end[base + a:base + b])
                if e > last:
                    last = e
            # the schedulers see the event; the first tasks (no producers) as the kernel starts
            seen = last + r.dispatch_event_us if last >= 0 else self.t0
            by_sched: dict[int, list[int]] = {}
            for t in range(op_first[j], op_first[j + 1]):
                by_sched.setdefault(sched_of_sm[sm_of[t]], []).append(t)
            now = env.now
            for sc, ts in by_sched.items():
                times, free[sc] = dispatch_times_us(seen, free[sc], len(ts), r)
                for t, a_us in zip(ts, times):
                    arrival(t).succeed_after(a_us - now)

        for j in range(len(g.ops)):
            env.process(dispatch(j))
        return arrived, arrival

    def _arrive(self, t: int, arrived: bytearray) -> None:
        arrived[t] = 1
        ld = self._gate_wait.pop(t, None)
        if ld is not None:
            ld.run()

    def _gated(self, t: int, loader: Loader) -> None:
        """``loader`` waits for task ``t`` to be handed to its SM."""
        self._gate_wait[t] = loader

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
        if self.dispatch_lanes is not None:  # scheduler SMs spend the kernel dispatching
            a, b = self.dispatch_lanes
            self.timeline.us["dependency wait"] += (float(np.max(end)) - self.t0) * (b - a)

    def result(self) -> SimResult:
        spans = None
        if self._chain_times is not None:
            start_t, end_t = self._chain_times
            spans = list(zip(start_t, end_t))
        die_stats = None
        if self.die_of_lane is not None:
            from ._dies import die_traffic

            die_stats = die_traffic(self.g, self.lane_of, self.r.n_sms, self.r.dies)
        return build_result(self.s, self.r, np.asarray(self.start), np.asarray(self.end),
                            np.asarray(self.lane_of, dtype=np.int64), self.timeline, self.n_lanes, self.t0, spans,
                            self.hbm, die_stats=die_stats)


__all__ = ["CATEGORIES", "gc_paused", "mark_validated", "simulate"]
