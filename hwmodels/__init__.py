"""Hardware models of GPU generations, one TOML data file each.

>>> import hwmodels
>>> "h200" in hwmodels.available()
True
"""

from ._loader import available, load, resolve
from ._schema import KERNEL_COST_KEYS, SECTIONS, GPUSpec, KernelCost, KernelSpec, Source

__all__ = ["KERNEL_COST_KEYS", "SECTIONS", "GPUSpec", "KernelCost", "KernelSpec", "Source", "available", "load",
           "resolve"]
