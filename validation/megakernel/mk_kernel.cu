// mksim's generated kernels: one persistent megakernel that interprets per-SM task queues, the
// same with a grid barrier between ops, and one kernel per op for the chain modes. All three run
// the device functions of validation/kernels/mk_ops.cuh on the same block layout:
//
//   warps 0 .. MK_CONSUMERS-1   workers: wait for a task's inputs, compute it, publish it;
//   warp  MK_CONSUMERS          producer: one lane streams the weight rows of every matmul task of
//                               the block's queue into a ring of shared-memory pages with
//                               cp.async.bulk, each page guarded by a `full` and an `empty` mbarrier;
//   warp  MK_CONSUMERS + 1      publisher (megakernel): one lane makes each finished task visible
//                               (a gpu-scope fence, then the tile's flag and the op's counter), so
//                               that the workers go on to their next task without waiting for it;
//   warp  MK_CONSUMERS + 2      waiter (persistent kernels): reads the next task's row and op
//                               description into a shared-memory slot and waits for its
//                               dependencies while the workers still compute the current task, so
//                               that neither the table loads nor the polling sit between two tasks;
//   warp  MK_CONSUMERS + 3      L2 prefetcher (persistent kernels, when MkParams.l2_lead_B > 0):
//                               walks the queue ahead of the producer and asks L2 for the weight
//                               rows and KV-cache rows of the coming tasks, up to l2_lead_B bytes
//                               ahead of the producer's position (mk_l2_prefetch).
//
// Weights never depend on activations, so the producer runs ahead of the workers across task and
// op boundaries, as far as the ring allows (its depth is the schedule's prefetch_depth, its page
// the schedule's page_KiB). Dependencies (megakernel): a whole-op dependency waits for the op's
// counter to reach its tile count, a partial one for the tiles' flags; both are published with
// red.release.gpu after every worker fenced its writes, and read with ld.acquire.gpu. With
// sync="flag" every dependency waits on tile flags. With sync="sentinel" (Kog's data as its own
// flag) there is neither: outputs start as all-ones bytes, producers write them with plain stores,
// and the waiter polls the very bytes its task will read until none is the sentinel (see
// mk_poll_data and SentinelPlan in program.py); the publisher warp then resets the other step's
// outputs instead. Any wait that lasts MK_SPIN_LIMIT_NS sets an error code and makes every warp of
// the grid stop: a hang becomes an error the host reports.
#include "mk_ops.cuh"

#ifndef MK_CONSUMERS
#define MK_CONSUMERS 8
#endif
#define MK_NW (MK_CONSUMERS * 32)
#define MK_THREADS (MK_NW + 128)  // + the producer, publisher, waiter and L2 prefetcher warps
#define MK_SLOTS 2                // tasks the waiter prepares ahead of the workers
#define MK_SLOT_B 224             // bytes of a task slot (SLOT_B in program.py)
#define MK_TASK_FIELDS 8
#define MK_DEP_OP 0
#define MK_SPIN_LIMIT_NS 2000000000ull
// MK_TRACE_X (a diagnostic; default 0): a tensor-core matmul task's stamps 0 and 3 (otherwise its
// wait's start and its hand-over) become, with 1, the moment its input rows are in shared memory
// and, with 2, the moment its first page is in; with either, the moment warp 0 is done with its
// last page (before the flush). Other tasks then keep only stamps 1 and 2.
#ifndef MK_TRACE_X
#define MK_TRACE_X 0
#endif
// Diagnostics that give wrong products (timing only): MK_NO_COPY=1, the producer marks a page full
// without copying into it (what the workers alone take); MK_NO_MMA=1, the tensor-core matmul's
// workers skip a page's arithmetic (what the ring's copies alone take).
#ifndef MK_NO_COPY
#define MK_NO_COPY 0
#endif
#ifndef MK_NO_MMA
#define MK_NO_MMA 0
#endif
// MK_MM_GROUPS (an experiment; default 1): the tensor-core matmul's worker warps form this many
// groups that take a task's pages in turn, each page split over one group's warps (1: every page
// over all of them). A page's fixed cost in the workers (its wait, the run's bounds, the deposit,
// the arrival) is then paid by fewer warps, each taking a longer run of the page.
#ifndef MK_MM_GROUPS
#define MK_MM_GROUPS 1
#endif
#if MK_MM_GROUPS != 1 && MK_MM_GROUPS != 2 && MK_MM_GROUPS != 4
#error "MK_MM_GROUPS must be 1, 2 or 4"
#endif

// error codes (validation/megakernel/gpu.py turns them into messages)
#define MK_ERR_COUNTER 1
#define MK_ERR_FLAG 2
#define MK_ERR_BARRIER 3
#define MK_ERR_PIPE 4
#define MK_ERR_ATTN 5
#define MK_ERR_OPCODE 6
#define MK_ERR_BATCH 7
#define MK_ERR_DATA 8
#define MK_ERR_SLOTS 9            // MK_MM=2: fewer row-group slots than one page's row groups (program.acc_rows)
#define MK_ERR_KCHUNK 10          // a k-chunked matmul without its slots or chunk shape (program.check_kc_slots), or MK_MM=1

// The tensor-core matmul's row sums (see "matmul on the tensor cores"): 1, each warp adds its 16 x 8
// partial into shared fp32 row sums with atomicAdd after every page (a CAS loop on sm_90); 2, each
// warp keeps its partial of a 16-row group in registers across pages and stores it once into a
// slot of its own, and a flush sums the warps' slots (mk_matmul_mma2). Both give the same product.
#ifndef MK_MM
#define MK_MM 2
#endif
#if MK_MM != 1 && MK_MM != 2
#error "MK_MM must be 1 (shared atomics) or 2 (per-warp slots)"
#endif
#ifndef MK_MM_SLOTS
#define MK_MM_SLOTS 16            // MK_MM=2: at most this many row groups between two flushes
#endif

#ifndef MK_POLL_BATCH
#define MK_POLL_BATCH 16          // sentinel polls in flight per lane (32 spills registers)
#endif
#ifndef MK_POLL_SLEEP_NS
#define MK_POLL_SLEEP_NS 0        // > 0: a lane sleeps this long after a pass that left units pending
#endif
#ifndef MK_EPILOGUES
#define MK_EPILOGUES 1            // 0: no fused matmul epilogues (fuse_rope / fuse_silu workloads then fail their check)
#endif
#ifndef MK_SENTINEL_FENCE
#define MK_SENTINEL_FENCE 2       // the fence after a task's polls (mk_wait_deps): 2, fence.acquire.gpu (-5.1 % at
#endif                            // llama-3.2-1b b1, -1.3 % at b8, correct: results/h200-mk-speed); 1, fence.acq_rel.gpu
                                  // (the one before); 0, none (an experiment, not the memory model's acquire)
#if MK_SENTINEL_FENCE < 0 || MK_SENTINEL_FENCE > 2
#error "MK_SENTINEL_FENCE must be 0 (none), 1 (fence.acq_rel.gpu) or 2 (fence.acquire.gpu)"
#endif

struct MkPoll {                 // a byte segment the waiter polls (POLL_FIELDS in program.py)
    const unsigned char* ptr;
    int end;                    // units of its dependency's list up to and including this segment
    int kind;                   // 0: 16-byte words of bf16, 1: of fp32; 2: one bf16, 3: one fp32
};

struct MkReset {                // a piece of the next step's outputs to reset (RESET_FIELDS)
    unsigned char* ptr;         // 16-byte aligned
    unsigned long long nbytes;  // whole 4-byte words
};

struct MkParams {               // keep in step with PARAM_FIELDS in program.py
    const int* tasks;           // rows of MK_TASK_FIELDS int32 (see encode.py)
    const int* queue_start;     // block b runs rows queue_start[b] .. queue_start[b + 1] - 1
    const int* deps;            // rows of (kind, op, t0, t1)
    const int* op_tiles;        // tiles per op: the counters' targets
    const MkOp* ops;
    unsigned* counters;         // one per op
    unsigned* flags;            // one per tile (op's flag_base + tile)
    unsigned* barrier;          // grid-barrier arrivals (persistent_barrier)
    int* error;
    unsigned long long* trace;  // optional: 4 %globaltimer stamps per task row (wait, ready, computed, published)
    int n_ops, page_B, depth, x_B;  // ring page bytes and depth; bytes of the x / scratch region
    int acc_floats, acc_rows;  // row accumulators: T x acc_rows floats (acc_rows a power of two)
    int ahead;                 // 0: the producer streams a task only once the workers have begun it
    int l2_lead_B;             // > 0: the L2 prefetcher runs this many bytes ahead of the producer (0: off)
    const MkPoll* polls;       // sync="sentinel": the segments to poll,
    const int* poll_deps;      // ... each dependency row's segments [s0, s1) (int pairs),
    const MkReset* resets;     // ... and the other step's outputs, reset by the publisher warps
    int n_resets, sentinel;    // sentinel: 1 with sync="sentinel"
};

__device__ __forceinline__ unsigned mk_smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ unsigned long long mk_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned mk_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void mk_red_release(unsigned* p) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory");
}

__device__ __forceinline__ void mk_red_relaxed(unsigned* p) {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(p) : "memory");
}

__device__ __forceinline__ bool mk_failed(const int* error) { return *(const volatile int*)error != 0; }

__device__ __forceinline__ unsigned mk_ld_relaxed(const unsigned* p) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// MK_WAIT_ACQ (an experiment; default 0): how a wait for a counter or flag acquires. 0: every poll
// is ld.acquire.gpu (SASS on sm_90: LDG.E.STRONG.GPU, then CCTL.IVALL, which drops the SM's L1 at
// every poll, while the workers of the same SM may still run a task that reads through it);
// 1: the polls are ld.relaxed.gpu (LDG.E.STRONG.GPU alone) and one fence.acquire.gpu (CCTL.IVALL)
// follows the poll that saw the value: the PTX memory model's acquire pattern, the same ordering.
#ifndef MK_WAIT_ACQ
#define MK_WAIT_ACQ 0
#endif
#if MK_WAIT_ACQ != 0 && MK_WAIT_ACQ != 1
#error "MK_WAIT_ACQ must be 0 (ld.acquire polls) or 1 (ld.relaxed polls, then fence.acquire)"
#endif

// Spin until *p >= want. False, with the error code set, after MK_SPIN_LIMIT_NS or when another
// block has failed.
__device__ bool mk_wait_at_least(const unsigned* p, unsigned want, int* error, int code) {
    unsigned long long t0 = 0;
    for (int k = 0; (MK_WAIT_ACQ ? mk_ld_relaxed(p) : mk_ld_acquire(p)) < want; ++k) {
        if (k == 0) t0 = mk_now();
        if ((k & 63) == 63) {
            if (mk_failed(error)) return false;
            if (mk_now() - t0 > MK_SPIN_LIMIT_NS) { atomicCAS(error, 0, code); return false; }
        }
    }
    if (MK_WAIT_ACQ) asm volatile("fence.acquire.gpu;" ::: "memory");
    return true;
}

// ---------------------------------------------------------------- sync="sentinel"
__device__ __forceinline__ uint4 mk_ld_relaxed_v4(const unsigned char* p) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
    return v;
}

// One unit of a polled segment (MkPoll.kind); a single element comes zero-extended in .x.
__device__ __forceinline__ uint4 mk_poll_load(const unsigned char* p, int kind) {
    if (kind < 2) return mk_ld_relaxed_v4(p);
    unsigned x;
    if (kind == 2) {
        unsigned short h;
        asm volatile("ld.relaxed.gpu.global.u16 %0, [%1];" : "=h"(h) : "l"(p) : "memory");
        x = h;
    } else {
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
    }
    return make_uint4(x, 0u, 0u, 0u);
}

// Whether no element of a unit is the sentinel (all ones): each 16-bit half of the words for
// bf16, each word for fp32. Elements are checked one by one, so a unit whose producer has written
// some of its elements (or a row written in part) still counts as pending.
__device__ __forceinline__ bool mk_unit_written(uint4 v, int kind) {
    if (kind & 1) return (v.x != ~0u) & (v.y != ~0u) & (v.z != ~0u) & (v.w != ~0u);
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    bool ok = true;
#pragma unroll
    for (int i = 0; i < 4; ++i) ok &= ((w[i] & 0xffffu) != 0xffffu) & ((w[i] >> 16) != 0xffffu);
    return ok;
}

