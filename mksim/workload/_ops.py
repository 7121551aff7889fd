"""Ops and workloads: the op-level graph of one model step, before tiling.

An :class:`Op` produces an output index space of ``out_size`` elements (output
features of a matmul, heads of attention, ...). Tiling later cuts that space into
contiguous ranges (tasks). Each :class:`Input` says which range of a producer's output
a consumer's range needs, so that dependencies can be derived at tile level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mksim.errors import WorkloadError

from .kinds import KINDS


@dataclass(frozen=True)
class Input:
    """How a consumer's output range maps onto a producer's output range.

    ``full``: every consumer element needs the producer's whole output (a matvec needs
    its whole input vector). Otherwise consumer element ``i`` belongs to group
    ``k = i // group`` and needs, for each ``(offset, stride, width)`` in ``segments``,
    the producer range ``[offset + k*stride, offset + k*stride + width)``.
    """
    op: str
    full: bool = False
    group: int = 1
    segments: tuple[tuple[int, int, int], ...] = ((0, 1, 1),)

    def gapless(self) -> tuple[tuple[int, int, int], ...] | None:
        """The segments, by offset, when each gives a consumer range one contiguous producer range (no
        gaps between groups: stride <= width); None for a full input or one with gaps."""
        if self.full or any(stride > width for _, stride, width in self.segments):
            return None
        return tuple(sorted(self.segments))

    def ranges(self, lo: int, hi: int, producer_size: int) -> list[tuple[int, int]]:
        """Producer ranges needed by consumer elements ``[lo, hi)`` (merged, clipped)."""
        if self.full:
            return [(0, producer_size)]
        k0, k1 = lo // self.group, (hi - 1) // self.group
        out: list[tuple[int, int]] = []
        for off, stride, width in self.segments:
            if stride > width:  # groups leave gaps: list each group's range
                out.extend((off + k * stride, off + k * stride + width) for k in range(k0, k1 + 1))
            else:
                out.append((off + k0 * stride, off + k1 * stride + width))
        clipped = sorted((max(0, a), min(producer_size, b)) for a, b in out)
        merged: list[tuple[int, int]] = []
        for a, b in clipped:
            if a >= b:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        return merged


@dataclass(frozen=True)
class Op:
    """One op of a model step, with its whole-op costs.

    Bytes and FLOPs are totals for the op; tiling divides them among tasks in
    proportion to each task's share of ``out_size`` (inputs are counted per task).
    """
    name: str
    kind: str
    out_size: int
    elem_bytes: float            # bytes written per output element
    flops: float
    weight_bytes: float = 0.0    # weights (parameters) read
    kv_read_bytes: float = 0.0   # KV cache read
    kv_write_bytes: float = 0.0  # KV cache appended
    inputs: tuple[Input, ...] = ()
    layer: int | None = None
    align: int = 1               # tile boundaries fall on multiples of this
    dtype: str = "bf16"
    attrs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def unit(self) -> str:
        """``"tensor"`` or ``"vector"``: which arithmetic units the op uses (a kind outside
        :data:`~mksim.workload.KINDS` counts as vector)."""
        k = KINDS.get(self.kind, None)
        return k.unit if k is not None else "vector"

    @property
    def out_bytes(self) -> float:
        return self.out_size * self.elem_bytes


@dataclass(frozen=True)
class Workload:
    """The ops of one model step (decode or prefill), in a topological order; a built one keeps the
    :class:`~mksim.workload.Step` and :class:`~mksim.workload.Build` it was made from (``step``, ``build``).

    Example::

        >>> from mksim import models
        >>> wl = models.workload("llama-3.2-1b", batch=1, kv_len=1024)
        >>> len(wl.ops), round(wl.weight_bytes / 1e9, 2)
        (163, 2.47)
    """
    name: str
    ops: tuple[Op, ...]
    tokens: int                      # tokens produced per step (batch for decode)
    batch: int = 1
    kv_len: int = 0
    phase: str = "decode"
    prefill_tokens: int = 0
    weight_dtype: str = "bf16"
    fuse_norm: bool = False          # RMS norms computed inside the next matvec (no norm ops)
    fuse_rope: bool = False          # RoPE and the KV-cache append in the qkv projection's epilogue (no rope_kv ops)
    fuse_silu: bool = False          # SiLU(gate) * up in the gate/up projection's epilogue (no silu_mul ops)
    fuse_reduce: bool = False        # attention partials merged in the O projection's input load (no attn_reduce ops)
    split_qkv: bool = False          # separate q, k, v projections
    split_gate_up: bool = False      # separate gate and up projections
    # further builder options that changed the ops (name, value), e.g. (("logit_softcap", 30.0),):
    # a schedule file stores them, so a new workload option round-trips without touching mksim.schedule
    options: tuple[tuple[str, Any], ...] = ()
    model: Any = field(default=None, compare=False, hash=False)
    # what it was built from, where a builder made it (the one place later code reads batch, KV length,
    # phase and the build choices from): a Step and a Build of mksim.workload
    step: Any = field(default=None, compare=False, hash=False)
    build: Any = field(default=None, compare=False, hash=False)
    # a mixture of experts: each MoE layer's routing (mksim.workload.routing.RoutedLayer), in layer order
    routing: tuple[Any, ...] = field(default=(), compare=False, hash=False)

    def __post_init__(self) -> None:
        check_op_graph(self.ops)

    @property
    def index(self) -> dict[str, int]:
        return {op.name: i for i, op in enumerate(self.ops)}

    @property
    def weight_bytes(self) -> float:
        return sum(op.weight_bytes for op in self.ops)

    @property
    def kv_bytes(self) -> float:
        return sum(op.kv_read_bytes + op.kv_write_bytes for op in self.ops)

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def min_dram_bytes(self) -> float:
        """Bytes a step must move at least: weights, the KV cache, and each activation once."""
        return self.weight_bytes + self.kv_bytes + sum(op.out_bytes for op in self.ops)

    def bandwidth_floor_us(self, bandwidth_Bps: float) -> float:
        """The step's time if it moved only :attr:`min_dram_bytes` at ``bandwidth_Bps``."""
        return self.min_dram_bytes / bandwidth_Bps * 1e6

    def routing_summary(self) -> dict[str, Any] | None:
        """A mixture of experts' routing over its MoE layers (None for a dense step): the routing model,
        the distinct experts per layer the routing model expects (mean, and the mean of the per-layer
        standard deviations), the distinct experts of the drawn step (mean, min, max), and the bytes of
        expert weights the step reads."""
        if not self.routing:
            return None
        active = [r.active for r in self.routing]
        expert_B = sum(op.weight_bytes for op in self.ops if op.attrs.get("grouped") == "experts")
        return {"routing": getattr(self.step, "routing", "uniform"), "moe_layers": len(self.routing),
                "expected_active_experts": sum(r.expected for r in self.routing) / len(self.routing),
                "active_experts_std": sum(r.std for r in self.routing) / len(self.routing),
                "active_experts": sum(active) / len(active), "active_experts_min": min(active),
                "active_experts_max": max(active), "expert_weight_bytes": expert_B}

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for op in self.ops:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        out = {
            "name": self.name, "phase": self.phase, "batch": self.batch, "kv_len": self.kv_len,
            "prefill_tokens": self.prefill_tokens, "tokens": self.tokens,
            "weight_dtype": self.weight_dtype, "ops": len(self.ops), "op_kinds": kinds,
            "weight_bytes": self.weight_bytes, "kv_cache_bytes": self.kv_bytes,
            "min_dram_bytes": self.min_dram_bytes, "flops": self.flops,
        }
        moe = self.routing_summary()
        return {**out, "moe": moe} if moe else out


