// Prototype kernels for the GIoU training step (bf16, B=16384, N=256), timed against kfuse's
// generated kernels in the same run. nvcc -O3 -arch=sm_90 -std=c++17 train_proto.cu -o tp
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <random>
#include <cuda_runtime.h>
#include "train_kernels.cuh"
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1); } } while (0)
// ---------------------------------------------------------------- harness
struct Timer { cudaEvent_t a, b; Timer() { CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b)); } };
static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
template <class F> static void timeit(const char* name, F launch, void* flush, size_t flush_bytes, double bytes) {
    Timer t;
    for (int i = 0; i < 10; ++i) launch();
    CK(cudaDeviceSynchronize());
    std::vector<float> b2b, fl;
    for (int k = 0; k < 15; ++k) {
        CK(cudaEventRecord(t.a));
        for (int i = 0; i < 20; ++i) launch();
        CK(cudaEventRecord(t.b)); CK(cudaEventSynchronize(t.b));
        float ms; CK(cudaEventElapsedTime(&ms, t.a, t.b)); b2b.push_back(ms * 1000 / 20);
    }
    for (int k = 0; k < 30; ++k) {
        CK(cudaMemsetAsync(flush, k & 0xff, flush_bytes));
        CK(cudaEventRecord(t.a)); launch(); CK(cudaEventRecord(t.b)); CK(cudaEventSynchronize(t.b));
        float ms; CK(cudaEventElapsedTime(&ms, t.a, t.b)); fl.push_back(ms * 1000);
    }
    CK(cudaGetLastError());
    const float mb = median(b2b), mf = median(fl);
    printf("%-44s b2b %8.2f us  flushed %8.2f us  (%5.0f / %5.0f GB/s over %.1f MB)\n", name, mb, mf, bytes / mb / 1e3, bytes / mf / 1e3, bytes / 1e6);
}
static unsigned short bf(float f) { unsigned u; memcpy(&u, &f, 4); return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }
static float fb(unsigned short h) { unsigned u = (unsigned)h << 16; float f; memcpy(&f, &u, 4); return f; }

