"""Fused epilogues (``fuse_rope``, ``fuse_silu``) and the fused attention reduction (``fuse_reduce``,
in the O projection's input load): one op fewer per layer, the same weights, KV cache and FLOPs, and
one op boundary less per layer in closed form on the toy GPU of test_sim_stories (times in µs)."""

from __future__ import annotations

import pytest

import mksim
from mksim import models
from mksim.errors import WorkloadError
from mksim.schedule import Schedule
from mksim.workload import TaskGraph, Tiling

from .simkit import toy_gpu

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
        "max_position_embeddings": 4096}
LAYERS, T, I, Q, KV = 2, 1, 512, 8 * 32, 2 * 32
TOL = 2e-3
EPILOGUES = ({"fuse_silu": True}, {"fuse_rope": True}, {"fuse_rope": True, "fuse_silu": True})
FUSIONS = EPILOGUES + ({"fuse_reduce": True}, {"fuse_rope": True, "fuse_silu": True, "fuse_reduce": True})
REMOVED = {"fuse_rope": "rope_kv", "fuse_silu": "silu_mul", "fuse_reduce": "attn_reduce"}


def tiny(**kw):
    return models.from_hf_config(TINY, **{"batch": T, "kv_len": 600, "n_sms": 2, **kw})


@pytest.mark.parametrize("kw", FUSIONS)
def test_a_fused_epilogue_removes_one_op_per_layer_and_keeps_bytes_and_flops(kw):
    plain, fused = tiny(), tiny(**kw)
    kinds = [op.kind for op in fused.ops]
    assert len(plain.ops) - len(fused.ops) == len(kw) * LAYERS
    assert all(kinds.count(REMOVED[k]) == 0 for k in kw)
    # the same weights, KV cache and arithmetic: the epilogue does what the op did
    assert fused.weight_bytes == plain.weight_bytes and fused.kv_bytes == plain.kv_bytes
    assert fused.flops == pytest.approx(plain.flops, rel=1e-12)
    # one activation fewer per layer: the unrotated [q; k; v], the [gate; up] product, the merged attention
    saved = (T * (Q + 2 * KV) * 2 if "fuse_rope" in kw else 0) + (T * 2 * I * 2 if "fuse_silu" in kw else 0) \
        + (T * Q * 2 if "fuse_reduce" in kw else 0)
    assert plain.min_dram_bytes - fused.min_dram_bytes == LAYERS * saved
    g = TaskGraph(fused, Tiling(default=3))
    assert g.flops.sum() == pytest.approx(fused.flops) and g.kv_bytes.sum() == pytest.approx(fused.kv_bytes)
    assert tiny(**kw).name == plain.name + "".join(f" fused-{k[5:]}" for k in REMOVED if k in kw)


def test_the_fused_projections_carry_the_absorbed_op():
    ops = {op.name: op for op in tiny(fuse_rope=True, fuse_silu=True).ops}
    qkv, gu = ops["L0.qkv_proj"], ops["L0.gate_up_proj"]
    # RoPE: the rotated [q; k; v] in the model's order, k and v appended to the cache, attention reads it
    assert qkv.attrs["epilogue"] == "rope_kv" and qkv.out_size == Q + 2 * KV
    assert qkv.kv_write_bytes == T * 2 * KV * 2
    assert ops["L0.attn_partial"].inputs[0].op == "L0.qkv_proj"
    # SiLU·mul: 2 I weight rows in (gate, up) pairs make I outputs, 8 outputs = a 16-row group
    assert (gu.attrs["epilogue"], gu.out_size, gu.attrs["weight_rows"], gu.align) == ("silu_mul", I, 2 * I, 8)
    assert gu.weight_bytes == 256 * 2 * I * 2
    assert ops["L0.down_proj"].inputs[0].op == "L0.gate_up_proj"


def test_the_o_projection_merges_every_partial_while_it_loads_its_input():
    """With fuse_reduce o_proj reads the partials (all of them: each of its tasks needs every head of
    its rows), does the merge's arithmetic and names the op it absorbed; nothing else changes."""
    plain, fused = tiny(batch=2, kv_splits=3), tiny(batch=2, kv_splits=3, fuse_reduce=True)
    ops, before = {op.name: op for op in fused.ops}, {op.name: op for op in plain.ops}
    o, part = ops["L0.o_proj"], ops["L0.attn_partial"]
    assert [(i.op, i.full) for i in o.inputs] == [("L0.attn_partial", True), ("embed", False)]
    assert (o.attrs["prologue"], o.attrs["kv_splits"], o.attrs["k"]) == ("attn_reduce", 3, Q)
    C, B, heads, hd = 3, 2, 8, 32
    assert o.attrs["prologue_bytes"] == part.out_bytes == B * heads * C * (hd + 2) * 4
    assert o.flops == before["L0.o_proj"].flops + before["L0.attn_reduce"].flops
    assert (o.weight_bytes, o.out_size, o.out_bytes) == (before["L0.o_proj"].weight_bytes, 256, 256 * B * 2)
    g = TaskGraph(fused, Tiling(default=4))
    first = g.task_id("L0.o_proj", 0)
    for t in range(g.n_tiles[fused.index["L0.o_proj"]]):  # each task: every partial, and its residual features
        lo, hi = g.bounds[fused.index["L0.o_proj"]][t:t + 2]
        assert g.in_bytes[first + t] == part.out_bytes + (hi - lo) * B * 2
        assert (fused.index["L0.attn_partial"], 0, 4) in g.deps(first + t)
    assert ops["L0.mlp_norm"].inputs[0].op == "L0.o_proj"


