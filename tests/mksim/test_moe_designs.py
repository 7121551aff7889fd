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
from tests.mksim.simkit import first_layers
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


# -- the designs -----------------------------------------------------------------------------------
from mksim.errors import ScheduleError  # noqa: E402
from mksim.schedule import design_names  # noqa: E402
from mksim.workload import Input, Op, Tiling, Workload  # noqa: E402
from tests.mksim.test_bad_inputs import assert_one_line, run_cli  # noqa: E402

MOE_DESIGNS = {"moe_stride": {"moe_dispatch": "stride"}, "moe_queue": {"moe_dispatch": "queue"},
               "moe_prefetch": {"moe_prefetch_MiB": 16.0},
               "moe_queue+prefetch": {"moe_dispatch": "queue", "moe_prefetch_MiB": 16.0}}


def test_the_moe_designs_are_registered() -> None:
    assert {"moe_stride", "moe_queue", "moe_prefetch"} <= set(design_names())


def _one_layer(rows: tuple[int, ...], tiles_per_expert: int) -> Workload:
    """One MoE layer by hand: a top-k, then a grouped expert op of len(rows) experts (equal weights),
    each cut into ``tiles_per_expert`` tiles of 1 MB."""
    D = len(rows)
    topk = Op(name="L0.topk", kind="topk", out_size=1, elem_bytes=64, flops=1.0, layer=0,
              attrs={"experts": 8, "top_k": D, "active": D})
    experts = Op(name="L0.experts_down", kind="matmul", out_size=D * tiles_per_expert * 64, elem_bytes=2,
                 flops=1.0, weight_bytes=D * tiles_per_expert * 1e6, align=64, layer=0,
                 inputs=(Input("L0.topk", full=True),),
                 attrs={"grouped": "experts", "groups": D, "group_experts": tuple(range(D)), "group_rows": rows,
                        "tokens": 1, "k": 1, "rows": 1})
    return Workload(name="one moe layer", ops=(topk, experts), tokens=1)


def test_stride_against_queue_on_four_sms(tmp_path: Any) -> None:
    """One layer, 2 experts of 3 tiles (1 MB each) on a 4-SM GPU whose SMs each draw 10 GB/s (100 µs
    a tile): striding by slot puts tiles 0..5 on SMs 0,1,2,3,0,1 (2 on SMs 0 and 1: 200 µs of
    streaming, max/mean 2/1.5); the queue gives the same counts, claimed as SMs free up, and its
    claims and route-finalize cost atomics, not tiles."""
    import hwmodels
    from tests.mksim.simkit import TOY
    text = TOY.format(cap=10).replace('count = { value = 2, source = "t" }', 'count = { value = 4, source = "t" }', 1)
    (tmp_path / "toy4.toml").write_text(text)
    gpu = hwmodels.load(tmp_path / "toy4.toml")
    wl = _one_layer((1, 1), 3)
    got = {}
    for name, opts in (("stride", {"moe_dispatch": "stride"}), ("queue", {"moe_dispatch": "queue"})):
        s = mksim.build_schedule(wl, gpu, "megakernel", tiling=Tiling(default=6), **opts)
        r = mksim.simulate(s, timeline=False)
        got[name] = r
        layer = r.design_stats[f"moe_{name}"]["layers"][0]
        assert (layer["tiles"], layer["max_tiles_per_sm"], layer["mean_tiles_per_sm"]) == (6, 2, 1.5)
    assert [int(x) for x in got["stride"].task_lane[1:]] == [0, 1, 2, 3, 0, 1]  # type: ignore[index]
    # the launch (1 µs), the top-k seen (under 1 µs), then 2 tiles of 1 µs latency + 100 µs on SMs 0 and 1
    stride, queue = got["stride"].latency_us, got["queue"].latency_us
    assert 202.0 < stride < 203.0
    # the queue: the same tiles per SM, its route-finalize (an L2 read + an atomic) and the first claim
    # (an atomic) later at most: 0.02 + 0.5 + 0.5 µs on the toy GPU
    assert 0.0 < queue - stride <= 1.02 + 1e-9


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("model", ["olmoe-1b-7b", "qwen3-30b-a3b", "mixtral-8x7b"])
def test_every_design_runs_every_moe_model(model: str, batch: int) -> None:
    cfg = first_layers(model)  # a few of its layers: the model's others are the same MoE layer again
    wl = models.workload(cfg, batch=batch)
    plain = mksim.simulate(mksim.build_schedule(wl, "h200-calibrated", "megakernel"), timeline=False)
    for name, opts in MOE_DESIGNS.items():
        r = mksim.simulate(mksim.build_schedule(wl, "h200-calibrated", "megakernel", **opts), timeline=False)
        assert math.isfinite(r.latency_us) and r.latency_us > r.bandwidth_floor_us * 0.5, name
        assert abs(r.latency_us / plain.latency_us - 1) < 0.5, (name, r.latency_us, plain.latency_us)
        for d in name.replace("+prefetch", "").split("+") + (["moe_prefetch"] if "prefetch" in name else []):
            stats = r.design_stats[d if d.startswith("moe_") else "moe_" + d]
            assert stats["layers"], name
        if "moe_prefetch" not in name:
            layers = r.design_stats[name.split("+")[0]]["layers"]
            moe = cfg.moe_layers
            assert [x["layer"] for x in layers] == list(moe)
            for x in layers:
                assert x["max_tiles_per_sm"] >= x["mean_tiles_per_sm"] > 0 and x["topk_us"] > 0
                assert sum(len(e) for e in x["sm_experts"].values()) >= x["active"]


