// Element types and their conversions to the type arithmetic is done in.
//
// Nothing here includes a CUDA header: NVRTC compiles the sources alone, so
// the narrow floats are storage structs and their conversions are single PTX
// instructions (sm_80 for bf16, sm_89 for fp8), with a software path for
// fp8 on older GPUs. Narrow floats are computed in float and rounded to
// nearest even on every store, fp8 saturating to the largest finite value,
// as NCCL does and as core/src/reduce.rs does on the host.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

struct half_t { u16 bits; };
struct bf16_t { u16 bits; };
struct e4m3_t { u8 bits; };
struct e5m2_t { u8 bits; };

__device__ __forceinline__ float oxccl_h2f(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ u16 oxccl_f2h(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

__device__ __forceinline__ float oxccl_bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ u16 oxccl_f2bf(float f) {
  u16 b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}

// 8-bit floats in software: EB exponent bits, MB mantissa bits; E4M3 has no
// infinities (all ones is NaN), E5M2 is IEEE-like. Only used below sm_89.
template <int EB, int MB, bool IEEE_TOP>
__device__ __forceinline__ float oxccl_fp8_decode_sw(u8 v) {
  const int bias = (1 << (EB - 1)) - 1;
  const u32 mag = v & 0x7f;
  const int e = (int)(mag >> MB);
  const int m = (int)(mag & ((1u << MB) - 1));
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  if (IEEE_TOP && e == (1 << EB) - 1) return m == 0 ? sign * __int_as_float(0x7f800000) : __int_as_float(0x7fc00000);
  if (!IEEE_TOP && mag == 0x7f) return __int_as_float(0x7fc00000);
  const float x = e == 0 ? ldexpf((float)m, 1 - bias - MB) : ldexpf((float)(m + (1 << MB)), e - bias - MB);
  return sign * x;
}

template <int EB, int MB, bool IEEE_TOP>
__device__ __forceinline__ u8 oxccl_fp8_encode_sw(float x) {
  const int bias = (1 << (EB - 1)) - 1;
  const u32 max_code = IEEE_TOP ? ((((1u << EB) - 2) << MB) | ((1u << MB) - 1)) : 0x7e;
  if (x != x) return 0xff;  // NaN, as the host encodes it
  const u8 sign = (__float_as_uint(x) >> 24) & 0x80;
  const float a = fabsf(x);
  if (a >= oxccl_fp8_decode_sw<EB, MB, IEEE_TOP>((u8)max_code)) return sign | (u8)max_code;
  if (a == 0.0f) return sign;
  int e;
  frexpf(a, &e);
  // Exponent of the 1.m form, clamped to the subnormal range; the quantum is
  // 2^(ex - MB) on both sides, so one formula covers normals, subnormals and
  // the carry into the next exponent.
  const int ex = max(e - 1, 1 - bias);
  const float r = rintf(ldexpf(a, MB - ex));
  u32 code = (u32)(((ex + bias - 1) << MB) + (int)r);
  return sign | (u8)min(code, max_code);
}

__device__ __forceinline__ float oxccl_e4m3_to_f(u8 v) {
#if __CUDA_ARCH__ >= 890
  u32 r;
  u16 in = v;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(in));
  return oxccl_h2f((u16)(r & 0xffff));
#else
  return oxccl_fp8_decode_sw<4, 3, false>(v);
#endif
}

__device__ __forceinline__ u8 oxccl_f_to_e4m3(float f) {
#if __CUDA_ARCH__ >= 890
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
  return (u8)(r & 0xff);
#else
  return oxccl_fp8_encode_sw<4, 3, false>(f);
#endif
}

__device__ __forceinline__ float oxccl_e5m2_to_f(u8 v) {
#if __CUDA_ARCH__ >= 890
  u32 r;
  u16 in = v;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(in));
  return oxccl_h2f((u16)(r & 0xffff));
#else
  return oxccl_fp8_decode_sw<5, 2, true>(v);
#endif
}

__device__ __forceinline__ u8 oxccl_f_to_e5m2(float f) {
#if __CUDA_ARCH__ >= 890
  u16 r;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
  return (u8)(r & 0xff);
#else
  return oxccl_fp8_encode_sw<5, 2, true>(f);
#endif
}

// Elem<T>: the type arithmetic is done in (Acc) and the conversions.
template <typename T> struct Elem {
  typedef T Acc;
  static __device__ __forceinline__ Acc load(T x) { return x; }
  static __device__ __forceinline__ T store(Acc a) { return a; }
};

template <> struct Elem<half_t> {
  typedef float Acc;
  static __device__ __forceinline__ Acc load(half_t x) { return oxccl_h2f(x.bits); }
  static __device__ __forceinline__ half_t store(Acc a) { half_t r; r.bits = oxccl_f2h(a); return r; }
};

template <> struct Elem<bf16_t> {
  typedef float Acc;
  static __device__ __forceinline__ Acc load(bf16_t x) { return oxccl_bf2f(x.bits); }
  static __device__ __forceinline__ bf16_t store(Acc a) { bf16_t r; r.bits = oxccl_f2bf(a); return r; }
};

template <> struct Elem<e4m3_t> {
  typedef float Acc;
  static __device__ __forceinline__ Acc load(e4m3_t x) { return oxccl_e4m3_to_f(x.bits); }
  static __device__ __forceinline__ e4m3_t store(Acc a) { e4m3_t r; r.bits = oxccl_f_to_e4m3(a); return r; }
};

template <> struct Elem<e5m2_t> {
  typedef float Acc;
  static __device__ __forceinline__ Acc load(e5m2_t x) { return oxccl_e5m2_to_f(x.bits); }
  static __device__ __forceinline__ e5m2_t store(Acc a) { e5m2_t r; r.bits = oxccl_f_to_e5m2(a); return r; }
};
