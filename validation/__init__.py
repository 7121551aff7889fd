"""Proving mksim on real GPUs: schedules run as real CUDA kernels, checked and timed against their
predictions, and the microbenchmarks the hardware models are calibrated on.

- :mod:`validation.suite` — the standard suite, its parts, searched schedules, targets, plots and
  per-layer anatomy (``mksim validate``);
- :mod:`validation.megakernel` — a schedule turned into the generated kernels, run and checked;
- :mod:`validation.calibrate`, :mod:`validation.mechanisms`, :mod:`validation.chains`,
  :mod:`validation.stacks`, :mod:`validation.whatif` — calibration, mechanism sweeps, held-out
  chains, the stacks users run, the chip with fewer SMs;
- :mod:`validation.verbs` — ``python -m validation VERB``: the runners of all of them behind one
  entry point, for GPU machines without typer; :mod:`validation.cli` — ``mksim validate`` and
  ``mksim calibrate``.
"""
