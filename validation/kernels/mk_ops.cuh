// The ops of a decode step as device functions for mksim's generated kernels.
//
// One op description (MkOp) per op of the workload; a task is one tile [lo, hi) of one op's output.
// Every function here runs on the block's *worker* threads (tid in [0, nw), nw a multiple of 32) and
// synchronises them with a named barrier, so that the same code serves a chain kernel and a
// persistent kernel whose block also holds a producer warp. Activations are bf16 [T, size]
// row-major (T rows: one per sequence in decode); attention partials are fp32. Arithmetic is fp32
// and every bf16 output is rounded to nearest even, as validation/megakernel/reference.py does.
#pragma once
#include "mk_device.cuh"

// Opcodes (MK_OP_MATMUL, ...) come from the op kinds' descriptions (mksim/workload/kinds.py),
// passed as -D flags by the runner: validation.megakernel.encode.opcode_defines().
#ifndef MK_OP_MATMUL
#error "compile with the opcode defines of validation.megakernel.encode.opcode_defines()"
#endif

#define MK_OPT_FUSED_NORM 1  // matmul: x = rmsnorm(in0) * w2 before the product
#define MK_OPT_RESIDUAL 2    // matmul: out = W x + in1
#define MK_OPT_MMA 4         // matmul on the tensor cores; W in fragment order (mk_kernel.cu)
#define MK_OPT_ROPE 8        // matmul epilogue: RoPE on the [q; k; v] rows, k and v appended to the KV cache
#define MK_OPT_SILU 16       // matmul epilogue: out = silu(gate) * up of the (gate, up) row pairs
#define MK_OPT_PAIRS (MK_OPT_ROPE | MK_OPT_SILU)  // an epilogue that takes the rows in pairs (mk_epilogue_pair)

// Keep in step with OP_FIELDS in validation/megakernel/program.py (a test compares the two).
struct MkOp {
    int kind, n_tiles, N, K;         // N: output elements per row; K: matmul input size / norm size
    int T, flag_base, opt, ld_out;   // T rows; first flag of this op; MK_OPT_*; output row stride
    int ld0, ld1, ld2, off1;         // input row strides; element offsets of in1 / in2
    int off2, hq, hkv, hd;           // attention: query heads, kv heads, head size
    int splits, kv_total, pos, s_max;// KV splits, tokens attended, new token position, cache rows
    float eps, scale, pad0, pad1;    // RMS-norm epsilon; attention score scale
    const int* bounds;               // tile boundaries (n_tiles + 1 elements)
    const mk_bf16* W;                // weights: matmul [N, K]; norm [N]; embedding table [vocab, N]
    const mk_bf16* w2;               // fused norm weight [K]
    const mk_bf16* in0;
    const mk_bf16* in1;
    const mk_bf16* in2;
    void* out;                       // bf16 [T, ld_out] (attention partials: fp32)
    mk_bf16* kc;                     // KV cache of this layer: [T, hkv, s_max, hd]
    mk_bf16* vc;
    const float* rope;               // cos[hd/2], sin[hd/2] at position pos
    const int* tokens;               // [T] token ids (embedding)
};

__device__ __forceinline__ mk_bf16 mk_f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (mk_bf16)0x7fc0;  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mk_bf16)(u >> 16);
}

__device__ __forceinline__ float mk_ld_bf16(const mk_bf16* p) {  // through L2: written by other SMs
    return mk_bf16_to_f32(__ldcg(reinterpret_cast<const unsigned short*>(p)));
}

__device__ __forceinline__ void mk_bar(int nw) { asm volatile("bar.sync 1, %0;" :: "r"(nw) : "memory"); }

__device__ __forceinline__ float mk_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum of squares of the n values at x (16-byte aligned, n a multiple of 8) over all workers;
// red: >= 32 floats of shared memory. 16-byte loads, up to 4 in flight per thread.
__device__ __forceinline__ float mk_row_sumsq(const mk_bf16* x, int n, int tid, int nw, float* red) {
    const uint4* x4 = reinterpret_cast<const uint4*>(x);
    float ss = 0.f;
    for (int i = tid; i < n / 8; i += 4 * nw) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = i + u * nw < n / 8 ? __ldcg(x4 + i + u * nw) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            float f[8];
            mk_unpack8(v[u], f);
#pragma unroll
            for (int e = 0; e < 8; ++e) ss = fmaf(f[e], f[e], ss);
        }
    }
    ss = mk_warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    mk_bar(nw);
    float t = 0.f;
    for (int w = 0; w < (nw >> 5); ++w) t += red[w];
    mk_bar(nw);
    return t;
}

