// Fused multi-head attention on CUDA (flash-attention style): the (T x S) scores and
// probabilities never go to global memory.
//
// Forward (one block per 64-query tile of one (b, h), 256 threads): the block keeps its query tile
// in shared memory (pre-multiplied by scale * log2(e), so exponentials are exp2) and walks the key
// tiles of 64 keys: S = Q K^T (each thread a 4 x 4 patch of the 64 x 64 tile), the masks (key
// padding flags per key tile, causal by index), then the online softmax per query row (running
// max m and sum l in f32, both in the log2 domain; rows are spread over 16 lanes of a warp and
// reduced with shuffles), P into shared memory and O += P V (each thread 4 rows x D/16 columns of
// O). At the end out = O / l and lse = (m + log2 l) ln 2, natural log; a row without a visible key
// has l = 0 and gets out = 0, lse = -inf. Causal: key tiles after the tile's last visible key are
// skipped; the tiles with the most keys are scheduled first.
//
// Backward (FlashAttention-2): a small kernel computes delta_t = rowsum(dout_t * out_t), then one
// block per 64-key tile of one (b, h) keeps K, V in shared memory and walks the query tiles that
// can see its keys: P = exp(scale q k^T - lse) (0 where masked or where lse = -inf),
// dP = dout V^T, dS = P (dP - delta), dV += P^T dout and dK += scale dS^T Q in registers (written
// once at the end), and dQ += scale dS K added with f32 atomics into an f32 buffer (dq itself for
// f32, a temporary converted at the end for bf16/f16). Atomics keep one pass over the (T x S)
// pairs; the alternative, a second pass per query tile recomputing P and dS, costs as much again.
//
// Arithmetic is f32 FMA everywhere (inputs converted on load), for f32, bf16 and f16 alike; the
// head dimension is padded in shared memory to 32, 64 or 128 (zeros), so D <= 128.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "engine/cuda_exec.h"
#include "ops/attention.h"
#include "ops/cuda_common.cuh"

