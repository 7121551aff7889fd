"""The engine's busiest actors, written as coroutines resumed directly rather than SimPy processes.

A process pays an event and a generator resume for every wait. An SM's loader and a
chain-mode block slot wait several times per task, and only ever on a DRAM flow (the HBM
calls them back when it ends), on an event (they add themselves to its callbacks), or on
their executor (which calls them). So each is a small object whose steps are a generator that
suspends (a bare ``yield``) where it has to wait, and that whoever ends the wait resumes at once
(``wake``): the same steps at the same instants, in the same order, as a process's, with no
event where none is needed and the state in the generator's locals. :mod:`._engine` keeps the
processes (launcher, barriers) and the executors, and wires these in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from functools import partial
from heapq import heappush
from typing import TYPE_CHECKING, Any

from simpy.core import NORMAL
from simpy.events import Event

from mksim.costs import first_byte_us

from ._hbm import Tracked

_INF = math.inf

if TYPE_CHECKING:
    from mksim.workload import TaskGraph

    from ._engine import _Engine


class Signal(Event):
    """An event its trigger can schedule for later: a producer's end, visible after the flag
    latency, wakes every consumer waiting for it at that instant, without a timeout each."""

    def succeed_after(self, delay_us: float) -> None:
        self._ok = True
        self._value = None
        env = self.env  # env.schedule(self, NORMAL, delay_us), inline
        at = env._now + delay_us
        env._batches.pop(at, None)  # type: ignore[attr-defined]  # (an engine Env: closes the batch there)
        heappush(env._queue, (at, NORMAL, next(env._eid), self))


# -- persistent modes: an SM's loader ------------------------------------------------------
class Loader:
    """One SM's loader: walks the SM's queue, fills free shared-memory pages with each task's
    first bytes, and streams the rest of a bigger task once the executor has started it.

    Its steps are a coroutine (:meth:`_load`) that suspends whenever it waits: for a DRAM flow (the
    HBM calls it back), for pages the executor frees (:meth:`free`), for the executor to start the
    task (:meth:`started`) or, under dynamic dispatch, for the task's hand-over (:meth:`run`).
    Whoever ends the wait resumes it at once, so it takes the same steps at the same instants, in
    the same order, as a SimPy process woken through events would, without an event per wait. The
    executor reads ``n_loaded`` and, to wait for its data, sets ``loaded`` to an event; the loader
    fires it with the task's DRAM-latency bubbles (for the breakdown).
    """

    __slots__ = ("env", "hbm", "timeline", "q", "lane", "pre_B", "buf_B", "page_B", "cap", "lat", "i",
                 "free_B", "want_B", "n_started", "waits_start", "n_loaded", "loaded", "heads",
                 "first_lat", "gate", "issue_us", "op_cap", "op_of", "first_in", "pf", "pos", "l2_Bpus", "l2_lat",
                 "pf_waited", "pf_gen", "wake", "wake_ev", "addr", "bubbles")

    def __init__(self, eng: _Engine, sm: int, q: list[int], buf_B: int, page_B: int):
        self.env, self.hbm, self.timeline, self.q = eng.env, eng.hbm, eng.timeline, q
        self.lane = -1 - sm
        self.pre_B = eng.pre_B
        self.buf_B, self.page_B = buf_B, page_B
        self.cap, self.lat = eng.r.sm_cap_Bpus, eng.r.dram_latency_us
        self.first_lat = first_byte_us(True, 0.0, 0.0, 0.0, eng.r)  # the kernel's first load on this SM
        self.i = 0               # queue position being loaded
        self.free_B = buf_B      # free page bytes
        self.want_B = 0          # page bytes waited for (0: not waiting)
        self.n_started = 0       # queue positions the executor has started
        self.waits_start = False
        self.n_loaded = 0        # queue positions whose data is in
        self.loaded: Callable[[object], object] | None = None  # the executor waiting for the data, if it waits
        self.bubbles: list[tuple[float, float]] = []  # ... and the data's DRAM-latency bubbles, as it wakes it
        self.heads: list[int] = []  # page bytes each loaded task holds
        # dynamic dispatch: (tasks arrived, wait(task, loader)); a task not yet handed to this SM
        # cannot be loaded, and the engine runs the loader again when it arrives
        self.gate: tuple | None = None
        # a task whose weight address a routing decides (an MoE expert's): (the op deciding it for each
        # op, else -1; when that op is seen, else None): not loaded before (address_gates)
        self.addr: tuple[list[int], Callable[[int], float | Event]] | None = None
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
        co = self._load()
        self.wake: Callable[[], object] = co.__next__  # resumes the coroutine (a flow's end, pages, ...)
        self.wake_ev: Callable[[object], None] = co.send  # ... as an event's callback

    def run(self, _ev: object = None) -> None:
        """Start loading (at the kernel's start), or go on once the awaited task is handed over."""
        self.wake()

    def free(self, nbytes: int) -> None:
        """The executor freed ``nbytes`` of pages."""
        self.free_B += nbytes
        if self.want_B and self.free_B >= self.want_B:
            self.wake()

    def started(self, i: int) -> None:
        """The executor started the task at queue position ``i``."""
        self.n_started = i + 1
        if self.waits_start and self.i == i:
            self.waits_start = False
            self.wake()

    def _load(self) -> Generator[None, object, None]:
        """The loader's steps: for each task, its pages (as they free up, as many at a time as are
        free), then the rest of it once the executor has started it; each a DRAM flow."""
        # what the engine and the designs set up as the loader was made, read once (it starts later)
        env, hbm, q, pre_B, buf_B, page_B = self.env, self.hbm, self.q, self.pre_B, self.buf_B, self.page_B
        heads, first_in, op_of, pf, gate, addr = self.heads, self.first_in, self.op_of, self.pf, self.gate, self.addr
        cap0, op_cap, issue_us, lat, first_lat = self.cap, self.op_cap, self.issue_us, self.lat, self.first_lat
        segs, lane = self.timeline.segs if self.timeline.segments else None, self.lane
        wake, start, batch_of, new_batch = self.wake, hbm.start, env._batches.get, env.batch
        last = -1.0  # when the last flow ended: a later start pays the DRAM latency
        i = 0
        while True:  # (from the first run(), as the kernel starts)
            self.i = i  # (== len(q) once all are loaded: a design that appends a task then runs the loader)
            if i >= len(q):
                yield  # all loaded: suspended (returning would raise in its waker) until a design adds tasks
                continue
            t = q[i]
            while gate is not None and not gate[0][t]:
                gate[1](t, self)
                yield  # until the task is handed over
                t = q[i]  # a design may have put another task at this place meanwhile
            if addr is not None and addr[0][op_of[t]] >= 0:
                while True:
                    seen = addr[1](addr[0][op_of[t]])
                    if not isinstance(seen, float):  # the op deciding it has not ended: its signal
                        seen.callbacks.append(self.wake_ev)
                        yield
                        continue
                    if seen > env.now:
                        env.timeout(seen - env.now).callbacks.append(self.wake_ev)
                        yield
                    break
            cap = cap0  # the task's flows' cap
            if op_cap is not None:
                own = op_cap[op_of[t]]
                if own < cap:
                    cap = own
            # shared memory is counted in whole bytes: float sums would overfill the pages
            head = math.ceil(pre_B[t])
            if head > buf_B:
                head = buf_B
            got = 0
            n: float
            pages = True  # filling pages (then: streaming the rest)
            bubbles: list[tuple[float, float]] = []
            while True:
                if got < head:
                    need = head - got
                    least = need if need < page_B else page_B
                    free = self.free_B
                    if free < least:
                        self.want_B = least
                        yield  # until free() has freed them
                        # one page is what the loader waited for; if the rest of the head is free
                        # too, it would stream it the instant that page is in: one flow does both
                        free = self.free_B
                        n = need if free >= need else least
                        self.want_B = 0
                    else:
                        n = need if need < free else free
                    self.free_B = free - n
                elif pages:
                    pages = False
                    heads.append(head)
                    n = pre_B[t] - head  # (a float: the rest of the task's bytes)
                    if n <= 0.5:
                        break
                    if self.n_started <= i:  # the rest streams once the executor has started the task
                        self.waits_start = True
                        yield  # until started(i)
                else:
                    break
                # a flow of n bytes; an L2 prefetcher running ahead may hold some of them
                hit = 0.0
                while pf is not None:
                    wait = pf.wait_us(self.pos, n)
                    if wait > 0.0:  # its flow in flight holds them: read them from L2 once they are in,
                        self.pf_gen += 1  # at its rate now, or when it ends if that comes first
                        g = self.pf_gen
                        pf.waiter = partial(self._retry, g)
                        if not self.pf_waited:
                            self.pf_waited = True
                            env.timeout(wait).callbacks.append(partial(self._retry, g))
                        yield  # until _retry
                        continue
                    self.pf_waited = False
                    hit = pf.hits(self.pos, n)
                    pf.moved(self.pos, self.pos + n)
                    self.pos += n
                    break
                a = env.now
                if a <= last:  # the loader streamed until now: no first-byte wait
                    d = 0.0
                elif hit > 0.0 and n - hit <= 0.5:  # all in L2: the L2 latency, then the bytes at its rate
                    d = self.l2_lat
                else:
                    d = lat if last >= 0 else first_lat
                    if d > 0 and issue_us:
                        d += issue_us
                if first_in[t] != first_in[t]:  # NaN: the task's first flow
                    first_in[t] = a + d
                if hit == 0.0:
                    start(n - hit, cap, d, wake)
                else:
                    l2 = self.l2_Bpus if self.l2_Bpus < cap else cap
                    if n - hit <= 0.5:
                        env.timeout(d + n / l2).callbacks.append(self.wake_ev)
                    else:  # the bytes in L2 first (they come first in the stream), then the rest from DRAM
                        hbm.start(n - hit, cap, d + hit / l2, wake)
                yield  # until the bytes are in
                last = now = env.now
                # Timeline.flow, inline (a loader's flows count only through its executor's data waits)
                if d > 0:
                    e = a + d
                    bubbles.append((a, e))
                    if segs is not None:
                        if now > e:
                            segs += (lane, a, e, t, "bubble", lane, e, now, t, "memory")
                        else:
                            segs += (lane, a, e, t, "bubble")
                elif segs is not None and now > a:
                    segs += (lane, a, now, t, "memory")
                if pages:
                    got += n  # type: ignore[assignment]  # (whole page bytes)
                if pf is not None:
                    pf.moved(self.pos, self.pos)
            self.n_loaded = i + 1
            if self.loaded is not None:
                fn, self.loaded = self.loaded, None
                self.bubbles = bubbles
                now = env.now  # env.wake_at(now, fn), inline
                b = batch_of(now)
                if b is None:
                    b = new_batch(now)
                b.members.append(fn)
            i += 1

    def _retry(self, gen: int, _ev: object = None) -> None:
        if gen == self.pf_gen:  # the first of the two wake-ups
            self.pf_gen += 1
            self.wake()


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


def address_gates(graph: TaskGraph) -> list[int] | None:
    """For each op of ``graph``, the op whose end decides its tasks' weight addresses (an MoE layer's
    expert ops: the layer's ``topk``), else -1; ``None`` where no op has one (a dense model). A
    megakernel's loader streams an expert's weights only once its layer's top-k is seen."""
    topk = {op.layer: i for i, op in enumerate(graph.ops) if op.kind == "topk"}
    gates = [topk.get(op.layer, -1) if op.attrs.get("grouped") == "experts" else -1 for op in graph.ops]
    return gates if any(g >= 0 for g in gates) else None


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
        k, queues, start_t = self.k, self.queues, self.start_t
        while k < len(queues):
            if start_t[k] != start_t[k]:  # NaN: not dispatched yet
                break
            q = queues[k]
            if q:
                self.k = k
                return k, q.popleft()
            k += 1
        self.k = k
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
                idle.popleft().give(kt)


class Slot:
    """One block slot of an SM in a chain mode: takes the next block (or waits for a kernel's
    dispatch), streams its weights — under PDL the first pages before the previous kernel has
    ended — computes, and takes the next.

    Its steps are a coroutine (:meth:`_blocks`), suspended while it waits (a flow, the release,
    compute, a dispatch) and resumed by whoever ends the wait: the HBM, the event's callbacks, or
    :meth:`Chain._dispatched` handing it a block (:attr:`give`)."""

    __slots__ = ("ch", "lane", "sm", "level", "wake", "wake_ev", "give")

    def __init__(self, ch: Chain, lane: int):
        self.ch, self.lane = ch, lane
        self.sm, self.level = divmod(lane, ch.lanes_per_sm)
        co = self._blocks()
        self.wake: Callable[[], object] = co.__next__  # a flow's bytes are in
        self.wake_ev: Callable[[object], None] = co.send  # an event it waits for is processed
        self.give: Callable[[tuple[int, int]], None] = co.send  # its next block (kernel, task)
        next(co)  # idle until a dispatch gives it a block

    def _blocks(self) -> Generator[None, Any, None]:
        ch, lane, sm = self.ch, self.lane, self.sm
        env, hbm, timeline, r = ch.env, ch.hbm, ch.timeline, ch.r
        pre_B, work_us, tail_us, warm_us, first_in = ch.pre_B, ch.work_us, ch.tail_us, ch.warm_us, ch.first_in
        start, end, lane_of, on_device, cap = ch.start, ch.end, ch.lane_of, ch.on_device, ch.cap
        release, released_at, left, end_t, done = ch.release, ch.released_at, ch.left, ch.end_t, ch.done
        sm_kernel, cold_until = ch.sm_kernel, ch.cold_until
        wake, wake_ev = self.wake, self.wake_ev
        batch_of, new_batch = env._batches.get, env.batch  # its compute waits: Env.wake_at, inline
        # what Timeline.flow, add and task record, inline: the segments (if kept) and the breakdown's sums
        segs, us = timeline.segs if timeline.segments else None, timeline.us
        queues = ch.queues
        k, t = yield
        idle = ch.idle[self.level]  # (made once every slot is)
        while True:
            t_in = env.now
            pre = pre_B[t]
            if released_at[k] == _INF:  # not released yet
                head = min(pre, ch.head_B)
                if head > 0:  # PDL prologue: stream the first pages while the previous kernel runs
                    pre -= head
                    d = ch.first_byte(sm, k, t_in)
                    first_in[t] = env.now + d
                    hbm.start(head, cap[k], d, wake)
                    yield
                    timeline.flow(lane, t_in, d, env.now, t)
                if released_at[k] == _INF:
                    w = env.now
                    release[k].callbacks.append(wake_ev)
                    yield
                    timeline.add(lane, w, env.now, t, "dependency wait")
            since = env.now
            start[t] = since  # the dependent part starts here (PDL prologue before)
            if on_device[t]:  # a device function's fixed part needs only the release
                rel_us = released_at[k]
                w0 = rel_us if rel_us > t_in else t_in
            else:
                w0 = since
            if pre > 0:
                if sm_kernel[sm] == k:  # a later block of this kernel on the SM
                    d = first_byte_us(False, since, t_in, cold_until[sm], r)
                else:  # Chain.first_byte, inline
                    d = first_byte_us(True, since, t_in, 0.0, r)
                    sm_kernel[sm] = k
                    cold_until[sm] = since + d
                if first_in[t] != first_in[t]:  # NaN: no prologue streamed it
                    first_in[t] = since + d
                hbm.start(pre, cap[k], d, wake)
                yield
                now = env.now
                if d > 0:  # Timeline.flow, inline
                    a = since + d
                    us["bubble"] += a - since
                    if now > a:
                        us["memory"] += now - a
                        if segs is not None:
                            segs += (lane, since, a, t, "bubble", lane, a, now, t, "memory")
                    elif segs is not None:
                        segs += (lane, since, a, t, "bubble")
                elif now > since:
                    us["memory"] += now - since
                    if segs is not None:
                        segs += (lane, since, now, t, "memory")
            else:
                now = since
            if warm_us is not None and on_device[t]:  # from its inputs and first bytes
                fi = first_in[t]
                rest = warm_us[t] - (now - (fi if fi > w0 else w0))
            else:
                rest = work_us[t] - (now - w0)
            if rest < tail_us[t]:  # a device function consumes the last page once it is in
                rest = tail_us[t]
            if rest > 0:
                at = now + rest
                b = batch_of(at)
                if b is None:
                    b = new_batch(at)
                b.members.append(wake_ev)
                yield
                w, now = now, env.now
                if now > w:  # Timeline.add and task, inline
                    us["compute"] += now - w
                    if segs is not None:
                        segs += (lane, w, now, t, "compute", lane, t_in, now, t, "task")
                elif segs is not None and now > t_in:
                    segs += (lane, t_in, now, t, "task")
            elif segs is not None and now > t_in:  # the block is done
                segs += (lane, t_in, now, t, "task")
            end[t] = now
            lane_of[t] = lane
            n = left[k] - 1
            left[k] = n
            if n == 0:
                end_t[k] = now
                done[k].succeed()
            q = queues[k]
            if ch.k == k and q:  # Chain.take, inline: the next block of this kernel
                t = q.popleft()
                continue
            kt = ch.take()
            if kt is None:  # wait in the FIFO of its level for a dispatch
                idle.append(self)
                kt = yield
            k, t = kt
