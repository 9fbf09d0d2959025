// 2-D pooling on CUDA, NCHW: own kernels (cuDNN's pooling returns no argmax indices and has no
// ceil_mode), f32, bf16 and f16 storage, computing in f32. Windows follow the CPU reference
// (ops/pooling_cpu.cpp), which follows PyTorch:
//   max:       one thread per output; padding is -infinity, the first maximum in row-major window
//              order wins ties and a NaN counts as the maximum (comparisons on the f32 values, so
//              bf16/f16 indices are those of the CPU op on the same values). Indices are flat
//              h W + w within the (b, c) plane.
//   max bwd:   scatters dy through the indices with f32 atomics into a zeroed buffer (dx itself
//              for f32, an f32 buffer converted afterwards for bf16/f16). Indices outside the
//              plane, which the CPU op reports, are skipped: a kernel cannot throw without a sync.
//   average:   one thread per output (sum in f32, the CPU's divisor rules); the backward gathers:
//              one thread per input cell sums dy / divisor over the windows that cover it, so no
//              atomics and no zeroing.
//   adaptive:  one thread per output for small windows, a warp per output (shuffle reduction)
//              for large ones (global average pooling); the backward gathers like the average.
// Index arithmetic runs in 32 bits when the element count allows, else in 64 bits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "engine/cuda_exec.h"
#include "ops/cuda_common.cuh"
#include "ops/pooling.h"