namespace strata::ops::cuda {
namespace {

constexpr const char* kForward = "attention_forward";
constexpr const char* kBackward = "attention_backward";

constexpr int kBlockM = 64;             // queries per tile
constexpr int kBlockN = 64;             // keys per tile
constexpr int kThreads = 256;           // 16 x 16; each thread a 4 x 4 patch of a 64 x 64 tile
constexpr int kPStride = kBlockN + 16;  // row stride of (64 x 64) score tiles in shared memory
constexpr int kMaxHeadDim = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

enum MaskKind : int { kMaskNone = 0, kMaskU8 = 1, kMaskI32 = 2, kMaskI64 = 3 };

using ::strata::ops::cuda_detail::check_cuda;
using ::strata::ops::cuda_detail::check_float;
using ::strata::ops::cuda_detail::check_same_dtype;
using ::strata::ops::cuda_detail::check_shape;
using ::strata::ops::cuda_detail::dispatch_float;
using ::strata::ops::cuda_detail::from_f32;
using ::strata::ops::cuda_detail::to_f32;

__device__ __forceinline__ bool key_kept(const void* mask, int kind, int64_t i) {
  switch (kind) {
    case kMaskU8:
      return static_cast<const uint8_t*>(mask)[i] != 0;
    case kMaskI32:
      return static_cast<const int32_t*>(mask)[i] != 0;
    case kMaskI64:
      return static_cast<const int64_t*>(mask)[i] != 0;
    default:
      return true;
  }
}

// Max and sum over the 16 lanes that share a row (lanes 0-15 and 16-31 of a warp).
__device__ __forceinline__ float row_max16(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row_sum16(float x) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Copies rows [row0, row0 + 64) of a (rows, d) matrix into a (64, kD) f32 tile with row stride
// `stride`, times `mul`; rows past `rows` and columns past d are zero.
template <typename T, int kD>
__device__ __forceinline__ void load_tile(float* dst, int stride, const T* src, int row0, int rows,
                                          int d, float mul) {
  for (int i = threadIdx.x; i < 64 * kD; i += kThreads) {
    const int r = i / kD, c = i % kD;
    float x = 0.f;
    if (row0 + r < rows && c < d) x = to_f32(src[static_cast<int64_t>(row0 + r) * d + c]) * mul;
    dst[r * stride + c] = x;
  }
}

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const void* mask;
  int mask_kind;
  int64_t bh_count, heads;
  int t_len, s_len, d;
  int causal, causal_shift;
  float scale_log2;  // scale * log2(e)
  int num_tiles;
};

template <int kD>
constexpr size_t fwd_smem_bytes() {
  return sizeof(float) * (2 * kBlockM * (kD + 1) + kBlockN * kD + kBlockM * kPStride + kBlockN);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_fwd_kernel(FwdParams p) {
  constexpr int kStride = kD + 1;  // odd: column reads by 16 lanes hit 16 banks
  constexpr int kCols = kD / 16;   // O columns per thread
  extern __shared__ float smem[];
  float* qs = smem;                    // (64, kStride) queries * scale * log2(e)
  float* ks = qs + kBlockM * kStride;  // (64, kStride)
  float* vs = ks + kBlockN * kStride;  // (64, kD)
  float* ps = vs + kBlockN * kD;       // (64, kPStride) probabilities (unnormalized)
  int* keep = reinterpret_cast<int*>(ps + kBlockM * kPStride);  // (64,) key visible (padding)

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) % p.bh_count;
  const int tile =
      p.num_tiles - 1 - static_cast<int>(static_cast<int64_t>(blockIdx.x) / p.bh_count);
  const int q0 = tile * kBlockM;
  const int64_t b = bh / p.heads;
  const T* q = static_cast<const T*>(p.q) + bh * p.t_len * p.d;
  const T* k = static_cast<const T*>(p.k) + bh * p.s_len * p.d;
  const T* v = static_cast<const T*>(p.v) + bh * p.s_len * p.d;

  load_tile<T, kD>(qs, kStride, q, q0, p.t_len, p.d, p.scale_log2);

  const int last_row = min(q0 + kBlockM, p.t_len) - 1;
  const int n_end = p.causal ? min(p.s_len, last_row + p.causal_shift + 1) : p.s_len;

  float acc[4][kCols];
  float m_run[4], l_run[4];  // running max (log2 domain), this thread's part of the running sum
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m_run[i] = -INFINITY;
    l_run[i] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0.f;
  }

  for (int n0 = 0; n0 < n_end; n0 += kBlockN) {
    __syncthreads();  // the previous tile's ks, vs, ps are consumed
    for (int i = tid; i < kBlockN * kD; i += kThreads) {
      const int r = i / kD, c = i % kD;
      float kx = 0.f, vx = 0.f;
      if (n0 + r < p.s_len && c < p.d) {
        const int64_t idx = static_cast<int64_t>(n0 + r) * p.d + c;
        kx = to_f32(k[idx]);
        vx = to_f32(v[idx]);
      }
      ks[r * kStride + c] = kx;
      vs[r * kD + c] = vx;
    }
    if (tid < kBlockN) {
      const int s = n0 + tid;
      keep[tid] = s < p.s_len && key_kept(p.mask, p.mask_kind, b * p.s_len + s) ? 1 : 0;
    }
    __syncthreads();

    float sc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) sc[i][j] = 0.f;
#pragma unroll 8
    for (int c = 0; c < kD; ++c) {
      float qa[4], kb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[i] = qs[(ty + 16 * i) * kStride + c];
#pragma unroll
      for (int j = 0; j < 4; ++j) kb[j] = ks[(tx + 16 * j) * kStride + c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sc[i][j] = fmaf(qa[i], kb[j], sc[i][j]);
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = q0 + ty + 16 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = tx + 16 * j;
        const bool visible = keep[col] != 0 && (!p.causal || n0 + col <= row + p.causal_shift);
        if (!visible) sc[i][j] = -INFINITY;
        mx = fmaxf(mx, sc[i][j]);
      }
      mx = row_max16(mx);
      const float m_new = fmaxf(m_run[i], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no visible key yet: p = 0
      const float alpha = exp2f(m_run[i] - m_use);           // 0 while m_run is -inf
      m_run[i] = m_new;
      float rs = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float e = exp2f(sc[i][j] - m_use);
        sc[i][j] = e;
        rs += e;
      }
      l_run[i] = l_run[i] * alpha + rs;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[i][c] *= alpha;
#pragma unroll
      for (int j = 0; j < 4; ++j) ps[(ty + 16 * i) * kPStride + tx + 16 * j] = sc[i][j];
    }
    __syncthreads();

#pragma unroll 4
    for (int n = 0; n < kBlockN; ++n) {
      float pa[4], vb[kCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[i] = ps[(ty + 16 * i) * kPStride + n];
#pragma unroll
      for (int c = 0; c < kCols; ++c) vb[c] = vs[n * kD + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[i][c] = fmaf(pa[i], vb[c], acc[i][c]);
    }
  }

  T* out = static_cast<T*>(p.out) + bh * p.t_len * p.d;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float l = row_sum16(l_run[i]);  // every lane takes part
    const int row = q0 + ty + 16 * i;
    if (row >= p.t_len) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = tx + 16 * c;
      if (col < p.d) out[static_cast<int64_t>(row) * p.d + col] = from_f32<T>(acc[i][c] * inv);
    }
    if (tx == 0) p.lse[bh * p.t_len + row] = l > 0.f ? (m_run[i] + log2f(l)) * kLn2 : -INFINITY;
  }
}

