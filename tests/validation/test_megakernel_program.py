"""What a schedule becomes on the GPU (op table, buffers, launch shape) and the torch reference
of the decode step, checked without a GPU."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import mksim
from mksim.errors import ScheduleError
from mksim.models import ModelConfig
from mksim.workload._llm import build_llm_workload
from validation.megakernel import program as P

from .mkkit import cpu_buffers

ROOT = Path(__file__).resolve().parents[2]


def _struct_fields(path: Path, name: str) -> list[str]:
    """Member names of ``struct name { ... };`` in a CUDA source, in order."""
    body = re.search(rf"struct {name} \{{(.*?)\n\}};", path.read_text(), re.S).group(1)
    names = []
    for line in body.splitlines():
        decl = line.split("//")[0].strip()
        if not decl:
            continue
        names += [re.findall(r"\w+", part)[-1] for part in decl.rstrip(";").split(",")]
    return names


def test_op_table_matches_the_cuda_struct():
    assert _struct_fields(ROOT / "validation/kernels/mk_ops.cuh", "MkOp") == list(P.OP_FIELDS.names)


def test_params_match_the_cuda_struct():
    assert _struct_fields(ROOT / "validation/megakernel/mk_kernel.cu", "MkParams") == list(P.PARAM_FIELDS.names)


@pytest.mark.parametrize("model,batch", [("llama-3.2-1b", 1), ("llama-3.2-1b", 4), ("llama-3.1-8b", 4)])
@pytest.mark.parametrize("mode", ["megakernel", "persistent_barrier", "graph_pdl", "graph", "stream"])
def test_plans_fit_in_shared_memory(model, batch, mode):
    cfg = dataclasses.replace(mksim.models.get(model), num_layers=2)  # a plan's every layer is alike: two show it
    s = mksim.build_schedule(mksim.models.workload(cfg, batch=batch), "h200-calibrated", mode,
                             **P.kernel_options(model, batch, mode=mode))
    plan = P.plan(s)
    assert plan.smem_B <= P.SMEM_MAX_B
    assert plan.ahead == (s.options.prefetch_depth > 0)
    assert len(plan.ops) == len(s.workload.ops) == len(plan.outputs)
    if s.queues is None:  # chains: one block per task, task rows in id order
        assert plan.program.task_id.tolist() == list(range(len(s.graph)))
    else:
        assert plan.program.task_id.tolist() == [t for q in s.queues for t in q]
    # every pointer of the op table names a buffer of the plan
    for row in plan.ops:
        assert all(row[f] is None or row[f] in plan.buffers for f in P.OP_PTR_FIELDS)
    # the weights the model streams: all but the embedding table, of which a step reads T rows
    weights = sum(b.nbytes for n, b in plan.buffers.items() if n.startswith(("w:", "w2:")) and n != "w:embed")
    assert weights + batch * s.workload.model.hidden_size * 2 == pytest.approx(s.workload.weight_bytes, rel=1e-9)


def test_op_table_packs_addresses():
    s = mksim.build_schedule("llama-3.2-1b", "h200-calibrated", "megakernel", blocks_per_sm=1)
    plan = P.plan(s)
    addr = {name: 4096 * (i + 1) for i, name in enumerate(plan.buffers)}
    t = P.op_table(plan, addr)
    assert t.dtype.itemsize == 192 and len(t) == len(plan.ops)
    qkv = s.workload.index["L0.qkv_proj"]
    assert t[qkv]["W"] == addr["w:L0.qkv_proj"] and t[qkv]["in0"] == addr["out:L0.attn_norm"]
    assert t[qkv]["K"] == 2048 and t[qkv]["N"] == 3072 and t[qkv]["in1"] == 0


@pytest.mark.parametrize("model,batch,opts,msg", [
    ("llama-3.2-1b", 3, {}, "handles batch"),
    ("llama-3.2-1b", 1, {"blocks_per_sm": 2}, "one block per SM"),
    # within the simulator's budget (17 KiB reserved), not beside the kernel's 8B batch-4 input rows
    ("llama-3.1-8b", 4, {"prefetch_depth": 6}, "use prefetch_depth <= 3"),
])
def test_unsupported_schedules_fail_in_one_line(model, batch, opts, msg):
    opts = {"blocks_per_sm": 1, "smem_reserve_KiB": 17} | opts
    s = mksim.build_schedule(mksim.models.workload(model, batch=batch), "h200-calibrated", "megakernel", **opts)
    with pytest.raises(ScheduleError, match=msg) as exc:
        P.plan(s)
    assert "\n" not in str(exc.value)


def test_models_without_device_functions_are_refused():
    # open_llama_3b's shape: 32 heads of 100 (3200 / 32), no tensor-core k-step fits
    cfg = ModelConfig(name="head100", hidden_size=3200, intermediate_size=8640, num_layers=2, num_heads=32,
                      num_kv_heads=32, head_dim=100, vocab_size=32000)
    s = mksim.build_schedule(build_llm_workload(cfg, batch=1), "h200-calibrated", "graph", blocks_per_sm=1)
    with pytest.raises(ScheduleError, match="head100: no attention device function: head size 100 is not a multiple"):
        P.plan(s)


def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 7
    ours = P.bf16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert (ours == theirs).all()


# -- the torch reference, on a tiny model -----------------------------------------------------
TINY = ModelConfig(name="tiny", hidden_size=256, intermediate_size=512, num_layers=2, num_heads=8, num_kv_heads=2,
                   head_dim=64, vocab_size=1000, rope_theta=10000.0, max_position_embeddings=4096)


def _tiny(mode="megakernel", batch=2, **kw):
    wl = build_llm_workload(TINY, batch=batch, kv_len=70, n_sms=8, kv_splits=3, **kw)
    return P.plan(mksim.build_schedule(wl, "h200-datasheet", mode, blocks_per_sm=1))




def test_reference_attention_is_softmax_attention():
    """The partials over three KV splits, merged by the reduction, equal plain softmax attention."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny()
    bufs = cpu_buffers(plan, torch)
    ref = reference.run(plan, bufs)
    T, hd, nq, nkv, pos = 2, 64, 8, 2, 70
    rope = ref["out:L0.rope_kv"].float()
    q = rope[:, :nq * hd].reshape(T, nq, hd)
    k = torch.cat([bufs["kc:0"][:, :, :pos].float(), rope[:, nq * hd:(nq + nkv) * hd].reshape(T, nkv, 1, hd)], 2)
    v = torch.cat([bufs["vc:0"][:, :, :pos].float(), rope[:, (nq + nkv) * hd:].reshape(T, nkv, 1, hd)], 2)
    k, v = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)  # [T, nq, pos + 1, hd]
    att = torch.softmax(torch.einsum("thd,thpd->thp", q, k) / hd ** 0.5, dim=-1)
    want = torch.einsum("thp,thpd->thd", att, v).reshape(T, nq * hd)
    got = ref["out:L0.attn_reduce"].float()
    assert reference.rel_err(got, want) < 4e-3  # bf16 output rounding


