"""The engine's busiest actors, written as state machines rather than SimPy processes.

A process pays an event and a generator resume for every wait. An SM's loader and a
chain-mode block slot wait several times per task, and only ever on a DRAM flow (the HBM
calls them back when it ends), on an event (they add themselves to its callbacks), or on
their executor (which calls them). So each is a small object whose ``run`` method advances
through the steps of its task until one has to wait, and is called again when the wait is
over. The steps are the same as a process's would be; :mod:`._engine` keeps the processes
(launcher, barriers, executors) and wires these in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from simpy.core import NORMAL
from simpy.events import Event

from mksim.costs import first_byte_us

from ._hbm import Tracked

_INF = math.inf

if TYPE_CHECKING:
    from ._engine import _Engine


class Signal(Event):
    """An event its trigger can schedule for later: a producer's end, visible after the flag
    latency, wakes every consumer waiting for it at that instant, without a timeout each."""

    def succeed_after(self, delay_us: float) -> None:
        self._ok = True
        self._value = None
        self.env.schedule(self, NORMAL, delay_us)


# -- persistent modes: an SM's loader ------------------------------------------------------
_NEW, _HEAD, _BODY, _IN = range(4)  # task not begun, filling pages, streaming the rest, in


class Loader:
    """One SM's loader: walks the SM's queue, fills free shared-memory pages with each task's
    first bytes, and streams the rest of a bigger task once the executor has started it.

    It waits for a DRAM flow (the HBM calls :meth:`run` back), for pages the executor frees
    (:meth:`free`) or for the executor to start the task (:meth:`started`). The executor
    reads ``n_loaded`` and, to wait for its data, sets ``loaded`` to an event; the loader
    fires it with the task's DRAM-latency bubbles (for the breakdown).
    """

    __slots__ = ("env", "hbm", "timeline", "q", "lane", "pre_B", "buf_B", "page_B", "cap", "lat", "i",
                 "phase", "head", "got", "body", "free_B", "want_B", "n_started", "waits_start", "n_loaded",
                 "loaded", "heads", "bubbles", "last_end", "flow_a", "flow_d", "flow_n", "first_lat", "gate",
                 "issue_us", "op_cap", "op_of", "first_in", "pf", "pos", "l2_Bpus", "l2_lat", "pf_waited", "pf_gen",
                 "segments", "flowed")

    def __init__(self, eng: _Engine, sm: int, q: list[int], buf_B: int, page_B: int):
        self.env, self.hbm, self.timeline, self.q = eng.env, eng.hbm, eng.timeline, q
        self.segments = eng.timeline.segments
        self.flowed = self._flowed  # bound once: the HBM calls it back for every flow
        self.lane = -1 - sm
        self.pre_B = eng.pre_B
        self.buf_B, self.page_B = buf_B, page_B
        self.cap, self.lat = eng.r.sm_cap_Bpus, eng.r.dram_latency_us
        self.first_lat = first_byte_us(True, 0.0, 0.0, 0.0, eng.r)  # the kernel's first load on this SM
        self.i = 0               # queue position being loaded
        self.phase = _NEW
        self.head = self.got = 0  # page bytes of the current task: wanted, streamed
        self.body = 0.0          # bytes streamed after the pages
        self.free_B = buf_B      # free page bytes
        self.want_B = 0          # page bytes waited for (0: not waiting)
        self.n_started = 0       # queue positions the executor has started
        self.waits_start = False
        self.n_loaded = 0        # queue positions whose data is in
        self.loaded: Event | None = None
        self.heads: list[int] = []  # page bytes each loaded task holds
        self.bubbles: list[tuple[float, float]] = []  # the current task's DRAM-latency bubbles
        self.last_end = -1.0     # when the last flow ended: a later start pays the DRAM latency
        self.flow_a = self.flow_d = 0.0  # the flow in progress: start, latency paid
        self.flow_n: float = 0   # ... and bytes (whole page bytes while filling pages)
        # dynamic dispatch: (tasks arrived, wait(task, loader)); a task not yet handed to this SM
        # cannot be loaded, and the engine runs the loader again when it arrives
        self.gate: tuple | None = None
        self.issue_us = 0.0      # movement="native": issuing the first copy of a pipeline that starts
        # each op's cap where an implementation profile says what its loads keep in flight (else None)
        self.op_cap: list[float] | None = None
        self.op_of = eng.op_of
        self.first_in = eng.first_in
        # Options.l2_prefetch_KiB: the SM's L2 prefetcher (else None); pos: the bytes of the SM's
        # stream the loader has asked for so far; bytes found in L2 come at the SM's L2 share
        self.pf: L2Prefetch | None = None
        self.pos = 0.0
        self.pf_waited = False  # the request waited for the prefetch in flight once already
        self.pf_gen = 0         # ... and which wake-up of it counts
        self.l2_Bpus, self.l2_lat = eng.r.l2_per_sm_Bpus, eng.r.l2_latency_us

    def run(self, _ev: object = None) -> None:
        """Load as far as possible; return when waiting for a flow, pages or the executor."""
        q, n = self.q, len(self.q)
        while self.i < n:
            phase = self.phase
            if phase == _NEW:
                t = q[self.i]
                gate = self.gate
                if gate is not None and not gate[0][t]:
                    gate[1](t, self)
                    return
                # shared memory is counted in whole bytes: float sums would overfill the pages
                head = math.ceil(self.pre_B[t])
                self.head = head if head < self.buf_B else self.buf_B
                self.got = 0
                self.bubbles = []
                self.phase = phase = _HEAD
            if phase == _HEAD:
                head, got = self.head, self.got
                if got < head:  # fill pages as they free up, as many at a time as are free
                    need = head - got
                    free = self.free_B
                    least = need if need < self.page_B else self.page_B
                    if free < least:
                        self.want_B = least  # free() hands them over
                        return
                    take = need if need < free else free
                    self.free_B = free - take
                    self._flow(take)
                    return
                self.heads.append(head)
                self.body = self.pre_B[q[self.i]] - head
                self.phase = phase = _BODY
            if phase == _BODY:
                if self.body > 0.5:  # the rest streams once the executor has started the task
                    if self.n_started <= self.i:
                        self.waits_start = True
                        return
                    self.phase = _IN
                    self._flow(self.body)
                    return
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
        pf = self.pf
        hit = 0.0
        if pf is not None:  # an L2 prefetcher runs ahead: some of these bytes may be in L2
            wait = pf.wait_us(self.pos, nbytes)
            if wait > 0.0:  # its flow in flight holds them: read them from L2 once they are in, at
                self.pf_gen += 1  # its rate now, or when it ends if that comes first (or it slowed)
                g = self.pf_gen
                pf.waiter = partial(self._retry, g, nbytes)
                if not self.pf_waited:
                    self.pf_waited = True
                    self.env.timeout(wait).callbacks.append(partial(self._retry, g, nbytes))
                return
            self.pf_waited = False
            hit = pf.hits(self.pos, nbytes)
            pf.moved(self.pos, self.pos + nbytes)
            self.pos += nbytes
        last = self.last_end
        if a <= last:  # the loader streamed until now: no first-byte wait
            d = 0.0
        elif hit > 0.0 and nbytes - hit <= 0.5:  # all in L2: the L2 latency, then the bytes at its rate
            d = self.l2_lat
        else:
            d = self.lat if last >= 0 else self.first_lat
            if d > 0 and self.issue_us:
                d += self.issue_us
        self.flow_a, self.flow_d, self.flow_n = a, d, nbytes
        t = self.q[self.i]
        first_in = self.first_in
        if first_in[t] != first_in[t]:  # NaN: the task's first flow
            first_in[t] = a + d
        cap = self.cap
        if self.op_cap is not None:
            own = self.op_cap[self.op_of[t]]
            if own < cap:
                cap = own
        if hit > 0.0:
            l2 = self.l2_Bpus if self.l2_Bpus < cap else cap
            if nbytes - hit <= 0.5:
                self.env.timeout(d + nbytes / l2).callbacks.append(self._l2_in)
                return
            d += hit / l2  # the bytes in L2 first (they come first in the stream), then the rest from DRAM
        self.hbm.start(nbytes - hit, cap, d, self.flowed)

    def _retry(self, gen: int, nbytes: float, _ev: object = None) -> None:
        if gen == self.pf_gen:  # the first of the two wake-ups
            self.pf_gen += 1
            self._flow(nbytes)

    def _l2_in(self, _ev: object) -> None:
        self._flowed()

    def _flowed(self) -> None:
        self.last_end = now = self.env.now
        a, d = self.flow_a, self.flow_d
        if self.segments:  # (a loader's flows count only through its executor's data waits)
            self.timeline.flow(self.lane, a, d, now, self.q[self.i], count=False)
        if d > 0:
            self.bubbles.append((a, a + d))
        if self.phase == _HEAD:
            self.got += int(self.flow_n)
        if self.pf is not None:
            self.pf.moved(self.pos, self.pos)
        self.run()


class L2Prefetch:
    """One SM's L2 prefetcher (``Options.l2_prefetch_KiB``): it reads the SM's stream of DRAM bytes
    (its queue's tasks' bytes in order, as the loader asks for them) into L2 up to ``lead_B`` ahead
    of what the loader has received, one flow at a time, sharing the HBM with every other flow.

    The loader finds there what has arrived (:meth:`hits`) and reads it at its L2 share; bytes the
    flow in flight still brings it waits for (:meth:`wait_us`). The L2 keeps the most recent DRAM
    traffic: a prefetched flow is gone once more than the L2's size has arrived from DRAM after it
    (least recently used), and its bytes come from DRAM again. Positions are bytes of the SM's
    stream.
    """

    __slots__ = ("env", "hbm", "lead", "chunk", "total", "l2_B", "cap", "lat", "first_lat", "base", "req", "flow",
                 "f0", "f1", "chunks", "last_end", "waiter")

    def __init__(self, eng: _Engine, total_B: float, lead_B: float, page_B: float):
        self.env, self.hbm = eng.env, eng.hbm
        self.lead = lead_B
        self.chunk = min(lead_B, max(page_B, lead_B / 2))  # few flows, each asking for half the lead
        self.total = total_B
        self.l2_B = eng.s.gpu.l2.size_MiB * 2 ** 20
        self.cap, self.lat = eng.r.sm_cap_Bpus, eng.r.dram_latency_us
        self.first_lat = first_byte_us(True, 0.0, 0.0, 0.0, eng.r)
        self.base = 0.0                # what the loader has received: the window starts there
        self.req = 0.0                 # what has been asked of DRAM, by the prefetcher or the loader
        self.flow: Tracked | None = None  # the flow in flight, over [f0, f1)
        self.f0 = self.f1 = 0.0
        self.chunks: deque[tuple[float, float, float]] = deque()  # arrived: (start, end, DRAM bytes arrived by then)
        self.last_end = -1.0
        self.waiter: Callable[[], object] | None = None  # called when the flow in flight ends

    def moved(self, received: float, asked: float) -> None:
        """The loader has received the stream up to ``received`` and asked for it up to ``asked``."""
        self.base = received
        if self.req < asked:
            self.req = asked
        if self.flow is None:
            self._issue()

    def _issue(self) -> None:
        end = min(self.base + self.lead, self.total)
        room = end - self.req
        if room <= 0.5 or (room < self.chunk - 0.5 and end < self.total):
            return
        n = room if room < self.chunk else self.chunk
        now = self.env.now
        d = (self.lat if self.last_end >= 0 else self.first_lat) if now > self.last_end else 0.0
        self.f0, self.f1 = self.req, self.req + n
        self.req = self.f1
        self.flow = self.hbm.start_tracked(n, self.cap, d, self._done)

    def _done(self) -> None:
        self.last_end = self.env.now
        self.chunks.append((self.f0, self.f1, self.hbm.arrived_now()))
        self.flow = None
        w, self.waiter = self.waiter, None
        if w is not None:
            w()
        if self.flow is None:
            self._issue()

    def wait_us(self, c: float, n: float) -> float:
        """How long until what the flow in flight holds of bytes ``[c, c + n)`` has arrived, at its
        rate now (0: it holds none of them, or they are in). A loader that has waited once waits
        for the flow's end (:attr:`waiter`)."""
        fl = self.flow
        if fl is None or self.f0 >= c + n:
            return 0.0
        need = min(c + n, self.f1) - self.f0
        got = fl.served()
        if got >= need - 0.5:
            return 0.0
        rate = fl.rate()
        if rate <= 0.0:  # still in its first-byte latency
            return max(fl.at - self.env.now, 0.0) + (need - got) / self.cap
        return (need - got) / rate

    def hits(self, c: float, n: float) -> float:
        """Bytes of ``[c, c + n)`` in L2 now: arrived flows not yet pushed out, and what the flow in
        flight has brought."""
        end = c + n
        ch = self.chunks
        while ch and ch[0][1] <= c:  # passed by the loader
            ch.popleft()
        hit = 0.0
        if ch:
            kept = self.hbm.arrived_now() - self.l2_B  # what arrived before this much DRAM traffic is gone
            for a, b, mark in ch:
                if a >= end:
                    break
                if mark >= kept:
                    hit += min(b, end) - max(a, c)
        fl = self.flow
        if fl is not None and self.f0 < end:
            got = self.f0 + fl.served()
            if got > c:
                hit += min(got, end) - max(self.f0, c)
        return hit


