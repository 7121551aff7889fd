"""The discrete-event engine: SMs over a shared HBM, on a SimPy environment.

Durations come from :mod:`mksim.costs`, what differs between modes from their hooks
(:mod:`mksim.schedule`). Chain modes run kernels of blocks dispatched to SM
slots; persistent modes run per-SM queues with a loader (weight prefetch into shared-memory
pages) and an executor. The launcher, the grid barriers and the executors are SimPy
processes; the block slots and the loaders, which wait several times per task, are state
machines called back by the HBM and by events (:mod:`._actors`).

For speed the hot loops read plain Python lists rather than numpy arrays (a numpy scalar
costs more than the float it holds), a flow's DRAM latency is waited out inside the HBM, and
an event is made only when something really has to wait.
"""

from __future__ import annotations

import math

import numpy as np
import simpy

from mksim import costs
from mksim.costs import (
    block_dram_cap_Bpus,
    copy_issue_Bpus,
    die_of_sm,
    dispatch_times_us,
    rates,
    seen_on_die_us,
)
from mksim.errors import DeadlockError
from mksim.schedule import (
    ChainMode,
    PersistentMode,
    Schedule,
    active_designs,
    dispatch_layout,
    gc_paused,
    get_mode,
    get_sync,
)

from ._actors import Chain, L2Prefetch, Loader, Signal, stream_bytes
from ._dies import die_traffic
from ._hbm import HBM
from ._result import CATEGORIES, SimResult, Timeline, build_result


def simulate(schedule: Schedule, timeline: bool = True) -> SimResult:
    """Run ``schedule`` and return its :class:`SimResult` (latency in µs, breakdown, timeline).

    With ``timeline=False`` the per-SM segments and task names are not recorded (``timeline`` and
    ``task_names`` of the result are empty): what a caller that needs only the latency, the
    breakdown and the per-op times saves; every number is the same.

    Example::

        >>> import mksim
        >>> res = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200", "graph"))
        >>> res.latency_us > res.bandwidth_floor_us
        True
    """
    if not schedule.is_validated():
        schedule.validate()
    with gc_paused():
        eng = _Engine(schedule, timeline=timeline)
        eng.run()
        return eng.result()