int main() {
    const long long B = 16384, N = 256, nbox = B * N;
    int dev = 0, sms = 0; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, dev));
    printf("%s, %d SMs\n", prop.name, sms);
    // data like `kfuse gen boxes`: count = floor(|N(0, 3)|), boxes of uint8 corners
    std::mt19937_64 rng(7);
    std::normal_distribution<double> cnt(0, 3), jit(0, 12);
    std::uniform_int_distribution<int> c255(0, 254), w255(1, 255);
    std::vector<unsigned short> hp(nbox * 4), ht(nbox * 4, 0);
    std::vector<int> hl(B);
    long long valid = 0;
    auto box = [&](float* o) { int x = c255(rng), y = c255(rng), w = w255(rng), h = w255(rng); o[0] = x; o[1] = y; o[2] = std::min(x + w, 255); o[3] = std::min(y + h, 255); };
    for (long long b = 0; b < B; ++b) {
        int c = std::min((int)std::floor(std::fabs(cnt(rng))), 255);
        hl[b] = c; valid += c;
        for (long long s = 0; s < N; ++s) {
            float tb[4], pb[4];
            box(pb);
            if (s < c) { box(tb); for (int k = 0; k < 4; ++k) pb[k] = tb[k] + (float)jit(rng); float q[4] = {std::min(pb[0], pb[2]), std::min(pb[1], pb[3]), std::max(pb[0], pb[2]), std::max(pb[1], pb[3])}; memcpy(pb, q, 16);
                for (int k = 0; k < 4; ++k) ht[(b * N + s) * 4 + k] = bf(tb[k]); }
            for (int k = 0; k < 4; ++k) hp[(b * N + s) * 4 + k] = bf(pb[k]);
        }
    }
    printf("B=%lld N=%lld valid boxes %lld\n", B, N, valid);
    const size_t tb = nbox * 8;
    unsigned short *pred, *target, *dpred, *dref, *loss;
    int* lengths;
    CK(cudaMalloc(&pred, tb)); CK(cudaMalloc(&target, tb)); CK(cudaMalloc(&dpred, tb)); CK(cudaMalloc(&dref, tb)); CK(cudaMalloc(&loss, 16));
    CK(cudaMalloc(&lengths, B * 4));
    CK(cudaMemcpy(pred, hp.data(), tb, cudaMemcpyHostToDevice)); CK(cudaMemcpy(target, ht.data(), tb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(lengths, hl.data(), B * 4, cudaMemcpyHostToDevice));
    float* scale; u64* li; float4* lv; double* partials; unsigned* counter;
    CK(cudaMalloc(&scale, 16)); CK(cudaMalloc(&li, 2 * nbox * 8)); CK(cudaMalloc(&lv, 2 * nbox * 16)); CK(cudaMalloc(&partials, 1 << 20)); CK(cudaMalloc(&counter, 16));
    CK(cudaMemset(counter, 0, 16)); CK(cudaMemset(partials, 0, 1 << 20));
    const size_t flush_bytes = 200ull << 20; void* flush; CK(cudaMalloc(&flush, flush_bytes));
    Tail tail{loss, scale, li, lv, partials, counter};
    const double pad_bytes = 2.0 * tb, len_bytes = (double)tb + B * 4;
    const long long nchunks = nbox / 2;

    auto coop = [&](const void* fn, void** args) {
        int per = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, fn, 256, 0));
        CK(cudaLaunchCooperativeKernel(fn, per * sms, 256, args, 0, 0));
    };
    auto grid_of = [&](const void* fn) { int per = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, fn, 256, 0)); return per * sms; };
    std::vector<unsigned short> href(nbox * 4), hout(nbox * 4);
    unsigned short lref = 0, lout = 0;
    auto check = [&](const char* name) {
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hout.data(), dpred, tb, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(&lout, loss, 2, cudaMemcpyDeviceToHost));
        long long bad = 0; double worst = 0;
        for (size_t i = 0; i < hout.size(); ++i) if (hout[i] != href[i]) { ++bad; worst = std::max(worst, (double)std::fabs(fb(hout[i]) - fb(href[i]))); }
        printf("  check %-40s loss %.6f (ref %.6f), dpred elements differing %lld, max abs diff %.3g\n", name, fb(lout), fb(lref), bad, worst);
    };
    auto poison = [&]() { CK(cudaMemset(dpred, 0x7f, tb)); CK(cudaMemset(loss, 0x7f, 2)); };

    // reference: the generated padded kernel
    long long sz0 = B, sz1 = N;
    unsigned* counter_pad; CK(cudaMalloc(&counter_pad, 16)); CK(cudaMemset(counter_pad, 0, 16)); // [0] arrivals, [1] departures
    void* a_pad[] = {&pred, &target, &loss, &dpred, &li, &lv, &partials, &counter_pad, &sz0, &sz1};
    auto gen_pad = [&]() { coop((const void*)kf_225d6bb11374dcad_0, a_pad); };
    poison(); gen_pad(); CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(href.data(), dpred, tb, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(&lref, loss, 2, cudaMemcpyDeviceToHost));
    printf("generated padded kernel: grid %d\n", grid_of((const void*)kf_225d6bb11374dcad_0));

    printf("== floors\n");
    timeit("cudaMemset dpred (32 MB)", [&]() { CK(cudaMemsetAsync(dpred, 0, tb)); }, flush, flush_bytes, tb);
    { const int g = sms * 4;
      timeit("zero_fill_cs", [&]() { zero_fill_cs<<<g, 256>>>((uint4*)dpred, nchunks); }, flush, flush_bytes, tb);
      timeit("copy16 target->dpred", [&]() { copy16<<<g, 256>>>((const uint4*)target, (uint4*)dpred, nchunks); }, flush, flush_bytes, pad_bytes); }

    printf("== padded + predicate (must move %.1f MB; 70%% of 2.80 TB/s = %.2f us)\n", pad_bytes / 1e6, pad_bytes / 2.8e6 / 0.7);
    timeit("generated (cooperative, 1024x4)", gen_pad, flush, flush_bytes, pad_bytes);
    Bar* bar; CK(cudaMalloc(&bar, sizeof(Bar))); CK(cudaMemset(bar, 0, sizeof(Bar)));
#define PADV(KERNEL, EPT, MINB) { \
        auto fn = (const void*)KERNEL<EPT, MINB>; const uint2* pp = (const uint2*)pred; const uint4* tt = (const uint4*)target; long long nb = nbox; \
        void* args[] = {&pp, &tt, &dpred, &tail, &nb}; \
        char nm[80]; snprintf(nm, 80, #KERNEL "<%d,%d> grid %d", EPT, MINB, grid_of(fn)); \
        poison(); coop(fn, args); check(nm); timeit(nm, [&]() { coop(fn, args); }, flush, flush_bytes, pad_bytes); }
