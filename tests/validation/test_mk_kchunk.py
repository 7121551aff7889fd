"""Matmul input rows chunked along k (MK_OPT_KCHUNK, ``mk_matmul_kc``): the chunk sizes, the weights'
per-task chunk order, a replay of the kernel's walk against the unchunked one, the plans of the 7-8 B
models at batch 8, and the one-line refusals. No GPU."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import mksim
from mksim.errors import MksimError, ScheduleError
from validation import suite as vs
from validation.megakernel import gpu as G
from validation.megakernel import program as P
from validation.megakernel.attn_suite import model_config

from .test_megakernel_program import _mm2_replay

ROOT = Path(__file__).resolve().parents[2]


def test_chunks_only_rows_too_long_to_hold_whole():
    assert P.k_chunk(1, 14336) == P.k_chunk(4, 14336) == P.k_chunk(8, 11008) == 0  # as before: whole rows
    for T, K in [(8, 14336), (8, 12288), (8, 18944), (16, 14336), (16, 4096 * 3)]:
        kc = P.k_chunk(T, K)
        assert T * K * 2 > P.X_WHOLE_MAX_B and K % kc == 0 and kc % 32 == 0 and 2 * T * kc * 2 <= P.KCHUNK_X_B
        # the fewest chunks that do: none fewer gives whole blocks whose two buffers fit
        assert not any(K % n == 0 and (K // n) % 32 == 0 and 4 * T * (K // n) <= P.KCHUNK_X_B
                       for n in range(2, K // kc))
    assert P.k_chunk(8, 32 * 1031) == 32  # 1031 is prime: one block a chunk (kc_problem refuses its pages)


@pytest.mark.parametrize("tiles,K,kc", [((0, 32, 48, 96), 256, 64), ((0, 16), 2048, 1024), ((0, 64, 128), 384, 128)])
def test_kc_pack_keeps_each_task_contiguous_in_chunk_order(tiles, K, kc):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((tiles[-1], K)).astype(np.float32)
    p = P.kc_pack(w, tiles, kc)
    assert np.array_equal(P.kc_unpack(p, tiles, kc), w)
    assert np.array_equal(P.kc_pack(torch.from_numpy(w), tiles, kc).numpy(), p)
    assert np.array_equal(P.kc_unpack(torch.from_numpy(p), tiles, kc).numpy(), w)
    assert np.array_equal(P.unpack_buffer(p, P.Buffer(w.shape, "bf16", "normal", 1.0, "mma-kc", kc, tiles)), w)
    flat = p.reshape(-1)
    for a, z in zip(tiles[:-1], tiles[1:], strict=True):  # task [a, z): bytes [a K, z K), chunk by chunk
        task = flat[a * K:z * K]
        for c in range(K // kc):
            piece = task[c * (z - a) * kc:(c + 1) * (z - a) * kc].reshape(z - a, kc)
            assert np.array_equal(P.mma_unpack(piece), w[a:z, c * kc:(c + 1) * kc])
    assert np.array_equal(P.kc_pack(w, (0, tiles[-1]), K), P.mma_pack(w))  # one chunk: the plain order


def _kc_replay(K: int, kc: int, rows: int, page_B: int, T: int, C: int = 8) -> np.ndarray:
    """mk_matmul_kc replayed on one task: its pages; the staging (which chunk each buffer holds,
    the copies issued, what cp.async.wait_group 0 / 1 leaves in flight); each warp's run of a page
    and the block -> (chunk, group, block of the chunk) arithmetic, every block read from the
    kc_pack'd weight and from the buffer of its chunk, which must hold that chunk, landed; the
    deposits added into each warp's entry; one flush at the end."""
    rng = np.random.default_rng(K + rows + page_B + T)  # _mm2_replay's w and x
    w, x = rng.standard_normal((rows, K)), rng.standard_normal((T, K))
    blocks = P.kc_pack(w, (0, rows), kc).reshape(-1, 512)  # the task's 1 KiB blocks, in stream order
    KBc, ng, nb, nch = kc // 32, rows // 16, page_B // 1024, K // kc
    cb, S = ng * KBc, 16
    NB = nch * cb
    assert KBc >= nb and ng <= S, "mk_matmul_kc refuses this (MK_ERR_KCHUNK)"
    buf = [-1, -1]               # the chunk each buffer holds
    inflight: list[int] = []     # chunks whose copies are issued and not yet waited for, in order
    landed = [False, False]
    slots = np.zeros((S, C, 16, T))
    d = np.zeros((C, 16, T))

    def stage(c: int) -> None:
        buf[c & 1], landed[c & 1] = c, False
        inflight.append(c)

    def wait(keep: int) -> None:
        while len(inflight) > keep:
            landed[inflight.pop(0) & 1] = True

    stage(0)
    issued, ready = 0, -1
    for q0 in range(0, NB, nb):
        n = min(nb, NB - q0)
        cf, cl = q0 // cb, (q0 + n - 1) // cb
        assert cl <= cf + 1  # a page spans at most two chunks
        if issued <= cf and cf + 1 < nch:  # (after a barrier: every warp is past the pages before)
            assert buf[(cf + 1) & 1] in (-1, cf - 1)  # the buffer's old chunk is no page's from here on
            stage(cf + 1)
            issued = cf + 1
        if cl > ready:
            wait(1 if issued > cl else 0)
            ready = cl
        for wp in range(C):
            a, z = wp * n // C, (wp + 1) * n // C
            if a >= z:
                continue
            c, kb = divmod(q0 + a, cb)
            rg, kb = divmod(kb, KBc)
            for q in range(q0 + a, q0 + z):
                assert buf[c & 1] == c and landed[c & 1], "a block read a chunk not in its buffer"
                blk = P.mma_unpack(blocks[q].reshape(16, 32))  # rows of group rg, inputs of block kb of chunk c
                ks = slice(c * kc + 32 * kb, c * kc + 32 * kb + 32)
                assert np.array_equal(blk, w[16 * rg:16 * rg + 16, ks])
                d[wp] += blk @ x[:, ks].T
                kb += 1
                if kb == KBc:
                    slots[rg, wp] += d[wp]
                    d[wp] = 0.0
                    kb, rg = 0, rg + 1
                    if rg == ng:
                        rg, c = 0, c + 1
            if kb:
                slots[rg, wp] += d[wp]
                d[wp] = 0.0
    assert not inflight and not d.any()
    out = slots[:ng].sum(axis=1).transpose(2, 0, 1).reshape(T, rows)  # the flush: each group's warps summed
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-9, atol=1e-9)
    return out