namespace strata::ops::cuda {
namespace {

namespace sc = ::strata::cuda;

constexpr int kThreads = 256;

using ::strata::ops::cuda_detail::check_cuda;
using ::strata::ops::cuda_detail::check_float;
using ::strata::ops::cuda_detail::check_shape;
using ::strata::ops::cuda_detail::dispatch_float;
using ::strata::ops::cuda_detail::from_f32;
using ::strata::ops::cuda_detail::to_f32;

struct PoolGeometry {
  int64_t batch = 0, channels = 0, in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int64_t planes() const { return batch * channels; }
  int64_t in_plane() const { return in_h * in_w; }
  int64_t out_plane() const { return out_h * out_w; }
  int64_t in_numel() const { return planes() * in_plane(); }
  int64_t out_numel() const { return planes() * out_plane(); }
};

PoolGeometry plane_geometry(const char* op, const char* name, const Shape& shape) {
  STRATA_CHECK(shape.size() == 4) << op << ": " << name << " must be (B, C, H, W), got "
                                  << shape_str(shape);
  STRATA_CHECK(shape[0] >= 0 && shape[1] > 0 && shape[2] > 0 && shape[3] > 0)
      << op << ": " << name << " " << shape_str(shape)
      << " has an empty channel or spatial dimension";
  PoolGeometry g;
  g.batch = shape[0];
  g.channels = shape[1];
  g.in_h = shape[2];
  g.in_w = shape[3];
  return g;
}

PoolGeometry pool_geometry(const char* op, const char* name, const Shape& shape,
                           const Pool2dParams& p) {
  PoolGeometry g = plane_geometry(op, name, shape);
  STRATA_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1 &&
               p.pad_h >= 0 && p.pad_w >= 0)
      << op << ": need kernel >= 1, stride >= 1 and padding >= 0; got kernel (" << p.kernel_h
      << ", " << p.kernel_w << "), stride (" << p.stride_h << ", " << p.stride_w << "), padding ("
      << p.pad_h << ", " << p.pad_w << ")";
  STRATA_CHECK(2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w)
      << op << ": padding (" << p.pad_h << ", " << p.pad_w << ") must be at most half the kernel ("
      << p.kernel_h << ", " << p.kernel_w << ")";
  STRATA_CHECK(p.kernel_h <= g.in_h + 2 * p.pad_h && p.kernel_w <= g.in_w + 2 * p.pad_w)
      << op << ": kernel (" << p.kernel_h << ", " << p.kernel_w << ") is larger than " << name
      << " " << shape_str(shape) << " padded by (" << p.pad_h << ", " << p.pad_w << ")";
  g.out_h = pool2d_output_size(g.in_h, p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  g.out_w = pool2d_output_size(g.in_w, p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  return g;
}

Shape output_shape(const PoolGeometry& g) { return {g.batch, g.channels, g.out_h, g.out_w}; }

// Kernel-side geometry (plain values, passed by value).
struct PoolArgs {
  int64_t in_h, in_w, out_h, out_w;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

PoolArgs pool_args(const PoolGeometry& g, const Pool2dParams& p) {
  return PoolArgs{g.in_h,     g.in_w,     g.out_h, g.out_w, p.kernel_h,         p.kernel_w,
                  p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.count_include_pad};
}

// True when every index of `numel` elements fits 32-bit arithmetic (with room for the
// grid-stride step).
bool fits_i32(int64_t numel) { return numel < (int64_t{1} << 30); }

// ---- max pooling --------------------------------------------------------------------------------

template <typename T, typename I>
__global__ void max_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                        int64_t* __restrict__ indices, I total, PoolArgs a) {
  const I out_h = static_cast<I>(a.out_h), out_w = static_cast<I>(a.out_w);
  const I in_h = static_cast<I>(a.in_h), in_w = static_cast<I>(a.in_w);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I ow = i % out_w;
    const I t = i / out_w;
    const I oh = t % out_h;
    const I plane = t / out_h;
    const I hs = oh * static_cast<I>(a.sh) - static_cast<I>(a.ph);
    const I ws = ow * static_cast<I>(a.sw) - static_cast<I>(a.pw);
    const I h0 = hs > 0 ? hs : 0, w0 = ws > 0 ? ws : 0;
    const I h1 = min(hs + static_cast<I>(a.kh), in_h), w1 = min(ws + static_cast<I>(a.kw), in_w);
    const T* src = x + static_cast<int64_t>(plane) * in_h * in_w;
    float best = -INFINITY;
    I best_at = h0 * in_w + w0;
    for (I ih = h0; ih < h1; ++ih) {
      const T* row = src + ih * in_w;
      for (I iw = w0; iw < w1; ++iw) {
        const float v = to_f32(row[iw]);
        if (v > best || isnan(v)) {
          best = v;
          best_at = ih * in_w + iw;
        }
      }
    }
    y[i] = from_f32<T>(best);
    indices[i] = static_cast<int64_t>(best_at);
  }
}

// dx_acc[plane, indices[i]] += dy[i] for every output i; out-of-plane indices are skipped.
template <typename T>
__global__ void max_pool_backward_kernel(const T* __restrict__ dy,
                                         const int64_t* __restrict__ indices,
                                         float* __restrict__ dx_acc, int64_t total,
                                         int64_t out_plane, int64_t in_plane) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = indices[i];
    if (at < 0 || at >= in_plane) continue;
    const int64_t plane = i / out_plane;
    atomicAdd(dx_acc + plane * in_plane + at, to_f32(dy[i]));
  }
}

template <typename T>
__global__ void convert_from_f32_kernel(const float* __restrict__ src, T* __restrict__ dst,
                                        int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = from_f32<T>(src[i]);
  }
}

// ---- average pooling ----------------------------------------------------------------------------

// The window of output o along one axis: [begin, end) inside the input and the divisor factor.
struct Span {
  int64_t begin, end, padded;
};
__device__ __forceinline__ Span pool_span(int64_t o, int64_t kernel, int64_t stride, int64_t pad,
                                          int64_t in) {
  const int64_t start = o * stride - pad;
  const int64_t stop = min(start + kernel, in + pad);
  return Span{start > 0 ? start : 0, min(stop, in), stop - start};
}

__device__ __forceinline__ float avg_divisor(const Span& h, const Span& w, bool include_pad) {
  return include_pad ? static_cast<float>(h.padded * w.padded)
                     : static_cast<float>((h.end - h.begin) * (w.end - w.begin));
}

