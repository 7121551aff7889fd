"""``graph_pdl``: a CUDA graph with programmatic dependent launch (PDL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hwmodels import GPUSpec
from mksim.costs import Rates
from mksim.errors import ScheduleError

from .._modes import ChainMode, register_mode

if TYPE_CHECKING:
    from .._schedule import Options, Schedule

TRIGGERS = ("early", "late", "never")


# compute capability of the NVIDIA generations before Hopper that a hardware file may describe
COMPUTE_CAPABILITY = {"volta": "7.0", "turing": "7.5", "ampere": "8.0", "ada": "8.9"}


@register_mode
class GraphPDL(ChainMode):
    """Kernel ``k`` is dispatched ``pdl_node_us`` after kernel ``k - 1`` triggers it (``pdl_trigger``:
    at its start by default, after its main loop, or at its end); its blocks that find a slot
    prefetch up to ``prefetch_depth`` pages of their weights (the prologue), and their dependent part
    waits until kernel ``k - 1`` ends + ``pdl_node_us``."""

    name = "graph_pdl"
    search_order = 1
    defaults = {"tasks_per_sm": 2.0, "blocks_per_sm": 2, "prefetch_depth": 2}
    waits_for_previous_end = False
    separate_release = True

    def available_on(self, gpu: GPUSpec) -> str | None:
        """PDL is a launch attribute of compute capability 9.0 and later (Hopper, Blackwell); HIP has
        none. A hardware file without ``launch.pdl_node_us`` says the GPU has none."""
        if gpu.launch.pdl_node_us is not None:
            return None
        arch = gpu.architecture.lower()
        if gpu.vendor == "amd":
            why = f"AMD {gpu.architecture}: HIP has no PDL"
        elif arch in COMPUTE_CAPABILITY:
            why = f"compute capability {COMPUTE_CAPABILITY[arch]}; PDL needs 9.0 or later"
        else:
            why = "its hardware file gives no launch.pdl_node_us"
        return f"{gpu.name} has no programmatic dependent launch ({why})"

    def dispatch_after(self, options: Options) -> str:
        """Where kernel ``k - 1`` triggers its dependents (``pdl_trigger``): at its start (early), or
        after its main loop (late) — once every block's work is done, which in this model is its end,
        the same instant as never."""
        return "start" if options.pdl_trigger == "early" else "end"

    def dispatch_us(self, k: int, prev_start_us: float, prev_end_us: float, r: Rates) -> float:
        if k == 0:
            return r.launch_latency_us
        trigger = prev_start_us if prev_end_us != prev_end_us else prev_end_us  # NaN: an early trigger
        return max(trigger + r.pdl_node_us, r.launch_latency_us)

    def validate(self, schedule: Schedule) -> None:
        super().validate(schedule)
        if schedule.options.pdl_trigger not in TRIGGERS:
            raise ScheduleError(f"pdl_trigger must be one of {', '.join(TRIGGERS)}, got "
                                f"{schedule.options.pdl_trigger!r}")

    def release_us(self, k: int, prev_end_us: float, r: Rates) -> float:
        return prev_end_us + r.pdl_node_us

    def prologue_B(self, options: Options) -> float:
        return options.prefetch_bytes
