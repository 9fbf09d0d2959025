// Inverted dropout on CUDA with the counter-based Philox masks of ops/dropout.h: f32, bf16, f16.
//
// One thread per Philox block: the four consecutive elements e = 4 j .. 4 j + 3 of one sample
// take the four lanes of philox4x32_10({lo32(j), hi32(j), lo32(n), lo32(step)}, key), exactly as
// the CPU does, so masks are bit-identical. The keep test is the CPU's double comparison
// philox_uniform(bits) >= p done as integers: (bits >> 8) >= ceil(p 2^24) (p 2^24 is exact in
// double). When the sample size is a multiple of 4 and the pointers allow, the four elements and
// their mask bytes move as single vector accesses. Kept elements are x * (1 / (1 - p)) with the
// scale rounded to f32; dropped elements are exactly 0.
#include <cmath>
#include <cstdint>

#include "engine/philox.h"
#include "ops/dropout.h"
#include "ops/pointwise_cuda_util.cuh"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr const char* kForward = "dropout_forward";
constexpr const char* kBackward = "dropout_backward";
constexpr int kThreads = 256;

void check_p(double p, const char* op) {
  STRATA_CHECK(p >= 0.0 && p < 1.0) << op << ": p must be in [0, 1), got " << p;
}

template <typename T, bool kVec>
__global__ void dropout_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                       uint8_t* __restrict__ mask, int64_t batch,
                                       int64_t per_sample, int64_t blocks_per_sample, PhiloxKey key,
                                       uint64_t first_sample, uint32_t step, uint32_t threshold,
                                       float scale) {
  const int64_t total = batch * blocks_per_sample;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < total;
       w += stride) {
    const int64_t b = w / blocks_per_sample;
    const uint64_t block = static_cast<uint64_t>(w - b * blocks_per_sample);
    const uint32_t sample = static_cast<uint32_t>(first_sample + static_cast<uint64_t>(b));
    const PhiloxCounter counter{
        {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), sample, step}};
    const PhiloxCounter bits = philox4x32_10(counter, key);
    const int64_t e0 = static_cast<int64_t>(block) * 4;
    const int64_t i0 = b * per_sample + e0;
    if constexpr (kVec) {
      using P = cd::Pack<T, 4>;
      const P px = *reinterpret_cast<const P*>(x + i0);
      P py;
      uint32_t m = 0;
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) {
        const bool keep = (bits.v[lane] >> 8) >= threshold;
        m |= static_cast<uint32_t>(keep) << (8 * lane);
        py.v[lane] = keep ? cd::from_f32<T>(__fmul_rn(cd::to_f32(px.v[lane]), scale))
                          : cd::from_f32<T>(0.0f);
      }
      *reinterpret_cast<P*>(y + i0) = py;
      *reinterpret_cast<uint32_t*>(mask + i0) = m;  // little-endian: byte `lane` is element lane
    } else {
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) {
        if (e0 + lane < per_sample) {
          const int64_t i = i0 + lane;
          const bool keep = (bits.v[lane] >> 8) >= threshold;
          mask[i] = keep ? 1 : 0;
          y[i] = keep ? cd::from_f32<T>(__fmul_rn(cd::to_f32(x[i]), scale)) : cd::from_f32<T>(0.0f);
        }
      }
    }
  }
}

// dx = mask ? dy * scale : 0, four elements per step when kVec.
template <typename T, bool kVec>
__global__ void dropout_backward_kernel(int64_t n, const T* __restrict__ dy,
                                        const uint8_t* __restrict__ mask, T* __restrict__ dx,
                                        float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVec) {
    using P = cd::Pack<T, 4>;
    const int64_t nv = n / 4;
    for (int64_t v = tid; v < nv; v += stride) {
      const P pg = reinterpret_cast<const P*>(dy)[v];
      const uint32_t m = reinterpret_cast<const uint32_t*>(mask)[v];
      P px;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        px.v[k] = ((m >> (8 * k)) & 0xffu) != 0
                      ? cd::from_f32<T>(__fmul_rn(cd::to_f32(pg.v[k]), scale))
                      : cd::from_f32<T>(0.0f);
      }
      reinterpret_cast<P*>(dx)[v] = px;
    }
    done = nv * 4;
  }
  for (int64_t i = done + tid; i < n; i += stride) {
    dx[i] =
        mask[i] != 0 ? cd::from_f32<T>(__fmul_rn(cd::to_f32(dy[i]), scale)) : cd::from_f32<T>(0.0f);
  }
}

}  // namespace

DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng) {
  CudaExec& ex = ::strata::cuda::exec(ctx, kForward);
  cd::check_float(x, ctx, kForward, "x");
  STRATA_CHECK(x.dim() >= 1) << kForward << ": x must be (B, ...), got a 0-d tensor";
  check_p(p, kForward);
  DropoutResult r;
  if (p == 0.0) {
    r.y = x;
    return r;
  }
  r.y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  r.mask = Tensor::empty(x.shape(), DType::kU8, &ctx.allocator());
  const int64_t batch = x.size(0);
  const int64_t per_sample = batch > 0 ? x.numel() / batch : 0;
  if (x.numel() == 0) return r;
  const PhiloxKey key = philox_key(rng.seed, rng.stream);
  const uint32_t step = static_cast<uint32_t>(static_cast<uint64_t>(rng.step));
  const uint64_t first_sample = static_cast<uint64_t>(rng.sample_offset);
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const int64_t blocks_per_sample = (per_sample + 3) / 4;
  const int64_t total = batch * blocks_per_sample;
  const unsigned blocks = ::strata::cuda::blocks_for(total, kThreads, ex);
  uint8_t* pm = static_cast<uint8_t*>(r.mask.raw_data());
  cd::dispatch_float(x.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(r.y.raw_data());
    const bool vec = per_sample % 4 == 0 && cd::aligned_to(px, 4 * sizeof(T)) &&
                     cd::aligned_to(py, 4 * sizeof(T)) && cd::aligned_to(pm, 4);
    if (vec) {
      dropout_forward_kernel<T, true>
          <<<blocks, kThreads, 0, ex.stream()>>>(px, py, pm, batch, per_sample, blocks_per_sample,
                                                 key, first_sample, step, threshold, scale);
    } else {
      dropout_forward_kernel<T, false>
          <<<blocks, kThreads, 0, ex.stream()>>>(px, py, pm, batch, per_sample, blocks_per_sample,
                                                 key, first_sample, step, threshold, scale);
    }
    STRATA_CUDA_LAUNCH_CHECK("dropout_forward_kernel");
  });
  return r;
}

Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p) {
  CudaExec& ex = ::strata::cuda::exec(ctx, kBackward);
  cd::check_float(dy, ctx, kBackward, "dy");
  check_p(p, kBackward);
  if (!mask.defined()) {
    STRATA_CHECK(p == 0.0) << kBackward << ": mask is undefined but p = " << p
                           << " (only p == 0 runs without a mask)";
    return dy;
  }
  cd::check_cuda(mask, ctx, kBackward, "mask");
  STRATA_CHECK(mask.dtype() == DType::kU8)
      << kBackward << ": mask must be u8, got " << dtype_name(mask.dtype());
  cd::check_shape(mask, dy.shape(), kBackward, "mask");
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), &ctx.allocator());
  const int64_t n = dy.numel();
  if (n == 0) return dx;
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const uint8_t* pm = static_cast<const uint8_t*>(mask.raw_data());
  cd::dispatch_float(dy.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy.raw_data());
    T* pdx = static_cast<T*>(dx.raw_data());
    const bool vec = cd::aligned_to(pdy, 4 * sizeof(T)) && cd::aligned_to(pdx, 4 * sizeof(T)) &&
                     cd::aligned_to(pm, 4);
    if (vec) {
      dropout_backward_kernel<T, true>
          <<<::strata::cuda::blocks_for((n + 3) / 4, kThreads, ex), kThreads, 0, ex.stream()>>>(
              n, pdy, pm, pdx, scale);
    } else {
      dropout_backward_kernel<T, false>
          <<<::strata::cuda::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(n, pdy, pm,
                                                                                      pdx, scale);
    }
    STRATA_CUDA_LAUNCH_CHECK("dropout_backward_kernel");
  });
  return dx;
}

}  // namespace strata::ops::cuda
