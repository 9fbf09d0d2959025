// Layer normalization over the last dimension on CUDA: f32, bf16 and f16 (x, gamma, beta, y and
// the gradients of one dtype); the saved statistics mean and rstd are f32 whatever x's dtype (as
// the frameworks keep them under mixed precision), and are computed in f32.
//
// Forward: a row belongs to one warp (C <= 1024, four rows per block) or to a block (256 threads
// up to C = 8192, 1024 beyond). Two-pass statistics as on the CPU (mean, then the mean of squared
// deviations, so no cancellation), reduced with warp shuffles (and shared memory across warps);
// a third pass writes y. The second and third passes read the row from cache.
// Backward: dx with the same row layout, the two row means (of g = dy gamma and of g xhat) in one
// pass, dx in a second. dgamma and dbeta: blocks of 32 columns x 8 rows sum a range of rows each
// in double into per-block partials (scratch), and a second kernel adds the partials of every
// column in a fixed order and accumulates (+=) into dgamma / dbeta: no atomics, deterministic.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "ops/layer_norm.h"
#include "ops/pointwise_cuda_util.cuh"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr const char* kForward = "layer_norm_forward";
constexpr const char* kBackward = "layer_norm_backward";

template <int kRowThreads>
__host__ __device__ constexpr int block_threads() {
  return kRowThreads == 32 ? 128 : kRowThreads;
}

template <typename T, int kRowThreads, int kVec>
__global__ void __launch_bounds__(block_threads<kRowThreads>())
    layer_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ gamma,
                              const T* __restrict__ beta, T* __restrict__ y,
                              float* __restrict__ mean, float* __restrict__ rstd, int64_t rows,
                              int64_t c, float eps) {
  constexpr int kBlock = block_threads<kRowThreads>();
  constexpr int kRowsPerBlock = kBlock / kRowThreads;
  using P = cd::Pack<T, kVec>;
  __shared__ float smem[32];
  const int t = threadIdx.x % kRowThreads;
  const int64_t packs = c / kVec;
  const P* gp = reinterpret_cast<const P*>(gamma);
  const P* bp = reinterpret_cast<const P*>(beta);
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const P* xr = reinterpret_cast<const P*>(x + row * c);
    float sum = 0.0f;
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) sum += cd::to_f32(p.v[k]);
    }
    const float mu = cd::row_sum<kRowThreads>(sum, smem) * inv_c;
    float sq = 0.0f;
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float d = cd::to_f32(p.v[k]) - mu;
        sq += d * d;
      }
    }
    const float var = cd::row_sum<kRowThreads>(sq, smem) * inv_c;
    const float rs = 1.0f / sqrtf(var + eps);
    if (t == 0) {
      mean[row] = mu;
      rstd[row] = rs;
    }
    P* yr = reinterpret_cast<P*>(y + row * c);
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j];
      P g, b, o;
      if (gamma != nullptr) g = gp[j];
      if (beta != nullptr) b = bp[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float v = (cd::to_f32(p.v[k]) - mu) * rs;
        if (gamma != nullptr) v *= cd::to_f32(g.v[k]);
        if (beta != nullptr) v += cd::to_f32(b.v[k]);
        o.v[k] = cd::from_f32<T>(v);
      }
      yr[j] = o;
    }
  }
}

