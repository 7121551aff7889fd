"""The cost model: the arithmetic of the performance model, as pure functions (no SimPy).

One time unit across the simulator: **microseconds** (``_us``). Bandwidths are bytes per
microsecond (``_Bpus``; 1 GB/s = 1e3 B/µs), rates FLOP per microsecond.

This is the one copy of every formula: the engine (:mod:`mksim.sim`) and the placement policies
(:mod:`mksim.schedule`) call these functions, and the tests check them. :func:`task_times` gives
the engine every task's DRAM bytes, work and consumption tail; :func:`task_costs` gives the
policies their estimate; :func:`counter_ready_us`, :func:`flag_ready_us` and
:func:`sentinel_seen_us` say when a dependency is seen, each called by its sync's class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hwmodels import GPUSpec
from mksim.errors import HardwareFileError
from mksim.workload import KINDS, TaskGraph

GBps_TO_Bpus = 1e3      # 1 GB/s = 1e9 B/s = 1e3 B/µs
TFLOPs_TO_FLOPpus = 1e6  # 1 TFLOP/s = 1e6 FLOP/µs


@dataclass(frozen=True)
class NcclProtocol:
    """One protocol of NCCL's ring (LL, LL128, Simple) in NCCL's own cost model: a collective costs
    ``base_us`` + steps x ``step_us`` + bytes over the bus bandwidth times ``bw_factor`` (LL moves a flag
    with every 8 bytes of data: half the bandwidth; LL128 a flag per 128 bytes: NCCL counts 0.92)."""
    name: str
    base_us: float
    step_us: float
    bw_factor: float


@dataclass(frozen=True)
class Link:
    """A node's links in simulator units, from a hardware file's ``[interconnect]`` (:func:`link_rates`).
    Bandwidths are per direction and reachable (the datasheet's times ``reachable_fraction``)."""
    topology: str          # nvswitch | mesh | pcie
    gpus: int              # GPUs in the node
    links: int             # links of one GPU
    link_Bpus: float       # one link
    total_Bpus: float      # all of one GPU's links
    hop_us: float          # a store into a peer's memory to the peer's poll seeing it
    multicast_Bpus: float  # switch multicast and in-switch reduction (0: none)
    nccl: tuple[NcclProtocol, ...] = ()  # NCCL's ring protocols on this link (none: no NCCL model)


#: how a collective op runs: a library kernel between kernels (NCCL's cost: the chain modes), or inside a
#: megakernel through peer memory: ``one_shot`` (every rank pushes its partial to every peer after the op's
#: last tile), ``two_shot`` (reduce-scatter then all-gather), ``push`` (each tile pushes its partial as it
#: finishes: the reduction waits only for the last one's flag), ``multicast`` (the switch reduces and
#: broadcasts: NVLink SHARP, a datasheet what-if, never run on our machines)
COLLECTIVE_ALGORITHMS = ("nccl", "one_shot", "two_shot", "push", "multicast")


@dataclass(frozen=True)
class Rates:
    """What the simulator needs of a GPU, in µs units, derived once from a :class:`GPUSpec`."""
    n_sms: int
    hbm_Bpus: float             # reachable DRAM bandwidth of the chip
    dram_latency_us: float
    sm_cap_Bpus: float          # most one SM draws from DRAM (Little's law, capped)
    sm_port_Bpus: float         # ... however much it keeps in flight (the cap)
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
    device: dict = field(default_factory=dict)  # op kind -> DeviceCost, where [runtime.kernels] has one
    sentinel_latency_us: float = 0.0  # data as its own flag: a producer's stores to a consumer's poll seeing them
    sentinel_poll_us_per_B: float = 0.0          # ... and per byte the consumer polls, the chip idle
    sentinel_loaded_latency_us: float = 0.0      # ... the same two while every SM streams DRAM (0: unmeasured)
    sentinel_loaded_poll_us_per_B: float = 0.0
    dispatch_event_us: float = 0.0    # dynamic dispatch: an event's last trigger to its scheduler seeing it
    dispatch_task_us: float = 0.0     # ... one task handed out by a scheduler (serial per scheduler)
    dispatch_pickup_us: float = 0.0   # ... a worker seeing its new task and loading its descriptor
    dies: int = 1                     # dies (chiplets), each with its own L2 slice
    cross_die_latency_us: float = 0.0  # what a dependency or an L2 access costs more across dies
    async_copy_B: float = 0.0         # [chip.movement] (0: absent): bytes per copy instruction of a loader warp
    async_copy_issue_us: float = 0.0  # ... time between two of them
    mma_latency_us: float = 0.0       # ... a tensor-core task's tail
    multicast: int = 1                # ... SMs one multicast load feeds
    stream_latency_us: float = 0.0    # Little's-law latency of streaming loads, lightly loaded
    queue_us: float = 0.0             # latency growth with load (0: a hard knee, see loaded_total_Bpus)
    l1_load_B: float = math.inf       # L1 + shared memory that ordinary loads in flight may use
    sync_load_share: float = 0.0      # share of the DRAM queueing delay a sync sees (sync_load_us)
    bulk_copy_latency_us: float = 0.0  # a bulk (TMA) copy's latency, then its bytes at bulk_copy_Bpus
    bulk_copy_Bpus: float = math.inf
    ring_copies: float = 0.0          # copies a profile's page ring keeps in flight per pipeline (0: no limit)
    host_us: dict = field(default_factory=dict)  # op kind -> a stack's host time per op (an eager profile's)
    host_step_us: float = 0.0         # a stack's host time per step before its first kernel (0: none)
    host_graph_node_us: float = 0.0   # launching a CUDA graph from the host, per node, GPU idle (0: none)
    host_qk_norm_us: float = 0.0      # a layer's q/k norm calls, added to a q/k-normed rope_kv's host_us
    link: Link | None = None          # the node's links ([interconnect]); None: one GPU only

    @property
    def host_bound(self) -> bool:
        """Whether the profile gives the host's own costs (:func:`host_issue_times`)."""
        return bool(self.host_us) or self.host_step_us > 0 or self.host_graph_node_us > 0


@dataclass(frozen=True)
class DeviceCost:
    """What one task of an op kind costs on the device functions that run it, from a hardware
    file's ``[runtime.kernels]`` ``<kind>_task_fixed_us``, ``<kind>_task_row_us``,
    ``<kind>_consume_GBps`` and ``<kind>_consume_row_GBps`` (absent: 0, 0, no limit, no limit).

    A task of ``rows`` rows (tokens) that streams ``B`` bytes takes, once its inputs are visible,
    at least ``fixed_us(rows) + B * us_per_B(rows)``: its fixed part (input loads, reductions,
    writes), then the consumption of its bytes, however early they are in shared memory.
    ``page_us`` (0 where absent) is what each page costs a kind whose bytes go through the page
    ring (``OpKind.pages``) beyond the page's bulk copy (:func:`ring_page_us`).

    >>> c = DeviceCost(fixed_us=1.0, row_us=0.5, consume_Bpus=25e3, row_consume_Bpus=100e3)
    >>> c.fixed_us_at(1), c.fixed_us_at(4)
    (1.0, 2.5)
    >>> round(1e5 * c.us_per_B(1), 6), round(1e5 * c.us_per_B(4), 6)  # µs for 100 kB
    (4.0, 7.0)
    """
    fixed_us: float = 0.0
    row_us: float = 0.0
    consume_Bpus: float = math.inf      # one SM's workers, at one row
    row_consume_Bpus: float = math.inf  # each further row adds bytes / this
    inflight_B: float = math.inf        # bytes one block keeps in flight (inf: the GPU's best)
    page_us: float = 0.0                # what a page costs the ring beyond its bulk copy (ring_page_us)

    def fixed_us_at(self, rows: float) -> float:
        return self.fixed_us + (rows - 1) * self.row_us

    def us_per_B(self, rows: float) -> float:
        """µs per streamed byte for one SM's workers consuming a task of ``rows`` rows."""
        return 1.0 / self.consume_Bpus + (rows - 1) / self.row_consume_Bpus


def device_costs(kernels: object) -> dict[str, DeviceCost]:
    """The :class:`DeviceCost` of every op kind whose ``[runtime.kernels.<kind>]`` table in
    ``kernels`` (a :class:`hwmodels.KernelSpec`) gives ``task_fixed_us`` or ``consume_GBps``;
    other kinds cost what their FLOPs and L2 bytes do. A kind that is not one of
    :data:`mksim.workload.KINDS` is refused in one line.

    >>> import hwmodels
    >>> device_costs(hwmodels.load("h200-datasheet").kernels)  # a datasheet file: none
    {}
    >>> sorted(device_costs(hwmodels.load("h200-mk-kernels").kernels))[:3]
    ['attn_partial', 'attn_reduce', 'combine']
    """
    out: dict[str, DeviceCost] = {}
    for kind, c in kernels.per_kind.items():  # type: ignore[attr-defined]
        if kind not in KINDS:
            raise HardwareFileError(f"[runtime.kernels.{kind}]: {kind!r} is not an op kind; known: "
                                    f"{', '.join(KINDS)}")
        if c.task_fixed_us is None and c.consume_GBps is None and c.inflight_KiB is None and c.page_us is None:
            continue
        out[kind] = DeviceCost(fixed_us=c.task_fixed_us or 0.0, row_us=c.task_row_us or 0.0,
                               consume_Bpus=c.consume_GBps * GBps_TO_Bpus if c.consume_GBps else math.inf,
                               row_consume_Bpus=c.consume_row_GBps * GBps_TO_Bpus if c.consume_row_GBps
                               else math.inf,
                               inflight_B=c.inflight_KiB * 1024 if c.inflight_KiB else math.inf,
                               page_us=c.page_us or 0.0)
    return out


def device_task_us(base_us: ArrayLike, streamed_B: ArrayLike, rows: float, cost: DeviceCost, share: float = 1.0,
                   page_B: float = math.inf, ring_page_us: float = 0.0,
                   ring_depth: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """A task's work and consumption tail on a device function of cost ``cost``:

    - work: ``max(base_us, fixed + streamed_B * µs per byte)``, counted from when its inputs are
      visible: the fixed part overlaps the wait for its bytes, their consumption follows it;
    - tail: the consumption of its last page (``min(streamed_B, page_B)`` bytes), which cannot
      start before that page is in: the task ends no sooner than its bytes are in + tail.

    ``base_us`` is what its FLOPs and L2 bytes take; ``share`` blocks share the SM's workers (each
    consumes at ``1/share`` of the rate). ``ring_page_us`` (:func:`ring_page_us`; 0: no ring): the
    workers consume a page no sooner than the block's page ring delivers one, so a byte costs at
    least ``ring_page_us / page_B``; a ring of one page (``ring_depth`` 1) refills a page only once
    it is consumed, and a byte then costs both. Element-wise over arrays.

    >>> c = DeviceCost(fixed_us=1.0, consume_Bpus=25e3)
    >>> w, tail = device_task_us([0.5, 4.0], [50e3, 50e3], 1, c, page_B=32768)
    >>> w.tolist(), tail.round(4).tolist()   # 1 + 50 kB at 25 GB/s, unless the math takes longer
    ([3.0, 4.0], [1.3107, 1.3107])
    >>> device_task_us(0.5, 50e3, 1, c, share=2)[0].item()   # two blocks on the SM
    5.0
    >>> device_task_us(0.5, 50e3, 1, c, page_B=10e3, ring_page_us=0.8)[0].item()  # 5 pages, 0.8 us each
    5.0
    >>> round(device_task_us(0.5, 50e3, 1, c, page_B=10e3, ring_page_us=0.8, ring_depth=1)[0].item(), 6)
    7.0
    """
    per_B = cost.us_per_B(rows) * share
    eff = per_B
    if ring_page_us > 0:
        ring_B = ring_page_us / page_B
        if ring_depth < 2:  # one page: its refill waits for its consumption
            ring_B += per_B
        eff = np.maximum(eff, ring_B)  # rows may differ by task (an expert's tokens): arrays
    streamed = np.asarray(streamed_B, dtype=float)
    work = np.maximum(np.asarray(base_us, dtype=float), cost.fixed_us_at(rows) + streamed * eff)
    return work, np.minimum(streamed, page_B) * per_B


def resident_blocks(n_blocks: int, n_sms: int, blocks_per_sm: int) -> int:
    """Blocks of one kernel on an SM once it is placed: spread over the SMs first, at most
    ``blocks_per_sm`` (the chain modes' block slots).

    >>> resident_blocks(100, 132, 2), resident_blocks(200, 132, 2), resident_blocks(1000, 132, 2)
    (1, 2, 2)
    """
    return max(1, min(blocks_per_sm, -(-n_blocks // n_sms)))


def rates(gpu: GPUSpec) -> Rates:
    """The GPU's parameters in simulator units."""
    n = gpu.sm.count
    c = gpu.compute
    tensor = {"bf16": c.tensor_bf16_dense_TFLOPs, "fp16": c.tensor_fp16_dense_TFLOPs,
              "fp8": c.tensor_fp8_dense_TFLOPs or c.tensor_bf16_dense_TFLOPs,
              "fp32": c.tensor_tf32_dense_TFLOPs or c.tensor_fp32_dense_TFLOPs or c.vector_fp32_TFLOPs}
    lat_us = gpu.dram.latency_ns / 1e3
    stream_us = _or(gpu.dram.stream_latency_ns, gpu.dram.latency_ns) / 1e3
    sy, mv = gpu.sync, gpu.movement
    sent_us = _or(sy.sentinel_latency_ns, 2 * gpu.l2.latency_ns) / 1e3
    return Rates(
        n_sms=n,
        hbm_Bpus=gpu.hbm_bandwidth_Bps / 1e6,
        dram_latency_us=lat_us,
        sm_cap_Bpus=sm_dram_cap_Bpus(gpu.concurrency.max_inflight_per_sm_KiB * 1024, stream_us,
                                     gpu.concurrency.per_sm_bandwidth_max_GBps * GBps_TO_Bpus),
        sm_port_Bpus=gpu.concurrency.per_sm_bandwidth_max_GBps * GBps_TO_Bpus,
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
        device=device_costs(gpu.kernels),
        sentinel_latency_us=sent_us,
        sentinel_poll_us_per_B=_or(sy.sentinel_poll_ns_per_KiB, 0.0) / 1024e3,
        sentinel_loaded_latency_us=_or(sy.sentinel_loaded_latency_ns, 0.0) / 1e3,
        sentinel_loaded_poll_us_per_B=_or(sy.sentinel_loaded_poll_ns_per_KiB, _or(sy.sentinel_poll_ns_per_KiB, 0.0))
        / 1024e3,
        dispatch_event_us=_or(sy.dispatch_event_ns, 2 * sy.atomic_roundtrip_ns + 2 * gpu.l2.latency_ns) / 1e3,
        dispatch_task_us=_or(sy.dispatch_task_ns, sy.atomic_roundtrip_ns) / 1e3,
        dispatch_pickup_us=_or(sy.dispatch_pickup_ns, 3 * gpu.l2.latency_ns) / 1e3,
        async_copy_B=mv.async_copy_B or 0.0,
        async_copy_issue_us=(mv.async_copy_issue_ns or 0.0) / 1e3,
        mma_latency_us=(mv.mma_latency_ns or 0.0) / 1e3,
        multicast=mv.cluster_multicast_count or 1,
        dies=gpu.interconnect.dies_count,
        cross_die_latency_us=_or(gpu.interconnect.cross_die_latency_ns, 0.0) / 1e3,
        stream_latency_us=stream_us,
        queue_us=_or(gpu.dram.queue_ns, 0.0) / 1e3,
        sync_load_share=_or(gpu.sync.load_share_fraction, 0.0),
        bulk_copy_latency_us=_or(mv.bulk_copy_latency_ns, 0.0) / 1e3,
        bulk_copy_Bpus=mv.bulk_copy_GBps * GBps_TO_Bpus if mv.bulk_copy_GBps else math.inf,
        ring_copies=_or(gpu.kernels.ring_copies_in_flight_count, 0.0),
        host_us={k: c.host_us for k, c in gpu.kernels.per_kind.items() if c.host_us is not None},
        host_step_us=_or(gpu.kernels.host_step_us, 0.0),
        host_graph_node_us=_or(gpu.kernels.host_graph_node_us, 0.0),
        host_qk_norm_us=_or(gpu.kernels.host_qk_norm_us, 0.0),
        l1_load_B=gpu.concurrency.l1_load_KiB * 1024 if gpu.concurrency.l1_load_KiB else math.inf,
        link=link_rates(gpu.node),
    )


def link_rates(node: Any) -> Link | None:
    """The :class:`Link` of a hardware file's ``[interconnect]`` (a :class:`hwmodels.NodeSpec`), or None.

    >>> import hwmodels
    >>> k = link_rates(hwmodels.load("h100").node)
    >>> k.topology, round(k.total_Bpus / 1e3), k.hop_us, [p.name for p in k.nccl]
    ('nvswitch', 360, 0.6, ['LL', 'LL128', 'Simple'])
    """
    if node is None:
        return None
    frac = _or(node.reachable_fraction, 1.0)
    protocols = (("LL", node.nccl_ll_base_us, node.nccl_ll_step_us, 0.5),
                 ("LL128", node.nccl_ll128_base_us, node.nccl_ll128_step_us, 0.92),
                 ("Simple", node.nccl_simple_base_us, node.nccl_simple_step_us, 1.0))
    return Link(topology=node.topology, gpus=node.gpus_count, links=node.links_count,
                link_Bpus=node.link_bandwidth_GBps * GBps_TO_Bpus * frac,
                total_Bpus=node.bandwidth_per_direction_GBps * GBps_TO_Bpus * frac, hop_us=node.link_latency_ns / 1e3,
                multicast_Bpus=_or(node.multicast_GBps, 0.0) * GBps_TO_Bpus * frac,
                nccl=tuple(NcclProtocol(n, b, st, f) for n, b, st, f in protocols if b is not None and st is not None))


# -- communication between GPUs: pure functions of a Link -------------------------------------------
def group_Bpus(ranks: int, k: Link) -> float:
    """What one GPU sends (or receives) per µs to the other ``ranks - 1`` GPUs of its group at once: the
    GPU's every link through a switch; on a mesh, the links to those peers only; over PCIe, its slot.

    >>> k = Link("mesh", 8, 7, 64e3, 448e3, 0.8, 0.0)
    >>> group_Bpus(2, k) / 1e3, group_Bpus(8, k) / 1e3
    (64.0, 448.0)
    """
    if k.topology == "mesh":
        return min(ranks - 1, k.links) * k.link_Bpus
    return k.total_Bpus


def nccl_ring_us(message_B: float, ranks: int, steps: int, traffic: float, k: Link) -> float:
    """NCCL's own cost model of one ring collective (src/graph/tuning.cc), the fastest of its protocols:
    ``base + steps x step + traffic x message_B / (bw_factor x bus bandwidth)``, where ``traffic`` is the
    share of the message each GPU sends (an all-reduce ``2 (n - 1) / n``, an all-gather ``(n - 1) / n`` of
    the gathered output).

    >>> k = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 0.0, (NcclProtocol("LL", 6.6, 0.6, 0.5),))
    >>> round(nccl_ring_us(8192, 2, 2, 1.0, k), 3)   # 6.6 + 2 x 0.6 + 8 KiB at 225 GB/s
    7.836
    """
    if not k.nccl:
        raise ValueError("this link has no NCCL model (no nccl_* numbers in [interconnect])")
    bw = group_Bpus(ranks, k)
    return min(p.base_us + steps * p.step_us + traffic * message_B / (p.bw_factor * bw) for p in k.nccl)


def nccl_all_reduce_us(message_B: float, ranks: int, k: Link) -> float:
    """NCCL's ring all-reduce of ``message_B`` bytes over ``ranks`` GPUs: 2 (n - 1) steps (a
    reduce-scatter, then an all-gather), each GPU sending 2 (n - 1) / n of the message.

    >>> import hwmodels
    >>> k = link_rates(hwmodels.load("h100").node)
    >>> round(nccl_all_reduce_us(8192, 2, k), 2), round(nccl_all_reduce_us(8192, 8, k), 2)
    (7.85, 15.08)
    """
    return nccl_ring_us(message_B, ranks, 2 * (ranks - 1), 2 * (ranks - 1) / ranks, k)


def nccl_all_gather_us(output_B: float, ranks: int, k: Link) -> float:
    """NCCL's ring all-gather into ``output_B`` bytes (each GPU holding ``output_B / ranks``): n - 1 steps."""
    return nccl_ring_us(output_B, ranks, ranks - 1, (ranks - 1) / ranks, k)


def nccl_all_to_all_us(sent_B: float, ranks: int, k: Link) -> float:
    """NCCL's all-to-all (grouped sends and receives) of ``sent_B`` bytes per GPU, ``sent_B / ranks`` to
    each: one step, (n - 1) / n of the bytes over the links."""
    return nccl_ring_us(sent_B, ranks, 1, (ranks - 1) / ranks, k)


def one_shot_all_reduce_us(message_B: float, ranks: int, k: Link) -> float:
    """An all-reduce inside a kernel through peer memory, in one shot: every GPU stores its whole partial
    into each peer's buffer, then a flag (one hop); each reduces the n copies it holds. No launch.

    >>> k = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 0.0)
    >>> one_shot_all_reduce_us(9000, 2, k), one_shot_all_reduce_us(9000, 8, k)   # 0.6 + (n-1) x 9 kB at 450 GB/s
    (0.62, 0.74)
    """
    return k.hop_us + (ranks - 1) * message_B / group_Bpus(ranks, k)


def two_shot_all_reduce_us(message_B: float, ranks: int, k: Link) -> float:
    """An all-reduce inside a kernel in two shots: a reduce-scatter (each GPU pushes each peer's 1/n of
    its partial, a flag), then an all-gather of the reduced slices (another): two hops, 2 (n - 1) / n of
    the message each way.

    >>> k = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 0.0)
    >>> round(two_shot_all_reduce_us(450e3, 8, k), 3)   # 1.2 + 1.75 x 1 us
    2.95
    """
    return 2 * k.hop_us + 2 * (ranks - 1) / ranks * message_B / group_Bpus(ranks, k)


def multicast_all_reduce_us(message_B: float, ranks: int, k: Link) -> float:
    """A datasheet what-if: the switch reduces and broadcasts (NVLink SHARP's multimem loads and stores):
    each GPU reduces its 1/n through the switch and multicasts the result, receiving (n + 1) / n of the
    message at the multicast rate; two hops. Refused where the switch has no multicast.

    >>> k = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 450e3)
    >>> round(multicast_all_reduce_us(450e3, 8, k), 3)
    2.325
    """
    if k.multicast_Bpus <= 0:
        raise ValueError("this node's switch has no multicast (no multicast_GBps in [interconnect])")
    return 2 * k.hop_us + (ranks + 1) / ranks * message_B / k.multicast_Bpus


def push_us(task_out_B: ArrayLike, concurrent: int, ranks: int, k: Link) -> Any:
    """What a producer task of an overlapped all-reduce takes more: it stores its ``task_out_B`` partial
    into each of the ``ranks - 1`` peers, sharing the links with the ``concurrent`` tasks that push at
    the same time.

    >>> k = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 0.0)
    >>> float(push_us(1000, 132, 2, k) * 450e3 / 132e3)   # each task gets 1/132 of 450 GB/s
    1.0
    """
    return (ranks - 1) * np.asarray(task_out_B, dtype=float) * concurrent / group_Bpus(ranks, k)


def direct_all_gather_us(output_B: float, ranks: int, k: Link) -> float:
    """An all-gather inside a kernel: each GPU stores its ``output_B / ranks`` into every peer, then a flag
    (each receives (n - 1) / n of the output)."""
    return k.hop_us + (ranks - 1) / ranks * output_B / group_Bpus(ranks, k)


def direct_all_to_all_us(sent_B: float, ranks: int, k: Link) -> float:
    """An all-to-all inside a kernel (an MoE layer's dispatch or combine): each GPU stores the
    ``sent_B / ranks`` bytes meant for each peer into that peer's buffer, then a flag.

    >>> k = Link("nvswitch", 8, 18, 25e3, 450e3, 0.6, 0.0)
    >>> direct_all_to_all_us(900e3, 2, k)   # 0.6 + half of 900 kB at 450 GB/s
    1.6
    """
    return k.hop_us + (ranks - 1) / ranks * sent_B / group_Bpus(ranks, k)


def collective_us(kind: str, algorithm: str, message_B: float, ranks: int, k: Link) -> float:
    """How long a collective op of ``kind`` (``all_reduce``, ``all_gather``, ``all_to_all``) takes by
    ``algorithm`` (:data:`COLLECTIVE_ALGORITHMS`), its tasks running side by side. For ``push`` this is
    the reduction's own part (the last flag); its producers' stores are :func:`push_us`. An all-gather or
    an all-to-all runs ``direct`` inside a kernel whatever the all-reduce's algorithm; one GPU costs 0.

    >>> import hwmodels
    >>> k = link_rates(hwmodels.load("h100").node)
    >>> [round(collective_us("all_reduce", a, 8192, 2, k), 3) for a in COLLECTIVE_ALGORITHMS]
    [7.846, 0.623, 1.223, 0.6, 1.234]
    """
    if ranks <= 1:
        return 0.0
    if algorithm == "nccl":
        lib = {"all_reduce": nccl_all_reduce_us, "all_gather": nccl_all_gather_us, "all_to_all": nccl_all_to_all_us}
        return lib[kind](message_B, ranks, k)
    if kind == "all_gather":
        return direct_all_gather_us(message_B, ranks, k)
    if kind == "all_to_all":
        return direct_all_to_all_us(message_B, ranks, k)
    reduce = {"one_shot": one_shot_all_reduce_us, "two_shot": two_shot_all_reduce_us,
              "multicast": multicast_all_reduce_us}
    if algorithm == "push":
        return k.hop_us
    return reduce[algorithm](message_B, ranks, k)


def copy_issue_Bpus(r: Rates) -> float:
    """The most one loader warp streams when it issues every copy itself: bytes per copy
    instruction over the time between two (``inf`` without ``[chip.movement]``).

    >>> import hwmodels
    >>> round(copy_issue_Bpus(rates(hwmodels.load("a100"))) / 1e3, 1)   # cp.async: GB/s
    85.3
    >>> round(copy_issue_Bpus(rates(hwmodels.load("h100"))) / 1e3)      # TMA: a tile per copy
    1311
    """
    if r.async_copy_B <= 0 or r.async_copy_issue_us <= 0:
        return math.inf
    return r.async_copy_B / r.async_copy_issue_us


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def dispatch_times_us(seen_us: float, free_us: float, n_tasks: int, r: Rates) -> tuple[list[float], float]:
    """Dynamic dispatch by one scheduler warp: when each of the ``n_tasks`` tasks it hands out for an
    event reaches its worker, and when the scheduler is free again. The scheduler sees the event at
    ``seen_us`` (its last trigger + ``dispatch_event_us``; the kernel's start for the first tasks) or
    once done with the events before it (``free_us``), hands the tasks out one by one,
    ``dispatch_task_us`` each, and a worker sees its task ``dispatch_pickup_us`` after it was handed
    out.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), dispatch_task_us=0.25, dispatch_pickup_us=0.5)
    >>> dispatch_times_us(11.0, 0.0, 3, r)
    ([11.75, 12.0, 12.25], 11.75)
    >>> dispatch_times_us(11.0, 12.0, 1, r)   # busy with an earlier event until 12
    ([12.75], 12.25)
    """
    start = seen_us if seen_us > free_us else free_us
    step, pick = r.dispatch_task_us, r.dispatch_pickup_us
    return [start + (k + 1) * step + pick for k in range(n_tasks)], start + n_tasks * step


def counter_ready_us(last_end_us: float, r: Rates, draw_Bpus: float = 0.0) -> float:
    """When a megakernel task sees its producers through one counter per op range (released by
    the producers, observed by the consumer) whose last ended at ``last_end_us``, while the chip
    draws ``draw_Bpus`` from DRAM: the flag latency, and what the counter waits in the memory queues
    as loads do (:func:`sync_load_us`). The grid barrier of ``persistent_barrier`` is
    ``r.grid_barrier_us`` instead; each sync of :data:`mksim.schedule.SYNCS` calls its function here.

    >>> import hwmodels
    >>> r = rates(hwmodels.load("h200-calibrated"))
    >>> round(counter_ready_us(0.0, r), 3)
    0.558
    """
    return last_end_us + r.flag_latency_us + sync_load_us(draw_Bpus, r)


def flag_ready_us(last_end_us: float, n_producer_tiles: int, r: Rates, draw_Bpus: float = 0.0) -> float:
    """As :func:`counter_ready_us`, through a flag per producer tile (of ``n_producer_tiles``)
    polled 32 at a time by a warp: one L2 round trip more per 32 flags.

    >>> import hwmodels
    >>> r = rates(hwmodels.load("h200-calibrated"))
    >>> round(flag_ready_us(10.0, 40, r), 3), round(flag_ready_us(0.0, 132, r), 3)  # two and five round trips
    (10.85, 1.287)
    """
    return (last_end_us + r.flag_latency_us + math.ceil(n_producer_tiles / 32) * r.l2_latency_us
            + sync_load_us(draw_Bpus, r))


def sentinel_seen_us(polled_B: float, draw_Bpus: float, r: Rates) -> float:
    """Data as its own flag: from a producer's last store to the consumer seeing every one of the
    ``polled_B`` bytes it polls. A line in the bytes, ``latency + polled_B * per_B``, between the
    idle chip's and that of a chip whose every SM streams DRAM, in proportion to ``draw_Bpus`` of
    the reachable bandwidth (both lines measured by mech_bench's ``poll`` sweep on calibrated
    GPUs; without the loaded line, the idle one plus what a counter takes more under load,
    :func:`sync_load_us`).

    >>> import hwmodels
    >>> r = rates(hwmodels.load("h200-calibrated"))
    >>> [round(sentinel_seen_us(k * 1024, 0.0, r), 2) for k in (4, 64)]         # idle
    [1.98, 17.69]
    >>> [round(sentinel_seen_us(k * 1024, r.hbm_Bpus, r), 2) for k in (4, 64)]  # every SM streaming
    [5.17, 35.62]
    """
    u = min(max(draw_Bpus / r.hbm_Bpus, 0.0), 1.0) if r.hbm_Bpus > 0 else 0.0
    if r.sentinel_loaded_latency_us > 0.0:
        lat = r.sentinel_latency_us + u * (r.sentinel_loaded_latency_us - r.sentinel_latency_us)
    else:
        lat = r.sentinel_latency_us + sync_load_us(draw_Bpus, r)
    per_B = r.sentinel_poll_us_per_B + u * (r.sentinel_loaded_poll_us_per_B - r.sentinel_poll_us_per_B)
    return lat + polled_B * per_B


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
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), dram_latency_us=0.25, block_setup_us=0.25,
    ...             first_load_us=0.5)
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


def loaded_total_Bpus(demand_Bpus: float, r: Rates) -> float:
    """The chip's DRAM rate when its flows keep bytes in flight that would draw ``demand_Bpus`` in
    total at the stream latency ``L0`` (each flow's cap: bytes in flight / ``L0``).

    Latency grows with load: at a fraction ``u`` of the reachable bandwidth ``P`` a load takes
    ``L(u) = L0 + queue * u / (1 - u)`` (:func:`loaded_latency_us`), so flows keeping ``F = demand *
    L0`` bytes in flight draw ``T = F / L(T / P)`` (Little's law), a soft knee below ``P``: solved in
    closed form, ``x = T / P`` is the root in (0, 1) of ``P (queue - L0) x^2 + L0 (P + D) x - D L0 = 0``.
    With ``queue_us == 0`` (a file without ``memory.dram.queue_ns``) the knee is hard: ``min(D, P)``.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), hbm_Bpus=4000e3, stream_latency_us=0.5, queue_us=0.1)
    >>> round(loaded_total_Bpus(2000e3, r) / 1e3)      # half the peak asked: latency 0.58 us, not 0.5
    1734
    >>> round(loaded_total_Bpus(40000e3, r) / 1e3)     # ten times the peak asked: just below it
    3915
    >>> loaded_total_Bpus(8000e3, replace(r, queue_us=0.0)) / 1e3   # a hard knee
    4000.0
    """
    P, L0, q = r.hbm_Bpus, r.stream_latency_us, r.queue_us
    if q <= 0.0:
        return demand_Bpus if demand_Bpus < P else P
    if demand_Bpus <= 0.0:
        return 0.0
    b = L0 * (P + demand_Bpus)
    disc = b * b + 4.0 * P * (q - L0) * demand_Bpus * L0
    return P * 2.0 * demand_Bpus * L0 / (b + math.sqrt(disc))


def loaded_latency_us(total_Bpus: float, r: Rates) -> float:
    """A DRAM load's latency while the chip draws ``total_Bpus`` (:func:`loaded_total_Bpus`): the
    stream latency plus ``queue_us * u / (1 - u)`` at the fraction ``u`` of the reachable bandwidth.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), hbm_Bpus=4000e3, stream_latency_us=0.5, queue_us=0.1)
    >>> loaded_latency_us(0.0, r), round(loaded_latency_us(3000e3, r), 3)
    (0.5, 0.8)
    """
    u = total_Bpus / r.hbm_Bpus
    if r.queue_us <= 0.0 or u <= 0.0:
        return r.stream_latency_us
    u = min(u, 0.999)
    return r.stream_latency_us + r.queue_us * u / (1.0 - u)


def ring_page_us(page_B: float, r: Rates, page_us: float = 0.0) -> float:
    """How long one pipeline of a page ring takes per page: ``bulk_copy_latency + page /
    bulk_copy_rate`` per copy, ``ring_copies`` copies at a time (the TMA microbenchmark's pipeline
    kept one in flight whatever its depth), plus ``page_us``: what each page costs a profile's
    kernels beyond its copy (the workers' wait on the page's barrier, their release of it, its
    refill; fitted to single ops at several page sizes). The workers consume a page no faster
    (:func:`device_task_us`); the DRAM flow keeps the copies' cap (:func:`ring_cap_Bpus`). 0 without
    a profile's ``ring_copies_in_flight_count`` or the GPU's bulk-copy numbers (no ring).

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), bulk_copy_latency_us=0.38, bulk_copy_Bpus=118e3,
    ...             ring_copies=1)
    >>> [round(ring_page_us(k * 1024, r), 3) for k in (8, 32)], round(ring_page_us(8192, r, page_us=0.2), 3)
    ([0.449, 0.658], 0.649)
    """
    if r.ring_copies <= 0 or r.bulk_copy_latency_us <= 0:
        return 0.0
    return (r.bulk_copy_latency_us + page_B / r.bulk_copy_Bpus) / r.ring_copies + page_us


def ring_cap_Bpus(page_B: float, r: Rates) -> float:
    """The most one pipeline of a page ring draws from DRAM: ``ring_copies`` pages per bulk-copy
    time (:func:`ring_page_us` without a per-page cost). ``inf`` without a profile's
    ``ring_copies_in_flight_count`` or the GPU's bulk-copy numbers.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), bulk_copy_latency_us=0.38, bulk_copy_Bpus=118e3,
    ...             ring_copies=1)
    >>> [round(ring_cap_Bpus(k * 1024, r) / 1e3, 1) for k in (8, 16, 32)]   # GB/s per pipeline
    [18.2, 31.6, 49.8]
    """
    t = ring_page_us(page_B, r)
    return page_B / t if t > 0 else math.inf


def sync_load_us(total_Bpus: float, r: Rates) -> float:
    """What a sync (a grid barrier, a counter, a flag, a sentinel) takes more while the chip draws
    ``total_Bpus``: its release and its observation wait in the same memory queues as the loads, a
    share ``sync_load_share`` of their queueing delay (:func:`loaded_latency_us` minus the stream
    latency). 0 on an idle chip or without ``memory.dram.queue_ns``.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), hbm_Bpus=4000e3, stream_latency_us=0.5, queue_us=0.1,
    ...             sync_load_share=0.5)
    >>> sync_load_us(0.0, r), round(sync_load_us(3000e3, r), 3)   # the queue adds 0.3 us: half of it
    (0.0, 0.15)
    """
    if r.sync_load_share <= 0.0 or r.queue_us <= 0.0:
        return 0.0
    return r.sync_load_share * (loaded_latency_us(total_Bpus, r) - r.stream_latency_us)


def inflight_B(blocks: int, threads: int, loads_per_thread: float, smem_per_block_B: float, r: Rates,
               load_B: int = 16) -> float:
    """Bytes one SM keeps in flight with ``blocks`` resident blocks of ``threads`` threads, each
    with ``loads_per_thread`` ordinary ``load_B``-byte loads outstanding: a load in flight holds an
    L1 line, so what the shared memory of the blocks leaves of ``l1_load_B`` bounds it.

    >>> import hwmodels
    >>> from dataclasses import replace
    >>> r = replace(rates(hwmodels.load("h200-datasheet")), l1_load_B=248 * 1024)
    >>> inflight_B(2, 512, 4, 0, r) / 1024, inflight_B(2, 512, 4, 100 * 1024, r) / 1024
    (64.0, 48.0)
    """
    want = blocks * threads * loads_per_thread * load_B
    room = r.l1_load_B - blocks * smem_per_block_B
    return max(min(want, room), float(load_B))


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


def compute_us(flops: ArrayLike, unit: str, dtype: str, r: Rates, efficiency: float = 1.0) -> np.ndarray:
    """Time for one SM to do ``flops`` on tensor cores (``unit="tensor"``) or CUDA cores
    (element-wise; 0 for no FLOPs).

    >>> import hwmodels
    >>> r = rates(hwmodels.load("h200-datasheet"))
    >>> compute_us([0.0, 2 * r.vector_per_sm], "vector", "fp32", r).tolist()
    [0.0, 2.0]
    """
    f = np.asarray(flops, dtype=float)
    return np.where(f > 0, f / (flop_rate(unit, dtype, r) * efficiency), 0.0)


def l2_us(nbytes: ArrayLike, r: Rates) -> np.ndarray:
    """Time for one SM to move ``nbytes`` through L2 at its share of L2 bandwidth (no latency;
    element-wise)."""
    b = np.asarray(nbytes, dtype=float)
    return np.where(b > 0, b / r.l2_per_sm_Bpus, 0.0)


def host_issue_us(i: int, r: Rates) -> float:
    """When the host has issued the ``i``-th kernel of a stream: launches are rate-limited."""
    return i * r.stream_launch_us


#: what :func:`host_kind` appends to the kind of a RoPE op whose model also norms q and k (Qwen3)
QK_NORM = "+qk_norm"


def host_kind(op: Any) -> str:
    """The kind whose host cost an op pays (:func:`host_issue_times`): its own, with :data:`QK_NORM`
    where it is a ``rope_kv`` of a model with q/k norms (an eager stack calls the two norms as modules:
    ``host_qk_norm_us`` more).

    >>> from mksim.workload import Op
    >>> host_kind(Op(name="L0.rope_kv", kind="rope_kv", out_size=1, elem_bytes=2, flops=0.0,
    ...              attrs={"qk_norm": True}))
    'rope_kv+qk_norm'
    """
    return op.kind + QK_NORM if op.kind == "rope_kv" and op.attrs.get("qk_norm") else op.kind


def host_issue_times(kinds: list[str], ops_of: list[str], r: Rates, default_us: float | None = None) -> list[float]:
    """When the host of a stack whose profile gives host costs (:attr:`Rates.host_bound`) has issued
    each kernel of a chain: ``kinds[k]`` is the model op kind kernel ``k`` belongs to (:func:`host_kind`),
    ``ops_of[k]`` the model op. The step's own part (``host_step_us``) first, then each op's ``host_us``
    (plus ``host_qk_norm_us`` for a kind marked :data:`QK_NORM`) spread evenly over its kernels, a kernel
    issued once its share is done; a kind the profile gives no host cost for costs ``default_us`` a kernel
    (``stream_launch_us`` where None). Host work never waits for the GPU (an eager stack that queues its
    kernels: the launch queue is deep).
    """
    n_of: dict[str, int] = {}
    for o in ops_of:
        n_of[o] = n_of.get(o, 0) + 1
    out, t = [], r.host_step_us
    other = r.stream_launch_us if default_us is None else default_us
    for kind, o in zip(kinds, ops_of, strict=True):
        base = kind[:-len(QK_NORM)] if kind.endswith(QK_NORM) else kind
        h = r.host_us.get(base)
        if h is not None and base != kind:
            h += r.host_qk_norm_us
        t += h / n_of[o] if h is not None else other
        out.append(t)
    return out


def block_dram_cap_Bpus(n_blocks: int, blocks_per_sm: int, r: Rates, inflight_B: float = math.inf) -> float:
    """The most one block of a kernel of ``n_blocks`` draws from DRAM at the stream latency.

    Without ``inflight_B`` (a kernel as good as the chip allows) its SM's bytes in flight are
    shared by the kernel's blocks resident there (:func:`resident_blocks`). A block that keeps
    ``inflight_B`` in flight (an implementation profile's ``inflight_KiB``) draws that over the
    stream latency, within its share of the SM's port.

    >>> import hwmodels
    >>> r = rates(hwmodels.load("h200-calibrated"))
    >>> round(block_dram_cap_Bpus(264, 2, r) / 1e3, 1)                     # GB/s: half the SM's best
    71.4
    >>> round(block_dram_cap_Bpus(264, 2, r, inflight_B=16384) / 1e3, 1)   # 16 KiB / 492 ns
    33.3
    """
    share = resident_blocks(n_blocks, r.n_sms, blocks_per_sm)
    if inflight_B < math.inf:
        own = inflight_B / r.stream_latency_us
        port = r.sm_port_Bpus / share
        return own if own < port else port
    return r.sm_cap_Bpus / share


# -- per task, over a whole task graph -------------------------------------------------------------
def dram_bytes(graph: TaskGraph) -> np.ndarray:
    """Each task's DRAM bytes that do not depend on this step's activations (weights, KV cache
    read): what a loader may prefetch."""
    return graph.weight_bytes + graph.kv_read_bytes


def l2_bytes(graph: TaskGraph, multicast: int = 1) -> np.ndarray:
    """Each task's activation bytes through L2: inputs read, outputs and KV written. With
    ``multicast`` SMs fed by one load (a cluster), a matvec's input vector counts once per cluster."""
    if multicast <= 1:
        return graph.in_bytes + graph.out_bytes + graph.kv_write_bytes
    in_B = graph.in_bytes.copy()
    for i, op in enumerate(graph.ops):
        if op.kind == "matmul":
            in_B[int(graph.op_first[i]):int(graph.op_first[i + 1])] /= multicast
    return in_B + graph.out_bytes + graph.kv_write_bytes


def op_compute_us(graph: TaskGraph, r: Rates) -> np.ndarray:
    """Each task's :func:`compute_us`, at its op's unit and dtype."""
    comp = np.empty(len(graph))
    for i, op in enumerate(graph.ops):
        a, b = int(graph.op_first[i]), int(graph.op_first[i + 1])
        comp[a:b] = compute_us(graph.flops[a:b], op.unit, op.dtype, r)
    return comp


def task_costs(graph: TaskGraph, r: Rates, active_sms: int | None = None) -> np.ndarray:
    """Estimated time (µs) of every task when all SMs share DRAM fairly and latency is hidden: the
    slowest of its DRAM bytes at its share, its L2 bytes at its SM's L2 share, and its arithmetic.
    Placement policies use it to balance load; the engine runs :func:`task_times`."""
    n = active_sms or r.n_sms
    bw = min(r.sm_cap_Bpus, r.hbm_Bpus / n)
    return np.maximum(np.maximum(dram_bytes(graph) / bw, l2_us(l2_bytes(graph), r)), op_compute_us(graph, r))


@dataclass(frozen=True)
class TaskTimes:
    """What the engine needs of every task (arrays indexed by task id):

    - ``pre_B``: DRAM bytes it streams (:func:`dram_bytes`);
    - ``work_us``: its own work once its data is arriving: the slower of its math and its L2
      traffic, plus the L2 latency for a task with nothing from DRAM, or its device function's
      cost (:func:`device_task_us`), plus the MMA tail with native movement;
    - ``tail_us``: what it still takes after its last bytes are in (a device function consuming its
      last page, the MMA tail);
    - ``on_device``: whether a device function's cost applies (its work counts from when its inputs
      are visible, not from when its bytes are in);
    - ``warm_us``: a device task's work without the cold start its single-op measurement paid
      (:func:`cold_start_us`): the engine counts it from when its inputs are visible *and* its first
      bytes are in, so a task whose first pages were prefetched (a megakernel's ring, a PDL prologue)
      saves that start, and a cold one pays it as its flow's first-byte wait (``work_us`` elsewhere).
    """
    pre_B: np.ndarray
    work_us: np.ndarray
    tail_us: np.ndarray
    on_device: np.ndarray
    warm_us: np.ndarray | None = None


def cold_start_us(r: Rates) -> float:
    """What a fresh kernel's block pays before its first bytes are in on an idle chip: its set-up and
    its first load (``launch.block_setup_us + first_load_us``, measured by boundary microbenchmarks).
    A device function's task cost measured on single ops (each op one fresh kernel) holds it.

    >>> import hwmodels
    >>> round(cold_start_us(rates(hwmodels.load("h200-calibrated"))), 2)
    0.9
    """
    return r.block_setup_us + r.first_load_us


def task_times(graph: TaskGraph, r: Rates, *, blocks_per_sm: int = 1, page_KiB: float = 32.0,
               native: bool = False, ring_depth: int = 4, collective: str = "one_shot") -> TaskTimes:
    """Every task's :class:`TaskTimes` when ``blocks_per_sm`` blocks of a kernel may share an SM
    (chain modes; 1 in persistent modes), pages are ``page_KiB`` in a ring of ``ring_depth`` (a
    schedule's ``prefetch_depth``; 0: the kernel's ring without prefetch, at least 2 pages) and,
    with ``native``, data moves as the GPU's generation does (``[chip.movement]``: cluster
    multicast, tensor-core latency). A device kind whose bytes go through the pages
    (``OpKind.pages``) consumes them no faster than the ring delivers them (:func:`ring_page_us`).
    A collective op (tensor and expert parallelism) runs by ``collective`` (:func:`collective_task_times`).

    >>> import hwmodels
    >>> from mksim.workload import Op, TaskGraph, Tiling, Workload
    >>> r = rates(hwmodels.load("h200-datasheet"))
    >>> op = Op(name="k", kind="matmul", out_size=4, elem_bytes=2, flops=0.0, weight_bytes=0.0, align=1)
    >>> g = TaskGraph(Workload(name="w", ops=(op,), tokens=1), Tiling(default=1))
    >>> tt = task_times(g, r)       # no DRAM bytes: its 8 bytes of output, then the L2 latency
    >>> float(tt.work_us[0]) == float(l2_us(8, r)) + r.l2_latency_us
    True
    """
    g = graph
    pre = dram_bytes(g)
    tail = np.maximum(op_compute_us(g, r), l2_us(l2_bytes(g, r.multicast if native else 1), r))
    work = np.where(pre <= 0, tail + r.l2_latency_us, tail)  # nothing streamed: the L2 read latency
    on_device = np.zeros(len(g), dtype=bool)
    consume_tail = np.zeros(len(g))
    warm = None
    if r.device:
        warm = work.copy()
        cold = cold_start_us(r)
        page_B = page_KiB * 1024
        depth = ring_depth if ring_depth > 0 else 2
        for i, op in enumerate(g.ops):
            cost = r.device.get(op.kind)
            if cost is None:
                continue
            a, b = int(g.op_first[i]), int(g.op_first[i + 1])
            share = resident_blocks(int(g.n_tiles[i]), r.n_sms, blocks_per_sm)
            rows: Any = g.task_rows(i)  # per task in a grouped op (an expert's tokens), else the op's
            rows = op.attrs.get("rows", g.workload.tokens) if rows is None else rows
            base = work[a:b].copy()
            ring = ring_page_us(page_B, r, cost.page_us) if KINDS[op.kind].pages else 0.0
            work[a:b], consume_tail[a:b] = device_task_us(base, pre[a:b], rows, cost, share, page_B, ring, depth)
            if cold > 0 and cost.fixed_us > 0:  # the same cost without the cold start it was measured with
                lean = replace(cost, fixed_us=max(cost.fixed_us - cold, 0.0))
                w = device_task_us(base, pre[a:b], rows, lean, share, page_B, ring, depth)[0]
                warm[a:b] = np.where(pre[a:b] > 0, w, work[a:b])  # nothing streamed: no first bytes to wait for
            else:
                warm[a:b] = work[a:b]
            on_device[a:b] = True
    if native:  # a tensor-core task ends its MMA latency after its work and after its last bytes are
        for i, op in enumerate(g.ops):  # in (measured device costs include it already)
            if op.unit == "tensor":
                a, b = int(g.op_first[i]), int(g.op_first[i + 1])
                extra = np.where(on_device[a:b], 0.0, r.mma_latency_us)
                work[a:b] += extra
                consume_tail[a:b] += extra
    if any(KINDS[op.kind].collective for op in g.ops if op.kind in KINDS):
        collective_task_times(g, r, collective, work)
        if warm is not None:
            collective_task_times(g, r, collective, warm)
    return TaskTimes(pre_B=pre, work_us=work, tail_us=consume_tail, on_device=on_device, warm_us=warm)


def collective_task_times(g: TaskGraph, r: Rates, algorithm: str, work: np.ndarray) -> None:
    """Set, in ``work``, what the tasks of each collective op take by ``algorithm``: each the whole
    collective (:func:`collective_us`: its tasks run side by side, sharing the links), then its share of
    the local reduction (its range of the ``ranks`` copies through L2). With ``push`` the producer's tasks
    also store their partials into the peers as they finish (:func:`push_us`, sharing the links with the
    producer's other tasks on the chip), and the reduction waits only for the last flag."""
    k = r.link
    index = g.workload.index
    for i, op in enumerate(g.ops):
        if op.kind not in KINDS or not KINDS[op.kind].collective:
            continue
        ranks = int(op.attrs["ranks"])
        if k is None:
            raise HardwareFileError(f"op {op.name} spans {ranks} GPUs but the GPU file has no [interconnect] table; "
                                    "add one (docs/parallel.md)")
        a, b = int(g.op_first[i]), int(g.op_first[i + 1])
        local = l2_us(g.out_bytes[a:b] * ranks, r) + r.l2_latency_us
        work[a:b] = collective_us(op.kind, algorithm, op.attrs["message_B"], ranks, k) + local
        if algorithm == "push" and op.kind == "all_reduce":
            p = index[op.inputs[0].op]
            pa, pb = int(g.op_first[p]), int(g.op_first[p + 1])
            work[pa:pb] += push_us(g.out_bytes[pa:pb], min(pb - pa, r.n_sms), ranks, k)
