// 2-D convolution on CUDA through cuDNN's (deprecated in cuDNN 9, still present) legacy API, in
// NHWC (channels-last, ops/layout.h), f32, bf16 and f16 with f32 accumulation (compute type
// CUDNN_DATA_FLOAT). Tensor-core kernels read NHWC; NCHW would make cuDNN transpose every call.
//
//   layout    x and dy are taken in either layout (an NCHW one is converted to channels-last
//             first); y and dx are channels-last, so consecutive convolutions, batch norms,
//             ReLUs and residual adds pass NHWC activations along without converting (the other
//             ops get NCHW copies, ops/dispatch.cpp). The weight stays (OC, C, KH, KW), the
//             checkpoint and exchange layout, and is permuted to (OC, KH, KW, C) for each call;
//             its gradient is computed in that layout and added back permuted.
//   forward   cudnnConvolutionForward (beta 0), then a kernel adds the bias;
//   backward  cudnnConvolutionBackwardData (beta 0) for dx, cudnnConvolutionBackwardFilter into
//             a (OC, KH, KW, C) gradient, then dweight += it permuted; dbias += the column sums
//             of dy's (B OH OW, OC) rows (sum_to_shape).
//
// Algorithms: found once per (device, dtype, math mode, shapes, parameters, direction) with
// cudnnFind...AlgorithmEx, which times the candidates on the call's own buffers (the first call of
// a shape is slower, the later ones take the measured fastest), keeping the fastest whose
// workspace fits kWorkspaceLimit, cached in a process-wide map. When the search's workspace does
// not fit the memory limit, cuDNN's heuristics choose instead (cudnnGet..._v7, nothing run).
// f32 under MathMode::kFp32 keeps full-precision FMA kernels (CUDNN_FMA_MATH, no TF32);
// MathMode::kTf32 lets cuDNN use TF32 tensor cores; bf16/f16 use tensor cores. Workspaces come
// from the context's caching allocator. Batches whose tensors pass cuDNN's 32-bit sizes are split
// into chunks of images (the weight gradient accumulates over them).
//
// Without cuDNN (STRATA_WITH_CUDNN undefined) both ops throw.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "engine/cuda_exec.h"
#include "ops/conv2d.h"
#include "ops/cuda_common.cuh"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/shape_ops.h"

#ifdef STRATA_WITH_CUDNN
// The legacy convolution API is deprecated in cuDNN 9; these calls are what this file is for.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#pragma nv_diag_suppress 1444
#pragma nv_diag_suppress 1215
#endif

namespace strata::ops::cuda {

#ifdef STRATA_WITH_CUDNN

namespace {

namespace sc = ::strata::cuda;

constexpr int kThreads = 256;
// Largest cuDNN workspace an algorithm may ask for.
constexpr size_t kWorkspaceLimit = size_t{512} << 20;

using ::strata::ops::cuda_detail::check_float;
using ::strata::ops::cuda_detail::check_on_device;
using ::strata::ops::cuda_detail::check_same_dtype;
using ::strata::ops::cuda_detail::check_shape;
using ::strata::ops::cuda_detail::dispatch_float;
using ::strata::ops::cuda_detail::from_f32;
using ::strata::ops::cuda_detail::is_cuda_float;
using ::strata::ops::cuda_detail::to_f32;

// ---- bias -------------------------------------------------------------------------------------

// y[i] += bias[i mod OC]: y channels-last, its memory (B OH OW, OC) rows.
template <typename T, typename I>
__global__ void add_bias_nhwc_kernel(T* __restrict__ y, const T* __restrict__ bias, I total,
                                     I channels) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    y[i] = from_f32<T>(to_f32(y[i]) + to_f32(bias[i % channels]));
  }
}

struct ConvGeometry {
  int64_t batch = 0, in_c = 0, in_h = 0, in_w = 0;
  int64_t out_c = 0, in_c_g = 0, k_h = 0, k_w = 0, out_h = 0, out_w = 0;
  Conv2dParams p;
  int64_t in_image() const { return in_c * in_h * in_w; }
  int64_t out_image() const { return out_c * out_h * out_w; }
};