// delta[r] = sum_c dout[r, c] out[r, c], one warp per row.
template <typename T>
__global__ void attention_bwd_delta_kernel(const T* __restrict__ dout, const T* __restrict__ out,
                                           float* __restrict__ delta, int64_t rows, int d) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t r = warp; r < rows; r += warps) {
    float s = 0.f;
    for (int c = lane; c < d; c += 32) s = fmaf(to_f32(dout[r * d + c]), to_f32(out[r * d + c]), s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) delta[r] = s;
  }
}

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* dout;
  const float* lse;
  const float* delta;
  float* dq_acc;  // f32 (B, H, T, D), zeroed; receives scale dS K
  void* dk;
  void* dv;
  const void* mask;
  int mask_kind;
  int64_t bh_count, heads;
  int t_len, s_len, d;
  int causal, causal_shift;
  float scale, scale_log2;
  int num_key_tiles;
};

template <int kD>
constexpr size_t bwd_smem_bytes() {
  return sizeof(float) * (2 * kBlockN * (kD + 1) + 2 * kBlockM * (kD + 1) + kBlockM * kPStride +
                          2 * kBlockM + kBlockN);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_bwd_kernel(BwdParams p) {
  constexpr int kStride = kD + 1;
  constexpr int kCols = kD / 16;
  extern __shared__ float smem[];
  float* ks = smem;                        // (64 keys, kStride)
  float* vs = ks + kBlockN * kStride;      // (64 keys, kStride)
  float* qs = vs + kBlockN * kStride;      // (64 queries, kStride)
  float* dos = qs + kBlockM * kStride;     // (64 queries, kStride)
  float* ps = dos + kBlockM * kStride;     // (64 queries, kPStride): P, then scale dS
  float* lse_s = ps + kBlockM * kPStride;  // (64,) lse * log2(e), -inf past T
  float* delta_s = lse_s + kBlockM;        // (64,)
  int* keep = reinterpret_cast<int*>(delta_s + kBlockM);  // (64,)

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) % p.bh_count;
  const int n0 = static_cast<int>(static_cast<int64_t>(blockIdx.x) / p.bh_count) * kBlockN;
  const int64_t b = bh / p.heads;
  const T* q = static_cast<const T*>(p.q) + bh * p.t_len * p.d;
  const T* dout = static_cast<const T*>(p.dout) + bh * p.t_len * p.d;
  const T* k = static_cast<const T*>(p.k) + bh * p.s_len * p.d;
  const T* v = static_cast<const T*>(p.v) + bh * p.s_len * p.d;
  const float* lse = p.lse + bh * p.t_len;
  const float* delta = p.delta + bh * p.t_len;
  float* dq = p.dq_acc + bh * p.t_len * p.d;

  load_tile<T, kD>(ks, kStride, k, n0, p.s_len, p.d, 1.f);
  load_tile<T, kD>(vs, kStride, v, n0, p.s_len, p.d, 1.f);
  if (tid < kBlockN) {
    const int s = n0 + tid;
    keep[tid] = s < p.s_len && key_kept(p.mask, p.mask_kind, b * p.s_len + s) ? 1 : 0;
  }

  // Causal: query t sees key s when s <= t + shift, so the first query to see key n0 is
  // n0 - shift; earlier query tiles contribute nothing.
  const int m_begin = p.causal ? max(0, n0 - p.causal_shift) / kBlockM * kBlockM : 0;

  float dk_acc[4][kCols], dv_acc[4][kCols];  // rows: keys ty + 16 i; columns tx + 16 c
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int c = 0; c < kCols; ++c) dk_acc[i][c] = dv_acc[i][c] = 0.f;

  for (int m0 = m_begin; m0 < p.t_len; m0 += kBlockM) {
    __syncthreads();  // the previous query tile's qs, dos, ps are consumed (and K, V are loaded)
    load_tile<T, kD>(qs, kStride, q, m0, p.t_len, p.d, 1.f);
    load_tile<T, kD>(dos, kStride, dout, m0, p.t_len, p.d, 1.f);
    if (tid < kBlockM) {
      const int t = m0 + tid;
      lse_s[tid] = t < p.t_len ? lse[t] * kLog2e : -INFINITY;
      delta_s[tid] = t < p.t_len ? delta[t] : 0.f;
    }
    __syncthreads();

    // S = Q K^T and dP = dout V^T; rows: queries ty + 16 i, columns: keys tx + 16 j.
    float sc[4][4], dp[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) sc[i][j] = dp[i][j] = 0.f;
#pragma unroll 4
    for (int c = 0; c < kD; ++c) {
      float qa[4], da[4], kb[4], vb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qa[i] = qs[(ty + 16 * i) * kStride + c];
        da[i] = dos[(ty + 16 * i) * kStride + c];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        kb[j] = ks[(tx + 16 * j) * kStride + c];
        vb[j] = vs[(tx + 16 * j) * kStride + c];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sc[i][j] = fmaf(qa[i], kb[j], sc[i][j]);
          dp[i][j] = fmaf(da[i], vb[j], dp[i][j]);
        }
    }
    // P (kept in sc) and scale dS (kept in dp).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = ty + 16 * i, row = m0 + r;
      const float l2 = lse_s[r], dl = delta_s[r];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = tx + 16 * j;
        const bool visible =
            l2 != -INFINITY && keep[col] != 0 && (!p.causal || n0 + col <= row + p.causal_shift);
        const float pr = visible ? exp2f(fmaf(sc[i][j], p.scale_log2, -l2)) : 0.f;
        sc[i][j] = pr;
        dp[i][j] = pr * (dp[i][j] - dl) * p.scale;
        ps[r * kPStride + col] = pr;
      }
    }
    __syncthreads();
    // dV += P^T dout.