// ---------------------------------------------------------------- embedding, norms, elementwise
__device__ void mk_embed(const MkOp& o, int lo, int hi, int tid, int nw) {
    mk_bf16* out = (mk_bf16*)o.out;
    for (int b = 0; b < o.T; ++b) {
        const mk_bf16* row = o.W + (size_t)o.tokens[b] * o.N;
        for (int e = lo + tid; e < hi; e += nw) out[(size_t)b * o.ld_out + e] = row[e];
    }
}

__device__ void mk_rmsnorm(const MkOp& o, int lo, int hi, int tid, int nw, float* red) {
    mk_bf16* out = (mk_bf16*)o.out;
    for (int b = 0; b < o.T; ++b) {
        const mk_bf16* x = o.in0 + (size_t)b * o.ld0;
        const float inv = rsqrtf(mk_row_sumsq(x, o.K, tid, nw, red) / o.K + o.eps);
        for (int e = lo + tid; e < hi; e += nw)
            out[(size_t)b * o.ld_out + e] = mk_f32_to_bf16(mk_bf16_to_f32(mk_f32_to_bf16(mk_ld_bf16(x + e) * inv)) *
                                                           mk_bf16_to_f32(o.W[e]));
    }
}

__device__ void mk_silu_mul(const MkOp& o, int lo, int hi, int tid, int nw) {
    mk_bf16* out = (mk_bf16*)o.out;
    for (int b = 0; b < o.T; ++b)
        for (int e = lo + tid; e < hi; e += nw) {
            const float g = mk_ld_bf16(o.in0 + (size_t)b * o.ld0 + e);
            const float u = mk_ld_bf16(o.in1 + (size_t)b * o.ld1 + o.off1 + e);
            out[(size_t)b * o.ld_out + e] = mk_f32_to_bf16(g / (1.f + __expf(-g)) * u);
        }
}

// Logit soft-capping (Gemma 2): cap * tanh(x / cap), the cap in o.scale.
__device__ void mk_softcap(const MkOp& o, int lo, int hi, int tid, int nw) {
    mk_bf16* out = (mk_bf16*)o.out;
    for (int b = 0; b < o.T; ++b)
        for (int e = lo + tid; e < hi; e += nw)
            out[(size_t)b * o.ld_out + e] = mk_f32_to_bf16(o.scale * tanhf(mk_ld_bf16(o.in0 + (size_t)b * o.ld0 + e) /
                                                                          o.scale));
}

// Element e of the [q; k; v] row b (three sources: one fused projection or three split ones).
__device__ __forceinline__ float mk_qkv_at(const MkOp& o, int b, int e) {
    const int Q = o.hq * o.hd, KV = o.hkv * o.hd;
    if (e < Q) return mk_ld_bf16(o.in0 + (size_t)b * o.ld0 + e);
    if (e < Q + KV) return mk_ld_bf16(o.in1 + (size_t)b * o.ld1 + o.off1 + e - Q);
    return mk_ld_bf16(o.in2 + (size_t)b * o.ld2 + o.off2 + e - Q - KV);
}

// RoPE (rotate-half) on the q and k heads of [lo, hi) (whole heads), the new k and v appended to
// the KV cache at position pos; the rotated row is also written to out (attention reads q there).
__device__ void mk_rope_kv(const MkOp& o, int lo, int hi, int tid, int nw) {
    mk_bf16* out = (mk_bf16*)o.out;
    const int D = o.hd, half = D / 2, Q = o.hq * D, KV = o.hkv * D;
    for (int b = 0; b < o.T; ++b)
        for (int e = lo + tid; e < hi; e += nw) {
            const int d = e % D;
            float v = mk_qkv_at(o, b, e);
            if (e < Q + KV) {
                const int j = d < half ? d : d - half;
                const float c = o.rope[j], s = o.rope[half + j];
                const float other = mk_qkv_at(o, b, d < half ? e + half : e - half);
                v = d < half ? v * c - other * s : v * c + other * s;
            }
            const mk_bf16 r = mk_f32_to_bf16(v);
            out[(size_t)b * o.ld_out + e] = r;
            if (e >= Q) {
                const int kv = e < Q + KV ? e - Q : e - Q - KV, h = kv / D;
                mk_bf16* cache = e < Q + KV ? o.kc : o.vc;
                cache[(((size_t)b * o.hkv + h) * o.s_max + o.pos) * D + d] = r;
            }
        }
}