// Poll the units of segments [s0, s1) of P.polls (one dependency's list) until none holds the
// sentinel. Lane l takes units l, l + 32, ... of the list, a window of 64 of them at a time; a pass
// loads every unit of the window still pending, MK_POLL_BATCH loads in flight, and passes repeat
// until none is: data that lands in any order is seen one pass after its last unit. False, with
// the error code set, after MK_SPIN_LIMIT_NS or when another block has failed.
__device__ bool mk_poll_data(const MkParams& P, int s0, int s1, int lane) {
    if (s0 >= s1) return true;
    const MkPoll* S = P.polls;
    const int total = __ldg(&S[s1 - 1].end);
    unsigned long long t0 = 0;
    int seg_w = s0, passes = 0;
    for (int w0 = 0; w0 < total; w0 += 64 * 32) {
        const int mine = min(64, max(0, (total - w0 - lane + 31) / 32));
        unsigned long long pending = mine == 64 ? ~0ull : (1ull << mine) - 1;
        while (__ldg(&S[seg_w].end) <= w0) ++seg_w;  // the segment of unit w0
        while (pending) {
            unsigned long long m = pending;
            int seg = seg_w;
            while (m) {
                const unsigned char* addr[MK_POLL_BATCH];
                int kind[MK_POLL_BATCH], bit[MK_POLL_BATCH];
#pragma unroll
                for (int q = 0; q < MK_POLL_BATCH; ++q) {
                    bit[q] = -1;
                    kind[q] = 0;
                    addr[q] = nullptr;
                    if (m) {
                        const int j = __ffsll((long long)m) - 1;
                        m &= m - 1;
                        const int u = w0 + 32 * j + lane;
                        while (__ldg(&S[seg].end) <= u) ++seg;
                        const int first = seg == s0 ? 0 : __ldg(&S[seg - 1].end);
                        kind[q] = __ldg(&S[seg].kind);
                        const unsigned char* base = reinterpret_cast<const unsigned char*>(
                            __ldg(reinterpret_cast<const unsigned long long*>(&S[seg].ptr)));
                        addr[q] = base + (size_t)(u - first) * (kind[q] < 2 ? 16 : 2 * (kind[q] - 1));
                        bit[q] = j;
                    }
                }
                uint4 v[MK_POLL_BATCH];
#pragma unroll
                for (int q = 0; q < MK_POLL_BATCH; ++q)
                    v[q] = bit[q] >= 0 ? mk_poll_load(addr[q], kind[q]) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
                for (int q = 0; q < MK_POLL_BATCH; ++q)
                    if (bit[q] >= 0 && mk_unit_written(v[q], kind[q])) pending &= ~(1ull << bit[q]);
            }
            if (pending) {
                if (MK_POLL_SLEEP_NS > 0) __nanosleep(MK_POLL_SLEEP_NS);
                if (t0 == 0) {
                    t0 = mk_now();
                } else if (mk_now() - t0 > MK_SPIN_LIMIT_NS) {
                    atomicCAS(P.error, 0, MK_ERR_DATA);
                    return false;
                }
                if ((++passes & 15) == 0 && mk_failed(P.error)) return false;
            }
        }
    }
    return true;
}

// The publisher warp with sync="sentinel" (nothing to publish): write the sentinel over the other
// step's outputs and appended KV-cache slots, which no task of this step reads; block b takes
// pieces b, b + grid, ... The next step starts after this one has ended, so sees them all.
__device__ void mk_reset_next(const MkParams& P, int lane) {
    const uint4 ones = make_uint4(~0u, ~0u, ~0u, ~0u);
    for (int j = blockIdx.x; j < P.n_resets; j += gridDim.x) {
        unsigned char* p = P.resets[j].ptr;
        const long long n = (long long)P.resets[j].nbytes, n16 = n & ~15ll;
        for (long long o = 16 * lane; o < n16; o += 16 * 32) *reinterpret_cast<uint4*>(p + o) = ones;
        for (long long o = n16 + 4 * lane; o < n; o += 4 * 32) *reinterpret_cast<unsigned*>(p + o) = ~0u;
    }
}

// ---------------------------------------------------------------- the page ring
// MK_RING_HINT (-DMK_RING_HINT=1, an experiment; default 0): the ring's bulk copies carry an L2
// evict_first policy. Weights are read once a step, so the lines they leave in L2 are dead; with
// the hint L2 drops them before the activations, the KV cache and what the L2 prefetcher asked for.
#ifndef MK_RING_HINT
#define MK_RING_HINT 0
#endif
struct MkRing {
    unsigned char* pages;
    unsigned long long* full;   // producer -> workers: the page holds its bytes
    unsigned long long* empty;  // workers -> producer: every worker warp is done with the page
    int P, D;
    int stage;                  // the next page to fill (producer) or to read (workers)
    unsigned phase;             // parity of the ring's current round

    __device__ __forceinline__ void advance() {  // no division on the per-page path
        if (++stage == D) { stage = 0; phase ^= 1u; }
    }
};

__device__ __forceinline__ bool mk_mbar_try(unsigned long long* b, unsigned parity) {
    unsigned ok;
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}" : "=r"(ok) : "r"(mk_smem_addr(b)), "r"(parity) : "memory");
    return ok != 0;
}

// Wait for the phase of parity `parity` of barrier b; false when the grid failed meanwhile (the
// error word is read only while waiting long, never on the fast path).
__device__ bool mk_mbar_wait(unsigned long long* b, unsigned parity, int* error) {
    unsigned long long t0 = 0;
    for (int k = 0; !mk_mbar_try(b, parity); ++k) {
        if (k == 0) t0 = mk_now();
        if ((k & 63) == 63) {
            if (mk_failed(error)) return false;
            if (mk_now() - t0 > MK_SPIN_LIMIT_NS) { atomicCAS(error, 0, MK_ERR_PIPE); return false; }
        }
    }
    return true;
}

// What the producer needs of one task row: where its weight rows start and how many bytes.
struct MkStream {
    const unsigned char* src;
    long long bytes;            // 0: the task streams nothing through the ring; -1: an expert task, not resolved yet
};

__device__ __forceinline__ MkStream mk_stream_of(const MkParams& P, const int* t) {
    MkStream m{nullptr, 0};
    if (__ldg(t) != MK_OP_MATMUL) return m;
    const int op = __ldg(t + 1), lo = __ldg(t + 3), hi = __ldg(t + 4);
    const MkOp* o = P.ops + op;
    if (__ldg(&o->opt) & MK_OPT_EXPERTS) { m.bytes = -1; return m; }  // its expert is known after the top-k
    const int K = __ldg(&o->K);
    m.src = reinterpret_cast<const unsigned char*>(__ldg(reinterpret_cast<const unsigned long long*>(&o->W)))
            + (size_t)lo * K * 2;
    m.bytes = (long long)(hi - lo) * K * 2;
    return m;
}

// MK_MOE_EARLY (default 1; 0: as measured in validation/results/h200-moe): in the megakernel, the
// producer streams an expert task's weight rows as soon as its layer's top-k has published the route
// table (the top-k op's counter, MkOp.off2 of an expert row), not once the task's own dependencies
// are met. The down projection's rows then stream while its slot's gate/up tiles still run on other
// SMs (its dependency), instead of starting cold after them; the gate/up's rows start as before.
#ifndef MK_MOE_EARLY
#define MK_MOE_EARLY 1
#endif
// MK_MOE_L2PF_B (default 0: none; megakernel only; measured at 256 KiB on our H200: 2-6 % slower at
// batch 1 than without it, validation/results/h200-moe-speed): once an expert task's rows are known,
// the producer asks L2 (cp.async.bulk.prefetch.L2) for up to this many of its bytes beyond the
// ring's first depth x page, a chunk at a time, so that the task's DRAM stream does not wait for
// ring pages to free: all the layer's expert bytes are asked for at once across the SMs, and the
// ring's copies find them in L2 (or already on their way). A hint: it never changes what is read.
#ifndef MK_MOE_L2PF_B
#define MK_MOE_L2PF_B 0
#endif
#define MK_MOE_L2PF_CHUNK_B 32768
#if MK_MOE_L2PF_B % 16 != 0
#error "MK_MOE_L2PF_B must be a multiple of 16"
#endif

// An expert matmul task's weight rows (MK_OPT_EXPERTS), once its layer's top-k is done: `gate` says
// how the producer knows. 0: the top-k op's counter says its task is published (MK_MOE_EARLY), or
// (MK_MOE_EARLY=0) the waiter has found task row i's dependencies met (*ready >= i; the top-k is one
// of them); 1: the workers have begun it (*ready: `started`; persistent_barrier, whose workers pass
// the grid barrier themselves); 2: the kernel's prerequisite grid is done (a chain:
// griddepcontrol.wait). Nothing of the expert's weights is streamed before (no speculation). A slot
// past the active experts streams nothing (its workers exit early, mk_expert_active). Bytes -2 when
// the grid failed meanwhile.
__device__ __forceinline__ MkStream mk_expert_stream(const MkParams& P, const int* t, int i, const int* ready, int gate) {
    MkStream m{nullptr, -2};  // -2: the grid failed
    if (gate == 2) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (MK_MOE_EARLY && gate == 0) {
        const int topk = __ldg(&P.ops[__ldg(t + 1)].off2);  // acquire: the route table is read after it
        if (!mk_wait_at_least(P.counters + topk, (unsigned)__ldg(P.op_tiles + topk), P.error, MK_ERR_COUNTER))
            return m;
    } else {
        for (int n = 0; *(const volatile int*)ready < i; ++n)
            if ((n & 255) == 255 && mk_failed(P.error)) return m;
        if (mk_failed(P.error)) return m;
        __threadfence();  // the top-k's table, seen through the waiter's acquire, before it is read
    }
    const int lo = __ldg(t + 3), hi = __ldg(t + 4);
    const MkOp* o = P.ops + __ldg(t + 1);
    const int K = __ldg(&o->K), opt = __ldg(&o->opt), per = (opt & MK_OPT_SILU ? 2 : 1) * __ldg(&o->pos);
    const float* route = reinterpret_cast<const float*>(__ldg(reinterpret_cast<const unsigned long long*>(&o->tokens)));
    const int j = lo / per;
    const float count = __ldcg(route), expert = __ldcg(route + 1 + j);
    m.bytes = 0;
    if (j < (int)count) {
        m.src = reinterpret_cast<const unsigned char*>(__ldg(reinterpret_cast<const unsigned long long*>(&o->W)))
                + ((size_t)(int)expert * per + (lo - j * per)) * K * 2;
        m.bytes = (long long)(hi - lo) * K * 2;
    }
    return m;
}

// Ask L2 for an expert task's bytes [skip, skip + MK_MOE_L2PF_B) (those that exist), a chunk at a time.
__device__ __forceinline__ void mk_expert_l2(const MkStream& m, long long skip) {
    for (long long a = skip, e = min(m.bytes, skip + (long long)MK_MOE_L2PF_B); a < e; a += MK_MOE_L2PF_CHUNK_B)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                     :: "l"(m.src + a), "r"((unsigned)min((long long)MK_MOE_L2PF_CHUNK_B, e - a)) : "memory");
}

// The producer lane: stream the weight rows of task rows [i0, i1) through the ring. The next
// task's descriptor is read while this one's pages are issued, so that no global load sits on
// the path between two copies. Without `ahead`, a task's first page waits until the workers
// have begun the task (no prefetch across tasks). With `pf_pos` (the L2 prefetcher runs), it
// posts where it is after every copy: the row in the high word, the bytes of that row issued in
// the low one; (i1, 0) once it is done.
// An expert task's rows are resolved only at its turn, once `gate` allows (mk_expert_stream).
__device__ void mk_produce(const MkParams& P, int i0, int i1, MkRing& r, const int* started, const int* ready, int gate,
                           unsigned long long* pf_pos = nullptr) {
    if (i0 >= i1) return;
#if MK_RING_HINT
    unsigned long long pol;  // the ring's bytes are read once: L2 may drop them first
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    MkStream cur = mk_stream_of(P, P.tasks + (size_t)i0 * MK_TASK_FIELDS);
    bool ask = false;  // the current task's bytes beyond the ring are still to be asked of L2 (MK_MOE_L2PF_B)
    for (int i = i0; i < i1; ++i) {
        if (cur.bytes == -1) {
            cur = mk_expert_stream(P, P.tasks + (size_t)i * MK_TASK_FIELDS, i, ready, gate);
            if (cur.bytes < 0) return;
            ask = MK_MOE_L2PF_B > 0 && gate == 0 && cur.bytes > (long long)r.P * r.D;  // bytes beyond the ring
        }
        const MkStream next = i + 1 < i1 ? mk_stream_of(P, P.tasks + (size_t)(i + 1) * MK_TASK_FIELDS) : MkStream{nullptr, 0};
        if (cur.bytes > 0 && !P.ahead)
            while (*(const volatile int*)started < i)
                if (mk_failed(P.error)) return;
        for (long long off = 0; off < cur.bytes; off += r.P) {
            const int stage = r.stage;
            const unsigned parity = r.phase ^ 1u;
            r.advance();
            // an expert task's bytes beyond the ring's first pages: asked of L2 after its first page's
            // copy (the copy not queued behind them), or at once if the ring has no free page yet
            if (ask && (off > 0 || !mk_mbar_try(r.empty + stage, parity))) {
                mk_expert_l2(cur, (long long)r.P * r.D);
                ask = false;
            }
            if (!mk_mbar_wait(r.empty + stage, parity, P.error)) return;
            const unsigned bytes = (unsigned)min((long long)r.P, cur.bytes - off);
            const unsigned bar = mk_smem_addr(r.full + stage);
#if MK_NO_COPY
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
            continue;
#endif
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
#if MK_RING_HINT
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                         " [%0], [%1], %2, [%3], %4;"
                         :: "r"(mk_smem_addr(r.pages + (size_t)stage * r.P)), "l"(cur.src + off), "r"(bytes), "r"(bar),
                            "l"(pol) : "memory");
#else
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(mk_smem_addr(r.pages + (size_t)stage * r.P)), "l"(cur.src + off), "r"(bytes), "r"(bar)
                         : "memory");
#endif
            if (pf_pos) *(volatile unsigned long long*)pf_pos = ((unsigned long long)i << 32) | (unsigned)(off + bytes);
        }
        cur = next;
    }
    if (pf_pos) *(volatile unsigned long long*)pf_pos = (unsigned long long)i1 << 32;
}

