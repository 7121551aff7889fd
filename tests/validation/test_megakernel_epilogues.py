"""Fused matmul epilogues of the generated kernel (``fuse_rope``, ``fuse_silu``), checked without a GPU:
the stored row order, the op table, the task rows, the torch reference, and a line-by-line replay of
the device functions (mk_epilogue_rows, mk_epilogue_pair in validation/kernels/mk_ops.cuh)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from mksim.models import ModelConfig
from mksim.workload import Tiling
from mksim.workload._llm import build_llm_workload
from validation.megakernel import program as P
from validation.megakernel.encode import OPCODES

from .mkkit import cpu_buffers

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelConfig(name="tiny", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=8, num_kv_heads=2,
                   head_dim=64, vocab_size=1000, rope_theta=10000.0, max_position_embeddings=4096)
FUSED = {"fuse_rope": True, "fuse_silu": True}


def _plan(tiles: int | None = None, mode: str = "megakernel", batch: int = 2, **kw):
    wl = build_llm_workload(TINY, batch=batch, kv_len=70, n_sms=8, kv_splits=3, **kw)
    tiling = Tiling(default=tiles, per_kind={"attn_partial": 0, "attn_reduce": 0}) if tiles else None
    return P.plan(mksim.build_schedule(wl, "h200-datasheet", mode, blocks_per_sm=1, tiling=tiling))




# -- the stored row order ---------------------------------------------------------------------------
@pytest.mark.parametrize("hd", [16, 64, 128])
def test_rope_pairs_are_adjacent_rows_of_a_16_row_group_within_each_head(hd):
    n, rotated = 5 * hd + 32, 4 * hd
    rows = P.rope_pair_rows(n, rotated, hd)
    assert sorted(rows.tolist()) == list(range(n))  # a permutation
    for p in range(0, rotated, 2):
        a, b = rows[p], rows[p + 1]
        assert a // hd == b // hd == p // hd  # one head, its own rows
        assert b - a == hd // 2 and a % hd < hd // 2  # the rotate-half pair (d, d + hd / 2)
    assert rows[rotated:].tolist() == list(range(rotated, n))  # v rows unchanged
    with pytest.raises(ValueError, match="multiple of 16"):
        P.rope_pair_rows(72, 48, 24)


def test_silu_pairs_interleave_gate_and_up():
    rows = P.silu_pair_rows(24)
    assert rows[0::2].tolist() == list(range(24)) and rows[1::2].tolist() == list(range(24, 48))


def test_pack_and_unpack_round_trip_in_numpy_and_torch():
    torch = pytest.importorskip("torch")
    ops = {op.name: op for op in build_llm_workload(TINY, batch=1, kv_len=70, **FUSED).ops}
    for name, n in (("L0.qkv_proj", 768), ("L0.gate_up_proj", 1024), ("L0.o_proj", 256)):
        op = ops[name]
        w = np.random.default_rng(0).standard_normal((n, op.attrs["k"])).astype(np.float32)
        p = P.pack_weight(w, op, TINY)
        assert np.array_equal(P.unpack_weight(p, op, TINY), w)
        assert np.array_equal(P.pack_weight(torch.from_numpy(w), op, TINY).numpy(), p)
        assert np.array_equal(P.unpack_weight(torch.from_numpy(p), op, TINY).numpy(), w)
        rows = P.epilogue_rows(op, TINY)
        # what the kernel multiplies by (mma_unpack of the stored array) is the weight in stored row order
        assert np.array_equal(P.mma_unpack(p), w if rows is None else w[rows])


# -- what the plan gives the kernel ------------------------------------------------------------------
def test_the_fused_rows_of_the_op_table_and_the_task_rows():
    plan = _plan(**FUSED)
    wl, g = plan.schedule.workload, plan.schedule.graph
    kinds = {r["kind"] for r in plan.ops}
    assert OPCODES["rope_kv"] not in kinds and OPCODES["silu_mul"] not in kinds
    qkv, gu = wl.index["L0.qkv_proj"], wl.index["L0.gate_up_proj"]
    r = plan.ops[qkv]
    assert r["opt"] == P.OPT_MMA | P.OPT_ROPE and r["rope"] == "rope" and (r["kc"], r["vc"]) == ("kc:0", "vc:0")
    assert (r["hq"], r["hkv"], r["hd"], r["pos"], r["s_max"], r["N"], r["ld_out"]) == (8, 2, 64, 70, 71, 768, 768)
    assert plan.buffers["w:L0.qkv_proj"].shape == (768, 256) and plan.buffers["out:L0.qkv_proj"].shape == (2, 768)
    r = plan.ops[gu]
    assert r["opt"] == P.OPT_MMA | P.OPT_SILU and r["kc"] is None and (r["N"], r["ld_out"]) == (512, 512)
    assert plan.buffers["w:L0.gate_up_proj"].shape == (1024, 256)
    assert plan.buffers["out:L0.gate_up_proj"].shape == (2, 512)
    ai = wl.index["L0.attn_partial"]
    assert plan.ops[ai]["in0"] == "out:L0.qkv_proj" and plan.ops[ai]["ld0"] == 768
    assert plan.ops[wl.index["L0.down_proj"]]["in0"] == "out:L0.gate_up_proj"
    # a matmul task row streams weight rows: two per output element of the fused SiLU·mul
    tasks = plan.program.tasks
    for op, f in ((qkv, 1), (gu, 2)):
        sel = tasks[tasks[:, 1] == op]
        b = g.bounds[op]
        assert sorted(zip(sel[:, 3].tolist(), sel[:, 4].tolist(), strict=True)) == \
            [(f * int(b[t]), f * int(b[t + 1])) for t in range(len(b) - 1)]


def test_the_option_bits_match_the_cuda_defines():
    src = (ROOT / "validation/kernels/mk_ops.cuh").read_text()
    for name in ("ROPE", "SILU"):
        assert int(re.search(rf"#define MK_OPT_{name} (\d+)", src).group(1)) == getattr(P, f"OPT_{name}")
    assert re.search(r"#define MK_OPT_PAIRS \(MK_OPT_ROPE \| MK_OPT_SILU\)", src)
    assert "mk_epilogue_rows(" in (ROOT / "validation/megakernel/mk_kernel.cu").read_text()


def test_an_epilogue_off_the_tensor_cores_is_refused_in_one_line():
    wl = build_llm_workload(TINY, batch=1, kv_len=70, n_sms=8, fuse_silu=True)
    s = mksim.build_schedule(wl, "h200-datasheet", "megakernel", blocks_per_sm=1, page_KiB=2.5)
    with pytest.raises(ScheduleError, match="fused silu_mul epilogue runs on the tensor-core matmul only") as exc:
        P.plan(s)
    assert "\n" not in str(exc.value)


def test_the_runner_takes_the_fusions_as_workload_options():
    from validation.megakernel.quick import workload_option

    assert workload_option("fuse_rope", "1") is True and workload_option("fuse_silu", "0") is False


# -- the torch reference --------------------------------------------------------------------------------
def test_the_fused_step_is_the_unfused_step_with_its_weight_rows_reordered():
    """Same inputs, weights stored in epilogue order: every later output is bit for bit the same."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plain, fused = _plan(), _plan(**FUSED)
    bufs = cpu_buffers(plain, torch)
    fb = dict(bufs)
    for op in fused.schedule.workload.ops:
        rows = P.epilogue_rows(op, TINY)
        if rows is not None:
            fb[f"w:{op.name}"] = bufs[f"w:{op.name}"][torch.as_tensor(rows)]
    a, b = reference.run(plain, bufs), reference.run(fused, fb)
    for layer in range(2):
        assert torch.equal(b[f"out:L{layer}.qkv_proj"], a[f"out:L{layer}.rope_kv"])
        assert torch.equal(b[f"out:L{layer}.gate_up_proj"], a[f"out:L{layer}.silu_mul"])
    assert torch.equal(b["out:lm_head"], a["out:lm_head"])
    local = reference.run(fused, {**fb, **b}, local=True)
    assert all(reference.rel_err(local[n], b[n]) == 0.0 for n in fused.outputs)


