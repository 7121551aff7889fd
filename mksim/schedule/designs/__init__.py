"""The built-in megakernel designs and syncs, one file each, registered in this order.

A new design is a file here (a subclass of :class:`~mksim.schedule.BaseDesign` decorated with
:func:`~mksim.schedule.register_design`) and its import below; see docs/extending.md.
"""

# isort: off  (the order of registration is design_names()' order)
from . import sync, dynamic, dies, movement  # noqa: F401,I001
# isort: on

__all__: list[str] = []