@pytest.mark.parametrize("opts", list(MOE_DESIGNS.values()))
def test_dense_models_are_refused_in_one_line(opts: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ScheduleError, match="has no experts"):
        mksim.build_schedule("llama-3.2-1b", "h200-calibrated", "megakernel", **opts)
    flags = [f"--opt={k}={v}" for k, v in opts.items()]
    code, _out, err = run_cli(["simulate", "--model", "llama-3.2-1b", "--mode", "megakernel", *flags], capsys)
    assert_one_line(code, err, "has no experts")


def test_bad_values_are_refused() -> None:
    wl = models.workload(_cfg(), batch=1)
    for opts, msg in (({"moe_dispatch": "spray"}, "moe_dispatch must be one of"),
                      ({"moe_prefetch_MiB": -1.0}, "moe_prefetch_MiB must be"),
                      ({"moe_prefetch_MiB": 1e6}, "exceeds"),
                      ({"moe_dispatch": "queue", "dispatch": "dynamic"}, "use one or the other"),
                      ({"moe_dispatch": "stride", "policy": "dag"}, "policy must be moe_stride")):
        policy = opts.pop("policy", None)
        with pytest.raises(ScheduleError, match=msg):
            mksim.build_schedule(wl, "h200-calibrated", "megakernel", policy=policy, **opts)
    with pytest.raises(ScheduleError, match="megakernel design"):
        mksim.build_schedule(wl, "h200-calibrated", "persistent_barrier", moe_dispatch="queue")


def test_chain_forms_run_the_top_k_and_combine_as_kernels() -> None:
    wl = models.workload("qwen3-30b-a3b", batch=1)
    for mode in ("graph", "graph_pdl"):
        r = mksim.simulate(mksim.build_schedule(wl, "h200-calibrated", mode), timeline=False)
        kinds = {op["op"].split(".")[-1] for op in r.per_op}
        assert {"topk", "combine", "experts_gate_up", "experts_down"} <= kinds
        topk = [op for op in r.per_op if op["op"].endswith(".topk")]
        assert len(topk) == 48


def test_the_search_picks_among_the_moe_designs() -> None:  # 0.8 s of CPU, optuna's import included
    pytest.importorskip("optuna")
    from mksim.search import search
    from tests.mksim.searchkit import TINY_MOE

    # the designs' machinery, not a model's numbers: OLMoE's block at 2 layers of 16 experts (top-4)
    res = search(str(TINY_MOE), "h200-calibrated", batch=1, trials=31, seed=0, storage="memory",
                 designs=("moe_prefetch", "moe_queue", "moe_stride"))
    names = set(res.baselines)
    assert {"megakernel:moe_stride", "megakernel:moe_queue", "megakernel:moe_prefetch"} <= names, names
    assert all(math.isfinite(res.baselines[n]["latency_us"]) for n in names)
    assert res.best["latency_us"] <= min(v["latency_us"] for v in res.baselines.values())
