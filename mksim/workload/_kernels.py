"""Ops of several kernels: how a software stack runs an op, as a workload transformation.

mksim's chain modes launch one kernel per op. A stack users run (plain torch, ``torch.compile``)
launches several for some ops: HF-style RMS norm in float32 is eight kernels, a split-K GEMM is
the GEMM and its reduction. An implementation profile says how many, per op kind
(``[runtime.kernels.<kind>] kernels_per_op_count``); :func:`expand_kernels` turns each op of such a
kind into a chain of that many ops, so that the engine charges every kernel its launch boundary
(``stream``, ``graph``, ``graph_pdl``) without knowing about stacks:

- the first keeps the op (its name, kind, bytes, FLOPs, inputs): it streams the weights or the KV
  cache and costs the kind's ``task_fixed_us`` (+ rows) and consumption;
- each further one is an op over the same output that reads the previous kernel's output element
  for element and streams nothing: of the same kind, costing its fixed part (an RMS norm of eight
  kernels is eight kernels of the norm's fixed cost), except after a kind that streams bytes
  (``matmul``, ``attn_partial``), where it is of kind :data:`CONTINUATION_KIND` (``elementwise``) and
  costs the profile's ``[runtime.kernels.elementwise]`` (a GEMM's split-K reduction or residual
  add is no GEMM);
- the op's consumers read the last kernel of the chain.

A fractional count is an average: the ops of a kind get ``floor`` or ``ceil`` of it in turn, so
that the kind's kernels per step add up (torch's matmuls: 1, 2, 1, 2 for qkv, o_proj + residual
add, gate/up, down + split-K reduction is 1.5 per op). Persistent modes (one kernel for the whole
step) do not apply it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from mksim.errors import WorkloadError

from ._ops import Input, Op, Workload
from .kinds import KINDS

CONTINUATION_KIND = "elementwise"
"""The kind of the kernels after the first one of an op that streams bytes (their cost: the
profile's table of this kind)."""

_SEP = "~"


def kernel_counts(n_ops: int, per_op: float) -> list[int]:
    """Kernels of each of ``n_ops`` ops of a kind with ``per_op`` kernels on average: ``floor`` or
    ``ceil`` of it, spread evenly, summing to ``floor(n_ops * per_op)``.

    >>> kernel_counts(4, 1.5), kernel_counts(3, 8.0), kernel_counts(5, 1.2)
    ([1, 2, 1, 2], [8, 8, 8], [1, 1, 1, 1, 2])
    """
    if not per_op >= 1 or math.isinf(per_op):
        raise WorkloadError(f"kernels per op must be a finite number >= 1, got {per_op}")
    edges = [math.floor(i * per_op + 1e-9) for i in range(n_ops + 1)]
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


def expand_kernels(workload: Workload, kernels_per_op: Mapping[str, float]) -> Workload:
    """``workload`` with each op of a kind in ``kernels_per_op`` turned into a chain of that many
    kernels (module docstring); the same workload if no op has more than one.

    >>> from mksim import models
    >>> wl = models.workload("llama-3.2-1b", batch=1, kv_len=1024)
    >>> ex = expand_kernels(wl, {"rmsnorm": 3, "matmul": 1.5})
    >>> len(ex.ops) - len(wl.ops), [op.name for op in ex.ops[1:5]]
    (98, ['L0.attn_norm', 'L0.attn_norm~2', 'L0.attn_norm~3', 'L0.qkv_proj'])
    >>> ex.ops[4].inputs[0].op, ex.ops[2].kind, ex.ops[2].weight_bytes, ex.ops[9].kind
    ('L0.attn_norm~3', 'rmsnorm', 0.0, 'elementwise')
    """
    counts: dict[str, int] = {}
    for kind, per_op in kernels_per_op.items():
        ops = [op for op in workload.ops if op.kind == kind and "kernel_of" not in op.attrs]
        counts.update({op.name: k for op, k in zip(ops, kernel_counts(len(ops), float(per_op)), strict=True)})
    if all(k <= 1 for k in counts.values()):
        return workload
    last: dict[str, str] = {}   # op name -> the name of its last kernel
    out: list[Op] = []
    for op in workload.ops:
        inputs = tuple(replace(i, op=last.get(i.op, i.op)) for i in op.inputs)
        out.append(replace(op, inputs=inputs) if inputs != op.inputs else op)
        prev = op.name
        kind = CONTINUATION_KIND if op.kind in KINDS and KINDS[op.kind].streams else op.kind
        for j in range(2, counts.get(op.name, 1) + 1):
            name = f"{op.name}{_SEP}{j}"
            out.append(Op(name=name, kind=kind, out_size=op.out_size, elem_bytes=op.elem_bytes,
                          flops=0.0, inputs=(Input(prev),), layer=op.layer, align=op.align, dtype=op.dtype,
                          attrs={"kernel_of": op.name, "kernel": j,
                                 "rows": op.attrs.get("rows", workload.tokens)}))
            prev = name
        last[op.name] = prev
    return replace(workload, ops=tuple(out))


def kernels_per_op(per_kind: Mapping[str, Any]) -> dict[str, float]:
    """``{kind: kernels_per_op_count}`` of a hardware file's ``[runtime.kernels.<kind>]`` tables
    (``GPUSpec.kernels.per_kind``) that give one: what :func:`expand_kernels` takes.

    >>> import hwmodels
    >>> kernels_per_op(hwmodels.load("h200-calibrated+torch").kernels.per_kind)["rmsnorm"]
    8.489
    >>> kernels_per_op(hwmodels.load("h200-calibrated").kernels.per_kind)
    {}
    """
    out = {}
    for kind, cost in per_kind.items():
        k = getattr(cost, "kernels_per_op_count", None)
        if k is not None:
            out[kind] = float(k)
    return out


def kernel_of(op: Op) -> str:
    """The op of the model a kernel belongs to: itself, or the op whose chain it continues.

    >>> kernel_of(Op(name="L0.o_proj~2", kind="elementwise", out_size=1, elem_bytes=2, flops=0.0,
    ...              attrs={"kernel_of": "L0.o_proj"}))
    'L0.o_proj'
    """
    return str(op.attrs.get("kernel_of", op.name))
