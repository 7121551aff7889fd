"""Hardware models of GPU generations, one TOML data file each.

>>> import hwmodels
>>> "h200" in hwmodels.available()
True

Importing hwmodels loads :mod:`hwmodels.errors` alone: the loader and the spec classes (the TOML
reader, some thirty dataclasses) load on first use of one of their names, so that a program that
only catches :class:`InputError` (``import mksim``, ``mksim --help``) does not pay for them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import HardwareError, HardwareFileError, UnknownGPUError

if TYPE_CHECKING:  # what __getattr__ below loads on first use
    from ._loader import (
        VALIDATION_FAMILIES,
        available,
        hardware_validation,
        load,
        profile_info,
        profiles,
        resolve,
        resolve_profile,
        split_profile,
    )
    from ._schema import KERNEL_COST_KEYS, SECTIONS, UNITS, GPUSpec, KernelCost, KernelSpec, Source, unit_of

__all__ = ["GPUSpec", "HardwareError", "HardwareFileError", "KERNEL_COST_KEYS", "KernelCost", "KernelSpec", "SECTIONS",
           "Source", "UNITS", "UnknownGPUError", "VALIDATION_FAMILIES", "available", "errors", "hardware_validation",
           "load", "profile_info", "profiles", "resolve", "resolve_profile", "split_profile", "unit_of"]

_LAZY = {
    **dict.fromkeys(("VALIDATION_FAMILIES", "available", "hardware_validation", "load", "profile_info", "profiles",
                     "resolve", "resolve_profile", "split_profile"), "._loader"),
    **dict.fromkeys(("KERNEL_COST_KEYS", "SECTIONS", "UNITS", "GPUSpec", "KernelCost", "KernelSpec", "Source",
                     "unit_of"), "._schema"),
}


def __getattr__(name: str) -> Any:  # PEP 562: the loader and the spec load on first use
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'hwmodels' has no attribute {name!r}")