# -- the device functions, replayed ----------------------------------------------------------------------
def _bf16(x) -> np.float32:
    """A float32 value rounded to bf16 as mk_f32_to_bf16 does, widened back."""
    return (P.bf16_bits(np.array([x], dtype=np.float32)).astype(np.uint32) << 16).view(np.float32)[0]


class Replay:
    """mk_epilogue_rows and mk_epilogue_pair of mk_ops.cuh, line by line, on flat numpy buffers;
    every store recorded as (buffer, element)."""

    def __init__(self, row: dict, T: int, rope: np.ndarray, cache_size: int):
        self.o, self.rope = row, rope
        self.out = np.full(T * row["ld_out"], np.nan, dtype=np.float32)
        self.kc = np.full(cache_size, np.nan, dtype=np.float32)
        self.vc = np.full(cache_size, np.nan, dtype=np.float32)
        self.stores: list[tuple[str, int]] = []

    def store(self, buf: str, i: int, v) -> None:
        getattr(self, buf)[i] = v
        self.stores.append((self.o["out"] if buf == "out" else self.o[buf], i))

    def rows(self, T: int, lo: int, r0: int, r1: int, acc: np.ndarray) -> None:  # mk_epilogue_rows
        h = (r1 - r0) >> 1
        for i in range(T * h):
            b, rr = i // h, r0 + 2 * (i - (i // h) * h)
            self.pair(b, lo + rr, acc[b, lo + rr], acc[b, lo + rr + 1])

    def pair(self, b: int, p: int, acc0, acc1) -> None:  # mk_epilogue_pair
        o = self.o
        x0, x1 = _bf16(acc0), _bf16(acc1)
        out = b * o["ld_out"]
        if o["opt"] & P.OPT_SILU:
            self.store("out", out + (p >> 1), _bf16(x0 / (np.float32(1) + np.exp(-x0)) * x1))
            return
        D = o["hd"]
        half, Q, KV = D >> 1, o["hq"] * D, o["hkv"] * D
        e0, step, y0, y1 = p, 1, x0, x1
        if p < Q + KV:
            w = p % D
            d = ((w >> 4) << 3) + ((w & 15) >> 1)
            c, s = self.rope[d], self.rope[half + d]
            e0, step = p - w + d, half
            y0, y1 = x0 * c - x1 * s, x1 * c + x0 * s
        r0, r1 = _bf16(y0), _bf16(y1)
        self.store("out", out + e0, r0)
        self.store("out", out + e0 + step, r1)
        if e0 >= Q:
            is_k = e0 < Q + KV
            kv = e0 - (Q if is_k else Q + KV)
            h = kv // D
            d0 = kv - h * D
            slot = ((b * o["hkv"] + h) * o["s_max"] + o["pos"]) * D
            self.store("kc" if is_k else "vc", slot + d0, r0)
            self.store("kc" if is_k else "vc", slot + d0 + step, r1)


