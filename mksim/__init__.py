"""mksim: simulate GPU megakernels and kernel chains before writing them.

Importing mksim is light: the standard library and mksim's errors. Its names and subpackages load on
first use (``mksim.models`` loads the models and workloads, with numpy; ``mksim.simulate`` the
engine, with SimPy); torch, dash and cupy load only where used.

>>> import mksim
>>> wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=1024)
>>> wl.phase, wl.batch
('decode', 1)
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from . import errors  # noqa: E402  (light: every command and reader catches its errors)
from .errors import DeadlockError, MksimError  # noqa: E402

if TYPE_CHECKING:  # what __getattr__ below loads on first use (the others are typed where they are imported)
    from . import models, workload
    from .workload import Step

__all__ = ["DeadlockError", "MODES", "MksimError", "POLICIES", "Schedule", "SimResult", "Step", "__version__",
           "build_schedule", "errors", "models", "simulate", "workload"]

_LAZY: dict[str, str] = {
    "simulate": ".sim",
    "SimResult": ".sim",
    "build_schedule": ".schedule",
    "Schedule": ".schedule",
    "MODES": ".schedule",
    "POLICIES": ".schedule",
    "Step": ".workload",
}
#: subpackages and modules that ``mksim.<name>`` imports on first use, as ``import mksim.<name>`` does
_SUBMODULES = frozenset({"catalog", "compare", "console", "costs", "extras", "models", "registry", "report", "schedule",
                         "search", "sim", "tables", "target", "trace", "trace_map", "trace_read", "workload"})


def __getattr__(name: str) -> Any:  # PEP 562: heavy parts load on first use
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    if name in _SUBMODULES:
        return import_module(f".{name}", __name__)  # the import binds it: found directly from now on
    raise AttributeError(f"module 'mksim' has no attribute {name!r}")
