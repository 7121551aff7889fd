"""The attention reduction folded into the O projection's input load (``fuse_reduce``), checked
without a GPU: the op table and the task rows, the one-line refusals, the torch reference, and a
line-by-line replay of the device functions (mk_merge_rows in validation/megakernel/mk_kernel.cu,
mk_reduce_pair in validation/kernels/mk_ops.cuh)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from mksim.models import ModelConfig
from mksim.workload._llm import build_llm_workload
from validation.megakernel import program as P
from validation.megakernel.encode import OPCODES

from .mkkit import cpu_buffers

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelConfig(name="tiny", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=8, num_kv_heads=2,
                   head_dim=64, vocab_size=1000, rope_theta=10000.0, max_position_embeddings=4096)
ALL = {"fuse_norm": True, "fuse_rope": True, "fuse_silu": True}
Q, G, D = 8 * 64, 4, 64


def _plan(batch: int = 2, splits: int = 3, mode: str = "megakernel", **kw):
    wl = build_llm_workload(TINY, batch=batch, kv_len=70, n_sms=8, kv_splits=splits, **kw)
    return P.plan(mksim.build_schedule(wl, "h200-datasheet", mode, blocks_per_sm=1))




# -- what the plan gives the kernel ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["megakernel", "graph"])
def test_the_o_projection_row_points_at_the_partials(mode):
    plan = _plan(mode=mode, fuse_reduce=True, **ALL)
    wl = plan.schedule.workload
    assert OPCODES["attn_reduce"] not in {r["kind"] for r in plan.ops}
    assert not any(n.startswith("out:") and n.endswith("attn_reduce") for n in plan.buffers)
    r = plan.ops[wl.index["L1.o_proj"]]
    assert r["opt"] == P.OPT_MMA | P.OPT_RESIDUAL | P.OPT_REDUCE
    assert (r["in0"], r["ld0"], r["in1"]) == ("out:L1.attn_partial", G * (D + 2), "out:L0.down_proj")
    assert (r["hq"], r["hkv"], r["hd"], r["splits"], r["K"], r["T"]) == (8, 2, 64, 3, Q, 2)
    assert plan.buffers["out:L1.attn_partial"].shape == (2 * 2 * 3, G * (D + 2))
    assert plan.buffers["out:L1.attn_partial"].dtype == "f32"
    # the input region holds the merged rows, not the partials
    assert plan.x_B >= 2 * Q * 2 and plan.x_B == P.x_region_bytes(_plan(**ALL).schedule)
    # every o_proj task waits for every partial of its layer
    prog, ai = plan.program, wl.index["L1.attn_partial"]
    for row in prog.tasks[prog.tasks[:, 1] == wl.index["L1.o_proj"]]:
        deps = prog.deps[row[5]:row[5] + row[6]]
        assert [ai, 0, int(plan.ops[ai]["n_tiles"])] in deps[:, 1:].tolist()


def test_the_option_bit_matches_the_cuda_define_and_every_loader_merges():
    src = (ROOT / "validation/kernels/mk_ops.cuh").read_text()
    assert int(re.search(r"#define MK_OPT_REDUCE (\d+)", src).group(1)) == P.OPT_REDUCE
    assert P.OPT_REDUCE not in (P.OPT_FUSED_NORM, P.OPT_RESIDUAL, P.OPT_MMA, P.OPT_ROPE, P.OPT_SILU)
    kernel = (ROOT / "validation/megakernel/mk_kernel.cu").read_text()
    for loader in ("mk_load_x_mma2", "mk_load_x_mma", "mk_load_x"):
        body = re.search(rf"\n__device__ void {loader}\(.*?\n\}}\n", kernel, re.S).group(0)
        assert "MK_OPT_REDUCE" in body and "mk_merge_rows(" in body, loader
    assert "mk_reduce_pair(" in re.search(r"void mk_attn_reduce\(.*?\n\}\n#endif  // MK_ATTN", src, re.S).group(0)


@pytest.mark.parametrize("attr,value,msg", [
    ("prologue", "rope_kv", "no device function for a fused rope_kv prologue"),
    ("kv_splits", 5, "needs the attention partials of its KV splits"),
    ("k", 256, "makes 512 inputs, not 256"),
])
def test_what_the_merge_cannot_run_is_refused_in_one_line(attr, value, msg):
    wl = build_llm_workload(TINY, batch=1, kv_len=70, n_sms=8, kv_splits=3, fuse_reduce=True)
    s = mksim.build_schedule(wl, "h200-datasheet", "megakernel", blocks_per_sm=1)
    s.workload.ops[wl.index["L0.o_proj"]].attrs[attr] = value  # attrs are the encoder's to read
    with pytest.raises(ScheduleError, match=f"op L0.o_proj: .*{msg}") as exc:
        P.plan(s)
    assert "\n" not in str(exc.value)


def test_the_runner_takes_fuse_reduce_as_a_workload_option():
    from validation.megakernel.quick import case_schedule, workload_option

    wl = {k: workload_option(k, "1") for k in ("fuse_norm", "fuse_rope", "fuse_silu", "fuse_reduce")}
    assert wl["fuse_reduce"] is True
    s = case_schedule("llama-3.2-1b", 1, 1024, "h200-calibrated", "megakernel", wl, {})
    assert s.workload.fuse_reduce and s.workload_spec["fuse_reduce"] is True
    plan = P.plan(s)
    o = plan.ops[s.workload.index["L0.o_proj"]]
    assert o["opt"] & P.OPT_REDUCE and o["in0"] == "out:L0.attn_partial" and o["splits"] == 5
    assert plan.smem_B <= P.SMEM_MAX_B


# -- the torch reference --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, ALL, {"split_qkv": True, "split_gate_up": True}])
def test_the_fused_step_is_the_unfused_step(kw):
    """Same inputs: the fused o_proj is the unfused attn_reduce -> o_proj chain, bit for bit, and so
    is everything after it."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plain, fused = _plan(**kw), _plan(fuse_reduce=True, **kw)
    bufs = cpu_buffers(plain, torch)
    a, b = reference.run(plain, bufs), reference.run(fused, bufs)
    assert set(b) == set(a) - {"out:L0.attn_reduce", "out:L1.attn_reduce"}
    assert all(torch.equal(b[n], a[n]) for n in b)
    local = reference.run(fused, {**bufs, **b}, local=True)
    assert all(reference.rel_err(local[n], b[n]) == 0.0 for n in fused.outputs)


