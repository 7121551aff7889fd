// Mechanism microbenchmarks ("mechanisms, not fits"), one sweep per subcommand.
// Each prints one JSON object on stdout (raw samples, no fitting; validation/mechanisms/run.py fits).
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o mech_bench mech_bench.cu
//   mech_bench bw|bwl1|tma|tma_nofence|tma_bps|chain|cost|opb|poll|bcast [--quick]
//
// bw     DRAM read bandwidth vs bytes in flight: blocks per SM (1..8, forced exactly by shared memory),
//        threads per block, 16-byte loads in flight per thread (ILP 1..16), active SMs (blocks whose
//        %smid is not selected exit at once). Every launch reads fresh data (a cursor walks an 8 GiB
//        buffer), sized to run ~250 us.
// bwl1   the same without shared-memory padding (the L1 as large as it gets), and one SM's draw as
//        shared memory per SM grows from 0 to 224 KiB (the L1 shrinking in its place).
// tma    the same question for a bulk-copy (TMA) pipeline: 4..32 KiB stages, 1..16 deep, 1..132 SMs.
// cost   one memory-bound kernel (read + one store per block) over 64 KiB .. 512 MiB and four grid
//        shapes: a CUDA graph of 16 kernels on 16 distinct regions, a graph of one, and one launch
//        between events; the L2 is flushed (256 MiB read) before every timed replay.
// chain  32-kernel graph chains of that kernel, 1..64 MiB each, six grid shapes, plain graph and
//        programmatic dependent launch with the trigger early, late (after the main loop) or never.
// poll   data as its own flag (sync="sentinel"): a waiter warp polling bytes that stay the sentinel
//        while the other warps stream DRAM, and the time from a producer's stores to 131 pollers seeing them.
// bcast  131 SMs reading the same 1-128 KiB (or each its own) once a flag says another SM wrote them:
//        a matmul task's input rows in a megakernel.
// opb    a persistent kernel (one block per SM): op boundaries on a global counter, with the chip idle,
//        with 15 of 16 warps of every SM streaming DRAM, and with every op streaming its own bytes.
//
// Every kernel's result is checked (XOR of everything read against a reference kernel, chain
// tokens, placement counters); a wrong answer exits 3, a hang is stopped by a 20 s event watchdog.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#define CHECK(x)                                                                                       \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            std::fprintf(stderr, "mech_bench: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), \
                         __LINE__);                                                                    \
            std::exit(2);                                                                              \
        }                                                                                              \
    } while (0)

static void fail(const char* what) {
    std::fprintf(stderr, "mech_bench: check failed: %s\n", what);
    std::exit(3);
}

// ------------------------------------------------------------------------------------ device helpers
__device__ __forceinline__ unsigned smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned xor4(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// This thread's XOR of chunk_vec 16-byte words at p: ILP coalesced loads issued before any use.
template <int ILP>
__device__ __forceinline__ unsigned stream_xor(const uint4* __restrict__ p, size_t chunk_vec, unsigned tid,
                                               unsigned nthreads) {
    unsigned acc = 0;
    const size_t step = (size_t)ILP * nthreads;
    const size_t full = chunk_vec / step * step;  // iterations that need no bounds check
    size_t i = tid;
    for (; i < full; i += step) {
        uint4 v[ILP];
#pragma unroll
        for (int u = 0; u < ILP; ++u) v[u] = __ldcs(p + i + (size_t)u * nthreads);
#pragma unroll
        for (int u = 0; u < ILP; ++u) acc ^= xor4(v[u]);
    }
    for (; i < chunk_vec; i += nthreads) acc ^= xor4(__ldcs(p + i));
    return acc;
}

// XOR over the block; the result is valid in thread 0. Every thread of the block must call it.
__device__ __forceinline__ unsigned block_xor(unsigned acc) {
    __shared__ unsigned red[32];
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
    __syncthreads();
    unsigned s = 0;
    if (threadIdx.x == 0)
        for (unsigned w = 0; w < (blockDim.x + 31) / 32; ++w) s ^= red[w];
    return s;
}

// ------------------------------------------------------------------------------------ kernels
__global__ void k_fill(uint4* a, size_t n_vec, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_vec; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)(i * 2654435761ull) ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        a[i] = make_uint4(x | 1u, (x * 747796405u) | 1u, (x ^ 0x9e3779b9u) | 1u, (x + 12345u) | 1u);
    }
}

// The reference: a plain grid-stride XOR of [a, a + n_vec) into *out (also the L2 flush).
__global__ void k_ref_xor(const uint4* __restrict__ a, size_t n_vec, unsigned* out) {
    unsigned acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_vec; i += (size_t)gridDim.x * blockDim.x)
        acc ^= xor4(__ldcg(a + i));
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(out, acc);
}

// 1. bw: blocks on selected SMs (smid % stride == 0, smid / stride < n_active) take a rank from a
// per-SM slot counter and read chunk `rank`; the others exit. The caller sizes dynamic shared
// memory so that exactly bps blocks fit on an SM, and launches bps blocks per SM on every SM.
// MINB is __launch_bounds__'s minimum of resident 1024-thread blocks: with 2 (or none), ptxas keeps
// to 32 registers, which lets 2048 threads share an SM but cannot hold 8 loads of 16 bytes (32
// registers of data alone); with 1 it may use 64, fewer threads fit, more loads stay in flight.
template <int ILP, int MINB>
__global__ void __launch_bounds__(1024, MINB) k_bw(const uint4* __restrict__ a, size_t chunk_vec, int n_active, int stride,
                                             int bps, unsigned* slots, unsigned* part, unsigned* errors) {
    __shared__ int rank_s;
    const unsigned sm = smid();
    if (sm % stride != 0 || sm / stride >= (unsigned)n_active) return;
    if (threadIdx.x == 0) {
        unsigned slot = atomicAdd(slots + sm, 1u);
        rank_s = slot < (unsigned)bps ? (int)((sm / stride) * bps + slot) : -1;
        if (rank_s < 0) atomicAdd(errors, 1u);
    }
    __syncthreads();
    const int rank = rank_s;
    if (rank < 0) return;
    unsigned acc = stream_xor<ILP>(a + (size_t)rank * chunk_vec, chunk_vec, threadIdx.x, blockDim.x);
    acc = block_xor(acc);
    if (threadIdx.x == 0) part[rank] = acc;
}

// 2./3. A memory-bound chain member: block b reads its chunk of w, stores one word, and block 0
// passes the chain's token on (tokens[1] = tokens[0] + 1: the data dependency on the predecessor).
// mode 0: plain launch; 1: PDL, wait at start, no trigger; 2: PDL, wait at start, trigger after
// the main loop; 3: PDL, trigger then wait at start; 4: PDL, trigger at start, read, wait before
// the store (weights need no predecessor).
enum { M_PLAIN = 0, M_NEVER = 1, M_LATE = 2, M_EARLY = 3, M_EARLY_READFIRST = 4 };
template <int ILP>
__global__ void __launch_bounds__(1024) k_chain(const uint4* __restrict__ w, size_t chunk_vec, size_t total_vec,
                                                unsigned* __restrict__ part, unsigned* __restrict__ sm_of,
                                                unsigned* tokens, int mode) {
    if (mode == M_EARLY || mode == M_EARLY_READFIRST) pdl_trigger();
    if (mode == M_NEVER || mode == M_LATE || mode == M_EARLY) pdl_wait();
    const size_t beg = (size_t)blockIdx.x * chunk_vec;
    const size_t n = beg >= total_vec ? 0 : (total_vec - beg < chunk_vec ? total_vec - beg : chunk_vec);
    unsigned acc = stream_xor<ILP>(w + beg, n, threadIdx.x, blockDim.x);
    if (mode == M_LATE) pdl_trigger();
    if (mode == M_EARLY_READFIRST) pdl_wait();
    acc = block_xor(acc);
    if (threadIdx.x == 0) {
        part[blockIdx.x] = acc;
        sm_of[blockIdx.x] = smid();  // where the block ran: how evenly the grid was placed
        if (blockIdx.x == 0) tokens[1] = tokens[0] + 1;
    }
}