def check_op_graph(ops: tuple[Op, ...] | list[Op]) -> None:
    """Reject duplicate names, unknown producers and cycles, in one line naming the ops."""
    names: dict[str, int] = {}
    for i, op in enumerate(ops):
        if op.name in names:
            raise WorkloadError(f"op name {op.name!r} appears twice; op names must be unique")
        if op.out_size <= 0:
            raise WorkloadError(f"op {op.name!r} has out_size {op.out_size}; it must be positive")
        names[op.name] = i
    for op in ops:
        for inp in op.inputs:
            if inp.op not in names:
                raise WorkloadError(f"op {op.name!r} reads {inp.op!r}, which is not an op of the workload")
    users: dict[str, list[str]] = {op.name: [] for op in ops}
    for op in ops:
        for p in {i.op for i in op.inputs}:
            users[p].append(op.name)
    stuck = unresolved({op.name: len({i.op for i in op.inputs}) for op in ops}, users)
    if stuck:
        cyc = _find_cycle({op.name: [i.op for i in op.inputs] for op in ops if op.name in stuck})
        raise WorkloadError(f"the op graph has a cycle: {' -> '.join(cyc)}; an op cannot depend on itself")
    for i, op in enumerate(ops):  # builders emit a topological order; keep that promise
        for inp in op.inputs:
            if names[inp.op] >= i:
                raise WorkloadError(f"op {op.name!r} comes before its input {inp.op!r}; list ops in "
                                    "dependency order")


def unresolved(indeg: dict, users: dict) -> set:
    """Kahn's algorithm: the nodes left with unmet dependencies (on or behind a cycle).

    ``indeg[n]`` counts n's producers; ``users[n]`` lists n's consumers. ``indeg`` is consumed.
    """
    ready = [n for n, d in indeg.items() if d == 0]
    while ready:
        n = ready.pop()
        for u in users[n]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
    return {n for n, d in indeg.items() if d > 0}


def _find_cycle(deps: dict[str, list[str]]) -> list[str]:
    """One cycle in ``deps`` (every node in it has an unresolved dependency)."""
    start = next(iter(deps))
    path, pos = [start], {start: 0}
    while True:
        nxt = next(d for d in deps[path[-1]] if d in deps)
        if nxt in pos:
            cyc = path[pos[nxt]:] + [nxt]
            return cyc[::-1]  # producer -> consumer order
        pos[nxt] = len(path)
        path.append(nxt)