// ---------------------------------------------------------------- matmul on the workers
// xs: the op's input, bf16 [T][K] in shared memory. Each page holds whole 512-byte units of the
// task's weight rows (K is a multiple of 256, so a unit never straddles rows); each worker warp
// takes a contiguous run of a page's units, accumulates per row and adds its row sums into acc_s
// (shared memory, fp32 [T][R], row r in slot r mod R, R a power of two). Pages are consumed without any block-wide
// synchronisation: the rows are written out only when the slots would wrap (R rows apart) and at
// the end of the task.
// `res`: when the task's T x rows outputs are at most one per worker thread, the residual of
// thread tid's output (b, r) = (tid / rows, tid % rows), loaded when the task began (see
// mk_matmul_mma), so that no load sits between the last page and the output.
template <int T>
__device__ __forceinline__ void mk_matmul_flush(const MkOp& o, int lo, int r0, int r1, float* acc_s, int R, int tid,
                                                bool have_res = false, float res = 0.f) {
    mk_bar(MK_NW);
    const int n = r1 - r0;
#if MK_EPILOGUES
    if (o.opt & MK_OPT_PAIRS) {  // a fused epilogue (mk_ops.cuh) takes rows (2r, 2r + 1) together; r0, r1 even
        mk_epilogue_rows(mk_epilogue_of(o), T, lo, r0, r1, acc_s, R, tid, MK_NW);
        mk_bar(MK_NW);
        return;
    }
#endif
    mk_bf16* out = (mk_bf16*)o.out;
    for (int i = tid; i < T * n; i += MK_NW) {
        const int b = i / n, rr = r0 + i - b * n;
        float* slot = acc_s + b * R + (rr & (R - 1));
        float v = *slot;
        *slot = 0.f;
        if (o.bias) v += mk_bf16_to_f32(o.bias[lo + rr]);
        if (o.opt & MK_OPT_RESIDUAL) v += have_res ? res : mk_ld_bf16(o.in1 + (size_t)b * o.ld1 + lo + rr);
        out[(size_t)b * o.ld_out + lo + rr] = mk_f32_to_bf16(v);
    }
    mk_bar(MK_NW);
}

template <int T>
__device__ void mk_matmul_pages(const MkOp& o, int lo, int hi, MkRing& r, const mk_bf16* xs, float* acc_s,
                                int R, int tid, int* error) {
    const int K = o.K, upr = K >> 8, lane = tid & 31, warp = tid >> 5, rows = hi - lo;
    const long long S = (long long)rows * K * 2;
    const uint4* x4 = reinterpret_cast<const uint4*>(xs);
    const int kv8 = K >> 3;
    int written = 0;  // rows [0, written) are out
    for (long long off = 0; off < S; off += r.P) {
        const int nu = (int)(min((long long)r.P, S - off) >> 9);
        const int u0 = (int)(off >> 9);
        if ((u0 + nu - 1) / upr - written >= R) {  // this page's last row would wrap onto an unwritten one
            mk_matmul_flush<T>(o, lo, written, u0 / upr, acc_s, R, tid);
            written = u0 / upr;
        }
        const int stage = r.stage;
        const unsigned parity = r.phase;
        r.advance();
        mk_mbar_wait(r.full + stage, parity, error);
        const int a = warp * nu / MK_CONSUMERS, z = (warp + 1) * nu / MK_CONSUMERS;
        const uint4* pg = reinterpret_cast<const uint4*>(r.pages + (size_t)stage * r.P);
        if ((upr & 3) == 0 && (r.P & 2047) == 0) {
            // fast path (K a multiple of 1024): the page's units in groups of 4, which never straddle
            // a row; a warp takes whole groups, four independent FMA chains per group
            const int ng = nu >> 2, ga = warp * ng / MK_CONSUMERS, gz = (warp + 1) * ng / MK_CONSUMERS;
            int row = -1;
            float acc[T];
            int rr = (u0 + 4 * ga) / upr, c8 = (u0 + 4 * ga - rr * upr) * 32 + lane;  // one division a page
            for (int gi = ga; gi < gz; ++gi, c8 += 128) {
                if (c8 >= kv8) { c8 -= kv8; ++rr; }
                if (rr != row) {
                    if (row >= 0) {
#pragma unroll
                        for (int b = 0; b < T; ++b) {
                            const float v = mk_warp_sum(acc[b]);
                            if (lane == 0) atomicAdd(acc_s + b * R + (row & (R - 1)), v);
                        }
                    }
                    row = rr;
#pragma unroll
                    for (int b = 0; b < T; ++b) acc[b] = 0.f;
                }
                const int u = gi * 4;
                uint4 wv[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) wv[j] = pg[(u + j) * 32 + lane];
#pragma unroll
                for (int b = 0; b < T; ++b) {
                    uint4 xv[4];
#pragma unroll
                    for (int j = 0; j < 4; ++j) xv[j] = x4[b * kv8 + c8 + 32 * j];
                    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float f[8], xf[8];
                        mk_unpack8(wv[j], f);
                        mk_unpack8(xv[j], xf);
#pragma unroll
                        for (int e = 0; e < 8; ++e) part[j] = fmaf(f[e], xf[e], part[j]);
                    }
                    acc[b] += (part[0] + part[1]) + (part[2] + part[3]);
                }
            }
            if (row >= 0) {
#pragma unroll
                for (int b = 0; b < T; ++b) {
                    const float v = mk_warp_sum(acc[b]);
                    if (lane == 0) atomicAdd(acc_s + b * R + (row & (R - 1)), v);
                }
            }
        } else if (a < z) {
            int row = (u0 + a) / upr, c8 = (u0 + a - row * upr) * 32 + lane;
            float acc[T], acc2[T];
#pragma unroll
            for (int b = 0; b < T; ++b) acc[b] = acc2[b] = 0.f;
            for (int u = a; u < z;) {
                // two units at a time when both lie in this row: two independent FMA chains, and
                // all four shared-memory loads in flight together
                const bool two = u + 1 < z && c8 + 32 < kv8;
                const uint4 w0 = pg[u * 32 + lane];
                const uint4 w1 = two ? pg[(u + 1) * 32 + lane] : make_uint4(0, 0, 0, 0);
                uint4 x0[T], x1[T];
#pragma unroll
                for (int b = 0; b < T; ++b) {
                    x0[b] = x4[b * kv8 + c8];
                    x1[b] = two ? x4[b * kv8 + c8 + 32] : make_uint4(0, 0, 0, 0);
                }
                float f0[8], f1[8];
                mk_unpack8(w0, f0);
                mk_unpack8(w1, f1);
#pragma unroll
                for (int b = 0; b < T; ++b) {
                    float xa[8], xb[8];
                    mk_unpack8(x0[b], xa);
                    mk_unpack8(x1[b], xb);
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        acc[b] = fmaf(f0[e], xa[e], acc[b]);
                        acc2[b] = fmaf(f1[e], xb[e], acc2[b]);
                    }
                }
                u += two ? 2 : 1;
                c8 += two ? 64 : 32;
                if (c8 >= kv8 || u == z) {  // the row ends here, or the warp's run does
#pragma unroll
                    for (int b = 0; b < T; ++b) {
                        const float v = mk_warp_sum(acc[b] + acc2[b]);
                        if (lane == 0) atomicAdd(acc_s + b * R + (row & (R - 1)), v);
                        acc[b] = acc2[b] = 0.f;
                    }
                    if (c8 >= kv8) { c8 = lane; ++row; }
                }
            }
        }
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(mk_smem_addr(r.empty + stage)) : "memory");
    }
    mk_matmul_flush<T>(o, lo, written, rows, acc_s, R, tid);
}

// ---------------------------------------------------------------- matmul on the tensor cores
// The same product with mma.sync m16n8k16 (bf16 in, fp32 accumulate): the weight rows are the
// A operand (16 rows x 16 k a step), the batch rows the B operand (8 columns, those past T zero).
// Weights of MK_OPT_MMA ops are stored in "fragment order" (program.py, mma_layout): 1 KiB blocks,
// block (g16, kb) holding rows 16 g16 .. 16 g16 + 15 and inputs 32 kb .. 32 kb + 31, laid out so
// that lane l = 4 g + t of a warp reads rows g and g + 8 at inputs 8 t .. 8 t + 7 as two 16-byte
// words at bytes 16 l and 512 + 16 l: conflict-free, and one block is two mma steps. A task's rows
// (a multiple of 16) stay contiguous, so the producer streams them exactly as before. The inputs
// match: xs holds x in the same order ([K / 32][T][32], see mk_load_x_mma). In the 32 inputs of a
// block, lane t's 8 values 8t .. 8t+7 serve step 0 as k = 2t, 2t+1 (values 0, 1) and 2t+8, 2t+9
// (values 2, 3), and step 1 as the same k with values 4 .. 7: a permutation of k shared by W and x,
// so the sums are those of the plain product.
__device__ __forceinline__ void mk_mma16816(float d[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                            unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A warp's 16 x 8 partial product (two accumulators) into the row sums: d[0], d[1] are row g,
// columns 2t, 2t + 1; d[2], d[3] row g + 8. Columns are batch rows; those >= T are padding.
template <int T>
__device__ __forceinline__ void mk_mma_store(float* acc_s, int R, int row0, float d0[4], float d1[4], int g, int t) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int b = 2 * t + j;
        if (b < T) {
            atomicAdd(acc_s + b * R + ((row0 + g) & (R - 1)), d0[j] + d1[j]);
            atomicAdd(acc_s + b * R + ((row0 + g + 8) & (R - 1)), d0[2 + j] + d1[2 + j]);
        }
        d0[j] = d1[j] = d0[2 + j] = d1[2 + j] = 0.f;
    }
}

template <int T>
__device__ void mk_matmul_mma(const MkOp& o, int lo, int hi, MkRing& r, const mk_bf16* xs, float* acc_s, int R,
                              int tid, int* error) {
    const int KB = o.K >> 5, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, rows = hi - lo;
    const long long S = (long long)rows * o.K * 2;
    const uint4* x4 = reinterpret_cast<const uint4*>(xs);
    const bool have_res = (o.opt & MK_OPT_RESIDUAL) && T * rows <= MK_NW && rows <= R;
    float res = 0.f;
    if (have_res && tid < T * rows) res = mk_ld_bf16(o.in1 + (size_t)(tid / rows) * o.ld1 + lo + tid % rows);
    int written = 0;  // rows [0, written) are out
    for (long long off = 0; off < S; off += r.P) {
        const int nb = (int)(min((long long)r.P, S - off) >> 10), q0 = (int)(off >> 10);
        const int last = ((q0 + nb - 1) / KB) * 16 + 15;  // the page's last row
        if (last - written >= R) {                        // ... would wrap onto an unwritten one
            const int first = (q0 / KB) * 16;
            mk_matmul_flush<T>(o, lo, written, first, acc_s, R, tid);
            written = first;
        }
        const int stage = r.stage;
        const unsigned parity = r.phase;
        r.advance();
        mk_mbar_wait(r.full + stage, parity, error);
        const int a = warp * nb / MK_CONSUMERS, z = (warp + 1) * nb / MK_CONSUMERS;
        if (a < z) {
            const uint4* pg = reinterpret_cast<const uint4*>(r.pages + (size_t)stage * r.P);
            int rg = (q0 + a) / KB, kb = q0 + a - rg * KB;
            float d0[4] = {0.f, 0.f, 0.f, 0.f}, d1[4] = {0.f, 0.f, 0.f, 0.f};
            for (int i = a; i < z; ++i) {
                const uint4 w0 = pg[i * 64 + lane], w1 = pg[i * 64 + 32 + lane];
                const uint4 xv = g < T ? x4[(kb * T + g) * 4 + t] : make_uint4(0, 0, 0, 0);
                mk_mma16816(d0, w0.x, w1.x, w0.y, w1.y, xv.x, xv.y);
                mk_mma16816(d1, w0.z, w1.z, w0.w, w1.w, xv.z, xv.w);
                if (++kb == KB || i + 1 == z) {  // the row group ends here, or the warp's run does
                    mk_mma_store<T>(acc_s, R, rg * 16, d0, d1, g, t);
                    if (kb == KB) { kb = 0; ++rg; }
                }
            }
        }
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(mk_smem_addr(r.empty + stage)) : "memory");
    }
    mk_matmul_flush<T>(o, lo, written, rows, acc_s, R, tid, have_res, res);
}

__device__ __forceinline__ float mk_sumsq8(uint4 v) {  // sum of squares of 8 bf16 values
    float f[8], ss = 0.f;
    mk_unpack8(v, f);
#pragma unroll
    for (int e = 0; e < 8; ++e) ss = fmaf(f[e], f[e], ss);
    return ss;
}

// 8 bf16 inputs RMS-normed: bf16(bf16(x * inv) * w), as mk_load_x and torch round them.
__device__ __forceinline__ uint4 mk_norm8(uint4 x, uint4 w, float inv) {
    float f[8], s[8];
    mk_unpack8(x, f);
    mk_unpack8(w, s);
    unsigned p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const unsigned lo16 = mk_f32_to_bf16(mk_bf16_to_f32(mk_f32_to_bf16(f[2 * e] * inv)) * s[2 * e]);
        const unsigned hi16 = mk_f32_to_bf16(mk_bf16_to_f32(mk_f32_to_bf16(f[2 * e + 1] * inv)) * s[2 * e + 1]);
        p[e] = lo16 | (hi16 << 16);
    }
    return make_uint4(p[0], p[1], p[2], p[3]);
}

// The workers' partial sums of squares of one row -> 1 / RMS (red: one float per worker warp).
__device__ __forceinline__ float mk_inv_rms(float ss, float* red, int tid, int K, float eps) {
    ss = mk_warp_sum(ss);
    if ((tid & 31) == 0) red[tid >> 5] = ss;
    mk_bar(MK_NW);
    float tot = 0.f;
    for (int w = 0; w < MK_CONSUMERS; ++w) tot += red[w];
    return rsqrtf(tot / K + eps);
}