// ---------------------------------------------------------------- matmul epilogues
// A fused matmul (MK_OPT_PAIRS) stores its weight rows so that each output pair of its epilogue
// lies on the adjacent rows (2r, 2r + 1) of a 16-row group (program.py: rope_pair_rows,
// silu_pair_rows); the matmul's flush hands every such pair of batch row b here, as fp32 sums
// (mk_epilogue_rows), and mk_epilogue_pair rounds them to the bf16 product (what the unfused op
// read) and stores the result. p: the pair's first weight row in the op (even).
//   MK_OPT_SILU: rows 2j, 2j + 1 are gate row j and up row j: out[j] = silu(g) * u, as mk_silu_mul.
//   MK_OPT_ROPE: in the q and k heads, rows 16i + 2r and 16i + 2r + 1 of a head hold its dims d
//   and d + hd / 2 with d = 8i + r: rotated as mk_rope_kv does and written to out at d and
//   d + hd / 2 of the head (attention reads q there), k and v also to the KV cache at position
//   pos; the v rows keep their order.
struct MkEpilogue {              // what an epilogue needs of its op (MkOp)
    mk_bf16* out;
    mk_bf16* kc;
    mk_bf16* vc;
    const float* rope;
    int opt, ld_out, hd, hq, hkv, s_max, pos;
};

__device__ __forceinline__ void mk_epilogue_pair(const MkEpilogue& o, int b, int p, float acc0, float acc1) {
    const float x0 = mk_bf16_to_f32(mk_f32_to_bf16(acc0)), x1 = mk_bf16_to_f32(mk_f32_to_bf16(acc1));
    mk_bf16* out = o.out + (size_t)b * o.ld_out;
    if (o.opt & MK_OPT_SILU) {
        out[p >> 1] = mk_f32_to_bf16(x0 / (1.f + __expf(-x0)) * x1);
        return;
    }
    const int D = o.hd, half = D >> 1, Q = o.hq * D, KV = o.hkv * D;
    int e0 = p, step = 1;  // the pair's elements of [q; k; v]: e0 and e0 + step
    float y0 = x0, y1 = x1;
    if (p < Q + KV) {
        const int w = p % D, d = ((w >> 4) << 3) + ((w & 15) >> 1);
        const float c = o.rope[d], s = o.rope[half + d];
        e0 = p - w + d;
        step = half;
        y0 = x0 * c - x1 * s;
        y1 = x1 * c + x0 * s;
    }
    const mk_bf16 r0 = mk_f32_to_bf16(y0), r1 = mk_f32_to_bf16(y1);
    out[e0] = r0;
    out[e0 + step] = r1;
    if (e0 >= Q) {  // k or v: the cache slot of the new token (both elements lie in one head)
        const bool is_k = e0 < Q + KV;
        const int kv = e0 - (is_k ? Q : Q + KV), h = kv / D, d0 = kv - h * D;
        mk_bf16* slot = (is_k ? o.kc : o.vc) + (((size_t)b * o.hkv + h) * o.s_max + o.pos) * D;
        slot[d0] = r0;
        slot[d0 + step] = r1;
    }
}

// Rows [r0, r1) (both even) of a fused matmul task whose rows start at weight row lo, for T batch
// rows: each pair's sums taken from (and cleared in) the row accumulators acc_s (row r of batch
// row b in slot b * R + r mod R, R a power of two) and handed to mk_epilogue_pair. Not inlined,
// and given only what the epilogue reads: the matmul's main loop keeps its registers.
__device__ __noinline__ void mk_epilogue_rows(const MkEpilogue o, int T, int lo, int r0, int r1, float* acc_s,
                                              int R, int tid, int nw) {
    const int h = (r1 - r0) >> 1;
    for (int i = tid; i < T * h; i += nw) {
        const int b = i / h, rr = r0 + 2 * (i - b * h);
        float* s0 = acc_s + b * R + (rr & (R - 1));
        float* s1 = acc_s + b * R + ((rr + 1) & (R - 1));
        const float v0 = *s0, v1 = *s1;
        *s0 = *s1 = 0.f;
        mk_epilogue_pair(o, b, lo + rr, v0, v1);
    }
}

// The epilogue fields of op o.
__device__ __forceinline__ MkEpilogue mk_epilogue_of(const MkOp& o) {
    return MkEpilogue{(mk_bf16*)o.out, o.kc, o.vc, o.rope, o.opt, o.ld_out, o.hd, o.hq, o.hkv, o.s_max, o.pos};
}

