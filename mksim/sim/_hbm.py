"""DRAM as one shared bandwidth on a SimPy environment.

Concurrent transfers share the chip's bandwidth max-min fairly, each capped by what its
SM's bytes in flight allow (:func:`~mksim.costs.fair_share`). Flows with the same cap
form a class that advances one virtual clock (bytes served per flow), so a start or a
finish costs O(classes + log flows), not O(flows).

Rates are settled once per instant: starts and finishes only mark the HBM dirty, and one
late-priority event at the end of the instant recomputes the shares and schedules the next
wake. A hundred SMs starting loads at once cost one recomputation, not a hundred. A flow
that first waits out a DRAM latency sits in an arrival heap meanwhile, and the HBM's own
wakes let it join: no event per flow.

A flow started with :meth:`HBM.start_tracked` can say how many of its bytes have arrived while it
streams (:class:`Tracked`): an L2 prefetch's bytes that the loader catches up with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import NORMAL
from simpy.events import Event

from mksim.costs import fair_share

from ._env import Wake

_EPS = 1e-9
_INF = math.inf
_LATE = 2  # SimPy priority after NORMAL (1): runs once everything else at this instant has


class _Class:
    """Flows of one cap. Their ends are a heap of distinct clock values, each with its flows in the
    order they joined: the order of a heap of ``(v at end, join order, done)``, for a fraction of
    the comparisons (floats, not tuples)."""

    __slots__ = ("cap", "v", "rate", "n", "ends", "at")

    def __init__(self, cap: float):
        self.cap = cap
        self.v = 0.0       # bytes served to each member since the class was created
        self.rate = 0.0    # bytes per µs per member now
        self.n = 0         # members
        self.ends: list[float] = []  # heap of the v at which members end
        self.at: dict[float, list[Callable[[], object]]] = {}  # v at end -> its members' done, in join order


class Tracked:
    """A flow whose progress can be read while it streams: started by :meth:`HBM.start_tracked`,
    it calls ``done()`` when its last byte has arrived, as any flow does."""

    __slots__ = ("hbm", "nbytes", "at", "cls", "v0", "ended", "done")

    def __init__(self, hbm: HBM, nbytes: float, at_us: float, done: Callable[[], object]):
        self.hbm, self.nbytes, self.at, self.done = hbm, nbytes, at_us, done
        self.cls: _Class | None = None  # the class it streams in, once it has joined the share
        self.v0 = 0.0                   # ... and that class's clock when it joined
        self.ended = False

    def __call__(self) -> None:
        self.ended = True
        self.cls = None
        self.done()

    def served(self) -> float:
        """Bytes arrived so far (0 while its first-byte latency lasts)."""
        if self.ended:
            return self.nbytes
        c = self.cls
        if c is None:
            return 0.0
        v = c.v + c.rate * (self.hbm.env.now - self.hbm.t_last) - self.v0
        return min(self.nbytes, max(0.0, v))

    def rate(self) -> float:
        """Bytes per µs it draws now (0 before it has joined the share)."""
        c = self.cls
        return c.rate if c is not None and not self.ended else 0.0


def _settle_late(env: simpy.Environment, callback: Callable[[Any], object]) -> None:
    """Call ``callback`` after every ordinary event of this instant: a :class:`~._env.Wake` of a
    priority after NORMAL, put in SimPy's queue now."""
    w = Wake()
    w.callbacks.append(callback)  # type: ignore[arg-type]  # simpy types callbacks as returning None
    heappush(env._queue, (env._now, _LATE, next(env._eid), w))  # type: ignore[attr-defined, misc]