// The CPU op's checks (ops/conv2d_cpu.cpp), with CUDA placement and dtypes.
// An image argument (x, dy): on the device, f32/bf16/f16, NCHW or channels-last.
void check_image(const ExecContext& ctx, const char* op, const Tensor& t, const char* name) {
  check_on_device(t, ctx, op, name);
  STRATA_CHECK(is_cuda_float(t.dtype()))
      << op << ": " << name << " " << t.shape_str() << " must be f32, bf16 or f16 on CUDA, got "
      << dtype_name(t.dtype());
  STRATA_CHECK(t.is_contiguous() || ops::is_channels_last(t))
      << op << ": " << name << " " << t.str() << " must be NCHW or channels-last (NHWC)";
}

ConvGeometry conv_geometry(const ExecContext& ctx, const char* op, const Tensor& x,
                           const Tensor& weight, const Conv2dParams& p) {
  check_image(ctx, op, x, "x");
  check_float(weight, ctx, op, "weight");
  check_same_dtype(x, weight, op, "x", "weight");
  STRATA_CHECK(x.dim() == 4) << op << ": x must be (B, C, H, W), got " << x.shape_str();
  STRATA_CHECK(weight.dim() == 4) << op << ": weight must be (OC, C / groups, KH, KW), got "
                                  << weight.shape_str();
  STRATA_CHECK(p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1 &&
               p.pad_h >= 0 && p.pad_w >= 0 && p.groups >= 1)
      << op << ": need stride >= 1, dilation >= 1, padding >= 0 and groups >= 1; got stride ("
      << p.stride_h << ", " << p.stride_w << "), dilation (" << p.dilation_h << ", " << p.dilation_w
      << "), padding (" << p.pad_h << ", " << p.pad_w << "), groups " << p.groups;
  ConvGeometry g;
  g.p = p;
  g.batch = x.size(0);
  g.in_c = x.size(1);
  g.in_h = x.size(2);
  g.in_w = x.size(3);
  g.out_c = weight.size(0);
  g.in_c_g = weight.size(1);
  g.k_h = weight.size(2);
  g.k_w = weight.size(3);
  STRATA_CHECK(g.in_c > 0 && g.in_h > 0 && g.in_w > 0)
      << op << ": x " << x.shape_str() << " has an empty channel or spatial dimension";
  STRATA_CHECK(g.out_c > 0 && g.in_c_g > 0 && g.k_h > 0 && g.k_w > 0)
      << op << ": weight " << weight.shape_str() << " has an empty dimension";
  STRATA_CHECK(g.in_c % p.groups == 0 && g.out_c % p.groups == 0)
      << op << ": groups " << p.groups << " must divide both x's channels (" << g.in_c
      << ") and weight's output channels (" << g.out_c << ")";
  STRATA_CHECK_EQ(g.in_c_g * p.groups, g.in_c)
      << op << ": weight " << weight.shape_str() << " with groups " << p.groups << " takes "
      << g.in_c_g * p.groups << " input channels, but x " << x.shape_str() << " has " << g.in_c;
  const int64_t span_h = p.dilation_h * (g.k_h - 1) + 1;
  const int64_t span_w = p.dilation_w * (g.k_w - 1) + 1;
  STRATA_CHECK(span_h <= g.in_h + 2 * p.pad_h && span_w <= g.in_w + 2 * p.pad_w)
      << op << ": weight " << weight.shape_str() << " with dilation (" << p.dilation_h << ", "
      << p.dilation_w << ") spans " << span_h << " x " << span_w << ", larger than x "
      << x.shape_str() << " padded by (" << p.pad_h << ", " << p.pad_w << ")";
  g.out_h = conv2d_output_size(g.in_h, g.k_h, p.stride_h, p.pad_h, p.dilation_h);
  g.out_w = conv2d_output_size(g.in_w, g.k_w, p.stride_w, p.pad_w, p.dilation_w);
  // cuDNN's legacy descriptors take int sizes and strides.
  const int64_t params[] = {g.in_c,   g.in_h,       g.in_w,       g.out_c,       g.k_h,
                            g.k_w,    p.stride_h,   p.stride_w,   p.pad_h,       p.pad_w,
                            p.groups, p.dilation_h, p.dilation_w, weight.numel()};
  for (int64_t v : params) {
    STRATA_CHECK_LE(v, INT_MAX) << op << ": x " << x.shape_str() << " / weight "
                                << weight.shape_str() << " has a size or parameter past cuDNN's "
                                << "32-bit limit";
  }
  STRATA_CHECK(g.in_image() <= INT_MAX && g.out_image() <= INT_MAX)
      << op << ": one image of x " << x.shape_str() << " or of the output (" << g.out_c << ", "
      << g.out_h << ", " << g.out_w << ") has more than 2^31 - 1 elements (cuDNN's limit)";
  return g;
}