// The input rows of a matmul that merges the attention partials into them (MK_OPT_REDUCE,
// fuse_reduce; program.py: _reduce_prologue), T rows into xs, in the layout the matmul reads
// (mma: the weights' k order of mk_load_x_mma; else rows of K); the caller's barrier follows.
// Row b's inputs are the attention output of sequence b, element (head q, d) at q D + d, merged
// from the partials at in0 (partial i = (kv head g, sequence b, split c), g-major, ld0 = G (D + 2)
// floats each: o[G][D], m[G], l[G]; written by other SMs and read through L2 after the waiter's
// acquire, as every input is) by mk_reduce_pair, the merge of mk_attn_reduce: the same bits as
// the unfused reduction's output, so the same product. A thread takes two adjacent inputs of a
// row (a warp: 64 of one head, D a multiple of 64). The partials stream from L2: xs holds the
// merged rows only.
__device__ __forceinline__ void mk_merge_rows(const MkOp& o, mk_bf16* xs, int tid, int T, bool mma) {
    const int D = o.hd, G = o.hq / o.hkv, C = o.splits, K = o.K, per = K >> 1, lane = tid & 31;
    const float* parts = reinterpret_cast<const float*>(o.in0);
#pragma unroll 1
    for (int it = tid; it < T * per; it += MK_NW) {  // per: a multiple of 32, so warps stay whole
        const int b = it / per, k = 2 * (it - b * per), q = k / D, g = q / G, gk = k - g * G * D;
        const unsigned pair = mk_reduce_pair(parts + (size_t)(g * T + b) * C * o.ld0, o.ld0, G * D, G, q - g * G,
                                             gk, C, lane);
        const int c = k >> 3;  // the 16-byte word of the row that holds inputs k, k + 1
        const int at = mma ? (((c >> 2) * T + b) * 4 + (c & 3)) * 8 + (k & 7) : b * K + k;
        *reinterpret_cast<unsigned*>(xs + at) = pair;
    }
}

// The input rows of an MK_OPT_MMA matmul into shared memory in the weights' k order: the 16-byte
// word c of row b (inputs 8c .. 8c + 7) goes to word (c / 4 * T + b) * 4 + c % 4. With a fused
// norm, each row is scaled once its sum of squares is known (same roundings as mk_load_x).
__device__ void mk_load_x_mma(const MkOp& o, mk_bf16* xs, float* red, int tid) {
    const int K = o.K, kv = K >> 3, T = o.T;
    const bool norm = o.opt & MK_OPT_FUSED_NORM;
    uint4* x4 = reinterpret_cast<uint4*>(xs);
    const uint4* w2 = reinterpret_cast<const uint4*>(o.w2);
    constexpr int J = 4;  // up to J words per thread: the input and the norm weight loaded in one round trip
    const bool one_pass = norm && kv <= J * MK_NW;
    if (o.opt & MK_OPT_REDUCE) {  // the attention output, merged from its partials (fuse_reduce)
        mk_merge_rows(o, xs, tid, T, true);
        mk_bar(MK_NW);
        return;
    }
    for (int b = 0; b < T; ++b) {
        const uint4* src = reinterpret_cast<const uint4*>(o.in0 + (size_t)b * o.ld0);
        auto word = [&](int c) -> uint4& { return x4[((c >> 2) * T + b) * 4 + (c & 3)]; };
        float ss = 0.f;
        if (one_pass) {
            uint4 xv[J], wv[J];
#pragma unroll
            for (int j = 0; j < J; ++j) {
                const int c = tid + j * MK_NW;
                if (c < kv) {
                    xv[j] = __ldcg(src + c);
                    wv[j] = __ldg(w2 + c);
                    ss += mk_sumsq8(xv[j]);
                }
            }
            const float inv = mk_inv_rms(ss, red, tid, K, o.eps);
#pragma unroll
            for (int j = 0; j < J; ++j)
                if (tid + j * MK_NW < kv) word(tid + j * MK_NW) = mk_norm8(xv[j], wv[j], inv);
        } else {  // no norm, or rows too long to keep in registers: two passes
            for (int c = tid; c < kv; c += MK_NW) {
                const uint4 v = __ldcg(src + c);
                word(c) = v;
                if (norm) ss += mk_sumsq8(v);
            }
            if (!norm) continue;
            const float inv = mk_inv_rms(ss, red, tid, K, o.eps);
            for (int c = tid; c < kv; c += MK_NW) word(c) = mk_norm8(word(c), __ldg(w2 + c), inv);  // words it wrote
        }
        mk_bar(MK_NW);  // red is read by every worker before the next row writes it
    }
    mk_bar(MK_NW);
}

// The matmul's input rows into shared memory (RMS-normed first when the norm is fused).
__device__ void mk_load_x(const MkOp& o, mk_bf16* xs, float* red, int tid) {
    const int K = o.K, kv = K >> 3;
    uint4* x4 = reinterpret_cast<uint4*>(xs);
    if (o.opt & MK_OPT_REDUCE) {  // the attention output, merged from its partials (fuse_reduce)
        mk_merge_rows(o, xs, tid, o.T, false);
        mk_bar(MK_NW);
        return;
    }
    for (int b = 0; b < o.T; ++b) {
        const uint4* src = reinterpret_cast<const uint4*>(o.in0 + (size_t)b * o.ld0);
        for (int j = tid; j < kv; j += MK_NW) x4[b * kv + j] = __ldcg(src + j);
    }
    mk_bar(MK_NW);
    if (o.opt & MK_OPT_FUSED_NORM) {
        for (int b = 0; b < o.T; ++b) {
            mk_bf16* x = xs + (size_t)b * K;
            float ss = 0.f;
            for (int k = tid; k < K; k += MK_NW) {
                const float v = mk_bf16_to_f32(x[k]);
                ss = fmaf(v, v, ss);
            }
            ss = mk_warp_sum(ss);
            if ((tid & 31) == 0) red[tid >> 5] = ss;
            mk_bar(MK_NW);
            float t = 0.f;
            for (int w = 0; w < MK_CONSUMERS; ++w) t += red[w];
            const float inv = rsqrtf(t / K + o.eps);
            for (int k = tid; k < K; k += MK_NW)
                x[k] = mk_f32_to_bf16(mk_bf16_to_f32(mk_f32_to_bf16(mk_bf16_to_f32(x[k]) * inv)) *
                                      mk_bf16_to_f32(o.w2[k]));
            mk_bar(MK_NW);
        }
    }
}

// ---------------------------------------------------------------- MK_MM=2: no shared atomics
// The product of mk_matmul_mma (same pages, same fragments) with the row sums kept out of atomics.
// A worker warp takes the same run of every page's blocks as before; it accumulates the 16-row
// group it is in across pages in registers and, once it has done its last block of the group,
// stores its partial with plain stores into its own entry of the group's slot (group rg in slot
// rg % S; a slot is [warp][16 rows][T] fp32). A flush sums a window of groups' slots over the
// warps, always in warp order (the sums do not depend on timing), zeroes what it read, and writes
// each output in one place, mk_mm_out2, one aligned row pair (2r, 2r + 1) of a group at a time. It
// runs when the next page would touch a group S or more past the first one not yet written out
// (two worker barriers; rare: see MkMmSlots), and at the end of the task (one barrier; the
// caller's next barrier orders the rest). An entry whose warp never touched the group (small K,
// the last page) is zero: slots start zeroed and the flush zeroes them again.
struct MkMmSlots {
    float* base;  // slot 0: right after the op's input rows in xs
    int S;        // slots: as many as fit in the rest of the x region and the accumulator region
    int dirty_B;  // bytes of them in the x region (other inputs, attention scratch): zeroed with the input
    unsigned Sm;  // mk_div_magic(S) (0 without MK_MM_FASTDIV)
};

// MK_MM_FASTDIV (default 1): divide by the task's blocks per row group (K / 32) and by the slot
// count with a multiply-high by a magic number made once per task, instead of the ~25-instruction
// integer division, on the per-page path of mk_matmul_mma2 (0: the divisions, as before). The
// workers bound the matmul (a task takes as long with the copies left out, MK_NO_COPY): without
// the divisions a llama-3.2-1b b1 step took 954 us against 1020 (evidence/h200-mk18-ring, run4).
#ifndef MK_MM_FASTDIV
#define MK_MM_FASTDIV 1
#endif
// x / d == __umulhi(x, mk_div_magic(d)) for d >= 2 and x d < 2^32: with m = floor((2^32 - 1) / d) + 1,
// m d = 2^32 + e with 0 <= e < d, and x e < 2^32 keeps the floor (program.fastdiv_ok, which
// program.mma_ok asks of every tensor-core matmul's largest task: blocks x K / 32 <= 2^32).
__device__ __forceinline__ unsigned mk_div_magic(unsigned d) { return 0xFFFFFFFFu / d + 1u; }
__device__ __forceinline__ int mk_div(int x, int d, unsigned m) {
#if MK_MM_FASTDIV
    (void)d;
    return (int)__umulhi((unsigned)x, m);
#else
    (void)m;
    return x / d;
#endif
}

// A row group's slot: rg mod S.
__device__ __forceinline__ int mk_slot_of(int rg, const MkMmSlots& sl) { return rg - mk_div(rg, sl.S, sl.Sm) * sl.S; }

// The slots of an op of T rows and K inputs: the x region past its T x K bf16 inputs, then the
// accumulator region (which the flushes keep zero), at most MK_MM_SLOTS of them.
template <int T>
__device__ __forceinline__ MkMmSlots mk_mm_slots(const MkParams& P, const MkOp& o, mk_bf16* xs) {
    constexpr int slot_B = MK_CONSUMERS * 16 * T * 4;
    const int x_B = T * o.K * 2;
    MkMmSlots s;
    s.base = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(xs) + x_B);
    s.S = min(MK_MM_SLOTS, (P.x_B + 4 * P.acc_floats - x_B) / slot_B);
    s.dirty_B = max(0, min(P.x_B - x_B, s.S * slot_B));
    s.Sm = MK_MM_FASTDIV ? mk_div_magic((unsigned)s.S) : 0u;
    return s;
}

// The one place where an output of the MK_MM=2 matmul is finalised (residual) and stored: rows r
// and r + 1 (r even: an aligned pair of a 16-row group; no flush splits one) of batch row b.
// `res`: their residuals when the caller loaded them already (have_res), else loaded here.
__device__ __forceinline__ void mk_mm_out2(const MkOp& o, int lo, int b, int r, float v0, float v1, bool have_res,
                                           float2 res) {
#if MK_EPILOGUES
    if (o.opt & MK_OPT_PAIRS) {  // a fused epilogue (mk_ops.cuh) takes the pair; no residual there
        mk_epilogue_one(mk_epilogue_of(o), b, lo + r, v0, v1);
        return;
    }
#endif
    if (o.bias) {  // the projection's bias (Qwen2's q, k, v), before the rounding
        v0 += mk_bf16_to_f32(o.bias[lo + r]);
        v1 += mk_bf16_to_f32(o.bias[lo + r + 1]);
    }
    if (o.opt & MK_OPT_RESIDUAL) {
        if (!have_res) {
            const mk_bf16* in1 = o.in1 + (size_t)b * o.ld1 + lo + r;
            res = make_float2(mk_ld_bf16(in1), mk_ld_bf16(in1 + 1));
        }
        v0 += res.x;
        v1 += res.y;
    }
    // one 4-byte store: ld_out and lo are multiples of 16 for a tensor-core op, r is even
    *reinterpret_cast<unsigned*>((mk_bf16*)o.out + (size_t)b * o.ld_out + lo + r) =
        (unsigned)mk_f32_to_bf16(v0) | ((unsigned)mk_f32_to_bf16(v1) << 16);
}

// Flush unit u of a window of groups starting at f0: batch row b = u % T of row pair u / T.
template <int T>
__device__ __forceinline__ float2 mk_mm_res2(const MkOp& o, int lo, int u) {  // its residuals (f0 = 0)
    const int b = u % T, pr = u / T, r = 16 * (pr >> 3) + 2 * (pr & 7);
    const mk_bf16* in1 = o.in1 + (size_t)b * o.ld1 + lo + r;
    return make_float2(mk_ld_bf16(in1), mk_ld_bf16(in1 + 1));
}

template <int T>
__device__ void mk_mm_flush(const MkOp& o, int lo, int f0, int f1, const MkMmSlots& sl, int tid, bool have_res,
                            float2 res, bool mid) {
    mk_bar(MK_NW);  // every warp has stored its entries of groups [f0, f1)
    for (int u = tid; u < (f1 - f0) * 8 * T; u += MK_NW) {
        const int b = u % T, pr = u / T, rg = f0 + (pr >> 3), rr = 2 * (pr & 7);
        float* e = sl.base + (mk_slot_of(rg, sl) * MK_CONSUMERS * 16 + rr) * T + b;  // warp 0's entry of row rr
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int w = 0; w < MK_CONSUMERS; ++w) {
            float* ew = e + w * 16 * T;
            v0 += ew[0];
            v1 += ew[T];
            ew[0] = 0.f;
            ew[T] = 0.f;
        }
        mk_mm_out2(o, lo, b, 16 * rg + rr, v0, v1, have_res, res);
    }
    if (mid) mk_bar(MK_NW);  // the slots are free before any warp stores into them again
}

// A warp's partial of group rg (the sum of its accumulators d[0..3]: d[j][0], d[j][1] are row g,
// columns 2t, 2t + 1; d[j][2], d[j][3] row g + 8; columns are batch rows, those >= T padding) into
// its entry of the group's slot, and the accumulators cleared. Plain stores: the entry is the warp's.
template <int T>
__device__ __forceinline__ void mk_mm_deposit(const MkMmSlots& sl, int rg, int warp, int g, int t, float d[4][4]) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        v[e] = (d[0][e] + d[1][e]) + (d[2][e] + d[3][e]);
        d[0][e] = d[1][e] = d[2][e] = d[3][e] = 0.f;
    }
    float* ent = sl.base + (mk_slot_of(rg, sl) * MK_CONSUMERS + warp) * 16 * T;
    if (T == 1) {
        if (t == 0) {
            ent[g] = v[0];
            ent[g + 8] = v[2];
        }
    } else if (2 * t < T) {
        *reinterpret_cast<float2*>(ent + g * T + 2 * t) = make_float2(v[0], v[1]);
        *reinterpret_cast<float2*>(ent + (g + 8) * T + 2 * t) = make_float2(v[2], v[3]);
    }
}

