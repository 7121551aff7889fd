"""The engine pieces of the megakernel designs, one file each (:mod:`mksim.sim._design_run` says when
the engine calls their hooks). Every module of this package is imported, so a design's piece is one
file here: a :class:`~mksim.sim.DesignRun` subclass decorated with :func:`~mksim.sim.runs` (the
design's class).
"""

from importlib import import_module
from pkgutil import iter_modules

for _m in iter_modules(__path__):
    import_module(f"{__name__}.{_m.name}")  # registers what it defines

__all__: list[str] = []
