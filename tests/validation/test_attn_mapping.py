"""The thread mapping of the generated kernels' decode attention (validation/kernels/mk_ops.cuh,
MK_ATTN 2) emulated lane by lane in numpy, with no GPU.

The PTX primitives it uses (mma.sync m16n8k16, ldmatrix, movmatrix, cvt.rn.bf16x2, cp.async with
zero fill) are written here from the PTX ISA's fragment layouts; the device functions'
index arithmetic is transcribed step by step on top of them (shared memory as bytes, warps one after
another between barriers, the 32 lanes of a warp as numpy vectors). The partials and the reduction
must then agree with attention computed directly in float64: a wrong lane, row, chunk or head
anywhere gives an O(1) error. The same runs check that every shared-memory access stays inside the
region the kernel is given and that the accesses meant to be free of bank conflicts are.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import mksim
from validation.megakernel import program as P

MK_OPS = Path(__file__).resolve().parents[2] / "validation/kernels/mk_ops.cuh"
L = np.arange(32)
LG, LT = L >> 2, L & 3  # lane 4g + t


# ---------------------------------------------------------------- bf16 and the PTX primitives
def bf16_to_f32(bits) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def f32_to_bf16(x) -> np.ndarray:
    """Round to nearest even (finite values), as cvt.rn.bf16 and mk_f32_to_bf16."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def halves(w) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(w, dtype=np.uint32)
    return (w & 0xFFFF).astype(np.uint16), (w >> 16).astype(np.uint16)


def pack(lo, hi) -> np.ndarray:
    return np.asarray(lo, dtype=np.uint32) | (np.asarray(hi, dtype=np.uint32) << 16)


def cvt_bf16x2(a, b) -> np.ndarray:
    """cvt.rn.bf16x2.f32 d, a, b: a in the upper half, b in the lower."""
    return pack(f32_to_bf16(b), f32_to_bf16(a))


