"""``megakernel``: one persistent kernel, each task waiting for its own producers."""

from __future__ import annotations

from .._modes import PersistentMode, register_mode


@register_mode
class Megakernel(PersistentMode):
    """One block per SM runs its own queue; a task starts once its producers are seen (the
    schedule's ``sync``), while the SM's loader prefetches the next tasks' weights. Its designs
    (sync, dispatch, dies, movement) are in :mod:`mksim.schedule.designs`."""

    name = "megakernel"
    search_order = 0
    defaults = {"tasks_per_sm": 1.0, "blocks_per_sm": 1, "prefetch_depth": 4}