// Images per cuDNN call: every tensor of a call stays within 2^31 - 1 elements.
int64_t images_per_call(const ConvGeometry& g) {
  const int64_t per_image = std::max<int64_t>(g.in_image(), g.out_image());
  return std::clamp<int64_t>(INT_MAX / per_image, 1, std::max<int64_t>(g.batch, 1));
}

cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    default:
      STRATA_THROW() << "conv2d: no cuDNN type for " << dtype_name(dtype);
  }
}

// ---- descriptors ------------------------------------------------------------------------------

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(cudnnDataType_t dtype, int64_t n, int64_t c, int64_t h, int64_t w) {
    STRATA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    STRATA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NHWC, dtype, static_cast<int>(n),
                                                  static_cast<int>(c), static_cast<int>(h),
                                                  static_cast<int>(w)));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(cudnnDataType_t dtype, const ConvGeometry& g) {
    STRATA_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    STRATA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
        d, dtype, CUDNN_TENSOR_NHWC, static_cast<int>(g.out_c), static_cast<int>(g.in_c_g),
        static_cast<int>(g.k_h), static_cast<int>(g.k_w)));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(const ConvGeometry& g, cudnnMathType_t math) {
    STRATA_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    const Conv2dParams& p = g.p;
    STRATA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        d, static_cast<int>(p.pad_h), static_cast<int>(p.pad_w), static_cast<int>(p.stride_h),
        static_cast<int>(p.stride_w), static_cast<int>(p.dilation_h),
        static_cast<int>(p.dilation_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    STRATA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, static_cast<int>(p.groups)));
    STRATA_CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// The descriptors of one cuDNN call over `nb` images.
struct CallDescs {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  CallDescs(const ConvGeometry& g, cudnnDataType_t dtype, int64_t nb, cudnnMathType_t math)
      : x(dtype, nb, g.in_c, g.in_h, g.in_w),
        y(dtype, nb, g.out_c, g.out_h, g.out_w),
        w(dtype, g),
        conv(g, math) {}
};

// ---- algorithm choice and cache -----------------------------------------------------------------

enum class Direction { kForward = 0, kBackwardData = 1, kBackwardFilter = 2 };

struct AlgoChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

using AlgoKey = std::array<int64_t, 20>;

// The math type requested for a dtype under the context's math mode, and whether a result's
// math type is acceptable (f32 without TF32 takes FMA kernels only).
cudnnMathType_t requested_math(DType dtype, sc::MathMode mode) {
  if (dtype != DType::kF32) return CUDNN_TENSOR_OP_MATH;
  return mode == sc::MathMode::kTf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
}
bool math_allowed(DType dtype, sc::MathMode mode, cudnnMathType_t math) {
  if (dtype == DType::kF32 && mode == sc::MathMode::kFp32) return math == CUDNN_FMA_MATH;
  return true;
}

AlgoKey algo_key(const sc::CudaExec& ex, const ConvGeometry& g, DType dtype, int64_t nb,
                 Direction dir) {
  const Conv2dParams& p = g.p;
  return AlgoKey{ex.device(),
                 static_cast<int64_t>(dtype),
                 static_cast<int64_t>(ex.math_mode()),
                 static_cast<int64_t>(dir),
                 nb,
                 g.in_c,
                 g.in_h,
                 g.in_w,
                 g.out_c,
                 g.k_h,
                 g.k_w,
                 p.stride_h,
                 p.stride_w,
                 p.pad_h,
                 p.pad_w,
                 p.dilation_h,
                 p.dilation_w,
                 p.groups,
                 0,
                 0};
}

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<AlgoKey, AlgoChoice>& algo_cache() {
  static std::map<AlgoKey, AlgoChoice> cache;
  return cache;
}

