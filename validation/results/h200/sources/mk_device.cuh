// Device functions shared by mksim's calibration benchmarks and its generated validation kernels.
//
// Plain CUDA C++ that compiles under NVRTC (CuPy) and nvcc alike: no CUDA headers are included,
// bf16 values are carried as raw 16-bit words and widened exactly to fp32 here.
#pragma once

typedef unsigned short mk_bf16;  // raw bfloat16 bits
#define MK_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float mk_bf16_to_f32(mk_bf16 h) { return __uint_as_float(((unsigned)h) << 16); }

// The 8 bf16 values of a 16-byte vector, widened.
__device__ __forceinline__ void mk_unpack8(uint4 v, float f[8]) {
    unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ float mk_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Load n fp32 values from global memory into shared memory (all threads of the block).
__device__ __forceinline__ void mk_load_vector(float* dst, const float* __restrict__ src, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = __ldcg(src + i);
}

// y[r] = sum_k W[r, k] * x[k] for rows r in [r0, r1) of a row-major bf16 matrix with K columns
// (K a multiple of 8); x (fp32, K values) is in shared memory. Each warp owns whole rows: its
// lanes stride along the row in 16-byte vectors, UNROLL vectors in flight per lane, and lane 0
// writes the row's sum. A row's weights are read exactly once.
template <int UNROLL>
__device__ __forceinline__ void mk_matvec_rows(const mk_bf16* __restrict__ W, const float* xs, float* __restrict__ y,
                                               int r0, int r1, int K) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int kvec = K >> 3;
    for (int r = r0 + warp; r < r1; r += nwarps) {
        const uint4* row = reinterpret_cast<const uint4*>(W + (size_t)r * K);
        float acc = 0.f;
        for (int base = lane; base < kvec; base += 32 * UNROLL) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                int j = base + u * 32;
                v[u] = j < kvec ? __ldg(row + j) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                int j = base + u * 32;
                if (j < kvec) {
                    float f[8];
                    mk_unpack8(v[u], f);
                    const float* xv = xs + j * 8;
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc = fmaf(f[e], xv[e], acc);
                }
            }
        }
        acc = mk_warp_sum(acc);
        if (lane == 0) y[r] = acc;
    }
}

// RMS norm of one row of n fp32 values, times a bf16 weight: out = x / rms(x) * w. One block.
__device__ __forceinline__ void mk_rmsnorm_row(const float* __restrict__ x, const mk_bf16* __restrict__ w,
                                               float* __restrict__ out, int n, float eps, float* scratch) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = __ldcg(x + i);
        ss = fmaf(v, v, ss);
    }
    ss = mk_warp_sum(ss);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) scratch[warp] = ss;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nwarps ? scratch[lane] : 0.f;
        t = mk_warp_sum(t);
        if (lane == 0) scratch[0] = rsqrtf(t / n + eps);
    }
    __syncthreads();
    const float inv = scratch[0];
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = __ldcg(x + i) * inv * mk_bf16_to_f32(w[i]);
    __syncthreads();
}

// Flash-decoding partial attention for one KV head over cache positions [p0, p1).
// qs: the R query heads that share this KV head (R x D fp32, in shared memory, pre-scaled);
// K, V: this head's cache, row per position (bf16, D values each). Writes the unnormalised
// output o (R x D), the running max m and the sum of exponentials l of each query head, for a
// later merge of splits. Warps take positions in turn (lane i holds elements [i*E, i*E+E));
// the block merges its warps through `scratch` (nwarps * R * (D + 2) floats of shared memory).
template <int D, int R>
__device__ __forceinline__ void mk_attn_partial(const float* qs, const mk_bf16* __restrict__ K,
                                                const mk_bf16* __restrict__ V, int p0, int p1,
                                                float* __restrict__ o, float* __restrict__ m_out,
                                                float* __restrict__ l_out, float* scratch) {
    constexpr int E = D / 32;
    static_assert(E == 2 || E == 4, "head dimension 64 or 128");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    float q[R][E], acc[R][E], m[R], l[R];
#pragma unroll
    for (int h = 0; h < R; ++h) {
        m[h] = MK_NEG_INF;
        l[h] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            q[h][e] = qs[h * D + lane * E + e];
            acc[h][e] = 0.f;
        }
    }
    for (int p = p0 + warp; p < p1; p += nwarps) {
        float k[E], v[E];
        const mk_bf16* kr = K + (size_t)p * D + lane * E;
        const mk_bf16* vr = V + (size_t)p * D + lane * E;
        if (E == 4) {
            uint2 kk = __ldg(reinterpret_cast<const uint2*>(kr)), vv = __ldg(reinterpret_cast<const uint2*>(vr));
            k[0] = __uint_as_float(kk.x << 16); k[1] = __uint_as_float(kk.x & 0xffff0000u);
            k[E - 2] = __uint_as_float(kk.y << 16); k[E - 1] = __uint_as_float(kk.y & 0xffff0000u);
            v[0] = __uint_as_float(vv.x << 16); v[1] = __uint_as_float(vv.x & 0xffff0000u);
            v[E - 2] = __uint_as_float(vv.y << 16); v[E - 1] = __uint_as_float(vv.y & 0xffff0000u);
        } else {
            unsigned kk = __ldg(reinterpret_cast<const unsigned*>(kr)), vv = __ldg(reinterpret_cast<const unsigned*>(vr));
            k[0] = __uint_as_float(kk << 16); k[E - 1] = __uint_as_float(kk & 0xffff0000u);
            v[0] = __uint_as_float(vv << 16); v[E - 1] = __uint_as_float(vv & 0xffff0000u);
        }
#pragma unroll
        for (int h = 0; h < R; ++h) {
            float s = 0.f;
#pragma unroll
            for (int e = 0; e < E; ++e) s = fmaf(q[h][e], k[e], s);
            s = mk_warp_sum(s);
            const float mn = fmaxf(m[h], s), c = __expf(m[h] - mn), w = __expf(s - mn);
            l[h] = fmaf(l[h], c, w);
#pragma unroll
            for (int e = 0; e < E; ++e) acc[h][e] = fmaf(acc[h][e], c, w * v[e]);
            m[h] = mn;
        }
    }
#pragma unroll
    for (int h = 0; h < R; ++h) {
        float* row = scratch + (warp * R + h) * (D + 2);
#pragma unroll
        for (int e = 0; e < E; ++e) row[lane * E + e] = acc[h][e];
        if (lane == 0) { row[D] = m[h]; row[D + 1] = l[h]; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < R * D; i += blockDim.x) {
        const int h = i / D, d = i % D;
        float M = MK_NEG_INF;
        for (int w = 0; w < nwarps; ++w) M = fmaxf(M, scratch[(w * R + h) * (D + 2) + D]);
        float L = 0.f, O = 0.f;
        for (int w = 0; w < nwarps; ++w) {
            const float* row = scratch + (w * R + h) * (D + 2);
            const float c = row[D] == MK_NEG_INF ? 0.f : __expf(row[D] - M);
            O = fmaf(row[d], c, O);
            L = fmaf(row[D + 1], c, L);
        }
        o[h * D + d] = O;
        if (d == 0) { m_out[h] = M; l_out[h] = L; }
    }
    __syncthreads();
}