# -- the device functions, replayed ----------------------------------------------------------------------
def _f32(x) -> np.float32:
    return np.float32(x)


def _fma(a, b, c) -> np.float32:
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))  # one rounding (products of fp32 are exact)


def _warp_sum(v: list[np.float32]) -> np.float32:
    """mk_warp_sum's butterfly (xor 16, 8, 4, 2, 1); every lane ends with lane 0's value."""
    v = list(v)
    for o in (16, 8, 4, 2, 1):
        v = [_f32(v[i] + v[i ^ o]) for i in range(32)]
    return v[0]


def _reduce_pair(parts: np.ndarray, base: int, stride: int, GD: int, G: int, h: int, ks: list[int], C: int):
    """mk_reduce_pair for the 32 lanes of a warp (lane l: elements ks[l], ks[l] + 1 of head h), on the
    flat fp32 partials; the bf16 bits of each lane's pair."""
    CB, ninf = 16, np.float32(-np.inf)
    M, L = ninf, _f32(0)
    O = [[_f32(0), _f32(0)] for _ in range(32)]
    for c0 in range(0, C, CB):
        mc = [parts[base + (c0 + ln) * stride + GD + h] if ln < CB and c0 + ln < C else ninf for ln in range(32)]
        lc = [parts[base + (c0 + ln) * stride + GD + G + h] if ln < CB and c0 + ln < C else _f32(0) for ln in range(32)]
        mn = max(M, max(mc))
        corr = _f32(0) if M == ninf else np.exp(_f32(M - mn), dtype=np.float32)
        w = [_f32(0) if m == ninf else np.exp(_f32(m - mn), dtype=np.float32) for m in mc]
        L = _fma(L, corr, _warp_sum([_f32(lc[ln] * w[ln]) for ln in range(32)]))
        for ln in range(32):
            O[ln] = [_f32(O[ln][0] * corr), _f32(O[ln][1] * corr)]
            for j in range(CB):
                ov = parts[base + (c0 + j) * stride + ks[ln]:][:2] if c0 + j < C else np.zeros(2, np.float32)
                O[ln] = [_fma(ov[0], w[j], O[ln][0]), _fma(ov[1], w[j], O[ln][1])]
        M = mn
    return [P.bf16_bits(np.array([O[ln][0] / L, O[ln][1] / L], dtype=np.float32)) for ln in range(32)]


