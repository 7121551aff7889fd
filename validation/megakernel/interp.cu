// The megakernel interpreter (first version: matvec tasks, op-counter and tile-flag dependencies).
//
// One block per SM walks its queue of task rows (see validation/megakernel/encode.py): wait for the
// task's dependencies, run its device function on its tile, publish completion (the op's counter,
// and the tile's flag). Loads are synchronous in this version: no shared-memory prefetch yet.
#include "mk_device.cuh"

#define MK_TASK_FIELDS 8
#define MK_DEP_OP 0
#define MK_DEP_TILES 1
#define MK_OP_MATMUL 3
#define MK_SPIN_LIMIT_NS 2000000000ull  // a dependency not met in 2 s is a hang: report it, stop
#ifndef MK_UNROLL
#define MK_UNROLL 2                      // 16-byte weight loads in flight per lane
#endif

struct MkOp {                 // one op's buffers and shape (written by the runner)
    const mk_bf16* W;         // [N, K] bf16, row-major
    const float* x;           // [K] input vector (the producer's output)
    float* y;                 // [N] output vector
    int K, N, flag_base, pad;
};

__device__ __forceinline__ unsigned mk_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long mk_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Spin until *p >= want; false (and the error word set) after MK_SPIN_LIMIT_NS.
__device__ __forceinline__ bool mk_wait_at_least(const unsigned* p, unsigned want, int* error, int code) {
    const unsigned long long t0 = mk_now();
    while (mk_ld_acquire(p) < want) {
        if (mk_now() - t0 > MK_SPIN_LIMIT_NS) { atomicExch(error, code); return false; }
        if (*(volatile int*)error) return false;
    }
    return true;
}

extern "C" __global__ void mk_interp(const int* __restrict__ tasks, const int* __restrict__ queue_start,
                                     const int* __restrict__ deps, const int* __restrict__ op_tiles,
                                     const MkOp* __restrict__ ops, unsigned* counters, unsigned* flags,
                                     int* error) {
    extern __shared__ float xs[];
    __shared__ int ok;
    int x_of = -1;  // the op whose input vector xs holds: consecutive tiles of one op reuse it
    for (int i = queue_start[blockIdx.x]; i < queue_start[blockIdx.x + 1]; ++i) {
        const int* t = tasks + (size_t)i * MK_TASK_FIELDS;
        const int opcode = t[0], op = t[1], tile = t[2], lo = t[3], hi = t[4], d0 = t[5], nd = t[6];
        if (threadIdx.x == 0) {
            ok = 1;
            for (int k = d0; k < d0 + nd && ok; ++k) {
                const int kind = deps[4 * k], p = deps[4 * k + 1], t0 = deps[4 * k + 2], t1 = deps[4 * k + 3];
                if (kind == MK_DEP_OP) {
                    ok = mk_wait_at_least(counters + p, (unsigned)op_tiles[p], error, 1);
                } else {
                    for (int tt = t0; tt < t1 && ok; ++tt) ok = mk_wait_at_least(flags + ops[p].flag_base + tt, 1u, error, 2);
                }
            }
        }
        __syncthreads();
        if (!ok) return;
        if (opcode == MK_OP_MATMUL) {
            const MkOp o = ops[op];
            if (x_of != op) {
                mk_load_vector(xs, o.x, o.K);
                x_of = op;
                __syncthreads();
            }
            mk_matvec_rows<MK_UNROLL>(o.W, xs, o.y, lo, hi, o.K);
        } else if (threadIdx.x == 0) {
            atomicExch(error, 100 + opcode);  // no device function for this opcode in this version
        }
        __threadfence();  // every thread's writes are visible device-wide before the release below
        __syncthreads();
        if (threadIdx.x == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(flags + ops[op].flag_base + tile) : "memory");
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(counters + op) : "memory");
        }
        __syncthreads();
    }
}
