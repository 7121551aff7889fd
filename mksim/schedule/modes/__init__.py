"""The built-in execution modes, one file each, registered in this order (``MODES``' order).

A new mode is a file here (a subclass of :class:`~mksim.schedule.ChainMode` or
:class:`~mksim.schedule.PersistentMode` decorated with :func:`~mksim.schedule.register_mode`) and
its import below; see docs/extending.md.
"""

# isort: off  (the order of registration is MODES' order)
from . import stream, graph, graph_pdl, persistent_barrier, megakernel  # noqa: F401,I001
# isort: on

__all__: list[str] = []
