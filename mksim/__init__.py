"""mksim: simulate GPU megakernels and kernel chains before writing them.

Importing mksim is light: numpy and the standard library. SimPy, torch, dash and cupy
load only where used.

>>> import mksim
>>> wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
>>> wl.phase, wl.batch
('decode', 1)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

from . import errors, models, workload  # noqa: E402  (light modules)
from .errors import DeadlockError, MksimError  # noqa: E402
from .workload import Step  # noqa: E402

__all__ = ["DeadlockError", "MODES", "MksimError", "POLICIES", "Schedule", "SimResult", "Step", "__version__",
           "build_schedule", "errors", "models", "simulate", "workload"]

_LAZY: dict[str, str] = {
    "simulate": ".sim",
    "SimResult": ".sim",
    "build_schedule": ".schedule",
    "Schedule": ".schedule",
    "MODES": ".schedule",
    "POLICIES": ".schedule",
}


def __getattr__(name: str) -> Any:  # PEP 562: heavy parts load on first use
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'mksim' has no attribute {name!r}")
