"""The built-in blocks, one file each; every other module of this package is imported after them, so
a new block is one file here: a :class:`~mksim.workload.BaseBlock` subclass decorated with
``@BLOCKS.add`` (see docs/extending.md, "A block")."""

from importlib import import_module
from pkgutil import iter_modules

# registered in this order: each role's first block is the one a config that names none gets
BUILT_IN = ("embedding", "attention", "mlp", "head")

for _name in BUILT_IN + tuple(m.name for m in iter_modules(__path__) if m.name not in BUILT_IN):
    import_module(f"{__name__}.{_name}")  # registers what it defines

__all__: list[str] = []
