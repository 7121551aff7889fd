"""The discrete-event engine: SMs over a shared HBM, on a SimPy environment.

Durations come from :mod:`mksim.costs`, what differs between modes from their hooks
(:mod:`mksim.schedule`), what a megakernel design changes from its engine piece
(:mod:`mksim.sim._design_run`): the engine names no design and no sync. Chain modes run kernels of
blocks dispatched to SM
slots; persistent modes run per-SM queues with a loader (weight prefetch into shared-memory
pages) and an executor. The launcher and the grid barriers are SimPy processes
(:class:`~._env.Proc`, a lean one); the executors are coroutines that add themselves to what they
wait for (:meth:`~._env.Env.start`); the block slots and the loaders, which wait several times per
task, are coroutines called back by the HBM and by events (:mod:`._actors`).

For speed the hot loops read plain Python lists rather than numpy arrays (a numpy scalar
costs more than the float it holds), a flow's DRAM latency is waited out inside the HBM, an
event is made only when something really has to wait, and the engine's own waits are the
lightest events SimPy's loop can process (:class:`~._env.Wake`, in :class:`~._env.Env`), put in
its queue by the actors themselves. The hot loops inline the small helpers they would call per task
(each says which); those helpers stay the reference for what is recorded.
"""

from __future__ import annotations

import math

import numpy as np

from mksim import costs
from mksim.costs import block_dram_cap_Bpus, host_kind
from mksim.errors import DeadlockError, ScheduleError
from mksim.schedule import BaseSync, ChainMode, PersistentMode, Schedule, active_designs, gc_paused, get_mode, get_sync
from mksim.workload import kernel_of

from . import designs as _pieces  # noqa: F401  (registers every design's engine piece)
from ._actors import Chain, L2Prefetch, Loader, Signal, address_gates, stream_bytes
from ._design_run import RUNS, DesignRun, Handover, Seen, overrides
from ._env import Env, Proc
from ._hbm import HBM
from ._result import CATEGORIES, SimResult, Timeline, build_result


