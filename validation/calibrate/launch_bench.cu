// Launch and grid-synchronisation costs, measured from C++ so that no interpreter sits between
// the host and the driver. Built by `mksim calibrate` with nvcc; prints one JSON object.
//
//   launch_bench [--quick] [--boundary]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace cg = cooperative_groups;

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            std::fprintf(stderr, "launch_bench: %s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
            std::exit(2);                                                                     \
        }                                                                                     \
    } while (0)

__global__ void k_count(unsigned* counter) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(counter, 1u);
}

// PDL chain member: let the next kernel launch at once, wait for the previous one, then count.
__global__ void k_count_pdl(unsigned* counter) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicAdd(counter, 1u);
}

__global__ void k_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}

__global__ void k_grid_sync(int iters, unsigned* arrivals, unsigned* errors) {
    cg::grid_group grid = cg::this_grid();
    const unsigned n = gridDim.x;
    for (int it = 0; it < iters; ++it) {
        if (threadIdx.x == 0) atomicAdd(arrivals, 1u);
        grid.sync();
        if (threadIdx.x == 0 && atomicAdd(arrivals, 0u) < (unsigned)(it + 1) * n) atomicAdd(errors, 1u);
    }
}

// A memory-bound chain member: sums its own region (one 16-byte load per thread per step, 4 in
// flight). mode 0: plain; 1: PDL, waits for the previous kernel before reading; 2: PDL, reads
// its region (weights need no predecessor) and waits only before writing its result.
__global__ void k_read(const uint4* __restrict__ a, unsigned long long chunk_vec, unsigned* out, int mode) {
    if (mode) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (mode == 1) asm volatile("griddepcontrol.wait;" ::: "memory");
    const uint4* p = a + (unsigned long long)blockIdx.x * chunk_vec;
    unsigned acc = 0;
    for (unsigned long long i = threadIdx.x; i < chunk_vec; i += 4ull * blockDim.x) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            unsigned long long j = i + (unsigned long long)u * blockDim.x;
            v[u] = j < chunk_vec ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (mode == 2) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicXor(out, acc);  // one atomic per warp, not per thread
}

// A compute-only chain member: thread 0 of every block waits `ns` on the global timer; the block's
// other threads exit at once. Counts the blocks that ran.
__global__ void k_busy(long long ns, unsigned* blocks) {
    if (threadIdx.x != 0) return;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
    atomicAdd(blocks, 1u);
}

__global__ void k_fill(uint4* a, unsigned long long n_vec, unsigned seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n_vec;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)(i * 2654435761ull) ^ seed;
        a[i] = make_uint4(x | 1u, (x * 747796405u) | 1u, (x ^ 0x9e3779b9u) | 1u, (x + 12345u) | 1u);
    }
}

