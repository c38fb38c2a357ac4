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

    printf("== padded + lengths (must move %.1f MB; 70%% = %.2f us); b2b / rotated over 2 buffer sets / flushed\n", len_bytes / 1e6, len_bytes / 2.8e6 / 0.7);
    // set 1: copies of the inputs and its own dpred, so that rotating between sets 0 and 1 touches 2 x 100 MB > 3 x L2 of
    // inputs + outputs, as `kfuse bench --rotate-sets`
    struct Set { unsigned short *pred, *target, *dpred; int* lengths; };
    Set sets[2] = {{pred, target, dpred, lengths}, {nullptr, nullptr, nullptr, nullptr}};
    CK(cudaMalloc(&sets[1].pred, tb)); CK(cudaMalloc(&sets[1].target, tb)); CK(cudaMalloc(&sets[1].dpred, tb)); CK(cudaMalloc(&sets[1].lengths, B * 4));
    CK(cudaMemcpy(sets[1].pred, pred, tb, cudaMemcpyDeviceToDevice)); CK(cudaMemcpy(sets[1].target, target, tb, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(sets[1].lengths, lengths, B * 4, cudaMemcpyDeviceToDevice));
    auto time3 = [&](const char* name, auto launch) {
        Timer t;
        for (int i = 0; i < 10; ++i) launch(i & 1);
        CK(cudaDeviceSynchronize());
        std::vector<float> b2b, rot, fl;
        for (int k = 0; k < 15; ++k) for (int mode = 0; mode < 2; ++mode) {
            CK(cudaEventRecord(t.a));
            for (int i = 0; i < 20; ++i) launch(mode ? (i & 1) : 0);
            CK(cudaEventRecord(t.b)); CK(cudaEventSynchronize(t.b));
            float ms; CK(cudaEventElapsedTime(&ms, t.a, t.b)); (mode ? rot : b2b).push_back(ms * 1000 / 20);
        }
        for (int k = 0; k < 30; ++k) {
            CK(cudaMemsetAsync(flush, k & 0xff, flush_bytes));
            CK(cudaEventRecord(t.a)); launch(0); CK(cudaEventRecord(t.b)); CK(cudaEventSynchronize(t.b));
            float ms; CK(cudaEventElapsedTime(&ms, t.a, t.b)); fl.push_back(ms * 1000);
        }
        CK(cudaGetLastError());
        const float mb = median(b2b), mr = median(rot), mf = median(fl);
        printf("%-52s b2b %6.2f  rot %6.2f  flushed %6.2f us  (%3.0f%% / %3.0f%% / %3.0f%% of 2.80 TB/s over %.1f MB)\n", name, mb, mr, mf,
               len_bytes / mb / 2.8e4, len_bytes / mr / 2.8e4, len_bytes / mf / 2.8e4, len_bytes / 1e6);
    };
    auto check1 = [&](const char* name) { // set 1's output against the reference too
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hout.data(), sets[1].dpred, tb, cudaMemcpyDeviceToHost));
        long long bad = 0; for (size_t i = 0; i < hout.size(); ++i) bad += hout[i] != href[i];
        printf("  check %-40s set 1: dpred elements differing %lld\n", name, bad);
    };
    unsigned* counter_rows; CK(cudaMalloc(&counter_rows, 16)); CK(cudaMemset(counter_rows, 0, 16));
    unsigned long long* bar64; CK(cudaMalloc(&bar64, 8)); CK(cudaMemset(bar64, 0, 8));
    const int lgr = (int)std::min<long long>((B + 7) / 8, sms * 2);
    // the generated rows plan: a cooperative launch (its compute warps wait for every block's arrival)
    auto rows_launch = [&](const void* fn, bool coop) {
        return [&, fn, coop](int k) {
            Set& x = sets[k];
            void* a[] = {&x.pred, &x.target, &x.lengths, &loss, &x.dpred, &partials, &counter_rows, &sz0, &sz1};
            if (coop) CK(cudaLaunchCooperativeKernel(fn, lgr, 512, a, 0, 0)); else CK(cudaLaunchKernel(fn, lgr, 512, a, 0, 0));
        };
    };
    auto gen_rows = rows_launch((const void*)kf_len_rows, true);
    auto run3 = [&](const char* nm, auto launch) {
        poison(); CK(cudaMemset(sets[1].dpred, 0x7f, tb)); launch(0); check(nm); launch(1); check1(nm); time3(nm, launch);
    };
    run3("generated lengths, rows plan (one launch)", gen_rows);
    for (int g : {sms * 2}) {
        char nm[96]; snprintf(nm, 96, "fill_rows contiguous grid %d (floor: zero fill only)", g);
        time3(nm, [&](int k) { fill_rows<0><<<g, 512>>>(sets[k].dpred, B, N); });
    }
    {
        const void* fn = (const void*)len_fused3<0, 0>;
        run3("len_fused3 contiguous (session 4 best)", [&](int k) {
            Set& x = sets[k]; const uint2* pp = (const uint2*)x.pred; const uint2* tt = (const uint2*)x.target;
            void* args[] = {&pp, &tt, &x.lengths, &x.dpred, &loss, &partials, &counter, &bar64, (void*)&B, (void*)&N};
            CK(cudaLaunchCooperativeKernel(fn, sms * 2, 512, args, 0, 0)); });
    }
#define LWS(MINCW, COUNT) { \
        const void* fn = (const void*)len_ws<MINCW, COUNT>; char nm[96]; \
        snprintf(nm, 96, "len_ws<min cw %d, count %s>", MINCW, COUNT ? "arrival word (coop)" : "all lengths"); \
        run3(nm, [&](int k) { \
            Set& x = sets[k]; const uint2* pp = (const uint2*)x.pred; const uint2* tt = (const uint2*)x.target; \
            void* args[] = {&pp, &tt, &x.lengths, &x.dpred, &loss, &partials, &counter, &bar64, (void*)&B, (void*)&N}; \
            if (COUNT) CK(cudaLaunchCooperativeKernel(fn, sms * 2, 512, args, 0, 0)); else CK(cudaLaunchKernel(fn, sms * 2, 512, args, 0, 0)); }); }
    LWS(6, 1) LWS(8, 1)

    run3("generated rows plan, KF_MINCW 6", rows_launch((const void*)kf_len_rows_m6_u2, true));
#ifdef KF_LEN_ROWS_OLD
    run3("previous generated rows plan (plain launch)", rows_launch((const void*)kf_len_rows_old, false));
#endif
    run3("generated lengths, rows plan, again", gen_rows);
    printf("done\n");
    return 0;
}