def stream_bytes(pre_B: list[float], q: list[int], buf_B: int) -> float:
    """The bytes a loader with ``buf_B`` of pages asks for over queue ``q``: each task's pages (whole
    bytes) and the rest of it (:class:`Loader`)."""
    total = 0.0
    for t in q:
        p = pre_B[t]
        head = min(math.ceil(p), buf_B)
        total += head + (p - head if p - head > 0.5 else 0.0)
    return total


# -- chain modes: block slots -----------------------------------------------------------------
class Chain:
    """What the block slots of a chain mode share: the kernels' queues and events, and the
    slots waiting for blocks.

    Kernels' queues drain in order, so every slot takes from the first queue that still has
    blocks, once that kernel is dispatched; a slot that finds none waits in a FIFO of its level
    (every SM's first slots, then every SM's second ...), and a dispatch wakes only as many
    slots as the kernel has blocks, level by level: blocks spread over the SMs first. Per SM
    it remembers the last kernel that loaded there and when that load's first bytes arrive: a
    kernel's first block on an SM starts cold (:func:`~mksim.costs.first_byte_us`).
    """

    def __init__(self, eng: _Engine, n_lanes: int, dispatch: list[Event], release: list[Event],
                 done: list[Event], start_t: list[float], end_t: list[float], cap: list[float], head_B: float,
                 released_at: list[float]):
        self.env, self.hbm, self.timeline = eng.env, eng.hbm, eng.timeline
        self.pre_B, self.work_us, self.tail_us, self.start, self.end, self.lane_of = (
            eng.pre_B, eng.work_us, eng.tail_us, eng.start, eng.end, eng.lane_of)
        self.warm_us, self.first_in = eng.warm_us, eng.first_in
        first = eng.op_first
        self.queues = [deque(range(first[k], first[k + 1])) for k in range(len(first) - 1)]
        self.dispatch, self.release, self.done = dispatch, release, done
        self.left = list(eng.n_tiles)  # blocks of each kernel not yet finished
        self.start_t, self.end_t = start_t, end_t  # kernel k is dispatched once start_t[k] is set
        self.cap, self.head_B = cap, head_B
        self.r = eng.r
        self.lanes_per_sm = n_lanes // eng.r.n_sms
        self.sm_kernel = [-1] * eng.r.n_sms     # the last kernel that loaded on each SM
        self.cold_until = [0.0] * eng.r.n_sms   # when that kernel's first load there arrives
        self.k = 0                     # the first kernel with blocks not yet taken
        self.on_device = eng.on_device.tolist()  # tasks with a device function's costs
        self.released_at = released_at  # when each kernel's dependent part was released (inf: not yet)
        # Idle slots by level: level j holds each SM's j-th slot (lane sm * lanes_per_sm + j). A
        # dispatch fills level 0 first, as the block scheduler spreads a kernel's blocks over the
        # SMs before it doubles them up: a kernel of 132 blocks runs on 132 SMs, not on 66.
        per = self.lanes_per_sm
        self.idle = [deque(Slot(self, sm * per + j) for sm in range(eng.r.n_sms)) for j in range(per)]
        for ev in dispatch:
            ev.callbacks.append(self._dispatched)

    def take(self) -> tuple[int, int] | None:
        """The next block ``(kernel, task)``, or None if none is dispatched."""
        while self.k < len(self.queues):
            if self.start_t[self.k] != self.start_t[self.k]:  # NaN: not dispatched yet
                return None
            q = self.queues[self.k]
            if q:
                return self.k, q.popleft()
            self.k += 1
        return None

    def first_byte(self, sm: int, k: int, placed: float) -> float:
        """The first-byte wait of a flow that a block of kernel ``k`` on ``sm``, placed at
        ``placed``, starts now (:func:`first_byte_us`)."""
        now = self.env.now
        if self.sm_kernel[sm] == k:  # a later block of this kernel on the SM
            return first_byte_us(False, now, placed, self.cold_until[sm], self.r)
        d = first_byte_us(True, now, placed, 0.0, self.r)
        self.sm_kernel[sm] = k
        self.cold_until[sm] = now + d
        return d

    def _dispatched(self, _ev: Event) -> None:
        for idle in self.idle:
            while idle:
                kt = self.take()
                if kt is None:
                    return
                slot = idle.popleft()
                slot.begin(*kt)
                slot.run()