template <int T>
__device__ int mk_matmul_mma2(const MkOp& o, int lo, int hi, MkRing& r, const mk_bf16* xs, const MkMmSlots& sl,
                              int tid, int* error, unsigned long long* stamp = nullptr) {
    const int KB = o.K >> 5, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int ng = (hi - lo) >> 4, NB = ng * KB, nb = r.P >> 10;
    const unsigned kbm = MK_MM_FASTDIV ? mk_div_magic((unsigned)KB) : 0u;  // K >= 256: KB >= 8; NB KB <= 2^32 (mma_ok)
    if ((nb + KB - 2) / KB + 1 > sl.S) return MK_ERR_SLOTS;  // the groups one page can touch
    const uint4* x4 = reinterpret_cast<const uint4*>(xs);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    // all groups in one window and one flush unit per thread: the residuals now, off the task's tail
    const bool have_res = (o.opt & MK_OPT_RESIDUAL) && ng <= sl.S && ng * 8 * T <= MK_NW;
    float2 res = make_float2(0.f, 0.f);
    if (have_res && tid < ng * 8 * T) res = mk_mm_res2<T>(o, lo, tid);
    float d[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[j][e] = 0.f;
    int f0 = 0;  // groups [0, f0) are written out
    constexpr int WG = MK_CONSUMERS / MK_MM_GROUPS;  // worker warps a page is split over
    const int wi = MK_MM_GROUPS == 1 ? warp : warp % WG;  // this warp's place among them
#if MK_MM_GROUPS > 1
    int pg_i = 0;                                    // the page's index in the task
#endif
    for (int q0 = 0; q0 < NB; q0 += nb) {  // q0: the page's first block (blocks of the task, in order)
        const int n = min(nb, NB - q0), first = mk_div(q0, KB, kbm), last = mk_div(q0 + n - 1, KB, kbm);
        if (last >= f0 + sl.S) {  // the page would store into the slot of a group not written out
            mk_mm_flush<T>(o, lo, f0, first, sl, tid, false, res, true);
            f0 = first;
        }
        const int stage = r.stage;
        const unsigned parity = r.phase;
        r.advance();
#if MK_MM_GROUPS > 1
        const bool mine = pg_i++ % MK_MM_GROUPS == warp / WG;  // pages go to the groups in turn
        if (!mine) continue;
#endif
        mk_mbar_wait(r.full + stage, parity, error);
#if MK_TRACE_X == 2
        if (q0 == 0 && tid == 0 && stamp) stamp[0] = mk_now();  // the task's first page is in
#endif
        const int a = wi * n / WG, z = (wi + 1) * n / WG;
        if (a < z && !MK_NO_MMA) {
            const uint4* pg = reinterpret_cast<const uint4*>(r.pages + (size_t)stage * r.P);
            int rg = mk_div(q0 + a, KB, kbm), kb = q0 + a - rg * KB;
            for (int i = a; i < z;) {
                const int e = min(z, i + KB - kb);  // blocks [i, e) of the run lie in group rg
                for (; i + 1 < e; i += 2, kb += 2) {  // two blocks: four independent accumulators
                    const uint4 w0 = pg[i * 64 + lane], w1 = pg[i * 64 + 32 + lane];
                    const uint4 w2 = pg[i * 64 + 64 + lane], w3 = pg[i * 64 + 96 + lane];
                    const uint4 xa = g < T ? x4[(kb * T + g) * 4 + t] : zero;
                    const uint4 xb = g < T ? x4[((kb + 1) * T + g) * 4 + t] : zero;
                    mk_mma16816(d[0], w0.x, w1.x, w0.y, w1.y, xa.x, xa.y);
                    mk_mma16816(d[1], w0.z, w1.z, w0.w, w1.w, xa.z, xa.w);
                    mk_mma16816(d[2], w2.x, w3.x, w2.y, w3.y, xb.x, xb.y);
                    mk_mma16816(d[3], w2.z, w3.z, w2.w, w3.w, xb.z, xb.w);
                }
                if (i < e) {
                    const uint4 w0 = pg[i * 64 + lane], w1 = pg[i * 64 + 32 + lane];
                    const uint4 xa = g < T ? x4[(kb * T + g) * 4 + t] : zero;
                    mk_mma16816(d[0], w0.x, w1.x, w0.y, w1.y, xa.x, xa.y);
                    mk_mma16816(d[1], w0.z, w1.z, w0.w, w1.w, xa.z, xa.w);
                    ++i;
                    ++kb;
                }
                if (kb == KB) {  // the group's last block: this warp is done with it
                    mk_mm_deposit<T>(sl, rg, warp, g, t, d);
                    ++rg;
                    kb = 0;
                }
            }
            if (kb != 0) {  // the run ends inside group rg: keep it unless this warp's next run is elsewhere
                const int q1 = q0 + MK_MM_GROUPS * nb;  // this warp's next page
                bool cont = false;
                if (q1 < NB) {
                    const int n1 = min(nb, NB - q1), a1 = wi * n1 / WG;
                    cont = a1 < (wi + 1) * n1 / WG && mk_div(q1 + a1, KB, kbm) == rg;
                }
                if (!cont) mk_mm_deposit<T>(sl, rg, warp, g, t, d);
            }
        }
        __syncwarp();
#if MK_MM_GROUPS > 1
        // the page's `empty` barrier counts MK_CONSUMERS arrivals: each of the WG warps gives MK_MM_GROUPS
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;"
                                    :: "r"(mk_smem_addr(r.empty + stage)), "r"(MK_MM_GROUPS) : "memory");
#else
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(mk_smem_addr(r.empty + stage)) : "memory");
#endif
    }
#if MK_TRACE_X
    if (tid == 0 && stamp) stamp[3] = mk_now();  // warp 0 is done with the task's last page
#endif
    mk_mm_flush<T>(o, lo, f0, ng, sl, tid, have_res, res, false);
    return 0;
}

// ---------------------------------------------------------------- k-chunked input rows (MK_OPT_KCHUNK)
// A matmul whose T input rows of K are too long to hold whole (program.k_chunk: llama-3.1-8b's
// down_proj at batch 8 would take 224 KiB) holds them Kc = o.off2 inputs at a time, in two buffers
// of T x Kc at the start of xs, each in the k order of mk_load_x_mma2. Its weights are stored so
// that a task walks them chunk by chunk (program.kc_pack): in the task's rows [lo, hi), for chunk
// c = 0, 1, ... its ng row groups' blocks of inputs [c Kc, (c + 1) Kc) in fragment order, so block
// q of the task is chunk c, group rg, block kb of the chunk with q = (c ng + rg) KBc + kb. The
// task's bytes stay one contiguous range: the producer and the L2 prefetcher stream them as any
// other task's, page for page. Chunk c + 1 is copied in (cp.async) while the warps work on chunk
// c: at the first page that begins in chunk c every warp is past chunk c - 1 (a barrier), and the
// copy of chunk c + 1 into that buffer is issued; a page that reaches into a chunk not yet in waits
// for its copy (cp.async.wait_group, a barrier). A page spans at most two chunks (a chunk of one
// row group is at least a page: program.kc_problem). Every group of the task keeps its slot for the
// whole task (ng <= S: program.check_kc_slots) and a warp adds each of its partials into its own
// entry; the groups are flushed once, at the end. The same product as mk_matmul_mma2, its fp32
// partial sums added in another order. Two barriers a chunk, no other cost beyond the unchunked
// walk: the input rows are read from L2 once, as before, only in pieces.

// Issue the copies of chunk c of the T input rows into the buffer at shared address buf_s (one
// commit group per thread, empty for a thread with no words).
template <int T>
__device__ __forceinline__ void mk_kc_stage(const MkOp& o, unsigned buf_s, int c, int Kc, int tid) {
    const int kv = Kc >> 3;
    const mk_bf16* base = o.in0 + (size_t)c * Kc;
#pragma unroll 1
    for (int w = tid; w < kv; w += MK_NW) {
        const unsigned dst = buf_s + 16u * (unsigned)((w >> 2) * T * 4 + (w & 3));
        const mk_bf16* src = base + 8 * w;
#pragma unroll
        for (int b = 0; b < T; ++b)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                         :: "r"(dst + 64u * b), "l"(src + (size_t)b * o.ld0) : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// mk_mm_deposit, added into the warp's entry of group rg's slot (slot rg: rg < S) rather than stored:
// a warp deposits a group once per chunk.
template <int T>
__device__ __forceinline__ void mk_kc_deposit(const MkMmSlots& sl, int rg, int warp, int g, int t, float d[4][4]) {
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        v[e] = (d[0][e] + d[1][e]) + (d[2][e] + d[3][e]);
        d[0][e] = d[1][e] = d[2][e] = d[3][e] = 0.f;
    }
    float* ent = sl.base + (rg * MK_CONSUMERS + warp) * 16 * T;
    if (T == 1) {
        if (t == 0) {
            ent[g] += v[0];
            ent[g + 8] += v[2];
        }
    } else if (2 * t < T) {
        float2* p0 = reinterpret_cast<float2*>(ent + g * T + 2 * t);
        float2* p1 = reinterpret_cast<float2*>(ent + (g + 8) * T + 2 * t);
        const float2 a0 = *p0, a1 = *p1;
        *p0 = make_float2(a0.x + v[0], a0.y + v[1]);
        *p1 = make_float2(a1.x + v[2], a1.y + v[3]);
    }
}

template <int T>
__device__ int mk_matmul_kc(const MkParams& P, const MkOp& o, int lo, int hi, MkRing& r, mk_bf16* xs, int tid) {
    const int Kc = o.off2, KBc = Kc >> 5, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int ng = (hi - lo) >> 4, cb = ng * KBc, nb = r.P >> 10;  // cb: the task's blocks of one chunk
    const int nch = Kc > 0 ? o.K / Kc : 0, NB = nch * cb;
    constexpr int slot_B = MK_CONSUMERS * 16 * T * 4;
    const int buf_B = T * Kc * 2;
    MkMmSlots sl;
    sl.base = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(xs) + 2 * buf_B);
    sl.S = min(MK_MM_SLOTS, (P.x_B + 4 * P.acc_floats - 2 * buf_B) / slot_B);
    sl.dirty_B = max(0, min(P.x_B - 2 * buf_B, sl.S * slot_B));
    sl.Sm = MK_MM_FASTDIV && sl.S >= 2 ? mk_div_magic((unsigned)sl.S) : 0u;
    if (KBc < 2 || (Kc & 31) || nch * Kc != o.K || ng > sl.S || sl.S < 2 || KBc < nb) return MK_ERR_KCHUNK;
    const unsigned cbm = MK_MM_FASTDIV ? mk_div_magic((unsigned)cb) : 0u;  // cb >= KBc >= 2 (fastdiv: kc_problem)
    const unsigned kbm = MK_MM_FASTDIV ? mk_div_magic((unsigned)KBc) : 0u;
    const unsigned xs_s = mk_smem_addr(xs);
    mk_kc_stage<T>(o, xs_s, 0, Kc, tid);
    int issued = 0, ready = -1;  // the last chunk whose copy is issued, and the last one in
    uint4* z4 = reinterpret_cast<uint4*>(sl.base);  // the slots in the x region: zero (the barrier below orders it)
    for (int j = tid; j < (sl.dirty_B >> 4); j += MK_NW) z4[j] = make_uint4(0u, 0u, 0u, 0u);
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float d[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[j][e] = 0.f;
    for (int q0 = 0; q0 < NB; q0 += nb) {
        const int n = min(nb, NB - q0), cf = mk_div(q0, cb, cbm), cl = mk_div(q0 + n - 1, cb, cbm);
        if (issued <= cf && cf + 1 < nch) {  // every warp is past chunk cf - 1: its buffer takes chunk cf + 1
            mk_bar(MK_NW);
            mk_kc_stage<T>(o, xs_s + (unsigned)(((cf + 1) & 1) * buf_B), cf + 1, Kc, tid);
            issued = cf + 1;
        }
        if (cl > ready) {  // the page reaches into a chunk not yet waited for
            if (issued > cl) asm volatile("cp.async.wait_group 1;" ::: "memory");
            else asm volatile("cp.async.wait_group 0;" ::: "memory");
            mk_bar(MK_NW);
            ready = cl;
        }
        const int stage = r.stage;
        const unsigned parity = r.phase;
        r.advance();
        mk_mbar_wait(r.full + stage, parity, P.error);
        const int a = warp * n / MK_CONSUMERS, z = (warp + 1) * n / MK_CONSUMERS;
        if (a < z && !MK_NO_MMA) {
            const uint4* pg = reinterpret_cast<const uint4*>(r.pages + (size_t)stage * r.P);
            int c = mk_div(q0 + a, cb, cbm), kb = q0 + a - c * cb;
            int rg = mk_div(kb, KBc, kbm);
            kb -= rg * KBc;
            const uint4* x4 = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(xs) + (c & 1) * buf_B);
            for (int i = a; i < z;) {
                const int e = min(z, i + KBc - kb);  // blocks [i, e) of the run lie in group rg of chunk c
                for (; i + 1 < e; i += 2, kb += 2) {
                    const uint4 w0 = pg[i * 64 + lane], w1 = pg[i * 64 + 32 + lane];
                    const uint4 w2 = pg[i * 64 + 64 + lane], w3 = pg[i * 64 + 96 + lane];
                    const uint4 xa = g < T ? x4[(kb * T + g) * 4 + t] : zero;
                    const uint4 xb = g < T ? x4[((kb + 1) * T + g) * 4 + t] : zero;
                    mk_mma16816(d[0], w0.x, w1.x, w0.y, w1.y, xa.x, xa.y);
                    mk_mma16816(d[1], w0.z, w1.z, w0.w, w1.w, xa.z, xa.w);
                    mk_mma16816(d[2], w2.x, w3.x, w2.y, w3.y, xb.x, xb.y);
                    mk_mma16816(d[3], w2.z, w3.z, w2.w, w3.w, xb.z, xb.w);
                }
                if (i < e) {
                    const uint4 w0 = pg[i * 64 + lane], w1 = pg[i * 64 + 32 + lane];
                    const uint4 xa = g < T ? x4[(kb * T + g) * 4 + t] : zero;
                    mk_mma16816(d[0], w0.x, w1.x, w0.y, w1.y, xa.x, xa.y);
                    mk_mma16816(d[1], w0.z, w1.z, w0.w, w1.w, xa.z, xa.w);
                    ++i;
                    ++kb;
                }
                if (kb == KBc) {  // the group's last block of this chunk
                    mk_kc_deposit<T>(sl, rg, warp, g, t, d);
                    kb = 0;
                    if (++rg == ng) {  // the chunk's last group: the next block is the next chunk's
                        rg = 0;
                        ++c;
                        x4 = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned char*>(xs) + (c & 1) * buf_B);
                    }
                }
            }
            if (kb != 0) mk_kc_deposit<T>(sl, rg, warp, g, t, d);  // the run ends inside a group
        }
        __syncwarp();
        if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(mk_smem_addr(r.empty + stage)) : "memory");
    }
    // the residuals are loaded by the flush (kept in registers across the walk, as mk_matmul_mma2
    // does, they made the persistent kernel spill)
    mk_mm_flush<T>(o, lo, 0, ng, sl, tid, false, make_float2(0.f, 0.f), false);
    return 0;
}