def _merge_rows(row: dict, parts: np.ndarray, T: int, mma: bool) -> np.ndarray:
    """mk_merge_rows, line by line (a warp's 32 items at a time): the bf16 bits of xs (T x K),
    every element stored once."""
    Dh, Gq, C, K = row["hd"], row["hq"] // row["hkv"], row["splits"], row["K"]
    per = K >> 1
    xs = np.full(T * K, -1, dtype=np.int64)
    assert per % 32 == 0
    for w0 in range(0, T * per, 32):  # a warp's 32 items: one row (per is a multiple of 32)
        b = w0 // per
        ks = [2 * (w0 + ln - b * per) for ln in range(32)]
        q = [k // Dh for k in ks]
        assert len(set(q)) == 1, "a warp's 64 elements lie in one head"
        g = q[0] // Gq
        gk = [k - g * Gq * Dh for k in ks]
        pairs = _reduce_pair(parts, (g * T + b) * C * row["ld0"], row["ld0"], Gq * Dh, Gq, q[0] - g * Gq, gk, C)
        for ln, k in enumerate(ks):
            c = k >> 3
            at = (((c >> 2) * T + b) * 4 + (c & 3)) * 8 + (k & 7) if mma else b * K + k
            assert (xs[at:at + 2] == -1).all()
            xs[at:at + 2] = pairs[ln]
    return xs


def _unpermute(xs: np.ndarray, T: int, K: int) -> np.ndarray:
    """The [T, K] rows of an input region in the weights' k order (mk_load_x_mma2's layout)."""
    x = np.empty((T, K), dtype=xs.dtype)
    for b in range(T):
        for c in range(K // 8):
            w = ((c // 4) * T + b) * 4 + c % 4
            x[b, 8 * c:8 * c + 8] = xs[8 * w:8 * w + 8]
    return x


@pytest.mark.parametrize("batch,splits", [(1, 3), (2, 5), (4, 20)])  # 20 splits: two groups of 16, merged online
@pytest.mark.parametrize("mma", [True, False])
def test_the_kernels_merge_is_the_reduction_the_reference_computes(batch, splits, mma):
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _plan(batch=batch, splits=splits, fuse_reduce=True)
    wl = plan.schedule.workload
    bufs = cpu_buffers(plan, torch)
    ref = reference.run(plan, bufs)
    i = wl.index["L0.o_proj"]
    row = plan.ops[i]
    parts = ref[row["in0"]].numpy().reshape(-1)
    xs = _merge_rows(row, parts, batch, mma)
    assert (xs >= 0).all()  # every element of every row written
    bits = (_unpermute(xs, batch, Q) if mma else xs.reshape(batch, Q)).astype(np.uint16)
    got = (bits.astype(np.uint32) << 16).view(np.float32)
    want = reference.REFERENCES["attn_reduce"](reference.Step(bufs=bufs, cfg=TINY, T=batch, pos=70, cos=None,
                                                              sin=None), wl.ops[i], row, [ref[row["in0"]]])
    want = want.float().numpy()
    assert np.abs(got - want).max() <= 2 ** -7 * np.abs(want).max()  # an ulp of bf16 at most (exp, sum order)
    assert (got == want).mean() > 0.9
