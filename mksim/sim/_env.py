"""The engine's SimPy environment: SimPy's own, with the clock as a plain attribute and a run loop
that steps without a method call per event.

An engine run reads the clock a dozen times per task and steps once or twice per task; SimPy's
``now`` is a property and ``run`` calls ``step`` for each event, which together cost a tenth of a
run. :class:`Env` keeps every other part of SimPy (events, processes, the heap of ``(time,
priority, id, event)``), and processes events in the same order as :meth:`simpy.Environment.run`.
"""

from __future__ import annotations

from heapq import heappop
from typing import Any

import simpy


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

    def step(self) -> None:
        super().step()
        self.now = self._now

    def run(self, until: Any = None) -> Any:
        if until is not None:  # simpy's own loop, through step()
            return super().run(until)
        queue = self._queue
        while queue:
            self._now, _, _, event = heappop(queue)
            self.now = self._now
            callbacks, event.callbacks = event.callbacks, None  # type: ignore[assignment]
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                # a failed event nobody handled: raise a copy of its exception, as simpy does
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
        return None


__all__ = ["Env"]