template <typename T, int kRowThreads, int kVec>
__global__ void __launch_bounds__(block_threads<kRowThreads>())
    layer_norm_dx_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                         const T* __restrict__ gamma, const float* __restrict__ mean,
                         const float* __restrict__ rstd, T* __restrict__ dx, int64_t rows,
                         int64_t c) {
  constexpr int kBlock = block_threads<kRowThreads>();
  constexpr int kRowsPerBlock = kBlock / kRowThreads;
  using P = cd::Pack<T, kVec>;
  __shared__ float smem[32];
  const int t = threadIdx.x % kRowThreads;
  const int64_t packs = c / kVec;
  const P* gp = reinterpret_cast<const P*>(gamma);
  const float inv_c = 1.0f / static_cast<float>(c);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
       row < rows; row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const P* xr = reinterpret_cast<const P*>(x + row * c);
    const P* dyr = reinterpret_cast<const P*>(dy + row * c);
    const float mu = mean[row], rs = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j], d = dyr[j];
      P g;
      if (gamma != nullptr) g = gp[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float gv = cd::to_f32(d.v[k]);
        if (gamma != nullptr) gv *= cd::to_f32(g.v[k]);
        sum_g += gv;
        sum_gx += gv * ((cd::to_f32(p.v[k]) - mu) * rs);
      }
    }
    const float mean_g = cd::row_sum<kRowThreads>(sum_g, smem) * inv_c;
    const float mean_gx = cd::row_sum<kRowThreads>(sum_gx, smem) * inv_c;
    P* dxr = reinterpret_cast<P*>(dx + row * c);
    for (int64_t j = t; j < packs; j += kRowThreads) {
      const P p = xr[j], d = dyr[j];
      P g, o;
      if (gamma != nullptr) g = gp[j];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float gv = cd::to_f32(d.v[k]);
        if (gamma != nullptr) gv *= cd::to_f32(g.v[k]);
        const float xhat = (cd::to_f32(p.v[k]) - mu) * rs;
        o.v[k] = cd::from_f32<T>(rs * (gv - mean_g - xhat * mean_gx));
      }
      dxr[j] = o;
    }
  }
}

constexpr int kColTile = 32;  // columns per block (threadIdx.x)
constexpr int kColRows = 8;   // rows in flight per block (threadIdx.y)

// partial[s, 0, col] = sum over rows of split s of dy xhat, partial[s, 1, col] = sum of dy.
template <typename T>
__global__ void layer_norm_param_partials_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                 const float* __restrict__ mean,
                                                 const float* __restrict__ rstd, int64_t rows,
                                                 int64_t c, int64_t chunk,
                                                 double* __restrict__ partial) {
  __shared__ double tile_g[kColRows][kColTile + 1];
  __shared__ double tile_b[kColRows][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t r1 = min(rows, r0 + chunk);
  double acc_g = 0.0, acc_b = 0.0;
  if (col < c) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) {
      const float d = cd::to_f32(dy[r * c + col]);
      const float xhat = (cd::to_f32(x[r * c + col]) - mean[r]) * rstd[r];
      acc_g += static_cast<double>(d) * static_cast<double>(xhat);
      acc_b += static_cast<double>(d);
    }
  }
  tile_g[threadIdx.y][threadIdx.x] = acc_g;
  tile_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < c) {
    double sg = 0.0, sb = 0.0;
#pragma unroll
    for (int i = 0; i < kColRows; ++i) {
      sg += tile_g[i][threadIdx.x];
      sb += tile_b[i][threadIdx.x];
    }
    partial[(static_cast<int64_t>(blockIdx.y) * 2 + 0) * c + col] = sg;
    partial[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * c + col] = sb;
  }
}

// dgamma[col] += sum_s partial[s, 0, col]; dbeta[col] += sum_s partial[s, 1, col].
template <typename T>
__global__ void layer_norm_param_finish_kernel(const double* __restrict__ partial, int64_t c,
                                               int splits, T* __restrict__ dgamma,
                                               T* __restrict__ dbeta) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; col < c;
       col += stride) {
    double sg = 0.0, sb = 0.0;
    for (int s = 0; s < splits; ++s) {
      sg += partial[(static_cast<int64_t>(s) * 2 + 0) * c + col];
      sb += partial[(static_cast<int64_t>(s) * 2 + 1) * c + col];
    }
    // Like the CPU: the sum is rounded to the dtype, then added.
    if (dgamma != nullptr) {
      dgamma[col] = cd::from_f32<T>(cd::to_f32(dgamma[col]) +
                                    cd::to_f32(cd::from_f32<T>(static_cast<float>(sg))));
    }
    if (dbeta != nullptr) {
      dbeta[col] = cd::from_f32<T>(cd::to_f32(dbeta[col]) +
                                   cd::to_f32(cd::from_f32<T>(static_cast<float>(sb))));
    }
  }
}