// ---------------------------------------------------------------- decode attention
// Partial i = (kv head g, sequence b, split c), g-major: the G = hq / hkv query heads of group g
// over cache positions [c * kv_total / splits, (c + 1) * kv_total / splits). Writes the
// unnormalised output o[G][D], the max m[G] and the sum of exponentials l[G]. A lane owns one
// position at a time (scores for 32 positions per warp step) and, while it loads its K row, copies
// its V row into the warp's rows of shared memory (cp.async); then the warp accumulates V with the
// probabilities broadcast by shuffles; warps are merged through shared memory (smem: G * D floats
// of pre-scaled queries, nw/32 * G * (D + 2) floats of warp partials, nw * D bf16 of V rows).
template <int D, int G>
__device__ void mk_attn_partial_one(const MkOp& o, int i, int tid, int nw, float* smem) {
    constexpr int E = D / 32;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nw >> 5;
    const int C = o.splits, g = i / (o.T * C), b = (i / C) % o.T, c = i % C;
    const int p0 = (int)((long long)c * o.kv_total / C), p1 = (int)((long long)(c + 1) * o.kv_total / C);
    float* qs = smem;
    float* part = smem + G * D;
    mk_bf16* vw = reinterpret_cast<mk_bf16*>(part + nwarps * G * (D + 2)) + warp * 32 * D;  // this warp's V rows
    const mk_bf16* qrow = o.in0 + (size_t)b * o.ld0 + g * G * D;
    for (int k = tid; k < G * D; k += nw) qs[k] = mk_ld_bf16(qrow + k) * o.scale;
    mk_bar(nw);
    const mk_bf16* Kc = o.kc + ((size_t)b * o.hkv + g) * o.s_max * D;
    const mk_bf16* Vc = o.vc + ((size_t)b * o.hkv + g) * o.s_max * D;
    float m[G], l[G], acc[G][E];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = MK_NEG_INF;
        l[h] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[h][e] = 0.f;
    }
    for (int cs = p0 + warp * 32; cs < p1; cs += nwarps * 32) {
        const int p = cs + lane;
        const bool valid = p < p1;
        if (valid) {  // this lane's V row into the warp's rows of vbuf, in flight with the K loads
            const unsigned dst = (unsigned)__cvta_generic_to_shared(vw + lane * D);
            const mk_bf16* src = Vc + (size_t)p * D;
#pragma unroll
            for (int v8 = 0; v8 < D / 8; ++v8)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst + 16 * v8), "l"(src + 8 * v8)
                             : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        float s[G];
#pragma unroll
        for (int h = 0; h < G; ++h) s[h] = 0.f;
        if (valid) {
            const uint4* kr = reinterpret_cast<const uint4*>(Kc + (size_t)p * D);
#pragma unroll
            for (int v8 = 0; v8 < D / 8; ++v8) {
                float f[8];
                mk_unpack8(__ldcg(kr + v8), f);
#pragma unroll
                for (int h = 0; h < G; ++h)
#pragma unroll
                    for (int e = 0; e < 8; ++e) s[h] = fmaf(qs[h * D + v8 * 8 + e], f[e], s[h]);
            }
        }
        float pr[G];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float sv = valid ? s[h] : MK_NEG_INF;
            const float mn = fmaxf(m[h], mk_warp_max(sv));
            const float corr = m[h] == MK_NEG_INF ? 0.f : __expf(m[h] - mn);
            pr[h] = valid ? __expf(sv - mn) : 0.f;
            l[h] = fmaf(l[h], corr, mk_warp_sum(pr[h]));
            m[h] = mn;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[h][e] *= corr;
        }
        // V rows of the 32 positions (already in shared memory), one position at a time
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();
        const int n = min(32, p1 - cs);
        for (int j = 0; j < n; ++j) {
            float v[E];
            const mk_bf16* vr = vw + j * D + lane * E;
            if (E == 4) {
                const uint2 vv = *reinterpret_cast<const uint2*>(vr);
                v[0] = __uint_as_float(vv.x << 16); v[1] = __uint_as_float(vv.x & 0xffff0000u);
                v[E - 2] = __uint_as_float(vv.y << 16); v[E - 1] = __uint_as_float(vv.y & 0xffff0000u);
            } else {
                const unsigned vv = *reinterpret_cast<const unsigned*>(vr);
                v[0] = __uint_as_float(vv << 16); v[E - 1] = __uint_as_float(vv & 0xffff0000u);
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {
                const float pj = __shfl_sync(0xffffffffu, pr[h], j);
#pragma unroll
                for (int e = 0; e < E; ++e) acc[h][e] = fmaf(pj, v[e], acc[h][e]);
            }
        }
        __syncwarp();  // the warp's V rows are read before the next positions overwrite them
    }
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float* row = part + (warp * G + h) * (D + 2);
#pragma unroll
        for (int e = 0; e < E; ++e) row[lane * E + e] = acc[h][e];
        if (lane == 0) { row[D] = m[h]; row[D + 1] = l[h]; }
    }
    mk_bar(nw);
    float* dst = (float*)o.out + (size_t)i * G * (D + 2);
    for (int k = tid; k < G * D; k += nw) {
        const int h = k / D, d = k % D;
        float M = MK_NEG_INF;
        for (int w = 0; w < nwarps; ++w) M = fmaxf(M, part[(w * G + h) * (D + 2) + D]);
        float L = 0.f, O = 0.f;
        for (int w = 0; w < nwarps; ++w) {
            const float* row = part + (w * G + h) * (D + 2);
            const float cw = row[D] == MK_NEG_INF ? 0.f : __expf(row[D] - M);
            O = fmaf(row[d], cw, O);
            L = fmaf(row[D + 1], cw, L);
        }
        dst[k] = O;
        if (d == 0) { dst[G * D + h] = M; dst[G * D + G + h] = L; }
    }
    mk_bar(nw);
}

