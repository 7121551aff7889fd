"""Errors that mksim reports to users as one line.

Every error raised for bad input derives from :class:`MksimError`; the CLI prints
``error: <message>`` and exits with status 2, without a traceback. A message says
what is wrong and how to fix it.

``MksimError`` is :class:`hwmodels.errors.InputError`, the root that the hardware layer defines:
hwmodels sits below mksim and may not import it, yet ``except MksimError`` must catch a bad
hardware file (:class:`HardwareFileError`) or an unknown GPU (:class:`UnknownGPUError`) too. Every
class here pickles, so an error raised in a worker process is raised again in the parent.

>>> import hwmodels
>>> try:
...     hwmodels.load("h900")
... except MksimError as exc:
...     print(type(exc).__name__)
UnknownGPUError
"""

from __future__ import annotations

from hwmodels.errors import HardwareError, HardwareFileError, UnknownGPUError, UnknownNameError
from hwmodels.errors import InputError as MksimError

__all__ = [
    "DeadlockError",
    "HardwareError",
    "HardwareFileError",
    "MissingExtraError",
    "MksimError",
    "ScheduleError",
    "UnknownGPUError",
    "UnknownNameError",
    "WorkloadError",
]


class WorkloadError(MksimError, ValueError):
    """Impossible workload parameters (batch 0, negative context, bad config)."""


class ScheduleError(MksimError, ValueError):
    """A schedule that cannot run (task placed twice or never, shared memory over budget)."""


class DeadlockError(ScheduleError):
    """A schedule whose queue order makes tasks wait on each other in a cycle."""


class MissingExtraError(MksimError, ImportError):
    """An optional dependency (an extra of the mksim package) is not installed."""
