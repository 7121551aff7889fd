"""The simulator: a SimPy engine of SMs, shared HBM, launches, barriers and counters."""

from ._engine import simulate
from ._result import CATEGORIES, SimResult

__all__ = ["CATEGORIES", "SimResult", "simulate"]
