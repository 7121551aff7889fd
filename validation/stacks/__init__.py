"""Measurements of the software stacks users already run (issue 17), beside mksim's megakernels."""