// 4. Op boundaries in a persistent kernel (one block per SM, all resident). Modes:
// 0 idle: thread 0 spins work_ns, releases (fence + atomicAdd on cnt[op]), waits for all blocks
//   (ld.acquire), for n_ops ops; the other warps do nothing;
// 1 loaded: as 0, while warps 1..15 stream the block's own bg_vec region (wrapping) until done;
// 2 drain: every op, all threads stream region_vec words, then the same release / wait;
// 3 single: as 2 without the boundaries (the same bytes, one op).
// stamps[(op * G + b) * 2 + {0, 1}] = %globaltimer at release and at resume.
__global__ void __launch_bounds__(512, 1) k_opb(const uint4* __restrict__ w, size_t region_vec, size_t span_vec,
                                                size_t bg_vec, int n_ops, int mode, long long work_ns,
                                                unsigned* cnt, unsigned long long* stamps, unsigned* part,
                                                unsigned long long* bg_bytes) {
    __shared__ volatile int done;
    const unsigned b = blockIdx.x, G = gridDim.x, warp = threadIdx.x >> 5;
    unsigned acc = 0;
    if (threadIdx.x == 0) done = 0;
    __syncthreads();
    auto boundary = [&](int op) {
        unsigned long long t_rel = gtimer();
        __threadfence();
        atomicAdd(cnt + op, 1u);
        while (ld_acquire(cnt + op) < G) {
        }
        unsigned long long t_res = gtimer();
        stamps[((size_t)op * G + b) * 2] = t_rel;
        stamps[((size_t)op * G + b) * 2 + 1] = t_res;
    };
    if (mode == 0 || mode == 1) {
        if (warp == 0) {
            if (threadIdx.x == 0) {
                for (int op = 0; op < n_ops; ++op) {
                    unsigned long long t0 = gtimer();
                    while ((long long)(gtimer() - t0) < work_ns) {
                    }
                    boundary(op);
                }
                done = 1;
            }
            __syncwarp();
        } else if (mode == 1) {
            const unsigned t = threadIdx.x - 32, nt = blockDim.x - 32;
            const uint4* p = w + (size_t)b * bg_vec;
            const size_t step = 4ull * nt;
            size_t i = t, loads = 0;
            while (!done) {
                uint4 v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) v[u] = __ldcs(p + i + (size_t)u * nt);
#pragma unroll
                for (int u = 0; u < 4; ++u) acc ^= xor4(v[u]);
                loads += 4;
                i += step;
                if (i + 3ull * nt >= bg_vec) i = t;
            }
            atomicAdd(bg_bytes, (unsigned long long)loads * 16ull);
        }
    } else {
        for (int op = 0; op < n_ops; ++op) {
            const size_t base = (((size_t)op * G + b) * region_vec) % (span_vec - region_vec);
            acc ^= stream_xor<4>(w + base, region_vec, threadIdx.x, blockDim.x);
            if (mode == 2) {
                __syncthreads();
                if (threadIdx.x == 0) boundary(op);
                __syncthreads();
            }
        }
    }
    acc = block_xor(acc);
    if (threadIdx.x == 0) part[b] = acc;
}

