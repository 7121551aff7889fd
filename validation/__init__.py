"""Proving mksim on real GPUs: calibration microbenchmarks (``validation.calibrate``) and, later,
schedules generated as real CUDA kernels and timed against their predictions."""