// 8 normed words of column c (inputs 8c .. 8c + 7) of every row, in place.
template <int T>
__device__ __forceinline__ void mk_norm_column(uint4* x4, int c, uint4 w, const float inv[T]) {
#pragma unroll
    for (int b = 0; b < T; ++b) {
        uint4& v = x4[((c >> 2) * T + b) * 4 + (c & 3)];
        v = mk_norm8(v, w, inv[b]);
    }
}

// The input rows of an MK_OPT_MMA matmul into shared memory in the weights' k order (as
// mk_load_x_mma), every 16-byte word of every row in flight at once (cp.async: no registers held)
// and one barrier; meanwhile the slots' part of the x region is zeroed and the norm weight words
// loaded. With a fused norm, the rows' sums of squares are then read from shared memory (each warp
// a part of one row), and every word is scaled in place: the roundings of mk_load_x_mma
// (mk_norm8, rsqrtf(sum / K + eps)), only the fp32 sum of squares adds its terms in another order.
// With MK_OPT_REDUCE the rows are merged from the attention partials instead (mk_merge_rows; here,
// in the batch template, the register allocation of the kernel stays what it was: called from
// mk_run_task, outside it, ptxas spilled 8 bytes more), and the slots are zeroed as always.
template <int T>
__device__ void mk_load_x_mma2(const MkOp& o, mk_bf16* xs, float* red, int tid, const MkMmSlots& sl) {
    const int K = o.K, kv = K >> 3, lane = tid & 31, warp = tid >> 5;
    const unsigned xs_s = mk_smem_addr(xs);
    if (o.opt & MK_OPT_REDUCE) {  // the attention output, merged from its partials (fuse_reduce; no norm)
        mk_merge_rows(o, xs, tid, T, true);
    } else {
#pragma unroll 1
        for (int c = tid; c < kv; c += MK_NW) {  // (not unrolled: no per-thread offsets kept across tasks)
            const unsigned dst = xs_s + 16u * (unsigned)((c >> 2) * T * 4 + (c & 3));
            const mk_bf16* src = o.in0 + 8 * c;
#pragma unroll
            for (int b = 0; b < T; ++b)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                             :: "r"(dst + 64u * b), "l"(src + (size_t)b * o.ld0) : "memory");
        }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    uint4* x4 = reinterpret_cast<uint4*>(xs);
    uint4* z4 = reinterpret_cast<uint4*>(sl.base);
    for (int j = tid; j < (sl.dirty_B >> 4); j += MK_NW) z4[j] = make_uint4(0u, 0u, 0u, 0u);
    const bool norm = o.opt & MK_OPT_FUSED_NORM;
    constexpr int MW = 4;  // norm weight words a thread keeps in registers (8 spill: the kernel is at its cap)
    const uint4* w2 = reinterpret_cast<const uint4*>(o.w2);
    uint4 wv[MW];
#pragma unroll
    for (int m = 0; m < MW; ++m) wv[m] = norm && tid + m * MK_NW < kv ? __ldg(w2 + tid + m * MK_NW) : make_uint4(0u, 0u, 0u, 0u);
    asm volatile("cp.async.wait_all;" ::: "memory");
    mk_bar(MK_NW);
    if (!norm) return;
    constexpr int PARTS = MK_CONSUMERS >= T ? MK_CONSUMERS / T : 1;  // warps per row
    static_assert(T * PARTS <= 32, "red holds 32 partial sums");
    for (int u = warp; u < T * PARTS; u += MK_CONSUMERS) {
        const int b = u % T, p = u / T;
        float ss = 0.f;
        for (int c = 32 * p + lane; c < kv; c += 32 * PARTS) ss += mk_sumsq8(x4[((c >> 2) * T + b) * 4 + (c & 3)]);
        ss = mk_warp_sum(ss);
        if (lane == 0) red[u] = ss;
    }
    mk_bar(MK_NW);
    float inv[T];
#pragma unroll
    for (int b = 0; b < T; ++b) {
        float tot = 0.f;
        for (int p = 0; p < PARTS; ++p) tot += red[p * T + b];
        inv[b] = rsqrtf(tot / K + o.eps);
    }
#pragma unroll
    for (int m = 0; m < MW; ++m)
        if (tid + m * MK_NW < kv) mk_norm_column<T>(x4, tid + m * MK_NW, wv[m], inv);
    for (int c = tid + MW * MK_NW; c < kv; c += MK_NW) mk_norm_column<T>(x4, c, __ldg(w2 + c), inv);
    mk_bar(MK_NW);  // red and the rows before any worker reads them
}

struct MkSlot {                  // a task the waiter has prepared for the workers
    MkOp op;
    int opcode, opi, lo, hi, ok, pad[3];
};
static_assert(sizeof(MkSlot) <= MK_SLOT_B && MK_SLOT_B % 16 == 0, "MK_SLOT_B: the task slots' shared memory");

struct MkBlock {                 // one block's shared memory and worker state
    MkRing ring;
    MkSlot* slots;               // MK_SLOTS of them, task row i in slot i % MK_SLOTS
    int* ready;                  // the last task row whose slot is filled and whose inputs are ready
    mk_bf16* xs;                 // matmul input / attention scratch
    float* acc;                  // matmul row sums
    float* red;                  // 32 floats of reduction scratch
    int* ok;                     // the workers' verdict on the current task
    int* started;                // the last task the workers have begun (the producer waits for it unless ahead)
    int* finished;               // the last task the workers have finished (the publisher waits for it)
    int* last;                   // MK_MOE_FTOPK: this block's router task drew the last ticket
    unsigned long long* pf_pos;  // where the producer is, for the L2 prefetcher (see mk_produce)
    int x_of;                    // the op whose input xs holds (consecutive tiles reuse it)
};

__device__ MkBlock mk_block_init(const MkParams& P) {
    extern __shared__ __align__(128) unsigned char smem[];
    MkBlock k;
    const size_t ring_B = (size_t)P.page_B * P.depth;
    k.ring.pages = smem;
    k.ring.P = P.page_B;
    k.ring.D = P.depth;
    k.ring.stage = 0;
    k.ring.phase = 0;
    k.xs = reinterpret_cast<mk_bf16*>(smem + ring_B);
    k.acc = reinterpret_cast<float*>(smem + ring_B + P.x_B);
    k.red = k.acc + P.acc_floats;
    k.ok = reinterpret_cast<int*>(k.red + 32);
    k.started = k.ok + 1;
    k.finished = k.ok + 2;
    k.ready = k.ok + 3;
    k.last = k.ok + 6;  // red + 38: between pf_pos (red + 36, 37) and the ring's barriers (red + 40)
    k.pf_pos = reinterpret_cast<unsigned long long*>(k.red + 36);  // 8-byte aligned: full (red + 40) is
    k.ring.full = reinterpret_cast<unsigned long long*>(k.red + 40);
    k.ring.empty = k.ring.full + P.depth;
    k.slots = reinterpret_cast<MkSlot*>(k.ring.empty + P.depth + (P.depth & 1));  // 16-byte aligned
    k.x_of = -1;
    if (threadIdx.x == 0) {
        for (int s = 0; s < P.depth; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(mk_smem_addr(k.ring.full + s)));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(mk_smem_addr(k.ring.empty + s)),
                         "r"(MK_CONSUMERS));
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        *k.started = -1;
        *k.finished = -1;
        *k.ready = -1;
        *k.pf_pos = 0ull;
    }
    for (int i = threadIdx.x; i < P.acc_floats; i += blockDim.x) k.acc[i] = 0.f;
    __syncthreads();
    return k;
}

// MK_MM_NOINLINE (default 0): 1 makes the MK_MM=2 matmul task a function of its own (see
// MK_ATTN_NOINLINE in mk_ops.cuh), its registers allocated apart from the rest of the kernel's.
#ifndef MK_MM_NOINLINE
#define MK_MM_NOINLINE 0
#endif
#if MK_MM_NOINLINE
#define MK_MM_FN __device__ __noinline__
#else
#define MK_MM_FN __device__ __forceinline__
#endif

#if MK_MM == 2
// A matmul task of T rows (op `op`), its input rows loaded first unless the block's previous task
// left them in xs: on the tensor cores when its weights are in fragment order. An error code or 0.
template <int T>
MK_MM_FN int mk_matmul(const MkParams& P, MkBlock& k, const MkOp& o, int op, int lo, int hi, int tid) {
    if (o.opt & MK_OPT_KCHUNK) {  // input rows chunked along k: staged anew by every task
        k.x_of = -1;
        if constexpr (T >= 4) return mk_matmul_kc<T>(P, o, lo, hi, k.ring, k.xs, tid);  // program.kc_problem
        else return MK_ERR_KCHUNK;
    }
    if (o.opt & MK_OPT_MMA) {
        const MkMmSlots sl = mk_mm_slots<T>(P, o, k.xs);
        if (k.x_of != op) {
            mk_load_x_mma2<T>(o, k.xs, k.red, tid, sl);
            k.x_of = op;
        }
#if MK_TRACE_X == 1
        if (tid == 0 && P.trace) P.trace[4 * *(volatile int*)k.started] = mk_now();  // the input rows are in
#endif
#if MK_TRACE_X
        return mk_matmul_mma2<T>(o, lo, hi, k.ring, k.xs, sl, tid, P.error,
                                 P.trace ? P.trace + 4 * *(volatile int*)k.started : nullptr);
#else
        return mk_matmul_mma2<T>(o, lo, hi, k.ring, k.xs, sl, tid, P.error);
#endif
    }
    if (k.x_of != op) {
        mk_load_x(o, k.xs, k.red, tid);
        k.x_of = op;
    }
    mk_matmul_pages<T>(o, lo, hi, k.ring, k.xs, k.acc, P.acc_rows, tid, P.error);
    return 0;
}
#else
// A matmul task of T rows: on the tensor cores when its weights are in fragment order.
template <int T>
__device__ __forceinline__ void mk_matmul(const MkParams& P, MkBlock& k, const MkOp& o, int lo, int hi, int tid) {
    if (o.opt & MK_OPT_MMA) mk_matmul_mma<T>(o, lo, hi, k.ring, k.xs, k.acc, P.acc_rows, tid, P.error);
    else mk_matmul_pages<T>(o, lo, hi, k.ring, k.xs, k.acc, P.acc_rows, tid, P.error);
}
#endif

// Run one task on the workers (its inputs are ready). False if the op has no device function here.
// Forced inline: with MK_ATTN=2, ptxas otherwise makes it a function of its own, which spills (472 B
// of stores, 632 of loads) and slowed every kind's tasks; inlined, 4 B (nvcc 13.0 -Xptxas -v). With
// MK_ATTN=1 it was inlined anyway: the cubin is byte for byte the same.
__device__ __forceinline__ int mk_run_task(const MkParams& P, MkBlock& k, const MkOp& o, int opcode, int op, int lo, int hi, int tid) {
    switch (opcode) {
    case MK_OP_MATMUL:
        if (o.opt & MK_OPT_EXPERTS) {
            if (!mk_expert_active(o, lo)) return 0;  // a slot past the active experts: no pages came for it
            if (o.opt & MK_OPT_SLOT_IN) k.x_of = -1;  // its own input rows (mk_expert_input)
        }
#if MK_MM == 2
        switch (o.T) {
        case 1: return mk_matmul<1>(P, k, o, op, lo, hi, tid);
        case 2: return mk_matmul<2>(P, k, o, op, lo, hi, tid);
        case 4: return mk_matmul<4>(P, k, o, op, lo, hi, tid);
        case 8: return mk_matmul<8>(P, k, o, op, lo, hi, tid);
        default: return MK_ERR_BATCH;
        }
#else
        if (o.opt & MK_OPT_KCHUNK) return MK_ERR_KCHUNK;  // the chunked walk is MK_MM=2's
        if (k.x_of != op) {
            if (o.opt & MK_OPT_MMA) mk_load_x_mma(o, k.xs, k.red, tid);
            else mk_load_x(o, k.xs, k.red, tid);
            k.x_of = op;
        }
        switch (o.T) {
        case 1: mk_matmul<1>(P, k, o, lo, hi, tid); break;
        case 2: mk_matmul<2>(P, k, o, lo, hi, tid); break;
        case 4: mk_matmul<4>(P, k, o, lo, hi, tid); break;
        case 8: mk_matmul<8>(P, k, o, lo, hi, tid); break;
        default: return MK_ERR_BATCH;
        }
        return 0;
#endif
    case MK_OP_ATTN_PARTIAL:
        k.x_of = -1;  // the scratch overwrites xs
        return mk_attn_partial<MK_NW>(o, lo, hi, tid, reinterpret_cast<float*>(k.xs)) ? 0 : MK_ERR_ATTN;
    case MK_OP_TOPK:  // an MoE layer's top-k and route table (mk_ops.cuh)
        k.x_of = -1;  // the scratch overwrites xs
        mk_topk(P.ops + op, tid, MK_NW, reinterpret_cast<float*>(k.xs));
        return 0;
    case MK_OP_COMBINE:  // an MoE layer's output (mk_ops.cuh)
        k.x_of = -1;  // the scratch overwrites xs
        mk_combine(P.ops + op, lo, hi, tid, MK_NW, reinterpret_cast<float*>(k.xs));
        return 0;
    default:  // the ops that need only the workers (mk_ops.cuh)
        return mk_run_worker_op(o, opcode, lo, hi, tid, MK_NW, k.red) ? 0 : MK_ERR_OPCODE;
    }
}

