"""The engine piece of dynamic dispatch (MPK): scheduler warps hand each task to its worker SM when
the event it waits for fires."""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from mksim.costs import dispatch_times_us
from mksim.schedule.designs.dynamic import DynamicDispatch, dispatch_layout

from .._actors import Loader, Signal
from .._design_run import DesignRun, Handover, runs
from .._env import Proc


@runs(DynamicDispatch)
class DynamicDispatchRun(DesignRun):
    """Each op's tasks wait for one event, fired by the last of their producers (with ``prelaunch``
    events of look-ahead: of whole ops that many levels up); the scheduler warps that own the tasks'
    worker SMs see it and hand the tasks out one by one (:func:`~mksim.costs.dispatch_times_us`).
    A worker runs a task once it has it, and a loader cannot stream a task's weights before then;
    the scheduler SMs run no task: their time is dispatch."""

    def setup(self) -> None:
        eng = self.eng
        s, g = eng.s, eng.g
        self.workers, self.n_sched, _ = dispatch_layout(s.gpu, s.options.schedulers)
        self.sched_of_sm = [w * self.n_sched // self.workers for w in range(self.workers)] if self.workers else []
        self.sm_of = [0] * len(g)
        for sm, q in enumerate(s.queues or []):
            for t in q:
                self.sm_of[t] = sm
        self.arrived = bytearray(len(g))
        self.signals: dict[int, Signal] = {}
        self.waiting: dict[int, Loader] = {}  # loaders waiting for a task to be handed over
        self.free_us = [0.0] * self.n_sched
        prods = [self._producers(j) for j in range(len(g.ops))]
        self.prods = prods
        for j in range(len(g.ops)):
            Proc(eng.env, self._dispatch(j, s.options.prelaunch))

    def handover(self) -> Handover:
        # handed over early (prelaunch): the worker then waits for its producers' counters itself
        return self.arrived, self.arrival, self.eng.s.options.prelaunch > 0

    def loader(self, ld: Loader) -> None:
        ld.gate = (self.arrived, self._gated)

    def after_run(self) -> None:
        # scheduler SMs spend the kernel dispatching
        eng = self.eng
        eng.timeline.us["dependency wait"] += (float(np.max(eng.end)) - eng.t0) * (eng.r.n_sms - self.workers)

    # -- the schedulers ----------------------------------------------------------------------
    def arrival(self, t: int) -> Signal:
        """The signal of task ``t``'s hand-over to its SM."""
        ev = self.signals.get(t)
        if ev is None:
            ev = self.signals[t] = Signal(self.eng.env)

            def arrive(_e: object, t: int = t) -> None:
                self.arrived[t] = 1
                ld = self.waiting.pop(t, None)
                if ld is not None:
                    ld.run()
            ev.callbacks.append(arrive)
        return ev

    def _gated(self, t: int, loader: Loader) -> None:
        """``loader`` waits for task ``t`` to be handed to its SM."""
        self.waiting[t] = loader

    def _producers(self, j: int) -> dict[int, tuple[int, int]]:
        """The producer tile range each producer op of op ``j``'s tasks covers (one event)."""
        deps, op_first = self.eng.g.deps, self.eng.op_first
        out: dict[int, tuple[int, int]] = {}
        for t in range(op_first[j], op_first[j + 1]):
            for p, a, b in deps(t):
                got = out.get(p)
                if got is None:
                    out[p] = (a, b)
                elif a < got[0] or b > got[1]:
                    out[p] = (min(got[0], a), max(got[1], b))
        return out

    def _launchers(self, j: int, ahead: int) -> dict[int, tuple[int, int]]:
        """What op ``j``'s launch event waits for: its producers, or with ``ahead`` events of
        prelaunch, whole ops that many levels further up (nothing: handed out at the start)."""
        if ahead == 0:
            return self.prods[j]
        out: dict[int, tuple[int, int]] = {}
        for p in self.prods[j]:
            for q in self._launchers(p, ahead - 1):
                out[q] = (0, self.eng.n_tiles[q])
        return out

    def _dispatch(self, j: int, ahead: int) -> Generator:
        eng = self.eng
        op_first, n_tiles, op_done_n, op_end, end = eng.op_first, eng.n_tiles, eng.op_done_n, eng.op_end, eng.end
        last = -1.0
        for p, (a, b) in self._launchers(j, ahead).items():
            if b - a == n_tiles[p]:
                if op_done_n[p] < b - a:
                    yield eng.op_signal(p)
                e = op_end[p]
            else:
                base = op_first[p]
                for k in range(base + a, base + b):
                    if end[k] != end[k]:
                        yield eng.task_signal(k)
                e = max(end[base + a:base + b])
            if e > last:
                last = e
        # the schedulers see the event; the first tasks (no producers) as the kernel starts
        seen = last + eng.r.dispatch_event_us if last >= 0 else eng.t0
        by_sched: dict[int, list[int]] = {}
        sched_of_sm, sm_of, free, arrival = self.sched_of_sm, self.sm_of, self.free_us, self.arrival
        for t in range(op_first[j], op_first[j + 1]):
            by_sched.setdefault(sched_of_sm[sm_of[t]], []).append(t)
        now = eng.env.now
        for sc, ts in by_sched.items():
            times, free[sc] = dispatch_times_us(seen, free[sc], len(ts), eng.r)
            for t, a_us in zip(ts, times, strict=True):
                arrival(t).succeed_after(a_us - now)