// Picks the first heuristic result that succeeded, has an allowed math type and fits the
// workspace limit; `fallback` (an algorithm every configuration supports) otherwise.
template <typename Perf, typename GetWorkspace>
AlgoChoice pick(const std::vector<Perf>& perfs, int returned, DType dtype, sc::MathMode mode,
                int fallback, cudnnMathType_t fallback_math, GetWorkspace&& get_workspace) {
  for (int i = 0; i < returned; ++i) {
    const Perf& r = perfs[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kWorkspaceLimit) continue;
    if (!math_allowed(dtype, mode, r.mathType)) continue;
    return AlgoChoice{static_cast<int>(r.algo), r.mathType, r.memory};
  }
  AlgoChoice c;
  c.algo = fallback;
  c.math = fallback_math;
  c.workspace = get_workspace(fallback);
  return c;
}

// cuDNN's heuristics (nothing run): when the search below has no room for its workspace.
AlgoChoice heuristic_algo(sc::CudaExec& ex, const ConvGeometry& g, DType dtype, int64_t nb,
                          Direction dir) {
  const sc::MathMode mode = ex.math_mode();
  const cudnnMathType_t math = requested_math(dtype, mode);
  CallDescs d(g, cudnn_dtype(dtype), nb, math);
  cudnnHandle_t h = ex.cudnn();
  AlgoChoice choice;
  int count = 0, returned = 0;
  switch (dir) {
    case Direction::kForward: {
      STRATA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(std::max(count, 1));
      STRATA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.d, d.w.d, d.conv.d, d.y.d,
                                                                static_cast<int>(perfs.size()),
                                                                &returned, perfs.data()));
      choice = pick(perfs, returned, dtype, mode, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, math,
                    [&](int algo) {
                      size_t bytes = 0;
                      STRATA_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
                          h, d.x.d, d.w.d, d.conv.d, d.y.d,
                          static_cast<cudnnConvolutionFwdAlgo_t>(algo), &bytes));
                      return bytes;
                    });
      break;
    }
    case Direction::kBackwardData: {
      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(std::max(count, 1));
      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          h, d.w.d, d.y.d, d.conv.d, d.x.d, static_cast<int>(perfs.size()), &returned,
          perfs.data()));
      choice = pick(perfs, returned, dtype, mode, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, math,
                    [&](int algo) {
                      size_t bytes = 0;
                      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
                          h, d.w.d, d.y.d, d.conv.d, d.x.d,
                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), &bytes));
                      return bytes;
                    });
      break;
    }
    case Direction::kBackwardFilter: {
      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(std::max(count, 1));
      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          h, d.x.d, d.y.d, d.conv.d, d.w.d, static_cast<int>(perfs.size()), &returned,
          perfs.data()));
      choice = pick(perfs, returned, dtype, mode, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, math,
                    [&](int algo) {
                      size_t bytes = 0;
                      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
                          h, d.x.d, d.y.d, d.conv.d, d.w.d,
                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), &bytes));
                      return bytes;
                    });
      break;
    }
  }
  return choice;
}

// The buffers of one call, which the search runs the candidate algorithms on (it writes the
// call's output, which the call itself then overwrites).
struct CallBuffers {
  const void* x = nullptr;   // forward, backward filter
  const void* w = nullptr;   // forward, backward data
  const void* dy = nullptr;  // backward
  void* out = nullptr;       // y, dx or the weight gradient
};

