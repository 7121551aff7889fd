// The kernel boundary taken apart, on one GPU in one run (a diagnostic beside launch_bench --boundary).
//
//   nvcc -O2 -arch=sm_90 -std=c++17 -o boundary_parts boundary_parts.cu && ./boundary_parts > out.json
//
// A. Chains of empty kernels in a CUDA graph, 1 to 200 long: the node interval and the graph's start.
// B. Compute-only chains (thread 0 of each block waits on the global timer), with and without one
//    same-address atomic per block at the end.
// C. Chains of the memory-bound kernel of launch_bench (132 blocks, 4 16-byte loads in flight per
//    thread, one chunk per block) with four endings: 0 one atomicXor per warp to ONE address
//    (launch_bench's k_read), 2 one plain store per warp to its own line, 3 a block reduction in
//    shared memory and one store per block (the CuPy read_sum of the calibration), 5 no write at all;
//    bytes from 0 (the code, no loads) to 256 MiB; plain graph, PDL waiting first, PDL reading first.
// Every replay is preceded by an L2 flush (512 MiB read), as in launch_bench; the per-kernel time is
// the replay's time (CUDA events) over the chain length. Every reading chain's result is checked.
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); std::exit(2); } } while (0)

__global__ void k_empty(int pdl) {
    if (pdl) {
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
}

template <int ATOMIC>
__global__ void k_busy(long long ns, unsigned* blocks) {
    if (threadIdx.x != 0) return;
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
    if (ATOMIC) atomicAdd(blocks, 1u);
}

template <int END>
__global__ void k_read(const uint4* __restrict__ a, unsigned long long chunk_vec, unsigned* out, int mode, int never) {
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
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (END == 0) { if (lane == 0) atomicXor(out, acc); }
    if (END == 2) { if (lane == 0) out[((size_t)blockIdx.x * 32 + warp) * 32] = acc; }
    if (END == 3) {
        __shared__ unsigned red[32];
        if (lane == 0) red[warp] = acc;
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned s = 0;
            for (int w = 0; w < (int)(blockDim.x >> 5); ++w) s ^= red[w];
            out[(size_t)blockIdx.x * 32 * 32] = s;
        }
    }
    if (END == 5) { if (never && acc == 0x12345u) out[0] = acc; }
}

__global__ void k_fill(uint4* a, unsigned long long n_vec, unsigned seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n_vec;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)(i * 2654435761ull) ^ seed;
        a[i] = make_uint4(x | 1u, (x * 747796405u) | 1u, (x ^ 0x9e3779b9u) | 1u, (x + 12345u) | 1u);
    }
}
__global__ void k_flush(const uint4* a, unsigned long long n, unsigned* out) {
    unsigned acc = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) acc ^= __ldcg(a + i).x;
    if (acc == 0x9e3779b9u) out[0] = acc;
}

template <typename... Params, typename... Args>
static void launch(cudaStream_t s, bool pdl, int grid, int block, void (*kernel)(Params...), Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid); cfg.blockDim = dim3(block); cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr; cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, args...));
}

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]); }

