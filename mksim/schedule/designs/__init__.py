"""The megakernel designs and syncs, one file each.

The built-in ones register in ``design_names()``' order (below); every other module of this package
is imported after them, so a new design is one file here: a subclass of
:class:`~mksim.schedule.BaseDesign` decorated with :func:`~mksim.schedule.register_design` (see
docs/extending.md).
"""

from importlib import import_module
from pkgutil import iter_modules

# isort: off  (the order of registration is design_names()' order)
from . import sync, dynamic, dies, movement  # noqa: F401,I001
# isort: on

for _m in iter_modules(__path__):
    import_module(f"{__name__}.{_m.name}")  # the designs added beside the built-in ones

__all__: list[str] = []