template <typename T, typename I>
__global__ void avg_pool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, I total,
                                        PoolArgs a) {
  const I out_h = static_cast<I>(a.out_h), out_w = static_cast<I>(a.out_w);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I ow = i % out_w;
    const I t = i / out_w;
    const I oh = t % out_h;
    const I plane = t / out_h;
    const Span sh = pool_span(oh, a.kh, a.sh, a.ph, a.in_h);
    const Span sw = pool_span(ow, a.kw, a.sw, a.pw, a.in_w);
    const T* src = x + static_cast<int64_t>(plane) * a.in_h * a.in_w;
    float sum = 0.0f;
    for (int64_t ih = sh.begin; ih < sh.end; ++ih) {
      const T* row = src + ih * a.in_w;
      for (int64_t iw = sw.begin; iw < sw.end; ++iw) sum += to_f32(row[iw]);
    }
    y[i] = from_f32<T>(sum / avg_divisor(sh, sw, a.count_include_pad));
  }
}

// dx[ih, iw] = sum over the windows (oh, ow) covering (ih, iw) of dy[oh, ow] / divisor(oh, ow).
// Window oh covers ih when oh sh - ph <= ih < oh sh - ph + kh.
template <typename T, typename I>
__global__ void avg_pool_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, I total,
                                         PoolArgs a) {
  const I in_h = static_cast<I>(a.in_h), in_w = static_cast<I>(a.in_w);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I iw = i % in_w;
    const I t = i / in_w;
    const I ih = t % in_h;
    const I plane = t / in_h;
    const int64_t ah = static_cast<int64_t>(ih) + a.ph, aw = static_cast<int64_t>(iw) + a.pw;
    const int64_t oh0 = ah < a.kh ? 0 : (ah - a.kh) / a.sh + 1;
    const int64_t oh1 = min(ah / a.sh, a.out_h - 1);  // inclusive
    const int64_t ow0 = aw < a.kw ? 0 : (aw - a.kw) / a.sw + 1;
    const int64_t ow1 = min(aw / a.sw, a.out_w - 1);
    const T* src = dy + static_cast<int64_t>(plane) * a.out_h * a.out_w;
    float sum = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      const Span sh = pool_span(oh, a.kh, a.sh, a.ph, a.in_h);
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const Span sw = pool_span(ow, a.kw, a.sw, a.pw, a.in_w);
        sum += to_f32(src[oh * a.out_w + ow]) / avg_divisor(sh, sw, a.count_include_pad);
      }
    }
    dx[i] = from_f32<T>(sum);
  }
}

// ---- adaptive average pooling -------------------------------------------------------------------

// Output o of `out` averages input [floor(o in / out), ceil((o + 1) in / out)).
__device__ __forceinline__ int64_t adaptive_begin(int64_t o, int64_t out, int64_t in) {
  return o * in / out;
}
__device__ __forceinline__ int64_t adaptive_end(int64_t o, int64_t out, int64_t in) {
  return ((o + 1) * in + out - 1) / out;
}

struct AdaptiveArgs {
  int64_t in_h, in_w, out_h, out_w;
};

template <typename T, typename I>
__global__ void adaptive_forward_kernel(const T* __restrict__ x, T* __restrict__ y, I total,
                                        AdaptiveArgs a) {
  const I out_h = static_cast<I>(a.out_h), out_w = static_cast<I>(a.out_w);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I ow = i % out_w;
    const I t = i / out_w;
    const I oh = t % out_h;
    const I plane = t / out_h;
    const int64_t h0 = adaptive_begin(oh, a.out_h, a.in_h), h1 = adaptive_end(oh, a.out_h, a.in_h);
    const int64_t w0 = adaptive_begin(ow, a.out_w, a.in_w), w1 = adaptive_end(ow, a.out_w, a.in_w);
    const T* src = x + static_cast<int64_t>(plane) * a.in_h * a.in_w;
    float sum = 0.0f;
    for (int64_t ih = h0; ih < h1; ++ih) {
      const T* row = src + ih * a.in_w;
      for (int64_t iw = w0; iw < w1; ++iw) sum += to_f32(row[iw]);
    }
    y[i] = from_f32<T>(sum / static_cast<float>((h1 - h0) * (w1 - w0)));
  }
}

