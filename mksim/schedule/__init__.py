"""Schedules: execution modes, megakernel designs and placement policies, validation, JSON.

Modes (:class:`BaseMode`) and megakernel designs (:class:`BaseDesign`) are classes in registries:
``MODES``, ``CHAIN_MODES``, ``PERSISTENT_MODES``, ``SYNCS`` and :func:`design_names` list what is
registered (docs/extending.md: how to add one).

>>> from mksim.schedule import CHAIN_MODES, MODES, design_names
>>> MODES
('stream', 'graph', 'graph_pdl', 'persistent_barrier', 'megakernel')
>>> "graph" in CHAIN_MODES, design_names()[0]
(True, 'sentinel')
"""

from importlib import import_module

from mksim.costs import task_costs
from mksim.registry import Names  # re-exported: the registries' live name lists

from ._build import build_schedule, check_fits, gc_paused
from ._designs import (
    DESIGN_REGISTRY,
    SYNC_REGISTRY,
    SYNCS,
    BaseDesign,
    BaseSync,
    active_designs,
    design_names,
    design_rows,
    get_design,
    get_sync,
    register_design,
    register_sync,
    registered_designs,
    unregister_design,
)
from ._modes import (
    CHAIN_MODES,
    MODE_DEFAULTS,
    MODES,
    PERSISTENT_MODES,
    BaseMode,
    ChainMode,
    PersistentMode,
    get_mode,
    modes_on,
    register_mode,
    unregister_mode,
)
from ._policies import ORDERS, POLICIES, BasePolicy, get_policy, register_policy, task_order
from ._schedule import Options, Schedule, find_deadlock, workload_from_spec

# The built-in designs and modes, and any file added beside them, register as they are imported: last,
# so that such a file can import what it needs from mksim.schedule.
designs = import_module(f"{__name__}.designs")
modes = import_module(f"{__name__}.modes")
DISPATCHES, dispatch_layout = designs.dynamic.DISPATCHES, designs.dynamic.dispatch_layout
MOVEMENTS = designs.movement.MOVEMENTS

__all__ = ["BaseDesign", "BaseMode", "BasePolicy", "BaseSync", "CHAIN_MODES", "ChainMode", "DESIGN_REGISTRY",
           "DISPATCHES", "MODES", "MODE_DEFAULTS", "MOVEMENTS", "Names", "ORDERS", "Options", "PERSISTENT_MODES",
           "POLICIES", "PersistentMode", "SYNCS", "SYNC_REGISTRY", "Schedule", "active_designs", "build_schedule",
           "check_fits", "design_names", "design_rows", "designs", "dispatch_layout", "find_deadlock", "gc_paused",
           "get_design", "get_mode", "get_policy", "get_sync", "modes", "modes_on", "register_design", "register_mode",
           "register_policy", "register_sync", "registered_designs", "task_costs", "task_order", "unregister_design",
           "unregister_mode", "workload_from_spec"]
