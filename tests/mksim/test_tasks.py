"""Tiling and tile-level dependencies, checked against a brute-force element-level expansion."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mksim import models
from mksim.errors import WorkloadError
from mksim.workload import Input, Op, TaskGraph, Tiling, Workload, tile_bounds

TINY = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
        "max_position_embeddings": 4096}


def tiny(batch=2, kv_len=600, **kw):
    return models.from_hf_config(TINY, batch=batch, kv_len=kv_len, **kw)


def test_tile_bounds_are_aligned_and_cover():
    op = Op(name="x", kind="matmul", out_size=1000, elem_bytes=2, flops=0, align=16)
    b = tile_bounds(op, 7)
    assert b[0] == 0 and b[-1] == 1000 and len(b) == 8
    assert all(x % 16 == 0 for x in b[:-1]) and all(b[1:] > b[:-1])


def test_named_dependencies():
    wl = tiny(batch=1, kv_len=1000, kv_splits=4)
    g = TaskGraph(wl, Tiling(default=8, per_kind={"attn_partial": 0, "attn_reduce": 0}))
    ix = wl.index
    # a matvec tile needs every tile of its input vector
    assert g.deps(g.task_id("L0.qkv_proj", 3)) == ((ix["L0.attn_norm"], 0, 4),)  # 256/64 = 4 tiles
    # an elementwise tile needs the overlapping tiles only: rope tile 5 covers columns
    # [224, 288) (head-aligned), which lie in qkv tiles 4 [192, 240) and 5 [240, 288)
    assert g.deps(g.task_id("L0.rope_kv", 5)) == ((ix["L0.qkv_proj"], 4, 6),)
    # attention partial of kv head 1: q heads 4..7, k head 1, v head 1 (rope tiles of 64 cols)
    q_cols, kv_off = (4 * 32, 8 * 32), 256
    deps = g.deps(g.task_id("L0.attn_partial", 1 * 4 + 2))   # head 1, split 2
    rope_b = g.bounds[ix["L0.rope_kv"]].tolist()
    want = set()
    for lo, hi in [q_cols, (kv_off + 32, kv_off + 64), (kv_off + 64 + 32, kv_off + 64 + 64)]:
        want |= {t for t in range(8) if rope_b[t] < hi and rope_b[t + 1] > lo}
    got = {t for p, a, b in deps for t in range(a, b)}
    assert got == want and all(p == ix["L0.rope_kv"] for p, _, _ in deps)
    # the reduction of head 1 needs the 4 partials of head 1
    assert g.deps(g.task_id("L0.attn_reduce", 1)) == ((ix["L0.attn_partial"], 4, 8),)
    # o_proj: all of the attention output, plus the residual tile under it: o_proj tile 2
    # is [64, 96), inside embed tile 1 [64, 128) (embed has 4 tiles of 64)
    d = g.deps(g.task_id("L0.o_proj", 2))
    assert (ix["embed"], 1, 2) in d and (ix["L0.attn_reduce"], 0, 2) in d
    # silu_mul tile j reads gate tile j and up tile j of the [gate; up] output
    gu = 8  # gate_up has 8 tiles over 1024 = [gate 512 | up 512]
    assert g.deps(g.task_id("L0.silu_mul", 1)) == ((ix["L0.gate_up_proj"], 0, 1), (ix["L0.gate_up_proj"], 4, 5))
    assert gu == g.n_tiles[ix["L0.gate_up_proj"]]


def _brute_force_deps(g: TaskGraph, task: int) -> set[int]:
    """Producer tasks found element by element, from the Input definitions."""
    op = g.ops[g.op_of[task]]
    t = g.tile_of[task]
    lo, hi = g.bounds[g.op_of[task]][t], g.bounds[g.op_of[task]][t + 1]
    out: set[int] = set()
    for inp in op.inputs:
        p = g.workload.index[inp.op]
        pb = g.bounds[p]
        need: set[int] = set()
        for i in range(lo, hi):
            if inp.full:
                need |= set(range(g.ops[p].out_size))
                break
            k = i // inp.group
            for off, stride, width in inp.segments:
                need |= set(range(off + k * stride, off + k * stride + width))
        for tt in range(len(pb) - 1):
            if any(pb[tt] <= e < pb[tt + 1] for e in need):
                out.add(int(g.op_first[p] + tt))
    return out


@settings(max_examples=25, deadline=None)
@given(default=st.integers(1, 12), attn=st.integers(0, 6), batch=st.integers(1, 3),
       splits=st.integers(1, 4), fuse=st.booleans(), split_qkv=st.booleans(), split_gu=st.booleans(),
       epilogues=st.booleans(), reduce=st.booleans())
def test_deps_match_brute_force(default, attn, batch, splits, fuse, split_qkv, split_gu, epilogues, reduce):
    # epilogues: RoPE and SiLU·mul fused into the projections that are not split; reduce: the
    # attention reduction fused into the O projection (which then needs every partial)
    wl = tiny(batch=batch, kv_len=700, kv_splits=splits, fuse_norm=fuse, split_qkv=split_qkv,
              split_gate_up=split_gu, fuse_rope=epilogues and not split_qkv, fuse_silu=epilogues and not split_gu,
              fuse_reduce=reduce)
    g = TaskGraph(wl, Tiling(default=default, per_kind={"attn_partial": attn, "attn_reduce": attn}))
    layer0 = [i for i, op in enumerate(wl.ops) if op.layer == 0]
    first_layer = range(int(g.op_first[layer0[0]]), int(g.op_first[layer0[-1] + 1]))
    for task in first_layer:
        assert set(g.dep_tasks(task)) == _brute_force_deps(g, task), g.name(task)


def test_fusion_options_keep_the_step_s_bytes():
    base = models.workload("llama-3.2-1b")
    for kw in ({"fuse_norm": True}, {"split_qkv": True}, {"split_gate_up": True},
               {"fuse_norm": True, "split_qkv": True, "split_gate_up": True}, {"fuse_rope": True, "fuse_silu": True},
               {"fuse_norm": True, "fuse_rope": True, "split_gate_up": True}, {"fuse_reduce": True, "split_qkv": True}):
        wl = models.workload("llama-3.2-1b", **kw)
        # the same weights; with fused norms each split projection reads the norm's weight again
        assert base.weight_bytes <= wl.weight_bytes <= base.weight_bytes * (1 + 1e-4)
        assert wl.kv_bytes == base.kv_bytes
        names = {op.name.rsplit(".", 1)[-1] for op in wl.ops}
        assert ("attn_norm" in names) != kw.get("fuse_norm", False)
        assert ({"q_proj", "k_proj", "v_proj"} <= names) == kw.get("split_qkv", False)
        assert ({"gate_proj", "up_proj"} <= names) == kw.get("split_gate_up", False)
        assert ("rope_kv" in names) != kw.get("fuse_rope", False)
        assert ("silu_mul" in names) != kw.get("fuse_silu", False)
        assert ("attn_reduce" in names) != kw.get("fuse_reduce", False)


def test_costs_are_conserved_by_tiling():
    wl = models.workload("llama-3.2-1b", batch=4, kv_len=2048)
    for tiling in (Tiling(default=1), Tiling(default=132), Tiling(default=0)):
        g = TaskGraph(wl, tiling)
        assert g.weight_bytes.sum() == pytest.approx(wl.weight_bytes)
        assert g.flops.sum() == pytest.approx(wl.flops)
        assert g.kv_bytes.sum() == pytest.approx(wl.kv_bytes)
        assert g.out_bytes.sum() == pytest.approx(sum(op.out_bytes for op in wl.ops))


def test_granularity_is_a_parameter():
    wl = models.workload("llama-3.2-1b")
    one_kernel = TaskGraph(wl, Tiling(default=1000))
    mk = TaskGraph(wl, Tiling(default=132))
    lm = wl.index["lm_head"]
    assert one_kernel.n_tiles[lm] == 1000 and mk.n_tiles[lm] == 132


def test_task_graph_is_acyclic():
    TaskGraph(tiny(), Tiling(default=5)).check_acyclic()


def test_op_cycle_is_reported_with_its_path():
    a = Op(name="a", kind="add", out_size=4, elem_bytes=2, flops=0, inputs=(Input("c"),))
    b = Op(name="b", kind="add", out_size=4, elem_bytes=2, flops=0, inputs=(Input("a"),))
    c = Op(name="c", kind="add", out_size=4, elem_bytes=2, flops=0, inputs=(Input("b"),))
    with pytest.raises(WorkloadError, match=r"cycle: (a -> b -> c -> a|b -> c -> a -> b|c -> a -> b -> c)"):
        Workload(name="w", ops=(a, b, c), tokens=1)


def test_bad_op_graphs():
    a = Op(name="a", kind="add", out_size=4, elem_bytes=2, flops=0)
    with pytest.raises(WorkloadError, match="appears twice"):
        Workload(name="w", ops=(a, a), tokens=1)
    b = Op(name="b", kind="add", out_size=4, elem_bytes=2, flops=0, inputs=(Input("zz"),))
    with pytest.raises(WorkloadError, match="reads 'zz'"):
        Workload(name="w", ops=(a, b), tokens=1)
    c = Op(name="c", kind="add", out_size=4, elem_bytes=2, flops=0, inputs=(Input("a"),))
    with pytest.raises(WorkloadError, match="comes before its input"):
        Workload(name="w", ops=(c, a), tokens=1)


def test_bad_tiling():
    with pytest.raises(WorkloadError, match="tile count"):
        TaskGraph(tiny(), Tiling(default=-1))