@pytest.mark.parametrize("K,kc,rows,page_KiB", [(14336, 2048, 32, 32), (14336, 2048, 16, 32), (18944, 1184, 32, 32),
                                                (4096, 1024, 48, 32), (2048, 512, 64, 16), (1536, 512, 16, 5),
                                                (3072, 1024, 256, 32)])
@pytest.mark.parametrize("T", [1, 2, 8])
def test_the_chunked_walk_computes_what_the_unchunked_one_does(K, kc, rows, page_KiB, T):
    page_B = page_KiB * 1024
    chunked = _kc_replay(K, kc, rows, page_B, T)
    whole = _mm2_replay(K, rows, page_B, T, 16)
    np.testing.assert_allclose(chunked, whole, rtol=1e-9, atol=1e-9)


# the built-in 7-8 B models, and Mistral-NeMo-12B's shapes (hidden 5120, heads of 128, FFN 14336)
NEMO = {"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336, "num_hidden_layers": 40,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 131072,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-05, "max_position_embeddings": 131072}


def _schedule(model, batch: int, mode: str, layers: int | None = 2, **opts):
    """A step of ``model`` on h200-mk-kernels with the kernel's options, of its first ``layers`` layers (None:
    all): what a plan chunks, and the shared memory it takes, is the same in every layer."""
    cfg = mksim.models.config_from_hf(NEMO, name="mistral-nemo-12b") if model == "mistral-nemo-12b" \
        else model_config(model)
    if layers is not None:
        cfg = dataclasses.replace(cfg, num_layers=min(layers, cfg.num_layers))
    kopts = P.kernel_options(cfg, batch, 1024, "h200-mk-kernels", mode=mode)
    wl = mksim.models.workload(cfg, batch=batch, kv_len=1024, n_sms=132)
    return mksim.build_schedule(wl, "h200-mk-kernels", mode, **(kopts | opts))


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b", "qwen2.5-7b", "mistral-7b", "mistral-nemo-12b"])
@pytest.mark.parametrize("mode", ["megakernel", "graph_pdl"])
def test_the_8b_models_fit_at_batch_8_with_their_ffn_inputs_chunked(model, mode):
    s = _schedule(model, 8, mode)
    plan = P.plan(s)
    cfg = s.workload.model
    assert plan.smem_B <= P.SMEM_MAX_B and plan.depth >= (2 if mode == "graph_pdl" else 4) - (model == "qwen2.5-7b")
    kc_ops = [(op, r) for op, r in zip(s.workload.ops, plan.ops, strict=True) if r["opt"] & P.OPT_KCHUNK]
    assert {op.name.split(".")[1] for op, _ in kc_ops} == {"down_proj"}  # the FFN's long inputs only
    for op, r in kc_ops:
        assert r["off2"] == P.k_chunk(8, cfg.intermediate_size) and r["opt"] & P.OPT_MMA
        w = plan.buffers[r["W"]]
        assert w.layout == "mma-kc" and w.kc == r["off2"] and w.tiles[-1] == op.out_size
        ng = max(np.diff(w.tiles)) // 16
        assert ng <= P.kc_slots(w.kc, plan.x_B, plan.acc_rows, 8) and w.kc * 32 >= plan.page_B
    # the x region holds attention's scratch or whole rows of 4096-5120, not a down_proj's 14336 inputs
    assert plan.x_B < 8 * cfg.intermediate_size * 2 / 2


@pytest.mark.parametrize("model,batch", [("llama-3.1-8b", 4), ("qwen2.5-7b", 4), ("llama-3.1-8b", 1)])
def test_cases_that_fit_before_keep_their_plans(model, batch):
    """Under X_WHOLE_MAX_B nothing is chunked: the x region is the whole rows', as before."""
    s = _schedule(model, batch, "megakernel")
    plan = P.plan(s)
    assert not any(r["opt"] & P.OPT_KCHUNK for r in plan.ops)
    assert all(b.layout != "mma-kc" for b in plan.buffers.values())
    whole = max(batch * op.attrs["k"] * 2 for op in s.workload.ops if op.kind == "matmul")
    assert plan.x_B >= whole


def test_the_suite_no_longer_refuses_llama_8b_at_batch_8():
    for mode in ("megakernel", "graph_pdl"):
        P.plan(vs.build(vs.Case("llama-3.1-8b", 8, mode, kv_len=1024), "h200-mk-kernels"))


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_chunked_rows_with_pages_larger_than_a_chunk_are_refused_in_one_line():
    with pytest.raises(ScheduleError) as e:  # qwen2.5-7b b8: chunks of 1184 inputs, 37 KiB of a row group
        P.plan(_schedule("qwen2.5-7b", 8, "megakernel", page_KiB=64, prefetch_depth=1))
    assert "use page_KiB <= 37" in _one_line(e)


def test_chunked_rows_under_a_fused_norm_are_refused_in_one_line():
    big = dict(NEMO, hidden_size=12288, intermediate_size=8192, num_hidden_layers=2)  # qkv: 8 rows of 12288
    cfg = mksim.models.config_from_hf(big, name="wide")
    wl = mksim.models.workload(cfg, batch=8, kv_len=1024, n_sms=132, fuse_norm=True)
    s = mksim.build_schedule(wl, "h200-mk-kernels", "megakernel", blocks_per_sm=1, prefetch_depth=2)
    with pytest.raises(ScheduleError) as e:
        P.plan(s)
    assert "fused norm over chunked input rows has no device code" in _one_line(e)


def test_a_task_with_more_row_groups_than_slots_is_refused_in_one_line():
    wl = mksim.models.workload("llama-3.1-8b", batch=8, kv_len=1024, n_sms=132)
    s = mksim.build_schedule(wl, "h200-mk-kernels", "megakernel", blocks_per_sm=1, prefetch_depth=4,
                             smem_reserve_KiB=92)
    down = wl.index["L0.down_proj"]
    bounds = [np.array([0, 4096])] * len(wl.ops)
    with pytest.raises(ScheduleError) as e:
        P.check_kc_slots(wl.ops[down], 2048, bounds[down], P.x_region_bytes(s), 256, 8)
    assert "needs a slot each" in _one_line(e)


def test_batch_16_is_refused_in_one_line_before_any_build():
    with pytest.raises(MksimError) as e:
        P.check_supported(mksim.build_schedule(mksim.models.workload("llama-3.2-1b", batch=16), "h200-mk-kernels",
                                               "megakernel", blocks_per_sm=1))
    assert "not 16" in _one_line(e)


def test_the_kchunk_bit_and_error_match_the_cuda_sources():
    ops = (ROOT / "validation/kernels/mk_ops.cuh").read_text()
    mk = (ROOT / "validation/megakernel/mk_kernel.cu").read_text()
    assert int(re.search(r"#define MK_OPT_KCHUNK (\d+)", ops).group(1)) == P.OPT_KCHUNK
    code = int(re.search(r"#define MK_ERR_KCHUNK (\d+)", mk).group(1))
    assert "k-chunked" in G.ERRORS[code]
    # Kc travels in the op row's off2 field, which the matmul reads as o.off2
    assert "const int Kc = o.off2" in mk
