"""The execution modes, one file each.

The built-in ones register in ``MODES``' order (below); every other module of this package is
imported after them, so a new mode is one file here: a subclass of
:class:`~mksim.schedule.ChainMode` or :class:`~mksim.schedule.PersistentMode` decorated with
:func:`~mksim.schedule.register_mode` (see docs/extending.md).
"""

from importlib import import_module
from pkgutil import iter_modules

# registered in this order: MODES' order
BUILT_IN = ("stream", "graph", "graph_pdl", "persistent_barrier", "megakernel")

for _name in BUILT_IN + tuple(m.name for m in iter_modules(__path__) if m.name not in BUILT_IN):
    import_module(f"{__name__}.{_name}")  # registers what it defines

__all__: list[str] = []
