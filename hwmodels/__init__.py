"""Hardware models of GPU generations, one TOML data file each.

>>> import hwmodels
>>> "h200" in hwmodels.available()
True
"""

from ._loader import available, load, resolve
from ._schema import SECTIONS, GPUSpec, Source

__all__ = ["GPUSpec", "SECTIONS", "Source", "available", "load", "resolve"]
