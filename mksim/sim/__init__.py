"""The simulator: a SimPy engine of SMs, shared HBM, launches, barriers and counters.

Its durations come from :mod:`mksim.costs`; what differs between execution modes, from their
classes in :mod:`mksim.schedule`; what a megakernel design changes in a run, from its engine piece
(:class:`DesignRun`, one file per design in :mod:`mksim.sim.designs`, registered with :func:`runs`).
"""

from ._design_run import RUNS, DesignRun, runs
from ._engine import simulate
from ._result import CATEGORIES, SimResult, task_experts
from .designs.dies import die_traffic

__all__ = ["CATEGORIES", "RUNS", "DesignRun", "SimResult", "die_traffic", "runs", "simulate", "task_experts"]