def simulate(schedule: Schedule, timeline: bool = True) -> SimResult:
    """Run ``schedule`` and return its :class:`SimResult` (latency in µs, breakdown, timeline).

    With ``timeline=False`` the per-SM segments and task names are not recorded (``timeline`` and
    ``task_names`` of the result are empty): what a caller that needs only the latency, the
    breakdown and the per-op times saves; every number is the same.

    Example::

        >>> import mksim
        >>> res = mksim.simulate(mksim.build_schedule("llama-3.2-1b", "h200-datasheet", "graph"))
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
        self.r = s.rates
        self.mode = get_mode(s.mode)
        # the engine pieces of the designs that are on (mksim.sim.designs), in registration order
        self.pieces: dict[str, DesignRun] = {d.name: RUNS[d.name](self) for d in active_designs(s.mode, s.options)
                                             if d.name in RUNS}
        self.env = Env()
        r0 = self.r
        knee = (lambda demand: costs.loaded_total_Bpus(demand, r0)) if r0.queue_us > 0 else None
        self.hbm = HBM(self.env, self.r.hbm_Bpus, record=s.options.record or timeline,  # the trace's counter
                       knee=knee)
        g, r = self.g, self.r
        n = len(g)
        chain = isinstance(self.mode, ChainMode)
        # a collective op runs as the mode runs it (a library kernel, or in the megakernel), or as chosen
        times_kw: dict = {"collective": s.options.collective or self.mode.collective}
        for piece in self.pieces.values():
            times_kw |= piece.task_times_options()
        # the cost model's per-task times (mksim.costs.task_times): the engine only waits them out
        tt = costs.task_times(g, r, blocks_per_sm=s.options.blocks_per_sm if chain else 1,
                              page_KiB=s.options.page_KiB, ring_depth=s.options.prefetch_depth, **times_kw)
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
        self.in_B: list[float] = g.in_bytes.tolist()
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
        # per finished task: the pieces that follow tasks (their own `finished`)
        self._finished = tuple(p.finished for p in self.pieces.values() if overrides(p, "finished"))
        self._handover: Handover | None = None  # persistent modes: set as the run starts
        self._seen: Seen | None = None
        # the sync's last answer: [producers' last end, flags, bytes polled, chip's draw, when the consumer sees them]
        self._ready_memo: list[float] = [math.nan] * 5

    # -- shared helpers -------------------------------------------------------------------
    def op_signal(self, p: int) -> Signal:
        """Fires when every task of op ``p`` is done and visible."""
        ev = self.op_events.get(p)
        if ev is None:
            ev = self.op_events[p] = Signal(self.env)
        return ev

    def op_seen_at(self, p: int) -> float | Signal:
        """When op ``p``'s end is visible (its last task's end + the sync's latency), or, while it
        runs, the signal that fires then."""
        if self.op_done_n[p] < self.n_tiles[p]:
            return self.op_signal(p)
        return self.op_end[p] + self.visible_us

    def task_signal(self, t: int) -> Signal:
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
        host_at = None
        if r.host_bound:   # a stack's own host costs (an implementation profile's): kernels wait for the host
            by_name = {op.name: op for op in g.ops}
            ops_of = [kernel_of(op) for op in g.ops]
            host_at = mode.host_ready_us([host_kind(by_name.get(o, op)) for o, op in zip(ops_of, g.ops, strict=True)],
                                         ops_of, r)

        def launcher():
            for k in range(n_k):
                prev_end = math.nan
                if k > 0 and after == "end":
                    if not done[k - 1].triggered:
                        yield done[k - 1]
                    prev_end = end_t[k - 1]
                at = mode.dispatch_us(k, start_t[k - 1] if k else math.nan, prev_end, r)
                if host_at is not None and host_at[k] + r.launch_latency_us > at:
                    at = host_at[k] + r.launch_latency_us
                if at > env.now:
                    yield env.timeout(at - env.now)
                start_t[k] = env.now
                dispatch[k].succeed()
                if separate:
                    Proc(env, releaser(k))
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

        Proc(env, launcher())
        # the slots wake on dispatch
        Chain(self, self.n_lanes, dispatch, release, done, start_t, end_t, cap, head_B, released_at)
        self.t0 = r.launch_latency_us
        self._chain_times = (start_t, end_t)

    # -- persistent modes -------------------------------------------------------------
    def _run_persistent(self, mode: PersistentMode):
        """One launch; then each SM's loader streams its queue's data while its executor runs the
        tasks, each after what the mode waits for (a grid barrier, or its producers as the sync and
        the designs' pieces see them)."""
        r = self.r
        self.n_lanes = r.n_sms
        self.t0 = r.launch_latency_us
        barrier = mode.waits_for == "barrier"
        sync = get_sync(self.s.options.sync)
        # consumers wake when a producer becomes visible; a grid barrier has its own cost
        self.visible_us = 0.0 if barrier else sync.visible_us(r)
        for piece in self.pieces.values():
            piece.setup()
        # what the designs change in the executors: tasks handed over by schedulers, producers seen late
        self._handover = self._one("handover")
        self._seen = self._one("seen")
        barrier_done = self._barriers() if barrier else None
        self._start_sms(barrier_done, sync)

    def _one(self, hook: str):
        """What the one design that is on and changes ``hook`` gives (``None``: none does)."""
        got = [(name, v) for name, p in self.pieces.items() if (v := getattr(p, hook)()) is not None]
        if len(got) > 1:
            raise ScheduleError(f"designs {got[0][0]} and {got[1][0]} both change the executors' {hook}; turn one "
                                "off")
        return got[0][1] if got else None

    def _barriers(self) -> list:
        """persistent_barrier: op ``j``'s tasks may start once every task of op ``j - 1`` is done
        and a grid barrier later. Returns the events that say so, one per op."""
        env, n_tiles, op_done_n = self.env, self.n_tiles, self.op_done_n
        barrier_done = [env.event() for _ in self.g.ops]

        def barriers():
            barrier_done[0].succeed()
            for j in range(1, len(barrier_done)):
                if op_done_n[j - 1] < n_tiles[j - 1]:
                    yield self.op_signal(j - 1)
                yield env.timeout(self.r.grid_barrier_us + costs.sync_load_us(self.hbm.rate_now, self.r))
                barrier_done[j].succeed()
        Proc(env, barriers())
        return barrier_done

    def _start_sms(self, barrier_done: list | None, sync: BaseSync) -> None:
        """Each SM's loader (its pages, caps, L2 prefetcher, and what the designs add) and executor,
        both starting after the launch."""
        s, g, r, env = self.s, self.g, self.r, self.env
        buf_B = int(s.options.prefetch_bytes)
        page_B = int(s.options.page_KiB * 1024)
        # an op whose implementation profile says what its loads keep in flight draws that over the
        # stream latency (mksim.costs.block_dram_cap_Bpus, one block per SM)
        op_cap = [block_dram_cap_Bpus(r.n_sms, 1, r, r.device[op.kind].inflight_B) if op.kind in r.device
                  and r.device[op.kind].inflight_B < math.inf else math.inf for op in g.ops]
        lead_B = s.options.l2_prefetch_KiB * 1024  # an L2 prefetcher per SM ahead of its loader
        ring = costs.ring_cap_Bpus(page_B, r)  # the profile's ring: so many pages per bulk-copy time
        # work counts from the task's start where its bytes stream after it (more than the pages
        # hold) or a device function's fixed part overlaps the wait for them; else from its data
        from_start = ((np.asarray(self.pre_B) > buf_B) | self.on_device).tolist()
        on_device = self.on_device.tolist()  # once: the executors share these lists
        capped = any(c < math.inf for c in op_cap)
        gates = address_gates(g)  # expert weights: their address known once the layer's top-k is seen
        addr = (gates, self.op_seen_at) if gates is not None else None
        for sm, q in enumerate(s.queues or []):
            ld = Loader(self, sm, q, buf_B, page_B)
            if lead_B > 0:
                ld.pf = L2Prefetch(self, stream_bytes(self.pre_B, q, buf_B), lead_B, page_B)
            if capped:
                ld.op_cap = op_cap
            if ring < ld.cap:
                ld.cap = ring
            ld.addr = addr
            for piece in self.pieces.values():
                piece.loader(ld)
            env.timeout(self.t0).callbacks.append(ld.run)
            env.start(self._executor(sm, q, ld, barrier_done, sync, from_start, on_device))

    def _executor(self, sm: int, q: list[int], ld: Loader, barrier_done: list | None, sync: BaseSync,
                  from_start: list[bool], on_device: list[bool]):
        """SM ``sm``'s executor: for each task of its queue, wait for what the mode says (the barrier,
        or its hand-over and its producers), then for its data (``ld``), then its work; finish it.

        The hot loop of the engine, a coroutine run by :meth:`Env.start`: it appends its own
        ``wake`` to what it waits for, and its timed waits and its data wait (one at a time) are one
        :class:`Wake` it puts in the queue again each time. What it calls per dependency is the
        designs' ``seen`` closures only where a design gives them; everything else is bound once per
        SM, the clock is read once per wait, and a wait of no time records nothing
        (:meth:`Timeline.add` would not)."""
        wake = (yield)._value  # its own send (Env.start)
        env, r, timeline, hbm = self.env, self.r, self.timeline, self.hbm
        batch_of, new_batch = env._batches.get, env.batch  # Env.wake_at, inline at each timed wait
        arrived, arrival, own_deps = self._handover if self._handover is not None else (None, None, True)
        op_seen, tiles_seen = self._seen(sm) if self._seen is not None else (None, None)
        ready_after, memo = sync.ready_us, self._ready_memo
        work_us, start, tail_us, warm_us, first_in = self.work_us, self.start, self.tail_us, self.warm_us, self.first_in
        op_of, n_tiles, op_first, op_done_n, op_end, end = (self.op_of, self.n_tiles, self.op_first, self.op_done_n,
                                                            self.op_end, self.end)
        deps_of, in_B = self.g.all_deps, self.in_B  # in_B: what a task reads of its producers (a sentinel polls it)
        finished = self._finished
        lane_of, op_events, task_events, visible_us = self.lane_of, self.op_events, self.task_events, self.visible_us
        # what Timeline.add records, inline: the segments (if kept) and the breakdown's sums
        segs, us, heads = timeline.segs if timeline.segments else None, timeline.us, ld.heads
        env.wake_at(env.now + self.t0, wake)
        yield
        for i, t in enumerate(q):
            w = env.now
            if barrier_done is not None:
                j = op_of[t]
                if not barrier_done[j].triggered:
                    barrier_done[j].callbacks.append(wake)
                    yield
                    timeline.add(sm, w, env.now, t, "barrier wait")
            else:
                if arrived is not None and not arrived[t]:  # handed over by a scheduler
                    ev = arrival(t)  # type: ignore[misc]
                    if ev.callbacks is not None:  # (else processed already: go on at once)
                        ev.callbacks.append(wake)
                        yield
                if own_deps:  # producers done and visible
                    ready = -1.0
                    n_flags = 0
                    for p, a, b in deps_of[t]:
                        n = b - a
                        if n == n_tiles[p]:  # the whole op
                            if op_done_n[p] < n:
                                sig = op_events.get(p)  # op_signal(p), inline
                                if sig is None:
                                    sig = op_events[p] = Signal(env)
                                sig.callbacks.append(wake)
                                yield
                            e = op_end[p] if op_seen is None else op_seen(p)
                        elif n == 1:  # one task (as the range below)
                            k = op_first[p] + a
                            e = end[k]
                            if e != e:  # NaN: not done
                                sig = task_events.get(k)  # task_signal(k), inline
                                if sig is None:
                                    sig = task_events[k] = Signal(env)
                                sig.callbacks.append(wake)
                                yield
                                e = end[k]
                            if tiles_seen is not None:
                                e = tiles_seen(k, k + 1)
                        else:
                            lo = op_first[p] + a
                            for k in range(lo, lo + n):
                                if end[k] != end[k]:  # NaN: not done
                                    sig = task_events.get(k)  # task_signal(k), inline
                                    if sig is None:
                                        sig = task_events[k] = Signal(env)
                                    sig.callbacks.append(wake)
                                    yield
                            e = max(end[lo:lo + n]) if tiles_seen is None else tiles_seen(lo, lo + n)
                        if e > ready:
                            ready = e
                        n_flags += n
                    if ready >= 0:
                        polled, draw = in_B[t], hbm.rate_now
                        # the sync's answer (a pure function of these) to the last executor that asked, if
                        # asked alike (most are: the SMs that a producer's signal wakes at one instant)
                        if ready == memo[0] and draw == memo[3] and n_flags == memo[1] and polled == memo[2]:
                            ready = memo[4]
                        else:
                            memo[0] = ready
                            memo[1] = n_flags
                            memo[2] = polled
                            memo[3] = draw
                            ready = memo[4] = ready_after(ready, n_flags, r, polled, draw)
                        now = env.now
                        if ready > now:
                            at = now + (ready - now)
                            bt = batch_of(at)
                            if bt is None:
                                bt = new_batch(at)
                            bt.members.append(wake)
                            yield
                now = env.now
                if now > w:
                    if segs is not None:
                        segs += (sm, w, now, t, "dependency wait")
                    us["dependency wait"] += now - w
            now = t_in = env.now
            start[t] = t_in
            ld.n_started = i + 1  # Loader.started(i), inline: the rest of the task's bytes may stream
            if ld.waits_start and ld.i == i:
                ld.waits_start = False
                ld.wake()
            if ld.n_loaded <= i:
                ld.loaded = wake
                yield
                bubbles = ld.bubbles
                now = env.now
                if now > t_in:  # Timeline.data_wait, inline: bubble where the loader was in one
                    if segs is not None:
                        segs += (sm, t_in, now, t, "data wait")
                    bub = 0.0
                    for x, y in bubbles:
                        v = (y if y < now else now) - (x if x > t_in else t_in)
                        if v > 0.0:
                            bub += v
                    us["bubble"] += bub
                    us["memory"] += (now - t_in) - bub
            if warm_us is not None and on_device[t]:  # counted from its start and its first bytes
                fi = first_in[t]
                rest = warm_us[t] - (now - (fi if fi > t_in else t_in))
            elif from_start[t]:
                rest = work_us[t] - (now - t_in)
            else:  # counted from its data
                rest = work_us[t]
            if rest < tail_us[t]:  # the last page is consumed after it is in
                rest = tail_us[t]
            # its compute, then the task's whole span (the loader, woken below, records nothing before
            # it next waits, so both segments go in at once)
            if rest > 0:
                at = now + rest
                bt = batch_of(at)
                if bt is None:
                    bt = new_batch(at)
                bt.members.append(wake)
                yield
                t1, now = now, env.now
                if now > t1:
                    us["compute"] += now - t1
                    if segs is not None:
                        segs += (sm, t1, now, t, "compute", sm, t_in, now, t, "task")
                elif segs is not None and now > t_in:
                    segs += (sm, t_in, now, t, "task")
            elif segs is not None and now > t_in:
                segs += (sm, t_in, now, t, "task")
            head = heads[i]
            if head > 0:  # Loader.free(head), inline: its pages are free again
                free = ld.free_B = ld.free_B + head
                if ld.want_B and free >= ld.want_B:
                    ld.wake()
            # done: its end, its op's count, the signals of whoever waits for it
            end[t] = now
            lane_of[t] = sm
            p = op_of[t]
            op_done_n[p] += 1
            if now > op_end[p]:
                op_end[p] = now
            if finished:
                for hook in finished:
                    hook(t, p, sm, now)
            if task_events:
                sig = task_events.pop(t, None)
                if sig is not None:
                    sig.succeed_after(visible_us)
            if op_done_n[p] == n_tiles[p]:
                sig = op_events.pop(p, None)
                if sig is not None:
                    sig.succeed_after(visible_us)
        yield  # its queue done: suspended for good (returning would raise in the last event's processing)

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
        for piece in self.pieces.values():
            piece.after_run()

    def result(self) -> SimResult:
        spans = None
        if self._chain_times is not None:
            start_t, end_t = self._chain_times
            spans = list(zip(start_t, end_t, strict=True))
        stats = {name: got for name, piece in self.pieces.items() if (got := piece.result()) is not None}
        return build_result(self.s, self.r, np.asarray(self.start), np.asarray(self.end),
                            np.asarray(self.lane_of, dtype=np.int64), self.timeline, self.n_lanes, self.t0, spans,
                            self.hbm, design_stats=stats, names=self.timeline.segments)


__all__ = ["CATEGORIES", "simulate"]
