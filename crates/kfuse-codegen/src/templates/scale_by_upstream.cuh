//~ The backward of a loss computed with its gradient: the gradient (n elements of {{gty}}, in
//~ place) times the loss's upstream gradient (one {{uty}} on the device). Nothing is written when
//~ the upstream gradient is exactly 1, what `loss.backward()` passes: the check runs on the
//~ device, so the host never waits for the value. x * 1 == x for every x, NaN and infinities
//~ included, so skipping is exact. Reviewed template; rendered by `scale`; `//~` lines are not
//~ emitted.
{{helpers}}
extern "C" __global__ void __launch_bounds__({{block}}) {{name}}({{gty}}* __restrict__ grad, const {{uty}}* __restrict__ up, long long n) {
    const float s = {{load_up}};
    if (s == 1.0f) return;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        grad[i] = {{scaled}};
    }
}