// Times the candidates with cudnnFind...AlgorithmEx (see the top); throws OutOfMemoryError when
// its workspace does not fit.
AlgoChoice found_algo(ExecContext& ctx, sc::CudaExec& ex, const ConvGeometry& g, DType dtype,
                      int64_t nb, Direction dir, const CallBuffers& b) {
  const sc::MathMode mode = ex.math_mode();
  const cudnnMathType_t math = requested_math(dtype, mode);
  CallDescs d(g, cudnn_dtype(dtype), nb, math);
  cudnnHandle_t h = ex.cudnn();
  const Tensor workspace = sc::scratch(ctx, kWorkspaceLimit, "cuDNN algorithm search workspace");
  void* ws = workspace.raw_data();
  int count = 0, returned = 0;
  auto none = [](int) { return size_t{0}; };  // algo -1: nothing usable was timed
  switch (dir) {
    case Direction::kForward: {
      STRATA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perfs(std::max(count, 1));
      STRATA_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
          h, d.x.d, b.x, d.w.d, b.w, d.conv.d, d.y.d, b.out, static_cast<int>(perfs.size()),
          &returned, perfs.data(), ws, kWorkspaceLimit));
      return pick(perfs, returned, dtype, mode, -1, math, none);
    }
    case Direction::kBackwardData: {
      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perfs(std::max(count, 1));
      STRATA_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, d.w.d, b.w, d.y.d, b.dy, d.conv.d, d.x.d, b.out, static_cast<int>(perfs.size()),
          &returned, perfs.data(), ws, kWorkspaceLimit));
      return pick(perfs, returned, dtype, mode, -1, math, none);
    }
    case Direction::kBackwardFilter: {
      STRATA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perfs(std::max(count, 1));
      STRATA_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, d.x.d, b.x, d.y.d, b.dy, d.conv.d, d.w.d, b.out, static_cast<int>(perfs.size()),
          &returned, perfs.data(), ws, kWorkspaceLimit));
      return pick(perfs, returned, dtype, mode, -1, math, none);
    }
  }
  return AlgoChoice{};
}

// The cached choice for this key, or (never searched) cuDNN's heuristics, cached too.
AlgoChoice heuristic_or_cached(sc::CudaExec& ex, const ConvGeometry& g, DType dtype, int64_t nb,
                               Direction dir) {
  const AlgoKey key = algo_key(ex, g, dtype, nb, dir);
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = algo_cache().find(key);
  if (it != algo_cache().end()) return it->second;
  const AlgoChoice choice = heuristic_algo(ex, g, dtype, nb, dir);
  algo_cache()[key] = choice;
  return choice;
}

// The cached choice for this call's key, found on the first call of the key.
AlgoChoice choose_algo(ExecContext& ctx, sc::CudaExec& ex, const ConvGeometry& g, DType dtype,
                       int64_t nb, Direction dir, const CallBuffers& b) {
  const AlgoKey key = algo_key(ex, g, dtype, nb, dir);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = algo_cache().find(key);
    if (it != algo_cache().end()) return it->second;
  }
  AlgoChoice choice;
  try {
    choice = found_algo(ctx, ex, g, dtype, nb, dir, b);
  } catch (const OutOfMemoryError&) {  // no room for the search's workspace
    choice.algo = -1;
  }
  if (choice.algo < 0) choice = heuristic_algo(ex, g, dtype, nb, dir);
  std::lock_guard<std::mutex> lock(cache_mutex());
  algo_cache()[key] = choice;
  return choice;
}

sc::CudaExec& begin_op(const ExecContext& ctx, const char* op) {
  sc::CudaExec& x = sc::exec(ctx, op);
  STRATA_CUDA_CHECK(cudaSetDevice(x.device()));
  return x;
}

}  // namespace

