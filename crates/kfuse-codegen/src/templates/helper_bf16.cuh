//~ The bf16 conversion helpers (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_BF16
#define KF_HELPER_BF16
// bf16 <-> f32 without cuda_bf16.h: bf16 is the top half of an f32; rounding uses PTX (sm_80+).
__device__ __forceinline__ float kf_bf16_to_f32(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short kf_f32_to_bf16(float f) { unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif
