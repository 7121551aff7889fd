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
#define MK_OPT_REDUCE 32     // matmul prologue: the input rows merged from the attention partials at in0 (mk_load_x_reduce)
#define MK_OPT_KCHUNK 256    // matmul: input rows held off2 (Kc) inputs at a time, W stored chunk by chunk (mk_matmul_kc)
// rope_kv's opt: RMS norms of q and k before the rotation (mk_rope_kv_norm), weights W (q) and w2 (k)
#define MK_ROPE_NORM_HEAD 1  // over each head (Qwen3): weights of hd
#define MK_ROPE_NORM_ALL 2   // over the token's whole q and whole k (OLMoE, OLMo 2): weights of hq hd and hkv hd

// Keep in step with OP_FIELDS in validation/megakernel/program.py (a test compares the two).
struct MkOp {
    int kind, n_tiles, N, K;         // N: output elements per row; K: matmul input size / norm size
    int T, flag_base, opt, ld_out;   // T rows; first flag of this op; MK_OPT_*; output row stride
    int ld0, ld1, ld2, off1;         // input row strides; element offsets of in1 / in2
    int off2, hq, hkv, hd;           // attention: query heads, kv heads, head size (off2 of an expert matmul: its top-k's op)
    int splits, kv_total, pos, s_max;// KV splits, tokens attended, new token position, cache rows
    float eps, scale, pad0, pad1;    // RMS-norm epsilon; attention score scale
    const int* bounds;               // tile boundaries (n_tiles + 1 elements)
    const mk_bf16* W;                // weights: matmul [N, K]; norm [N]; embedding table [vocab, N]
    const mk_bf16* w2;               // fused norm weight [K]
    const mk_bf16* in0;              // (MK_OPT_REDUCE: the attention partials, fp32, ld0 floats a partial)
    const mk_bf16* in1;
    const mk_bf16* in2;
    void* out;                       // bf16 [T, ld_out] (attention partials: fp32)
    mk_bf16* kc;                     // KV cache of this layer: [T, hkv, s_max, hd]
    mk_bf16* vc;
    const float* rope;               // cos[hd/2], sin[hd/2] at position pos
    const int* tokens;               // [T] token ids (embedding)
    const mk_bf16* bias;             // matmul: a bias per weight row, in the rows' stored order (null: none)
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

// mk_rope_kv with the RMS norms of q and k first (MK_ROPE_NORM_*, as the workload's rope_kv does
// them: the norm needs the whole head, or the whole q / k, before the rotation): each q or k value
// becomes bf16(bf16(x inv) w), as mk_rmsnorm makes it, and is rotated from there. A warp takes a
// head of one row at a time: over the head (HEAD) its lanes sum the squares and shuffle the sum;
// over all of q and k (ALL) the block sums them once per row first (the op waits for the whole
// projection). The v heads are copied to out and the cache as mk_rope_kv does.
__device__ void mk_rope_kv_norm(const MkOp& o, int lo, int hi, int tid, int nw, float* red) {
    mk_bf16* out = (mk_bf16*)o.out;
    const int D = o.hd, half = D / 2, Q = o.hq * D, KV = o.hkv * D, lane = tid & 31, nwarps = nw >> 5;
    const bool all = o.opt & MK_ROPE_NORM_ALL;
    for (int b = 0; b < o.T; ++b) {
        float inv_q = 0.f, inv_k = 0.f;
        if (all) {  // every worker: mk_row_sumsq synchronises them
            inv_q = rsqrtf(mk_row_sumsq(o.in0 + (size_t)b * o.ld0, Q, tid, nw, red) / Q + o.eps);
            inv_k = rsqrtf(mk_row_sumsq(o.in1 + (size_t)b * o.ld1 + o.off1, KV, tid, nw, red) / KV + o.eps);
        }
        mk_bf16* row = out + (size_t)b * o.ld_out;
        for (int h = lo / D + (tid >> 5); h < hi / D; h += nwarps) {  // tiles are whole heads
            const int e0 = h * D;
            if (e0 >= Q + KV) {  // a v head: to out and the cache slot
                mk_bf16* slot = o.vc + (((size_t)b * o.hkv + (e0 - Q - KV) / D) * o.s_max + o.pos) * D;
                for (int d = lane; d < D; d += 32) row[e0 + d] = slot[d] = mk_f32_to_bf16(mk_qkv_at(o, b, e0 + d));
                continue;
            }
            const bool is_q = e0 < Q;
            float inv = is_q ? inv_q : inv_k;
            if (!all) {
                float ss = 0.f;
                for (int d = lane; d < D; d += 32) {
                    const float x = mk_qkv_at(o, b, e0 + d);
                    ss = fmaf(x, x, ss);
                }
                inv = rsqrtf(mk_warp_sum(ss) / D + o.eps);
            }
            const mk_bf16* w = (is_q ? o.W : o.w2) + (all ? (is_q ? e0 : e0 - Q) : 0);
            mk_bf16* slot = is_q ? nullptr : o.kc + (((size_t)b * o.hkv + (e0 - Q) / D) * o.s_max + o.pos) * D;
            for (int d = lane; d < half; d += 32) {
                const float n0 = mk_bf16_to_f32(mk_f32_to_bf16(mk_qkv_at(o, b, e0 + d) * inv));
                const float n1 = mk_bf16_to_f32(mk_f32_to_bf16(mk_qkv_at(o, b, e0 + d + half) * inv));
                const float x0 = mk_bf16_to_f32(mk_f32_to_bf16(n0 * mk_bf16_to_f32(w[d])));
                const float x1 = mk_bf16_to_f32(mk_f32_to_bf16(n1 * mk_bf16_to_f32(w[d + half])));
                const float c = o.rope[d], s = o.rope[half + d];
                const mk_bf16 r0 = mk_f32_to_bf16(x0 * c - x1 * s), r1 = mk_f32_to_bf16(x1 * c + x0 * s);
                row[e0 + d] = r0;
                row[e0 + d + half] = r1;
                if (slot) {
                    slot[d] = r0;
                    slot[d + half] = r1;
                }
            }
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
    const mk_bf16* bias;         // the op's bias (rows in stored order), added before the rounding; null: none
    int opt, ld_out, hd, hq, hkv, s_max, pos;
};

__device__ __forceinline__ void mk_epilogue_pair(const MkEpilogue& o, int b, int p, float acc0, float acc1) {
    if (o.bias) {  // the projection's bias (Qwen2's q, k, v): part of the product the unfused op stored
        acc0 += mk_bf16_to_f32(o.bias[p]);
        acc1 += mk_bf16_to_f32(o.bias[p + 1]);
    }
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

// One pair through the epilogue, not inlined (the MK_MM=2 flush's call: its registers stay).
__device__ __noinline__ void mk_epilogue_one(const MkEpilogue o, int b, int p, float v0, float v1) {
    mk_epilogue_pair(o, b, p, v0, v1);
}

// The epilogue fields of op o.
__device__ __forceinline__ MkEpilogue mk_epilogue_of(const MkOp& o) {
    return MkEpilogue{(mk_bf16*)o.out, o.kc, o.vc, o.rope, o.bias, o.opt, o.ld_out, o.hd, o.hq, o.hkv, o.s_max, o.pos};
}

// ---------------------------------------------------------------- decode attention
// Partial i = (kv head g, sequence b, split c), g-major: the G = hq / hkv query heads of group g
// over cache positions [w0 + c * n / splits, w0 + (c + 1) * n / splits), n = kv_total - w0 the
// positions attended: all of them (w0 = 0), or with a sliding window the last o.K (mk_attn_first).
// Writes the unnormalised output o[G][D], the max m[G] and the sum of exponentials l[G] (fp32,
// G (D + 2) floats a partial); the reduction merges a head's splits into its bf16 output row.
//
// The (head size, group) the partials are built for: the plan's (MK_ATTN_HD, MK_ATTN_G, passed by
// the runner: program.attn_defines), one template instance, so that a build compiles what its
// model runs; without them the four shapes of the built-in models before any other was built.
//
// MK_ATTN (-DMK_ATTN=..., through MKSIM_KERNEL_DEFINES) picks the device functions:
//   1  a lane per position on the CUDA cores, 32 positions per warp;
//   2  (the default) the scores and the weighted V sum on the tensor cores, 16 positions per warp
//      step with every warp busy, the K and V loads issued before anything waits; the reduction
//      with all of its loads in flight at once. First measured slower (validation/results/evidence/
//      h200-mk18-ab): ptxas had outlined mk_run_task and spilled in it. With mk_run_task inlined
//      (mk_kernel.cu) a partial takes half the time and the step 4-13 % less
//      (validation/results/evidence/h200-mk18-noinline).
#ifndef MK_ATTN
#define MK_ATTN 2
#endif
#if MK_ATTN != 1 && MK_ATTN != 2
#error "MK_ATTN must be 1 (a lane per position) or 2 (tensor cores)"
#endif
#if defined(MK_ATTN_HD) != defined(MK_ATTN_G)
#error "give both MK_ATTN_HD and MK_ATTN_G (program.attn_defines), or neither"
#endif

// The first cache position the partials read: a sliding window of o.K positions (the last o.K of
// the kv_total, the new token's included), or 0 (o.K 0, or a window that holds them all).
__device__ __forceinline__ int mk_attn_first(const MkOp& o) { return o.K > 0 && o.K < o.kv_total ? o.kv_total - o.K : 0; }

#if MK_ATTN == 1
// A lane owns one position at a time (scores for 32 positions per warp step) and, while it loads
// its K row, copies its V row into the warp's rows of shared memory (cp.async); then the warp
// accumulates V with the probabilities broadcast by shuffles; warps are merged through shared
// memory (smem: G * D floats of pre-scaled queries, nw/32 * G * (D + 2) floats of warp partials,
// nw * D bf16 of V rows).
template <int D, int G>
__device__ void mk_attn_partial_one(const MkOp& o, int i, int tid, int nw, float* smem) {
    constexpr int E = D / 32;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nw >> 5;
    static_assert(E == 2 || E == 4, "a lane per position: head sizes 64 and 128");
    const int C = o.splits, g = i / (o.T * C), b = (i / C) % o.T, c = i % C;
    const int w0 = mk_attn_first(o), n = o.kv_total - w0;
    const int p0 = w0 + (int)((long long)c * n / C), p1 = w0 + (int)((long long)(c + 1) * n / C);
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

#else  // MK_ATTN == 2
// mma.sync m16n8k16, bf16 in, fp32 accumulate (lane 4g + t): a0 = A[g][2t, 2t + 1],
// a1 = A[g + 8][2t, 2t + 1], a2 = A[g][2t + 8, 2t + 9], a3 = A[g + 8][2t + 8, 2t + 9];
// b0 = B[2t, 2t + 1][g], b1 = B[2t + 8, 2t + 9][g] (the lower 16 bits the first); d[0], d[1] =
// D[g][2t, 2t + 1], d[2], d[3] = D[g + 8][2t, 2t + 1].
__device__ __forceinline__ void mk_attn_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8 x 8 matrices of 16-bit values from shared memory: lane 8j + r gives the address of row r
// of matrix j (16 bytes); lane 4g + t receives row g, columns 2t, 2t + 1 of matrix j in r_j, or
// with .trans column g, rows 2t, 2t + 1.
__device__ __forceinline__ void mk_ldsm4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void mk_ldsm4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// An 8 x 8 matrix of 16-bit values transposed across the warp: lane 4r + q holds row r, columns
// 2q and 2q + 1 (the lower 16 bits the first), before and after.
__device__ __forceinline__ unsigned mk_movt(unsigned x) {
    unsigned y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

// (x0, x1) as bf16 pairs hi + lo (nearest even; x0 in the lower 16 bits): hi + lo holds x to about
// 16 bits, so that probabilities multiplied on the tensor cores lose nothing against fp32.
__device__ __forceinline__ void mk_split_bf16x2(float x0, float x1, unsigned& hi, unsigned& lo) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(hi) : "f"(x1), "f"(x0));
    const float r0 = x0 - __uint_as_float(hi << 16), r1 = x1 - __uint_as_float(hi & 0xffff0000u);
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(lo) : "f"(r1), "f"(r0));
}

// 16 bytes global -> shared, in flight until cp.async.wait; zeros instead when !ok.
__device__ __forceinline__ void mk_cp16(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}

// bytes (a multiple of 16) at p (16-byte aligned) on their way into L2, 32 KiB a request.
__device__ __forceinline__ void mk_prefetch_l2(const mk_bf16* p, long long bytes) {
    for (long long off = 0; off < bytes; off += 32768) {
        const unsigned n = bytes - off < 32768 ? (unsigned)(bytes - off) : 32768u;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                     :: "l"(reinterpret_cast<const char*>(p) + off), "r"(n) : "memory");
    }
}

// The cache rows of partial i: this head's K and V (row 0), the positions [p0, p1).
struct MkAttnSpan {
    const mk_bf16* K;
    const mk_bf16* V;
    int p0, p1, b, g;
};

template <int D>
__device__ __forceinline__ MkAttnSpan mk_attn_span(const MkOp& o, int i) {
    const int C = o.splits, g = i / (o.T * C), b = (i / C) % o.T, c = i % C;
    const size_t row0 = ((size_t)b * o.hkv + g) * o.s_max;
    const int w0 = mk_attn_first(o), n = o.kv_total - w0;
    return {o.kc + row0 * D, o.vc + row0 * D, w0 + (int)((long long)c * n / C), w0 + (int)((long long)(c + 1) * n / C),
            b, g};
}

// Shared memory of the partials: per worker warp a K tile and a V tile (16 rows of D bf16 each,
// rows MK_TILE_ROW_B<D> bytes apart; the warp's partial o[G][D + 4] overwrites them at the end);
// then q (G rows of D / 2 + 4 words: the words lanes 4g + t read together lie in different banks),
// m[nwarps][G] and l[nwarps][G]. program.x_region_bytes (sized for MK_ATTN 1) is larger for every
// G <= 8 (tests/validation/test_attn_mapping.py). A tile row is padded by 16 bytes: the 8 rows an
// ldmatrix reads lie in 8 different bank groups, and a fragment's offset is a constant.
template <int D>
constexpr int MK_TILE_ROW_B = 2 * D + 16;
template <int D>
constexpr int MK_ATTN_WARP_B = 2 * 16 * MK_TILE_ROW_B<D>;

template <int D, int G>
__host__ __device__ constexpr int mk_attn_smem_bytes(int nwarps) {
    return nwarps * MK_ATTN_WARP_B<D> + G * (D / 2 + 4) * 4 + 2 * nwarps * G * 4;
}

// cp.async of the K and V rows of positions P .. P + 15 into the warp's tiles (ks, vs = ks + tile);
// rows at or past p1 become zeros (their scores are masked, and a zero V row adds nothing). The
// tile's 16 D / 8 chunks of 16 bytes go to the lanes in order: chunk q = lane + 32 k is chunk
// q % CH of row q / CH, so consecutive lanes read adjacent 16 bytes (where 32 is a multiple of CH,
// lane l copies chunk l % CH of rows l / CH + (32 / CH) k, as before any other head size was built).
template <int D>
__device__ __forceinline__ void mk_attn_stage(const MkAttnSpan& a, int P, unsigned ks, int lane) {
    constexpr int CH = D / 8;  // 16-byte chunks a row
    static_assert(D % 16 == 0, "a tile of whole 16-element k-steps");
    constexpr bool RS = 32 % CH == 0;  // whole rows a round: lane l's chunk is l % CH of every round
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {  // 16 CH / 32 rounds of the warp's lanes
        const int q = lane + 32 * k, r = RS ? lane / CH + 32 / CH * k : q / CH, c = RS ? lane % CH : q - r * CH;
        const int p = P + r;
        const bool ok = p < a.p1;
        const size_t src = (size_t)min(p, a.p1 - 1) * D + 8 * c;  // a row of the split, read or not
        const unsigned dst = ks + r * MK_TILE_ROW_B<D> + 16 * c;
        mk_cp16(dst, a.K + src, ok);
        mk_cp16(dst + 16 * MK_TILE_ROW_B<D>, a.V + src, ok);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Warp w takes the 16-position steps w, w + nw/32, ... of the partial (64 positions: 4 warps, one
// step each; 205: 13 steps over all 8 warps). Its K and V rows go to its tiles by cp.async before
// anything else; then q into shared memory and a barrier, passed long before the rows arrive from
// DRAM; the rows of later rounds and of the task's next partial are prefetched into L2. A step:
//   S^T = K Q^T on the tensor cores: A = the K tile (rows: positions, by ldmatrix), B = q (columns:
//     heads, those >= G zero); lane 4g + t gets heads 2t, 2t + 1 at positions P + g and P + 8 + g;
//   the online softmax in fp32 (__expf) in registers, the max over positions by 3 shuffles;
//   O^T += V^T P^T: A = the V tile transposed (ldmatrix .trans), B = the probabilities transposed
//     8 x 8 by movmatrix, as bf16 hi + lo pairs (two mma); lane 4g + t accumulates heads 2t, 2t + 1
//     at elements 16 dd + g and 16 dd + 8 + g.
// The warps merge through shared memory with one barrier (and one more between two partials of a
// task, before the next copies overwrite the tiles).
template <int D, int G>
__device__ void mk_attn_partial_tc(const MkOp& o, int i, int next, int tid, int nw, float* smem) {
    static_assert(D % 16 == 0 && G >= 1 && G <= 8 && G * (D + 4) * 4 <= MK_ATTN_WARP_B<D>, "head size and group");
    constexpr int KD = D / 16, R = D + 4, TILE = 16 * MK_TILE_ROW_B<D>, QS = D / 2 + 4;
    // KD: k-steps; R: row stride of a warp's partial (floats); TILE: bytes; QS: row stride of q (words)
    const int lane = tid & 31, warp = tid >> 5, nwarps = nw >> 5, g = lane >> 2, t = lane & 3, r8 = lane & 7;
    const MkAttnSpan a = mk_attn_span<D>(o, i);
    const int nsteps = (a.p1 - a.p0 + 15) >> 4;
    unsigned char* base = reinterpret_cast<unsigned char*>(smem);
    unsigned char* mine = base + (size_t)warp * MK_ATTN_WARP_B<D>;
    const unsigned ks = (unsigned)__cvta_generic_to_shared(mine);
    // this lane's row address for ldmatrix (matrix j = lane / 8: rows 8 (j & 1) + lane % 8, chunk j / 2
    // of each 16 head elements), in the K tile; the V tile's is TILE further
    const int j8 = lane >> 3;
    const unsigned kq = ks + (r8 + 8 * (j8 & 1)) * MK_TILE_ROW_B<D> + 16 * (j8 >> 1);
    if (warp < nsteps) mk_attn_stage<D>(a, a.p0 + 16 * warp, ks, lane);
    // then q (the group's G heads: G D / 2 words) into shared memory, two words a thread in flight
    unsigned* qs = reinterpret_cast<unsigned*>(base + (size_t)nwarps * MK_ATTN_WARP_B<D>);
    const unsigned* qw = reinterpret_cast<const unsigned*>(o.in0 + (size_t)a.b * o.ld0 + (size_t)a.g * G * D);
    for (int k0 = 0; k0 < G * D / 2; k0 += 2 * nw) {
        const int ka = k0 + tid, kb = ka + nw;
        const unsigned wa = ka < G * D / 2 ? __ldcg(qw + ka) : 0u, wb = kb < G * D / 2 ? __ldcg(qw + kb) : 0u;
        if (ka < G * D / 2) qs[(ka / (D / 2)) * QS + ka % (D / 2)] = wa;
        if (kb < G * D / 2) qs[(kb / (D / 2)) * QS + kb % (D / 2)] = wb;
    }
    if (tid == 0) {  // rows past the first round of steps, and the next partial's, into L2 meanwhile
        const int r = a.p0 + 16 * nwarps;
        if (r < a.p1) {
            mk_prefetch_l2(a.K + (size_t)r * D, (long long)(a.p1 - r) * D * 2);
            mk_prefetch_l2(a.V + (size_t)r * D, (long long)(a.p1 - r) * D * 2);
        }
        if (next >= 0) {
            const MkAttnSpan n = mk_attn_span<D>(o, next);
            mk_prefetch_l2(n.K + (size_t)n.p0 * D, (long long)(n.p1 - n.p0) * D * 2);
            mk_prefetch_l2(n.V + (size_t)n.p0 * D, (long long)(n.p1 - n.p0) * D * 2);
        }
    }
    mk_bar(nw);  // q is in shared memory (long before the K and V rows arrive from DRAM)
    const unsigned* qg = qs + min(g, G - 1) * QS + t;  // head g: b0 = words 8kk + t, b1 = 8kk + 4 + t (g < G)
    float m[2] = {MK_NEG_INF, MK_NEG_INF}, l[2] = {0.f, 0.f}, acc[KD][4];
#pragma unroll
    for (int dd = 0; dd < KD; ++dd) acc[dd][0] = acc[dd][1] = acc[dd][2] = acc[dd][3] = 0.f;
    for (int P = a.p0 + 16 * warp; P < a.p1; P += 16 * nwarps) {  // the warp's steps
        asm volatile("cp.async.wait_all;" ::: "memory");
        __syncwarp();  // every lane's copies are in the tiles
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {  // a0..a3: positions 0-7 / 8-15 x elements 16kk .. + 7 / 16kk + 8 .. + 15
            unsigned a0, a1, a2, a3;
            mk_ldsm4(kq + 32 * kk, a0, a1, a2, a3);
            const unsigned b0 = g < G ? qg[8 * kk] : 0u, b1 = g < G ? qg[8 * kk + 4] : 0u;
            mk_attn_mma(sc, a0, a1, a2, a3, b0, b1);
        }
        // sc: heads 2t, 2t + 1 at position P + g (0, 1) and P + 8 + g (2, 3)
        const bool v0 = P + g < a.p1, v1 = P + 8 + g < a.p1;
        const float x0 = v0 ? sc[0] * o.scale : MK_NEG_INF, x1 = v0 ? sc[1] * o.scale : MK_NEG_INF;
        const float x2 = v1 ? sc[2] * o.scale : MK_NEG_INF, x3 = v1 ? sc[3] * o.scale : MK_NEG_INF;
        float mx0 = fmaxf(x0, x2), mx1 = fmaxf(x1, x3);
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, sh));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, sh));
        }
        const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);  // finite: position P is in the split
        const float c0 = m[0] == MK_NEG_INF ? 0.f : __expf(m[0] - mn0);
        const float c1 = m[1] == MK_NEG_INF ? 0.f : __expf(m[1] - mn1);
        const float e0 = __expf(x0 - mn0), e1 = __expf(x1 - mn1), e2 = __expf(x2 - mn0), e3 = __expf(x3 - mn1);
        l[0] = fmaf(l[0], c0, e0 + e2);  // this lane's two positions; summed over g below
        l[1] = fmaf(l[1], c1, e1 + e3);
        m[0] = mn0;
        m[1] = mn1;
        unsigned h0, lo0, h1, lo1;
        mk_split_bf16x2(e0, e1, h0, lo0);  // row g of P^T, positions 0-7: heads 2t, 2t + 1
        mk_split_bf16x2(e2, e3, h1, lo1);  // positions 8-15
        const unsigned bh0 = mk_movt(h0), bh1 = mk_movt(h1), bl0 = mk_movt(lo0), bl1 = mk_movt(lo1);
#pragma unroll
        for (int dd = 0; dd < KD; ++dd) {  // transposed: a0, a2 (sic), a1, a3 = elements 16dd .. + 7 / + 8 .. + 15
            unsigned a0, a1, a2, a3;     // x positions 0-7 / 8-15
            mk_ldsm4_t(kq + TILE + 32 * dd, a0, a2, a1, a3);
            acc[dd][0] *= c0;
            acc[dd][1] *= c1;
            acc[dd][2] *= c0;
            acc[dd][3] *= c1;
            mk_attn_mma(acc[dd], a0, a1, a2, a3, bh0, bh1);
            mk_attn_mma(acc[dd], a0, a1, a2, a3, bl0, bl1);
        }
        if (P + 16 * nwarps < a.p1) {
            __syncwarp();  // the tiles are read before the warp's next step overwrites them
            mk_attn_stage<D>(a, P + 16 * nwarps, ks, lane);
        }
    }