// 5. tma: blocks on SMs with %smid < n_active (one per SM; the others exit) stream their chunk
// through `depth` shared-memory stages of stage_B bytes: thread 0 issues cp.async.bulk copies
// completing on one mbarrier per stage; all threads XOR a stage once it has landed, then thread 0
// refills it. Bytes in flight per SM = depth x stage_B, held in shared memory, not registers.
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ bool mbar_try(unsigned long long* b, unsigned parity) {
    unsigned ok;
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(ok) : "r"(smem_addr(b)), "r"(parity) : "memory");
    return ok != 0;
}
constexpr int TMA_MAX_DEPTH = 16;
__global__ void __launch_bounds__(256) k_tma(const unsigned char* __restrict__ a, size_t chunk_B, unsigned stage_B,
                                                int depth, int n_active, unsigned* slots, unsigned* part,
                                                unsigned* errors, int fence, int bps) {
    extern __shared__ __align__(128) unsigned char stages[];
    __shared__ __align__(8) unsigned long long full[TMA_MAX_DEPTH];
    __shared__ int rank_s;
    const unsigned sm = smid();
    if (sm >= (unsigned)n_active) return;
    if (threadIdx.x == 0) {
        const unsigned slot = atomicAdd(slots + sm, 1u);  // bps blocks per SM, ranks sm * bps + slot
        rank_s = slot < (unsigned)bps ? (int)(sm * bps + slot) : -1;
        if (rank_s < 0) atomicAdd(errors, 1u);
        for (int s = 0; s < depth; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(full + s)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int rank = rank_s;
    if (rank < 0) return;
    const unsigned char* src = a + (size_t)rank * chunk_B;
    const size_t n_st = chunk_B / stage_B;
    auto issue = [&](size_t it) {
        const int s = (int)(it % depth);
        const unsigned bar = smem_addr(full + s);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(stage_B) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(smem_addr(stages + (size_t)s * stage_B)), "l"(src + it * stage_B), "r"(stage_B), "r"(bar)
                     : "memory");
    };
    if (threadIdx.x == 0)
        for (size_t it = 0; it < n_st && it < (size_t)depth; ++it) issue(it);
    unsigned acc = 0;
    for (size_t it = 0; it < n_st; ++it) {
        const int s = (int)(it % depth);
        while (!mbar_try(full + s, (unsigned)((it / depth) & 1))) {
        }
        const uint4* st = reinterpret_cast<const uint4*>(stages + (size_t)s * stage_B);
        for (unsigned i = threadIdx.x; i < stage_B / 16; i += blockDim.x) acc ^= xor4(st[i]);
        __syncthreads();  // every thread is done with stage s before it is refilled
        if (threadIdx.x == 0 && it + depth < n_st) {
            // Orders the generic-proxy reads above before the async-proxy refill. Measured on the
            // H200 (results/h200-mechanisms/raw/README.md, item 3), refills did not overlap: one
            // stage per ~380 ns + bytes / 118 GB/s at every depth >= 2; this fence is the suspect.
            // `tma_nofence` leaves it out (the block barrier alone orders the reads, which have
            // returned their values; the XOR check would show a stage overwritten too early).
            if (fence) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            issue(it + depth);
        }
    }
    acc = block_xor(acc);
    if (threadIdx.x == 0) part[rank] = acc;
}

// %globaltimer's step: the smallest nonzero difference between consecutive reads.
__global__ void k_gtimer_step(unsigned long long* out) {
    unsigned long long prev = gtimer(), best = ~0ull, changes = 0, t0 = prev;
    for (int i = 0; i < 200000; ++i) {
        unsigned long long t = gtimer();
        if (t != prev) {
            if (t - prev < best) best = t - prev;
            ++changes;
        }
        prev = t;
    }
    out[0] = best;
    out[1] = changes;
    out[2] = prev - t0;
}


// 7. poll: data as its own flag (sync="sentinel" of the megakernel), the waiter's side. One block
// per SM, 512 threads: warp 0 polls, as mk_poll_data in validation/megakernel/mk_kernel.cu does
// (lane l takes 16-byte units l, l + 32, ... in windows of 64 per lane, POLL_BATCH loads in flight,
// a unit dropped once none of its bf16 halves is the sentinel 0xffff, passes until none is
// pending); warps 1..15 stream stream_vec fresh words of DRAM each (ILP 8, their own region), or
// idle. Modes:
//   0 stream   no poller: the stream alone (the reference);
//   1 pending  every poller polls poll_B bytes that stay the sentinel, pass after pass, until its
//              block's stream is done: what polling costs the stream, and a pass's time under load;
//   2 seen     block 0 writes poll_B bytes (plain stores, all its threads) after write_delay_ns;
//              every other block's poller waits until it sees all of them: from the last store
//              issued to each poller seeing the data; the other blocks' warps 1..15 stream meanwhile
//              if stream_vec > 0 (block 0 streams nothing);
//   3 bcast    block 0 writes poll_B bytes (shared) or poll_B for every block, waits write_delay_ns,
//              releases a flag; every other block waits for the flag (one thread), then all its
//              threads read its bytes once (16-byte L2 loads, 8 in flight a thread): how long a
//              matmul task's input rows take when every SM reads the same bytes just written;
// `shared` 1: every block polls the same bytes (a consumer op's input: what the step does); 0: block
// b its own poll_B bytes (mode 1 only). stamps[b * 4 + {0..3}]: stream start, stream end, data
// written (block 0) or seen, passes. A wait past 200 ms sets *err and stops.
constexpr int POLL_BATCH = 16;
__device__ __forceinline__ uint4 ld_relaxed_v4(const uint4* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ bool unit_written(uint4 v) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    bool ok = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) ok &= ((w[i] & 0xffffu) != 0xffffu) & ((w[i] >> 16) != 0xffffu);
    return ok;
}
// Poll units [0, n) of p until every one is written, or (stop != null) until *stop; returns passes.
__device__ long long poll_units(const uint4* p, int n, volatile int* stop, int* err) {
    const int lane = threadIdx.x & 31;
    long long passes = 0;
    const unsigned long long t0 = gtimer();
    for (int w0 = 0; w0 < n; w0 += 64 * 32) {
        const int mine = min(64, max(0, (n - w0 - lane + 31) / 32));
        unsigned long long pending = mine == 64 ? ~0ull : (1ull << mine) - 1;
        while (__any_sync(0xffffffffu, pending != 0)) {
            unsigned long long m = pending;
            while (m) {
                int bit[POLL_BATCH];
                uint4 v[POLL_BATCH];
#pragma unroll
                for (int q = 0; q < POLL_BATCH; ++q) {
                    bit[q] = -1;
                    if (m) { bit[q] = __ffsll((long long)m) - 1; m &= m - 1; }
                }
#pragma unroll
                for (int q = 0; q < POLL_BATCH; ++q)
                    v[q] = bit[q] >= 0 ? ld_relaxed_v4(p + w0 + 32 * bit[q] + lane) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int q = 0; q < POLL_BATCH; ++q)
                    if (bit[q] >= 0 && unit_written(v[q])) pending &= ~(1ull << bit[q]);
            }
            ++passes;
            if (stop && *stop) return passes;
            if ((passes & 15) == 0 && gtimer() - t0 > 200000000ull) { atomicExch(err, 1); return passes; }
        }
    }
    return passes;
}
__global__ void __launch_bounds__(512, 1) k_poll(const uint4* __restrict__ w, size_t stream_vec, uint4* polled,
                                                 int poll_vec, int mode, int shared, long long write_delay_ns,
                                                 unsigned long long* stamps, unsigned* part, int* err) {
    __shared__ volatile int done;
    __shared__ int left;
    const unsigned b = blockIdx.x, warp = threadIdx.x >> 5;
    unsigned acc = 0;
    if (threadIdx.x == 0) { done = 0; left = 15; }
    __syncthreads();
    unsigned long long* st = stamps + (size_t)b * 4;
    if (warp == 0) {
        if (mode == 1) {
            const long long n = poll_units(polled + (shared ? 0 : (size_t)b * poll_vec), poll_vec, &done, err);
            if (threadIdx.x == 0) st[3] = (unsigned long long)n;
        } else if (mode == 2 && b > 0) {
            const long long n = poll_units(polled, poll_vec, nullptr, err);
            if (threadIdx.x == 0) { st[2] = gtimer(); st[3] = (unsigned long long)n; }
        }
    } else if (stream_vec > 0 && !(mode == 2 && b == 0)) {  // the producer block streams nothing
        const unsigned t = threadIdx.x - 32, nt = blockDim.x - 32;
        if (t == 0) st[0] = gtimer();
        acc = stream_xor<8>(w + (size_t)b * stream_vec, stream_vec, t, nt);
        __syncwarp();
        if ((threadIdx.x & 31) == 0 && atomicSub(&left, 1) == 1) { st[1] = gtimer(); done = 1; }
    }
    if (mode == 3) {  // bcast: block 0 writes, waits write_delay_ns, releases a flag; the others read
        unsigned* flag = reinterpret_cast<unsigned*>(polled + (size_t)gridDim.x * poll_vec);
        const int n = shared ? poll_vec : poll_vec * (int)gridDim.x;
        if (b == 0) {
            for (int i = threadIdx.x; i < n; i += blockDim.x) polled[i] = make_uint4(2u * i + 1u, 7u, 9u, 11u);
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                const unsigned long long t0 = gtimer();
                while ((long long)(gtimer() - t0) < write_delay_ns) {
                }
                st[2] = gtimer();
                asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(flag) : "memory");
            }
        } else {
            if (threadIdx.x == 0) {
                const unsigned long long t0 = gtimer();
                while (ld_acquire(flag) == 0) {
                    if (gtimer() - t0 > 200000000ull) { atomicExch(err, 1); break; }
                }
                st[0] = gtimer();
            }
            __syncthreads();
            const uint4* src = polled + (shared ? 0 : (size_t)b * poll_vec);
            for (int i = threadIdx.x; i < poll_vec; i += 8 * blockDim.x) {
                uint4 v[8];
#pragma unroll
                for (int u = 0; u < 8; ++u)
                    v[u] = i + u * (int)blockDim.x < poll_vec ? __ldcg(src + i + u * blockDim.x) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int u = 0; u < 8; ++u) acc ^= xor4(v[u]);
            }
            __syncthreads();
            if (threadIdx.x == 0) st[1] = gtimer();
        }
    }
    if (mode == 2 && b == 0) {  // the producer: all threads write after the delay (the streams run meanwhile)
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned long long t0 = gtimer();
            while ((long long)(gtimer() - t0) < write_delay_ns) {
            }
        }
        __syncthreads();
        for (int i = threadIdx.x; i < poll_vec; i += blockDim.x)
            polled[i] = make_uint4(2u * i + 1u, 7u, 9u, 11u);
        __syncthreads();
        if (threadIdx.x == 0) st[2] = gtimer();  // the last store issued
    }
    acc = block_xor(acc);
    if (threadIdx.x == 0) part[b] = acc;
}

// ------------------------------------------------------------------------------------ host helpers
struct Ctx {
    cudaDeviceProp prop;
    int sms;
    cudaStream_t s;
    cudaEvent_t e0, e1;
    uint4* buf;       // data: buf_vec words (8 GiB)
    size_t buf_vec;
    uint4* flush;     // 256 MiB read before timed replays
    size_t flush_vec;
    unsigned* scratch;  // reference XOR, errors, sink
    bool quick;
    int reps;
};

