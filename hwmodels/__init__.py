"""Hardware models of GPU generations, one TOML data file each.

>>> import hwmodels
>>> "h200" in hwmodels.available()
True
"""

from . import errors
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
from .errors import HardwareError, HardwareFileError, UnknownGPUError

__all__ = ["GPUSpec", "HardwareError", "HardwareFileError", "KERNEL_COST_KEYS", "KernelCost", "KernelSpec", "SECTIONS",
           "Source", "UNITS", "UnknownGPUError", "VALIDATION_FAMILIES", "available", "errors", "hardware_validation",
           "load", "profile_info", "profiles", "resolve", "resolve_profile", "split_profile", "unit_of"]
