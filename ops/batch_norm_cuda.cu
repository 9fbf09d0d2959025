// Batch normalization on CUDA: own kernels (cuDNN's training call returns a running variance and
// saved statistics under its own conventions; these follow ops/batch_norm.h exactly). x is viewed
// as (B, C, S), S the product of the spatial dimensions; f32, bf16 and f16 storage (x, y, gamma,
// beta and the gradients), computing in f32 with per-channel statistics merged in double. The
// statistics (save_mean, save_invstd, running_mean, running_var) are f32 whatever x's dtype.
//
// Every op is a per-channel reduction, a per-channel finalize, and an element-wise pass:
//   reduce    partial statistics per (channel, part) into a double buffer [C][parts]:
//             - "flat" layout (S >= kColumnModeMaxS): a 2-D grid of (channel, split) blocks; a
//               split takes an even share of the channel's B S values (rows of S contiguous
//               values, read with 16-byte vectors when S allows);
//             - "column" layout (small S, e.g. (B, C) inputs or 7 x 7 planes): x as a (B, C S)
//               matrix, one thread per column (coalesced across columns) over a share of the
//               rows, so that a channel's values, C S apart, are not read one sector each.
//             Training forward: Welford (count, mean, M2) per thread in f32 over chunks of the
//             vector width, merged with Chan's formula in double (one pass over x, no
//             cancellation). Backward: sum dy and sum dy (x - mean) per thread in f32, in double
//             across threads and blocks.
//   finalize  a warp per channel merges its parts; training writes save_mean, save_invstd
//             (1 / sqrt(biased var + eps)) and updates the running statistics with the unbiased
//             variance; every op folds its per-channel constants (in double) for the last pass;
//             backward accumulates dgamma and dbeta (+=).
//   apply     y = x scale + shift, or dx = a dy + b (x - mean) + k, vectorized.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "engine/cuda_exec.h"
#include "ops/batch_norm.h"
#include "ops/cuda_common.cuh"

namespace strata::ops::cuda {
namespace {

namespace sc = ::strata::cuda;

constexpr int kThreads = 256;
// Below this many values per (b, c) row, the reductions use the column layout.
constexpr int64_t kColumnModeMaxS = 64;
// Column layout: blocks of kColumns x kColumnRows threads.
constexpr int kColumns = 32;
constexpr int kColumnRows = 8;

using ::strata::ops::cuda_detail::aligned_to;
using ::strata::ops::cuda_detail::check_float;
using ::strata::ops::cuda_detail::check_same_dtype;
using ::strata::ops::cuda_detail::check_shape;
using ::strata::ops::cuda_detail::dispatch_float;
using ::strata::ops::cuda_detail::from_f32;
using ::strata::ops::cuda_detail::to_f32;

// ---- vector access --------------------------------------------------------------------------

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// V consecutive elements from p (aligned to V elements when V > 1) as floats.
template <typename T, int V>
__device__ __forceinline__ void load(const T* p, float (&out)[V]) {
  const Pack<T, V> pack = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = to_f32(pack.v[i]);
}

template <typename T, int V>
__device__ __forceinline__ void store(T* p, const float (&in)[V]) {
  Pack<T, V> pack;
#pragma unroll
  for (int i = 0; i < V; ++i) pack.v[i] = from_f32<T>(in[i]);
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

// ---- statistics -----------------------------------------------------------------------------

// A partial statistic in double: (count, mean, M2) for Welford, (sum dy, sum dy xc, unused) for
// the backward sums.
struct Stat3 {
  double a, b, c;
};

// Training statistics: Welford per thread, Chan's merge in double.
template <typename T>
struct WelfordPolicy {
  const T* x;
  struct Acc {
    float n, mean, m2;
  };
  __device__ Acc init(int64_t /*channel*/) const { return Acc{0.0f, 0.0f, 0.0f}; }
  template <int V>
  __device__ __forceinline__ void add(Acc& acc, int64_t offset) const {
    float v[V];
    load<T, V>(x + offset, v);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) s += v[i];
    const float chunk_mean = s * (1.0f / V);
    float chunk_m2 = 0.0f;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float d = v[i] - chunk_mean;
      chunk_m2 += d * d;
    }
    const float n = acc.n + static_cast<float>(V);
    const float d = chunk_mean - acc.mean;
    const float f = static_cast<float>(V) / n;
    acc.mean += d * f;
    acc.m2 += chunk_m2 + d * d * acc.n * f;
    acc.n = n;
  }
  __device__ static Stat3 finish(const Acc& acc) { return Stat3{acc.n, acc.mean, acc.m2}; }
  __device__ static Stat3 merge(const Stat3& x, const Stat3& y) {
    const double n = x.a + y.a;
    if (n == 0.0) return x;
    const double d = y.b - x.b;
    const double fy = y.a / n;
    return Stat3{n, x.b + d * fy, x.c + y.c + d * d * x.a * fy};
  }
};

// Backward sums: sum dy and sum dy (x - mean).
template <typename T>
struct GradPolicy {
  const T* x;
  const T* dy;
  const float* mean;  // (C,)
  struct Acc {
    float center, dy, dy_xc;
  };
  __device__ Acc init(int64_t channel) const { return Acc{mean[channel], 0.0f, 0.0f}; }
  template <int V>
  __device__ __forceinline__ void add(Acc& acc, int64_t offset) const {
    float v[V], d[V];
    load<T, V>(x + offset, v);
    load<T, V>(dy + offset, d);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      acc.dy += d[i];
      acc.dy_xc += d[i] * (v[i] - acc.center);
    }
  }
  __device__ static Stat3 finish(const Acc& acc) { return Stat3{acc.dy, acc.dy_xc, 0.0}; }
  __device__ static Stat3 merge(const Stat3& x, const Stat3& y) {
    return Stat3{x.a + y.a, x.b + y.b, 0.0};
  }
};

