"""The execution modes, one file each.

The built-in ones register in ``MODES``' order (below); every other module of this package is
imported after them, so a new mode is one file here: a subclass of
:class:`~mksim.schedule.ChainMode` or :class:`~mksim.schedule.PersistentMode` decorated with
:func:`~mksim.schedule.register_mode` (see docs/extending.md).
"""

from importlib import import_module
from pkgutil import iter_modules

# isort: off  (the order of registration is MODES' order)
from . import stream, graph, graph_pdl, persistent_barrier, megakernel  # noqa: F401,I001
# isort: on

for _m in iter_modules(__path__):
    import_module(f"{__name__}.{_m.name}")  # the modes added beside the built-in ones

__all__: list[str] = []