#pragma unroll 4
    for (int m = 0; m < kBlockM; ++m) {
      float pa[4], db[kCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[i] = ps[m * kPStride + ty + 16 * i];
#pragma unroll
      for (int c = 0; c < kCols; ++c) db[c] = dos[m * kStride + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < kCols; ++c) dv_acc[i][c] = fmaf(pa[i], db[c], dv_acc[i][c]);
    }
    __syncthreads();  // P is consumed; ps takes scale dS
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) ps[(ty + 16 * i) * kPStride + tx + 16 * j] = dp[i][j];
    __syncthreads();
    // dK += (scale dS)^T Q.
#pragma unroll 4
    for (int m = 0; m < kBlockM; ++m) {
      float sa[4], qb[kCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) sa[i] = ps[m * kPStride + ty + 16 * i];
#pragma unroll
      for (int c = 0; c < kCols; ++c) qb[c] = qs[m * kStride + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < kCols; ++c) dk_acc[i][c] = fmaf(sa[i], qb[c], dk_acc[i][c]);
    }
    // dQ += (scale dS) K for queries ty + 16 i, columns tx + 16 c, added atomically (other key
    // tiles add to the same rows).
    float dq_acc[4][kCols];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int c = 0; c < kCols; ++c) dq_acc[i][c] = 0.f;