#pragma unroll
    for (int sh = 4; sh < 32; sh <<= 1) {
        l[0] += __shfl_xor_sync(0xffffffffu, l[0], sh);
        l[1] += __shfl_xor_sync(0xffffffffu, l[1], sh);
    }
    const int nact = min(nwarps, nsteps);  // the warps that took a step
    float* pm = reinterpret_cast<float*>(qs + G * QS);
    float* pl = pm + nwarps * G;
    __syncwarp();  // the tiles are read before the partial overwrites them
    if (warp < nact) {  // acc[dd][e], acc[dd][2 + e]: head 2t + e, elements 16 dd + g and 16 dd + 8 + g
        float* rows = reinterpret_cast<float*>(mine);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int h = 2 * t + e;
            if (h < G) {
#pragma unroll
                for (int dd = 0; dd < KD; ++dd) {
                    rows[h * R + 16 * dd + g] = acc[dd][e];
                    rows[h * R + 16 * dd + 8 + g] = acc[dd][2 + e];
                }
                if (g == 0) {
                    pm[warp * G + h] = m[e];
                    pl[warp * G + h] = l[e];
                }
            }
        }
    }
    mk_bar(nw);
    float* dst = (float*)o.out + (size_t)i * G * (D + 2);
    for (int it = tid; it < G * D / 2; it += nw) {  // two elements a thread
        const int h = it / (D / 2), d = 2 * (it - h * (D / 2));
        float M = MK_NEG_INF;
#pragma unroll 2  // (fully unrolled, the persistent kernel spills a register)
        for (int w = 0; w < nact; ++w) M = fmaxf(M, pm[w * G + h]);
        float2 O = make_float2(0.f, 0.f);
        float L = 0.f;
#pragma unroll 2
        for (int w = 0; w < nact; ++w) {
            const float mw = pm[w * G + h], cw = mw == MK_NEG_INF ? 0.f : __expf(mw - M);
            const float2 v = *reinterpret_cast<const float2*>(
                reinterpret_cast<const float*>(base + (size_t)w * MK_ATTN_WARP_B<D>) + h * R + d);
            O.x = fmaf(v.x, cw, O.x);
            O.y = fmaf(v.y, cw, O.y);
            L = fmaf(pl[w * G + h], cw, L);
        }
        *reinterpret_cast<float2*>(dst + h * D + d) = O;
        if (d == 0) {
            dst[G * D + h] = M;
            dst[G * D + G + h] = L;
        }
    }
    if (next >= 0) mk_bar(nw);  // the partials are read before the next partial's copies overwrite them
}

template <int D, int G>
__device__ __forceinline__ void mk_attn_partial_at(const MkOp& o, int i, int hi, int tid, int nw, float* smem) {
    mk_attn_partial_tc<D, G>(o, i, i + 1 < hi ? i + 1 : -1, tid, nw, smem);
}
#endif  // MK_ATTN

// The partials [lo, hi) of one task; smem: the scratch region (program.x_region_bytes). False when
// this build has no attention for the op's (head size, group) shape.
// MK_ATTN_NOINLINE (default 0): 1 makes the partials a function of their own (an experiment).
// The persistent kernel sits at the 168 registers that 384 threads a block allow; any call in it
// costs more than it saves: not inlined, the partials do not spill, but the matmul's tasks take
// 11-12 % longer and the step 7-10 % (validation/results/evidence/h200-mk18-noinline). NW, the
// worker threads, is a template argument so that the partials keep it as a constant either way.
#ifndef MK_ATTN_NOINLINE
#define MK_ATTN_NOINLINE 0
#endif
#if MK_ATTN_NOINLINE
#define MK_ATTN_FN __device__ __noinline__
#else
#define MK_ATTN_FN __device__
#endif
template <int NW>
MK_ATTN_FN bool mk_attn_partial(const MkOp& o, int lo, int hi, int tid, float* smem) {
    constexpr int nw = NW;
    const int G = o.hq / o.hkv;
    for (int i = lo; i < hi; ++i) {
#if MK_ATTN == 1
#define MK_ATTN_CASE(D_, G_) mk_attn_partial_one<D_, G_>(o, i, tid, nw, smem)
#else
#define MK_ATTN_CASE(D_, G_) mk_attn_partial_at<D_, G_>(o, i, hi, tid, nw, smem)
#endif
#if defined(MK_ATTN_HD)
        if (o.hd == MK_ATTN_HD && G == MK_ATTN_G) MK_ATTN_CASE(MK_ATTN_HD, MK_ATTN_G);
        else return false;
#else
        if (o.hd == 64 && G == 4) MK_ATTN_CASE(64, 4);
        else if (o.hd == 128 && G == 4) MK_ATTN_CASE(128, 4);
        else if (o.hd == 128 && G == 3) MK_ATTN_CASE(128, 3);
        else if (o.hd == 64 && G == 8) MK_ATTN_CASE(64, 8);
        else return false;
#endif
#undef MK_ATTN_CASE
    }
    return true;
}

