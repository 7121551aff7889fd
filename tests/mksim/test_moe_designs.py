"""The MoE layer's designs: an expert's weights are never streamed before its layer's top-k is seen
(unless a design speculates, into L2), static striding by slot against a route-finalize queue in
stories with closed-form answers, every design on every built-in MoE model, dense models refused in
one line, and the search choosing among them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import mksim
from mksim import models
from mksim.sim import _engine
from tests.mksim.test_moe import _cfg


def _expert_first_bytes(s: mksim.Schedule) -> list[tuple[float, float]]:
    """For each expert matmul op: (its first bytes in, its layer's top-k end)."""
    eng = _engine._Engine(s, timeline=False)
    eng.run()
    g, fi = s.graph, np.asarray(eng.first_in)
    topk = {op.layer: i for i, op in enumerate(g.ops) if op.kind == "topk"}
    out = []
    for j, op in enumerate(g.ops):
        if op.attrs.get("grouped") == "experts" and op.weight_bytes > 0:
            a, b = eng.op_first[j], eng.op_first[j + 1]
            out.append((float(np.nanmin(fi[a:b])), eng.op_end[topk[op.layer]]))
    return out


@pytest.mark.parametrize("opts", [{}, {"dispatch": "dynamic"}, {"prefetch_depth": 6}])
@pytest.mark.parametrize("mode", ["megakernel", "persistent_barrier"])
def test_expert_weights_never_stream_before_the_top_k(mode: str, opts: dict[str, Any]) -> None:
    if mode != "megakernel" and "dispatch" in opts:
        pytest.skip("dynamic dispatch is a megakernel design")
    wl = models.workload(_cfg(), batch=4)
    got = _expert_first_bytes(mksim.build_schedule(wl, "h200-calibrated", mode, **opts))
    assert got and all(first > end for first, end in got), got


def test_the_gate_costs_a_static_megakernel_time_and_leaves_dense_models_alone() -> None:
    from mksim.sim import _actors
    wl = models.workload(_cfg(), batch=1)
    s = mksim.build_schedule(wl, "h200-calibrated", "megakernel")
    gated = mksim.simulate(s, timeline=False).latency_us
    real = _actors.address_gates
    try:
        _actors.address_gates = lambda graph: None  # type: ignore[assignment]
        _engine.address_gates = _actors.address_gates  # type: ignore[attr-defined]
        free = mksim.simulate(s, timeline=False).latency_us
    finally:
        _actors.address_gates = real  # type: ignore[assignment]
        _engine.address_gates = real  # type: ignore[attr-defined]
    assert gated > free
    dense = mksim.build_schedule("llama-3.2-1b", "h200-calibrated", "megakernel")
    assert _actors.address_gates(dense.graph) is None
    assert not math.isnan(gated)