// Lane 0 gets the merge of the warp's 32 statistics.
template <typename P>
__device__ __forceinline__ Stat3 warp_merge(Stat3 s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const Stat3 other{__shfl_down_sync(0xffffffffu, s.a, offset),
                      __shfl_down_sync(0xffffffffu, s.b, offset),
                      __shfl_down_sync(0xffffffffu, s.c, offset)};
    s = P::merge(s, other);
  }
  return s;
}

// Thread 0 gets the merge of the block's statistics (blockDim.x a multiple of 32, at most 1024).
template <typename P>
__device__ Stat3 block_merge(Stat3 s) {
  __shared__ Stat3 warps[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  s = warp_merge<P>(s);
  if (lane == 0) warps[warp] = s;
  __syncthreads();
  if (warp == 0) {
    const int nwarps = blockDim.x >> 5;
    s = lane < nwarps ? warps[lane] : Stat3{0.0, 0.0, 0.0};
    s = warp_merge<P>(s);
  }
  return s;
}

// Flat layout: block (c, split) reduces values [t0, t1) of channel c's B Sv vectors of V values
// (Sv = S / V); vector t is row b = t / Sv, position (t % Sv) V of plane (b, c).
// partial[c splits + split].
template <typename P, int V, typename I>
__global__ void reduce_flat_kernel(P p, I vectors, I sv, int64_t channels, int64_t spatial,
                                   Stat3* __restrict__ partial) {
  const int64_t c = blockIdx.x;
  const int64_t splits = gridDim.y, split = blockIdx.y;
  const I t0 = static_cast<I>(static_cast<int64_t>(vectors) * split / splits);
  const I t1 = static_cast<I>(static_cast<int64_t>(vectors) * (split + 1) / splits);
  typename P::Acc acc = p.init(c);
  for (I t = t0 + static_cast<I>(threadIdx.x); t < t1; t += static_cast<I>(blockDim.x)) {
    const I b = t / sv;
    const I s = t - b * sv;
    const int64_t offset =
        (static_cast<int64_t>(b) * channels + c) * spatial + static_cast<int64_t>(s) * V;
    p.template add<V>(acc, offset);
  }
  const Stat3 st = block_merge<P>(P::finish(acc));
  if (threadIdx.x == 0) partial[c * splits + split] = st;
}

// Column layout: x as (B, C S); thread (tx, ty) of block (bx, by) reduces column
// j = bx kColumns + tx (channel j / S) over rows by kColumnRows + ty + k gridDim.y kColumnRows.
// partial[j gridDim.y + by], i.e. [C][S gridDim.y].
template <typename P>
__global__ void reduce_columns_kernel(P p, int64_t rows, int64_t columns, int64_t spatial,
                                      Stat3* __restrict__ partial) {
  __shared__ Stat3 cell[kColumnRows][kColumns];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumns + threadIdx.x;
  const bool active = j < columns;
  typename P::Acc acc = p.init(active ? j / spatial : 0);
  if (active) {
    for (int64_t b = static_cast<int64_t>(blockIdx.y) * kColumnRows + threadIdx.y; b < rows;
         b += static_cast<int64_t>(gridDim.y) * kColumnRows) {
      p.template add<1>(acc, b * columns + j);
    }
  }
  cell[threadIdx.y][threadIdx.x] = P::finish(acc);
  __syncthreads();
  if (threadIdx.y == 0 && active) {
    Stat3 s = cell[0][threadIdx.x];
#pragma unroll
    for (int r = 1; r < kColumnRows; ++r) s = P::merge(s, cell[r][threadIdx.x]);
    partial[j * gridDim.y + blockIdx.y] = s;
  }
}

// Merges channel c's `parts` partial statistics in a warp; lane 0 gets the result.
template <typename P>
__device__ Stat3 merge_parts(const Stat3* __restrict__ partial, int64_t c, int64_t parts) {
  Stat3 s{0.0, 0.0, 0.0};
  const int lane = threadIdx.x & 31;
  for (int64_t k = lane; k < parts; k += 32) s = P::merge(s, partial[c * parts + k]);
  return warp_merge<P>(s);
}

// Training: one warp per channel.
template <typename T>
__global__ void train_finalize_kernel(const Stat3* __restrict__ partial, int64_t parts, int64_t n,
                                      double momentum, double eps, const T* __restrict__ gamma,
                                      const T* __restrict__ beta, float* __restrict__ running_mean,
                                      float* __restrict__ running_var,
                                      float* __restrict__ save_mean,
                                      float* __restrict__ save_invstd, float2* __restrict__ coef) {
  const int64_t c = blockIdx.x;
  const Stat3 s = merge_parts<WelfordPolicy<T>>(partial, c, parts);
  if (threadIdx.x != 0) return;
  const double mean = s.b;
  const double m2 = s.c > 0.0 ? s.c : 0.0;
  const double invstd = 1.0 / sqrt(m2 / static_cast<double>(n) + eps);
  save_mean[c] = static_cast<float>(mean);
  save_invstd[c] = static_cast<float>(invstd);
  if (running_mean != nullptr) {
    running_mean[c] = static_cast<float>((1.0 - momentum) * static_cast<double>(running_mean[c]) +
                                         momentum * mean);
    running_var[c] = static_cast<float>((1.0 - momentum) * static_cast<double>(running_var[c]) +
                                        momentum * m2 / static_cast<double>(n - 1));
  }
  const double scale = invstd * (gamma != nullptr ? static_cast<double>(to_f32(gamma[c])) : 1.0);
  const double shift =
      (beta != nullptr ? static_cast<double>(to_f32(beta[c])) : 0.0) - mean * scale;
  coef[c] = make_float2(static_cast<float>(scale), static_cast<float>(shift));
}

// Evaluation: scale = gamma / sqrt(running_var + eps), shift = beta - running_mean scale.
template <typename T>
__global__ void eval_coef_kernel(const T* __restrict__ gamma, const T* __restrict__ beta,
                                 const float* __restrict__ running_mean,
                                 const float* __restrict__ running_var, double eps,
                                 int64_t channels, float2* __restrict__ coef) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double g = gamma != nullptr ? static_cast<double>(to_f32(gamma[c])) : 1.0;
    const double b = beta != nullptr ? static_cast<double>(to_f32(beta[c])) : 0.0;
    const double scale = g / sqrt(static_cast<double>(running_var[c]) + eps);
    const double shift = b - static_cast<double>(running_mean[c]) * scale;
    coef[c] = make_float2(static_cast<float>(scale), static_cast<float>(shift));
  }
}