static double now_s() {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Host watchdog: poll the event instead of blocking, so that a hung kernel ends the process.
static void wait_event(cudaEvent_t e) {
    const double t0 = now_s();
    while (true) {
        cudaError_t r = cudaEventQuery(e);
        if (r == cudaSuccess) return;
        if (r != cudaErrorNotReady) CHECK(r);
        if (now_s() - t0 > 20.0) {
            std::fprintf(stderr, "mech_bench: watchdog: a kernel ran past 20 s\n");
            std::_Exit(4);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

static double elapsed_us(Ctx& c) {
    wait_event(c.e1);
    float ms;
    CHECK(cudaEventElapsedTime(&ms, c.e0, c.e1));
    return 1e3 * ms;
}

static void do_flush(Ctx& c) {
    k_ref_xor<<<c.sms * 4, 512, 0, c.s>>>(c.flush, c.flush_vec, c.scratch + 2);
    CHECK(cudaGetLastError());
}

// XOR of [p, p + n_vec), by the reference kernel.
static unsigned ref_xor(Ctx& c, const uint4* p, size_t n_vec) {
    CHECK(cudaMemsetAsync(c.scratch, 0, sizeof(unsigned), c.s));
    k_ref_xor<<<c.sms * 4, 512, 0, c.s>>>(p, n_vec, c.scratch);
    CHECK(cudaGetLastError());
    unsigned v;
    CHECK(cudaMemcpyAsync(&v, c.scratch, sizeof v, cudaMemcpyDeviceToHost, c.s));
    CHECK(cudaStreamSynchronize(c.s));
    return v;
}

static unsigned host_xor(const std::vector<unsigned>& v, size_t n) {
    unsigned x = 0;
    for (size_t i = 0; i < n; ++i) x ^= v[i];
    return x;
}

struct Json {
    std::string s;
    bool first = true;
    void open() { s += first ? "{" : ", {"; first = false; inner = true; }
    void close() { s += "}"; }
    bool inner = true;
    void key(const char* k) { s += inner ? "" : ", "; inner = false; s += "\""; s += k; s += "\": "; }
    void num(const char* k, double v) { key(k); char b[64]; std::snprintf(b, sizeof b, "%.10g", v); s += b; }
    void str(const char* k, const std::string& v) { key(k); s += "\"" + v + "\""; }
    void list(const char* k, const std::vector<double>& v) {
        key(k);
        s += "[";
        char b[64];
        for (size_t i = 0; i < v.size(); ++i) { std::snprintf(b, sizeof b, "%s%.5g", i ? ", " : "", v[i]); s += b; }
        s += "]";
    }
};

// Allow the largest dynamic shared memory; with `carveout`, also ask for the largest shared-memory
// share of the L1 (so that the occupancy the padding computes is the one the launch gets).
template <typename K>
static void set_smem_attrs(Ctx& c, K kernel, bool carveout) {
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)(c.prop.sharedMemPerBlockOptin - fa.sharedSizeBytes)));
    if (carveout) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
}

// Dynamic shared memory that leaves room for exactly bps blocks per SM.
template <typename K>
static size_t pad_for(Ctx& c, K kernel, int bps) {
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    const size_t per_block = c.prop.sharedMemPerMultiprocessor / bps - 1024;
    return per_block - c.prop.reservedSharedMemPerBlock - fa.sharedSizeBytes;
}

// ------------------------------------------------------------------------------------ 1. bw
struct BwBufs {
    size_t cursor = 0;
    unsigned* slots;
    unsigned* part;
    std::vector<unsigned> host_part;
};
template <typename L>
static void measure_point(Ctx& c, Json& j, BwBufs& bb, int nb, size_t gran_vec, L launcher);

// One configuration: n SMs (selected by stride) each with bps blocks of `threads`, `pad` bytes of
// dynamic shared memory per block. Sized to ~250 us from a probe; median of c.reps launches.
template <typename K>
static void bw_point(Ctx& c, Json& j, BwBufs& bb, K kernel, int threads, int bps, int n, int stride, size_t pad) {
    const int grid = c.sms * bps;
    measure_point(c, j, bb, n * bps, 1, [&](const uint4* base, size_t chunk_vec) {
        kernel<<<grid, threads, pad, c.s>>>(base, chunk_vec, n, stride, bps, bb.slots, bb.part, c.scratch + 1);
    });
}

// Time `launcher(base, chunk_vec)` (nb blocks each reading chunk_vec 16-byte words from base),
// sized to ~250 us from a probe, chunk_vec a multiple of gran_vec; checks the last launch.
template <typename L>
static void measure_point(Ctx& c, Json& j, BwBufs& bb, int nb, size_t gran_vec, L launcher) {
    auto launch = [&](size_t chunk_vec) {
        if (bb.cursor + nb * chunk_vec > c.buf_vec) bb.cursor = 0;
        const uint4* base = c.buf + bb.cursor;
        CHECK(cudaMemsetAsync(bb.slots, 0, c.sms * sizeof(unsigned), c.s));
        CHECK(cudaEventRecord(c.e0, c.s));
        launcher(base, chunk_vec);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(c.e1, c.s));
        double us = elapsed_us(c);
        bb.cursor += nb * chunk_vec;
        return std::make_pair(us, base);
    };
    CHECK(cudaMemsetAsync(c.scratch + 1, 0, sizeof(unsigned), c.s));
    size_t chunk_vec = (256u << 10) / 16;
    launch(chunk_vec);
    double probe_us = launch(chunk_vec).first;
    const double rate_Bpus = nb * chunk_vec * 16.0 / probe_us;
    const double target_us = c.quick ? 120.0 : 250.0;
    chunk_vec = (size_t)std::clamp(rate_Bpus * target_us / nb / 16.0, 4096.0, (1u << 30) / 16.0 / nb);
    chunk_vec = std::max(gran_vec, chunk_vec / gran_vec * gran_vec);
    std::vector<double> us;
    const uint4* last_base = nullptr;
    for (int r = 0; r < 2 + c.reps; ++r) {
        auto tb = launch(chunk_vec);
        if (r >= 2) us.push_back(tb.first);
        last_base = tb.second;
    }
    unsigned errors = 0;
    CHECK(cudaMemcpy(&errors, c.scratch + 1, sizeof errors, cudaMemcpyDeviceToHost));
    if (errors) {  // blocks were not placed bps per SM: no data
        j.num("placement_errors", errors);
        return;
    }
    CHECK(cudaMemcpy(bb.host_part.data(), bb.part, nb * sizeof(unsigned), cudaMemcpyDeviceToHost));
    if (host_xor(bb.host_part, nb) != ref_xor(c, last_base, nb * chunk_vec)) fail("bw read wrong data");
    j.num("bytes", (double)nb * chunk_vec * 16);
    j.list("us", us);
}

static void bw_head(Json& j, const char* set, int ilp, int minb, int regs, int threads, int bps, int n, int stride,
                    int occ, size_t pad, size_t smem_per_sm, int carveout) {
    j.open();
    j.str("set", set);
    j.num("ilp", ilp); j.num("minb", minb); j.num("threads", threads); j.num("bps", bps); j.num("sms", n);
    j.num("stride", stride); j.num("regs", regs); j.num("resident_bps", occ);
    j.num("inflight_per_sm_B", (double)bps * threads * ilp * 16);
    j.num("pad_B", (double)pad); j.num("smem_per_sm_B", (double)smem_per_sm); j.num("carveout_pct", carveout);
}

// bw: exactly bps blocks per SM, forced by dynamic shared memory (so the L1 keeps only what the
// shared memory leaves: 256 - 228 KiB on an H100/H200).
template <int ILP, int MINB>
static void bw_for(Ctx& c, Json& j, BwBufs& bb) {
    auto kernel = k_bw<ILP, MINB>;
    set_smem_attrs(c, kernel, true);
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    std::vector<std::pair<int, int>> placements = {{1, 1}, {8, 1}, {33, 1}, {66, 1}, {132, 1}, {8, 16}, {33, 4}, {66, 2}};
    if (c.quick) placements = {{1, 1}, {33, 1}, {132, 1}};
    const std::vector<int> threads_list = c.quick ? std::vector<int>{256, 1024} : std::vector<int>{128, 256, 512, 1024};
    for (int threads : threads_list) {
        for (int bps : {1, 2, 4, 8}) {
            if (threads * bps > 2048) continue;
            const size_t pad = pad_for(c, kernel, bps);
            int occ = 0;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, pad));
            for (const auto& pl : placements) {
                const int n = pl.first, stride = pl.second;
                if (n * stride > c.sms) continue;
                bw_head(j, "smem_pad", ILP, MINB, fa.numRegs, threads, bps, n, stride, occ, pad,
                        bps * (pad + c.prop.reservedSharedMemPerBlock + fa.sharedSizeBytes), 100);
                if (occ == bps) bw_point(c, j, bb, kernel, threads, bps, n, stride, pad);
                j.close();
            }
        }
    }
}