_TAKE, _PROLOGUE, _RELEASE, _RELEASED, _LOAD, _COMPUTE, _COMPUTED, _END = range(8)


class Slot:
    """One block slot of an SM in a chain mode: takes the next block (or waits for a kernel's
    dispatch), streams its weights — under PDL the first pages before the previous kernel has
    ended — computes, and takes the next."""

    __slots__ = ("ch", "lane", "sm", "level", "k", "phase", "t", "t_in", "since", "w0", "pre", "w", "d")

    def __init__(self, ch: Chain, lane: int):
        self.ch, self.lane = ch, lane
        self.sm, self.level = divmod(lane, ch.lanes_per_sm)
        self.k = 0               # kernel of the block it runs
        self.phase = _TAKE
        self.t = -1              # the block (task) it runs
        self.t_in = self.since = self.w = 0.0  # taken, dependent part started, began waiting
        self.w0 = 0.0            # its work counts from here
        self.pre = 0.0           # DRAM bytes still to stream
        self.d = 0.0             # first-byte wait of the flow in progress

    def begin(self, k: int, t: int) -> None:
        """Take block ``t`` of kernel ``k``; :meth:`run` runs it."""
        self.k, self.t = k, t
        self.t_in = self.ch.env.now
        self.pre = self.ch.pre_B[t]
        self.phase = _PROLOGUE

    def run(self, _ev: object = None) -> None:
        """Run blocks until a step has to wait (a flow, the release, compute, a dispatch).

        The steps follow each other in the order of their phases; a step that waits records the
        phase it resumes at and returns."""
        ch, env = self.ch, self.ch.env
        ph = self.phase
        while True:
            if ph == _TAKE:
                kt = ch.take()
                if kt is None:
                    self.phase = _TAKE
                    ch.idle[self.level].append(self)
                    return
                self.begin(*kt)
                ph = _PROLOGUE
            if ph == _PROLOGUE:
                ph = _RELEASE
                if ch.released_at[self.k] == _INF:  # not released yet
                    head = min(self.pre, ch.head_B)
                    if head > 0:  # PDL prologue: stream the first pages while the previous kernel runs
                        self.phase = _RELEASE
                        self.pre -= head
                        self.d = ch.first_byte(self.sm, self.k, self.t_in)
                        ch.first_in[self.t] = env.now + self.d
                        ch.hbm.start(head, ch.cap[self.k], self.d, self._prologue_in)
                        return
            if ph == _RELEASE:
                if ch.released_at[self.k] == _INF:
                    self.w = env.now
                    self.phase = _RELEASED
                    ch.release[self.k].callbacks.append(self.run)
                    return
                ph = _LOAD
            if ph == _RELEASED:
                ch.timeline.add(self.lane, self.w, env.now, self.t, "dependency wait")
                ph = _LOAD
            if ph == _LOAD:
                t = self.t
                self.since = now = env.now
                ch.start[t] = now  # the dependent part starts here (PDL prologue before)
                if ch.on_device[t]:  # a device function's fixed part needs only the release
                    rel_us = ch.released_at[self.k]
                    self.w0 = rel_us if rel_us > self.t_in else self.t_in
                else:
                    self.w0 = now
                ph = _COMPUTE
                if self.pre > 0:
                    sm = self.sm
                    if ch.sm_kernel[sm] == self.k:  # a later block of this kernel on the SM
                        d = first_byte_us(False, now, self.t_in, ch.cold_until[sm], ch.r)
                    else:
                        d = ch.first_byte(sm, self.k, self.t_in)
                    self.d = d
                    if ch.first_in[t] != ch.first_in[t]:  # NaN: no prologue streamed it
                        ch.first_in[t] = now + d
                    self.phase = _COMPUTE
                    ch.hbm.start(self.pre, ch.cap[self.k], d, self._loaded)
                    return
            if ph == _COMPUTE:
                t, now = self.t, env.now
                if ch.warm_us is not None and ch.on_device[t]:  # from its inputs and first bytes
                    fi = ch.first_in[t]
                    rest = ch.warm_us[t] - (now - (fi if fi > self.w0 else self.w0))
                else:
                    rest = ch.work_us[t] - (now - self.w0)
                if rest < ch.tail_us[t]:  # a device function consumes the last page once it is in
                    rest = ch.tail_us[t]
                if rest > 0:
                    self.w = now
                    self.phase = _COMPUTED
                    env.timeout(rest).callbacks.append(self.run)
                    return
                ph = _END
            if ph == _COMPUTED:
                ch.timeline.add(self.lane, self.w, env.now, self.t, "compute")
            # the block is done
            now, t, k = env.now, self.t, self.k
            ch.timeline.task(self.lane, self.t_in, now, t)
            ch.end[t] = now
            ch.lane_of[t] = self.lane
            ch.left[k] -= 1
            if ch.left[k] == 0:
                ch.end_t[k] = now
                ch.done[k].succeed()
            ph = _TAKE

    def _prologue_in(self) -> None:
        self.ch.timeline.flow(self.lane, self.t_in, self.d, self.ch.env.now, self.t)
        self.run()

    def _loaded(self) -> None:
        self.ch.timeline.flow(self.lane, self.since, self.d, self.ch.env.now, self.t)
        self.run()
