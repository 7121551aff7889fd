"""Errors reported to the user as one line, rooted in the lowest layer.

:class:`InputError` is the root of every one-line error of the mksim distribution: hwmodels
raises its subclasses, and :mod:`mksim.errors` re-exports it as ``MksimError`` and derives its own
errors from it. The root lives here, in the layer that every other package imports, so that
``except MksimError`` catches a bad hardware file without hwmodels importing mksim.

Every class survives a process boundary (pickling), so an error raised in a worker process is
raised again, with its message, in the parent.

>>> import pickle
>>> e = pickle.loads(pickle.dumps(UnknownGPUError("GPU", "h900", ["h100", "h200"])))
>>> str(e), e.known
("unknown GPU 'h900'; known: h100, h200", ('h100', 'h200'))
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["HardwareError", "HardwareFileError", "InputError", "UnknownGPUError", "UnknownNameError"]


class InputError(Exception):
    """Root of the errors reported to the user in one line (``error: ...``, exit status 2)."""


class UnknownNameError(InputError, KeyError):
    """A name that is not known (a GPU, model, mode, policy or design); the message lists the known ones."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        self.kind, self.name, self.known = kind, name, tuple(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])

    def __reduce__(self) -> tuple[Any, ...]:  # unpickling calls __init__ with these, not with the message
        return (type(self), (self.kind, self.name, self.known))


class HardwareError(InputError):
    """Base of the errors of hardware models (:mod:`hwmodels`)."""


class HardwareFileError(HardwareError):
    """A hardware data file is malformed (missing or unknown key, bad unit or value)."""


class UnknownGPUError(HardwareError, UnknownNameError):
    """A GPU name that is neither a built-in nor a calibrated hardware model."""
