//~ The f16 conversion helpers (reviewed template, emitted as is by `cuda::helper_source`).
#ifndef KF_HELPER_F16
#define KF_HELPER_F16
// f16 <-> f32 without cuda_fp16.h: the PTX conversions (round to nearest even).
__device__ __forceinline__ float kf_f16_to_f32(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short kf_f32_to_f16(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#endif