@pytest.mark.parametrize("tiles", [None, 5])  # 16-row tiles (4 to a head), or tiles of 9 to 10 row groups
@pytest.mark.parametrize("batch", [1, 2])
def test_the_kernel_epilogue_computes_the_reference_and_writes_what_the_sentinels_poll(tiles, batch):
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _plan(tiles, batch=batch, **FUSED)
    wl, g = plan.schedule.workload, plan.schedule.graph
    bufs = cpu_buffers(plan, torch)
    ref = reference.run(plan, bufs)
    rope = bufs["rope"].numpy()
    for name in ("L0.qkv_proj", "L1.gate_up_proj"):
        i = wl.index[name]
        op, row = wl.ops[i], plan.ops[i]
        x = reference._norm(ref[row["in0"]], bufs[row["w2"]], row["eps"]) if row["w2"] else ref[row["in0"]]
        acc = (x.float() @ bufs[row["W"]].float().t()).numpy()  # the sums, weight rows in stored order
        cache = batch * TINY.num_kv_heads * 71 * TINY.head_dim
        rp = Replay(row, batch, rope, cache)
        tasks = plan.program.tasks[plan.program.tasks[:, 1] == i]
        for t in range(g.n_tiles[i]):
            lo, hi = (int(v) for v in tasks[tasks[:, 2] == t][0, 3:5])
            first = len(rp.stores)
            rp.rows(batch, lo, 0, hi - lo, acc)
            got = {(buf, k * 2) for buf, k in rp.stores[first:]}
            want = {(buf, a + j) for buf, a, z, _ in P.written_bytes(op, row, int(g.bounds[i][t]),
                                                                     int(g.bounds[i][t + 1]), batch)
                    for j in range(0, z - a, 2)}
            assert got == want, (name, t)  # the tile's stores are what a sentinel consumer polls
        assert len(rp.stores) == len(set(rp.stores))  # each element once
        want = ref[f"out:{name}"].float().numpy().reshape(-1)
        assert not np.isnan(rp.out).any()
        assert np.abs(rp.out - want).max() <= 2 ** -7 * np.abs(want).max()  # an ulp of bf16 at most
        if op.attrs["epilogue"] == "rope_kv":  # the new token's k and v, appended at position pos
            Q, KV = 8 * 64, 2 * 64
            for buf, part in (("kc", slice(Q, Q + KV)), ("vc", slice(Q + KV, Q + 2 * KV))):
                slot = getattr(rp, buf).reshape(batch, 2, 71, 64)[:, :, 70]
                assert np.array_equal(slot, ref[f"out:{name}"].float().numpy()[:, part].reshape(batch, 2, 64))
                assert np.isnan(getattr(rp, buf).reshape(batch, 2, 71, 64)[:, :, :70]).all()
