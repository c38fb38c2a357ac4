//~ Streaming store helpers (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_STORE_CS
#define KF_HELPER_STORE_CS
// Streaming (evict-first) stores for outputs that nothing re-reads: st.global.cs.
__device__ __forceinline__ void kf_st_cs(float4* p, float4 v) { asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)); }
__device__ __forceinline__ void kf_st_cs(float2* p, float2 v) { asm volatile("st.global.cs.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(v.x), "f"(v.y)); }
__device__ __forceinline__ void kf_st_cs(float* p, float v) { asm volatile("st.global.cs.f32 [%0], %1;" :: "l"(p), "f"(v)); }
__device__ __forceinline__ void kf_st_cs(uint4* p, uint4 v) { asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)); }
__device__ __forceinline__ void kf_st_cs(uint2* p, uint2 v) { asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.x), "r"(v.y)); }
__device__ __forceinline__ void kf_st_cs(unsigned int* p, unsigned int v) { asm volatile("st.global.cs.u32 [%0], %1;" :: "l"(p), "r"(v)); }
#endif