// bwl1 (a): no padding, the L1 as large as the driver allows (carveout preference 0); blocks per SM
// set by the grid (bps per SM, placed breadth-first; the slot counters check it).
// bwl1 (b): a few configurations with shared memory per SM raised step by step (0..224 KiB), the
// carveout preference following it: how the L1 left over limits one SM's bytes in flight.
template <int ILP, int MINB>
static void bwl1_for(Ctx& c, Json& j, BwBufs& bb) {
    auto kernel = k_bw<ILP, MINB>;
    set_smem_attrs(c, kernel, false);
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, kernel));
    const size_t fixed = c.prop.reservedSharedMemPerBlock + fa.sharedSizeBytes;
    std::vector<int> sms_list = {1, 8, 33, 66, 132};
    if (c.quick) sms_list = {1, 132};
    const std::vector<int> threads_list = c.quick ? std::vector<int>{256, 1024} : std::vector<int>{128, 256, 512, 1024};
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 0));
    for (int threads : threads_list) {
        for (int bps : {1, 2, 4, 8}) {
            if (threads * bps > 2048) continue;
            int occ = 0;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, 0));
            for (int n : sms_list) {
                bw_head(j, "no_pad", ILP, MINB, fa.numRegs, threads, bps, n, 1, occ, 0, bps * fixed, 0);
                if (occ >= bps) bw_point(c, j, bb, kernel, threads, bps, n, 1, 0);
                j.close();
            }
        }
    }
    // (b) only for the configurations that hold 64 KiB or more in flight per SM
    const std::vector<std::pair<int, int>> cfgs = {{1024, 1}, {1024, 2}, {512, 2}};
    const double smem_max = (double)c.prop.sharedMemPerMultiprocessor;
    for (const auto& tb : cfgs) {
        const int threads = tb.first, bps = tb.second;
        if (ILP * threads * bps * 16 < (64 << 10) || (MINB == 1 && bps > 1)) continue;
        for (int kib : {0, 32, 64, 96, 128, 160, 192, 224}) {
            const size_t want = (size_t)kib << 10, per_block = want / bps;
            const size_t pad = per_block > fixed ? per_block - fixed : 0;
            const int carve = std::min(100, (int)std::ceil(100.0 * bps * (pad + fixed) / smem_max));
            CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carve));
            int occ = 0;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, threads, pad));
            for (int n : {1, 132}) {
                bw_head(j, "l1", ILP, MINB, fa.numRegs, threads, bps, n, 1, occ, pad, bps * (pad + fixed), carve);
                if (occ >= bps) bw_point(c, j, bb, kernel, threads, bps, n, 1, pad);
                j.close();
            }
        }
    }
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 0));
}

static std::string run_bw(Ctx& c, bool l1) {
    BwBufs bb;
    CHECK(cudaMalloc(&bb.slots, c.sms * sizeof(unsigned)));
    CHECK(cudaMalloc(&bb.part, 8 * c.sms * sizeof(unsigned)));
    bb.host_part.resize(8 * c.sms);
    Json j;
    if (l1) {
        bwl1_for<1, 2>(c, j, bb);
        bwl1_for<2, 2>(c, j, bb);
        bwl1_for<4, 2>(c, j, bb);
        bwl1_for<8, 1>(c, j, bb);
        bwl1_for<16, 1>(c, j, bb);
    } else {
        bw_for<1, 2>(c, j, bb);
        bw_for<2, 2>(c, j, bb);
        bw_for<4, 2>(c, j, bb);
        bw_for<8, 2>(c, j, bb);
        bw_for<8, 1>(c, j, bb);
        bw_for<16, 1>(c, j, bb);
    }
    CHECK(cudaFree(bb.slots));
    CHECK(cudaFree(bb.part));
    return "\"points\": [" + j.s + "]";
}

// tma: one SM's draw and the chip's versus the bytes a TMA pipeline keeps in flight.
// tma_bps: the same without the fence, with 1, 2 or 4 blocks (pipelines) per SM, each padded to
// a 1/bps share of the shared memory: do copies overlap across blocks where they did not within one?
static std::string run_tma(Ctx& c, bool fence, bool vary_bps = false) {
    BwBufs bb;
    CHECK(cudaMalloc(&bb.slots, c.sms * sizeof(unsigned)));
    CHECK(cudaMalloc(&bb.part, 8 * c.sms * sizeof(unsigned)));
    bb.host_part.resize(8 * c.sms);
    set_smem_attrs(c, k_tma, false);
    Json j;
    std::vector<int> sms_list = {1, 8, 33, 132};
    if (c.quick || vary_bps) sms_list = {1, 132};
    const std::vector<int> bps_list = vary_bps ? std::vector<int>{1, 2, 4} : std::vector<int>{1};
    for (int bps : bps_list) {
      for (unsigned kib : {4u, 8u, 16u, 32u}) {
        for (int depth : {1, 2, 4, 8, 12, 16}) {
            if (vary_bps && depth != 2 && depth != 4) continue;
            const size_t stages = (size_t)depth * (kib << 10);
            const size_t smem = bps == 1 ? stages : pad_for(c, k_tma, bps);
            if (stages > 200u << 10 || stages > smem) continue;
            for (int n : sms_list) {
                j.open();
                j.num("stage_B", kib << 10); j.num("depth", depth); j.num("sms", n); j.num("threads", 256);
                j.num("fence", fence ? 1 : 0); j.num("bps", bps);
                j.num("inflight_per_sm_B", (double)stages * bps);
                const unsigned stage_B = kib << 10;
                measure_point(c, j, bb, n * bps, stage_B / 16, [&](const uint4* base, size_t chunk_vec) {
                    k_tma<<<c.sms * bps, 256, smem, c.s>>>(reinterpret_cast<const unsigned char*>(base), chunk_vec * 16,
                                                          stage_B, depth, n, bb.slots, bb.part, c.scratch + 1,
                                                          fence ? 1 : 0, bps);
                });
                j.close();
            }
        }
      }
    }
    CHECK(cudaFree(bb.slots));
    CHECK(cudaFree(bb.part));
    return "\"points\": [" + j.s + "]";
}

// ------------------------------------------------------------------------------------ 2./3. chains
struct Shape {
    const char* name;
    int threads;
    int blocks_per_sm;   // 0: one block per bytes_per_block
    size_t bytes_per_block;
    bool exclusive;      // shared memory so large that no second block fits on the SM
};
static const Shape SHAPES[] = {
    {"1/SM", 512, 1, 0, false},
    {"1/SM-excl", 512, 1, 0, true},
    {"2/SM", 512, 2, 0, false},
    {"4/SM", 256, 4, 0, false},
    {"8/SM", 256, 8, 0, false},
    {"16KiB/block", 256, 0, 16u << 10, false},
};
static const char* MODE_NAMES[] = {"graph", "pdl_never", "pdl_late", "pdl_early", "pdl_early_readfirst"};

struct Chain {
    unsigned* part;    // kmax x max_blocks words
    unsigned* sm_of;   // kmax x max_blocks: the SM each block ran on
    unsigned* tokens;  // kmax + 1
    int max_blocks;
    int kmax;
};

static int blocks_of(const Ctx& c, const Shape& sh, size_t bytes) {
    if (sh.blocks_per_sm) return c.sms * sh.blocks_per_sm;
    return (int)std::max<size_t>(1, (bytes + sh.bytes_per_block - 1) / sh.bytes_per_block);
}

// Launch chain member i of region `w` (bytes) with shape sh and mode.
static void launch_member(Ctx& c, Chain& ch, const Shape& sh, int mode, const uint4* w, size_t bytes, int i, size_t pad) {
    const int blocks = blocks_of(c, sh, bytes);
    const size_t total_vec = bytes / 16, chunk_vec = (total_vec + blocks - 1) / blocks;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(sh.threads);
    cfg.dynamicSmemBytes = sh.exclusive ? pad : 0;
    cfg.stream = c.s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = mode == M_PLAIN ? 0 : 1;
    CHECK(cudaLaunchKernelEx(&cfg, k_chain<4>, w, chunk_vec, total_vec, ch.part + (size_t)i * ch.max_blocks,
                             ch.sm_of + (size_t)i * ch.max_blocks, ch.tokens + i, mode));
}

