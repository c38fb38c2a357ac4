// The hand-written GIoU loss kernel that `kfuse bench --baseline giou` times next to the generated
// one: what a competent engineer writes by hand for the seed's padded batch (one thread per box,
// skip the box when invalid, read the prediction only for valid boxes, 16-byte loads), with the
// mean finished inside the same launch so that it does the same job as the fused kernel.
// It sums with float atomics (fast, but the order, and so the last bits, vary run to run).
// Semantics: torchvision.ops.generalized_box_iou_loss, eps 1e-7, mean over valid boxes.

extern "C" __global__ void __launch_bounds__(256) giou_handwritten(
    const float4* __restrict__ pred,    // [n] boxes (x1, y1, x2, y2)
    const float4* __restrict__ target,  // [n] boxes; y2 == 0 marks padding
    long long n,                        // boxes in the batch (B * N)
    float* __restrict__ acc,            // [2] running sum and count, zero between launches
    unsigned int* __restrict__ ticket,  // [1] blocks finished, zero between launches
    float* __restrict__ loss)           // [1] the mean loss
{
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float l = 0.f, c = 0.f;
    if (i < n) {
        const float4 t = target[i];
        if (t.w != 0.f) {
            const float4 p = pred[i];
            const float eps = 1e-7f;
            const float area_p = (p.z - p.x) * (p.w - p.y);
            const float area_t = (t.z - t.x) * (t.w - t.y);
            const float iw = fminf(p.z, t.z) - fmaxf(p.x, t.x);
            const float ih = fminf(p.w, t.w) - fmaxf(p.y, t.y);
            const float inter = (iw > 0.f && ih > 0.f) ? iw * ih : 0.f;
            const float uni = area_p + area_t - inter;
            const float iou = inter / (uni + eps);
            const float cw = fmaxf(p.z, t.z) - fminf(p.x, t.x);
            const float ch = fmaxf(p.w, t.w) - fminf(p.y, t.y);
            const float area_c = cw * ch;
            l = 1.f - (iou - (area_c - uni) / (area_c + eps));
            c = 1.f;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        l += __shfl_down_sync(0xffffffffu, l, o);
        c += __shfl_down_sync(0xffffffffu, c, o);
    }
    __shared__ float sl[8], sc[8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sl[warp] = l; sc[warp] = c; }
    __syncthreads();
    if (warp != 0) return;
    l = lane < 8 ? sl[lane] : 0.f;
    c = lane < 8 ? sc[lane] : 0.f;
    for (int o = 4; o > 0; o >>= 1) {
        l += __shfl_down_sync(0xffffffffu, l, o);
        c += __shfl_down_sync(0xffffffffu, c, o);
    }
    if (lane != 0) return;
    if (c > 0.f) { atomicAdd(&acc[0], l); atomicAdd(&acc[1], c); }
    __threadfence();
    if (atomicAdd(ticket, 1u) == gridDim.x - 1) {
        const float s = atomicAdd(&acc[0], 0.f), cnt = atomicAdd(&acc[1], 0.f);
        loss[0] = s / fmaxf(cnt, 1.f);
        acc[0] = 0.f; acc[1] = 0.f; *ticket = 0u;
    }
}

// Device-to-device copy, to measure the card's copy bandwidth in the same run (bytes read + written).
extern "C" __global__ void __launch_bounds__(256) copy_bandwidth(
    const float4* __restrict__ src,  // [n]
    float4* __restrict__ dst,        // [n]
    long long n)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