def test_reference_rope_rotates_q_and_k_and_keeps_v():
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny()
    ref = reference.run(plan, cpu_buffers(plan, torch))
    qkv, rope = ref["out:L0.qkv_proj"].float(), ref["out:L0.rope_kv"].float()
    Q, KV = 8 * 64, 2 * 64
    heads = lambda x: x.reshape(2, -1, 64).norm(dim=-1)  # noqa: E731
    assert torch.allclose(heads(rope[:, :Q + KV]), heads(qkv[:, :Q + KV]), rtol=1e-2)  # a rotation
    assert not torch.allclose(rope[:, :Q], qkv[:, :Q])
    assert torch.equal(rope[:, Q + KV:], qkv[:, Q + KV:])


@pytest.mark.parametrize("kw", [{}, {"fuse_norm": True}, {"split_qkv": True, "split_gate_up": True},
                                {"logit_softcap": 30.0}])
def test_reference_local_and_end_to_end_agree_on_their_own_outputs(kw):
    """Fed the reference's own outputs as "the kernel's", the local check reproduces them exactly:
    the two modes differ only in where an op's inputs come from."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference

    plan = _tiny(**kw)
    bufs = cpu_buffers(plan, torch)
    e2e = reference.run(plan, bufs)
    local = reference.run(plan, {**bufs, **e2e}, local=True)
    assert all(reference.rel_err(local[n], e2e[n]) == 0.0 for n in plan.outputs)
    assert reference.rel_err(e2e["out:lm_head"] * float("nan"), e2e["out:lm_head"]) == float("inf")


def test_option_bits_match_the_cuda_defines():
    src = (ROOT / "validation/kernels/mk_ops.cuh").read_text()
    for name in ("FUSED_NORM", "RESIDUAL", "MMA"):
        assert int(re.search(rf"#define MK_OPT_{name} (\d+)", src).group(1)) == getattr(P, f"OPT_{name}")


def test_mma_pack_round_trips_and_keeps_row_groups_contiguous():
    torch = pytest.importorskip("torch")
    w = np.arange(48 * 64, dtype=np.float32).reshape(48, 64)
    p = P.mma_pack(w)
    assert np.array_equal(P.mma_unpack(p), w)
    assert np.array_equal(P.mma_pack(torch.from_numpy(w)).numpy(), p)
    assert np.array_equal(P.mma_unpack(torch.from_numpy(p)).numpy(), w)
    # rows 16 .. 31 (one row group) are exactly the second 16 x 64 slab of the packed array
    assert set(p[16:32].ravel()) == set(w[16:32].ravel())
    # in a block, lane 4g + t's first word is row g, inputs 8t .. 8t + 7
    block = p.reshape(-1)[:512]  # the first 1 KiB block (rows 0 .. 15, inputs 0 .. 31)
    g, t = 5, 3
    assert np.array_equal(block[(4 * g + t) * 8:(4 * g + t + 1) * 8], w[g, 8 * t:8 * t + 8])
    assert np.array_equal(block[256 + (4 * g + t) * 8:256 + (4 * g + t + 1) * 8], w[g + 8, 8 * t:8 * t + 8])


def _mma(a, b):
    """mma.sync m16n8k16 on fragments as the PTX ISA defines them: a[lane] = 4 registers of 2
    values (rows g / g + 8, k 2t.. / 2t + 8..), b[lane] = 2 registers (k 2t.. / 2t + 8.., column g);
    returns D[16, 8]."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for r, (row, k) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            A[row, k:k + 2] = a[lane][r]
        for r, k in enumerate([2 * t, 2 * t + 8]):
            B[k:k + 2, g] = b[lane][r]
    return A @ B