// Build a graph of k members (member i reads region i: buf + i * bytes), replay it after a flush;
// returns us per replay. Checks the last replay: tokens and the XOR of every block's word. With
// `placement`, sets it to the mean over members 1..k-1 of the most blocks one SM ran.
static std::vector<double> time_chain(Ctx& c, Chain& ch, const Shape& sh, int mode, size_t bytes, int k, size_t pad,
                                      unsigned want, int reps, double* placement = nullptr) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < k; ++i) launch_member(c, ch, sh, mode, c.buf + (size_t)i * (bytes / 16), bytes, i, pad);
    CHECK(cudaStreamEndCapture(c.s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    CHECK(cudaGraphDestroy(g));
    const int blocks = blocks_of(c, sh, bytes);
    std::vector<double> us;
    for (int r = 0; r < 2 + reps; ++r) {
        const bool last = r == 1 + reps;
        CHECK(cudaMemsetAsync(ch.tokens, 0, (ch.kmax + 1) * sizeof(unsigned), c.s));
        if (last) CHECK(cudaMemsetAsync(ch.part, 0xff, (size_t)ch.kmax * ch.max_blocks * sizeof(unsigned), c.s));
        do_flush(c);
        CHECK(cudaEventRecord(c.e0, c.s));
        CHECK(cudaGraphLaunch(ge, c.s));
        CHECK(cudaEventRecord(c.e1, c.s));
        double t = elapsed_us(c);
        if (r >= 2) us.push_back(t);
    }
    CHECK(cudaGraphExecDestroy(ge));
    std::vector<unsigned> tok(k + 1), part((size_t)k * ch.max_blocks);
    CHECK(cudaMemcpy(tok.data(), ch.tokens, (k + 1) * sizeof(unsigned), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(part.data(), ch.part, part.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
    if (tok[k] != (unsigned)k) fail("chain token did not pass through every kernel in order");
    unsigned x = 0;
    for (int i = 0; i < k; ++i)
        for (int b = 0; b < blocks; ++b) {
            unsigned v = part[(size_t)i * ch.max_blocks + b];
            if (v == 0xffffffffu) fail("chain: a block wrote no result");
            x ^= v;
        }
    if (x != want) fail("chain read wrong data");
    if (placement && k > 1) {
        std::vector<unsigned> where((size_t)k * ch.max_blocks);
        CHECK(cudaMemcpy(where.data(), ch.sm_of, where.size() * sizeof(unsigned), cudaMemcpyDeviceToHost));
        double sum = 0;
        for (int i = 1; i < k; ++i) {
            std::vector<int> count(c.sms, 0);
            for (int b = 0; b < blocks; ++b) ++count[where[(size_t)i * ch.max_blocks + b] % c.sms];
            sum += *std::max_element(count.begin(), count.end());
        }
        *placement = sum / (k - 1);
    }
    return us;
}

static Chain make_chain(Ctx& c, int kmax, int max_blocks) {
    Chain ch;
    ch.kmax = kmax;
    ch.max_blocks = max_blocks;
    CHECK(cudaMalloc(&ch.part, (size_t)kmax * max_blocks * sizeof(unsigned)));
    CHECK(cudaMalloc(&ch.sm_of, (size_t)kmax * max_blocks * sizeof(unsigned)));
    CHECK(cudaMalloc(&ch.tokens, (kmax + 1) * sizeof(unsigned)));
    return ch;
}

static std::string run_chain(Ctx& c) {
    const int k = 32;
    std::vector<size_t> sizes = {1u << 20, 4u << 20, 16u << 20, 64u << 20};
    if (c.quick) sizes = {4u << 20, 16u << 20};
    Chain ch = make_chain(c, k, (64 << 20) / (16 << 10));
    set_smem_attrs(c, k_chain<4>, false);
    const size_t pad = c.prop.sharedMemPerBlockOptin / 2 + 1024;  // one block per SM
    Json j;
    for (size_t bytes : sizes) {
        const unsigned want = ref_xor(c, c.buf, k * bytes / 16);
        for (const Shape& sh : SHAPES) {
            for (int mode = 0; mode < 5; ++mode) {
                double placement = 0;
                auto us = time_chain(c, ch, sh, mode, bytes, k, pad, want, c.reps, &placement);
                j.open();
                j.num("max_blocks_per_sm", placement);
                j.num("bytes", (double)bytes); j.str("shape", sh.name); j.str("mode", MODE_NAMES[mode]);
                j.num("blocks", blocks_of(c, sh, bytes)); j.num("threads", sh.threads); j.num("kernels", k);
                j.list("us", us);
                j.close();
            }
        }
    }
    CHECK(cudaFree(ch.part));
    CHECK(cudaFree(ch.sm_of));
    CHECK(cudaFree(ch.tokens));
    return "\"k\": " + std::to_string(k) + ", \"points\": [" + j.s + "]";
}

static std::string run_cost(Ctx& c) {
    const int n = 16;
    std::vector<size_t> sizes;
    for (size_t b = 64u << 10; b <= (512u << 20); b *= 4) sizes.push_back(b);
    sizes.push_back(512u << 20);
    if (c.quick) sizes = {64u << 10, 4u << 20, 64u << 20};
    Chain ch = make_chain(c, n, (512 << 20) / (16 << 10));
    Json j;
    for (size_t bytes : sizes) {
        const unsigned want16 = ref_xor(c, c.buf, n * bytes / 16), want1 = ref_xor(c, c.buf, bytes / 16);
        for (const Shape& sh : SHAPES) {
            if (sh.exclusive) continue;
            auto g16 = time_chain(c, ch, sh, M_PLAIN, bytes, n, 0, want16, c.reps);
            auto g1 = time_chain(c, ch, sh, M_PLAIN, bytes, 1, 0, want1, c.reps);
            std::vector<double> single;  // one launch between events, after a flush
            for (int r = 0; r < 2 + c.reps; ++r) {
                do_flush(c);
                CHECK(cudaEventRecord(c.e0, c.s));
                launch_member(c, ch, sh, M_PLAIN, c.buf, bytes, 0, 0);
                CHECK(cudaEventRecord(c.e1, c.s));
                double t = elapsed_us(c);
                if (r >= 2) single.push_back(t);
            }
            j.open();
            j.num("bytes", (double)bytes); j.str("shape", sh.name); j.num("blocks", blocks_of(c, sh, bytes));
            j.num("threads", sh.threads); j.num("n", n);
            j.list("graph_n_us", g16); j.list("graph_1_us", g1); j.list("event_us", single);
            j.close();
        }
    }
    CHECK(cudaFree(ch.part));
    CHECK(cudaFree(ch.sm_of));
    CHECK(cudaFree(ch.tokens));
    return "\"points\": [" + j.s + "]";
}

// ------------------------------------------------------------------------------------ 4. opb
static std::string run_opb(Ctx& c) {
    const int G = c.sms, n_ops = 100, threads = 512;
    unsigned *cnt, *part;
    unsigned long long *stamps, *bg, *gt;
    CHECK(cudaMalloc(&cnt, n_ops * sizeof(unsigned)));
    CHECK(cudaMalloc(&part, G * sizeof(unsigned)));
    CHECK(cudaMalloc(&stamps, (size_t)n_ops * G * 2 * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&bg, sizeof(unsigned long long)));
    CHECK(cudaMalloc(&gt, 3 * sizeof(unsigned long long)));
    set_smem_attrs(c, k_opb, true);
    const size_t pad = c.prop.sharedMemPerBlockOptin / 2 + 1024;  // one block per SM: all co-resident
    int occ = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_opb, threads, pad));
    if (occ != 1) fail("opb: not exactly one block per SM");
    k_gtimer_step<<<1, 1, 0, c.s>>>(gt);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(c.s));  // cudaMemcpy's legacy stream does not wait for c.s
    unsigned long long gts[3];
    CHECK(cudaMemcpy(gts, gt, sizeof gts, cudaMemcpyDeviceToHost));
    struct Cfg { const char* name; int mode; long long work_ns; size_t region_B; };
    std::vector<Cfg> cfgs = {{"idle", 0, 0, 0}, {"idle", 0, 2000, 0}, {"loaded", 1, 0, 0}, {"loaded", 1, 2000, 0}};
    for (size_t kb : {16, 64, 256, 1024}) {
        cfgs.push_back({"drain", 2, 0, kb << 10});
        cfgs.push_back({"single", 3, 0, kb << 10});
    }
    const size_t bg_vec = (8u << 20) / 16;
    Json j;
    std::vector<unsigned long long> st((size_t)n_ops * G * 2);
    std::vector<unsigned> hp(G);
    for (const Cfg& f : cfgs) {
        const size_t region_vec = f.region_B / 16, span_vec = c.buf_vec;
        std::vector<double> us, lat_first, lat_last, skew, bg_GBps;
        for (int r = 0; r < 2 + std::max(5, c.reps / 2); ++r) {
            CHECK(cudaMemsetAsync(cnt, 0, n_ops * sizeof(unsigned), c.s));
            CHECK(cudaMemsetAsync(bg, 0, sizeof(unsigned long long), c.s));
            do_flush(c);
            CHECK(cudaEventRecord(c.e0, c.s));
            k_opb<<<G, threads, pad, c.s>>>(c.buf, region_vec, span_vec, bg_vec, n_ops, f.mode, f.work_ns, cnt, stamps,
                                            part, bg);
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(c.e1, c.s));
            double t = elapsed_us(c);
            if (r < 2) continue;
            us.push_back(t);
            unsigned long long bgb = 0;
            CHECK(cudaMemcpy(&bgb, bg, sizeof bgb, cudaMemcpyDeviceToHost));
            bg_GBps.push_back(bgb / t / 1e3);
            if (f.mode == 3) continue;
            CHECK(cudaMemcpy(st.data(), stamps, st.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
            std::vector<double> lf, ll, sk;
            for (int op = 5; op < n_ops; ++op) {  // the first ops include the blocks' start
                unsigned long long last_rel = 0, first_rel = ~0ull, first_res = ~0ull, last_res = 0;
                for (int b = 0; b < G; ++b) {
                    unsigned long long rel = st[((size_t)op * G + b) * 2], res = st[((size_t)op * G + b) * 2 + 1];
                    last_rel = std::max(last_rel, rel); first_rel = std::min(first_rel, rel);
                    first_res = std::min(first_res, res); last_res = std::max(last_res, res);
                }
                lf.push_back((double)(long long)(first_res - last_rel));
                ll.push_back((double)(long long)(last_res - last_rel));
                sk.push_back((double)(last_rel - first_rel));
            }
            auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
            lat_first.push_back(med(lf)); lat_last.push_back(med(ll)); skew.push_back(med(sk));
        }
        if (f.mode >= 2) {  // the streaming modes read known data: check it
            CHECK(cudaMemcpy(hp.data(), part, G * sizeof(unsigned), cudaMemcpyDeviceToHost));
            unsigned want = 0;
            std::vector<unsigned> got(1);
            for (int op = 0; op < n_ops; ++op)
                for (int b = 0; b < G; ++b) {
                    const size_t base = (((size_t)op * G + b) * region_vec) % (span_vec - region_vec);
                    want ^= ref_xor(c, c.buf + base, region_vec);
                }
            if (host_xor(hp, G) != want) fail("opb read wrong data");
        }
        j.open();
        j.str("mode", f.name); j.num("work_ns", (double)f.work_ns); j.num("region_B", (double)f.region_B);
        j.num("n_ops", n_ops); j.num("blocks", G); j.num("threads", threads);
        j.list("us", us); j.list("lat_first_ns", lat_first); j.list("lat_last_ns", lat_last);
        j.list("release_skew_ns", skew); j.list("bg_GBps", bg_GBps);
        j.close();
    }
    for (void* p : {(void*)cnt, (void*)part, (void*)stamps, (void*)bg, (void*)gt}) CHECK(cudaFree(p));
    char b[160];
    std::snprintf(b, sizeof b, "\"globaltimer_step_ns\": %llu, \"globaltimer_changes\": %llu, \"globaltimer_span_ns\": %llu, ",
                  gts[0], gts[1], gts[2]);
    return std::string(b) + "\"points\": [" + j.s + "]";
}


// ------------------------------------------------------------------------------------ 7. poll
static std::string run_poll(Ctx& c) {
    const int G = c.sms, threads = 512;
    unsigned* part;
    int* err;
    unsigned long long* stamps;
    uint4* polled;
    const size_t max_poll_B = 256u << 10;
    CHECK(cudaMalloc(&part, G * sizeof(unsigned)));
    CHECK(cudaMalloc(&err, sizeof(int)));
    CHECK(cudaMalloc(&stamps, (size_t)G * 4 * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&polled, (size_t)G * max_poll_B));
    set_smem_attrs(c, k_poll, true);
    const size_t pad = c.prop.sharedMemPerBlockOptin / 2 + 1024;  // one block per SM: all co-resident
    int occ = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_poll, threads, pad));
    if (occ != 1) fail("poll: not exactly one block per SM");
    const size_t stream_vec = (c.quick ? (1u << 20) : (4u << 20)) / 16;  // per SM: 4 MiB (~120 us)
    struct Cfg { const char* name; int mode; int shared; size_t poll_B; bool stream; };
    std::vector<Cfg> cfgs = {{"stream", 0, 1, 0, true}};
    for (size_t kb : {4, 16, 64, 256}) {
        cfgs.push_back({"pending", 1, 1, kb << 10, true});
        cfgs.push_back({"pending", 1, 0, kb << 10, true});
        cfgs.push_back({"seen", 2, 1, kb << 10, false});
        cfgs.push_back({"seen", 2, 1, kb << 10, true});
    }
    Json j;
    std::vector<unsigned long long> st((size_t)G * 4);
    std::vector<unsigned> hp(G);
    size_t cursor = 0;
    for (const Cfg& f : cfgs) {
        std::vector<double> us, stream_us, GBps, passes, seen_med, seen_max, seen_min;
        const int poll_vec = (int)(f.poll_B / 16);
        for (int r = 0; r < 2 + std::max(5, c.reps / 2); ++r) {
            const size_t sv = f.stream ? stream_vec : 0;
            if ((cursor + (size_t)G * sv) > c.buf_vec) cursor = 0;
            const uint4* base = c.buf + cursor;
            cursor += (size_t)G * sv;
            CHECK(cudaMemsetAsync(polled, 0xff, (size_t)G * max_poll_B, c.s));
            CHECK(cudaMemsetAsync(stamps, 0, st.size() * sizeof(unsigned long long), c.s));
            CHECK(cudaMemsetAsync(err, 0, sizeof(int), c.s));
            do_flush(c);
            CHECK(cudaEventRecord(c.e0, c.s));
            k_poll<<<G, threads, pad, c.s>>>(base, sv, polled, poll_vec, f.mode, f.shared, 20000, stamps, part, err);
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(c.e1, c.s));
            const double t = elapsed_us(c);
            int e = 0;
            CHECK(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
            if (e) fail("poll: a poller waited past 200 ms");
            if (r < 2) continue;
            us.push_back(t);
            CHECK(cudaMemcpy(st.data(), stamps, st.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
            if (sv) {
                const int b0 = f.mode == 2 ? 1 : 0;  // mode 2: block 0 writes instead
                unsigned long long s0 = ~0ull, s1 = 0;
                for (int b = b0; b < G; ++b) { s0 = std::min(s0, st[b * 4]); s1 = std::max(s1, st[b * 4 + 1]); }
                stream_us.push_back((s1 - s0) / 1e3);
                GBps.push_back((double)(G - b0) * sv * 16 / ((s1 - s0) / 1e9) / 1e9);
                CHECK(cudaMemcpy(hp.data(), part, G * sizeof(unsigned), cudaMemcpyDeviceToHost));
                if (host_xor(hp, G) != ref_xor(c, base + b0 * sv, (size_t)(G - b0) * sv))
                    fail("poll: the stream read wrong data");
            }
            double np = 0;
            std::vector<double> seen;
            for (int b = 0; b < G; ++b) {
                np += (double)st[b * 4 + 3];
                if (f.mode == 2 && b > 0) seen.push_back((double)(long long)(st[b * 4 + 2] - st[2]));
            }
            passes.push_back(np / (f.mode == 2 ? G - 1 : G));
            if (!seen.empty()) {
                std::sort(seen.begin(), seen.end());
                seen_min.push_back(seen.front()); seen_med.push_back(seen[seen.size() / 2]); seen_max.push_back(seen.back());
            }
        }
        j.open();
        j.str("mode", f.name); j.num("shared", f.shared); j.num("poll_B", (double)f.poll_B);
        j.num("stream_B_per_sm", f.stream ? (double)stream_vec * 16 : 0.0); j.num("blocks", G); j.num("threads", threads);
        j.num("poll_batch", POLL_BATCH);
        j.list("us", us); j.list("stream_us", stream_us); j.list("stream_GBps", GBps); j.list("passes", passes);
        j.list("seen_min_ns", seen_min); j.list("seen_med_ns", seen_med); j.list("seen_max_ns", seen_max);
        j.close();
    }
    for (void* p : {(void*)part, (void*)err, (void*)stamps, (void*)polled}) CHECK(cudaFree(p));
    return "\"points\": [" + j.s + "]";
}

// ------------------------------------------------------------------------------------ 8. bcast
static std::string run_bcast(Ctx& c) {
    const int G = c.sms, threads = 512;
    unsigned* part;
    int* err;
    unsigned long long* stamps;
    uint4* polled;
    const size_t max_B = 128u << 10;
    CHECK(cudaMalloc(&part, G * sizeof(unsigned)));
    CHECK(cudaMalloc(&err, sizeof(int)));
    CHECK(cudaMalloc(&stamps, (size_t)G * 4 * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&polled, (size_t)G * max_B + 16));
    set_smem_attrs(c, k_poll, true);
    const size_t pad = c.prop.sharedMemPerBlockOptin / 2 + 1024;
    struct Cfg { int shared; size_t B; long long settle_ns; };
    std::vector<Cfg> cfgs;
    for (size_t kb : {1, 4, 16, 32, 64, 128})
        for (int sh : {1, 0})
            for (long long settle : {0ll, 20000ll}) cfgs.push_back({sh, kb << 10, settle});
    Json j;
    std::vector<unsigned long long> st((size_t)G * 4);
    std::vector<unsigned> hp(G);
    std::vector<uint4> host;
    for (const Cfg& f : cfgs) {
        const int vec = (int)(f.B / 16);
        std::vector<double> us, rd_med, rd_max, flag_med;
        for (int r = 0; r < 2 + std::max(5, c.reps / 2); ++r) {
            CHECK(cudaMemsetAsync(polled, 0, (size_t)G * max_B + 16, c.s));
            CHECK(cudaMemsetAsync(stamps, 0, st.size() * sizeof(unsigned long long), c.s));
            CHECK(cudaMemsetAsync(err, 0, sizeof(int), c.s));
            do_flush(c);
            CHECK(cudaEventRecord(c.e0, c.s));
            k_poll<<<G, threads, pad, c.s>>>(c.buf, 0, polled, vec, 3, f.shared, f.settle_ns, stamps, part, err);
            CHECK(cudaGetLastError());
            CHECK(cudaEventRecord(c.e1, c.s));
            const double t = elapsed_us(c);
            int e = 0;
            CHECK(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
            if (e) fail("bcast: a reader waited past 200 ms");
            if (r < 2) continue;
            us.push_back(t);
            CHECK(cudaMemcpy(st.data(), stamps, st.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(hp.data(), part, G * sizeof(unsigned), cudaMemcpyDeviceToHost));
            unsigned want = 0;  // every reader's XOR of the words it read: 2i+1 ^ 7 ^ 9 ^ 11 per word i
            for (int b = 1; b < G; ++b) {
                unsigned x = 0;
                const size_t i0 = f.shared ? 0 : (size_t)b * vec;
                for (size_t i = i0; i < i0 + (size_t)vec; ++i) x ^= (unsigned)(2 * i + 1) ^ 7u ^ 9u ^ 11u;
                want ^= x;
            }
            if (host_xor(hp, G) != want) fail("bcast read wrong data");
            std::vector<double> rd, fl;
            for (int b = 1; b < G; ++b) {
                rd.push_back((double)(long long)(st[b * 4 + 1] - st[b * 4]));
                fl.push_back((double)(long long)(st[b * 4] - st[2]));
            }
            std::sort(rd.begin(), rd.end());
            std::sort(fl.begin(), fl.end());
            rd_med.push_back(rd[rd.size() / 2]); rd_max.push_back(rd.back()); flag_med.push_back(fl[fl.size() / 2]);
        }
        j.open();
        j.str("mode", "bcast"); j.num("shared", f.shared); j.num("bytes", (double)f.B); j.num("settle_ns", (double)f.settle_ns);
        j.num("blocks", G); j.num("threads", threads);
        j.list("us", us); j.list("read_med_ns", rd_med); j.list("read_max_ns", rd_max); j.list("flag_med_ns", flag_med);
        j.close();
    }
    for (void* p : {(void*)part, (void*)err, (void*)stamps, (void*)polled}) CHECK(cudaFree(p));
    return "\"points\": [" + j.s + "]";
}

// ------------------------------------------------------------------------------------ main
int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: mech_bench bw|bwl1|tma|tma_nofence|tma_bps|chain|cost|opb|poll|bcast [--quick]\n");
        return 2;
    }
    const std::string what = argv[1];
    Ctx c;
    c.quick = argc > 2 && std::string(argv[2]) == "--quick";
    c.reps = c.quick ? 5 : 11;
    CHECK(cudaGetDeviceProperties(&c.prop, 0));
    c.sms = c.prop.multiProcessorCount;
    CHECK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&c.e0));
    CHECK(cudaEventCreate(&c.e1));
    c.buf_vec = (c.quick ? (2ull << 30) : (8ull << 30)) / 16;
    c.flush_vec = (256ull << 20) / 16;
    CHECK(cudaMalloc(&c.buf, c.buf_vec * 16));
    CHECK(cudaMalloc(&c.flush, c.flush_vec * 16));
    CHECK(cudaMalloc(&c.scratch, 16 * sizeof(unsigned)));
    k_fill<<<c.sms * 8, 256, 0, c.s>>>(c.buf, c.buf_vec, 0x1234567u);
    k_fill<<<c.sms * 8, 256, 0, c.s>>>(c.flush, c.flush_vec, 0x7654321u);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(c.s));
    const double t0 = now_s();
    std::string body;
    if (what == "bw") body = run_bw(c, false);
    else if (what == "bwl1") body = run_bw(c, true);
    else if (what == "tma") body = run_tma(c, true);
    else if (what == "tma_nofence") body = run_tma(c, false);
    else if (what == "tma_bps") body = run_tma(c, false, true);
    else if (what == "chain") body = run_chain(c);
    else if (what == "cost") body = run_cost(c);
    else if (what == "opb") body = run_opb(c);
    else if (what == "poll") body = run_poll(c);
    else if (what == "bcast") body = run_bcast(c);
    else { std::fprintf(stderr, "mech_bench: unknown sweep %s\n", what.c_str()); return 2; }
    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("{\"sweep\": \"%s\", \"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %d, \"smem_per_sm\": %zu, "
                "\"driver_version\": %d, \"runtime_version\": %d, \"quick\": %s, \"seconds\": %.2f, %s}\n",
                what.c_str(), c.prop.name, c.sms, c.prop.l2CacheSize, c.prop.sharedMemPerMultiprocessor, driver, runtime,
                c.quick ? "true" : "false", now_s() - t0, body.c_str());
    return 0;
}
