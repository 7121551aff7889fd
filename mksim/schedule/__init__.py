"""Schedules: execution modes, megakernel placement policies, validation, JSON."""

from ._build import MODE_DEFAULTS, build_schedule, workload_from_spec
from ._policies import POLICIES, BasePolicy, get_policy, task_costs
from ._schedule import (CHAIN_MODES, DISPATCHES, MODES, PERSISTENT_MODES, SYNCS, Options, Schedule, dispatch_layout,
                        find_deadlock)

__all__ = ["BasePolicy", "CHAIN_MODES", "DISPATCHES", "MODES", "MODE_DEFAULTS", "Options", "PERSISTENT_MODES",
           "POLICIES", "SYNCS", "Schedule", "build_schedule", "dispatch_layout", "find_deadlock", "get_policy",
           "task_costs", "workload_from_spec"]
