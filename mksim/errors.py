"""Errors that mksim reports to users as one line.

Every error raised for bad input derives from :class:`MksimError`; the CLI prints
``error: <message>`` and exits with status 2, without a traceback. A message says
what is wrong and how to fix it.
"""

from __future__ import annotations

__all__ = [
    "MksimError",
    "HardwareFileError",
    "UnknownNameError",
    "WorkloadError",
    "ScheduleError",
    "DeadlockError",
]


class MksimError(Exception):
    """Base class of the errors mksim reports to the user in one line."""


class HardwareFileError(MksimError):
    """A hardware data file is malformed (missing or unknown key, bad unit or value)."""


class UnknownNameError(MksimError, KeyError):
    """A model, GPU, mode or policy name that mksim does not know."""

    def __init__(self, kind: str, name: str, known: list[str] | tuple[str, ...]):
        self.kind, self.name, self.known = kind, name, tuple(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class WorkloadError(MksimError, ValueError):
    """Impossible workload parameters (batch 0, negative context, bad config)."""


class ScheduleError(MksimError, ValueError):
    """A schedule that cannot run (task placed twice or never, shared memory over budget)."""


class DeadlockError(ScheduleError):
    """A schedule whose queue order makes tasks wait on each other in a cycle."""
