"""Held-out compositions: chains of LLM projections by two implementations.

- :mod:`.cases`: the chains (:data:`~.cases.SEQUENCES`) as mksim workloads and schedules, and the
  cases the GPU measures: mksim's generated kernels in stream, graph, graph + PDL (trigger early
  and late), persistent barrier and megakernel; torch's ``F.linear`` (cuBLAS) as a stream of
  launches and as one CUDA graph; batch 1 and 8.
- :mod:`.runner` (GPU: torch, CuPy): check and time every case cold, the single kernels over
  sizes (the calibration set) and which kernels cuBLAS launches.
- :mod:`.predict` (CPU): mksim's prediction of each case, MAPE and PDL's sign.

Run::

    python -m validation chains run --out DIR [--quick] [--timeout 200]     # on the GPU
    python -m validation chains predict DIR/chains.json --gpu h200-calibrated [--json OUT]
"""

from .cases import SEQUENCES, Case, Sequence, build_schedule, case_list, chain_workload

__all__ = ["Case", "SEQUENCES", "Sequence", "build_schedule", "case_list", "chain_workload"]