class HBM:
    """Shared DRAM bandwidth.

    ``start(nbytes, cap, delay_us, done)`` streams ``nbytes`` and calls ``done()`` when they
    have arrived; the flow joins the share ``delay_us`` from now (a first-byte latency).
    With ``record=True`` the total rate is logged as ``(time, bytes_per_us)`` steps, for
    the conformance tests (never above ``total_Bpus``).
    """

    def __init__(self, env: simpy.Environment, total_Bpus: float, record: bool = False,
                 knee: Callable[[float], float] | None = None):
        self.env = env
        # an engine Env's batched wake-ups (a wake of the HBM closes its instant's batch); any SimPy env works
        self._batches: dict[float, Any] = getattr(env, "_batches", {})
        self.total = total_Bpus
        # soft knee (mksim.costs.loaded_total_Bpus): the chip's rate for the flows' total demand
        # at the stream latency; every flow then draws the same fraction of its cap (latency grew)
        self.knee = knee
        self.rate_now = 0.0  # the chip's total rate since the last settle
        self.classes: dict[float, _Class] = {}
        self.t_last = 0.0
        self._gen = 0
        self._settling = False
        self._wake_at = _INF  # when the HBM next looks at its flows
        # flows in their first-byte latency: a heap of the distinct times they join, each with its
        # flows (nbytes, cap, done) in the order they started
        self.arrivals: list[float] = []
        self.arriving: dict[float, list[tuple[float, float, Callable[[], object]]]] = {}
        self.bytes_done = 0.0  # bytes asked for (counted as their flows join)
        self.arrived_B = 0.0   # bytes arrived, up to t_last (arrived_now: up to now)
        self.log: list[tuple[float, float]] | None = [] if record else None
        self.settle = self._settle  # bound once: one settle per instant

    # -- public -------------------------------------------------------------------------
    def start(self, nbytes: float, cap_Bpus: float, delay_us: float, done: Callable[[], object]) -> None:
        """Stream ``nbytes`` (> 0), joining the share ``delay_us`` from now; call ``done()``
        at the instant the last byte arrives."""
        now = self.env.now
        if delay_us > 0:
            at = now + delay_us
            same = self.arriving.get(at)
            if same is None:
                self.arriving[at] = [(nbytes, cap_Bpus, done)]
                heappush(self.arrivals, at)
            else:
                same.append((nbytes, cap_Bpus, done))
            if at < self._wake_at and not self._settling:  # the next wake must come sooner
                self._settling = True
                _settle_late(self.env, self.settle)
            return
        # join the share now
        if now != self.t_last:
            self._advance()
        self._add(nbytes, cap_Bpus, done)
        if not self._settling:
            self._settling = True
            _settle_late(self.env, self.settle)

    def start_tracked(self, nbytes: float, cap_Bpus: float, delay_us: float, done: Callable[[], object]) -> Tracked:
        """:meth:`start`, returning a :class:`Tracked` that says how much of the flow has arrived."""
        tr = Tracked(self, nbytes, self.env.now + delay_us, done)
        self.start(nbytes, cap_Bpus, delay_us, tr)
        return tr

    def arrived_now(self) -> float:
        """Bytes that have arrived since the start."""
        return self.arrived_B + self.rate_now * (self.env.now - self.t_last)

    @property
    def active(self) -> int:
        return sum(c.n for c in self.classes.values())

    # -- internals ------------------------------------------------------------------------
    def _add(self, nbytes: float, cap: float, done: Callable[[], object]) -> None:
        cls = self.classes.get(cap)
        if cls is None:
            cls = self.classes[cap] = _Class(cap)
        key = cls.v + nbytes  # when it ends, on the class's clock
        same = cls.at.get(key)
        if same is None:
            cls.at[key] = [done]
            heappush(cls.ends, key)
        else:
            same.append(done)
        cls.n += 1
        self.bytes_done += nbytes
        if isinstance(done, Tracked):  # its progress is read against the class's clock
            done.cls, done.v0 = cls, cls.v

    def _advance(self) -> None:
        dt = self.env.now - self.t_last
        if dt > 0:
            for c in self.classes.values():
                c.v += c.rate * dt
            self.arrived_B += self.rate_now * dt
        self.t_last = self.env.now

    def _finish_done(self) -> None:
        """Finish every flow that is done (within rounding); drop classes left empty."""
        done: list[Callable[[], object]] = []
        for key in list(self.classes):
            c = self.classes[key]
            v = c.v
            ends, lim = c.ends, v + _EPS * (v if v > 1.0 else 1.0)
            while ends and ends[0] <= lim:
                members = c.at.pop(heappop(ends))
                done += members
                c.n -= len(members)
            if not c.n:
                del self.classes[key]
        for fn in done:  # after the bookkeeping: a callback may start the next flow
            fn()

    def _settle(self, _ev: Event) -> None:
        # the shares of the flows left once this instant is over, and when the next one ends
        self._finish_done()
        self._settling = False
        classes = self.classes
        demand = 0.0
        if self.knee is not None:
            for c in classes.values():
                demand += c.cap * c.n
        if 0.0 < demand < _INF:
            frac = self.knee(demand) / demand  # type: ignore[misc]  # demand > 0 only with a knee
            nxt = _INF
            total = 0.0
            for c in classes.values():
                c.rate = c.cap * frac
                total += c.rate * c.n
                t_end = (c.ends[0] - c.v) / c.rate
                if t_end < nxt:
                    nxt = t_end
        elif len(classes) == 1:
            (c,) = classes.values()
            n = c.n
            level = self.total / n
            c.rate = c.cap if c.cap < level else level
            nxt = (c.ends[0] - c.v) / c.rate
            total = c.rate * n
        else:
            level = fair_share({k: c.n for k, c in classes.items()}, self.total)
            nxt = _INF
            total = 0.0
            for c in classes.values():
                c.rate = min(c.cap, level)
                total += c.rate * c.n
                nxt = min(nxt, (c.ends[0] - c.v) / c.rate)
        self.rate_now = total
        if self.log is not None:
            self.log.append((self.env.now, total))
        now = self.env.now
        if nxt < 0.0:
            nxt = 0.0
        if 0.0 < nxt < _INF and now + nxt == now:
            # the next flow ends within the clock's resolution (a sliver of bytes late in a long step):
            # serve it now and settle again this instant, or the wake would never move the clock
            for c in classes.values():
                c.v += c.rate * nxt
            self._settling = True
            _settle_late(self.env, self.settle)
            return
        if self.arrivals:
            # (at - now) + now == at exactly once now >= at / 2: arrivals are not rounded
            first = self.arrivals[0] - now
            if first < nxt:
                nxt = first
        self._gen += 1
        if nxt < _INF:
            self._wake_at = now + nxt
            w = Wake(self._gen)  # an env.timeout(nxt, self._gen)
            w.callbacks.append(self._wake)  # type: ignore[arg-type]
            self._batches.pop(now + nxt, None)
            heappush(self.env._queue, (now + nxt, NORMAL, next(self.env._eid), w))  # type: ignore[attr-defined, misc]
        else:
            self._wake_at = _INF

    def _wake(self, ev: Wake) -> None:
        if ev._value != self._gen:  # superseded by a later start or finish
            return
        self._wake_at = _INF
        self._advance()
        arrivals, now = self.arrivals, self.env.now
        if arrivals and arrivals[0] <= now:
            classes, arriving = self.classes, self.arriving
            while arrivals and arrivals[0] <= now:
                for nbytes, cap, done in arriving.pop(heappop(arrivals)):  # _add, inline (most flows join here)
                    cls = classes.get(cap)
                    if cls is None:
                        cls = classes[cap] = _Class(cap)
                    key = cls.v + nbytes
                    same = cls.at.get(key)
                    if same is None:
                        cls.at[key] = [done]
                        heappush(cls.ends, key)
                    else:
                        same.append(done)
                    cls.n += 1
                    self.bytes_done += nbytes
                    if isinstance(done, Tracked):
                        done.cls, done.v0 = cls, cls.v
        self._finish_done()
        if not self._settling:
            self._settling = True
            _settle_late(self.env, self.settle)
