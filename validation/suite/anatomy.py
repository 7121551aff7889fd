"""Where a layer's time goes: per-op spans from a persistent kernel's per-task stamps.

The generated kernels stamp every task with ``%globaltimer`` (ns) four times
(``validation/megakernel/mk_kernel.cu``; :func:`validation.megakernel.gpu.measure` with
``raw_trace=`` saves the last timed run's stamps with the task rows they belong to):

0. the worker warps begin waiting for the task (the waiter warp has its row ready or not),
1. its inputs are ready and the workers start it,
2. its device function is done,
3. it is handed to the publisher warp (which fences and adds to its flag and counter).

- :func:`op_trace` reduces the stamps to one entry per op of the step — first start, last end,
  tasks, mean wait (1 − 0) and compute (2 − 1) — small enough to keep in ``measured.json``
  (``op_trace`` of a case, next to its ``measurement``);
- :func:`layer_anatomy` takes one layer of that, adds each op's DRAM bytes (weights and KV cache
  read) and the layer's DRAM time at the HBM read bandwidth;
- :func:`anatomy_table` puts two cases' anatomies side by side in markdown ("before" and "after").

Pure numpy and dicts: nothing here needs a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["anatomy_table", "layer_anatomy", "middle_layer", "op_trace", "op_trace_of_npz"]


def op_trace(stamps: np.ndarray, task_ops: np.ndarray, op_names: Iterable[str]) -> dict[str, Any]:
    """Per op, from the per-task stamps (``stamps``: tasks × 4, ns; ``task_ops``: each task's op
    index; ``op_names``: the ops by index). Times in µs from the step's first stamp: ``start_us``
    (the first of its tasks to start, stamp 1), ``end_us`` (the last handed to the publisher,
    stamp 3), ``tasks``, ``wait_us`` and ``compute_us`` (means over its tasks). Tasks that never
    stamped (all zeros) are left out.

    >>> st = np.array([[1000, 1200, 1700, 1800], [1000, 1500, 2500, 2600]], dtype=np.uint64)
    >>> op_trace(st, np.array([0, 0]), ["L0.qkv_proj"])["ops"]["L0.qkv_proj"]
    {'start_us': 0.2, 'end_us': 1.6, 'tasks': 2, 'wait_us': 0.35, 'compute_us': 0.75}
    """
    tr = np.asarray(stamps).astype(np.int64)
    ops = np.asarray(task_ops).astype(np.int64)
    names = list(op_names)
    seen = tr[:, 0] > 0
    tr, ops = tr[seen], ops[seen]
    if not len(tr):
        return {"t0_ns": None, "ops": {}}
    t0 = int(tr[:, 0].min())
    out: dict[str, dict[str, Any]] = {}
    for i in np.unique(ops).tolist():
        t = tr[ops == i]
        out[names[i]] = {"start_us": round(float(t[:, 1].min() - t0) / 1e3, 3),
                         "end_us": round(float(t[:, 3].max() - t0) / 1e3, 3), "tasks": int(len(t)),
                         "wait_us": round(float((t[:, 1] - t[:, 0]).mean()) / 1e3, 3),
                         "compute_us": round(float((t[:, 2] - t[:, 1]).mean()) / 1e3, 3)}
    order = {n: k for k, n in enumerate(names)}
    return {"t0_ns": t0, "ops": dict(sorted(out.items(), key=lambda kv: order[kv[0]]))}


def op_trace_of_npz(path) -> dict[str, Any]:
    """:func:`op_trace` of a raw trace file written by ``gpu.measure(raw_trace=...)``."""
    with np.load(path) as z:
        return op_trace(z["stamps"], z["tasks"][:, 1], [str(n) for n in z["ops"]])


def middle_layer(ops) -> int | None:
    """The middle one of the layers ``ops`` (a workload's ops) belong to."""
    layers = sorted({op.layer for op in ops if op.layer is not None})
    return layers[len(layers) // 2] if layers else None


def layer_anatomy(trace: dict[str, Any], ops, layer: int, hbm_GBps: float) -> dict[str, Any] | None:
    """One layer of an :func:`op_trace`: its ops in the workload's order (``ops``), each with its
    kind, start and end in µs from the layer's first start, span, tasks, mean wait and compute and
    its DRAM bytes (weights and KV cache read); the layer's span, bytes and DRAM time at
    ``hbm_GBps``. ``None`` when the trace has none of the layer's ops."""
    mine = [op for op in ops if op.layer == layer and op.name in trace.get("ops", {})]
    if not mine:
        return None
    t = trace["ops"]
    t0 = min(t[op.name]["start_us"] for op in mine)
    rows = []
    for op in mine:
        e = t[op.name]
        rows.append({"op": op.name.split(".", 1)[-1], "kind": op.kind,
                     "start_us": round(e["start_us"] - t0, 3), "end_us": round(e["end_us"] - t0, 3),
                     "span_us": round(e["end_us"] - e["start_us"], 3), "tasks": e["tasks"],
                     "wait_us": e["wait_us"], "compute_us": e["compute_us"],
                     "bytes": float(op.weight_bytes + op.kv_read_bytes)})
    total_B = sum(r["bytes"] for r in rows)
    return {"layer": layer, "layers": len({op.layer for op in ops if op.layer is not None}),
            "span_us": round(max(r["end_us"] for r in rows), 3), "tasks": sum(r["tasks"] for r in rows),
            "bytes": total_B, "hbm_read_GBps": hbm_GBps, "dram_us": round(total_B / hbm_GBps / 1e3, 3),
            "ops": rows}


def _merged_order(a: list[str], b: list[str]) -> list[str]:
    """``a`` with ``b``'s other names put where ``b`` has them: before the next name the two share
    (after the last one where none follows)."""
    out = list(a)
    for i, n in enumerate(b):
        if n in out:
            continue
        nxt = next((m for m in b[i + 1:] if m in out), None)
        out.insert(out.index(nxt) if nxt is not None else len(out), n)
    return out


def anatomy_table(before: tuple[str, dict], after: tuple[str, dict]) -> str:
    """Two layer anatomies (``(label, anatomy)``) side by side in markdown: per op, start–end (µs
    from the layer's first start), tasks, mean wait / compute per task; then the layer."""
    (la, a), (lb, b) = before, after
    by_a = {r["op"]: r for r in a["ops"]}
    by_b = {r["op"]: r for r in b["ops"]}
    kinds = {r["op"]: r["kind"] for r in a["ops"] + b["ops"]}

    def cells(r: dict | None) -> str:
        if r is None:
            return "– | – | –"
        return f"{r['start_us']:.1f}–{r['end_us']:.1f} | {r['tasks']} | {r['wait_us']:.2f} / {r['compute_us']:.2f}"

    lines = [f"| op | kind | {la}: start–end µs | tasks | wait / compute µs | {lb}: start–end µs | tasks | "
             "wait / compute µs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for op in _merged_order(list(by_a), list(by_b)):
        lines.append(f"| {op} | {kinds[op]} | {cells(by_a.get(op))} | {cells(by_b.get(op))} |")
    lines.append(f"| **layer** | | **0.0–{a['span_us']:.1f}** | {a['tasks']} | | **0.0–{b['span_us']:.1f}** | "
                 f"{b['tasks']} | |")
    return "\n".join(lines) + "\n"
