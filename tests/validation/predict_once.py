"""Each schedule the validation suite's tests predict is simulated once per test process.

The suite's tests predict the same few schedules again and again: the small runs of a fake GPU
(``run_suite`` predicts, then ``summarize`` predicts again), the documented commands (the whole suite
with ``--dry-run``, then resumed, in two parts, for one model) and the report of the measured run, whose
schedules (read back from ``measured.json``) are the ones the suite's dry run built. A prediction is a
pure function of the schedule, so :func:`predicted_us` keeps each one by the schedule's content: its
saved form (:meth:`mksim.Schedule.to_dict`, less the workload's recipe), its workload (the ops built,
compared by value: a recipe saved before a build option existed reads back with that option's default)
and its hardware model (by value: a test may hand a changed copy the same name).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import validation.suite as vs
import validation.suite.core as core

#: the saved form (less the workload) -> [(workload, gpu, µs)]
_DONE: dict[str, list[tuple[Any, Any, float]]] = {}
#: how many predictions were asked for, and how many simulated (tests check the memo is used)
COUNTS = {"asked": 0, "simulated": 0}
_REAL = core.predicted_us


def _key(schedule) -> str | None:
    try:
        saved = schedule.to_dict()
    except Exception:  # noqa: BLE001 - a schedule that cannot be saved is simulated every time
        return None
    saved.pop("workload")
    return json.dumps(saved, sort_keys=True, default=str)


def predicted_us(schedule) -> float:
    """:func:`validation.suite.predicted_us`, simulated once per schedule (by content) in this process."""
    COUNTS["asked"] += 1
    key = _key(schedule)
    if key is None:
        COUNTS["simulated"] += 1
        return _REAL(schedule)
    for wl, gpu, us in _DONE.get(key, ()):
        if wl == schedule.workload and gpu == schedule.gpu:
            return us
    COUNTS["simulated"] += 1
    us = _REAL(schedule)
    _DONE.setdefault(key, []).append((schedule.workload, schedule.gpu, us))
    return us


def patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every caller of the suite's ``predicted_us`` (the package's name, and the module's own
    callers: ``summarize``) use :func:`predicted_us`."""
    monkeypatch.setattr(vs, "predicted_us", predicted_us)
    monkeypatch.setattr(core, "predicted_us", predicted_us)
