"""The typed hardware spec: nested frozen dataclasses mirroring the data files.

Field names carry their unit (``clock_boost_MHz``, ``latency_ns``); the numbers
themselves live only in the TOML files under ``hwmodels/data`` and are read by
:mod:`hwmodels._loader`. ``meta(lo, hi)`` gives the sane range the loader checks;
it is a plausibility bound, not a GPU's value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def meta(lo: float, hi: float, *, optional: bool = False, integer: bool = False,
         doc: str = "", default: Any = MISSING) -> Any:
    """A numeric field with its plausible range [lo, hi]; optional fields may be absent (None)."""
    return field(default=default, metadata={"range": (lo, hi), "optional": optional, "integer": integer,
                                            "doc": doc})


def choice(*values: str, doc: str = "") -> Any:
    """A text field, one of ``values``, with its source like a number (``{ value = "nvswitch", source = ... }``)."""
    return field(metadata={"choices": values, "optional": False, "doc": doc})

UNITS = {
    # suffix -> human-readable unit, used in messages and docs
    "MHz": "MHz", "KiB": "KiB", "MiB": "MiB", "GB": "GB (1e9 bytes)", "GBps": "GB/s (1e9 B/s)",
    "TFLOPs": "TFLOP/s (1e12 FLOP/s)", "ns": "ns", "us": "µs", "fraction": "fraction (0..1)",
    "count": "count", "B": "bytes",
}


def unit_of(key: str) -> str:
    """The unit suffix of a key (``latency_ns`` -> ``ns``); counts end in ``count``."""
    return key.rsplit("_", 1)[-1]


@dataclass(frozen=True)
class SMSpec:
    """One streaming multiprocessor (NVIDIA) or compute unit (AMD), and how many there are."""
    count: int = meta(1, 1024, integer=True, doc="SMs (CUs) on the chip")
    clock_boost_MHz: float = meta(300, 4000, doc="boost clock")
    shared_memory_per_sm_KiB: float = meta(16, 1024, doc="shared memory (LDS) per SM")
    shared_memory_per_block_KiB: float = meta(16, 1024, doc="largest shared memory one block may use")
    registers_per_sm_count: int = meta(1024, 1 << 20, integer=True, doc="32-bit registers per SM")
    max_threads_per_sm_count: int = meta(256, 8192, integer=True)
    max_blocks_per_sm_count: int = meta(1, 128, integer=True)


@dataclass(frozen=True)
class ComputeSpec:
    """Dense (not sparse) throughput of the whole chip at boost clock."""
    tensor_tf32_dense_TFLOPs: float = meta(1, 1e5, optional=True)
    tensor_fp32_dense_TFLOPs: float = meta(1, 1e5, optional=True, doc="matrix cores that take fp32 (AMD)")
    tensor_bf16_dense_TFLOPs: float = meta(1, 1e5)
    tensor_fp16_dense_TFLOPs: float = meta(1, 1e5)
    tensor_fp8_dense_TFLOPs: float = meta(1, 1e5, optional=True)
    tensor_fp4_dense_TFLOPs: float = meta(1, 1e5, optional=True)
    vector_fp32_TFLOPs: float = meta(1, 1e4, doc="CUDA-core (SIMD) fp32, FMA counted as 2")


@dataclass(frozen=True)
class DRAMSpec:
    """Device memory (HBM or GDDR)."""
    capacity_GB: float = meta(1, 1e4)
    bandwidth_spec_GBps: float = meta(100, 1e5, doc="datasheet peak")
    reachable_fraction: float = meta(0.3, 1.0, doc="fraction of the peak a streaming kernel reaches")
    latency_ns: float = meta(100, 5000, doc="idle load-to-use latency of a DRAM access")
    stream_latency_ns: float = meta(100, 5000, optional=True,
                                    doc="Little's-law latency of streaming loads on a lightly loaded chip: bytes "
                                        "in flight / rate (latency_ns where absent)")
    queue_ns: float = meta(0, 5000, optional=True,
                           doc="how the latency grows with load: stream latency + queue_ns * u / (1 - u) at a "
                               "fraction u of the reachable bandwidth; absent: a hard knee (no growth, the "
                               "chip's bandwidth shared max-min fairly)")


@dataclass(frozen=True)
class L2Spec:
    size_MiB: float = meta(0.5, 1024)
    bandwidth_GBps: float = meta(100, 1e6)
    latency_ns: float = meta(20, 2000)


@dataclass(frozen=True)
class ConcurrencySpec:
    """How much bandwidth one SM can draw: ``min(inflight / latency, per_sm_max)`` (Little's law)."""
    max_inflight_per_sm_KiB: float = meta(1, 4096, doc="bytes one SM can keep in flight to DRAM")
    per_sm_bandwidth_max_GBps: float = meta(1, 1e4, doc="most one SM can draw however much it has in flight")
    l1_load_KiB: float = meta(8, 4096, optional=True,
                              doc="L1 + shared memory of an SM that ordinary loads in flight may use: such loads "
                                  "keep at most this minus the shared memory of the resident blocks in flight")


@dataclass(frozen=True)
class LaunchSpec:
    """Kernel launch costs."""
    stream_launch_us: float = meta(0.2, 100, doc="host-side interval between back-to-back launches on a stream")
    graph_node_us: float = meta(0.1, 50, doc="interval between dependent kernel nodes in a CUDA graph")
    pdl_node_us: float = meta(0.0, 50, optional=True, doc="interval between kernels with programmatic dependent launch")
    stream_gap_us: float = meta(0.1, 50, optional=True,
                                doc="GPU-side interval between back-to-back kernels of a stream when the host is ahead "
                                    "(graph_node_us where absent)")
    launch_latency_us: float = meta(0.5, 100, doc="single launch to kernel start, device idle")
    block_setup_us: float = meta(0.0, 50, optional=True,
                                 doc="what a kernel's first block on an SM does before its first DRAM load (kernel "
                                     "parameters, addresses); overlaps a PDL wait (0 where absent)")
    first_load_us: float = meta(0.05, 50, optional=True,
                                doc="first-byte latency of a kernel's first DRAM load on an SM, once set up "
                                    "(memory.dram.latency_ns where absent)")


@dataclass(frozen=True)
class SyncSpec:
    """Synchronisation inside a persistent kernel."""
    grid_barrier_us: float = meta(0.1, 100, doc="grid-wide barrier, last arrival to all released")
    atomic_roundtrip_ns: float = meta(50, 1e5, doc="global atomic issue to result")
    flag_latency_ns: float = meta(50, 1e5, doc="release of a flag/counter by one SM to its observation by another")
    load_share_fraction: float = meta(0.0, 4.0, optional=True,
                                      doc="how much of the DRAM queueing delay (loaded minus stream latency, "
                                          "memory.dram.queue_ns) a release and its observation see: a sync under "
                                          "load takes that much longer (0 where absent)")
    sentinel_latency_ns: float = meta(20, 1e5, optional=True,
                                      doc="data as its own flag: a producer's plain stores of its output to a "
                                          "consumer's poll of that data seeing them (buffers start as a sentinel, "
                                          "NaN); no release fence, no counter, no reload (2 x L2 latency where "
                                          "absent)")
    sentinel_poll_ns_per_KiB: float = meta(0, 1e5, optional=True,
                                           doc="data as its own flag: what a consumer takes more to see its "
                                               "producers' data per KiB it polls, the chip idle (every SM's waiter "
                                               "polling the same bytes, as a consumer op's tasks do; 0 where absent)")
    sentinel_loaded_latency_ns: float = meta(20, 1e5, optional=True,
                                             doc="sentinel_latency_ns while every SM streams DRAM "
                                                 "(sentinel_latency_ns where absent)")
    sentinel_loaded_poll_ns_per_KiB: float = meta(0, 1e5, optional=True,
                                                  doc="sentinel_poll_ns_per_KiB while every SM streams DRAM "
                                                      "(sentinel_poll_ns_per_KiB where absent)")
    dispatch_event_ns: float = meta(20, 1e5, optional=True,
                                    doc="dynamic dispatch: a worker's last task of an event to a scheduler warp seeing "
                                        "the event (the event counter's atomic with its result used, the enqueue to "
                                        "the scheduler's queue, the scheduler's poll); 2 atomic round trips + 2 L2 "
                                        "latencies where absent")
    dispatch_task_ns: float = meta(5, 1e5, optional=True,
                                   doc="dynamic dispatch: one task handed to a worker by a scheduler warp (a queue "
                                       "write and a release atomic on the worker's ready counter); one scheduler's "
                                       "hand-outs are serial; an atomic round trip where absent")
    dispatch_pickup_ns: float = meta(20, 1e5, optional=True,
                                     doc="dynamic dispatch: a worker's poll seeing a new task in its queue, then "
                                         "loading the task's descriptor; 3 L2 latencies where absent")


@dataclass(frozen=True)
class InterconnectSpec:
    """Dies (chiplets) and the costs of crossing between them."""
    dies_count: int = meta(1, 64, integer=True, doc="dies (chiplets) with their own L2 slice; SM s sits on die "
                                                     "s * dies // SMs in the model")
    cross_die_latency_ns: float = meta(1, 1e5, optional=True,
                                       doc="what a synchronisation or an L2 access costs more when it crosses to "
                                           "another die (with the dies option)")
    cross_die_bandwidth_GBps: float = meta(1, 1e5, optional=True, doc="die-to-die link bandwidth of the chip")


@dataclass(frozen=True)
class MovementSpec:
    """How an SM moves data into shared memory and through its tensor cores, per generation
    (Ampere cp.async, Hopper TMA and clusters, Blackwell TMA with tcgen05 and tensor memory). Used
    by the persistent modes' loader with ``movement="native"``; absent from a file, that option is
    refused."""
    async_copy_B: float = meta(4, 1 << 20, optional=True,
                               doc="bytes one asynchronous copy instruction of a loader warp moves into shared "
                                   "memory (cp.async: 16 B per thread; TMA: a whole tile)")
    async_copy_issue_ns: float = meta(0.1, 1e4, optional=True,
                                      doc="time between two copy instructions of one loader warp (address "
                                          "arithmetic, barrier bookkeeping); a pipeline's first copy waits this long")
    mma_latency_ns: float = meta(1, 1e4, optional=True,
                                 doc="a tensor-core task's tail: from its last operands in shared memory to its "
                                     "result usable")
    cluster_multicast_count: int = meta(1, 64, optional=True, integer=True,
                                        doc="SMs one multicast load of a thread-block cluster feeds (1: no clusters)")
    bulk_copy_latency_ns: float = meta(10, 1e4, optional=True, default=None,
                                       doc="a bulk (TMA) copy into shared memory: its latency on a lightly loaded "
                                           "chip, before its bytes stream in at bulk_copy_GBps")
    bulk_copy_GBps: float = meta(1, 1e5, optional=True, default=None,
                                 doc="the rate one bulk copy's bytes arrive at: a copy of B bytes takes latency + "
                                     "B / this")


TOPOLOGIES = ("nvswitch", "mesh", "pcie")


@dataclass(frozen=True)
class NodeSpec:
    """The GPUs of one node and the links between them (the ``[interconnect]`` table): what tensor
    and expert parallelism (``--tp``, ``--ep``) communicate over. Bandwidths are per direction.
    ``topology``: ``nvswitch`` (every GPU's links go to switches: any peer at the full per-direction
    bandwidth), ``mesh`` (a direct link to each peer, AMD Infinity Fabric: a peer at one link's
    bandwidth, all peers at once at the links' sum), ``pcie`` (no GPU-to-GPU links: peers through PCIe).
    The ``nccl_*`` numbers are NCCL's own cost model of its ring all-reduce by protocol (base latency
    of a collective, and latency per ring step on this kind of link), which ``mksim.costs`` uses for a
    library collective between kernels."""
    topology: str = choice(*TOPOLOGIES, doc="how the node's GPUs are connected (nvswitch, mesh, pcie)")
    gpus_count: int = meta(1, 1024, integer=True, doc="GPUs in one node (the largest --tp / --ep)")
    links_count: int = meta(1, 64, integer=True, doc="GPU-to-GPU links (NVLink, Infinity Fabric) of one GPU; "
                                                     "1 for PCIe (its x16 slot)")
    link_bandwidth_GBps: float = meta(1, 1e4, doc="one link's bandwidth in one direction")
    bandwidth_per_direction_GBps: float = meta(1, 1e5, doc="all of one GPU's links together, one direction "
                                                          "(links_count x link_bandwidth_GBps)")
    reachable_fraction: float = meta(0.1, 1.0, optional=True,
                                     doc="fraction of the link bandwidth a collective's copies reach (1 where "
                                         "absent)")
    link_latency_ns: float = meta(50, 1e5, doc="a store into a peer GPU's memory to that peer's poll seeing it "
                                               "(one hop, through the switch where there is one)")
    multicast_GBps: float = meta(1, 1e5, optional=True,
                                 doc="per-direction bandwidth of switch multicast and in-switch reduction "
                                     "(NVLink SHARP, multimem): a datasheet what-if only; absent: none")
    nccl_ll_base_us: float = meta(0.0, 1000, optional=True, doc="NCCL ring, LL protocol: base latency")
    nccl_ll_step_us: float = meta(0.0, 1000, optional=True, doc="NCCL ring, LL protocol: latency per step")
    nccl_ll128_base_us: float = meta(0.0, 1000, optional=True, doc="NCCL ring, LL128 protocol: base latency")
    nccl_ll128_step_us: float = meta(0.0, 1000, optional=True, doc="NCCL ring, LL128 protocol: latency per step")
    nccl_simple_base_us: float = meta(0.0, 1000, optional=True, doc="NCCL ring, Simple protocol: base latency")
    nccl_simple_step_us: float = meta(0.0, 1000, optional=True,
                                      doc="NCCL ring, Simple protocol: latency per step")


_FIXED = ("a task's fixed cost once its inputs are visible, at one row (token): input loads, reductions, "
          "writes; overlaps the wait for its streamed bytes, not their consumption")
_ROW = "what each row (token) of a task beyond the first adds to its fixed cost (0 where absent)"
_CONSUME = ("the rate at which one SM's workers consume the bytes a task streams (weights, KV cache), at one row: "
            "a task takes at least its fixed cost + bytes / this rate, however early its bytes are in")
_INFLIGHT = ("bytes one block of a kernel of this kind keeps in flight to DRAM (threads x loads in flight x 16 B "
             "for ordinary loads): its SM draws in-flight bytes / latency (memory.dram, the mechanisms), shared by "
             "its resident blocks; absent: memory.concurrency's, the best a kernel keeps")
_KERNELS_PER_OP = ("kernels a stack launches per op of this kind, on average (an implementation profile of a "
                   "software stack: HF-style RMS norm in torch is 8): the chain modes run an op as that many "
                   "kernels, the first streaming its bytes, the others costing [runtime.kernels.elementwise]'s "
                   "fixed part (mksim.workload.expand_kernels); persistent modes ignore it (absent: 1)")
_CONSUME_ROW = "each row (token) of a task beyond the first adds streamed bytes / this rate (none where absent)"
_HOST = ("host time a stack spends issuing one op of this kind (its module calls, Python and kernel launches: "
         "an implementation profile of an eager stack), spread evenly over the op's kernels: in a mode the host "
         "launches kernel by kernel (stream), a kernel is issued once the host has done its share")
_PAGE = ("what each page of the weight ring costs beyond its bulk copy (the workers' wait on the page's barrier, "
         "their release of it, its refill): the ring delivers a page per bulk_copy_latency + page / "
         "bulk_copy_GBps + this, and the workers consume no faster (0 where absent; fitted to single ops timed "
         "at several page sizes)")


@dataclass(frozen=True)
class KernelCost:
    """What one task of one op kind costs on the device functions of mksim's generated kernels: a
    ``[runtime.kernels.<kind>]`` table, fitted to single ops run alone by ``python -m
    validation.kernel_costs``. For a task of r rows (tokens) that streams B bytes, once its inputs
    are visible: fixed + (r - 1) * row + B / consume, and each row beyond the first adds
    B / consume_row; a kind whose bytes stream through the page ring consumes them no faster than
    the ring delivers a page, each page costing ``page_us`` beyond its bulk copy (docs/model.md,
    "What a task costs"). Which keys a kind has follows from how
    its cost is fitted (``mksim.workload.OpKind.cost_fields``)."""
    task_fixed_us: float | None = meta(0.0, 1000, optional=True, doc=_FIXED, default=None)
    task_row_us: float | None = meta(0.0, 1000, optional=True, doc=_ROW, default=None)
    consume_GBps: float | None = meta(0.1, 1e5, optional=True, doc=_CONSUME, default=None)
    consume_row_GBps: float | None = meta(0.1, 1e6, optional=True, doc=_CONSUME_ROW, default=None)
    inflight_KiB: float | None = meta(0.0625, 4096, optional=True, doc=_INFLIGHT, default=None)
    kernels_per_op_count: float | None = meta(1.0, 1000, optional=True, doc=_KERNELS_PER_OP, default=None)
    page_us: float | None = meta(0.0, 100, optional=True, doc=_PAGE, default=None)
    host_us: float | None = meta(0.0, 1e5, optional=True, doc=_HOST, default=None)


# The keys a per-kind table may hold, and the names files before [runtime.kernels.<kind>] tables
# gave them (``<kind>_<key>`` in [runtime.kernels]), which the loader still reads.
KERNEL_COST_KEYS = tuple(f.name for f in fields(KernelCost))


@dataclass(frozen=True)
class KernelSpec:
    """Measured costs of the device functions that mksim's generated kernels use.

    The ``matvec_*``, ``rmsnorm_*`` and ``attention_*`` efficiencies of standalone kernels are
    written by ``mksim calibrate`` (validation/kernels/mk_device.cuh) and not used by the
    simulator; ``per_kind`` holds the per-task costs of each op kind (a :class:`KernelCost` per
    ``[runtime.kernels.<kind>]`` table), which the simulator applies. All are absent from
    datasheet files. hwmodels reads any kind name; mksim checks them against its op kinds.
    """
    matvec_bw_fraction: float = meta(0.01, 1.0, optional=True,
                                     doc="steady bandwidth of the bf16 matvec device function over DRAM read bandwidth")
    matvec_fixed_us: float = meta(0.0, 100, optional=True, doc="fixed cost of a standalone matvec kernel")
    rmsnorm_bw_fraction: float = meta(0.01, 1.0, optional=True,
                                      doc="steady bandwidth of the RMS-norm device function over DRAM read bandwidth")
    rmsnorm_fixed_us: float = meta(0.0, 100, optional=True, doc="fixed cost of a standalone RMS-norm kernel")
    attention_bw_fraction: float = meta(0.01, 1.0, optional=True,
                                        doc="steady KV-cache bandwidth of the decode-attention device function over "
                                            "DRAM read bandwidth")
    attention_fixed_us: float = meta(0.0, 100, optional=True, doc="fixed cost of a standalone decode-attention kernel")
    ring_copies_in_flight_count: float = meta(0.25, 64, optional=True,
                                              doc="bulk copies a kernel's page ring keeps in flight per pipeline (an "
                                                  "implementation profile's): a block streams at most that many "
                                                  "pages per copy time (chip.movement.bulk_copy_*); absent: no limit")
    blocks_per_sm_count: int = meta(1, 128, optional=True, integer=True,
                                    doc="blocks of one kernel an implementation profile's kernels keep on an SM (their "
                                        "launch: mksim's generated kernels run one); a chain mode's blocks_per_sm "
                                        "defaults to it; absent: the mode's own default")
    host_step_us: float | None = meta(0.0, 1e6, optional=True,
                                      doc="host time of a step before its first kernel is issued, beyond the ops' "
                                          "host_us (an implementation profile's: a compiled stack's guards and "
                                          "input copies before its CUDA graph's launch, an eager stack's model "
                                          "code outside its layers); absent: none")
    host_qk_norm_us: float | None = meta(0.0, 1e5, optional=True,
                                         doc="host time of a layer's q and k norm calls (Qwen3's), added to the "
                                             "host_us of a rope_kv op of a model with q/k norms (an implementation "
                                             "profile's: an eager stack calls them as modules); absent: none")
    host_graph_node_us: float | None = meta(0.0, 100, optional=True,
                                            doc="what launching a CUDA graph from the host costs per node before "
                                                "its first kernel starts, the GPU idle (an implementation "
                                                "profile's: a stack that launches its graph once a step and "
                                                "waits for it); absent: none")
    # op kind -> its task costs, in file order; left out of the hash (a mapping has none)
    per_kind: Mapping[str, KernelCost] = field(default_factory=dict, hash=False, metadata={"per_kind": True})


@dataclass(frozen=True)
class Source:
    """Where a number comes from."""
    id: str
    kind: str  # datasheet | whitepaper | paper | measured | estimate
    title: str
    url: str = ""
    date: str = ""
    note: str = ""


SOURCE_KINDS = ("datasheet", "whitepaper", "paper", "article", "measured", "estimate")


@dataclass(frozen=True)
class GPUSpec:
    """A GPU generation, as read from one hardware data file (and its overlays).

    Example::

        >>> import hwmodels
        >>> gpu = hwmodels.load("h200")
        >>> gpu.sm.count
        132
    """
    name: str
    full_name: str
    vendor: str
    architecture: str
    sm: SMSpec
    compute: ComputeSpec
    dram: DRAMSpec
    l2: L2Spec
    concurrency: ConcurrencySpec
    launch: LaunchSpec
    sync: SyncSpec
    interconnect: InterconnectSpec
    kernels: KernelSpec
    movement: MovementSpec
    node: NodeSpec | None  # the [interconnect] table; None where the file has none (one GPU only)
    sources: dict[str, Source] = field(hash=False, compare=False, repr=False)
    provenance: dict[str, str] = field(hash=False, compare=False, repr=False)
    path: str = field(default="", compare=False)
    extends: str = ""
    profile: str = ""  # the implementation profile applied (hwmodels/profiles), "" for none: the best kernels

    # -- derived quantities, in SI units, used by the simulator --------------------
    @property
    def hbm_bandwidth_Bps(self) -> float:
        """Bandwidth a streaming kernel reaches, bytes per second."""
        return self.dram.bandwidth_spec_GBps * 1e9 * self.dram.reachable_fraction

    def source_of(self, key: str) -> Source:
        """The source of a number, by its dotted key (``"dram.latency_ns"``)."""
        return self.sources[self.provenance[key]]

    def numbers(self) -> dict[str, float | int | None]:
        """Every number by dotted key, in file order; a kind's task costs as
        ``kernels.<kind>.<key>`` (only the kinds and keys this GPU's files give)."""
        out: dict[str, float | int | None] = {}
        for sec in SECTIONS:
            obj = getattr(self, sec)
            if obj is None:  # a table the file leaves out (ABSENT_TABLES)
                continue
            for f in section_fields(type(obj)):
                out[f"{sec}.{f.name}"] = getattr(obj, f.name)
        for kind, cost in self.kernels.per_kind.items():
            for f in fields(cost):
                if getattr(cost, f.name) is not None:
                    out[f"kernels.{kind}.{f.name}"] = getattr(cost, f.name)
        return out

    def texts(self) -> dict[str, str]:
        """Every text field (``node.topology``) by dotted key, in file order."""
        out: dict[str, str] = {}
        for sec in SECTIONS:
            obj = getattr(self, sec)
            for f in text_fields(type(obj)) if obj is not None else ():
                out[f"{sec}.{f.name}"] = getattr(obj, f.name)
        return out


# attribute of GPUSpec -> (table in the data file, class). The file nests by physical
# hierarchy: the chip (its dies, SMs and arithmetic), its memory, and the runtime costs.
SECTIONS: dict[str, tuple[str, type]] = {
    "interconnect": ("chip", InterconnectSpec),
    "sm": ("chip.sm", SMSpec),
    "movement": ("chip.movement", MovementSpec),
    "compute": ("chip.compute", ComputeSpec),
    "l2": ("memory.l2", L2Spec),
    "dram": ("memory.dram", DRAMSpec),
    "concurrency": ("memory.concurrency", ConcurrencySpec),
    "launch": ("runtime.launch", LaunchSpec),
    "sync": ("runtime.sync", SyncSpec),
    "kernels": ("runtime.kernels", KernelSpec),
    "node": ("interconnect", NodeSpec),
}

def section_fields(cls: type) -> tuple[Any, ...]:
    """The numeric fields of a section class (without ``KernelSpec.per_kind``, a table of tables)."""
    return tuple(f for f in fields(cls) if not f.metadata.get("per_kind") and "choices" not in f.metadata)


def text_fields(cls: type) -> tuple[Any, ...]:
    """The text fields of a section class (each one of its ``choices``)."""
    return tuple(f for f in fields(cls) if "choices" in f.metadata)


# Tables a file may leave out (every key in them is optional).
OPTIONAL_TABLES = ("runtime.kernels", "chip.movement")
# Tables a file may leave out, whose section is then None (a GPU without multi-GPU data).
ABSENT_TABLES = ("interconnect",)

IDENTITY_KEYS = ("name", "full_name", "vendor", "architecture")