#pragma unroll 4
    for (int n = 0; n < kBlockN; ++n) {
      float sa[4], kb[kCols];
#pragma unroll
      for (int i = 0; i < 4; ++i) sa[i] = ps[(ty + 16 * i) * kPStride + n];
#pragma unroll
      for (int c = 0; c < kCols; ++c) kb[c] = ks[n * kStride + tx + 16 * c];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int c = 0; c < kCols; ++c) dq_acc[i][c] = fmaf(sa[i], kb[c], dq_acc[i][c]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = m0 + ty + 16 * i;
      if (row >= p.t_len) continue;
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int col = tx + 16 * c;
        if (col < p.d) atomicAdd(dq + static_cast<int64_t>(row) * p.d + col, dq_acc[i][c]);
      }
    }
  }

  T* dk = static_cast<T*>(p.dk) + bh * p.s_len * p.d;
  T* dv = static_cast<T*>(p.dv) + bh * p.s_len * p.d;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = n0 + ty + 16 * i;
    if (s >= p.s_len) continue;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = tx + 16 * c;
      if (col < p.d) {
        dk[static_cast<int64_t>(s) * p.d + col] = from_f32<T>(dk_acc[i][c]);
        dv[static_cast<int64_t>(s) * p.d + col] = from_f32<T>(dv_acc[i][c]);
      }
    }
  }
}

template <typename T>
__global__ void convert_f32_kernel(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = from_f32<T>(src[i]);
  }
}

// ---- host side ----------------------------------------------------------------------------------

struct Dims {
  int64_t b = 0, h = 0, t = 0, s = 0, d = 0;
  double scale = 0.0;
};

Dims check_qkv(const ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionOptions& options, const char* op) {
  check_float(q, ctx, op, "q");
  check_float(k, ctx, op, "k");
  check_float(v, ctx, op, "v");
  check_same_dtype(k, q, op, "k", "q");
  check_same_dtype(v, q, op, "v", "q");
  STRATA_CHECK(q.dim() == 4) << op << ": q must be (B, H, T, D), got " << q.shape_str();
  STRATA_CHECK(k.dim() == 4) << op << ": k must be (B, H, S, D), got " << k.shape_str();
  Dims dims;
  dims.b = q.size(0);
  dims.h = q.size(1);
  dims.t = q.size(2);
  dims.d = q.size(3);
  dims.s = k.size(2);
  STRATA_CHECK(dims.t > 0 && dims.s > 0 && dims.d > 0)
      << op << ": T, S and D must be positive, got q " << q.shape_str() << " and k "
      << k.shape_str();
  check_shape(k, {dims.b, dims.h, dims.s, dims.d}, op, "k");
  check_shape(v, k.shape(), op, "v");
  STRATA_CHECK(dims.d <= kMaxHeadDim)
      << op << ": head dimension D = " << dims.d << " (q " << q.shape_str()
      << ") is larger than the CUDA kernel's maximum of " << kMaxHeadDim;
  constexpr int64_t kMaxLen = int64_t{1} << 30;
  STRATA_CHECK(dims.t < kMaxLen && dims.s < kMaxLen)
      << op << ": T and S must be below 2^30 on CUDA, got q " << q.shape_str() << " and k "
      << k.shape_str();
  STRATA_CHECK(std::isfinite(options.scale))
      << op << ": scale must be finite (0 for 1 / sqrt(D)), got " << options.scale;
  dims.scale = options.scale != 0.0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(dims.d));
  return dims;
}