// Elements k, k + 1 (k even) of the G D outputs of one reduction (head h = k / D), merged over its
// C splits' partials (split c's at base + c * stride floats: o[G][D], then m[G] at GD = G D, then
// l[G]), as the bf16 pair (k in the low half) out = sum_c o_c w_c / sum_c l_c w_c, w_c =
// exp(m_c - max_c m_c). Called by whole warps whose lanes hold 64 adjacent elements of one head.
// Splits come 16 at a time: lanes 0..15 load one split's m and l each, every lane its 16 splits'
// two elements, all in flight together; the warp's max and sum go by shuffles and each split's
// weight from its lane. More than 16 splits: an online merge of the groups of 16. The reduction
// (mk_attn_reduce) and a matmul that merges its input rows (MK_OPT_REDUCE) both make their
// outputs here, so that the two give the same bits.
__device__ __forceinline__ unsigned mk_reduce_pair(const float* base, int stride, int GD, int G, int h, int k, int C,
                                                   int lane) {
    constexpr int CB = 16;
    float M = MK_NEG_INF, L = 0.f, O0 = 0.f, O1 = 0.f;
    for (int c0 = 0; c0 < C; c0 += CB) {
        const int c = c0 + lane;
        const bool mine = lane < CB && c < C;
        const float mc = mine ? __ldcg(base + (size_t)c * stride + GD + h) : MK_NEG_INF;
        const float lc = mine ? __ldcg(base + (size_t)c * stride + GD + G + h) : 0.f;
        float2 ov[CB];
#pragma unroll
        for (int j = 0; j < CB; ++j)
            ov[j] = c0 + j < C ? __ldcg(reinterpret_cast<const float2*>(base + (size_t)(c0 + j) * stride + k))
                               : make_float2(0.f, 0.f);
        const float mn = fmaxf(M, mk_warp_max(mc));
        const float corr = M == MK_NEG_INF ? 0.f : __expf(M - mn);
        const float w = mc == MK_NEG_INF ? 0.f : __expf(mc - mn);
        L = fmaf(L, corr, mk_warp_sum(lc * w));
        O0 *= corr;
        O1 *= corr;
#pragma unroll
        for (int j = 0; j < CB; ++j) {
            const float wj = __shfl_sync(0xffffffffu, w, j);
            O0 = fmaf(ov[j].x, wj, O0);
            O1 = fmaf(ov[j].y, wj, O1);
        }
        M = mn;
    }
    return (unsigned)mk_f32_to_bf16(O0 / L) | ((unsigned)mk_f32_to_bf16(O1 / L) << 16);
}