class _Engine:
    def __init__(self, s: Schedule, timeline: bool = True):
        self.s = s
        self.g = s.graph
        self.r = rates(s.gpu)
        self.mode = get_mode(s.mode)
        self.designs = {d.name for d in active_designs(s.mode, s.options)}
        self.env = simpy.Environment()
        r0 = self.r
        knee = (lambda demand: costs.loaded_total_Bpus(demand, r0)) if r0.queue_us > 0 else None
        self.hbm = HBM(self.env, self.r.hbm_Bpus, record=s.options.record or timeline,  # the trace's counter
                       knee=knee)
        g, r = self.g, self.r
        n = len(g)
        chain = isinstance(self.mode, ChainMode)
        self.native = "movement" in self.designs
        # the cost model's per-task times (mksim.costs.task_times): the engine only waits them out
        tt = costs.task_times(g, r, blocks_per_sm=s.options.blocks_per_sm if chain else 1,
                              page_KiB=s.options.page_KiB, native=self.native, ring_depth=s.options.prefetch_depth)
        self.on_device = tt.on_device
        self.pre_B: list[float] = tt.pre_B.tolist()
        self.work_us: list[float] = tt.work_us.tolist()
        self.tail_us: list[float] = tt.tail_us.tolist()
        # device tasks: their work without the measured cold start, counted from their first bytes
        self.warm_us: list[float] | None = tt.warm_us.tolist() if tt.warm_us is not None else None
        self.first_in = [math.nan] * n  # when each task's first bytes are in (its first flow's latency paid)
        self.op_of: list[int] = g.op_of.tolist()
        self.n_tiles: list[int] = g.n_tiles.tolist()
        self.op_first: list[int] = g.op_first.tolist()
        self.start = [math.nan] * n
        self.end = [math.nan] * n
        self.lane_of = [-1] * n
        self.timeline = Timeline(segments=timeline)
        self.op_done_n = [0] * len(g.ops)
        self.op_end = [0.0] * len(g.ops)
        self.op_events: dict[int, Signal] = {}
        self.task_events: dict[int, Signal] = {}
        self.visible_us = 0.0  # from a producer's end to its consumers seeing it
        self.n_lanes = 0
        self.t0 = 0.0  # when the (first) kernel starts
        self._chain_times: tuple[list[float], list[float]] | None = None
        self.dispatch_lanes: tuple[int, int] | None = None  # dynamic dispatch: the scheduler SMs' lanes
        # dies design: each lane's die, and each op's latest end on each die
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
        if self.op_end_die is not None and self.die_of_lane is not None:
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
    def _run_chain(self, mode: ChainMode):
        s, g, r, env = self.s, self.g, self.r, self.env
        slots = s.options.blocks_per_sm
        n_k = len(g.ops)
        self.n_lanes = r.n_sms * slots
        # an SM's bytes in flight are shared by the blocks of a kernel resident on it: one each
        # where the kernel has no more blocks than SMs (they spread over the SMs first)
        cap = [block_dram_cap_Bpus(int(b), slots, r, r.device[op.kind].inflight_B if op.kind in r.device else math.inf)
               for b, op in zip(g.n_tiles, g.ops, strict=True)]
        # a profile's device functions stream through a page ring: one pipeline per block
        ring = costs.ring_cap_Bpus(s.options.page_KiB * 1024, r)
        if ring < math.inf:
            cap = [min(c, ring) if op.kind in r.device else c for c, op in zip(cap, g.ops, strict=True)]
        dispatch = [env.event() for _ in range(n_k)]   # blocks of kernel k may be placed
        release = [env.event() for _ in range(n_k)]    # dependent part may run (PDL: later than dispatch)
        done = [env.event() for _ in range(n_k)]
        after = mode.dispatch_after(s.options)         # what of kernel k - 1 the launcher waits for
        start_t = [math.nan] * n_k
        end_t = [math.nan] * n_k
        released_at = [math.inf] * n_k                   # set as release[k] triggers
        separate = mode.separate_release
        head_B = mode.prologue_B(s.options) if separate else 0.0

        def launcher():
            for k in range(n_k):
                prev_end = math.nan
                if k > 0 and after == "end":
                    if not done[k - 1].triggered:
                        yield done[k - 1]
                    prev_end = end_t[k - 1]
                at = mode.dispatch_us(k, start_t[k - 1] if k else math.nan, prev_end, r)
                if at > env.now:
                    yield env.timeout(at - env.now)
                start_t[k] = env.now
                dispatch[k].succeed()
                if separate:
                    env.process(releaser(k))
                else:
                    released_at[k] = env.now
                    release[k].succeed()

        def releaser(k):
            if k > 0:
                if not done[k - 1].triggered:
                    yield done[k - 1]
                at = mode.release_us(k, end_t[k - 1], r)
                if at > env.now:
                    yield env.timeout(at - env.now)
            released_at[k] = env.now
            release[k].succeed()

        env.process(launcher())
        # the slots wake on dispatch
        Chain(self, self.n_lanes, dispatch, release, done, end_t, cap, head_B, released_at)
        self.t0 = r.launch_latency_us
        self._chain_times = (start_t, end_t)

    # -- persistent modes -------------------------------------------------------------
    def _run_persistent(self, mode: PersistentMode):
        s, g, r, env = self.s, self.g, self.r, self.env
        self.n_lanes = r.n_sms
        buf_B = int(s.options.prefetch_bytes)
        page_B = int(s.options.page_KiB * 1024)
        barrier = mode.waits_for == "barrier"
        sync = get_sync(s.options.sync)
        ready_after = sync.ready_us  # mksim.costs.sync_ready_us: when a task sees its last producer
        self.t0 = r.launch_latency_us
        # consumers wake when a producer becomes visible; a grid barrier has its own cost
        self.visible_us = 0.0 if barrier else sync.visible_us(r)
        dies = "dies" in self.designs and not barrier
        if dies:  # a producer on another die is seen cross_die_latency later
            die_end = self._die_view()
            die_of, lane_of = self.die_of_lane, self.lane_of
        dynamic = "dynamic" in self.designs
        prelaunched = dynamic and s.options.prelaunch > 0
        if dynamic:  # workers see their tasks when schedulers hand them out (_dispatcher)
            arrived, arrival = self._dispatcher()
        n_ops = len(g.ops)
        barrier_done = [env.event() for _ in range(n_ops)]
        pre_B, work_us, start, end, timeline = self.pre_B, self.work_us, self.start, self.end, self.timeline
        tail_us, warm_us, first_in, on_device = self.tail_us, self.warm_us, self.first_in, self.on_device.tolist()
        # work counts from the task's start where its bytes stream after it (more than the pages
        # hold) or a device function's fixed part overlaps the wait for them; else from its data
        from_start = ((np.asarray(pre_B) > buf_B) | self.on_device).tolist()
        op_of, n_tiles, op_first, op_done_n, op_end = (self.op_of, self.n_tiles, self.op_first, self.op_done_n,
                                                       self.op_end)
        deps_of = g.deps
        in_B = g.in_bytes.tolist()  # what a task reads of its producers: a sentinel's waiter polls it
        timeout, event, hbm = env.timeout, env.event, self.hbm
        op_signal, task_signal, finish = self._op_signal, self._task_signal, self._finish

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
                                e = max(seen_on_die_us(end[k], die_of[lane_of[k]], die_of[sm], r)
                                        for k in range(base + a, base + b))
                        if e > ready:
                            ready = e
                        n_flags += b - a
                    if ready >= 0:
                        ready = ready_after(ready, n_flags, r, in_B[t], hbm.rate_now)
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
                if warm_us is not None and on_device[t]:  # counted from its start and its first bytes
                    fi = first_in[t]
                    rest = warm_us[t] - (env.now - (fi if fi > t_in else t_in))
                else:
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
            env.process(self._barriers(barrier_done))
        # an op whose implementation profile says what its loads keep in flight draws that over the
        # stream latency (mksim.costs.block_dram_cap_Bpus, one block per SM)
        op_cap = [block_dram_cap_Bpus(r.n_sms, 1, r, r.device[op.kind].inflight_B) if op.kind in r.device
                  and r.device[op.kind].inflight_B < math.inf else math.inf for op in g.ops]
        lead_B = s.options.l2_prefetch_KiB * 1024  # an L2 prefetcher per SM ahead of its loader
        for sm, q in enumerate(s.queues or []):
            ld = Loader(self, sm, q, buf_B, page_B)
            if lead_B > 0:
                ld.pf = L2Prefetch(self, stream_bytes(pre_B, q, buf_B), lead_B, page_B)
            if any(c < math.inf for c in op_cap):
                ld.op_cap = op_cap
            if dynamic:  # a loader cannot stream a task's weights before the task is in its queue
                ld.gate = (arrived, self._gated)
            ring = costs.ring_cap_Bpus(page_B, r)
            if ring < ld.cap:  # the profile's ring: so many pages per bulk-copy time
                ld.cap = ring
            if self.native:  # one loader warp issues every copy: a pipeline starts a copy late, and no
                ld.issue_us = r.async_copy_issue_us  # faster than the copies are issued
                ld.cap = min(ld.cap, copy_issue_Bpus(r))
            env.timeout(self.t0).callbacks.append(ld.run)
            env.process(executor(sm, q, ld))

    def _barriers(self, barrier_done: list):
        """persistent_barrier: op ``j``'s tasks may start once every task of op ``j - 1`` is done
        and a grid barrier later."""
        env, n_tiles, op_done_n = self.env, self.n_tiles, self.op_done_n
        barrier_done[0].succeed()
        for j in range(1, len(barrier_done)):
            if op_done_n[j - 1] < n_tiles[j - 1]:
                yield self._op_signal(j - 1)
            yield env.timeout(self.r.grid_barrier_us + costs.sync_load_us(self.hbm.rate_now, self.r))
            barrier_done[j].succeed()

    def _die_view(self):
        """The dies design: note each lane's die and each op's latest end on each die (``_finish``
        keeps them); returns ``die_end(p, d)``, when op ``p``'s last task is visible on die ``d``
        (before the sync latency)."""
        r = self.r
        n_d = r.dies
        self.die_of_lane = [die_of_sm(sm, r.n_sms, n_d) for sm in range(r.n_sms)]
        self.op_end_die = op_end_die = [[-math.inf] * n_d for _ in self.g.ops]

        def die_end(p: int, d: int) -> float:
            return max(seen_on_die_us(v, e, d, r) for e, v in enumerate(op_end_die[p]))
        return die_end

    def _dispatcher(self) -> tuple[bytearray, object]:
        """Dynamic dispatch (MPK): each op's tasks wait for one event, fired by the last of their
        producers; the scheduler warps that own the tasks' worker SMs see it and hand the tasks out
        one by one (:func:`~mksim.costs.dispatch_times_us`). Returns the tasks that have
        arrived and a function giving the signal of a task's arrival."""
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

                def arrive(_e: object, t: int = t) -> None:
                    self._arrive(t, arrived)
                ev.callbacks.append(arrive)
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
                for t, a_us in zip(ts, times, strict=True):
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
        if isinstance(self.mode, ChainMode):
            self._run_chain(self.mode)
        elif isinstance(self.mode, PersistentMode):
            self._run_persistent(self.mode)
        else:
            raise TypeError(f"mode {self.mode.name} is neither a ChainMode nor a PersistentMode")
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
            spans = list(zip(start_t, end_t, strict=True))
        die_stats = None
        if self.die_of_lane is not None:
            die_stats = die_traffic(self.g, self.lane_of, self.r.n_sms, self.r.dies)
        return build_result(self.s, self.r, np.asarray(self.start), np.asarray(self.end),
                            np.asarray(self.lane_of, dtype=np.int64), self.timeline, self.n_lanes, self.t0, spans,
                            self.hbm, die_stats=die_stats, names=self.timeline.segments)


__all__ = ["CATEGORIES", "simulate"]
