"""The megakernel designs and syncs, one file each.

The built-in ones register in ``design_names()``' order (below); every other module of this package
is imported after them, so a new design is one file here: a subclass of
:class:`~mksim.schedule.BaseDesign` decorated with :func:`~mksim.schedule.register_design`; and, if
it changes what happens in a run, its engine piece in ``mksim/sim/designs/``, and, if no existing
option turns it on, a field of :class:`~mksim.schedule.Options` (see docs/extending.md).
"""

from importlib import import_module
from pkgutil import iter_modules

# registered in this order: design_names()' order
BUILT_IN = ("sync", "dynamic", "dies", "movement", "moe_stride", "moe_queue", "moe_prefetch", "collective")

for _name in BUILT_IN + tuple(m.name for m in iter_modules(__path__) if m.name not in BUILT_IN):
    import_module(f"{__name__}.{_name}")  # registers what it defines

__all__: list[str] = []