int mask_kind(const ExecContext& ctx, const Tensor& mask, const Dims& dims, const char* op) {
  if (!mask.defined()) return kMaskNone;
  check_cuda(mask, ctx, op, "key_padding_mask");
  STRATA_CHECK(mask.dtype() == DType::kU8 || mask.dtype() == DType::kI32 ||
               mask.dtype() == DType::kI64)
      << op << ": key_padding_mask must be u8, i32 or i64, got " << dtype_name(mask.dtype());
  check_shape(mask, {dims.b, dims.s}, op, "key_padding_mask");
  switch (mask.dtype()) {
    case DType::kU8:
      return kMaskU8;
    case DType::kI32:
      return kMaskI32;
    default:
      return kMaskI64;
  }
}

// Calls f(std::integral_constant<int, kD>) with the padded head dimension for d <= 128.
template <typename F>
void dispatch_head_dim(int64_t d, F&& f) {
  if (d <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (d <= 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    f(std::integral_constant<int, 128>{});
  }
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)));
}

unsigned blocks_for_tiles(int64_t bh, int64_t tiles, const char* op) {
  const int64_t n = bh * tiles;
  STRATA_CHECK(n < (int64_t{1} << 31))
      << op << ": B H x tiles = " << n << " blocks exceed the CUDA grid limit";
  return static_cast<unsigned>(n);
}

}  // namespace

AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& key_padding_mask,
                                  const AttentionOptions& options) {
  ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kForward);
  const Dims dims = check_qkv(ctx, q, k, v, options, kForward);
  const int kind = mask_kind(ctx, key_padding_mask, dims, kForward);
  AttentionResult r;
  r.out = Tensor::empty(q.shape(), q.dtype(), &ctx.allocator());
  r.lse = Tensor::empty({dims.b, dims.h, dims.t}, DType::kF32, &ctx.allocator());
  const int64_t bh = dims.b * dims.h;
  if (bh == 0) return r;
  FwdParams p{};
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.out = r.out.raw_data();
  p.lse = r.lse.data<float>();
  p.mask = kind != kMaskNone ? key_padding_mask.raw_data() : nullptr;
  p.mask_kind = kind;
  p.bh_count = bh;
  p.heads = dims.h;
  p.t_len = static_cast<int>(dims.t);
  p.s_len = static_cast<int>(dims.s);
  p.d = static_cast<int>(dims.d);
  p.causal = options.causal ? 1 : 0;
  p.causal_shift = static_cast<int>(std::max<int64_t>(dims.s - dims.t, 0));
  p.scale_log2 = static_cast<float>(dims.scale * 1.4426950408889634);
  p.num_tiles = static_cast<int>((dims.t + kBlockM - 1) / kBlockM);
  const unsigned blocks = blocks_for_tiles(bh, p.num_tiles, kForward);
  dispatch_float(q.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(dims.d, [&](auto hd) {
      constexpr int kD = decltype(hd)::value;
      constexpr size_t smem = fwd_smem_bytes<kD>();
      allow_smem(attention_fwd_kernel<T, kD>, smem);
      attention_fwd_kernel<T, kD><<<blocks, kThreads, smem, x.stream()>>>(p);
      STRATA_CUDA_LAUNCH_CHECK("attention_fwd_kernel");
    });
  });
  return r;
}

AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const AttentionResult& saved,
                                  const Tensor& key_padding_mask, const AttentionOptions& options) {
  ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kBackward);
  const Dims dims = check_qkv(ctx, q, k, v, options, kBackward);
  check_float(dout, ctx, kBackward, "dout");
  check_same_dtype(dout, q, kBackward, "dout", "q");
  check_shape(dout, q.shape(), kBackward, "dout");
  STRATA_CHECK(saved.out.defined() && saved.lse.defined())
      << kBackward << ": the CUDA kernel needs forward's out and lse in saved";
  check_float(saved.out, ctx, kBackward, "out");
  check_same_dtype(saved.out, q, kBackward, "out", "q");
  check_shape(saved.out, q.shape(), kBackward, "out");
  check_cuda(saved.lse, ctx, kBackward, "lse");
  STRATA_CHECK(saved.lse.dtype() == DType::kF32)
      << kBackward << ": lse must be f32, got " << dtype_name(saved.lse.dtype());
  check_shape(saved.lse, {dims.b, dims.h, dims.t}, kBackward, "lse");
  const int kind = mask_kind(ctx, key_padding_mask, dims, kBackward);

  AttentionGrads g;
  g.dq = Tensor::empty(q.shape(), q.dtype(), &ctx.allocator());
  g.dk = Tensor::empty(k.shape(), k.dtype(), &ctx.allocator());
  g.dv = Tensor::empty(v.shape(), v.dtype(), &ctx.allocator());
  const int64_t bh = dims.b * dims.h;
  if (bh == 0) return g;
  const int64_t rows = bh * dims.t;
  Tensor delta = Tensor::empty({dims.b, dims.h, dims.t}, DType::kF32, &ctx.allocator());
  const bool dq_direct = q.dtype() == DType::kF32;
  Tensor dq_acc = dq_direct ? g.dq : Tensor::empty(q.shape(), DType::kF32, &ctx.allocator());
  STRATA_CUDA_CHECK(cudaMemsetAsync(dq_acc.raw_data(), 0, dq_acc.nbytes(), x.stream()));

  BwdParams p{};
  p.q = q.raw_data();
  p.k = k.raw_data();
  p.v = v.raw_data();
  p.dout = dout.raw_data();
  p.lse = saved.lse.data<float>();
  p.delta = delta.data<float>();
  p.dq_acc = dq_acc.data<float>();
  p.dk = g.dk.raw_data();
  p.dv = g.dv.raw_data();
  p.mask = kind != kMaskNone ? key_padding_mask.raw_data() : nullptr;
  p.mask_kind = kind;
  p.bh_count = bh;
  p.heads = dims.h;
  p.t_len = static_cast<int>(dims.t);
  p.s_len = static_cast<int>(dims.s);
  p.d = static_cast<int>(dims.d);
  p.causal = options.causal ? 1 : 0;
  p.causal_shift = static_cast<int>(std::max<int64_t>(dims.s - dims.t, 0));
  p.scale = static_cast<float>(dims.scale);
  p.scale_log2 = static_cast<float>(dims.scale * 1.4426950408889634);
  p.num_key_tiles = static_cast<int>((dims.s + kBlockN - 1) / kBlockN);
  const unsigned blocks = blocks_for_tiles(bh, p.num_key_tiles, kBackward);

  dispatch_float(q.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kDeltaThreads = 256;
    const unsigned delta_blocks = ::strata::cuda::blocks_for(rows * 32, kDeltaThreads, x);
    attention_bwd_delta_kernel<T><<<delta_blocks, kDeltaThreads, 0, x.stream()>>>(
        static_cast<const T*>(dout.raw_data()), static_cast<const T*>(saved.out.raw_data()),
        delta.data<float>(), rows, p.d);
    STRATA_CUDA_LAUNCH_CHECK("attention_bwd_delta_kernel");
    dispatch_head_dim(dims.d, [&](auto hd) {
      constexpr int kD = decltype(hd)::value;
      constexpr size_t smem = bwd_smem_bytes<kD>();
      allow_smem(attention_bwd_kernel<T, kD>, smem);
      attention_bwd_kernel<T, kD><<<blocks, kThreads, smem, x.stream()>>>(p);
      STRATA_CUDA_LAUNCH_CHECK("attention_bwd_kernel");
    });
    if (!dq_direct) {
      const int64_t n = g.dq.numel();
      convert_f32_kernel<T><<<::strata::cuda::blocks_for(n, 256, x), 256, 0, x.stream()>>>(
          dq_acc.data<float>(), static_cast<T*>(g.dq.raw_data()), n);
      STRATA_CUDA_LAUNCH_CHECK("convert_f32_kernel");
    }
  });
  return g;
}

}  // namespace strata::ops::cuda