@pytest.mark.parametrize("T", [1, 3, 8])
def test_the_kernels_fragment_walk_computes_the_product(T):
    """mk_matmul_mma's indexing, replayed: words pg[i*64 + lane] and pg[i*64 + 32 + lane] of the
    packed weight, x word (kb*T + g)*4 + t of the reordered input (mk_load_x_mma), registers
    (w0.x, w1.x, w0.y, w1.y | x.x, x.y) then (w0.z, w1.z, w0.w, w1.w | x.z, x.w)."""
    rng = np.random.default_rng(1)
    N, K = 32, 96
    w, x = rng.standard_normal((N, K)), rng.standard_normal((T, K))
    words = P.mma_pack(w).reshape(-1, 8)  # 16-byte words, as 8 values
    xw = np.zeros(((K // 32) * T * 4, 8))
    for b in range(T):
        for c in range(K // 8):
            xw[((c // 4) * T + b) * 4 + c % 4] = x[b, 8 * c:8 * c + 8]
    y = np.zeros((N, T))
    for q in range(N * K // 512):
        rg, kb = divmod(q, K // 32)
        w0 = [words[q * 64 + lane] for lane in range(32)]
        w1 = [words[q * 64 + 32 + lane] for lane in range(32)]
        xv = [xw[(kb * T + lane // 4) * 4 + lane % 4] if lane // 4 < T else np.zeros(8) for lane in range(32)]
        for s in range(2):
            a = [[w0[l][4 * s:4 * s + 2], w1[l][4 * s:4 * s + 2],
                  w0[l][4 * s + 2:4 * s + 4], w1[l][4 * s + 2:4 * s + 4]]
                 for l in range(32)]
            bb = [[xv[l][4 * s:4 * s + 2], xv[l][4 * s + 2:4 * s + 4]] for l in range(32)]
            y[rg * 16:rg * 16 + 16] += _mma(a, bb)[:, :T]
    assert np.allclose(y, w @ x.T)


def _mm2_replay(K: int, rows: int, page_B: int, T: int, S: int, C: int = 8) -> np.ndarray:
    """mk_matmul_mma2 (MK_MM=2) replayed on one task: its pages, each warp's run of a page, the
    groups it keeps across pages, its deposits (the slot index arithmetic of mk_mm_deposit) and
    the flushes (mk_mm_flush's units and sums), a warp's partial of a group as a 16 x 8 block.
    Every slot entry is checked to be free when stored and to hold the flushed group when read."""
    rng = np.random.default_rng(K + rows + page_B + T)
    w, x = rng.standard_normal((rows, K)), rng.standard_normal((T, K))
    KB, ng, nb = K // 32, rows // 16, page_B // 1024
    NB = ng * KB
    assert (nb + KB - 2) // KB + 1 <= S, "mk_matmul_mma2 refuses this (MK_ERR_SLOTS)"
    slots, owner = np.zeros(S * C * 16 * T), np.full(S * C * 16 * T, -1)
    out = np.full((T, rows), np.nan)
    d = np.zeros((C, 16, 8))                 # each warp's accumulators: rows x batch columns
    held = [-1] * C                          # the group they hold (-1: none)

    def deposit(wp: int, rg: int) -> None:
        assert held[wp] == rg
        base = ((rg % S) * C + wp) * 16 * T
        for g in range(8):
            for t in range(4):
                for j in range(2):
                    if 2 * t + j < T:
                        for row in (g, g + 8):
                            i = base + row * T + 2 * t + j
                            assert owner[i] == -1
                            slots[i], owner[i] = d[wp, row, 2 * t + j], rg
        d[wp], held[wp] = 0.0, -1

    def flush(f0: int, f1: int) -> None:
        assert all(h == -1 or h >= f1 for h in held)  # every warp is past the window's groups
        for u in range((f1 - f0) * 8 * T):
            b, pr = u % T, u // T
            rg, rr = f0 + pr // 8, 2 * (pr % 8)
            e = ((rg % S) * C * 16 + rr) * T + b
            v = [0.0, 0.0]
            for wp in range(C):
                for k, i in enumerate((e + wp * 16 * T, e + wp * 16 * T + T)):
                    assert owner[i] in (-1, rg)
                    v[k] += slots[i]
                    slots[i], owner[i] = 0.0, -1
            assert np.isnan(out[b, 16 * rg + rr:16 * rg + rr + 2]).all()
            out[b, 16 * rg + rr:16 * rg + rr + 2] = v

    f0 = 0
    for q0 in range(0, NB, nb):
        n = min(nb, NB - q0)
        first, last = q0 // KB, (q0 + n - 1) // KB
        if last >= f0 + S:
            flush(f0, first)
            f0 = first
        for wp in range(C):
            a, z = wp * n // C, (wp + 1) * n // C
            if a >= z:
                continue
            rg, kb = divmod(q0 + a, KB)
            i = a
            while i < z:
                e = min(z, i + KB - kb)
                for blk in range(kb, kb + e - i):  # the blocks' product: rows of group rg, inputs of block blk
                    assert held[wp] in (-1, rg)
                    held[wp] = rg
                    ks = slice(32 * blk, 32 * blk + 32)
                    d[wp, :, :T] += w[16 * rg:16 * rg + 16, ks] @ x[:, ks].T
                kb += e - i
                i = e
                if kb == KB:
                    deposit(wp, rg)
                    rg, kb = rg + 1, 0
            if kb != 0:
                q1, cont = q0 + nb, False
                if q1 < NB:
                    n1 = min(nb, NB - q1)
                    a1 = wp * n1 // C
                    cont = a1 < (wp + 1) * n1 // C and (q1 + a1) // KB == rg
                if not cont:
                    deposit(wp, rg)
    flush(f0, ng)
    assert (owner == -1).all() and not slots.any()  # every slot is zero again for the next task
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-9, atol=1e-9)
    return out


@pytest.mark.parametrize("K,rows,page_KiB", [(2048, 32, 32), (2048, 976, 32), (8192, 48, 32), (256, 160, 32),
                                             (2304, 80, 32), (512, 64, 5), (1024, 16, 64), (3072, 112, 7)])
@pytest.mark.parametrize("T", [1, 2, 8])
def test_the_per_warp_row_sums_write_every_output_once(K, rows, page_KiB, T):
    """MK_MM=2: with the fewest slots the kernel accepts (one page's groups) and with more."""
    page_B = page_KiB * 1024
    least = P.mm_groups_per_page(page_B, K)
    for S in (least, least + 3, 16):
        _mm2_replay(K, rows, page_B, T, S)


@pytest.mark.parametrize("model", ["llama-3.2-1b", "llama-3.1-8b"])
@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_every_tensor_core_matmul_has_the_row_group_slots_it_needs(model, batch):
    """mk_mm_slots (MK_MM=2): the slots after an op's input rows, in the x and accumulator regions,
    are at least the groups one page touches, for every tensor-core op of the suite's models."""
    opts = P.kernel_options(model, batch)
    if opts.get("prefetch_depth", 1) < 1:
        pytest.skip("does not fit in shared memory")
    wl = mksim.models.workload(model, batch=batch, kv_len=128)
    for page_KiB in (16, 32, 64):
        depth = min(2, (227 - opts["smem_reserve_KiB"]) // page_KiB)
        if depth < 1:
            continue
        s = mksim.build_schedule(wl, "h200-datasheet", "megakernel", **(opts | {"page_KiB": page_KiB,
                                                                                "prefetch_depth": depth}))
        plan = P.plan(s)
        slot_B = P.CONSUMERS * 16 * batch * 4
        for r in plan.ops:
            if r["opt"] & P.OPT_KCHUNK:  # chunked input rows: a slot per row group of a task (check_kc_slots)
                assert P.kc_slots(r["off2"], plan.x_B, plan.acc_rows, batch) >= 2
            elif r["opt"] & P.OPT_MMA:
                S = min(16, (plan.x_B + 4 * batch * plan.acc_rows - batch * r["K"] * 2) // slot_B)
                assert S >= P.mm_groups_per_page(plan.page_B, r["K"])


def test_llama_matmuls_run_on_the_tensor_cores():
    wl = mksim.models.workload("llama-3.2-1b", batch=1, kv_len=128)
    s = mksim.build_schedule(wl, "h200-datasheet", "megakernel", **P.kernel_options("llama-3.2-1b", 1))
    plan = P.plan(s)
    mm = [r for r, op in zip(plan.ops, wl.ops, strict=True) if op.kind == "matmul"]
    assert mm and all(r["opt"] & P.OPT_MMA for r in mm)
    assert all(plan.buffers[r["W"]].layout == "mma" for r in mm)
    s2 = mksim.build_schedule(wl, "h200-datasheet", "megakernel", **(P.kernel_options("llama-3.2-1b",
                                                                                      1) | {"page_KiB": 2.5}))
    assert not any(r["opt"] & P.OPT_MMA for r, op in zip(P.plan(s2).ops, wl.ops, strict=True) if op.kind == "matmul")


def test_task_slots_hold_an_op_description_and_a_task_row():
    src = (ROOT / "validation/megakernel/mk_kernel.cu").read_text()
    assert int(re.search(r"#define MK_SLOT_B (\d+)", src).group(1)) == P.SLOT_B
    assert P.SLOT_B >= P.OP_FIELDS.itemsize + 8 * 4
    assert int(re.search(r"#define MK_THREADS \(MK_NW \+ (\d+)\)", src).group(1)) == P.THREADS - 32 * P.CONSUMERS


# -- one description per op kind ----------------------------------------------------------------------
CUDA = (ROOT / "validation/megakernel/mk_kernel.cu", ROOT / "validation/kernels/mk_ops.cuh")


def test_every_kind_with_an_opcode_has_an_encoder_a_reference_a_device_function_and_a_cost_fit():
    from mksim.workload import KINDS
    from validation import kernel_costs
    from validation.megakernel import reference
    from validation.megakernel.encode import OPCODES

    run = {k.name for k in KINDS.values() if k.opcode is not None}
    assert set(OPCODES) == set(P.ROWS) == set(reference.REFERENCES) == set(kernel_costs.KINDS) == run
    src = "\n".join(p.read_text() for p in CUDA)
    cases = re.findall(r"case (MK_OP_\w+):", src)
    assert sorted(cases) == sorted(KINDS[k].define for k in run)  # one case each, none unregistered
    assert set(re.findall(r"\bMK_OP_\w+", src)) == {KINDS[k].define for k in run}
    assert not re.search(r"#define MK_OP_", src)  # the numbers come from the descriptions only
    for kind in run:  # the fit writes what the hardware schema reads
        assert set(KINDS[kind].cost_fields) <= set(__import__("hwmodels").KERNEL_COST_KEYS)


def test_opcodes_reach_the_compiler_from_the_descriptions():
    from mksim.workload import KINDS
    from validation.megakernel.encode import OPCODES, opcode_defines
    from validation.megakernel.gpu import compile_options

    assert OPCODES == {k.name: k.opcode for k in KINDS.values() if k.opcode is not None}
    assert set(opcode_defines()) == {f"-D{KINDS[k].define}={c}" for k, c in OPCODES.items()}
    assert set(opcode_defines()) <= set(compile_options())


def test_a_kind_without_a_device_function_is_refused_in_one_line():
    from mksim.workload import Input, Op, Workload

    wl = build_llm_workload(TINY, batch=1, kv_len=70, n_sms=8)
    extra = Op(name="twice", kind="elementwise", out_size=1000, elem_bytes=2.0, flops=1000.0,
               inputs=(Input("lm_head"),))
    wl = Workload(name="x", ops=(*wl.ops, extra), tokens=1, batch=1, kv_len=70, model=TINY)
    with pytest.raises(ScheduleError, match="no device function for op kind 'elementwise'; the generated "
                                            "kernel runs embed, rmsnorm") as exc:
        P.plan(mksim.build_schedule(wl, "h200-datasheet", "megakernel", blocks_per_sm=1))
    assert "\n" not in str(exc.value)


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not installed")
def test_the_kernel_without_the_opcode_defines_says_where_they_come_from(tmp_path):
    import shutil
    import subprocess

    r = subprocess.run([shutil.which("nvcc"), "-arch=sm_90", "-std=c++17", f"-I{ROOT / 'validation/kernels'}", "-E",
                        str(CUDA[0]), "-o", str(tmp_path / "out.i")], capture_output=True, text=True, timeout=120,
                       check=False)
    assert r.returncode != 0 and "opcode_defines()" in r.stderr


def test_quick_look_takes_any_workload_option_typed_by_its_default():
    from validation.megakernel.quick import workload_option

    assert workload_option("split_qkv", "0") is False and workload_option("kv_splits", "8") == 8
    for key, text, msg in (("fuse_norm", "yes", "fuse_norm takes 0 or 1"), ("batch", "2", "unknown workload option"),
                           ("kv_splits", "1.5", "kv_splits takes a number")):
        with pytest.raises(ValueError, match=msg):
            workload_option(key, text)


def test_softcap_row_and_reference():
    """The soft-capped logits: the op reads lm_head's rows, its cap travels in the row's scale."""
    torch = pytest.importorskip("torch")
    from validation.megakernel import reference
    from validation.megakernel.encode import OPCODES

    plan = _tiny(logit_softcap=2.0)
    row, lm = plan.ops[-1], plan.ops[-2]
    assert (row["kind"], row["in0"], row["ld0"], row["scale"], row["N"], row["T"]) == \
        (OPCODES["softcap"], lm["out"], 1000, 2.0, 1000, 2)
    assert plan.program.tasks[:, 0].tolist().count(OPCODES["softcap"]) == plan.schedule.graph.n_tiles[-1]
    ref = reference.run(plan, cpu_buffers(plan, torch))
    logits, capped = ref["out:lm_head"].float(), ref["out:softcap"].float()
    assert torch.allclose(capped, 2.0 * torch.tanh(logits / 2.0), rtol=8e-3, atol=1e-6)  # bf16 rounding
    assert capped.abs().max() <= 2.0 < logits.abs().max()  # some logits were over the cap


def test_the_l2_prefetchers_lead_reaches_the_kernels_parameters():
    """l2_prefetch_KiB (0: off) becomes MkParams.l2_lead_B, in whole 16-byte words; the prefetcher's
    warp is one of the block's threads (MK_THREADS)."""
    wl = build_llm_workload(TINY, batch=2, kv_len=70, n_sms=8, kv_splits=3)
    for mode in ("megakernel", "persistent_barrier"):
        plan = P.plan(mksim.build_schedule(wl, "h200-datasheet", mode, blocks_per_sm=1, l2_prefetch_KiB=256))
        assert plan.l2_lead_B == 256 * 1024
    assert _tiny().l2_lead_B == 0
    assert "l2_lead_B" in P.PARAM_INT_FIELDS and P.THREADS == (P.CONSUMERS + 4) * 32


def test_the_l2_sweep_sets_the_lead_on_the_suites_searched_schedules():
    from validation.megakernel.l2_sweep import KINDS, schedule_with_lead
    from validation.suite import searched_schedule_path

    s = schedule_with_lead("llama-3.2-1b", 1, 512)
    searched = mksim.Schedule.from_json(searched_schedule_path("llama-3.2-1b", 1))
    assert s.options.l2_prefetch_KiB == 512 and P.plan(s).l2_lead_B == 512 * 1024
    assert s.policy == searched.policy and s.queues == searched.queues  # the suite's searched schedule, lead set
    assert KINDS["bulk"] == "-DMK_L2PF_KIND=0" and "-DMK_L2PF_KIND=2" in KINDS["line_last"]


def test_fastdiv_magic_is_exact_where_mma_ok_allows_it():
    """mk_div (MK_MM_FASTDIV): x / d as the high word of x * div_magic(d), for every d a matmul of
    K = 256 .. 16384 has and x up to the bound fastdiv_ok allows, and past it where it fails."""
    from validation.megakernel.program import div_magic, fastdiv_ok

    rng = np.random.default_rng(0)
    for d in list(range(8, 64)) + [96, 128, 256, 448, 512]:
        top = 2**32 // d  # fastdiv_ok(top, d); x < top
        assert fastdiv_ok(top, d) and not fastdiv_ok(top + 1, d)
        x = np.concatenate([np.arange(0, 5000), rng.integers(0, top, 20000), np.arange(top - 3000, top)])
        x = x.astype(np.uint64)
        hi = (x * np.uint64(div_magic(d))) >> np.uint64(32)
        assert (hi == x // np.uint64(d)).all(), d


def test_mma_ok_refuses_a_task_too_large_for_the_fast_division():
    """A matmul task of so many 1 KiB blocks that x * K / 32 passes 2^32 takes the CUDA-core path."""
    from types import SimpleNamespace

    from validation.megakernel.program import mma_ok

    op = SimpleNamespace(kind="matmul", attrs={"k": 2048}, out_size=2**30, name="big")
    assert mma_ok(op, np.array([0, 4096]), 32 * 1024)
    assert not mma_ok(op, np.array([0, 2**30]), 32 * 1024)
