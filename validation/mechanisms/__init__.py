"""Mechanism microbenchmarks: what a memory-bound kernel's time is made of on a GPU.

``mech_bench.cu`` holds four sweeps (DRAM bandwidth versus bytes in flight, a kernel's cost beyond
its bytes, programmatic-dependent-launch trigger placement, a megakernel op boundary under load);
:mod:`validation.mechanisms.runner` builds and runs them, :mod:`validation.mechanisms.analysis`
checks and summarises their raw JSON. Neither imports mksim: the runner works on a device machine
with only numpy. Results: ``validation/results/h200-mechanisms/raw/``.
"""

from validation.mechanisms.analysis import (
    SWEEPS,
    LineFit,
    RawError,
    check_raw,
    fit_line,
    headline_markdown,
    summarize,
    table,
)
from validation.mechanisms.runner import (
    BuildError,
    ldg_runs,
    nvcc_command,
    ptxas_registers,
)

__all__ = [
    "SWEEPS",
    "BuildError",
    "LineFit",
    "RawError",
    "check_raw",
    "fit_line",
    "headline_markdown",
    "ldg_runs",
    "nvcc_command",
    "ptxas_registers",
    "summarize",
    "table",
]