// Backward: one warp per channel; accumulates dgamma, dbeta and folds dx's constants
// (a, b, k, mean): dx = a dy + b (x - mean) + k.
template <typename T>
__global__ void backward_finalize_kernel(const Stat3* __restrict__ partial, int64_t parts,
                                         int64_t n, const T* __restrict__ gamma,
                                         const float* __restrict__ save_mean,
                                         const float* __restrict__ save_invstd,
                                         T* __restrict__ dgamma, T* __restrict__ dbeta,
                                         float4* __restrict__ coef) {
  const int64_t c = blockIdx.x;
  const Stat3 s = merge_parts<GradPolicy<T>>(partial, c, parts);
  if (threadIdx.x != 0) return;
  const double invstd = static_cast<double>(save_invstd[c]);
  const double sum_dy = s.a;
  const double sum_dy_xhat = s.b * invstd;
  if (dbeta != nullptr) dbeta[c] = from_f32<T>(to_f32(dbeta[c]) + static_cast<float>(sum_dy));
  if (dgamma != nullptr) {
    dgamma[c] = from_f32<T>(to_f32(dgamma[c]) + static_cast<float>(sum_dy_xhat));
  }
  const double scale = invstd * (gamma != nullptr ? static_cast<double>(to_f32(gamma[c])) : 1.0);
  const double mean_dy = sum_dy / static_cast<double>(n);
  const double mean_dy_xhat = sum_dy_xhat / static_cast<double>(n);
  coef[c] =
      make_float4(static_cast<float>(scale), static_cast<float>(-scale * mean_dy_xhat * invstd),
                  static_cast<float>(-scale * mean_dy), save_mean[c]);
}

