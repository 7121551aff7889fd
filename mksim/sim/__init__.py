"""The simulator: a SimPy engine of SMs, shared HBM, launches, barriers and counters.

Its durations come from :mod:`mksim.costs`; what differs between execution modes and megakernel
designs, from their classes in :mod:`mksim.schedule`.
"""

from ._dies import die_traffic
from ._engine import simulate
from ._result import CATEGORIES, SimResult

__all__ = ["CATEGORIES", "SimResult", "die_traffic", "simulate"]