#define PAD2(EPT, MINB, LCAP) { \
        auto fn = (const void*)pad_compact2<EPT, MINB, LCAP>; const uint2* pp = (const uint2*)pred; const uint4* tt = (const uint4*)target; long long nb = nbox; \
        void* args[] = {&pp, &tt, &dpred, &tail, &bar, &nb}; \
        char nm[80]; snprintf(nm, 80, "pad_compact2<%d,%d,%d> grid %d", EPT, MINB, LCAP, grid_of(fn)); \
        poison(); coop(fn, args); check(nm); timeit(nm, [&]() { coop(fn, args); }, flush, flush_bytes, pad_bytes); }
    PAD2(2, 4, 512) PAD2(2, 4, 64)
    timeit("generated (cooperative, 1024x4) again", gen_pad, flush, flush_bytes, pad_bytes);

    printf("== padded + lengths (must move %.1f MB; 70%% = %.2f us)\n", len_bytes / 1e6, len_bytes / 2.8e6 / 0.7);
    float* tmp1 = (float*)li;
    void* a_l0b[] = {&pred, &target, &lengths, &loss, &scale, &tmp1, &partials, &counter, &sz0, &sz1};
    void* a_l1[] = {&pred, &target, &lengths, &dpred, &scale, &tmp1, &sz0, &sz1};
    const int lg0 = (int)std::min<long long>(B / 64, sms * 8), lg1 = (int)std::min<long long>(B / 8, sms * 8); // kfuse plan grids
    auto gen_len = [&]() {
        CK(cudaLaunchKernel((const void*)kf_595cf59383a6d678_0, lg0, 256, a_l0b, 0, 0));
        CK(cudaLaunchKernel((const void*)kf_595cf59383a6d678_1, lg1, 256, a_l1, 0, 0));
    };
    poison(); gen_len(); check("generated lengths (two kernels)");
    timeit("generated lengths (two kernels)", gen_len, flush, flush_bytes, len_bytes);
    const int lgr = (int)std::min<long long>((B + 7) / 8, sms * 2);
    unsigned* counter_rows; CK(cudaMalloc(&counter_rows, 16)); CK(cudaMemset(counter_rows, 0, 16)); // the rows plan's ticket
    void* a_rows[] = {&pred, &target, &lengths, &loss, &dpred, &partials, &counter_rows, &sz0, &sz1};
    auto gen_rows = [&]() { CK(cudaLaunchKernel((const void*)kf_len_rows, lgr, 512, a_rows, 0, 0)); };
    poison(); gen_rows(); check("generated lengths, rows plan (one launch)");
    timeit("generated lengths, rows plan (one launch)", gen_rows, flush, flush_bytes, len_bytes);
    {
        char nm[96];
        auto run = [&](auto launch) { poison(); launch(); check(nm); timeit(nm, launch, flush, flush_bytes, len_bytes); };
        { const int gf = sms * 4, gc = sms;
          snprintf(nm, 96, "len_split<8,2> fill %d compute %d (session 3 best)", gf, gc);
          run([&]() { len_split<8, 2><<<gf + gc, 256>>>((const uint2*)pred, (const uint2*)target, lengths, dpred, loss, partials, counter, B, N, gf); }); }
#define LENF(BT, S, SPT, G) { const int g = (G); \
        snprintf(nm, 96, "len_fused<%d,S=%d,%d> grid %d", BT, S, SPT, g); \
        if ((B / g + 1) * S > BT * SPT) printf("skip %s\n", nm); \
        else run([&]() { len_fused<BT, S, SPT, (int)(16384 / 4 / BT)><<<g, BT>>>((const uint2*)pred, (const uint2*)target, lengths, dpred, loss, partials, counter, B, N); }); }
        LENF(512, 8, 1, sms * 2)
        for (int g : {sms * 2, 256}) {
            snprintf(nm, 96, "fill_rows contiguous grid %d", g); timeit(nm, [&]() { fill_rows<0><<<g, 512>>>(dpred, B, N); }, flush, flush_bytes, len_bytes);
            snprintf(nm, 96, "fill_rows strided grid %d", g); timeit(nm, [&]() { fill_rows<1><<<g, 512>>>(dpred, B, N); }, flush, flush_bytes, len_bytes);
        }
#define LEN2(ST, MODE) { snprintf(nm, 96, "len_fused2 %s mode %d (1: no tail, 2: no count)", ST ? "strided" : "contiguous", MODE); \
        auto l = [&]() { len_fused2<ST, MODE><<<sms * 2, 512>>>((const uint2*)pred, (const uint2*)target, lengths, dpred, loss, partials, counter, B, N); }; \
        if (MODE == 0) run(l); else timeit(nm, l, flush, flush_bytes, len_bytes); }
        LEN2(0, 0) LEN2(1, 0)
        unsigned long long* bar64; CK(cudaMalloc(&bar64, 8)); CK(cudaMemset(bar64, 0, 8));
#define LEN3(ST, FOLD) { snprintf(nm, 96, "len_fused3 %s, barrier count, fold %s", ST ? "strided" : "contiguous", FOLD ? "warp" : "block"); \
        const void* fn = (const void*)len_fused3<ST, FOLD>; const uint2* pp = (const uint2*)pred; const uint2* tt = (const uint2*)target; \
        void* args[] = {&pp, &tt, &lengths, &dpred, &loss, &partials, &counter, &bar64, (void*)&B, (void*)&N}; \
        run([&]() { CK(cudaLaunchCooperativeKernel(fn, sms * 2, 512, args, 0, 0)); }); }
        LEN3(0, 0) LEN3(1, 0)
        timeit("generated lengths, rows plan, again", gen_rows, flush, flush_bytes, len_bytes);
    }
    printf("done\n");
    return 0;
}