template <int kRowThreads>
unsigned row_blocks(int64_t rows, const CudaExec& ex) {
  constexpr int kRowsPerBlock = block_threads<kRowThreads>() / kRowThreads;
  const int64_t needed = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t cap = static_cast<int64_t>(std::max(ex.sm_count(), 1)) *
                      std::max(1, 4096 / block_threads<kRowThreads>());
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(needed, cap)));
}

template <typename T, typename F>
void pick_row_config(int64_t c, bool aligned, F&& launch) {
  constexpr int kV = cd::vec16<T>();
  const bool vec = aligned && c % kV == 0;
  auto with_vec = [&](auto rt) {
    if (vec) {
      launch(rt, std::integral_constant<int, kV>{});
    } else {
      launch(rt, std::integral_constant<int, 1>{});
    }
  };
  if (c <= 1024) {
    with_vec(std::integral_constant<int, 32>{});
  } else if (c <= 8192) {
    with_vec(std::integral_constant<int, 256>{});
  } else {
    with_vec(std::integral_constant<int, 1024>{});
  }
}

void check_param(const Tensor& p, const Tensor& x, int64_t c, const ExecContext& ctx,
                 const char* op, const char* name) {
  if (!p.defined()) return;
  cd::check_float(p, ctx, op, name);
  cd::check_same_dtype(p, x, op, name, "x");
  cd::check_shape(p, {c}, op, name);
}

int64_t check_x(const Tensor& x, const ExecContext& ctx, const char* op) {
  cd::check_float(x, ctx, op, "x");
  STRATA_CHECK(x.dim() >= 1 && x.size(-1) > 0)
      << op << ": x must be (..., C) with C > 0, got " << x.shape_str();
  return x.size(-1);
}

bool aligned16(const Tensor& t) { return !t.defined() || cd::aligned_to(t.raw_data(), 16); }

}  // namespace

LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps) {
  CudaExec& ex = ::strata::cuda::exec(ctx, kForward);
  const int64_t c = check_x(x, ctx, kForward);
  check_param(gamma, x, c, ctx, kForward, "gamma");
  check_param(beta, x, c, ctx, kForward, "beta");
  STRATA_CHECK(eps >= 0.0) << kForward << ": eps must be >= 0, got " << eps;
  const int64_t rows = x.numel() / c;
  LayerNormResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  r.mean = Tensor::empty({rows}, DType::kF32, &ctx.allocator());
  r.rstd = Tensor::empty({rows}, DType::kF32, &ctx.allocator());
  if (rows == 0) return r;
  cd::dispatch_float(x.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pg = gamma.defined() ? static_cast<const T*>(gamma.raw_data()) : nullptr;
    const T* pb = beta.defined() ? static_cast<const T*>(beta.raw_data()) : nullptr;
    T* py = static_cast<T*>(r.y.raw_data());
    float* pmean = static_cast<float*>(r.mean.raw_data());
    float* prstd = static_cast<float*>(r.rstd.raw_data());
    const bool aligned = aligned16(x) && aligned16(gamma) && aligned16(beta) && aligned16(r.y);
    pick_row_config<T>(c, aligned, [&](auto rt, auto vt) {
      constexpr int kRowThreads = decltype(rt)::value;
      constexpr int kVec = decltype(vt)::value;
      layer_norm_forward_kernel<T, kRowThreads, kVec>
          <<<row_blocks<kRowThreads>(rows, ex), block_threads<kRowThreads>(), 0, ex.stream()>>>(
              px, pg, pb, py, pmean, prstd, rows, c, static_cast<float>(eps));
      STRATA_CUDA_LAUNCH_CHECK("layer_norm_forward_kernel");
    });
  });
  return r;
}

Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta) {
  CudaExec& ex = ::strata::cuda::exec(ctx, kBackward);
  const int64_t c = check_x(x, ctx, kBackward);
  const int64_t rows = x.numel() / c;
  cd::check_float(dy, ctx, kBackward, "dy");
  cd::check_same_dtype(dy, x, kBackward, "dy", "x");
  cd::check_shape(dy, x.shape(), kBackward, "dy");
  for (const auto& [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}}) {
    cd::check_float(*t, ctx, kBackward, name);
    STRATA_CHECK(t->dtype() == DType::kF32)
        << kBackward << ": " << name
        << " must be f32 (the statistics layer_norm_forward saves), got " << dtype_name(t->dtype());
    cd::check_shape(*t, {rows}, kBackward, name);
  }
  check_param(gamma, x, c, ctx, kBackward, "gamma");
  check_param(dgamma, x, c, ctx, kBackward, "dgamma");
  check_param(dbeta, x, c, ctx, kBackward, "dbeta");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  if (rows == 0) return dx;
  cd::dispatch_float(x.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    const T* pdy = static_cast<const T*>(dy.raw_data());
    const T* pg = gamma.defined() ? static_cast<const T*>(gamma.raw_data()) : nullptr;
    const float* pmean = static_cast<const float*>(mean.raw_data());
    const float* prstd = static_cast<const float*>(rstd.raw_data());
    T* pdx = static_cast<T*>(dx.raw_data());
    const bool aligned = aligned16(x) && aligned16(dy) && aligned16(gamma) && aligned16(dx);
    pick_row_config<T>(c, aligned, [&](auto rt, auto vt) {
      constexpr int kRowThreads = decltype(rt)::value;
      constexpr int kVec = decltype(vt)::value;
      layer_norm_dx_kernel<T, kRowThreads, kVec>
          <<<row_blocks<kRowThreads>(rows, ex), block_threads<kRowThreads>(), 0, ex.stream()>>>(
              pdy, px, pg, pmean, prstd, pdx, rows, c);
      STRATA_CUDA_LAUNCH_CHECK("layer_norm_dx_kernel");
    });
    if (!dgamma.defined() && !dbeta.defined()) return;
    // Split the rows so that the column blocks fill the GPU, at least 64 rows per split.
    const int64_t col_blocks = (c + kColTile - 1) / kColTile;
    const int64_t target_blocks = static_cast<int64_t>(std::max(ex.sm_count(), 1)) * 4;
    int64_t splits = std::max<int64_t>(1, (target_blocks + col_blocks - 1) / col_blocks);
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, rows / 64));
    splits = std::min<int64_t>(splits, 65535);
    const int64_t chunk = (rows + splits - 1) / splits;
    splits = (rows + chunk - 1) / chunk;  // no empty split
    const Tensor partial_sums =
        ::strata::cuda::scratch(ctx, static_cast<size_t>(splits * 2 * c) * sizeof(double),
                                "layer_norm_backward partial sums");
    double* partial = static_cast<double*>(partial_sums.raw_data());
    layer_norm_param_partials_kernel<T>
        <<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(splits)),
           dim3(kColTile, kColRows), 0, ex.stream()>>>(pdy, px, pmean, prstd, rows, c, chunk,
                                                       partial);
    STRATA_CUDA_LAUNCH_CHECK("layer_norm_param_partials_kernel");
    T* pdg = dgamma.defined() ? static_cast<T*>(dgamma.raw_data()) : nullptr;
    T* pdb = dbeta.defined() ? static_cast<T*>(dbeta.raw_data()) : nullptr;
    layer_norm_param_finish_kernel<T>
        <<<::strata::cuda::blocks_for(c, 256, ex), 256, 0, ex.stream()>>>(
            partial, c, static_cast<int>(splits), pdg, pdb);
    STRATA_CUDA_LAUNCH_CHECK("layer_norm_param_finish_kernel");
  });
  return dx;
}

}  // namespace strata::ops::cuda
