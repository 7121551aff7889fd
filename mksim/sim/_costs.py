"""The arithmetic of the performance model, as pure functions (no SimPy).

One time unit across the simulator: **microseconds** (``_us``). Bandwidths are bytes per
microsecond (``_Bpus``; 1 GB/s = 1e3 B/µs), rates FLOP per microsecond.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwmodels import GPUSpec

GBps_TO_Bpus = 1e3      # 1 GB/s = 1e9 B/s = 1e3 B/µs
TFLOPs_TO_FLOPpus = 1e6  # 1 TFLOP/s = 1e6 FLOP/µs


@dataclass(frozen=True)
class Rates:
    """What the simulator needs of a GPU, in µs units, derived once from a :class:`GPUSpec`."""
    n_sms: int
    hbm_Bpus: float             # reachable DRAM bandwidth of the chip
    dram_latency_us: float
    sm_cap_Bpus: float          # most one SM draws from DRAM (Little's law, capped)
    l2_per_sm_Bpus: float       # one SM's share of L2 bandwidth
    l2_latency_us: float
    tensor_per_sm: dict         # dtype -> FLOP/µs per SM on tensor cores
    vector_per_sm: float        # FLOP/µs per SM on CUDA cores (fp32)
    stream_launch_us: float
    graph_node_us: float
    stream_gap_us: float        # GPU-side gap between stream launches (graph_node_us when unmeasured)
    pdl_node_us: float
    launch_latency_us: float
    block_setup_us: float       # a kernel's first block on an SM: set-up before its first load (0 if unmeasured)
    first_load_us: float        # ... then the first-byte latency of that load (dram_latency_us if unmeasured)
    grid_barrier_us: float
    flag_latency_us: float


def rates(gpu: GPUSpec) -> Rates:
    """The GPU's parameters in simulator units."""
    n = gpu.sm.count
    c = gpu.compute
    tensor = {"bf16": c.tensor_bf16_dense_TFLOPs, "fp16": c.tensor_fp16_dense_TFLOPs,
              "fp8": c.tensor_fp8_dense_TFLOPs or c.tensor_bf16_dense_TFLOPs,
              "fp32": c.tensor_tf32_dense_TFLOPs or c.tensor_fp32_dense_TFLOPs or c.vector_fp32_TFLOPs}
    lat_us = gpu.dram.latency_ns / 1e3
    return Rates(
        n_sms=n,
        hbm_Bpus=gpu.hbm_bandwidth_Bps / 1e6,
        dram_latency_us=lat_us,
        sm_cap_Bpus=sm_dram_cap_Bpus(gpu.concurrency.max_inflight_per_sm_KiB * 1024, lat_us,
                                     gpu.concurrency.per_sm_bandwidth_max_GBps * GBps_TO_Bpus),
        l2_per_sm_Bpus=gpu.l2.bandwidth_GBps * GBps_TO_Bpus / n,
        l2_latency_us=gpu.l2.latency_ns / 1e3,
        tensor_per_sm={k: v * TFLOPs_TO_FLOPpus / n for k, v in tensor.items()},
        vector_per_sm=c.vector_fp32_TFLOPs * TFLOPs_TO_FLOPpus / n,
        stream_launch_us=gpu.launch.stream_launch_us,
        graph_node_us=gpu.launch.graph_node_us,
        stream_gap_us=gpu.launch.stream_gap_us if gpu.launch.stream_gap_us is not None else gpu.launch.graph_node_us,
        pdl_node_us=gpu.launch.pdl_node_us if gpu.launch.pdl_node_us is not None else gpu.launch.graph_node_us,
        launch_latency_us=gpu.launch.launch_latency_us,
        block_setup_us=gpu.launch.block_setup_us or 0.0,
        first_load_us=gpu.launch.first_load_us if gpu.launch.first_load_us is not None else lat_us,
        grid_barrier_us=gpu.sync.grid_barrier_us,
        flag_latency_us=gpu.sync.flag_latency_ns / 1e3,
    )


def first_byte_us(fresh: bool, now_us: float, placed_us: float, cold_until_us: float, r: Rates) -> float:
    """How long a block's DRAM flow that starts now, with nothing else in flight, waits for its
    first bytes.

    The kernel's first block on an SM (``fresh``) first sets up (``block_setup_us``, counted
    from when it was placed at ``placed_us``: a block that waited for its predecessor under PDL
    has set up meanwhile), then waits ``first_load_us``. A later block of the same kernel on that
    SM waits the DRAM latency, or until the first block's bytes arrive (``cold_until_us``) if
    that is later.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200")), dram_latency_us=0.25, block_setup_us=0.25, first_load_us=0.5)
    >>> first_byte_us(True, 10.0, 10.0, 0.0, r), first_byte_us(True, 10.0, 9.0, 0.0, r)
    (0.75, 0.5)
    >>> first_byte_us(False, 10.0, 10.0, 10.5, r), first_byte_us(False, 10.0, 10.0, 10.125, r)
    (0.5, 0.25)
    """
    if fresh:
        setup = r.block_setup_us - (now_us - placed_us)
        return r.first_load_us + setup if setup > 0 else r.first_load_us
    wait = cold_until_us - now_us
    return wait if wait > r.dram_latency_us else r.dram_latency_us


def sm_dram_cap_Bpus(inflight_B: float, latency_us: float, max_Bpus: float) -> float:
    """Little's law: an SM keeping ``inflight_B`` bytes in flight draws ``inflight / latency``."""
    return min(inflight_B / latency_us, max_Bpus)


def fair_share(caps: dict[float, int], total_Bpus: float) -> float:
    """Max-min fair level: each flow gets ``min(cap, level)`` and the sum is at most ``total``.

    ``caps`` maps a per-flow cap to the number of flows with that cap. Returns the level
    (``inf`` when every flow gets its cap).

    >>> fair_share({10.0: 2}, 100.0)        # two flows each capped at 10: both get 10
    inf
    >>> fair_share({100.0: 4}, 100.0)       # four uncapped flows share 100
    25.0
    >>> fair_share({5.0: 2, 100.0: 2}, 100.0)  # the small ones saturate, the rest share 90
    45.0
    """
    remaining, n = total_Bpus, sum(caps.values())
    for cap in sorted(caps):
        if n == 0:
            break
        level = remaining / n
        if cap >= level:
            return level
        remaining -= cap * caps[cap]
        n -= caps[cap]
    return float("inf")


def flop_rate(unit: str, dtype: str, r: Rates) -> float:
    """FLOP/µs of one SM on tensor cores (``unit="tensor"``, by ``dtype``) or CUDA cores."""
    return r.tensor_per_sm.get(dtype, r.tensor_per_sm["bf16"]) if unit == "tensor" else r.vector_per_sm


def compute_us(flops: float, unit: str, dtype: str, r: Rates, efficiency: float = 1.0) -> float:
    """Time for one SM to do ``flops`` on tensor cores (``unit="tensor"``) or CUDA cores."""
    if flops <= 0:
        return 0.0
    return flops / (flop_rate(unit, dtype, r) * efficiency)


def l2_us(nbytes: float, r: Rates) -> float:
    """Time for one SM to move ``nbytes`` through L2 at its share of L2 bandwidth (no latency)."""
    return nbytes / r.l2_per_sm_Bpus if nbytes > 0 else 0.0


def host_issue_us(i: int, mode: str, r: Rates) -> float:
    """When the host has issued kernel ``i``: launches from a stream are rate-limited."""
    return i * r.stream_launch_us if mode == "stream" else 0.0