// False when this build has no attention for the op's (head size, group) shape.
__device__ bool mk_attn_partial(const MkOp& o, int lo, int hi, int tid, int nw, float* smem) {
    const int G = o.hq / o.hkv;
    for (int i = lo; i < hi; ++i) {
        if (o.hd == 64 && G == 4) mk_attn_partial_one<64, 4>(o, i, tid, nw, smem);
        else if (o.hd == 128 && G == 4) mk_attn_partial_one<128, 4>(o, i, tid, nw, smem);
        else if (o.hd == 128 && G == 3) mk_attn_partial_one<128, 3>(o, i, tid, nw, smem);
        else if (o.hd == 64 && G == 8) mk_attn_partial_one<64, 8>(o, i, tid, nw, smem);
        else return false;
    }
    return true;
}

// Reduction i = (kv head g, sequence b): merge the splits' partials into the G heads' output.
__device__ void mk_attn_reduce(const MkOp& o, int lo, int hi, int tid, int nw) {
    const int D = o.hd, G = o.hq / o.hkv, C = o.splits, stride = G * (D + 2);
    const float* parts = reinterpret_cast<const float*>(o.in0);
    mk_bf16* out = (mk_bf16*)o.out;
    for (int i = lo; i < hi; ++i) {
        const int g = i / o.T, b = i % o.T;
        const float* base = parts + (size_t)i * C * stride;
        for (int k = tid; k < G * D; k += nw) {
            const int h = k / D;
            float M = MK_NEG_INF;
            for (int c = 0; c < C; ++c) M = fmaxf(M, __ldcg(base + c * stride + G * D + h));
            float L = 0.f, O = 0.f;
            for (int c = 0; c < C; ++c) {
                const float* pc = base + c * stride;
                const float mc = __ldcg(pc + G * D + h);
                const float w = mc == MK_NEG_INF ? 0.f : __expf(mc - M);
                O = fmaf(__ldcg(pc + k), w, O);
                L = fmaf(__ldcg(pc + G * D + G + h), w, L);
            }
            out[(size_t)b * o.ld_out + g * G * D + k] = mk_f32_to_bf16(O / L);
        }
    }
}

// ---------------------------------------------------------------- dispatch
// The ops whose device function needs nothing of the block but its workers and the reduction
// scratch red (>= 32 floats): a new op kind adds its function above and its case here. False:
// not one of them (mk_run_task in mk_kernel.cu runs the matmul and attention partials, which use
// the block's weight pages and input region).
__device__ __forceinline__ bool mk_run_worker_op(const MkOp& o, int opcode, int lo, int hi, int tid, int nw,
                                                 float* red) {
    switch (opcode) {
    case MK_OP_EMBED: mk_embed(o, lo, hi, tid, nw); return true;
    case MK_OP_RMSNORM: mk_rmsnorm(o, lo, hi, tid, nw, red); return true;
    case MK_OP_ROPE_KV: mk_rope_kv(o, lo, hi, tid, nw); return true;
    case MK_OP_ATTN_REDUCE: mk_attn_reduce(o, lo, hi, tid, nw); return true;
    case MK_OP_SILU_MUL: mk_silu_mul(o, lo, hi, tid, nw); return true;
    case MK_OP_SOFTCAP: mk_softcap(o, lo, hi, tid, nw); return true;
    default: return false;
    }
}
