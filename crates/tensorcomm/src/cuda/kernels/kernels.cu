// tensorcomm's CUDA kernels, compiled at run time by NVRTC once per GPU
// architecture and cached on disk (see cuda/runtime/nvrtc.rs). Structures
// passed by value mirror the #[repr(C)] structs of multi_copy.rs,
// strided_copy.rs and reduce_add.rs.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

// ---- multi-tensor byte copy ------------------------------------------------
// Copies many (src, dst, bytes) ranges in one launch. Each range is cut into
// chunks of `chunk_bytes`; block b copies chunks b, b + grid, ...; the range a
// chunk belongs to is found by binary search over `chunk_start`. Sources and
// destinations may live on other GPUs (peer access over NVLink).

#define MAX_COPY 96
struct CopyDesc { u64 src; u64 dst; u64 bytes; };
struct CopyBatch { u64 count; u64 chunk_start[MAX_COPY + 1]; CopyDesc d[MAX_COPY]; };

__device__ __forceinline__ void copy_range(const unsigned char* s, unsigned char* d, u64 n) {
  const u64 t = threadIdx.x, nt = blockDim.x;
  if ((((u64)s | (u64)d) & 15) == 0) {
    const uint4* s4 = (const uint4*)s;
    uint4* d4 = (uint4*)d;
    const u64 nv = n >> 4;
    u64 i = t;
    for (; i + 3 * nt < nv; i += 4 * nt) {
      uint4 a = s4[i], b = s4[i + nt], c = s4[i + 2 * nt], e = s4[i + 3 * nt];
      d4[i] = a; d4[i + nt] = b; d4[i + 2 * nt] = c; d4[i + 3 * nt] = e;
    }
    for (; i < nv; i += nt) d4[i] = s4[i];
    for (u64 j = (nv << 4) + t; j < n; j += nt) d[j] = s[j];
  } else if ((((u64)s | (u64)d) & 3) == 0) {
    const u32* s1 = (const u32*)s;
    u32* d1 = (u32*)d;
    const u64 nw = n >> 2;
    for (u64 i = t; i < nw; i += nt) d1[i] = s1[i];
    for (u64 j = (nw << 2) + t; j < n; j += nt) d[j] = s[j];
  } else {
    for (u64 j = t; j < n; j += nt) d[j] = s[j];
  }
}

extern "C" __global__ void multi_copy(const CopyBatch batch, u64 chunk_bytes) {
  const u64 total = batch.chunk_start[batch.count];
  for (u64 c = blockIdx.x; c < total; c += gridDim.x) {
    u64 lo = 0, hi = batch.count;
    while (hi - lo > 1) {
      const u64 mid = (lo + hi) / 2;
      if (batch.chunk_start[mid] <= c) lo = mid; else hi = mid;
    }
    const u64 off = (c - batch.chunk_start[lo]) * chunk_bytes;
    u64 n = batch.d[lo].bytes - off;
    if (n > chunk_bytes) n = chunk_bytes;
    copy_range((const unsigned char*)batch.d[lo].src + off, (unsigned char*)batch.d[lo].dst + off, n);
  }
}

// ---- strided element copy -------------------------------------------------
// Copies elements between two layouts of the same shape (strides in elements).

#define MAX_DIMS 8
struct StridedArgs {
  u64 src; u64 dst; u64 numel; i64 ndim; i64 elem_size;
  i64 sizes[MAX_DIMS]; i64 src_strides[MAX_DIMS]; i64 dst_strides[MAX_DIMS];
};

template <typename T>
__device__ void strided_impl(const StridedArgs& a) {
  const T* s = (const T*)a.src;
  T* d = (T*)a.dst;
  const u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < a.numel; i += stride) {
    u64 rem = i;
    i64 so = 0, doff = 0;
    for (int k = (int)a.ndim - 1; k >= 0; --k) {
      const u64 sz = (u64)a.sizes[k];
      const i64 idx = (i64)(rem % sz);
      rem /= sz;
      so += idx * a.src_strides[k];
      doff += idx * a.dst_strides[k];
    }
    d[doff] = s[so];
  }
}

extern "C" __global__ void strided_copy(const StridedArgs a) {
  switch (a.elem_size) {
    case 1: strided_impl<unsigned char>(a); break;
    case 2: strided_impl<unsigned short>(a); break;
    case 4: strided_impl<u32>(a); break;
    default: strided_impl<u64>(a); break;
  }
}

// ---- element-wise sum of up to 8 inputs -----------------------------------
// Inputs may be on other GPUs (read over NVLink). `vector` != 0 means every
// pointer is 16-byte aligned, so 16-byte loads are used.

