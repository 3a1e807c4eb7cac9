// Reduction operations: the arithmetic per accumulator type and one struct
// per op, passed to the kernels as a template parameter.
//
// Semantics match core/src/reduce.rs: integers wrap, float max/min let a NaN
// through, the pre-multiplied sum scales each rank's own input where it
// enters (the float average is that with 1/n), and the integer average sums
// and divides the final result, truncating toward zero.

// The scalars of an op, converted once on the host to each type they are
// used in, so that device and host round the same way.
struct Scalars {
  double f64;  // premulsum scalar (double)
  u64 i;       // premulsum scalar cast to the integer type, two's complement
  u64 div;     // divisor of the integer average
  float f32;   // premulsum scalar (float), used by every narrower float
  u32 pad;
};

template <typename A> struct Arith;

// Signed overflow is undefined in C++, so signed types compute in the
// unsigned type of the same width and convert back (two's complement).
#define OXCCL_INT_ARITH(A, U)                                                             \
  template <> struct Arith<A> {                                                           \
    static __device__ __forceinline__ A add(A a, A b) { return (A)((U)a + (U)b); }        \
    static __device__ __forceinline__ A mul(A a, A b) { return (A)((U)a * (U)b); }        \
    static __device__ __forceinline__ A max(A a, A b) { return a > b ? a : b; }           \
    static __device__ __forceinline__ A min(A a, A b) { return a < b ? a : b; }           \
    static __device__ __forceinline__ A scale(A a, const Scalars& s) { return mul(a, (A)s.i); } \
    static __device__ __forceinline__ A div(A a, const Scalars& s) { return (A)(a / (A)s.div); } \
  };

OXCCL_INT_ARITH(signed char, u32)
OXCCL_INT_ARITH(unsigned char, u32)
OXCCL_INT_ARITH(int, u32)
OXCCL_INT_ARITH(unsigned int, u32)
OXCCL_INT_ARITH(long long, u64)
OXCCL_INT_ARITH(unsigned long long, u64)

// `a != a` is the NaN test: a NaN operand wins, as on the host.
#define OXCCL_FLOAT_ARITH(A, SCALE)                                                            \
  template <> struct Arith<A> {                                                                \
    static __device__ __forceinline__ A add(A a, A b) { return a + b; }                        \
    static __device__ __forceinline__ A mul(A a, A b) { return a * b; }                        \
    static __device__ __forceinline__ A max(A a, A b) { return (a != a || a > b) ? a : b; }    \
    static __device__ __forceinline__ A min(A a, A b) { return (a != a || a < b) ? a : b; }    \
    static __device__ __forceinline__ A scale(A a, const Scalars& s) { return a * s.SCALE; }   \
    static __device__ __forceinline__ A div(A a, const Scalars& s) { return a / (A)s.div; }    \
  };

OXCCL_FLOAT_ARITH(float, f32)
OXCCL_FLOAT_ARITH(double, f64)

// PRE: the op scales a rank's own input on entry; POST: it divides the
// final result. Both are compile-time so plain ops carry no test for them.
#define OXCCL_OP(NAME, FN, PRE_, POST_)                                              \
  struct NAME {                                                                      \
    enum { PRE = PRE_, POST = POST_ };                                               \
    template <typename A> static __device__ __forceinline__ A apply(A a, A b) {      \
      return Arith<A>::FN(a, b);                                                     \
    }                                                                                \
  };

OXCCL_OP(OpSum, add, 0, 0)
OXCCL_OP(OpProd, mul, 0, 0)
OXCCL_OP(OpMax, max, 0, 0)
OXCCL_OP(OpMin, min, 0, 0)
OXCCL_OP(OpPreMulSum, add, 1, 0)
OXCCL_OP(OpSumPostDiv, add, 0, 1)