Tensor conv2d_forward(ExecContext& ctx, const Tensor& x_in, const Tensor& weight,
                      const Tensor& bias, const Conv2dParams& params) {
  constexpr const char* kOp = "conv2d_forward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  const ConvGeometry g = conv_geometry(ctx, kOp, x_in, weight, params);
  if (bias.defined()) {
    check_float(bias, ctx, kOp, "bias");
    check_same_dtype(x_in, bias, kOp, "x", "bias");
    check_shape(bias, {g.out_c}, kOp, "bias");
  }
  Tensor y = empty_channels_last(ctx, {g.batch, g.out_c, g.out_h, g.out_w}, x_in.dtype());
  if (g.batch == 0) return y;
  const Tensor x = to_channels_last(ctx, x_in);
  const Tensor w = cuda::permute_copy(ctx, weight, {0, 2, 3, 1});  // (OC, KH, KW, C / groups)
  const cudnnDataType_t dtype = cudnn_dtype(x.dtype());
  const int64_t nb_max = images_per_call(g);
  const size_t elem = x.element_size();
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t b0 = 0; b0 < g.batch; b0 += nb_max) {
    const int64_t nb = std::min(nb_max, g.batch - b0);
    const char* px = static_cast<const char*>(x.raw_data()) + b0 * g.in_image() * elem;
    char* py = static_cast<char*>(y.raw_data()) + b0 * g.out_image() * elem;
    CallBuffers buffers;
    buffers.x = px;
    buffers.w = w.raw_data();
    buffers.out = py;
    const AlgoChoice c = choose_algo(ctx, ex, g, x.dtype(), nb, Direction::kForward, buffers);
    CallDescs d(g, dtype, nb, c.math);
    const Tensor workspace =
        c.workspace > 0 ? sc::scratch(ctx, c.workspace, "cuDNN convolution workspace") : Tensor();
    void* ws = workspace.defined() ? workspace.raw_data() : nullptr;
    STRATA_CUDNN_CHECK(cudnnConvolutionForward(
        ex.cudnn(), &alpha, d.x.d, px, d.w.d, w.raw_data(), d.conv.d,
        static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws, c.workspace, &beta, d.y.d, py));
  }
  if (bias.defined()) {
    dispatch_float(x.dtype(), kOp, [&](auto tag) {
      using T = decltype(tag);
      T* py = static_cast<T*>(y.raw_data());
      const T* pb = static_cast<const T*>(bias.raw_data());
      const int64_t total = y.numel();
      const unsigned blocks = sc::blocks_for(total, kThreads, ex);
      if (total < (int64_t{1} << 30)) {
        add_bias_nhwc_kernel<T, int32_t><<<blocks, kThreads, 0, ex.stream()>>>(
            py, pb, static_cast<int32_t>(total), static_cast<int32_t>(g.out_c));
      } else {
        add_bias_nhwc_kernel<T, int64_t>
            <<<blocks, kThreads, 0, ex.stream()>>>(py, pb, total, g.out_c);
      }
      STRATA_CUDA_LAUNCH_CHECK("add_bias_nhwc_kernel");
    });
  }
  return y;
}

Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy_in, const Tensor& x_in,
                       const Tensor& weight, const Conv2dParams& params, const Tensor& dweight,
                       const Tensor& dbias, bool need_dx) {
  constexpr const char* kOp = "conv2d_backward";
  sc::CudaExec& ex = begin_op(ctx, kOp);
  const ConvGeometry g = conv_geometry(ctx, kOp, x_in, weight, params);
  check_image(ctx, kOp, dy_in, "dy");
  check_same_dtype(x_in, dy_in, kOp, "x", "dy");
  STRATA_CHECK(dy_in.shape() == (Shape{g.batch, g.out_c, g.out_h, g.out_w}))
      << kOp << ": dy " << dy_in.shape_str() << " must be (" << g.batch << ", " << g.out_c << ", "
      << g.out_h << ", " << g.out_w << ")";
  if (dweight.defined()) {
    check_float(dweight, ctx, kOp, "dweight");
    check_same_dtype(x_in, dweight, kOp, "x", "dweight");
    check_shape(dweight, weight.shape(), kOp, "dweight");
  }
  if (dbias.defined()) {
    check_float(dbias, ctx, kOp, "dbias");
    check_same_dtype(x_in, dbias, kOp, "x", "dbias");
    check_shape(dbias, {g.out_c}, kOp, "dbias");
  }
  Tensor dx;
  if (need_dx) dx = empty_channels_last(ctx, x_in.shape(), x_in.dtype());
  if (g.batch == 0) return dx;
  const Tensor dy = to_channels_last(ctx, dy_in);
  if (dbias.defined()) {  // the column sums of dy's (B OH OW, OC) rows
    const Tensor rows = detail::nhwc_view(dy).view({-1, g.out_c});
    cuda::add_(ctx, dbias, cuda::sum_to_shape(ctx, rows, {g.out_c}), 1.0);
  }
  if (!need_dx && !dweight.defined()) return dx;
  const Tensor x = dweight.defined() ? to_channels_last(ctx, x_in) : Tensor();
  const Tensor w = cuda::permute_copy(ctx, weight, {0, 2, 3, 1});  // (OC, KH, KW, C / groups)
  Tensor dw;  // the weight gradient in w's layout, over every chunk
  if (dweight.defined()) dw = Tensor::empty(w.shape(), w.dtype(), &ctx.allocator());
  const cudnnDataType_t dtype = cudnn_dtype(x_in.dtype());
  const int64_t nb_max = images_per_call(g);
  const size_t elem = x_in.element_size();
  const float one = 1.0f, zero = 0.0f;
  for (int64_t b0 = 0; b0 < g.batch; b0 += nb_max) {
    const int64_t nb = std::min(nb_max, g.batch - b0);
    const char* pdy = static_cast<const char*>(dy.raw_data()) + b0 * g.out_image() * elem;
    if (dweight.defined()) {
      const char* px = static_cast<const char*>(x.raw_data()) + b0 * g.in_image() * elem;
      CallBuffers buffers;
      buffers.x = px;
      buffers.dy = pdy;
      buffers.out = dw.raw_data();
      // The search writes dw: it runs on the first chunk only, before dw holds anything.
      const AlgoChoice a =
          b0 == 0 ? choose_algo(ctx, ex, g, x_in.dtype(), nb, Direction::kBackwardFilter, buffers)
                  : heuristic_or_cached(ex, g, x_in.dtype(), nb, Direction::kBackwardFilter);
      const Tensor workspace =
          a.workspace > 0 ? sc::scratch(ctx, a.workspace, "cuDNN convolution workspace") : Tensor();
      CallDescs d(g, dtype, nb, a.math);
      const float* beta = b0 == 0 ? &zero : &one;  // accumulate over the chunks
      STRATA_CUDNN_CHECK(
          cudnnConvolutionBackwardFilter(ex.cudnn(), &one, d.x.d, px, d.y.d, pdy, d.conv.d,
                                         static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
                                         workspace.defined() ? workspace.raw_data() : nullptr,
                                         a.workspace, beta, d.w.d, dw.raw_data()));
    }
    if (need_dx) {
      char* pdx = static_cast<char*>(dx.raw_data()) + b0 * g.in_image() * elem;
      CallBuffers buffers;
      buffers.w = w.raw_data();
      buffers.dy = pdy;
      buffers.out = pdx;
      const AlgoChoice a =
          choose_algo(ctx, ex, g, x_in.dtype(), nb, Direction::kBackwardData, buffers);
      const Tensor workspace =
          a.workspace > 0 ? sc::scratch(ctx, a.workspace, "cuDNN convolution workspace") : Tensor();
      CallDescs d(g, dtype, nb, a.math);
      STRATA_CUDNN_CHECK(cudnnConvolutionBackwardData(
          ex.cudnn(), &one, d.w.d, w.raw_data(), d.y.d, pdy, d.conv.d,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo),
          workspace.defined() ? workspace.raw_data() : nullptr, a.workspace, &zero, d.x.d, pdx));
    }
  }
  // dweight += the gradient, back in (OC, C / groups, KH, KW).
  if (dweight.defined()) cuda::add_(ctx, dweight, cuda::permute_copy(ctx, dw, {0, 3, 1, 2}), 1.0);
  return dx;
}

#else  // no cuDNN

Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& params) {
  STRATA_THROW() << "conv2d_forward: this build has no cuDNN, which the CUDA convolution needs "
                    "(rebuild with cuDNN found, or run the op on the CPU)";
}

Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias,
                       bool need_dx) {
  STRATA_THROW() << "conv2d_backward: this build has no cuDNN, which the CUDA convolution needs "
                    "(rebuild with cuDNN found, or run the op on the CPU)";
}

#endif  // STRATA_WITH_CUDNN

}  // namespace strata::ops::cuda

#ifdef STRATA_WITH_CUDNN
#pragma GCC diagnostic pop
#endif
