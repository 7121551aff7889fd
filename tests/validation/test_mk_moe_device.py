"""The MoE device script's parts that run without a GPU: the trace's expert split on a made-up trace."""

from __future__ import annotations

import types

import numpy as np

from tests.validation.test_mk_moe import _cfg, _plan
from validation.megakernel import gpu


def _fake_runner(plan, counts: dict[int, int]):
    r = gpu.Runner.__new__(gpu.Runner)
    r.plan, r.schedule = plan, plan.schedule
    r.cp = types.SimpleNamespace(asnumpy=np.asarray)
    r.bufs = {}
    for op, out in zip(plan.schedule.workload.ops, plan.outputs, strict=True):
        if op.kind == "topk":
            r.bufs[out] = np.array([float(counts[op.layer])], dtype=np.float32)
    return r


def test_the_trace_splits_expert_tasks_by_their_slot_and_times_the_top_k():
    plan = _plan(_cfg(), 2, moe_dispatch="stride")  # C = 8 slots a layer
    g, prog = plan.graph, plan.program
    n = len(prog.tasks)
    tr = np.zeros((n, 4), dtype=np.int64)
    order = np.argsort(prog.task_id)  # made-up stamps: task t starts at 10 t us, waits 1, computes 2, publishes 0.5
    tr[order, 0] = np.arange(n) * 10_000
    tr[:, 1] = tr[:, 0] + 1000
    tr[:, 2] = tr[:, 1] + 2000
    tr[:, 3] = tr[:, 2] + 500
    ops = plan.schedule.workload.ops
    exit_rows = np.array([g.per[g.op_of[t]] > 0 and g.tile_of[t] // g.per[g.op_of[t]] >= 5 for t in prog.task_id])
    tr[exit_rows, 2] = tr[exit_rows, 1] + 300  # the slots past the active experts exit early
    r = _fake_runner(plan, {0: 5, 1: 5})
    out = r._moe_trace(tr)
    n_exp = int((g.per[g.op_of[prog.task_id]] > 0).sum())
    assert out["expert_exit"]["tasks"] == int(exit_rows.sum()) > 0
    assert out["expert_active"]["tasks"] + out["expert_exit"]["tasks"] == n_exp
    assert abs(out["expert_exit"]["compute_us"] - 0.3) < 1e-9 and abs(out["expert_active"]["compute_us"] - 2) < 1e-9
    idx = {op.name: i for i, op in enumerate(ops)}
    first = {i: int(g.op_first[i]) for i in range(len(ops))}
    want = np.mean([10 * (first[idx[f"L{L}.topk"]] - (first[idx[f"L{L}.router"] + 1] - 1)) for L in (0, 1)])
    assert abs(out["router_to_topk_us"] - want) < 1e-9