// Reduction i = (kv head g, sequence b): merge the splits' partials into the G heads' output.
#if MK_ATTN == 1
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
#else
// A thread takes two adjacent elements of one head (a warp: 64 elements of that head; mk_reduce_pair
// needs a warp's lanes in one head): a head takes HW = ceil(D / 64) x 32 threads, those past its D
// elements (D not a multiple of 64: 80, 96) merging its first pair again and storing nothing. For
// D a multiple of 64 thread it takes elements 2 it, as before other head sizes were built.
__device__ void mk_attn_reduce(const MkOp& o, int lo, int hi, int tid, int nw) {
    const int D = o.hd, G = o.hq / o.hkv, C = o.splits, stride = G * (D + 2), HW = (D + 63) / 64 * 32;
    const int per = G * HW, lane = tid & 31;
    const float* parts = reinterpret_cast<const float*>(o.in0);
    mk_bf16* out = (mk_bf16*)o.out;
    for (int it = tid; it < (hi - lo) * per; it += nw) {  // per, nw: multiples of 32, so warps stay whole
        const int i = lo + it / per, r = it % per, h = r / HW, j = 2 * (r - h * HW), g = i / o.T, b = i % o.T;
        const int k = h * D + (j < D ? j : 0);
        const unsigned pair = mk_reduce_pair(parts + (size_t)i * C * stride, stride, G * D, G, h, k, C, lane);
        if (j < D) *reinterpret_cast<unsigned*>(out + (size_t)b * o.ld_out + g * G * D + k) = pair;
    }
}
#endif  // MK_ATTN