// y = x scale[c] + shift[c] over vectors of V values (S a multiple of V).
template <typename T, int V, typename I>
__global__ void apply_kernel(const T* __restrict__ x, T* __restrict__ y,
                             const float2* __restrict__ coef, I vectors, I sv, I channels) {
  for (I q = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; q < vectors;
       q += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c = (q / sv) % channels;
    const float2 k = coef[c];
    float v[V];
    load<T, V>(x + static_cast<int64_t>(q) * V, v);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = v[i] * k.x + k.y;
    store<T, V>(y + static_cast<int64_t>(q) * V, v);
  }
}

template <typename T, int V, typename I>
__global__ void backward_dx_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                   T* __restrict__ dx, const float4* __restrict__ coef, I vectors,
                                   I sv, I channels) {
  for (I q = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; q < vectors;
       q += static_cast<I>(gridDim.x) * blockDim.x) {
    const I c = (q / sv) % channels;
    const float4 k = coef[c];
    float v[V], d[V];
    load<T, V>(x + static_cast<int64_t>(q) * V, v);
    load<T, V>(dy + static_cast<int64_t>(q) * V, d);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = k.x * d[i] + k.y * (v[i] - k.w) + k.z;
    store<T, V>(dx + static_cast<int64_t>(q) * V, v);
  }
}

// ---- host side ------------------------------------------------------------------------------

struct BnGeometry {
  int64_t batch = 0, channels = 0, spatial = 1;
  int64_t per_channel() const { return batch * spatial; }
  int64_t numel() const { return batch * channels * spatial; }
};

BnGeometry bn_geometry(const ExecContext& ctx, const char* op, const Tensor& x) {
  check_float(x, ctx, op, "x");
  STRATA_CHECK(x.dim() >= 2 && x.size(1) > 0)
      << op << ": x must be (B, C) or (B, C, spatial...) with C > 0, got " << x.shape_str();
  BnGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  for (int64_t d = 2; d < x.dim(); ++d) g.spatial *= x.size(d);
  return g;
}

void check_channel_tensor(const ExecContext& ctx, const char* op, const Tensor& t, const char* name,
                          const Tensor& x) {
  check_float(t, ctx, op, name);
  check_same_dtype(x, t, op, "x", name);
  check_shape(t, {x.size(1)}, op, name);
}

// A statistic (save_mean, save_invstd, running_mean, running_var): (C,), f32.
void check_stat_tensor(const ExecContext& ctx, const char* op, const Tensor& t, const char* name,
                       const Tensor& x) {
  check_float(t, ctx, op, name);
  STRATA_CHECK(t.dtype() == DType::kF32)
      << op << ": " << name << " must be f32 (batch-norm statistics), got "
      << dtype_name(t.dtype());
  check_shape(t, {x.size(1)}, op, name);
}

const float* stat_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const float*>(t.raw_data()) : nullptr;
}
float* mut_stat_or_null(const Tensor& t) {
  return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr;
}

void check_affine(const ExecContext& ctx, const char* op, const Tensor& gamma, const Tensor& beta,
                  const Tensor& x) {
  if (gamma.defined()) check_channel_tensor(ctx, op, gamma, "gamma", x);
  if (beta.defined()) check_channel_tensor(ctx, op, beta, "beta", x);
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw_data()) : nullptr;
}
template <typename T>
T* mut_ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw_data()) : nullptr;
}

