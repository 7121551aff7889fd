"""DRAM as one shared bandwidth on a SimPy environment.

Concurrent transfers share the chip's bandwidth max-min fairly, each capped by what its
SM's bytes in flight allow (:func:`~mksim.sim._costs.fair_share`). Flows with the same cap
form a class that advances one virtual clock (bytes served per flow), so a start or a
finish costs O(classes + log flows), not O(flows).
"""

from __future__ import annotations

import heapq
from itertools import count

import simpy

from ._costs import fair_share

_EPS = 1e-9


class _Class:
    __slots__ = ("cap", "v", "rate", "heap")

    def __init__(self, cap: float):
        self.cap = cap
        self.v = 0.0       # bytes served to each member since the class was created
        self.rate = 0.0    # bytes per µs per member now
        self.heap: list[tuple[float, int, simpy.Event]] = []


class HBM:
    """Shared DRAM bandwidth. ``transfer(nbytes, cap)`` returns an event that fires when done.

    With ``record=True`` the total rate is logged as ``(time, bytes_per_us)`` steps, for
    the conformance tests (never above ``total_Bpus``).
    """

    def __init__(self, env: simpy.Environment, total_Bpus: float, record: bool = False):
        self.env = env
        self.total = total_Bpus
        self.classes: dict[float, _Class] = {}
        self.t_last = 0.0
        self._gen = 0
        self._seq = count()
        self.bytes_done = 0.0
        self.log: list[tuple[float, float]] | None = [] if record else None

    # -- public -------------------------------------------------------------------------
    def transfer(self, nbytes: float, cap_Bpus: float) -> simpy.Event:
        ev = self.env.event()
        if nbytes <= 0:
            ev.succeed()
            return ev
        self._advance()
        cls = self.classes.get(cap_Bpus)
        if cls is None:
            cls = self.classes[cap_Bpus] = _Class(cap_Bpus)
        heapq.heappush(cls.heap, (cls.v + nbytes, next(self._seq), ev))
        self.bytes_done += nbytes
        self._reschedule()
        return ev

    @property
    def active(self) -> int:
        return sum(len(c.heap) for c in self.classes.values())

    # -- internals ------------------------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self.t_last
        if dt > 0:
            for c in self.classes.values():
                c.v += c.rate * dt
        self.t_last = self.env.now

    def _reschedule(self) -> None:
        # finish every flow that is done (within rounding), then recompute rates
        for key in list(self.classes):
            c = self.classes[key]
            while c.heap and c.heap[0][0] <= c.v + _EPS * max(1.0, c.v):
                _, _, ev = heapq.heappop(c.heap)
                ev.succeed()
            if not c.heap:
                del self.classes[key]
        level = fair_share({k: len(c.heap) for k, c in self.classes.items()}, self.total)
        nxt = float("inf")
        total = 0.0
        for c in self.classes.values():
            c.rate = min(c.cap, level)
            total += c.rate * len(c.heap)
            nxt = min(nxt, (c.heap[0][0] - c.v) / c.rate)
        if self.log is not None:
            self.log.append((self.env.now, total))
        self._gen += 1
        if nxt < float("inf"):
            gen = self._gen
            self.env.timeout(max(nxt, 0.0)).callbacks.append(lambda _e, g=gen: self._wake(g))

    def _wake(self, gen: int) -> None:
        if gen != self._gen:  # superseded by a later start or finish
            return
        self._advance()
        self._reschedule()
