"""Small GPUs and workloads with round numbers, for closed-form simulator stories."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import hwmodels
from mksim import models
from mksim.models import ModelConfig
from mksim.workload import Input, Op, Workload

# 2 SMs, 1e6 B/µs of DRAM (1000 GB/s, all reachable), 1 µs DRAM latency, SMs able to draw
# the whole bandwidth each, arithmetic and L2 so fast that they vanish; a counter or flag is seen
# 0.5 µs after its release, data polled as its own flag (a sentinel) 0.2 µs after its stores; a
# scheduler warp sees an event 1 µs after its last trigger and hands out a task every 0.25 µs, which
# its worker sees 0.5 µs later.
TOY = """
extends = "h200-datasheet"
name = "toy"
[chip.sm]
count = {{ value = 2, source = "t" }}
[chip.compute]
tensor_bf16_dense_TFLOPs = {{ value = 1e5, source = "t" }}
tensor_fp16_dense_TFLOPs = {{ value = 1e5, source = "t" }}
tensor_tf32_dense_TFLOPs = {{ value = 1e5, source = "t" }}
vector_fp32_TFLOPs = {{ value = 1e4, source = "t" }}
[memory.l2]
bandwidth_GBps = {{ value = 1e6, source = "t" }}
latency_ns = {{ value = 20, source = "t" }}
[memory.dram]
bandwidth_spec_GBps = {{ value = 1000, source = "t" }}
reachable_fraction = {{ value = 1.0, source = "t" }}
latency_ns = {{ value = 1000, source = "t" }}
[memory.concurrency]
max_inflight_per_sm_KiB = {{ value = 4096, source = "t" }}
per_sm_bandwidth_max_GBps = {{ value = {cap}, source = "t" }}
[runtime.launch]
stream_launch_us = {{ value = 2, source = "t" }}
graph_node_us = {{ value = 2, source = "t" }}
pdl_node_us = {{ value = 0.5, source = "t" }}
launch_latency_us = {{ value = 1, source = "t" }}
[runtime.sync]
grid_barrier_us = {{ value = 3, source = "t" }}
flag_latency_ns = {{ value = 500, source = "t" }}
sentinel_latency_ns = {{ value = 200, source = "t" }}
dispatch_event_ns = {{ value = 1000, source = "t" }}
dispatch_task_ns = {{ value = 250, source = "t" }}
dispatch_pickup_ns = {{ value = 500, source = "t" }}
atomic_roundtrip_ns = {{ value = 500, source = "t" }}
[sources.t]
kind = "estimate"
title = "round numbers for tests"
"""


def toy_gpu(tmp_path: Path, cap_GBps: float = 1000, kernels: dict[str, float] | None = None,
            chip: dict[str, float] | None = None, movement: dict[str, float] | None = None,
            **launch: float) -> hwmodels.GPUSpec:
    """The toy GPU; ``launch`` adds ``[runtime.launch]`` keys (``block_setup_us=0.5``), ``kernels``
    a ``[runtime.kernels]`` table (``{"matmul_task_fixed_us": 1}``), ``chip`` ``[chip]`` keys
    (``{"dies_count": 2, "cross_die_latency_ns": 300}``), ``movement`` ``[chip.movement]`` keys."""
    text = TOY.format(cap=cap_GBps)
    extra = "".join(f'{k} = {{ value = {v}, source = "t" }}\n' for k, v in launch.items())
    text = text.replace("[runtime.sync]", extra + "[runtime.sync]")
    if chip:
        text = text.replace("[chip.sm]", "[chip]\n" + "".join(f'{k} = {{ value = {v}, source = "t" }}\n'
                                                              for k, v in chip.items()) + "[chip.sm]")
    if movement:
        text = text.replace("[chip.compute]", "[chip.movement]\n" + "".join(
            f'{k} = {{ value = {v}, source = "t" }}\n' for k, v in movement.items()) + "[chip.compute]")
    if kernels:
        text += "[runtime.kernels]\n" + "".join(f'{k} = {{ value = {v}, source = "t" }}\n' for k, v in kernels.items())
    name = "-".join([f"{cap_GBps:g}", *(f"{k}{v:g}" for k, v in {**launch, **(kernels or {}), **(chip or {}),
                                                                   **(movement or {})}.items())])
    p = tmp_path / f"toy{name}.toml"
    p.write_text(text)
    return hwmodels.load(p)


def mem_op(name: str, weight_bytes: float, src: str | None = None, out: int = 64) -> Op:
    """A matvec-like op: streams ``weight_bytes``, needs all of ``src``; tiny math and output."""
    return Op(name=name, kind="matmul", out_size=out, elem_bytes=1e-6, flops=1.0, weight_bytes=weight_bytes,
              inputs=(Input(src, full=True),) if src else (), align=1)


def chain(*weights: float) -> Workload:
    ops, prev = [], None
    for i, w in enumerate(weights):
        ops.append(mem_op(f"k{i}", w, prev))
        prev = ops[-1].name
    return Workload(name="toy chain", ops=tuple(ops), tokens=1)


def first_layers(model: str, layers: int = 4) -> ModelConfig:
    """Built-in ``model`` cut to its first ``layers`` layers, every other field kept (its dense layers among
    those): a test that asks whether each mode, design or op runs on a model's kind of layer needs a few of
    them, not 48, and the simulated time of a step is its layers' in sequence."""
    cfg = models.get(model)
    return dataclasses.replace(cfg, num_layers=layers, dense_layers=tuple(i for i in cfg.dense_layers if i < layers))
