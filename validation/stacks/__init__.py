"""Measurements of the software stacks users already run, beside mksim's megakernels."""