// ---------------------------------------------------------------- mixture of experts
// An MoE layer (program.py: _topk_row, _combine_row, the expert rows of _matmul_row; moe.py for
// the tasks): `topk` writes the layer's route table, which every expert task and the combine read.
// The route table (fp32 words; ids are whole numbers, exact in fp32), C = the layer's capacity
// (min(N, T k) expert slots; MkOp.pos of every MoE row of the layer):
//   [0]                       the active experts' count D (distinct experts the T tokens chose)
//   [1 + j], j < C            the expert of slot j: the active experts in ascending order, -1 past D
//   [1 + C + t k + i]         the slot of token t's i-th choice (choices by descending logit)
//   [1 + C + T k + t k + i]   its weight
// An expert matmul task (MK_OPT_EXPERTS) is (slot j, rows [lo, hi) of that slot's output): its
// weight rows are those of expert route[1 + j], known only once the top-k is done, so the producer
// streams them only then (mk_expert_stream in mk_kernel.cu); a slot j >= D exits early.
#define MK_OPT_EXPERTS 64    // matmul: the weights of the slot's expert (route table at `tokens`, pos outputs a slot)
#define MK_OPT_SLOT_IN 128   // matmul: each slot has its own input rows, K elements apart (an expert op's output)
#define MK_TOPK_SIGMOID 1    // topk: sigmoid scores (else softmax over the N logits)
#define MK_TOPK_NORM 2       // topk: the k weights renormalised to sum 1
#define MK_MOE_OPT_SHARED 1  // combine: + the shared expert's output (W, ld2)
#define MK_MOE_OPT_GATED 2   // combine: ... times sigmoid of its gate (w2, one element per token)

// The slot of an expert matmul task whose weight rows start at lo (pos outputs a slot; two weight
// rows per output with the fused SiLU).
__device__ __forceinline__ int mk_expert_slot(const MkOp& o, int lo) {
    return lo / ((o.opt & MK_OPT_SILU ? 2 : 1) * o.pos);
}

// Whether the slot of an expert matmul task is active (read through L2: the top-k ran elsewhere).
__device__ __forceinline__ bool mk_expert_active(const MkOp& o, int lo) {
    return mk_expert_slot(o, lo) < (int)__ldcg(reinterpret_cast<const float*>(o.tokens));
}

// A task's own input rows (MK_OPT_SLOT_IN): its slot's K columns of the previous expert op's output.
// Static (the slot, not its expert): applied where the task's op description is copied.
__device__ __forceinline__ void mk_expert_input(MkOp& o, int lo) {
    if (o.opt & MK_OPT_SLOT_IN) o.in0 += (size_t)mk_expert_slot(o, lo) * o.K;
}

// The MoE tasks' device functions run once per layer (top-k) or on a few SMs (combine), each time
// on an SM that has not run them for a while: the persistent kernel's code is ~800 KB, and the
// weights streaming through L2 may evict their lines there too. The first versions (MK_MOE_V1=1,
// kept below for A/B runs) were 28.8 KB (top-k) and 8.3 KB (combine) of SASS in the persistent
// kernel (nvcc 13.0, sm_90: the compiler unrolled their loops) and took 10.3 and 3.0 us a task on
// the H200 (validation/results/h200-moe-dev): 0.36 us a KB both, as if their time were the fetch
// of their code. These are small: no loop unrolled but where a lane's registers need it, selects
// rather than branches (tests/validation/test_mk_moe_build.py bounds their sizes).
#ifndef MK_MOE_V1
#define MK_MOE_V1 0
#endif
#define MK_TOPK_REGS 4  // logits a lane holds: the warp-per-token top-k takes N <= 32 * MK_TOPK_REGS

