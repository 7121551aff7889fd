"""Op kinds: one description per kind of op, which every layer reads.

An :class:`OpKind` says what the simulator needs (which arithmetic units the op uses), how the
validation side fits the cost of its device function (:attr:`OpKind.cost_fields`, the keys of its
``[runtime.kernels.<kind>]`` table in a hardware file) and which opcode the generated kernel
runs it under (``MK_OP_<NAME>``, injected into the CUDA sources at compile time). :data:`KINDS`
(a :class:`~mksim.registry.Registry` that refuses a second kind of the same name or opcode) lists
them all; a block that needs a new kind registers it with ``KINDS.register(kind.name, kind)``. The
workload builders, ``mksim.sim``'s device costs, the instruction encoder,
the cost fit and the torch reference of ``validation.megakernel`` all take kinds from it.

>>> from mksim.workload import KINDS, get_kind
>>> get_kind("matmul").unit, get_kind("matmul").cost_fields
('tensor', ('task_fixed_us', 'task_row_us', 'consume_GBps', 'consume_row_GBps', 'page_us'))
>>> [k.name for k in KINDS.values() if k.opcode is None]   # simulated only: no device function
['add', 'elementwise', 'all_reduce', 'all_gather', 'all_to_all']
"""

from __future__ import annotations

from dataclasses import dataclass

from mksim.registry import Registry

UNITS = ("tensor", "vector")


@dataclass(frozen=True)
class OpKind:
    """One kind of op.

    - ``unit``: ``"tensor"`` (tensor cores) or ``"vector"`` (CUDA cores): the rate the simulator
      divides the op's FLOPs by;
    - ``opcode``: the number the generated kernel dispatches on (``MK_OP_<NAME>``); ``None``: the
      generated kernel has no device function for it (simulated only);
    - ``streams``: a task's time has a part proportional to the bytes it streams from DRAM
      (weights, KV cache): its cost is fitted as ``fixed + bytes / consume``, else as ``fixed``;
    - ``per_row``: a task does every row (token) of the batch, so each row beyond the first adds
      ``row`` (and, if it streams, ``bytes / consume_row``) to its cost;
    - ``pages``: the bytes it streams go through the kernel's ring of shared-memory pages (the
      matmul's weights), whose cost per page (``page_us``) is fitted where single ops were timed
      at several page sizes;
    - ``attention``: part of attention over the KV cache (what a profiler trace's attention
      kernels are held against);
    - ``anchor``: its kernels anchor the alignment of a profiler trace to the ops (few,
      unmistakable, one or a few per op: :mod:`mksim.trace_map`);
    - ``generic``: a catch-all of traced models (point-wise kernels that join a neighbouring op);
    - ``collective``: communication between the GPUs of a node (tensor and expert parallelism,
      :mod:`mksim.workload.parallel`): its time is the collective's (:func:`mksim.costs.collective_us`),
      not its FLOPs and bytes.
    """
    name: str
    unit: str
    description: str
    opcode: int | None = None
    streams: bool = False
    per_row: bool = False
    pages: bool = False
    attention: bool = False
    anchor: bool = False
    generic: bool = False
    collective: bool = False

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"op kind {self.name}: unit must be one of {', '.join(UNITS)}, got {self.unit!r}")

    @property
    def cost_fields(self) -> tuple[str, ...]:
        """The keys of ``[runtime.kernels.<kind>]`` its cost fit writes (``hwmodels.KernelCost``).

        >>> get_kind("rmsnorm").cost_fields, get_kind("attn_partial").cost_fields
        (('task_fixed_us', 'task_row_us'), ('task_fixed_us', 'consume_GBps'))
        """
        out = ["task_fixed_us"] + (["task_row_us"] if self.per_row else [])
        if self.streams:
            out += ["consume_GBps"] + (["consume_row_GBps"] if self.per_row else [])
        if self.pages:
            out.append("page_us")
        return tuple(out)

    @property
    def define(self) -> str:
        """The name of its opcode in the CUDA sources (``MK_OP_ROPE_KV``)."""
        return f"MK_OP_{self.name.upper()}"


def _unique_opcode(kind: OpKind) -> None:
    if kind.opcode is not None and any(k.opcode == kind.opcode for k in KINDS.values()):
        raise ValueError(f"op kind {kind.name}: opcode {kind.opcode} is taken; op kinds need unique opcodes")


KINDS: Registry[OpKind] = Registry("op kind", check=_unique_opcode, unique=True)
for _kind in (
    OpKind("embed", "vector", "one embedding row per token", opcode=1, per_row=True),
    OpKind("rmsnorm", "vector", "RMS norm of each row, times a weight", opcode=2, per_row=True),
    OpKind("matmul", "tensor", "rows times a weight matrix (a matvec in decode), optionally + a residual",
           opcode=3, streams=True, per_row=True, pages=True, anchor=True),
    OpKind("rope_kv", "vector", "rotary embedding of q and k; k and v appended to the KV cache", opcode=4,
           per_row=True),
    OpKind("attn_partial", "tensor", "decode attention over one split of the KV cache (flash-decoding)",
           opcode=5, streams=True, attention=True, anchor=True),
    OpKind("attn_reduce", "vector", "merge of the attention partials of the KV splits", opcode=6, attention=True,
           anchor=True),
    OpKind("silu_mul", "vector", "SiLU(gate) times up", opcode=7, per_row=True),
    OpKind("softcap", "vector", "logit soft-capping, cap * tanh(x / cap) (Gemma 2's final_logit_softcapping)",
           opcode=8, per_row=True),
    OpKind("add", "vector", "element-wise sum (traced models)", generic=True),
    OpKind("elementwise", "vector", "any other point-wise op (traced models)", generic=True),
):
    KINDS.register(_kind.name, _kind)  # every op kind, by name, in this order
del _kind


def get_kind(name: str) -> OpKind:
    """The :class:`OpKind` called ``name``; an unknown name lists the known ones in one line.

    >>> get_kind("rope_kv").define
    'MK_OP_ROPE_KV'
    """
    return KINDS.get(name)