static double now_us() {
    using namespace std::chrono;
    return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static std::string list(const std::vector<double>& v) {
    std::string s = "[";
    char buf[64];
    for (size_t i = 0; i < v.size(); ++i) {
        std::snprintf(buf, sizeof buf, "%s%.4f", i ? ", " : "", v[i]);
        s += buf;
    }
    return s + "]";
}

// Launch `kernel` with programmatic stream serialisation: it may start while the previous kernel of
// the stream still runs, and resolves the dependency itself (griddepcontrol.wait).
template <typename... Params, typename... Args>
static void launch_pdl(cudaStream_t s, int grid, int block, void (*kernel)(Params...), Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

int main(int argc, char** argv) {
    bool quick = false, boundary = false;
    for (int i = 1; i < argc; ++i) {
        quick |= std::string(argv[i]) == "--quick";
        boundary |= std::string(argv[i]) == "--boundary";
    }
    const int reps = quick ? 5 : 11;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned* d;  // [0] counter, [1] arrivals, [2] errors
    CHECK(cudaMalloc(&d, 4 * sizeof(unsigned)));
    CHECK(cudaMemsetAsync(d, 0, 4 * sizeof(unsigned), s));
    unsigned long long expected = 0;
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    auto elapsed_us = [&]() {
        float ms;
        CHECK(cudaEventSynchronize(e1));
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return 1e3 * ms;
    };
    for (int i = 0; i < 200; ++i) k_count<<<sms, 128, 0, s>>>(d);  // warm-up
    expected += 200;
    CHECK(cudaStreamSynchronize(s));

    // 1. Host-side issue rate: back-to-back launches timed on the host clock.
    const int n_host = 1000;
    std::vector<double> host;
    for (int r = 0; r < reps; ++r) {
        CHECK(cudaStreamSynchronize(s));
        double t0 = now_us();
        for (int i = 0; i < n_host; ++i) k_count<<<sms, 128, 0, s>>>(d);
        double t1 = now_us();
        CHECK(cudaGetLastError());
        expected += n_host;
        host.push_back((t1 - t0) / n_host);
    }
    CHECK(cudaStreamSynchronize(s));

    // 2. GPU-side gap: launches queued behind a spinning kernel, then timed on the GPU.
    const int n_gap = 500;
    std::vector<double> gap, gap1;
    for (int grid : {sms, 1}) {
        for (int r = 0; r < reps; ++r) {
            k_spin<<<1, 1, 0, s>>>(20 * 1000 * 1000 / (quick ? 2 : 1));
            CHECK(cudaEventRecord(e0, s));
            for (int i = 0; i < n_gap; ++i) k_count<<<grid, 128, 0, s>>>(d);
            CHECK(cudaEventRecord(e1, s));
            expected += n_gap;
            (grid == sms ? gap : gap1).push_back(elapsed_us() / n_gap);
        }
    }

    // 3. Per node in a CUDA graph, and with programmatic dependent launch (stream and graph).
    const int n_graph = 200;
    auto graph_of = [&](bool pdl) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < n_graph; ++i) {
            if (pdl) launch_pdl(s, sms, 128, k_count_pdl, d); else k_count<<<sms, 128, 0, s>>>(d);
        }
        CHECK(cudaStreamEndCapture(s, &g));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        CHECK(cudaGraphDestroy(g));
        return ge;
    };
    std::vector<double> graph_node, graph_pdl_node, stream_pdl;
    for (int pdl = 0; pdl < 2; ++pdl) {
        cudaGraphExec_t ge = graph_of(pdl);
        CHECK(cudaGraphLaunch(ge, s));  // warm-up replay
        expected += n_graph;
        for (int r = 0; r < reps; ++r) {
            k_spin<<<1, 1, 0, s>>>(200 * 1000);
            CHECK(cudaEventRecord(e0, s));
            CHECK(cudaGraphLaunch(ge, s));
            CHECK(cudaEventRecord(e1, s));
            expected += n_graph;
            (pdl ? graph_pdl_node : graph_node).push_back(elapsed_us() / n_graph);
        }
        CHECK(cudaGraphExecDestroy(ge));
    }
    for (int r = 0; r < reps; ++r) {
        k_spin<<<1, 1, 0, s>>>(20 * 1000 * 1000 / (quick ? 2 : 1));
        CHECK(cudaEventRecord(e0, s));
        for (int i = 0; i < n_gap; ++i) launch_pdl(s, sms, 128, k_count_pdl, d);
        CHECK(cudaEventRecord(e1, s));
        expected += n_gap;
        stream_pdl.push_back(elapsed_us() / n_gap);
    }

    // 4. One launch to completion, device idle: host clock around launch + synchronize.
    std::vector<double> single;
    for (int r = 0; r < (quick ? 50 : 200); ++r) {
        double t0 = now_us();
        k_count<<<sms, 128, 0, s>>>(d);
        CHECK(cudaStreamSynchronize(s));
        single.push_back(now_us() - t0);
        expected += 1;
    }

    unsigned counter = 0;
    CHECK(cudaMemcpy(&counter, d, sizeof counter, cudaMemcpyDeviceToHost));
    if (counter != (unsigned)expected) {
        std::fprintf(stderr, "launch_bench: %u kernels counted, %llu launched\n", counter, expected);
        return 3;
    }

    // 5. Cooperative grid.sync() versus blocks per SM.
    int coop = 0;
    CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    std::string sync_json = "[";
    const int iters = quick ? 500 : 2000;
    for (int bps : {1, 2, 4, 8}) {
        int max_bps = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&max_bps, k_grid_sync, 128, 0));
        if (!coop || bps > max_bps) continue;
        std::vector<double> per;
        for (int r = 0; r < reps; ++r) {
            CHECK(cudaMemsetAsync(d + 1, 0, 2 * sizeof(unsigned), s));
            int grid = bps * sms, it = iters;
            unsigned* arr = d + 1;
            unsigned* err = d + 2;
            void* args[] = {&it, &arr, &err};
            CHECK(cudaEventRecord(e0, s));
            CHECK(cudaLaunchCooperativeKernel((void*)k_grid_sync, dim3(grid), dim3(128), args, 0, s));
            CHECK(cudaEventRecord(e1, s));
            per.push_back(elapsed_us() / iters);
            unsigned errors = 0;
            CHECK(cudaMemcpy(&errors, err, sizeof errors, cudaMemcpyDeviceToHost));
            if (errors) {
                std::fprintf(stderr, "launch_bench: grid.sync let %u blocks through early\n", errors);
                return 3;
            }
        }
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s{\"blocks_per_sm\": %d, \"us\": ", sync_json.size() > 1 ? ", " : "", bps);
        sync_json += buf + list(per) + "}";
    }
    sync_json += "]";

    // 6. A chain of memory-bound kernels in a CUDA graph: plain, PDL waiting first, PDL reading first.
    const int chain = 16;
    const unsigned long long max_bytes = 16ull << 20, flush_bytes = 512ull << 20;
    uint4 *buf, *flush_buf;
    CHECK(cudaMalloc(&buf, chain * max_bytes));
    CHECK(cudaMalloc(&flush_buf, flush_bytes));
    unsigned* slots;  // one XOR of everything read per chain member, checked against the host
    CHECK(cudaMalloc(&slots, (chain + 1) * sizeof(unsigned)));
    k_fill<<<sms * 8, 256, 0, s>>>(buf, chain * max_bytes / 16, 1u);
    k_fill<<<sms * 8, 256, 0, s>>>(flush_buf, flush_bytes / 16, 2u);
    std::vector<unsigned> host_buf(chain * max_bytes / 4);
    CHECK(cudaStreamSynchronize(s));  // s does not synchronise with the legacy stream of cudaMemcpy
    CHECK(cudaMemcpy(host_buf.data(), buf, chain * max_bytes, cudaMemcpyDeviceToHost));
    // A graph captured from `capture_body`, replayed after `warmup` untimed runs; µs per kernel of
    // each timed replay. The L2 is evicted and the chain's checksums cleared before every replay.
    auto time_graph = [&](auto&& capture_body, int warmup) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        capture_body();
        CHECK(cudaStreamEndCapture(s, &g));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        CHECK(cudaGraphDestroy(g));
        std::vector<double> per;
        for (int r = 0; r < warmup + reps; ++r) {
            k_read<<<sms * 4, 512, 0, s>>>(flush_buf, flush_bytes / 16 / (sms * 4), slots + chain, 0);
            CHECK(cudaMemsetAsync(slots, 0, chain * sizeof(unsigned), s));
            CHECK(cudaEventRecord(e0, s));
            CHECK(cudaGraphLaunch(ge, s));
            CHECK(cudaEventRecord(e1, s));
            double t = elapsed_us() / chain;
            if (r >= warmup) per.push_back(t);
        }
        CHECK(cudaGraphExecDestroy(ge));
        return per;
    };
    // Each chain member XORed the `words` 32-bit words of its region into its slot: check them all.
    auto chain_read_right = [&](unsigned long long words, const char* what) {
        std::vector<unsigned> got(chain);
        CHECK(cudaMemcpy(got.data(), slots, chain * sizeof(unsigned), cudaMemcpyDeviceToHost));
        for (int i = 0; i < chain; ++i) {
            unsigned want = 0;
            const unsigned* w = host_buf.data() + (size_t)i * (max_bytes / 4);
            for (unsigned long long j = 0; j < words; ++j) want ^= w[j];
            if (got[i] != want) {
                std::fprintf(stderr, "launch_bench: %s kernel %d read wrong data (%08x, want %08x)\n", what, i, got[i],
                             want);
                return false;
            }
        }
        return true;
    };
    std::string chain_json = "[";
    for (unsigned long long bytes : {256ull << 10, 1ull << 20, 4ull << 20, 16ull << 20}) {
        for (int mode = 0; mode < 3; ++mode) {
            const unsigned long long chunk = bytes / 16 / sms;
            auto per = time_graph([&] {
                for (int i = 0; i < chain; ++i) {
                    const uint4* region = buf + (unsigned long long)i * (max_bytes / 16);
                    if (mode == 0) {
                        k_read<<<sms, 512, 0, s>>>(region, chunk, slots + i, 0);
                    } else {
                        launch_pdl(s, sms, 512, k_read, region, chunk, slots + i, mode);
                    }
                }
            }, 1);
            if (!chain_read_right(chunk * sms * 4, "memory chain")) return 3;
            char buf2[128];
            std::snprintf(buf2, sizeof buf2, "%s{\"bytes\": %llu, \"mode\": \"%s\", \"us\": ", chain_json.size() > 1 ? ", " : "",
                          chunk * 16 * sms, mode == 0 ? "graph" : mode == 1 ? "pdl_wait_first" : "pdl_read_first");
            chain_json += buf2 + list(per) + "}";
        }
    }
    chain_json += "]";
    // 7. (--boundary) The kernel boundary taken apart: compute-only chains of a fixed busy time, and
    //    memory-bound chains at several threads per block (bytes in flight per SM) and blocks per SM.
    std::string parts_json = "[";
    if (boundary) {
        char b2[200];
        for (long long ns : {0LL, 1000LL, 4000LL}) {
            CHECK(cudaMemsetAsync(d + 3, 0, sizeof(unsigned), s));
            auto per = time_graph([&] { for (int i = 0; i < chain; ++i) k_busy<<<sms, 512, 0, s>>>(ns, d + 3); }, 3);
            unsigned ran = 0;
            CHECK(cudaMemcpy(&ran, d + 3, sizeof ran, cudaMemcpyDeviceToHost));
            if (ran != (unsigned)(sms * chain * (3 + reps))) {
                std::fprintf(stderr, "launch_bench: busy chain ran %u blocks, want %d\n", ran, sms * chain * (3 + reps));
                return 3;
            }
            std::snprintf(b2, sizeof b2, "%s{\"kind\": \"busy\", \"busy_ns\": %lld, \"us\": ", parts_json.size() > 1 ? ", " : "", ns);
            parts_json += b2 + list(per) + "}";
        }
        for (unsigned long long bytes : {1ull << 20, 4ull << 20, 16ull << 20}) {
            for (int threads : {128, 256, 512, 1024}) {
                for (int bps : {1, 2}) {
                    if (threads * bps > 1024) continue;
                    const int grid = sms * bps;
                    const unsigned long long chunk = bytes / 16 / grid;
                    auto per = time_graph([&] {
                        for (int i = 0; i < chain; ++i)
                            k_read<<<grid, threads, 0, s>>>(buf + (unsigned long long)i * (max_bytes / 16), chunk, slots + i, 0);
                    }, 3);
                    if (!chain_read_right(chunk * grid * 4, "boundary read chain")) return 3;
                    std::snprintf(b2, sizeof b2, ", {\"kind\": \"read\", \"bytes\": %llu, \"threads\": %d, \"blocks_per_sm\": %d, "
                                  "\"inflight_per_sm\": %d, \"us\": ", chunk * 16 * grid, threads, bps, threads * bps * 64);
                    parts_json += b2 + list(per) + "}";
                }
            }
        }
    }
    parts_json += "]";
    CHECK(cudaFree(slots));
    CHECK(cudaFree(buf));
    CHECK(cudaFree(flush_buf));

    int driver = 0, runtime = 0;
    CHECK(cudaDriverGetVersion(&driver));
    CHECK(cudaRuntimeGetVersion(&runtime));
    std::printf("{\"device\": \"%s\", \"sms\": %d, \"driver_version\": %d, \"runtime_version\": %d,\n", prop.name, sms,
                driver, runtime);
    std::printf(" \"host_launch_us\": %s,\n", list(host).c_str());
    std::printf(" \"stream_gap_us\": %s,\n", list(gap).c_str());
    std::printf(" \"stream_gap_1block_us\": %s,\n", list(gap1).c_str());
    std::printf(" \"graph_node_us\": %s,\n", list(graph_node).c_str());
    std::printf(" \"graph_pdl_node_us\": %s,\n", list(graph_pdl_node).c_str());
    std::printf(" \"stream_pdl_gap_us\": %s,\n", list(stream_pdl).c_str());
    std::printf(" \"single_launch_us\": %s,\n", list(single).c_str());
    std::printf(" \"grid_sync\": %s,\n", sync_json.c_str());
    std::printf(" \"memory_chain\": %s,\n", chain_json.c_str());
    std::printf(" \"boundary_parts\": %s,\n", parts_json.c_str());
    std::printf(" \"kernels_counted\": %u}\n", counter);
    std::fprintf(stderr, "launch_bench: median host %.2f us, gap %.2f us, graph node %.2f us, pdl node %.2f us\n",
                 median(host), median(gap), median(graph_node), median(graph_pdl_node));
    return 0;
}
