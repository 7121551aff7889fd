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
from typing import TYPE_CHECKING

from simpy.core import NORMAL
from simpy.events import Event

from mksim.costs import first_byte_us

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
                 "issue_us", "op_cap", "op_of", "first_in")

    def __init__(self, eng: _Engine, sm: int, q: list[int], buf_B: int, page_B: int):
        self.env, self.hbm, self.timeline, self.q = eng.env, eng.hbm, eng.timeline, q
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

    def run(self, _ev: object = None) -> None:
        """Load as far as possible; return when waiting for a flow, pages or the executor."""
        q = self.q
        while self.i < len(q):
            if self.phase == _NEW:
                gate = self.gate
                if gate is not None and not gate[0][q[self.i]]:
                    gate[1](q[self.i], self)
                    return
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
        d = (self.lat if self.last_end >= 0 else self.first_lat) if a > self.last_end else 0.0
        if d > 0 and self.issue_us:
            d += self.issue_us
        self.flow_a, self.flow_d, self.flow_n = a, d, nbytes
        t = self.q[self.i]
        if self.first_in[t] != self.first_in[t]:  # NaN: the task's first flow
            self.first_in[t] = a + d
        cap = self.cap
        if self.op_cap is not None:
            own = self.op_cap[self.op_of[self.q[self.i]]]
            if own < cap:
                cap = own
        self.hbm.start(nbytes, cap, self.flow_d, self._flowed)

    def _flowed(self) -> None:
        self.last_end = now = self.env.now
        a, d = self.flow_a, self.flow_d
        self.timeline.flow(self.lane, a, d, now, self.q[self.i], count=False)
        if d > 0:
            self.bubbles.append((a, a + d))
        if self.phase == _HEAD:
            self.got += int(self.flow_n)
        self.run()


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
                 done: list[Event], end_t: list[float], cap: list[float], head_B: float, released_at: list[float]):
        self.env, self.hbm, self.timeline = eng.env, eng.hbm, eng.timeline
        self.pre_B, self.work_us, self.tail_us, self.start, self.end, self.lane_of = (
            eng.pre_B, eng.work_us, eng.tail_us, eng.start, eng.end, eng.lane_of)
        self.warm_us, self.first_in = eng.warm_us, eng.first_in
        first = eng.op_first
        self.queues = [deque(range(first[k], first[k + 1])) for k in range(len(first) - 1)]
        self.dispatch, self.release, self.done = dispatch, release, done
        self.left = list(eng.n_tiles)  # blocks of each kernel not yet finished
        self.end_t = end_t
        self.cap, self.head_B = cap, head_B
        self.r = eng.r
        self.lanes_per_sm = n_lanes // eng.r.n_sms
        self.sm_kernel = [-1] * eng.r.n_sms     # the last kernel that loaded on each SM
        self.cold_until = [0.0] * eng.r.n_sms   # when that kernel's first load there arrives
        self.k = 0                     # the first kernel with blocks not yet taken
        self.on_device = eng.on_device.tolist()  # tasks with a device function's costs
        self.released_at = released_at  # when each kernel's dependent part was released
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
            if not self.dispatch[self.k].triggered:
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
        """Run blocks until a step has to wait (a flow, the release, compute, a dispatch)."""
        ch, env = self.ch, self.ch.env
        while True:
            ph = self.phase
            if ph == _TAKE:
                kt = ch.take()
                if kt is None:
                    ch.idle[self.level].append(self)
                    return
                self.begin(*kt)
            elif ph == _PROLOGUE:
                self.phase = _RELEASE
                if not ch.release[self.k].triggered:
                    head = min(self.pre, ch.head_B)
                    if head > 0:  # PDL prologue: stream the first pages while the previous kernel runs
                        self.pre -= head
                        self.d = ch.first_byte(self.sm, self.k, self.t_in)
                        ch.first_in[self.t] = env.now + self.d
                        ch.hbm.start(head, ch.cap[self.k], self.d, self._prologue_in)
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
                ch.timeline.add(self.lane, self.w, env.now, self.t, "dependency wait")
                self.phase = _LOAD
            elif ph == _LOAD:
                self.since = env.now
                ch.start[self.t] = self.since  # the dependent part starts here (PDL prologue before)
                if ch.on_device[self.t]:  # a device function's fixed part needs only the release
                    rel_us = ch.released_at[self.k]
                    self.w0 = rel_us if rel_us > self.t_in else self.t_in
                else:
                    self.w0 = self.since
                self.phase = _COMPUTE
                if self.pre > 0:
                    sm = self.sm
                    if ch.sm_kernel[sm] == self.k:  # a later block of this kernel on the SM
                        d = first_byte_us(False, env.now, self.t_in, ch.cold_until[sm], ch.r)
                    else:
                        d = ch.first_byte(sm, self.k, self.t_in)
                    self.d = d
                    if ch.first_in[self.t] != ch.first_in[self.t]:  # NaN: no prologue streamed it
                        ch.first_in[self.t] = env.now + d
                    ch.hbm.start(self.pre, ch.cap[self.k], d, self._loaded)
                    return
            elif ph == _COMPUTE:
                if ch.warm_us is not None and ch.on_device[self.t]:  # from its inputs and first bytes
                    fi = ch.first_in[self.t]
                    rest = ch.warm_us[self.t] - (env.now - (fi if fi > self.w0 else self.w0))
                else:
                    rest = ch.work_us[self.t] - (env.now - self.w0)
                if rest < ch.tail_us[self.t]:  # a device function consumes the last page once it is in
                    rest = ch.tail_us[self.t]
                if rest > 0:
                    self.w = env.now
                    self.phase = _COMPUTED
                    env.timeout(rest).callbacks.append(self.run)
                    return
                self.phase = _END
            elif ph == _COMPUTED:
                ch.timeline.add(self.lane, self.w, env.now, self.t, "compute")
                self.phase = _END
            else:  # _END
                now, t, k = env.now, self.t, self.k
                ch.timeline.task(self.lane, self.t_in, now, t)
                ch.end[t] = now
                ch.lane_of[t] = self.lane
                ch.left[k] -= 1
                if ch.left[k] == 0:
                    ch.end_t[k] = now
                    ch.done[k].succeed()
                self.phase = _TAKE

    def _prologue_in(self) -> None:
        self.ch.timeline.flow(self.lane, self.t_in, self.d, self.ch.env.now, self.t)
        self.run()

    def _loaded(self) -> None:
        self.ch.timeline.flow(self.lane, self.since, self.d, self.ch.env.now, self.t)
        self.run()