// MK_MOE_FTOPK (default 0; megakernel and persistent_barrier only): an MoE layer's top-k runs on the
// SM of its router's last task instead of as a task of its own after a hop. Each router task, once
// its workers have written its logits, takes a ticket (fence, then atomicAdd on the router op's
// counter, which then counts the tasks as publishing would); the one that draws the last ticket
// runs mk_topk and publishes the top-k op's counter and flag itself. The top-k's own task row is
// then a no-op (not waited for, not run, not published), and the publisher skips the router's
// rows (their counter is the tickets; nothing but the top-k reads the logits, and a tile-flag
// dependency on them would time out, an error, rather than hang). Chain kernels run the top-k task.
// Measured slower at batch 1 and 8 (+0.7 to +2.5 %, validation/results/h200-moe-speed-2): the router's
// last task took 9.9 us with the top-k, where router, hop and top-k task took 8.6, and this build's
// matmuls were slower (its persistent kernel spills 4 bytes; the default none).
#ifndef MK_MOE_FTOPK
#define MK_MOE_FTOPK 0
#endif

// Whether op is an MoE router whose last task runs its top-k (the op after it; program.py makes a top-k's
// input the op before it: check_ftopk).
__device__ __forceinline__ bool mk_ftopk_router(const MkParams& P, int op) {
    return MK_MOE_FTOPK && op + 1 < P.n_ops && __ldg(&P.ops[op + 1].kind) == MK_OP_TOPK;
}

// Whether task row t is one MK_MOE_FTOPK moves elsewhere: a top-k's own row (run by its router's last
// task) or a router's (published by its tickets).
__device__ __forceinline__ bool mk_ftopk_row(const MkParams& P, const int* t) {
    if (!MK_MOE_FTOPK) return false;
    const int opcode = __ldg(t);
    return opcode == MK_OP_TOPK || (opcode == MK_OP_MATMUL && mk_ftopk_router(P, __ldg(t + 1)));
}

// MK_MOE_FTOPK, on the workers after a router task: its ticket, and on the last one the top-k, published.
// True on the last one (its scratch overwrote xs). A call of its own with plain arguments: inlined in the
// persistent loop it cost a spill there.
__device__ __noinline__ bool mk_ftopk_ticket(const MkOp* ops, unsigned* counters, unsigned* flags, int* last,
                                             float* scratch, int op, int n_tiles, int tid) {
    mk_bar(MK_NW);  // every worker's logits are written
    if (tid == 0) {
        __threadfence();  // ... and visible at gpu scope before the ticket
        const unsigned old = atomicAdd(counters + op, 1u);
        *(volatile int*)last = old + 1u == (unsigned)n_tiles;
        if (old + 1u == (unsigned)n_tiles) __threadfence();  // the others' logits, seen through their tickets
    }
    mk_bar(MK_NW);
    if (!*(volatile int*)last) return false;
    mk_topk(ops + op + 1, tid, MK_NW, scratch);
    mk_bar(MK_NW);  // every worker's route-table words are written
    if (tid == 0) {
        __threadfence();
        mk_red_relaxed(flags + __ldg(&ops[op + 1].flag_base));
        mk_red_relaxed(counters + op + 1);
    }
    return true;
}

// MK_PUB_FENCE (an experiment; default 0): the publisher's fence. 0: __threadfence(), which PTX makes
// membar.gl, that is fence.sc.gpu (SASS on sm_90, nvcc 13.0: MEMBAR.SC.GPU, then CCTL.IVALL, which
// drops the SM's L1); 1: fence.release.gpu (MEMBAR.ALL.GPU alone), all that a release of the workers'
// writes needs: with the relaxed adds after it, the PTX memory model's release pattern, which the
// waiter's acquire completes, cumulatively through the workers' barrier. The fence sits on every
// boundary's critical path: the last task of an op publishes after it, and the next op's tasks wait
// for that counter (~2 us from an op's last task to the next op's first at llama-3.2-1b b1).
#ifndef MK_PUB_FENCE
#define MK_PUB_FENCE 0
#endif
#if MK_PUB_FENCE != 0 && MK_PUB_FENCE != 1
#error "MK_PUB_FENCE must be 0 (fence.sc.gpu) or 1 (fence.release.gpu)"
#endif

// The publisher lane: for each task row of [i0, i1), once the workers have finished it, fence at
// gpu scope (cumulatively: every worker's writes were ordered before the `finished` store by the
// workers' barrier) and release the tile's flag and the op's counter.
__device__ void mk_publish(const MkParams& P, int i0, int i1, const int* finished) {
    for (int i = i0; i < i1; ++i) {
        const int* t = P.tasks + (size_t)i * MK_TASK_FIELDS;
        if (mk_ftopk_row(P, t)) continue;  // MK_MOE_FTOPK: the router's tickets and its last task publish
        const int op = __ldg(t + 1), tile = __ldg(t + 2);
        unsigned* flag = P.flags + __ldg(&P.ops[op].flag_base) + tile;
        for (int k = 0; *(const volatile int*)finished < i; ++k)
            if ((k & 255) == 255 && mk_failed(P.error)) return;
#if MK_PUB_FENCE
        asm volatile("fence.release.gpu;" ::: "memory");  // with the relaxed adds after it, a release of both
#else
        __threadfence();  // with the relaxed adds after it, a release of both (one fence, not three)
#endif
        mk_red_relaxed(flag);
        mk_red_relaxed(P.counters + op);
    }
}

// Warp 0 of the workers: wait for task row t's dependencies. A counter is polled by lane 0; a
// range of tile flags is split over the lanes, so that its round trips overlap.
__device__ bool mk_wait_deps(const MkParams& P, const int* t, int lane) {
    const int d0 = __ldg(t + 5), nd = __ldg(t + 6);
    bool ok = true;
    if (P.sentinel) {
        // poll the data itself. The producer wrote it with plain stores and no fence: the polled
        // bytes are the data, each element seen whole or not at all. One acquire fence per task
        // (not per element, and none on the producer's side) orders the workers' reads, which go
        // to L2 like the polls, after them.
        for (int d = d0; ok && d < d0 + nd; ++d)
            ok = mk_poll_data(P, __ldg(P.poll_deps + 2 * d), __ldg(P.poll_deps + 2 * d + 1), lane);
        // fence.acq_rel.gpu is MEMBAR.ALL.GPU and CCTL.IVALL in SASS (sm_90, nvcc 13.0), ~100 us a step at
        // llama-3.2-1b b1 and b8 (evidence/h200-mk18-suite10, ab6); an acquire needs only the second
        // (fence.acquire.gpu, MK_SENTINEL_FENCE=2, the default): the polls are strong reads, and with it an
        // acquire pattern
        if (MK_SENTINEL_FENCE == 1) asm volatile("fence.acq_rel.gpu;" ::: "memory");
        if (MK_SENTINEL_FENCE == 2) asm volatile("fence.acquire.gpu;" ::: "memory");
        return __all_sync(0xffffffffu, ok);
    }
    for (int d = d0; d < d0 + nd; ++d) {
        const int kind = __ldg(P.deps + 4 * d), p = __ldg(P.deps + 4 * d + 1);
        const int t0 = __ldg(P.deps + 4 * d + 2), t1 = __ldg(P.deps + 4 * d + 3);
        if (kind == MK_DEP_OP) {
            if (lane == 0 && ok)
                ok = mk_wait_at_least(P.counters + p, (unsigned)__ldg(P.op_tiles + p), P.error, MK_ERR_COUNTER);
        } else {
            const int fb = __ldg(&P.ops[p].flag_base);
            for (int tt = t0 + lane; ok && tt < t1; tt += 32)
                ok = mk_wait_at_least(P.flags + fb + tt, 1u, P.error, MK_ERR_FLAG);
        }
    }
    return __all_sync(0xffffffffu, ok);
}

// The waiter warp: for each task row of [i0, i1), once its slot is free (the workers finished the
// task MK_SLOTS rows before), copy the row's fields and its op description into the slot, wait
// for its dependencies (unless barrier_mode: the workers pass the grid barrier themselves) and
// mark it ready.
__device__ void mk_wait_tasks(const MkParams& P, MkBlock& k, int i0, int i1, int barrier_mode, int lane) {
    for (int i = i0; i < i1; ++i) {
        for (int n = 0; i - i0 >= MK_SLOTS && *(volatile int*)k.finished < i - MK_SLOTS; ++n)
            if ((n & 255) == 255 && mk_failed(P.error)) return;
        const int* t = P.tasks + (size_t)i * MK_TASK_FIELDS;
        MkSlot* sl = k.slots + (i % MK_SLOTS);
        const int op = __ldg(t + 1);
        const unsigned* src = reinterpret_cast<const unsigned*>(P.ops + op);
        unsigned* dst = reinterpret_cast<unsigned*>(&sl->op);
        for (int w = lane; w < (int)(sizeof(MkOp) / 4); w += 32) dst[w] = __ldg(src + w);
        __syncwarp();
        if (lane == 0) {
            if (__ldg(t) == MK_OP_MATMUL) mk_expert_input(sl->op, __ldg(t + 3));
            sl->opcode = __ldg(t);
            sl->opi = op;
            sl->lo = __ldg(t + 3);
            sl->hi = __ldg(t + 4);
        }
        const bool ghost = MK_MOE_FTOPK && __ldg(t) == MK_OP_TOPK;  // run by its router's last task
        const bool ok = barrier_mode || ghost ? true : mk_wait_deps(P, t, lane);
        if (lane == 0) sl->ok = ok;
        __syncwarp();
        if (lane == 0) {
            __threadfence_block();  // the slot's words before `ready`
            *(volatile int*)k.ready = i;
        }
        if (!ok) return;
    }
}

// ---------------------------------------------------------------- the L2 prefetcher
// Which instruction asks L2 for bytes (MK_L2PF_KIND): 0, cp.async.bulk.prefetch.L2 issued by one
// lane per MK_L2PF_CHUNK_B (the bulk-copy engine, as the ring's copies); 1, prefetch.global.L2 by
// the warp's lanes, one per MK_L2PF_LINE_B; 2, the same with .L2::evict_last. Both are hints
// without completion: nothing waits for them, and a prefetch never changes what a load reads.
#ifndef MK_L2PF_KIND
#define MK_L2PF_KIND 0
#endif
#ifndef MK_L2PF_LINE_B
#define MK_L2PF_LINE_B 128        // bytes between two per-line prefetches (a power of two)
#endif
#ifndef MK_L2PF_CHUNK_B
#define MK_L2PF_CHUNK_B 16384     // bytes the prefetcher asks for at a time (a multiple of 16)
#endif
#ifndef MK_L2PF_SLEEP_NS
#define MK_L2PF_SLEEP_NS 256      // the prefetcher's nap when it is a lead ahead of the producer
#endif
#if MK_L2PF_KIND < 0 || MK_L2PF_KIND > 3
#error "MK_L2PF_KIND must be 0 (bulk), 1 (prefetch.global.L2), 2 (prefetch.global.L2::evict_last) or 3 (bulk, evict_last)"
#endif
// MK_L2PF_GATE (an experiment; default 0): 1 asks for weight rows only while the workers' current
// task streams nothing (attention, reductions, the waits after them): the phases in which DRAM
// idles once the ring is full, so that prefetched lines do not compete with the ring's own copies
// while a matmul streams. KV-cache rows are asked for at any time. 2: as 1, and also while the
// workers, done with a matmul task, wait for a next task that streams nothing (the gap between a
// layer's QKV projection and its attention, ~3 us at llama-3.2-1b batch 1, in which 1 waits); the
// gaps between two matmuls stay closed (there the slowest SMs still stream, and asks would slow them).
#ifndef MK_L2PF_GATE
#define MK_L2PF_GATE 0
#endif
#if MK_L2PF_GATE < 0 || MK_L2PF_GATE > 2
#error "MK_L2PF_GATE must be 0 (no gate), 1 (the workers' task) or 2 (and their next task while they wait)"
#endif
#if (MK_L2PF_LINE_B & (MK_L2PF_LINE_B - 1)) != 0 || MK_L2PF_CHUNK_B % 16 != 0
#error "MK_L2PF_LINE_B must be a power of two and MK_L2PF_CHUNK_B a multiple of 16"
#endif

// Ask L2 for bytes [p, p + n) (p 16-byte aligned, n a multiple of 16), from every lane of a warp.
__device__ __forceinline__ void mk_l2_ask(const unsigned char* p, unsigned n, int lane) {
#if MK_L2PF_KIND == 0
    if (lane == 0) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(n) : "memory");
#elif MK_L2PF_KIND == 3
    if (lane == 0) {
        unsigned long long pol;
        asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" :: "l"(p), "r"(n), "l"(pol)
                     : "memory");
    }