#if MK_MOE_V1
#define mk_topk mk_topk_v1
#define mk_combine mk_combine_v1
#else
// The top-k of a layer's T tokens and its route table, in one task (T <= 8: a tiny serial step).
// One warp per token, all tokens at once. Each lane holds the logits lane, lane + 32, ... as keys:
// the bf16 bits made order-preserving as unsigned (-0 as +0) in the high half, 0xFFFF - the expert
// in the low half, so that the largest key is the larger logit and on a tie the lower expert (the
// order mk_topk_v1 picks in); 0 for a lane's slots past N. A choice is one warp max of the keys
// (redux.sync, sm_80+), its key then set to 0 in its lane. The max logit is the first choice's; the
// softmax's sum of exponentials is summed in mk_topk_v1's order (the same bits). Lane i keeps the
// i-th choice and its weight (renormalised with MK_TOPK_NORM by the sum in choice order). Then each
// active expert's slot: the active experts below it (popcounts of the mask words), and the table.
// Logits that are NaN are not ordered as mk_topk_v1 orders them (a broken router either way).
// scratch: the mask (MK_TOPK_REGS words), each token's choices and weights (2 T k words), within
// mk_topk_v1's (x_region_bytes). N > 32 MK_TOPK_REGS: mk_topk_v1, which keeps the logits in shared
// memory. Selects rather than branches: the fewer instructions, the fewer lines fetched (see above).
__device__ __forceinline__ unsigned mk_topk_key(unsigned short u, int e) {
    const unsigned o = u == 0x8000u ? 0x8000u : (u & 0x8000u ? ~u & 0xFFFFu : u | 0x8000u);
    return o << 16 | (0xFFFFu - (unsigned)e);
}
__device__ __forceinline__ float mk_topk_logit(unsigned key) {  // the logit of a key (-0 read as +0)
    const unsigned o = key >> 16;
    return __uint_as_float((o & 0x8000u ? o & 0x7FFFu : ~o & 0xFFFFu) << 16);
}
__device__ __noinline__ void mk_topk_v1(const MkOp* og, int tid, int nw, float* scratch);
__device__ __noinline__ void mk_topk(const MkOp* og, int tid, int nw, float* scratch) {
    const int T = og->T, N = og->N, k = og->K, C = og->pos, opt = og->opt, ld0 = og->ld0;
    if (N > 32 * MK_TOPK_REGS) {
        mk_topk_v1(og, tid, nw, scratch);
        return;
    }
    const unsigned short* in = reinterpret_cast<const unsigned short*>(og->in0);
    float* route = reinterpret_cast<float*>(og->out);
    const int lane = tid & 31, warps = nw >> 5;
    unsigned* mask = reinterpret_cast<unsigned*>(scratch);                  // [MK_TOPK_REGS] active experts
    int* sel = reinterpret_cast<int*>(scratch + MK_TOPK_REGS);              // [T][k] chosen experts
    float* wts = reinterpret_cast<float*>(scratch + MK_TOPK_REGS + T * k);  // [T][k] their weights
    if (tid < MK_TOPK_REGS) mask[tid] = 0u;
    mk_bar(nw);
#pragma unroll 1
    for (int b = tid >> 5; b < T; b += warps) {
        unsigned key[MK_TOPK_REGS];
        unsigned top = 0u;
#pragma unroll
        for (int j = 0; j < MK_TOPK_REGS; ++j) {  // past N: a load of logit N - 1 (not a branch), key 0
            const int e = lane + 32 * j;
            const unsigned short u = __ldcg(in + (size_t)b * ld0 + min(e, N - 1));
            key[j] = e < N ? mk_topk_key(u, e) : 0u;
            top = max(top, key[j]);
        }
        const float m = mk_topk_logit(__reduce_max_sync(0xffffffffu, top));
        float S = 0.f;
        if (!(opt & MK_TOPK_SIGMOID)) {
#pragma unroll
            for (int j = 0; j < MK_TOPK_REGS; ++j)
                S += lane + 32 * j < N ? __expf(mk_topk_logit(key[j]) - m) : 0.f;  // + 0: S exactly
            S = mk_warp_sum(S);
        }
        float sum = 0.f, mine_w = 0.f;
        int mine = 0;
#pragma unroll 1
        for (int i = 0; i < k; ++i) {
            top = 0u;
#pragma unroll
            for (int j = 0; j < MK_TOPK_REGS; ++j) top = max(top, key[j]);
            top = __reduce_max_sync(0xffffffffu, top);
            const float best = mk_topk_logit(top);
            const float p = opt & MK_TOPK_SIGMOID ? 1.f / (1.f + __expf(-best)) : __expf(best - m) / S;
            sum += p;
            mine = lane == i ? 0xFFFF - (int)(top & 0xFFFFu) : mine;
            mine_w = lane == i ? p : mine_w;
#pragma unroll
            for (int j = 0; j < MK_TOPK_REGS; ++j) key[j] = key[j] == top ? 0u : key[j];  // taken
        }
        if (lane < k) {
            if (opt & MK_TOPK_NORM) mine_w /= sum;
            sel[b * k + lane] = mine;
            wts[b * k + lane] = mine_w;
            atomicOr(mask + (mine >> 5), 1u << (mine & 31));
        }
    }
    mk_bar(nw);
    int count = 0;  // active experts
#pragma unroll
    for (int w = 0; w < MK_TOPK_REGS; ++w) count += __popc(mask[w]);
    const auto slot_of = [&](int e) {  // the active experts below e
        int s = __popc(mask[e >> 5] & ((1u << (e & 31)) - 1u));
#pragma unroll
        for (int w = 0; w < MK_TOPK_REGS; ++w) s += w < (e >> 5) ? __popc(mask[w]) : 0;
        return s;
    };
    if (tid == 0) route[0] = (float)count;
#pragma unroll 1
    for (int e = tid; e < N; e += nw)
        if (mask[e >> 5] & (1u << (e & 31))) route[1 + slot_of(e)] = (float)e;
#pragma unroll 1
    for (int j = count + tid; j < C; j += nw) route[1 + j] = -1.f;
#pragma unroll 1
    for (int i = tid; i < T * k; i += nw) {
        route[1 + C + i] = (float)slot_of(sel[i]);
        route[1 + C + T * k + i] = wts[i];
    }
}

#ifndef MK_COMBINE_CHUNK
#define MK_COMBINE_CHUNK 8  // expert rows a worker loads at once (a token's k, for k <= 8): one round trip
#endif

// The layer's output, features [lo, hi) of every token: its k experts' rows (slot s of the down
// projection's output at s * N, ld0 a token), weighted, + the shared expert (times the sigmoid of
// its gate) + the residual, in fp32, rounded once: the arithmetic of mk_combine_v1 in its order.
// The tokens' slots and weights are read into shared memory first (scratch: 2 T k words); then a
// worker per element issues its loads at once (the residual, the shared expert, its gate and up to
// MK_COMBINE_CHUNK expert rows) before it adds them up.
__device__ __noinline__ void mk_combine(const MkOp* og, int lo, int hi, int tid, int nw, float* scratch) {
    const int T = og->T, k = og->K, C = og->pos, H = og->N, opt = og->opt, ld0 = og->ld0, ld1 = og->ld1,
              ld2 = og->ld2, ld_out = og->ld_out;
    const float* route = reinterpret_cast<const float*>(og->tokens);
    const mk_bf16 *y0 = og->in0, *res = og->in1, *sh = og->W, *gate = og->w2;
    mk_bf16* out = (mk_bf16*)og->out;
#pragma unroll 1
    for (int i = tid; i < 2 * T * k; i += nw) scratch[i] = __ldcg(route + 1 + C + i);
    mk_bar(nw);
    const int n = hi - lo;
#pragma unroll 1
    for (int i = tid; i < T * n; i += nw) {
        const int b = i / n, e = lo + i - b * n;
        const mk_bf16* y = y0 + (size_t)b * ld0 + e;
        const float* sw = scratch + b * k;
        const float r = mk_ld_bf16(res + (size_t)b * ld1 + e);
        float s = 0.f, g = 1.f;
        if (opt & MK_MOE_OPT_SHARED) {
            s = mk_ld_bf16(sh + (size_t)b * ld2 + e);
            if (opt & MK_MOE_OPT_GATED) g = mk_ld_bf16(gate + b);
        }
        float acc = 0.f;
#pragma unroll 1
        for (int c0 = 0; c0 < k; c0 += MK_COMBINE_CHUNK) {
            float yv[MK_COMBINE_CHUNK];
#pragma unroll
            for (int u = 0; u < MK_COMBINE_CHUNK; ++u)
                yv[u] = c0 + u < k ? mk_ld_bf16(y + (int)sw[c0 + u] * H) : 0.f;
#pragma unroll
            for (int u = 0; u < MK_COMBINE_CHUNK; ++u)
                if (c0 + u < k) acc = fmaf(sw[T * k + c0 + u], yv[u], acc);
        }
        if (opt & MK_MOE_OPT_SHARED) {
            if (opt & MK_MOE_OPT_GATED) g = 1.f / (1.f + __expf(-g));
            acc = fmaf(g, s, acc);
        }
        acc += r;
        out[(size_t)b * ld_out + e] = mk_f32_to_bf16(acc);
    }
}
#endif  // MK_MOE_V1