// A warp per output: the lanes stride over the window's cells in row-major order (coalesced
// along rows), then a shuffle reduction.
template <typename T>
__global__ void adaptive_forward_warp_kernel(const T* __restrict__ x, T* __restrict__ y,
                                             int64_t total, AdaptiveArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; i < total;
       i += warps) {
    const int64_t ow = i % a.out_w;
    const int64_t t = i / a.out_w;
    const int64_t oh = t % a.out_h;
    const int64_t plane = t / a.out_h;
    const int64_t h0 = adaptive_begin(oh, a.out_h, a.in_h), h1 = adaptive_end(oh, a.out_h, a.in_h);
    const int64_t w0 = adaptive_begin(ow, a.out_w, a.in_w), w1 = adaptive_end(ow, a.out_w, a.in_w);
    const int rows = static_cast<int>(h1 - h0), cols = static_cast<int>(w1 - w0);
    const int cells = rows * cols;
    const T* src = x + plane * a.in_h * a.in_w + h0 * a.in_w + w0;
    float sum = 0.0f;
    for (int j = lane; j < cells; j += 32) {
      const int r = j / cols, c = j - r * cols;
      sum += to_f32(src[static_cast<int64_t>(r) * a.in_w + c]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    }
    if (lane == 0) y[i] = from_f32<T>(sum / static_cast<float>(cells));
  }
}

// dx[ih, iw] = sum over the outputs (oh, ow) whose windows cover (ih, iw) of dy / window cells.
// Output oh covers ih for oh in [floor(ih OH / H), ceil((ih + 1) OH / H) - 1].
template <typename T, typename I>
__global__ void adaptive_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, I total,
                                         AdaptiveArgs a) {
  const I in_h = static_cast<I>(a.in_h), in_w = static_cast<I>(a.in_w);
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    const I iw = i % in_w;
    const I t = i / in_w;
    const I ih = t % in_h;
    const I plane = t / in_h;
    const int64_t oh0 = static_cast<int64_t>(ih) * a.out_h / a.in_h;
    const int64_t oh1 =
        min((static_cast<int64_t>(ih + 1) * a.out_h + a.in_h - 1) / a.in_h - 1, a.out_h - 1);
    const int64_t ow0 = static_cast<int64_t>(iw) * a.out_w / a.in_w;
    const int64_t ow1 =
        min((static_cast<int64_t>(iw + 1) * a.out_w + a.in_w - 1) / a.in_w - 1, a.out_w - 1);
    const T* src = dy + static_cast<int64_t>(plane) * a.out_h * a.out_w;
    float sum = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      const int64_t rows = adaptive_end(oh, a.out_h, a.in_h) - adaptive_begin(oh, a.out_h, a.in_h);
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const int64_t cols =
            adaptive_end(ow, a.out_w, a.in_w) - adaptive_begin(ow, a.out_w, a.in_w);
        sum += to_f32(src[oh * a.out_w + ow]) / static_cast<float>(rows * cols);
      }
    }
    dx[i] = from_f32<T>(sum);
  }
}

// Launches `kernel` over n elements with 32-bit index arithmetic when both x and y are small
// enough (the geometry g in scope), else 64-bit; `args` in scope is the kernel's geometry.
#define STRATA_POOL_LAUNCH(kernel, T, n, x, ...)                                                \
  do {                                                                                          \
    const unsigned blocks_ = sc::blocks_for((n), kThreads, (x));                                \
    if (fits_i32(g.in_numel()) && fits_i32(g.out_numel())) {                                    \
      kernel<T, int32_t>                                                                        \
          <<<blocks_, kThreads, 0, (x).stream()>>>(__VA_ARGS__, static_cast<int32_t>(n), args); \
    } else {                                                                                    \
      kernel<T, int64_t>                                                                        \
          <<<blocks_, kThreads, 0, (x).stream()>>>(__VA_ARGS__, static_cast<int64_t>(n), args); \
    }                                                                                           \
    STRATA_CUDA_LAUNCH_CHECK(#kernel);                                                          \
  } while (0)

sc::CudaExec& begin_op(const ExecContext& ctx, const char* op) {
  sc::CudaExec& x = sc::exec(ctx, op);
  STRATA_CUDA_CHECK(cudaSetDevice(x.device()));
  return x;
}

}  // namespace

MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  constexpr const char* kOp = "max_pool2d_forward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  check_float(x, ctx, kOp, "x");
  const PoolGeometry g = pool_geometry(kOp, "x", x.shape(), params);
  MaxPool2dResult r;
  r.y = Tensor::empty(output_shape(g), x.dtype(), &ctx.allocator());
  r.indices = Tensor::empty(output_shape(g), DType::kI64, &ctx.allocator());
  const int64_t n = g.out_numel();
  if (n == 0) return r;
  const PoolArgs args = pool_args(g, params);
  dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(r.y.raw_data());
    int64_t* pi = r.indices.data<int64_t>();
    STRATA_POOL_LAUNCH(max_pool_forward_kernel, T, n, ex, px, py, pi);
  });
  return r;
}

Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices,
                           const Shape& x_shape) {
  constexpr const char* kOp = "max_pool2d_backward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  PoolGeometry g = plane_geometry(kOp, "x_shape", x_shape);
  check_float(dy, ctx, kOp, "dy");
  check_cuda(indices, ctx, kOp, "indices");
  STRATA_CHECK(indices.dtype() == DType::kI64)
      << kOp << ": indices must be i64, got " << dtype_name(indices.dtype());
  STRATA_CHECK(dy.dim() == 4 && dy.size(0) == g.batch && dy.size(1) == g.channels)
      << kOp << ": dy " << dy.shape_str() << " must be (B, C, OH, OW) for x_shape "
      << shape_str(x_shape);
  check_shape(indices, dy.shape(), kOp, "indices");
  g.out_h = dy.size(2);
  g.out_w = dy.size(3);
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), &ctx.allocator());
  const int64_t in_numel = g.in_numel();
  if (in_numel == 0) return dx;
  const int64_t n = g.out_numel();
  // f32 accumulates in dx itself; bf16/f16 in an f32 buffer converted at the end.
  Tensor acc =
      dy.dtype() == DType::kF32 ? dx : Tensor::empty(x_shape, DType::kF32, &ctx.allocator());
  float* pacc = acc.data<float>();
  STRATA_CUDA_CHECK(
      cudaMemsetAsync(pacc, 0, static_cast<size_t>(in_numel) * sizeof(float), ex.stream()));
  dispatch_float(dy.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = static_cast<const T*>(dy.raw_data());
    if (n > 0) {
      max_pool_backward_kernel<T><<<sc::blocks_for(n, kThreads, ex), kThreads, 0, ex.stream()>>>(
          pdy, indices.data<int64_t>(), pacc, n, g.out_plane(), g.in_plane());
      STRATA_CUDA_LAUNCH_CHECK("max_pool_backward_kernel");
    }
    if constexpr (!std::is_same_v<T, float>) {
      convert_from_f32_kernel<T>
          <<<sc::blocks_for(in_numel, kThreads, ex), kThreads, 0, ex.stream()>>>(
              pacc, static_cast<T*>(dx.raw_data()), in_numel);
      STRATA_CUDA_LAUNCH_CHECK("convert_from_f32_kernel");
    }
  });
  return dx;
}

Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  constexpr const char* kOp = "avg_pool2d_forward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  check_float(x, ctx, kOp, "x");
  const PoolGeometry g = pool_geometry(kOp, "x", x.shape(), params);
  Tensor y = Tensor::empty(output_shape(g), x.dtype(), &ctx.allocator());
  const int64_t n = g.out_numel();
  if (n == 0) return y;
  const PoolArgs args = pool_args(g, params);
  dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    STRATA_POOL_LAUNCH(avg_pool_forward_kernel, T, n, ex, static_cast<const T*>(x.raw_data()),
                       static_cast<T*>(y.raw_data()));
  });
  return y;
}

Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape,
                           const Pool2dParams& params) {
  constexpr const char* kOp = "avg_pool2d_backward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  const PoolGeometry g = pool_geometry(kOp, "x_shape", x_shape, params);
  check_float(dy, ctx, kOp, "dy");
  check_shape(dy, output_shape(g), kOp, "dy");
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), &ctx.allocator());
  const int64_t n = g.in_numel();
  if (n == 0) return dx;
  const PoolArgs args = pool_args(g, params);
  dispatch_float(dy.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    STRATA_POOL_LAUNCH(avg_pool_backward_kernel, T, n, ex, static_cast<const T*>(dy.raw_data()),
                       static_cast<T*>(dx.raw_data()));
  });
  return dx;
}

Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h,
                                   int64_t out_w) {
  constexpr const char* kOp = "adaptive_avg_pool2d_forward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  check_float(x, ctx, kOp, "x");
  PoolGeometry g = plane_geometry(kOp, "x", x.shape());
  STRATA_CHECK(out_h >= 1 && out_w >= 1)
      << kOp << ": output size (" << out_h << ", " << out_w << ") must be positive";
  g.out_h = out_h;
  g.out_w = out_w;
  Tensor y = Tensor::empty(output_shape(g), x.dtype(), &ctx.allocator());
  const int64_t n = g.out_numel();
  if (n == 0) return y;
  const AdaptiveArgs args{g.in_h, g.in_w, g.out_h, g.out_w};
  // The largest window: ceil(in / out) + 1 cells per axis at most.
  const int64_t max_cells =
      ((g.in_h + g.out_h - 1) / g.out_h + 1) * ((g.in_w + g.out_w - 1) / g.out_w + 1);
  dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    if (max_cells >= 64 && max_cells < (int64_t{1} << 30)) {
      const int64_t warps_per_block = kThreads / 32;
      const int64_t needed = (n + warps_per_block - 1) / warps_per_block;
      const int64_t cap = static_cast<int64_t>(ex.sm_count() > 0 ? ex.sm_count() : 80) * 32;
      const unsigned blocks = static_cast<unsigned>(needed < cap ? needed : cap);
      adaptive_forward_warp_kernel<T><<<blocks, kThreads, 0, ex.stream()>>>(px, py, n, args);
      STRATA_CUDA_LAUNCH_CHECK("adaptive_forward_warp_kernel");
      return;
    }
    STRATA_POOL_LAUNCH(adaptive_forward_kernel, T, n, ex, px, py);
  });
  return y;
}

Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape) {
  constexpr const char* kOp = "adaptive_avg_pool2d_backward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  PoolGeometry g = plane_geometry(kOp, "x_shape", x_shape);
  check_float(dy, ctx, kOp, "dy");
  STRATA_CHECK(dy.dim() == 4 && dy.size(0) == g.batch && dy.size(1) == g.channels &&
               dy.size(2) >= 1 && dy.size(3) >= 1)
      << kOp << ": dy " << dy.shape_str() << " must be (B, C, OH, OW) for x_shape "
      << shape_str(x_shape);
  g.out_h = dy.size(2);
  g.out_w = dy.size(3);
  Tensor dx = Tensor::empty(x_shape, dy.dtype(), &ctx.allocator());
  const int64_t n = g.in_numel();
  if (n == 0) return dx;
  const AdaptiveArgs args{g.in_h, g.in_w, g.out_h, g.out_w};
  dispatch_float(dy.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    STRATA_POOL_LAUNCH(adaptive_backward_kernel, T, n, ex, static_cast<const T*>(dy.raw_data()),
                       static_cast<T*>(dx.raw_data()));
  });
  return dx;
}

}  // namespace strata::ops::cuda