def test_the_reduction_fuses_with_every_other_fusion_and_split():
    for kw in ({"fuse_norm": True, "fuse_rope": True, "fuse_silu": True}, {"split_qkv": True, "split_gate_up": True}):
        wl = tiny(fuse_reduce=True, **kw)
        assert not any(op.kind == "attn_reduce" for op in wl.ops) and wl.fuse_reduce
        assert wl.ops[wl.index["L1.o_proj"]].inputs[0].op == "L1.attn_partial"


def test_the_merge_is_priced_by_its_input_bytes_and_flops(tmp_path):
    """A fused o_proj task costs what its bytes and FLOPs do (no device cost on the toy GPU): the
    slower of its arithmetic and its L2 traffic, which holds every partial; unfused, the same task
    reads only the merged rows."""
    from mksim import costs

    r = costs.rates(toy_gpu(tmp_path))
    for fuse in (False, True):
        wl = tiny(batch=2, kv_splits=3, fuse_reduce=fuse)
        g = TaskGraph(wl, Tiling(default=2))
        a = g.task_id("L0.o_proj", 0)
        rows_B = 2 * 128 * 2  # the residual features of its 128 outputs, both rows
        assert g.in_bytes[a] == rows_B + (2 * 8 * 3 * 34 * 4 if fuse else 2 * Q * 2)
        tt = costs.task_times(g, r)
        assert tt.work_us[a] == max(costs.op_compute_us(g, r)[a], costs.l2_us(g.in_bytes[a] + g.out_bytes[a], r))


def run(tmp_path, wl, mode, **opts):
    s = mksim.build_schedule(wl, toy_gpu(tmp_path), mode, tiling=Tiling(default=2), blocks_per_sm=1, **opts)
    return mksim.simulate(s).latency_us


@pytest.mark.parametrize("kw", FUSIONS)
@pytest.mark.parametrize("mode,boundary_us,opts", [
    ("graph", 2.0, {}),                              # a graph node interval
    ("megakernel", 0.5, {"prefetch_depth": 0}),      # a flag latency
    ("persistent_barrier", 3.0, {"prefetch_depth": 0}),  # a grid barrier
])
def test_each_fused_op_saves_one_op_boundary(tmp_path, kw, mode, boundary_us, opts):
    """The removed op streamed nothing: it cost its boundary and the L2 latency of its input loads
    (20 ns on the toy GPU); its arithmetic moved into the matmul (tensor cores: no time here)."""
    saved = run(tmp_path, tiny(), mode, **opts) - run(tmp_path, tiny(**kw), mode, **opts)
    assert saved == pytest.approx(len(kw) * LAYERS * (boundary_us + 0.02), abs=2 * TOL)


@pytest.mark.parametrize("kw,msg", [
    ({"fuse_rope": True, "split_qkv": True}, "fuse_rope rotates q and k in the fused q/k/v projection"),
    ({"fuse_silu": True, "split_gate_up": True}, "fuse_silu computes SiLU"),
    ({"fuse_rope": 1}, "fuse_rope must be true or false"),
    ({"fuse_reduce": "yes"}, "fuse_reduce must be true or false"),
])
def test_an_epilogue_without_its_fused_projection_is_refused_in_one_line(kw, msg):
    with pytest.raises(WorkloadError, match=msg) as exc:
        tiny(**kw)
    assert "\n" not in str(exc.value)


def test_rope_is_not_fused_with_q_k_norms():
    with pytest.raises(WorkloadError, match="qwen3-8b: fuse_rope is not built for models with q/k norms"):
        models.workload("qwen3-8b", fuse_rope=True)
    assert not any(op.kind == "silu_mul" for op in models.workload("qwen3-8b", fuse_silu=True).ops)


def test_schedule_files_keep_the_fusions():
    wl = models.workload("llama-3.2-1b", fuse_rope=True, fuse_silu=True, fuse_reduce=True)
    s = mksim.build_schedule(wl, "h200-datasheet", "megakernel")
    assert all(s.workload_spec[k] is True for k in ("fuse_rope", "fuse_silu", "fuse_reduce"))
    back = Schedule.from_json(s.to_json())
    assert back.workload == wl and back.queues == s.queues
    assert mksim.simulate(back).latency_us == pytest.approx(mksim.simulate(s).latency_us, rel=1e-12)