bool aligned16(const void* p) { return aligned_to(p, 16); }

// 16-byte vectors: 4 f32 or 8 bf16/f16 values.
template <typename T>
constexpr int vector_width() {
  return static_cast<int>(16 / sizeof(T));
}

bool fits_i32(int64_t n) { return n < (int64_t{1} << 30); }

// Runs the reduction of policy p over x's geometry into a new [C][parts] buffer of Stat3 and
// returns the buffer; `parts` receives the number of partial statistics per channel. `vec_ok`:
// every tensor the policy reads is 16-byte aligned.
template <typename T, typename P>
Tensor reduce_channels(ExecContext& ctx, sc::CudaExec& ex, const P& p, const BnGeometry& g,
                       bool vec_ok, int64_t* parts) {
  const int64_t target_blocks = 4 * static_cast<int64_t>(ex.sm_count() > 0 ? ex.sm_count() : 80);
  constexpr int64_t kStatDoubles = sizeof(Stat3) / sizeof(double);
  if (g.spatial < kColumnModeMaxS) {
    const int64_t columns = g.channels * g.spatial;
    const int64_t col_blocks = (columns + kColumns - 1) / kColumns;
    const int64_t max_row_blocks =
        std::min<int64_t>((g.batch + kColumnRows - 1) / kColumnRows, 65535);
    int64_t row_blocks =
        std::max<int64_t>((g.batch + 127) / 128, (target_blocks + col_blocks - 1) / col_blocks);
    row_blocks = std::clamp<int64_t>(row_blocks, 1, std::max<int64_t>(max_row_blocks, 1));
    *parts = g.spatial * row_blocks;
    Tensor partial =
        Tensor::empty({columns * row_blocks * kStatDoubles}, DType::kF64, &ctx.allocator());
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
    const dim3 block(kColumns, kColumnRows);
    reduce_columns_kernel<P><<<grid, block, 0, ex.stream()>>>(
        p, g.batch, columns, g.spatial, static_cast<Stat3*>(partial.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("reduce_columns_kernel");
    return partial;
  }
  const int64_t n = g.per_channel();
  const int64_t splits = std::clamp<int64_t>((target_blocks + g.channels - 1) / g.channels, 1,
                                             std::clamp<int64_t>(n / 2048, 1, 65535));
  *parts = splits;
  Tensor partial =
      Tensor::empty({g.channels * splits * kStatDoubles}, DType::kF64, &ctx.allocator());
  Stat3* pp = static_cast<Stat3*>(partial.raw_data());
  const dim3 grid(static_cast<unsigned>(g.channels), static_cast<unsigned>(splits));
  constexpr int V = vector_width<T>();
  const bool vec = vec_ok && g.spatial % V == 0;
  const int64_t width = vec ? V : 1;
  const int64_t vectors = n / width, sv = g.spatial / width;
  const bool small = fits_i32(g.numel());
  if (vec && small) {
    reduce_flat_kernel<P, V, int32_t><<<grid, kThreads, 0, ex.stream()>>>(
        p, static_cast<int32_t>(vectors), static_cast<int32_t>(sv), g.channels, g.spatial, pp);
  } else if (vec) {
    reduce_flat_kernel<P, V, int64_t>
        <<<grid, kThreads, 0, ex.stream()>>>(p, vectors, sv, g.channels, g.spatial, pp);
  } else if (small) {
    reduce_flat_kernel<P, 1, int32_t><<<grid, kThreads, 0, ex.stream()>>>(
        p, static_cast<int32_t>(vectors), static_cast<int32_t>(sv), g.channels, g.spatial, pp);
  } else {
    reduce_flat_kernel<P, 1, int64_t>
        <<<grid, kThreads, 0, ex.stream()>>>(p, vectors, sv, g.channels, g.spatial, pp);
  }
  STRATA_CUDA_LAUNCH_CHECK("reduce_flat_kernel");
  return partial;
}

// Launches an element-wise kernel (apply_kernel / backward_dx_kernel) with the widest vector
// the shape and alignment allow and 32-bit indices where they fit.
template <typename T, typename Fn>
void launch_elementwise(sc::CudaExec& ex, const BnGeometry& g, bool vec_ok, Fn&& launch) {
  constexpr int V = vector_width<T>();
  const bool vec = vec_ok && g.spatial % V == 0;
  const int64_t width = vec ? V : 1;
  const int64_t vectors = g.numel() / width, sv = g.spatial / width;
  const unsigned blocks = sc::blocks_for(vectors, kThreads, ex);
  const bool small = fits_i32(g.numel());
  if (vec && small) {
    launch(std::integral_constant<int, V>{}, int32_t{}, blocks, static_cast<int32_t>(vectors),
           static_cast<int32_t>(sv), static_cast<int32_t>(g.channels));
  } else if (vec) {
    launch(std::integral_constant<int, V>{}, int64_t{}, blocks, vectors, sv, g.channels);
  } else if (small) {
    launch(std::integral_constant<int, 1>{}, int32_t{}, blocks, static_cast<int32_t>(vectors),
           static_cast<int32_t>(sv), static_cast<int32_t>(g.channels));
  } else {
    launch(std::integral_constant<int, 1>{}, int64_t{}, blocks, vectors, sv, g.channels);
  }
}

sc::CudaExec& begin_op(const ExecContext& ctx, const char* op) {
  sc::CudaExec& x = sc::exec(ctx, op);
  STRATA_CUDA_CHECK(cudaSetDevice(x.device()));
  return x;
}

}  // namespace

BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              double momentum, double eps) {
  constexpr const char* kOp = "batch_norm_forward_train";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  const BnGeometry g = bn_geometry(ctx, kOp, x);
  check_affine(ctx, kOp, gamma, beta, x);
  STRATA_CHECK(running_mean.defined() == running_var.defined())
      << kOp << ": running_mean and running_var must be both defined or both undefined";
  if (running_mean.defined()) {
    check_stat_tensor(ctx, kOp, running_mean, "running_mean", x);
    check_stat_tensor(ctx, kOp, running_var, "running_var", x);
  }
  STRATA_CHECK(momentum >= 0.0 && momentum <= 1.0 && eps >= 0.0)
      << kOp << ": need 0 <= momentum <= 1 and eps >= 0, got momentum " << momentum << ", eps "
      << eps;
  const int64_t n = g.per_channel();
  STRATA_CHECK_GT(n, 1) << kOp << ": x " << x.shape_str()
                        << " has one value per channel; training needs more than one";
  BatchNormTrainResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  r.save_mean = Tensor::empty({g.channels}, DType::kF32, &ctx.allocator());
  r.save_invstd = Tensor::empty({g.channels}, DType::kF32, &ctx.allocator());
  Tensor coef = Tensor::empty({g.channels * 2}, DType::kF32, &ctx.allocator());
  float2* pcoef = reinterpret_cast<float2*>(coef.raw_data());
  const bool vec_ok = aligned16(x.raw_data()) && aligned16(r.y.raw_data());
  dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    int64_t parts = 0;
    Tensor partial =
        reduce_channels<T>(ctx, ex, WelfordPolicy<T>{px}, g, aligned16(x.raw_data()), &parts);
    train_finalize_kernel<T><<<static_cast<unsigned>(g.channels), 32, 0, ex.stream()>>>(
        static_cast<const Stat3*>(partial.raw_data()), parts, n, momentum, eps,
        ptr_or_null<T>(gamma), ptr_or_null<T>(beta), mut_stat_or_null(running_mean),
        mut_stat_or_null(running_var), static_cast<float*>(r.save_mean.raw_data()),
        static_cast<float*>(r.save_invstd.raw_data()), pcoef);
    STRATA_CUDA_LAUNCH_CHECK("train_finalize_kernel");
    T* py = static_cast<T*>(r.y.raw_data());
    launch_elementwise<T>(
        ex, g, vec_ok,
        [&](auto width, auto index, unsigned blocks, auto vectors, auto sv, auto channels) {
          constexpr int V = decltype(width)::value;
          using I = decltype(index);
          apply_kernel<T, V, I>
              <<<blocks, kThreads, 0, ex.stream()>>>(px, py, pcoef, vectors, sv, channels);
          STRATA_CUDA_LAUNCH_CHECK("apply_kernel");
        });
  });
  return r;
}

Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, double eps) {
  constexpr const char* kOp = "batch_norm_forward_eval";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  const BnGeometry g = bn_geometry(ctx, kOp, x);
  check_affine(ctx, kOp, gamma, beta, x);
  STRATA_CHECK(running_mean.defined() && running_var.defined())
      << kOp << ": evaluation normalizes with running_mean and running_var; both must be defined";
  check_stat_tensor(ctx, kOp, running_mean, "running_mean", x);
  check_stat_tensor(ctx, kOp, running_var, "running_var", x);
  STRATA_CHECK_GE(eps, 0.0) << kOp << ": eps must be >= 0";
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  if (g.numel() == 0) return y;
  Tensor coef = Tensor::empty({g.channels * 2}, DType::kF32, &ctx.allocator());
  float2* pcoef = reinterpret_cast<float2*>(coef.raw_data());
  const bool vec_ok = aligned16(x.raw_data()) && aligned16(y.raw_data());
  dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    eval_coef_kernel<T><<<sc::blocks_for(g.channels, kThreads, ex), kThreads, 0, ex.stream()>>>(
        ptr_or_null<T>(gamma), ptr_or_null<T>(beta), stat_or_null(running_mean),
        stat_or_null(running_var), eps, g.channels, pcoef);
    STRATA_CUDA_LAUNCH_CHECK("eval_coef_kernel");
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    launch_elementwise<T>(
        ex, g, vec_ok,
        [&](auto width, auto index, unsigned blocks, auto vectors, auto sv, auto channels) {
          constexpr int V = decltype(width)::value;
          using I = decltype(index);
          apply_kernel<T, V, I>
              <<<blocks, kThreads, 0, ex.stream()>>>(px, py, pcoef, vectors, sv, channels);
          STRATA_CUDA_LAUNCH_CHECK("apply_kernel");
        });
  });
  return y;
}

Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                           const Tensor& dbeta) {
  constexpr const char* kOp = "batch_norm_backward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  const BnGeometry g = bn_geometry(ctx, kOp, x);
  check_float(dy, ctx, kOp, "dy");
  check_same_dtype(x, dy, kOp, "x", "dy");
  check_shape(dy, x.shape(), kOp, "dy");
  if (gamma.defined()) check_channel_tensor(ctx, kOp, gamma, "gamma", x);
  check_stat_tensor(ctx, kOp, save_mean, "save_mean", x);
  check_stat_tensor(ctx, kOp, save_invstd, "save_invstd", x);
  if (dgamma.defined()) check_channel_tensor(ctx, kOp, dgamma, "dgamma", x);
  if (dbeta.defined()) check_channel_tensor(ctx, kOp, dbeta, "dbeta", x);
  const int64_t n = g.per_channel();
  STRATA_CHECK_GT(n, 1) << kOp << ": x " << x.shape_str()
                        << " has one value per channel; training needs more than one";
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  Tensor coef = Tensor::empty({g.channels * 4}, DType::kF32, &ctx.allocator());
  float4* pcoef = reinterpret_cast<float4*>(coef.raw_data());
  const bool read_vec_ok = aligned16(x.raw_data()) && aligned16(dy.raw_data());
  const bool vec_ok = read_vec_ok && aligned16(dx.raw_data());
  dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pdy = static_cast<const T*>(dy.raw_data());
    const float* pmean = static_cast<const float*>(save_mean.raw_data());
    int64_t parts = 0;
    Tensor partial =
        reduce_channels<T>(ctx, ex, GradPolicy<T>{px, pdy, pmean}, g, read_vec_ok, &parts);
    backward_finalize_kernel<T><<<static_cast<unsigned>(g.channels), 32, 0, ex.stream()>>>(
        static_cast<const Stat3*>(partial.raw_data()), parts, n, ptr_or_null<T>(gamma), pmean,
        static_cast<const float*>(save_invstd.raw_data()), mut_ptr_or_null<T>(dgamma),
        mut_ptr_or_null<T>(dbeta), pcoef);
    STRATA_CUDA_LAUNCH_CHECK("backward_finalize_kernel");
    T* pdx = static_cast<T*>(dx.raw_data());
    launch_elementwise<T>(
        ex, g, vec_ok,
        [&](auto width, auto index, unsigned blocks, auto vectors, auto sv, auto channels) {
          constexpr int V = decltype(width)::value;
          using I = decltype(index);
          backward_dx_kernel<T, V, I>
              <<<blocks, kThreads, 0, ex.stream()>>>(px, pdy, pdx, pcoef, vectors, sv, channels);
          STRATA_CUDA_LAUNCH_CHECK("backward_dx_kernel");
        });
  });
  return dx;
}

}  // namespace strata::ops::cuda