def mma(d: list, a: list, b: list) -> list:
    """mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on the warp's fragments: a, 4 registers,
    b, 2, d, 4 fp32 values, each a vector over the 32 lanes."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    C = np.zeros((16, 8))
    for r in range(4):  # a_r holds elements 2r, 2r + 1: row g (+ 8 if r odd), column 2t + e (+ 8 if r >= 2)
        for e, h in enumerate(halves(a[r])):
            A[LG + 8 * (r & 1), 2 * LT + e + 8 * (r >> 1)] = bf16_to_f32(h)
    for r in range(2):  # b_r: row 2t + e (+ 8 for b_1), column g
        for e, h in enumerate(halves(b[r])):
            B[2 * LT + e + 8 * r, LG] = bf16_to_f32(h)
    for i in range(4):  # c_i: row g (+ 8 for c_2, c_3), column 2t + (i & 1)
        C[LG + 8 * (i >> 1), 2 * LT + (i & 1)] = d[i]
    Dm = (A @ B + C).astype(np.float32)
    return [Dm[LG + 8 * (i >> 1), 2 * LT + (i & 1)] for i in range(4)]


def movmatrix_trans(x) -> np.ndarray:
    """movmatrix.sync.aligned.m8n8.trans.b16: lane 4r + q holds row r, columns 2q, 2q + 1."""
    M = np.zeros((8, 8), dtype=np.uint16)
    lo, hi = halves(x)
    M[LG, 2 * LT], M[LG, 2 * LT + 1] = lo, hi
    return pack(M[2 * LT, LG], M[2 * LT + 1, LG])


class Smem:
    """The kernel's scratch region as bytes; every access checked against its size."""

    def __init__(self, nbytes: int):
        self.b = np.zeros(nbytes, dtype=np.uint8)

    def _at(self, addr: int, n: int) -> slice:
        assert 0 <= addr and addr + n <= len(self.b), f"shared memory access [{addr}, {addr + n}) outside the region"
        return slice(addr, addr + n)

    def write(self, addr: int, data: np.ndarray) -> None:
        raw = np.ascontiguousarray(data).view(np.uint8).ravel()
        self.b[self._at(addr, len(raw))] = raw

    def read(self, addr: int, dtype, count: int = 1) -> np.ndarray:
        n = np.dtype(dtype).itemsize * count
        return self.b[self._at(addr, n)].view(dtype).copy()

    def ldmatrix_x4(self, addrs: np.ndarray, trans: bool) -> list:
        """ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8j + r addresses row r of matrix j."""
        out = []
        for j in range(4):
            rows = [int(addrs[8 * j + r]) for r in range(8)]
            assert all(a % 16 == 0 for a in rows), "ldmatrix rows are 16-byte aligned"
            assert len({(a // 16) % 8 for a in rows}) == 8, "the 8 rows of a matrix lie in 8 bank groups"
            M = np.stack([self.read(a, np.uint16, 8) for a in rows])
            if trans:
                out.append(pack(M[2 * LT, LG], M[2 * LT + 1, LG]))
            else:
                out.append(pack(M[LG, 2 * LT], M[LG, 2 * LT + 1]))
        return out


def banks(word_addrs) -> int:
    """Wavefronts a warp's 4-byte shared accesses take (distinct words in one bank serialise)."""
    w = np.asarray(word_addrs)
    return max(len(set(w[(w % 32) == k])) for k in range(32)) or 1


# ---------------------------------------------------------------- the partial, transcribed
def tile_row_b(D: int) -> int:  # MK_TILE_ROW_B<D>
    return 2 * D + 16


def warp_b(D: int) -> int:  # MK_ATTN_WARP_B<D>
    return 2 * 16 * tile_row_b(D)


def attn_smem_bytes(D: int, G: int, nwarps: int) -> int:  # mk_attn_smem_bytes<D, G>(nwarps)
    return nwarps * warp_b(D) + G * (D // 2 + 4) * 4 + 2 * nwarps * G * 4


class Op:
    """The fields of MkOp that attention reads, with the cache and input as flat bf16 arrays."""

    def __init__(self, rng, *, T: int, hkv: int, G: int, D: int, splits: int, kv_total: int, s_max: int,
                 window: int = 0):
        self.T, self.hkv, self.hd, self.splits, self.kv_total, self.s_max = T, hkv, D, splits, kv_total, s_max
        self.K = window  # MkOp.K of a partial: a sliding window's positions (0: all)
        self.G = G
        self.scale = np.float32(D ** -0.5)
        self.ld0 = (hkv * G + 2 * hkv) * D  # a rope row [q; k; v]
        self.in0 = f32_to_bf16(rng.standard_normal(T * self.ld0).astype(np.float32))
        self.kc = f32_to_bf16(rng.standard_normal(T * hkv * s_max * D).astype(np.float32))
        self.vc = f32_to_bf16(rng.standard_normal(T * hkv * s_max * D).astype(np.float32))
        self.n_parts = hkv * T * splits
        self.out = np.full((self.n_parts, G * (D + 2)), np.nan, dtype=np.float32)

    def span(self, i: int) -> tuple[int, int, int, int, int]:  # mk_attn_span: row0 (element), p0, p1, b, g
        C = self.splits
        g, b, c = i // (self.T * C), (i // C) % self.T, i % C
        row0 = (b * self.hkv + g) * self.s_max
        w0 = self.kv_total - self.K if 0 < self.K < self.kv_total else 0  # mk_attn_first
        n = self.kv_total - w0
        return row0 * self.hd, w0 + c * n // C, w0 + (c + 1) * n // C, b, g


def stage(op: Op, sm: Smem, k0: int, p1: int, P_: int, ks: int) -> None:
    """mk_attn_stage: chunk q = lane + 32 k of the tile is chunk q % CH of row q / CH, K and V
    (lane l: chunk l % CH of rows l / CH + (32 / CH) k where 32 is a multiple of CH)."""
    D = op.hd
    CH, RB = D // 8, tile_row_b(D)
    for k in range(D // 16):
        q = L + 32 * k
        r, c = q // CH, q % CH
        if 32 % CH == 0:
            assert (r == L // CH + 32 // CH * k).all() and (c == L % CH).all()
        p = P_ + r
        ok = p < p1
        src = k0 + np.minimum(p, p1 - 1) * D + 8 * c
        dst = ks + r * RB + 16 * c
        for lane in range(32):
            for cache, off in ((op.kc, 0), (op.vc, 16 * RB)):
                chunk = cache[src[lane]:src[lane] + 8] if ok[lane] else np.zeros(8, dtype=np.uint16)
                sm.write(int(dst[lane]) + off, chunk)


def attn_partial(op: Op, i: int, nw: int, sm: Smem) -> None:
    """mk_attn_partial_tc<D, G>(o, i, ...): the warps in turn between the barriers."""
    D, G = op.hd, op.G
    KD, R, TILE, QS, RB = D // 16, D + 4, 16 * tile_row_b(D), D // 2 + 4, tile_row_b(D)
    nwarps = nw // 32
    k0, p0, p1, b, gk = op.span(i)
    nsteps = (p1 - p0 + 15) >> 4
    r8, j8 = L & 7, L >> 3
    state = {}
    for warp in range(nwarps):  # the K and V copies of each warp's first step
        ks = warp * warp_b(D)
        if warp < nsteps:
            stage(op, sm, k0, p1, p0 + 16 * warp, ks)
    qs = nwarps * warp_b(D)  # q into shared memory: thread tid, words tid and tid + nw of each round
    qw0 = b * op.ld0 + gk * G * D
    for k0_ in range(0, G * D // 2, 2 * nw):
        for ka in (k0_ + np.arange(nw), k0_ + nw + np.arange(nw)):
            for kx in ka[ka < G * D // 2]:
                word = pack(op.in0[qw0 + 2 * kx], op.in0[qw0 + 2 * kx + 1])
                sm.write(qs + 4 * ((kx // (D // 2)) * QS + kx % (D // 2)), np.asarray([word], dtype=np.uint32))
    # ---- mk_bar(nw)
    for warp in range(nwarps):
        ks = warp * warp_b(D)
        kq = ks + (r8 + 8 * (j8 & 1)) * RB + 16 * (j8 >> 1)
        qg = qs // 4 + np.minimum(LG, G - 1) * QS + LT  # word addresses
        m = [np.full(32, -np.inf, np.float32) for _ in range(2)]
        l_ = [np.zeros(32, np.float32) for _ in range(2)]
        acc = [[np.zeros(32, np.float32) for _ in range(4)] for _ in range(KD)]
        for P_ in range(p0 + 16 * warp, p1, 16 * nwarps):
            sc = [np.zeros(32, np.float32) for _ in range(4)]
            for kk in range(KD):
                a = sm.ldmatrix_x4(kq + 32 * kk, trans=False)
                assert banks(qg + 8 * kk) == 1 and banks(qg + 8 * kk + 4) == 1
                qwords = sm.b[: len(sm.b) // 4 * 4].view(np.uint32)
                b0 = np.where(LG < G, qwords[qg + 8 * kk], 0).astype(np.uint32)
                b1 = np.where(LG < G, qwords[qg + 8 * kk + 4], 0).astype(np.uint32)
                sc = mma(sc, a, [b0, b1])
            v0, v1 = P_ + LG < p1, P_ + 8 + LG < p1
            x = [np.where(v, s * op.scale, -np.inf).astype(np.float32) for v, s in
                 ((v0, sc[0]), (v0, sc[1]), (v1, sc[2]), (v1, sc[3]))]
            mx = [np.maximum(x[0], x[2]), np.maximum(x[1], x[3])]
            for sh in (4, 8, 16):
                mx = [np.maximum(v, v[L ^ sh]) for v in mx]
            mn = [np.maximum(m[e], mx[e]) for e in range(2)]
            with np.errstate(invalid="ignore"):
                c = [np.where(m[e] == -np.inf, 0, np.exp(m[e] - mn[e])).astype(np.float32) for e in range(2)]
            ex = [np.exp(x[j] - mn[j & 1]).astype(np.float32) for j in range(4)]
            l_ = [(l_[e] * c[e] + (ex[e] + ex[2 + e])).astype(np.float32) for e in range(2)]
            m = mn
            hw, lw = [], []
            for j0 in (0, 2):  # mk_split_bf16x2(e0, e1) and (e2, e3)
                h = cvt_bf16x2(ex[j0 + 1], ex[j0])
                lo, hi = halves(h)
                lw.append(cvt_bf16x2(ex[j0 + 1] - bf16_to_f32(hi), ex[j0] - bf16_to_f32(lo)))
                hw.append(h)
            bh = [movmatrix_trans(w) for w in hw]
            bl = [movmatrix_trans(w) for w in lw]
            for dd in range(KD):
                r = sm.ldmatrix_x4(kq + TILE + 32 * dd, trans=True)
                a = [r[0], r[2], r[1], r[3]]  # a0, a2, a1, a3 as loaded
                acc[dd] = [acc[dd][0] * c[0], acc[dd][1] * c[1], acc[dd][2] * c[0], acc[dd][3] * c[1]]
                acc[dd] = mma(acc[dd], a, bh)
                acc[dd] = mma(acc[dd], a, bl)
            if P_ + 16 * nwarps < p1:
                stage(op, sm, k0, p1, P_ + 16 * nwarps, ks)
        for sh in (4, 8, 16):
            l_ = [v + v[L ^ sh] for v in l_]
        state[warp] = (m, l_, acc)
    nact = min(nwarps, nsteps)
    pm = qs + 4 * G * QS
    pl = pm + 4 * nwarps * G
    for warp in range(nact):  # each warp's partial over its tiles, m and l after q
        m, l_, acc = state[warp]
        rows = warp * warp_b(D)
        for e in range(2):
            h = 2 * LT + e
            ok = h < G
            for dd in range(KD):
                for part, dim in ((acc[dd][e], 16 * dd + LG), (acc[dd][2 + e], 16 * dd + 8 + LG)):
                    words = rows // 4 + h * R + dim
                    assert banks(words[ok]) == 1, "the partials' stores are conflict-free"
                    for lane in np.flatnonzero(ok):
                        sm.write(4 * int(words[lane]), part[lane:lane + 1])
            for lane in np.flatnonzero(ok & (LG == 0)):
                sm.write(pm + 4 * (warp * G + int(h[lane])), m[e][lane:lane + 1])
                sm.write(pl + 4 * (warp * G + int(h[lane])), l_[e][lane:lane + 1])
    # ---- mk_bar(nw); the merge, thread it: head h, elements d, d + 1
    for it in range(G * D // 2):
        h, d = it // (D // 2), 2 * (it % (D // 2))
        ms = [float(sm.read(pm + 4 * (w * G + h), np.float32)[0]) for w in range(nact)]
        M = np.float32(max(ms))
        O = np.zeros(2, np.float32)
        Lsum = np.float32(0)
        for w in range(nact):
            cw = np.float32(0) if ms[w] == -np.inf else np.exp(np.float32(ms[w]) - M)
            O += sm.read(w * warp_b(D) + 4 * (h * R + d), np.float32, 2) * cw
            Lsum += sm.read(pl + 4 * (w * G + h), np.float32)[0] * cw
        op.out[i, h * D + d:h * D + d + 2] = O
        if d == 0:
            op.out[i, G * D + h], op.out[i, G * D + G + h] = M, Lsum


def reference_partials(op: Op) -> np.ndarray:
    """o (unnormalised), m, l of every partial, in float64 from the same bf16 inputs."""
    D, G = op.hd, op.G
    ref = np.zeros_like(op.out, dtype=np.float64)
    for i in range(op.n_parts):
        k0, p0, p1, b, gk = op.span(i)
        K = bf16_to_f32(op.kc[k0 + p0 * D:k0 + p1 * D]).reshape(-1, D).astype(np.float64)
        V = bf16_to_f32(op.vc[k0 + p0 * D:k0 + p1 * D]).reshape(-1, D).astype(np.float64)
        q0 = b * op.ld0 + gk * G * D
        q = bf16_to_f32(op.in0[q0:q0 + G * D]).reshape(G, D).astype(np.float64) * float(op.scale)
        s = q @ K.T
        m = s.max(axis=1)
        p = np.exp(s - m[:, None])
        ref[i] = np.concatenate([(p @ V).ravel(), m, p.sum(axis=1)])
    return ref


SHAPES = [(64, 4), (64, 8), (128, 4), (128, 3)]  # the (head size, group) of mk_attn_partial's instantiations


@pytest.mark.parametrize("D,G", SHAPES)
@pytest.mark.parametrize("n", [1, 15, 17, 64, 65, 205])
def test_partial_mapping_matches_attention(D, G, n):
    """One partial of n positions (64: the searched schedule's split; 205: the default one at
    KV 1024; not a multiple of 16: masked rows; 205 > 8 warps x 16: a second round)."""
    rng = np.random.default_rng(D * 100 + G * 10 + n)
    op = Op(rng, T=1, hkv=2, G=G, D=D, splits=1, kv_total=n, s_max=n + 20)
    sm = Smem(attn_smem_bytes(D, G, 8))
    for i in range(op.n_parts):
        attn_partial(op, i, 256, sm)
    ref = reference_partials(op)
    got = op.out.astype(np.float64)
    o, m, lsum = slice(0, G * D), slice(G * D, G * D + G), slice(G * D + G, None)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[:, m], ref[:, m], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, lsum], ref[:, lsum], rtol=1e-5)
    assert np.linalg.norm(got[:, o] - ref[:, o]) <= 1e-5 * np.linalg.norm(ref[:, o])


def test_partial_mapping_splits_batch_and_sixteen_warps():
    """Partials (g, b, c), g-major, of two sequences over three splits, on 16 worker warps."""
    rng = np.random.default_rng(7)
    D, G = 64, 4
    op = Op(rng, T=2, hkv=2, G=G, D=D, splits=3, kv_total=300, s_max=310)
    sm = Smem(attn_smem_bytes(D, G, 16))
    for i in range(op.n_parts):
        attn_partial(op, i, 512, sm)
    ref = reference_partials(op)
    assert np.linalg.norm(op.out - ref) <= 1e-5 * np.linalg.norm(ref)


# ---------------------------------------------------------------- the reduction, transcribed
def attn_reduce(op: Op, parts: np.ndarray, lo: int, hi: int, nw: int) -> np.ndarray:
    """mk_attn_reduce (MK_ATTN 2): warps of 32 consecutive items, lane c < 16 holding split c0 + c; a
    head takes HW = ceil(D / 64) x 32 items, those past its D elements merging its first pair, unstored."""
    D, G, C, T = op.hd, op.G, op.splits, op.T
    CB, HW = 16, (D + 63) // 64 * 32
    per = G * HW
    out = np.full((T, op.hkv * G * D), np.nan, np.float32)
    flat = parts.ravel()
    stride = G * (D + 2)
    for it0 in range(0, (hi - lo) * per, 32):
        it = it0 + L
        r = it % per
        h, jj = r // HW, 2 * (r % HW)
        assert len(set(it // per)) == 1 and len(set(h)) == 1, "a warp: one reduction, one head"
        i, k = lo + it // per, h * D + np.where(jj < D, jj, 0)
        if D % 64 == 0:
            assert (k == 2 * r).all()  # the mapping before other head sizes were built
        h, g, b = h[0], i // T, i % T
        base = i * C * stride
        M, Ls = np.full(32, -np.inf, np.float32), np.zeros(32, np.float32)
        O0, O1 = np.zeros(32, np.float32), np.zeros(32, np.float32)
        for c0 in range(0, C, CB):
            c = c0 + L
            mine = (L < CB) & (c < C)
            cc = np.where(mine, c, 0)
            mc = np.where(mine, flat[base + cc * stride + G * D + h], -np.inf).astype(np.float32)
            lc = np.where(mine, flat[base + cc * stride + G * D + G + h], 0).astype(np.float32)
            ov = [(flat[base + (c0 + j) * stride + k], flat[base + (c0 + j) * stride + k + 1]) if c0 + j < C
                  else (np.zeros(32, np.float32), np.zeros(32, np.float32)) for j in range(CB)]
            mn = np.maximum(M, mc.max())
            with np.errstate(invalid="ignore"):
                corr = np.where(M == -np.inf, 0, np.exp(M - mn)).astype(np.float32)
                w = np.where(mc == -np.inf, 0, np.exp(mc - mn)).astype(np.float32)
            Ls = Ls * corr + (lc * w).sum()
            O0, O1 = O0 * corr, O1 * corr
            for j in range(CB):
                O0 = O0 + ov[j][0] * w[j]
                O1 = O1 + ov[j][1] * w[j]
            M = mn
        ok = jj < D
        col = (g * G * D + k)[ok]
        out[b[ok], col], out[b[ok], col + 1] = (O0 / Ls)[ok], (O1 / Ls)[ok]
    return out


@pytest.mark.parametrize("D,G", SHAPES)
@pytest.mark.parametrize("C,T", [(1, 1), (5, 1), (16, 1), (20, 2), (33, 1)])
def test_reduce_mapping_matches_the_merge(D, G, C, T):
    rng = np.random.default_rng(C * 10 + T + D + G)
    op = Op(rng, T=T, hkv=2, G=G, D=D, splits=C, kv_total=C * 4, s_max=C * 4)
    parts = rng.standard_normal(op.out.shape).astype(np.float32)
    parts[:, G * D + G:] = np.abs(parts[:, G * D + G:]) + 0.5  # l > 0
    got = attn_reduce(op, parts, 0, op.hkv * T, 256)
    p = parts.reshape(op.hkv, T, C, -1).astype(np.float64)
    o, m, lsum = p[..., :G * D].reshape(op.hkv, T, C, G, D), p[..., G * D:G * D + G], p[..., G * D + G:]
    w = np.exp(m - m.max(axis=2, keepdims=True))
    ref = (o * w[..., None]).sum(axis=2) / (lsum * w).sum(axis=2)[..., None]  # [hkv, T, G, D]
    ref = ref.transpose(1, 0, 2, 3).reshape(T, -1)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- the region it is given
@pytest.mark.parametrize("model", mksim.models.names())
def test_new_layout_fits_the_x_region(model):
    """program.x_region_bytes sizes the region for MK_ATTN 1 (at least); the new layout needs less."""
    wl = mksim.models.workload(model, batch=1, kv_len=1024)
    G, D = wl.model.num_heads // wl.model.num_kv_heads, wl.model.head_dim
    if (D, G) not in SHAPES:
        pytest.skip(f"no attention built for head size {D}, group {G}")
    schedule = SimpleNamespace(workload=wl)
    assert attn_smem_bytes(D, G, P.CONSUMERS) <= P.x_region_bytes(schedule)


def test_layout_formulas_are_the_kernels():
    """tile_row_b, warp_b and attn_smem_bytes above are mk_ops.cuh's MK_TILE_ROW_B, MK_ATTN_WARP_B and
    mk_attn_smem_bytes (their C++ expressions evaluated here)."""
    src = MK_OPS.read_text()

    def expr(pattern: str) -> str:
        e = re.search(pattern, src).group(1)
        e = e.replace("MK_TILE_ROW_B<D>", "tile_row_b(D)").replace("MK_ATTN_WARP_B<D>", "warp_b(D)")
        return e.replace("/", "//")

    row = expr(r"constexpr int MK_TILE_ROW_B = ([^;]+);")
    warp = expr(r"constexpr int MK_ATTN_WARP_B = ([^;]+);")
    total = expr(r"mk_attn_smem_bytes\(int nwarps\) \{\s*return ([^;]+);")
    for D, G in SHAPES:
        for nwarps in (8, 16):
            env = {"D": D, "G": G, "nwarps": nwarps, "tile_row_b": tile_row_b, "warp_b": warp_b}
            assert eval(row, env) == tile_row_b(D)
            assert eval(warp, env) == warp_b(D)
            assert eval(total, env) == attn_smem_bytes(D, G, nwarps)