#define MAX_SRC 8
struct ReduceArgs { u64 dst; u64 src[MAX_SRC]; u64 nsrc; u64 numel; u64 vector; };

__device__ __forceinline__ float h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float b2f(unsigned short b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ unsigned short f2b(float f) {
  const u32 x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#define PLAIN_OP(NAME, S_, A_)                                              \
  struct NAME {                                                             \
    typedef S_ S; typedef A_ A;                                             \
    static __device__ __forceinline__ A in(S x) { return (A)x; }            \
    static __device__ __forceinline__ S out(A x) { return (S)x; }           \
    static __device__ __forceinline__ A add(A x, A y) { return x + y; }     \
  };
PLAIN_OP(OpF32, float, float)
PLAIN_OP(OpF64, double, double)
PLAIN_OP(OpI8, signed char, u32)
PLAIN_OP(OpU8, unsigned char, u32)
PLAIN_OP(OpI32, int, u32)
PLAIN_OP(OpI64, i64, u64)
struct OpF16 {
  typedef unsigned short S; typedef float A;
  static __device__ __forceinline__ A in(S x) { return h2f(x); }
  static __device__ __forceinline__ S out(A x) { return f2h(x); }
  static __device__ __forceinline__ A add(A x, A y) { return x + y; }
};
struct OpBF16 {
  typedef unsigned short S; typedef float A;
  static __device__ __forceinline__ A in(S x) { return b2f(x); }
  static __device__ __forceinline__ S out(A x) { return f2b(x); }
  static __device__ __forceinline__ A add(A x, A y) { return x + y; }
};
struct OpBool {
  typedef unsigned char S; typedef u32 A;
  static __device__ __forceinline__ A in(S x) { return x != 0; }
  static __device__ __forceinline__ S out(A x) { return (S)(x != 0); }
  static __device__ __forceinline__ A add(A x, A y) { return x | y; }
};

template <typename Op>
__device__ void reduce_impl(const ReduceArgs& a) {
  typedef typename Op::S S;
  typedef typename Op::A A;
  const int PER = 16 / sizeof(S);
  const u64 gtid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
  const u64 gstride = (u64)gridDim.x * blockDim.x;
  const int nsrc = (int)a.nsrc;
  const u64 nvec = a.vector ? a.numel / PER : 0;
  for (u64 v = gtid; v < nvec; v += gstride) {
    uint4 raw[MAX_SRC];
#pragma unroll
    for (int k = 0; k < MAX_SRC; ++k) {
      if (k < nsrc) raw[k] = ((const uint4*)a.src[k])[v];
    }
    A acc[PER];
    const S* e0 = (const S*)&raw[0];
#pragma unroll
    for (int j = 0; j < PER; ++j) acc[j] = Op::in(e0[j]);
#pragma unroll
    for (int k = 1; k < MAX_SRC; ++k) {
      if (k < nsrc) {
        const S* ek = (const S*)&raw[k];
#pragma unroll
        for (int j = 0; j < PER; ++j) acc[j] = Op::add(acc[j], Op::in(ek[j]));
      }
    }
    uint4 o;
    S* oe = (S*)&o;
#pragma unroll
    for (int j = 0; j < PER; ++j) oe[j] = Op::out(acc[j]);
    ((uint4*)a.dst)[v] = o;
  }
  for (u64 i = nvec * PER + gtid; i < a.numel; i += gstride) {
    A acc = Op::in(((const S*)a.src[0])[i]);
    for (int k = 1; k < nsrc; ++k) acc = Op::add(acc, Op::in(((const S*)a.src[k])[i]));
    ((S*)a.dst)[i] = Op::out(acc);
  }
}

extern "C" __global__ void reduce_add_f32(const ReduceArgs a) { reduce_impl<OpF32>(a); }
extern "C" __global__ void reduce_add_f64(const ReduceArgs a) { reduce_impl<OpF64>(a); }
extern "C" __global__ void reduce_add_f16(const ReduceArgs a) { reduce_impl<OpF16>(a); }
extern "C" __global__ void reduce_add_bf16(const ReduceArgs a) { reduce_impl<OpBF16>(a); }
extern "C" __global__ void reduce_add_i8(const ReduceArgs a) { reduce_impl<OpI8>(a); }
extern "C" __global__ void reduce_add_u8(const ReduceArgs a) { reduce_impl<OpU8>(a); }
extern "C" __global__ void reduce_add_i32(const ReduceArgs a) { reduce_impl<OpI32>(a); }
extern "C" __global__ void reduce_add_i64(const ReduceArgs a) { reduce_impl<OpI64>(a); }
extern "C" __global__ void reduce_add_bool(const ReduceArgs a) { reduce_impl<OpBool>(a); }