// The first versions (validation/results/h200-moe-dev), kept for A/B runs (MK_MOE_V1=1); mk_topk_v1
// also runs the top-k of more than 32 MK_TOPK_REGS experts.
// The top-k of a layer's T tokens and its route table, in one task (T <= 8: a tiny serial step).
// Warp w takes tokens w, w + warps, ...: the N bf16 logits into shared memory, the max and (softmax)
// the sum of exponentials, then k rounds of a warp arg-max (the larger logit, the lower index on a
// tie), each choice taken out; the scores of the choices and their weights (renormalised with
// MK_TOPK_NORM, summed in choice order). Then the distinct experts (a bit mask), their slots in
// ascending order and the table. scratch: T N + 2 T k + N / 32 + 1 words (x_region_bytes).
// Not inlined, and given the op in global memory: the kernel's other tasks keep their registers.
__device__ __noinline__ void mk_topk_v1(const MkOp* og, int tid, int nw, float* scratch) {
    const MkOp& o = *og;
    const int T = o.T, N = o.N, k = o.K, C = o.pos, lane = tid & 31, warps = nw >> 5, words = (N + 31) >> 5;
    float* vals = scratch;                                     // [T][N]
    int* sel = reinterpret_cast<int*>(vals + T * N);           // [T][k] chosen experts
    float* wts = reinterpret_cast<float*>(sel + T * k);        // [T][k] their weights
    unsigned* mask = reinterpret_cast<unsigned*>(wts + T * k); // [words] active experts
    for (int i = tid; i < words; i += nw) mask[i] = 0u;
    for (int i = tid; i < T * N; i += nw) {
        const int b = i / N, e = i - b * N;
        vals[i] = mk_ld_bf16(o.in0 + (size_t)b * o.ld0 + e);
    }
    mk_bar(nw);
    for (int b = tid >> 5; b < T; b += warps) {
        float* v = vals + b * N;
        float m = MK_NEG_INF;
        for (int e = lane; e < N; e += 32) m = fmaxf(m, v[e]);
        m = mk_warp_max(m);
        float S = 0.f;
        if (!(o.opt & MK_TOPK_SIGMOID)) {
            for (int e = lane; e < N; e += 32) S += __expf(v[e] - m);
            S = mk_warp_sum(S);
        }
        float sum = 0.f;
        for (int i = 0; i < k; ++i) {
            float best = MK_NEG_INF;
            int at = N;
            for (int e = lane; e < N; e += 32)
                if (v[e] > best || (v[e] == best && e < at)) { best = v[e]; at = e; }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const float ob = __shfl_xor_sync(0xffffffffu, best, off);
                const int oa = __shfl_xor_sync(0xffffffffu, at, off);
                if (ob > best || (ob == best && oa < at)) { best = ob; at = oa; }
            }
            const float p = o.opt & MK_TOPK_SIGMOID ? 1.f / (1.f + __expf(-best)) : __expf(best - m) / S;
            sum += p;
            if (lane == 0) {
                sel[b * k + i] = at;
                wts[b * k + i] = p;
            }
            __syncwarp();
            if (lane == (at & 31)) v[at] = MK_NEG_INF;  // taken: not chosen again
            __syncwarp();
        }
        if (lane < k && (o.opt & MK_TOPK_NORM)) wts[b * k + lane] /= sum;
    }
    mk_bar(nw);
    for (int i = tid; i < T * k; i += nw) atomicOr(mask + (sel[i] >> 5), 1u << (sel[i] & 31));
    mk_bar(nw);
    float* route = reinterpret_cast<float*>(o.out);
    // the slot of expert e: the active experts below it
    auto slot_of = [&](int e) {
        int s = __popc(mask[e >> 5] & ((1u << (e & 31)) - 1u));
        for (int w = 0; w < (e >> 5); ++w) s += __popc(mask[w]);
        return s;
    };
    int count = 0;
    for (int w = 0; w < words; ++w) count += __popc(mask[w]);
    if (tid == 0) route[0] = (float)count;
    for (int e = tid; e < N; e += nw)
        if (mask[e >> 5] & (1u << (e & 31))) route[1 + slot_of(e)] = (float)e;
    for (int j = count + tid; j < C; j += nw) route[1 + j] = -1.f;
    for (int i = tid; i < T * k; i += nw) {
        route[1 + C + i] = (float)slot_of(sel[i]);
        route[1 + C + T * k + i] = wts[i];
    }
}

// The layer's output, features [lo, hi) of every token: its k experts' rows (slot s of the down
// projection's output at s * N, ld0 a token), weighted, + the shared expert (times the sigmoid of
// its gate) + the residual, in fp32, rounded once. The tokens' slots and weights are read into
// shared memory first (scratch: 2 T k words).
// Not inlined, and given the op in global memory (as mk_topk).
__device__ __noinline__ void mk_combine_v1(const MkOp* og, int lo, int hi, int tid, int nw, float* scratch) {
    const MkOp& o = *og;
    const float* route = reinterpret_cast<const float*>(o.tokens);
    const int T = o.T, k = o.K, C = o.pos, H = o.N;
    for (int i = tid; i < 2 * T * k; i += nw) scratch[i] = __ldcg(route + 1 + C + i);
    mk_bar(nw);
    mk_bf16* out = (mk_bf16*)o.out;
    for (int i = tid; i < T * (hi - lo); i += nw) {
        const int b = i / (hi - lo), e = lo + i - b * (hi - lo);
        const mk_bf16* y = o.in0 + (size_t)b * o.ld0 + e;
        const float* sw = scratch + b * k;
        float acc = 0.f;
        for (int c = 0; c < k; ++c) acc = fmaf(sw[T * k + c], mk_ld_bf16(y + (size_t)(int)sw[c] * H), acc);
        if (o.opt & MK_MOE_OPT_SHARED) {
            const float g = o.opt & MK_MOE_OPT_GATED ? 1.f / (1.f + __expf(-mk_ld_bf16(o.w2 + b))) : 1.f;
            acc = fmaf(g, mk_ld_bf16(o.W + (size_t)b * o.ld2 + e), acc);
        }
        acc += mk_ld_bf16(o.in1 + (size_t)b * o.ld1 + e);
        out[(size_t)b * o.ld_out + e] = mk_f32_to_bf16(acc);
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
    case MK_OP_ROPE_KV:
        if (o.opt & (MK_ROPE_NORM_HEAD | MK_ROPE_NORM_ALL)) mk_rope_kv_norm(o, lo, hi, tid, nw, red);
        else mk_rope_kv(o, lo, hi, tid, nw);
        return true;
    case MK_OP_ATTN_REDUCE: mk_attn_reduce(o, lo, hi, tid, nw); return true;
    case MK_OP_SILU_MUL: mk_silu_mul(o, lo, hi, tid, nw); return true;
    case MK_OP_SOFTCAP: mk_softcap(o, lo, hi, tid, nw); return true;
    default: return false;
    }
}
