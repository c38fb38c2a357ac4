//~ Counter-based uniform random numbers (reviewed template, emitted as is by `cuda::helper_source`).
//~ The same recipe as `kfuse_ir::philox::uniform`, which the interpreter runs: any change here
//~ must change both (the GPU tests compare the bits).
#ifndef KF_HELPER_PHILOX
#define KF_HELPER_PHILOX
// rand_like: Philox-4x32-10 of the counter (low and high words of the flat index i, 0, 0) under
// the key (low and high words of the seed); output word 0's top 24 bits times 2^-24, in [0, 1).
__device__ __forceinline__ float kf_philox_uniform(long long seed, long long i) {
    unsigned int c0 = (unsigned int)(unsigned long long)i, c1 = (unsigned int)((unsigned long long)i >> 32);
    unsigned int c2 = 0u, c3 = 0u;
    unsigned int k0 = (unsigned int)(unsigned long long)seed, k1 = (unsigned int)((unsigned long long)seed >> 32);
    #pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return (float)(c0 >> 8) * 5.9604644775390625e-8f;
}
#endif
