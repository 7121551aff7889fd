"""The engine's SimPy environment: SimPy's own, with the clock as a plain attribute, a run loop
that steps without a method call per event, and batched wake-ups; and :class:`Proc`, a lean SimPy
process.

An engine run reads the clock a dozen times per task and steps once or twice per task; SimPy's
``now`` is a property and ``run`` calls ``step`` for each event, which together cost a tenth of a
run. :class:`Env` keeps every other part of SimPy (events, processes, the heap of ``(time,
priority, id, event)``), and processes events in the same order as :meth:`simpy.Environment.run`.

Most of a run's events are the engine's own wake-ups (a task's compute done, its producers seen,
its data in), and most fall on instants shared by many SMs: symmetric SMs finish alike. A heap of
``(time, priority, id, event)`` tuples pays a dozen tuple comparisons per push and pop where times
tie (each comparing time, then priority, then id). :meth:`Env.wake_at` puts the wake-ups of one
instant that follow each other in the queue's order in one :class:`Batch`, one heap entry, whose
callbacks run in the order they were added: the order the heap would have run them in.
An executor waits twice per task; :class:`Proc` resumes its generator as :class:`simpy.Process`
does, in the same order, for a third of the work.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from heapq import heappop, heappush
from typing import Any

import simpy
from simpy.core import NORMAL, URGENT
from simpy.events import Event


class Wake:
    """The lightest SimPy event, for the engine's own waits: what :meth:`Env.run` and :class:`Proc`
    read of an event (``callbacks``, ``_ok``, ``_value``) and no more. :meth:`Env.after` and
    :meth:`Env.fire` put one in SimPy's queue where a :class:`~simpy.events.Timeout` and
    :meth:`~simpy.events.Event.succeed` put theirs, at a third of the cost."""

    __slots__ = ("callbacks", "_value")
    _ok = True

    def __init__(self, value: Any = None) -> None:
        self.callbacks: list[Callable[[Any], None]] = []
        self._value = value


class Batch:
    """Wake-ups of one instant, one event in SimPy's queue (:meth:`Env.wake_at`): its one callback
    calls each of ``members`` with the batch, in the order they were added."""

    __slots__ = ("callbacks", "members")
    _ok = True
    _value = None

    def __init__(self, run: list[Callable[[Any], None]]) -> None:
        self.callbacks = run
        self.members: list[Callable[[Any], object]] = []


class Env(simpy.Environment):
    """A :class:`simpy.Environment` whose ``now`` is an attribute (set as each event is processed)
    and whose :meth:`run` without ``until`` processes the events in a loop of its own.

    >>> env = Env()
    >>> log = []
    >>> env.timeout(2.0).callbacks.append(lambda ev: log.append(env.now))
    >>> env.run()
    >>> log, env.now
    ([2.0], 2.0)
    """

    now: float = 0  # shadows simpy's property: an instance attribute, kept equal to ``_now``

    def __init__(self) -> None:
        super().__init__()
        self.now = self._now
        # SimPy's queue, which also holds Wakes and Batches
        self._events: list[tuple[float, int, int, Any]] = self._queue  # type: ignore[assignment]
        # the batch of each instant that wake-ups may still join: none was put in the queue at that
        # instant (priority NORMAL) after it, and it has not run
        self._batches: dict[float, Batch] = {}
        self._batch: Batch | None = None  # the batch running
        self._run_batch_cb: list[Callable[[Any], None]] = [self._run_batch]  # every batch's callbacks

    def schedule(self, event: Event, priority: int = NORMAL, delay: Any = 0) -> None:
        """SimPy's :meth:`~simpy.Environment.schedule`: ``event`` comes after the wake-ups of its
        instant batched so far (a later one starts a new batch)."""
        at = self._now + delay
        if priority == NORMAL:
            self._batches.pop(at, None)
        elif priority < NORMAL and delay == 0 and self._batch is not None:
            raise RuntimeError("an urgent event (a process starting) scheduled from a batched wake-up would run "
                               "before the rest of its batch: start it from an ordinary event")
        heappush(self._events, (at, priority, next(self._eid), event))

    def wake_at(self, at: float, fn: Callable[[Any], object]) -> None:
        """Call ``fn(batch)`` at ``at`` (>= now), where an event made now for it would be processed:
        after everything already in the queue for that instant, before anything put there later.
        Wake-ups of one instant added one after another share one :class:`Batch`.

        >>> env = Env()
        >>> log = []
        >>> env.wake_at(1.0, lambda b: log.append("a"))
        >>> env.timeout(1.0).callbacks.append(lambda e: log.append("timeout"))
        >>> env.wake_at(1.0, lambda b: log.append("b"))
        >>> env.wake_at(1.0, lambda b: log.append("c"))
        >>> env.run()
        >>> log, env.now
        (['a', 'timeout', 'b', 'c'], 1.0)
        """
        b = self._batches.get(at)
        if b is None:
            b = self.batch(at)
        b.members.append(fn)

    def batch(self, at: float) -> Batch:
        """A new :class:`Batch` at ``at``, in the queue: the one later wake-ups at ``at`` join."""
        b = self._batches[at] = Batch(self._run_batch_cb)
        heappush(self._events, (at, NORMAL, next(self._eid), b))
        return b

    def _run_batch(self, b: Batch) -> None:
        # members added while it runs (at this instant, nothing else put in the queue after it) run last
        self._batch = b
        for fn in b.members:
            fn(b)
        self._batch = None
        if self._batches.get(self._now) is b:
            del self._batches[self._now]

    def after(self, delay_us: float, value: Any = None) -> Wake:
        """A :class:`Wake` processed ``delay_us`` (>= 0) from now, with ``value``: an
        ``env.timeout(delay_us, value)``."""
        w = Wake(value)
        at = self._now + delay_us
        self._batches.pop(at, None)
        heappush(self._events, (at, NORMAL, next(self._eid), w))
        return w

    def fire(self, w: Wake, value: Any = None) -> None:
        """Trigger ``w`` (made by ``Wake()``, waiting) now with ``value``: an ``event.succeed(value)``."""
        w._value = value
        self._batches.pop(self._now, None)
        heappush(self._events, (self._now, NORMAL, next(self._eid), w))

    def start(self, co: Generator[None, Any, None]) -> None:
        """Run coroutine ``co`` as a :class:`Proc` would run a generator, where ``co`` resumes itself:
        it receives first an event whose ``_value`` is its own ``send`` (at an urgent event made
        now, as a process's ``Initialize``), and appends that to the callbacks of each event it
        waits for before it yields (nothing); the event's processing sends it the event. A wait
        costs no call in between, and the same events run in the same order as under a process.
        It never returns (it ends at a bare ``yield``, suspended for good): the event whose
        processing resumed it last would see the ``StopIteration``.

        >>> env = Env()
        >>> log = []
        >>> def co():
        ...     wake = (yield)._value
        ...     env.timeout(1.0).callbacks.append(wake)
        ...     ev = yield
        ...     log.append((env.now, ev.value))
        ...     yield  # done
        >>> env.start(co())
        >>> env.run()
        >>> log
        [(1.0, None)]
        """
        next(co)  # to its first yield
        w = Wake(co.send)
        w.callbacks.append(co.send)
        heappush(self._events, (self._now, URGENT, next(self._eid), w))

    def step(self) -> None:
        try:
            super().step()
        finally:  # also when the step stops a run(until=...)
            self.now = self._now

    def run(self, until: Any = None) -> Any:
        if until is not None:  # simpy's own loop, through step()
            return super().run(until)
        queue = self._queue
        while queue:
            now, _, _, event = heappop(queue)
            self._now = self.now = now
            callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                # a failed event nobody handled: raise a copy of its exception, as simpy does
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
        return None


class Proc:
    """Run ``generator`` as :class:`simpy.Process` would: it starts at an urgent event made now (as a
    process's ``Initialize``), and each event it yields resumes it once processed, in the order of
    that event's callbacks. Unlike a process it is no event itself (nothing can wait for it to end),
    and the engine's events never fail, so a failed one is not thrown into the generator.

    >>> env = Env()
    >>> log = []
    >>> def gen():
    ...     yield env.timeout(1.0)
    ...     log.append(env.now)
    >>> _ = Proc(env, gen())
    >>> env.run()
    >>> log
    [1.0]
    """

    __slots__ = ("gen", "resume")

    def __init__(self, env: simpy.Environment, generator: Generator[Event | Wake, Any, None]) -> None:
        self.gen = generator
        self.resume = self._resume  # bound once: appended to an event per wait
        start = Event(env)
        start._ok, start._value = True, None
        start.callbacks.append(self.resume)
        env.schedule(start, URGENT)

    def _resume(self, event: Event | Wake) -> None:
        send = self.gen.send
        try:
            nxt = send(event._value)
            while nxt.callbacks is None:  # processed already: go on at once, as simpy does
                nxt = send(nxt._value)
        except StopIteration:
            return
        nxt.callbacks.append(self.resume)


__all__ = ["Batch", "Env", "Proc", "Wake"]
