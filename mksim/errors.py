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

import os
from pathlib import Path
from typing import Any

from hwmodels.errors import HardwareError, HardwareFileError, UnknownGPUError, UnknownNameError
from hwmodels.errors import InputError as MksimError

__all__ = [
    "DeadlockError",
    "HardwareError",
    "HardwareFileError",
    "Interrupted",
    "MissingExtraError",
    "MksimError",
    "ScheduleError",
    "UnknownGPUError",
    "OutputError",
    "UnknownNameError",
    "WorkloadError",
]  # and check_writable, a helper rather than an error


class WorkloadError(MksimError, ValueError):
    """Impossible workload parameters (batch 0, negative context, bad config)."""


class ScheduleError(MksimError, ValueError):
    """A schedule that cannot run (task placed twice or never, shared memory over budget)."""


class DeadlockError(ScheduleError):
    """A schedule whose queue order makes tasks wait on each other in a cycle."""


class MissingExtraError(MksimError, ImportError):
    """An optional dependency (an extra of the mksim package) is not installed."""


class Interrupted(MksimError):
    """Ctrl-C stopped the work early. The CLI exits with status 130 (128 + SIGINT), as shells expect."""

    exit_code = 130


class OutputError(MksimError):
    """A result could not be written where asked. ``result``, when set, is the finished work that the
    file was to hold, so that a caller can still show it (nothing finished is lost)."""

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.result))


def check_writable(path: str | Path, flag: str) -> Path:
    """``path`` as a :class:`Path` if a file can be written there (its folder exists and is writable, and
    it is not a folder), else :class:`OutputError` naming ``flag``: checked before the work, so that a
    typo does not cost a finished run. Creates nothing.

    >>> check_writable("/nonexistent/dir/x.json", "--out")
    Traceback (most recent call last):
    ...
    mksim.errors.OutputError: --out /nonexistent/dir/x.json: folder /nonexistent/dir does not exist; create it first
    """
    p = Path(path)
    folder = p.parent
    if p.is_dir():
        raise OutputError(f"{flag} {p}: is a folder; give a file name")
    if not folder.is_dir():
        raise OutputError(f"{flag} {p}: folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise OutputError(f"{flag} {p}: cannot write there (permission denied); choose another path")
    return p
