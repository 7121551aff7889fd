"""The engine piece of native data movement: the cost model's generation movement, and a loader
that issues every copy itself."""

from __future__ import annotations

from typing import Any

from mksim.costs import copy_issue_Bpus
from mksim.schedule.designs.movement import NativeMovement

from .._actors import Loader
from .._design_run import DesignRun, runs


@runs(NativeMovement)
class NativeMovementRun(DesignRun):
    """Tasks cost what the generation's movement makes them (:func:`mksim.costs.task_times`'s
    ``native``); one loader warp issues every copy: a pipeline starts a copy late, and streams no
    faster than the copies are issued (:func:`~mksim.costs.copy_issue_Bpus`)."""

    def task_times_options(self) -> dict[str, Any]:
        return {"native": True}

    def loader(self, ld: Loader) -> None:
        r = self.eng.r
        ld.issue_us = r.async_copy_issue_us
        ld.cap = min(ld.cap, copy_issue_Bpus(r))