int main() {
    cudaDeviceProp prop; CHECK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount, reps = 11;
    cudaStream_t s; CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int chain = 16;
    const unsigned long long max_bytes = 256ull << 20, flush_bytes = 512ull << 20;
    const size_t out_words = (size_t)sms * 32 * 32;  // per chain member: a line per warp
    uint4 *buf, *fb; unsigned *outs, *cnt;
    CHECK(cudaMalloc(&buf, chain * max_bytes)); CHECK(cudaMalloc(&fb, flush_bytes));
    CHECK(cudaMalloc(&outs, chain * out_words * 4)); CHECK(cudaMalloc(&cnt, 4));
    k_fill<<<sms * 8, 256, 0, s>>>(buf, chain * max_bytes / 16, 1u);
    k_fill<<<sms * 8, 256, 0, s>>>(fb, flush_bytes / 16, 2u);
    std::vector<unsigned> host(chain * max_bytes / 4), got(chain * out_words);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(host.data(), buf, chain * max_bytes, cudaMemcpyDeviceToHost));
    cudaEvent_t e0, e1; CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
    // µs per kernel of each timed replay of a graph captured from `body` (n kernels long)
    auto time_graph = [&](int n, auto&& body) {
        cudaGraph_t g; cudaGraphExec_t ge;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        body();
        CHECK(cudaStreamEndCapture(s, &g)); CHECK(cudaGraphInstantiate(&ge, g, 0)); CHECK(cudaGraphDestroy(g));
        std::vector<double> per;
        for (int r = 0; r < 3 + reps; ++r) {
            k_flush<<<sms * 4, 512, 0, s>>>(fb, flush_bytes / 16, cnt);
            CHECK(cudaMemsetAsync(outs, 0, chain * out_words * 4, s));
            CHECK(cudaEventRecord(e0, s)); CHECK(cudaGraphLaunch(ge, s)); CHECK(cudaEventRecord(e1, s));
            float ms; CHECK(cudaEventSynchronize(e1)); CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (r >= 3) per.push_back(1e3 * ms / n);
        }
        CHECK(cudaGraphExecDestroy(ge));
        return per;
    };
    std::map<std::pair<int, unsigned long long>, unsigned> want;
    auto check = [&](unsigned long long words, const char* what) {
        CHECK(cudaMemcpy(got.data(), outs, chain * out_words * 4, cudaMemcpyDeviceToHost));
        for (int i = 0; i < chain; ++i) {
            auto key = std::make_pair(i, words);
            if (!want.count(key)) {
                unsigned w = 0;
                const unsigned* p = host.data() + (size_t)i * (max_bytes / 4);
                for (unsigned long long j = 0; j < words; ++j) w ^= p[j];
                want[key] = w;
            }
            unsigned x = 0;
            for (size_t j = 0; j < out_words; ++j) x ^= got[(size_t)i * out_words + j];
            if (x != want[key]) { std::fprintf(stderr, "%s: member %d read wrong data\n", what, i); std::exit(3); }
        }
    };
    bool first = true;
    auto emit = [&](const char* part, const char* kernel, int n, int mode, long long bytes, int threads,
                    const std::vector<double>& per) {
        printf("%s{\"part\": \"%s\", \"kernel\": \"%s\", \"chain\": %d, \"mode\": \"%s\", \"bytes\": %lld, "
               "\"threads\": %d, \"median_us\": %.4f, \"us\": [", first ? "" : ",\n", part, kernel, n,
               mode == 0 ? "graph" : mode == 1 ? "pdl_wait_first" : "pdl_read_first", bytes, threads, median(per));
        for (size_t i = 0; i < per.size(); ++i) printf("%s%.4f", i ? ", " : "", per[i]);
        printf("]}");
        first = false;
        fflush(stdout);
    };
    int driver = 0; CHECK(cudaDriverGetVersion(&driver));
    printf("{\"device\": \"%s\", \"sms\": %d, \"driver_version\": %d, \"rows\": [\n", prop.name, sms, driver);
    // A. empty chains
    for (int pdl = 0; pdl < 2; ++pdl)
        for (int n : {1, 2, 4, 8, 16, 64, 200})
            emit("empty", "k_empty", n, pdl, 0, 128, time_graph(n, [&] {
                for (int i = 0; i < n; ++i) launch(s, pdl, sms, 128, k_empty, pdl); }));
    // B. compute-only chains
    for (int atomic = 0; atomic < 2; ++atomic)
        for (long long ns : {0LL, 1000LL, 4000LL})
            emit("busy", atomic ? "k_busy_atomic" : "k_busy", chain, 0, ns, 512, time_graph(chain, [&] {
                for (int i = 0; i < chain; ++i) launch(s, false, sms, 512, atomic ? k_busy<1> : k_busy<0>, ns, cnt); }));
    // C. memory-bound chains
    using KR = void (*)(const uint4*, unsigned long long, unsigned*, int, int);
    const int ends[4] = {0, 2, 3, 5};
    const KR kr[4] = {k_read<0>, k_read<2>, k_read<3>, k_read<5>};
    const char* names[4] = {"read_atomic_same", "read_store_warp", "read_reduce_block", "read_nowrite"};
    for (int e = 0; e < 4; ++e)
        for (unsigned long long bytes : {0ull, 64ull << 10, 256ull << 10, 1ull << 20, 4ull << 20, 16ull << 20,
                                         64ull << 20, 256ull << 20})
            for (int threads : {128, 512, 1024})
                for (int mode = 0; mode < 3; ++mode) {
                    if (threads != 512 && (mode || bytes != (1ull << 20))) continue;
                    if (bytes > (16ull << 20) && (mode || (ends[e] != 3 && ends[e] != 5))) continue;
                    const unsigned long long chunk = bytes / 16 / sms;
                    auto per = time_graph(chain, [&] {
                        for (int i = 0; i < chain; ++i)
                            launch(s, mode != 0, sms, threads, kr[e], (const uint4*)(buf + (unsigned long long)i * (max_bytes / 16)),
                                   chunk, outs + (size_t)i * out_words, mode, 0);
                    });
                    if (ends[e] != 5) check(chunk * sms * 4, names[e]);
                    emit("read", names[e], chain, mode, (long long)(chunk * 16 * sms), threads, per);
                }
    printf("]}\n");
    return 0;
}