#else
    const unsigned long long end = (unsigned long long)p + n;
    for (unsigned long long a = ((unsigned long long)p & ~(unsigned long long)(MK_L2PF_LINE_B - 1))
                                + (unsigned long long)lane * MK_L2PF_LINE_B; a < end; a += 32ull * MK_L2PF_LINE_B) {
#if MK_L2PF_KIND == 1
        asm volatile("prefetch.global.L2 [%0];" :: "l"(a));
#else
        asm volatile("prefetch.global.L2::evict_last [%0];" :: "l"(a));
#endif
    }
#endif
}

// Segment s of task row t's DRAM bytes in the prefetcher's stream: a matmul's weight rows (one
// segment), or for each attention partial of the row its K rows then its V rows (positions
// [p0, p1) of kv head g, sequence b: the layout mk_attn_partial_one reads). Other rows stream
// nothing (n = 0 segments).
struct MkSeg {
    const unsigned char* src;
    long long bytes;
};

struct MkPfRow {
    const MkOp* o;
    int kind;                    // 0: nothing, 1: matmul, 2: attention partials
    int lo, hi;
    int nseg;
};

__device__ __forceinline__ MkPfRow mk_pf_row(const MkParams& P, int row) {
    const int* t = P.tasks + (size_t)row * MK_TASK_FIELDS;
    const int opcode = __ldg(t);
    MkPfRow r{P.ops + __ldg(t + 1), 0, __ldg(t + 3), __ldg(t + 4), 0};
    if (opcode == MK_OP_MATMUL) {  // an expert task's rows are unknown until its top-k: never asked for
        if (!(__ldg(&r.o->opt) & MK_OPT_EXPERTS)) { r.kind = 1; r.nseg = 1; }
    } else if (opcode == MK_OP_ATTN_PARTIAL) { r.kind = 2; r.nseg = 2 * (r.hi - r.lo); }
    return r;
}

__device__ __forceinline__ MkSeg mk_pf_seg(const MkPfRow& r, int s) {
    const MkOp* o = r.o;
    if (r.kind == 1) {
        const int K = __ldg(&o->K);
        const unsigned char* W = reinterpret_cast<const unsigned char*>(
            __ldg(reinterpret_cast<const unsigned long long*>(&o->W)));
        return MkSeg{W + (size_t)r.lo * K * 2, (long long)(r.hi - r.lo) * K * 2};
    }
    const int i = r.lo + (s >> 1), T = __ldg(&o->T), C = __ldg(&o->splits), kv_total = __ldg(&o->kv_total);
    const int D = __ldg(&o->hd), hkv = __ldg(&o->hkv), s_max = __ldg(&o->s_max);
    const int g = i / (T * C), b = (i / C) % T, c = i % C;
    const int Kw = __ldg(&o->K), w0 = Kw > 0 && Kw < kv_total ? kv_total - Kw : 0, n = kv_total - w0;  // mk_attn_first
    const int p0 = w0 + (int)((long long)c * n / C), p1 = w0 + (int)((long long)(c + 1) * n / C);
    const unsigned long long cache = __ldg(reinterpret_cast<const unsigned long long*>((s & 1) ? (const void*)&o->vc
                                                                                              : (const void*)&o->kc));
    const unsigned char* base = reinterpret_cast<const unsigned char*>(cache)
                                + ((((size_t)b * hkv + g) * s_max + p0) * D) * 2;
    return MkSeg{base, (long long)(p1 - p0) * D * 2};
}

__device__ long long mk_pf_row_bytes(const MkParams& P, int row) {
    const MkPfRow r = mk_pf_row(P, row);
    long long n = 0;
    for (int s = 0; s < r.nseg; ++s) n += mk_pf_seg(r, s).bytes;
    return n;
}

// The L2 prefetcher warp: walk task rows [i0, i1) and ask L2 for their bytes (mk_pf_seg), at most
// P.l2_lead_B bytes of the stream ahead of the producer. Positions count the bytes of every row in
// queue order (weights and KV rows: what the simulator's loader streams); the producer posts its
// row and the bytes of it issued (k.pf_pos), and a shadow walk sums the rows before it. Weight
// bytes the producer has issued are skipped, and so is an attention row the workers have begun.
// The producer does nothing more than post; the warp naps while it is a lead ahead. All lanes walk
// together (the loads are the same address for every lane); mk_l2_ask spreads the asking.
__device__ void mk_l2_prefetch(const MkParams& P, const MkBlock& k, int i0, int i1, int lane) {
    const long long lead = P.l2_lead_B;
    if (lead <= 0) return;
    const volatile unsigned long long* pos = k.pf_pos;
    const volatile int* started = k.started;
    int srow = i0;              // shadow walk: the rows [i0, srow) ...
    long long scum = 0;         // ... hold scum bytes
    long long cum = 0;          // bytes of rows [i0, j)
    unsigned naps = 0;
    for (int j = i0; j < i1; ++j) {
        const MkPfRow r = mk_pf_row(P, j);
        long long done = 0;     // bytes of row j before segment s
        bool skip = false;
        for (int s = 0; s < r.nseg && !skip; ++s) {
            const MkSeg g = mk_pf_seg(r, s);
            long long so = 0;
            while (so < g.bytes) {
                // lane 0 reads the producer's post and the workers' task; every lane decides alike
                const unsigned long long pp = __shfl_sync(0xffffffffu, lane == 0 ? *pos : 0ull, 0);
                const int begun = __shfl_sync(0xffffffffu, lane == 0 ? *started : 0, 0);
#if MK_L2PF_GATE
                // the workers' current task streams weights: no weight rows asked for meanwhile
                bool mm = false;
                if (lane == 0 && begun >= i0 && begun < i1) {
                    mm = __ldg(P.tasks + (size_t)begun * MK_TASK_FIELDS) == MK_OP_MATMUL;
#if MK_L2PF_GATE == 2
                    // ... unless they are done with it and their next task streams nothing
                    if (mm && *(const volatile int*)k.finished >= begun && begun + 1 < i1)
                        mm = __ldg(P.tasks + (size_t)(begun + 1) * MK_TASK_FIELDS) == MK_OP_MATMUL;
#endif
                }
                const bool busy = __shfl_sync(0xffffffffu, mm, 0);
#else
                const bool busy = false;
#endif
                const int prow = (int)(pp >> 32);
                const long long poff = (long long)(unsigned)pp;
                while (srow < prow && srow < i1) scum += mk_pf_row_bytes(P, srow++);
                if (r.kind == 1 && j < prow) { skip = true; break; }   // the producer has issued it all
                if (r.kind == 2 && begun >= j) { skip = true; break; }  // its task has begun
                if (r.kind == 1 && j == prow && so < poff) so = poff;   // ... or part of it
                if (so >= g.bytes) break;
                const long long limit = prow >= i1 ? 0x7fffffffffffffffll : scum + (prow >= i0 ? poff : 0) + lead;
                const long long at = cum + done + so;
                if (at >= limit || (busy && r.kind == 1)) {  // a lead ahead (or gated): nap, and give up (the whole warp) if the grid has failed
                    if (MK_L2PF_SLEEP_NS > 0) __nanosleep(MK_L2PF_SLEEP_NS);
                    if ((++naps & 255) == 0 && __any_sync(0xffffffffu, mk_failed(P.error))) return;
                    continue;
                }
                long long n = min(min((long long)MK_L2PF_CHUNK_B, g.bytes - so), limit - at);
                n = min((n + 15) & ~15ll, g.bytes - so);
                mk_l2_ask(g.src + so, (unsigned)n, lane);
                __syncwarp();
                so += n;
            }
            done += g.bytes;
        }
        cum += skip ? mk_pf_row_bytes(P, j) : done;
    }
}

// The persistent kernels: one block per SM walks its queue. barrier_mode = 0: dependencies from
// the tables (megakernel); 1: a grid barrier after every op instead (persistent_barrier; the
// queues list ops in order).
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1) mk_persistent(const MkParams* __restrict__ Pp, int barrier_mode) {
    const MkParams P = *Pp;
    MkBlock k = mk_block_init(P);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int q0 = P.queue_start[blockIdx.x], q1 = P.queue_start[blockIdx.x + 1];
    if (warp == MK_CONSUMERS) {
        if (lane == 0) mk_produce(P, q0, q1, k.ring, k.started, barrier_mode ? k.started : k.ready, barrier_mode,
                                  P.l2_lead_B > 0 ? k.pf_pos : nullptr);
        return;
    }
    if (warp == MK_CONSUMERS + 1) {
        if (P.sentinel) mk_reset_next(P, lane);
        else if (lane == 0 && !barrier_mode) mk_publish(P, q0, q1, k.finished);
        return;
    }
    if (warp == MK_CONSUMERS + 2) {
        mk_wait_tasks(P, k, q0, q1, barrier_mode, lane);
        return;
    }
    if (warp == MK_CONSUMERS + 3) {
        mk_l2_prefetch(P, k, q0, q1, lane);
        return;
    }
    int passed = 0;  // barrier mode: grid barriers this block has passed
    for (int i = q0; i < q1; ++i) {
        const MkSlot* sl = k.slots + (i % MK_SLOTS);
        if (tid == 0) {
            if (P.trace && !MK_TRACE_X) P.trace[4 * i] = mk_now();
            bool ok = true;
            for (int n = 0; *(volatile int*)k.ready < i; ++n)
                if ((n & 255) == 255 && mk_failed(P.error)) { ok = false; break; }
            __threadfence_block();
            ok = ok && sl->ok && !mk_failed(P.error);
            if (barrier_mode)
                for (; ok && passed < sl->opi; ++passed) {
                    mk_red_release(P.barrier);
                    ok = mk_wait_at_least(P.barrier, (unsigned)(passed + 1) * gridDim.x, P.error, MK_ERR_BARRIER);
                }
            *k.ok = ok;
            *(volatile int*)k.started = i;
            if (P.trace) P.trace[4 * i + 1] = mk_now();
        }
        mk_bar(MK_NW);
        if (!*k.ok) return;
        const MkOp o = sl->op;  // by value: the fields live in registers, not reloaded after every barrier
#if MK_MOE_FTOPK
        const int code = sl->opcode == MK_OP_TOPK ? 0 : mk_run_task(P, k, o, sl->opcode, sl->opi, sl->lo, sl->hi, tid);
        if (sl->opcode == MK_OP_MATMUL && mk_ftopk_router(P, sl->opi)
            && mk_ftopk_ticket(P.ops, P.counters, P.flags, k.last, reinterpret_cast<float*>(k.xs), sl->opi, o.n_tiles, tid))
            k.x_of = -1;
#else
        const int code = mk_run_task(P, k, o, sl->opcode, sl->opi, sl->lo, sl->hi, tid);
#endif
        if (tid == 0 && P.trace) P.trace[4 * i + 2] = mk_now();
        mk_bar(MK_NW);  // every worker's writes are ordered before what thread 0 does next
        if (tid == 0) {
            if (code) atomicCAS(P.error, 0, code);
            __threadfence_block();
            *(volatile int*)k.finished = i;  // the publisher takes it from here
            if (P.trace && !MK_TRACE_X) P.trace[4 * i + 3] = mk_now();
        }
    }
    if (barrier_mode && tid == 0)  // arrive at the barriers this block has no tasks behind
        for (; passed < P.n_ops - 1; ++passed) mk_red_release(P.barrier);
}

// Where a chain kernel lets the next one launch under programmatic dependent launch (graph_pdl):
// 0 (early, the default): first thing, before its prologue; 1 (late): once its workers have
// computed the task (after the main loop). The next kernel's griddepcontrol.wait still waits for
// this whole grid to finish and flush, so the position changes timing, never results.
#ifndef MK_PDL_TRIGGER
#define MK_PDL_TRIGGER 0
#endif
#if MK_PDL_TRIGGER != 0 && MK_PDL_TRIGGER != 1
#error "MK_PDL_TRIGGER must be 0 (early) or 1 (late)"
#endif

// Chain modes: one launch per op, block b runs task row task0 + b. Weights stream before the
// griddepcontrol.wait, so with programmatic dependent launch (graph_pdl) a block prefetches its
// first pages while the previous kernel finishes; without it both instructions are no-ops.
extern "C" __global__ void __launch_bounds__(MK_THREADS, 1) mk_chain(const MkParams* __restrict__ Pp, int task0) {
#if MK_PDL_TRIGGER == 0
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const MkParams P = *Pp;
    MkBlock k = mk_block_init(P);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int* t = P.tasks + (size_t)(task0 + blockIdx.x) * MK_TASK_FIELDS;
    if (warp == MK_CONSUMERS) {
        if (lane == 0) mk_produce(P, task0 + blockIdx.x, task0 + blockIdx.x + 1, k.ring, k.started, nullptr, 2);
        return;
    }
    if (warp >= MK_CONSUMERS + 1) return;  // kernel boundaries publish and order
    const int row = task0 + blockIdx.x;
    if (tid == 0 && P.trace) P.trace[4 * row] = mk_now();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (tid == 0) {
        *(volatile int*)k.started = task0 + blockIdx.x;
        if (P.trace) P.trace[4 * row + 1] = mk_now();
    }
    mk_bar(MK_NW);
    MkOp o = P.ops[__ldg(t + 1)];  // by value: the fields live in registers
    if (__ldg(t) == MK_OP_MATMUL) mk_expert_input(o, __ldg(t + 3));
    const int code = mk_run_task(P, k, o, __ldg(t), __ldg(t + 1), __ldg(t + 3), __ldg(t + 4), tid);
#if MK_PDL_TRIGGER == 1
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (code && tid == 0) atomicCAS(P.error, 0, code);
    if (tid == 0 && P.trace) P.trace[4 * row + 2] = P.trace[4 * row + 3] = mk_now();
}
