// Cross-entropy fused with log-softmax on CUDA (the CPU version, cross_entropy_cpu.cpp, is the
// specification).
//
// One group of threads per row (a warp for V <= 1024, a block of 128..1024 threads above) reads
// the row once with 16-byte loads and keeps an online log-sum-exp in f32 (running maximum m and
// s = sum exp(x - m), rescaled when the maximum grows), plus sum_j x_j when label smoothing is on;
// the partial states are merged with warp shuffles and, across warps, through shared memory. Then
//   loss_i = m + log s - (1 - eps) x_t - (eps / V) sum_j x_j
// is formed in double and stored per row; one block adds the rows in a fixed order in double and
// counts the targets that are not ignored, so the loss is deterministic and needs no host value
// (no synchronization). The backward recomputes m and s (first read of the row), then writes
//   dlogits_ij = dloss / normalizer * (exp(x_ij - lse_i) - eps / V - (j == t) (1 - eps))
// on a second read of the row (from L2 for all but huge rows); ignored rows get 0. When
// options.normalizer is 0 a one-block kernel counts the targets first, on the device.
//
// A padded vocabulary (options.num_classes < the logits' columns): rows are num_classes logits
// read with the row stride of the full width; the padding takes no part in the loss and gets a
// zero gradient.
//
// Targets are checked on the device: a target outside [0, V) that is not ignore_index prints the
// op, the row and the value, and traps (the context is unusable afterwards, as after PyTorch's
// device-side asserts); checking on the host would need a synchronization per call.
#include <cmath>
#include <cstdio>

#include "ops/cross_entropy.h"
#include "ops/loss_cuda_common.cuh"

namespace strata::ops::cuda {
namespace {

using namespace ::strata::ops::cuda_detail;

constexpr int kFinishThreads = 1024;

struct Dims {
  int64_t n = 0, v = 0;  // rows, classes counted
  int64_t stride = 0;    // logits per row (v plus the padding)
};

Dims check_cross_entropy(const ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                         const CrossEntropyOptions& options, const char* op) {
  check_float(logits, ctx, op, "logits");
  STRATA_CHECK_EQ(logits.dim(), 2) << op << ": logits must be (N, V), got " << logits.shape_str();
  Dims d;
  d.n = logits.size(0);
  d.stride = logits.size(1);
  STRATA_CHECK(options.num_classes >= 0 && options.num_classes <= d.stride)
      << op << ": options.num_classes " << options.num_classes << " must be in [0, " << d.stride
      << "] for logits " << logits.shape_str();
  d.v = options.num_classes > 0 ? options.num_classes : d.stride;
  STRATA_CHECK_GE(d.v, 1) << op << ": logits " << logits.shape_str() << " has no classes";
  check_index(targets, ctx, op, "targets");
  check_shape(targets, {d.n}, op, "targets");
  const double eps = options.label_smoothing;
  STRATA_CHECK(eps >= 0.0 && eps < 1.0)
      << op << ": options.label_smoothing must be in [0, 1), got " << eps;
  STRATA_CHECK(options.normalizer >= 0.0 && std::isfinite(options.normalizer))
      << op << ": options.normalizer must be finite and >= 0 (0 means the target count), got "
      << options.normalizer;
  return d;
}

__device__ __noinline__ void report_bad_target(bool forward, int64_t row, int64_t t, int64_t v,
                                               int64_t ignore) {
  printf(
      "%s: targets[%lld] = %lld is out of range for V = %lld (must be in [0, %lld) or "
      "ignore_index %lld)\n",
      forward ? "cross_entropy_forward" : "cross_entropy_backward", static_cast<long long>(row),
      static_cast<long long>(t), static_cast<long long>(v), static_cast<long long>(v),
      static_cast<long long>(ignore));
  __trap();
}

// Merges the log-sum-exp state (m2, s2) into (m, s): s = sum exp(x - m) over both parts. A part
// with m = -inf holds nothing (or only -inf logits) and s = 0.
__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) {
    s += s2;
    return;
  }
  s = s * expf(m - mm) + s2 * expf(m2 - mm);
  m = mm;
}

// Adds CNT values to the thread's online state (m, s) and, with kSmooth, their sum to sx.
template <bool kSmooth, int CNT>
__device__ __forceinline__ void lse_add(float& m, float& s, float& sx, const float* vals) {
  float cmax = vals[0];
#pragma unroll
  for (int u = 1; u < CNT; ++u) cmax = fmaxf(cmax, vals[u]);
  if (cmax > m) {
    s *= expf(m - cmax);
    m = cmax;
  }
  const float shift = m == -INFINITY ? 0.0f : m;  // all values so far are -inf: exp(-inf) = 0
#pragma unroll
  for (int u = 0; u < CNT; ++u) s += expf(vals[u] - shift);
  if (kSmooth) {
#pragma unroll
    for (int u = 0; u < CNT; ++u) sx += vals[u];
  }
}

// Merges (m, s, sx) over the TPR threads of a row; every thread of the row gets the result. For
// TPR > 32 the row is the whole (one-dimensional) block and every thread must call this.
template <int TPR>
__device__ __forceinline__ void row_reduce(float& m, float& s, float& sx) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, o);
    const float s2 = __shfl_xor_sync(kFullMask, s, o);
    sx += __shfl_xor_sync(kFullMask, sx, o);
    lse_combine(m, s, m2, s2);
  }
  if constexpr (TPR > 32) {
    constexpr int kWarps = TPR / 32;
    __shared__ float sh_m[kWarps], sh_s[kWarps], sh_x[kWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // the previous row's values have been read
    if (lane == 0) {
      sh_m[warp] = m;
      sh_s[warp] = s;
      sh_x[warp] = sx;
    }
    __syncthreads();
    m = sh_m[0];
    s = sh_s[0];
    sx = sh_x[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      lse_combine(m, s, sh_m[w], sh_s[w]);
      sx += sh_x[w];
    }
  }
}

// Rows per block and the thread's place in its row: TPR == 32 uses (32, 8) blocks of one warp
// per row; TPR > 32 uses one-dimensional blocks of one row.
template <int TPR>
struct RowLayout {
  static constexpr int kRowsPerBlock = TPR == 32 ? 8 : 1;
  __device__ static int64_t first_row() {
    return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.y;
  }
  __device__ static int64_t row_stride() { return static_cast<int64_t>(gridDim.x) * kRowsPerBlock; }
};

// row_loss[i] = loss_i (0 for ignored rows).
template <typename T, int TPR, bool kSmooth>
__global__ void __launch_bounds__(TPR == 32 ? 256 : TPR)
    ce_forward_rows_kernel(const T* __restrict__ logits, const void* __restrict__ targets,
                           bool targets64, int64_t n, int64_t v, int64_t stride,
                           int64_t ignore_index, double eps, double* __restrict__ row_loss) {
  using L = RowLayout<TPR>;
  const int tid = threadIdx.x;
  for (int64_t row = L::first_row(); row < n; row += L::row_stride()) {
    const int64_t t = load_index(targets, targets64, row);
    if (t == ignore_index) {
      if (tid == 0) row_loss[row] = 0.0;
      continue;  // uniform over the row's threads
    }
    if (t < 0 || t >= v) {
      if (tid == 0) report_bad_target(true, row, t, v, ignore_index);
      continue;
    }
    const T* x = logits + row * stride;
    float m = -INFINITY, s = 0.0f, sx = 0.0f;
    for_each_in_row(x, v, tid, TPR, [&](auto cnt, int64_t, const float* vals) {
      lse_add<kSmooth, decltype(cnt)::value>(m, s, sx, vals);
    });
    row_reduce<TPR>(m, s, sx);
    if (tid == 0) {
      const double xt = to_f32(x[t]);
      double loss = static_cast<double>(m) + log(static_cast<double>(s)) - (1.0 - eps) * xt;
      if (kSmooth) loss -= eps / static_cast<double>(v) * static_cast<double>(sx);
      row_loss[row] = loss;
    }
  }
}

// loss = sum_i row_loss[i] / normalizer (0 when the normalizer is 0); one block.
template <typename T>
__global__ void __launch_bounds__(kFinishThreads)
    ce_finish_kernel(const double* __restrict__ row_loss, const void* __restrict__ targets,
                     bool targets64, int64_t n, int64_t ignore_index, double normalizer,
                     T* __restrict__ loss) {
  __shared__ double sh_sum[32];
  __shared__ long long sh_count[32];
  double sum = 0.0;
  long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sum += row_loss[i];
    count += load_index(targets, targets64, i) != ignore_index ? 1 : 0;
  }
  sum = block_sum(sum, sh_sum);
  count = block_sum(count, sh_count);
  if (threadIdx.x == 0) {
    const double norm = normalizer > 0.0 ? normalizer : static_cast<double>(count);
    loss[0] = from_f32<T>(static_cast<float>(norm > 0.0 ? sum / norm : 0.0));
  }
}

// count[0] = number of targets that are not ignore_index; one block.
__global__ void __launch_bounds__(kFinishThreads)
    ce_count_kernel(const void* __restrict__ targets, bool targets64, int64_t n,
                    int64_t ignore_index, long long* __restrict__ count) {
  __shared__ long long sh_count[32];
  long long c = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    c += load_index(targets, targets64, i) != ignore_index ? 1 : 0;
  }
  c = block_sum(c, sh_count);
  if (threadIdx.x == 0) count[0] = c;
}

// dlogits = dloss / normalizer * (softmax - q); normalizer = options' value when > 0, else
// *count (computed by ce_count_kernel).
template <typename T, int TPR>
__global__ void __launch_bounds__(TPR == 32 ? 256 : TPR)
    ce_backward_rows_kernel(const T* __restrict__ logits, const void* __restrict__ targets,
                            bool targets64, int64_t n, int64_t v, int64_t stride,
                            int64_t ignore_index, double eps, double normalizer,
                            const long long* __restrict__ count, double dloss,
                            T* __restrict__ dlogits) {
  using L = RowLayout<TPR>;
  const int tid = threadIdx.x;
  const double norm = normalizer > 0.0 ? normalizer : static_cast<double>(*count);
  const float scale = norm > 0.0 ? static_cast<float>(dloss / norm) : 0.0f;
  const float off_target = static_cast<float>(eps / static_cast<double>(v));
  const float on_target = static_cast<float>(1.0 - eps);
  for (int64_t row = L::first_row(); row < n; row += L::row_stride()) {
    const int64_t t = load_index(targets, targets64, row);
    T* dx = dlogits + row * stride;
    if (t == ignore_index) {
      zero_row(dx, stride, tid, TPR);
      continue;  // uniform over the row's threads
    }
    if (t < 0 || t >= v) {
      if (tid == 0) report_bad_target(false, row, t, v, ignore_index);
      continue;
    }
    const T* x = logits + row * stride;
    float m = -INFINITY, s = 0.0f, sx = 0.0f;
    for_each_in_row(x, v, tid, TPR, [&](auto cnt, int64_t, const float* vals) {
      lse_add<false, decltype(cnt)::value>(m, s, sx, vals);
    });
    row_reduce<TPR>(m, s, sx);
    const float lse = m + logf(s);
    map_row(x, dx, v, tid, TPR, [&](int64_t j, float xj) {
      const float q = j == t ? off_target + on_target : off_target;
      return scale * (expf(xj - lse) - q);
    });
    if (stride > v) zero_row(dx + v, stride - v, tid, TPR);  // the padding's gradient
  }
}

// Threads per row for rows of v logits.
int threads_per_row(int64_t v) {
  if (v <= 1024) return 32;
  if (v <= 4096) return 128;
  if (v <= 16384) return 256;
  if (v <= 65536) return 512;
  return 1024;
}

unsigned row_blocks(int64_t n, int rows_per_block) {
  const int64_t needed = (n + rows_per_block - 1) / rows_per_block;
  const int64_t cap = int64_t{1} << 24;  // the kernels loop over rows beyond this
  return static_cast<unsigned>(needed < cap ? (needed > 0 ? needed : 1) : cap);
}

template <int TPR>
dim3 row_block_dim() {
  return TPR == 32 ? dim3(32, 8) : dim3(TPR);
}

template <typename T, int TPR>
void launch_forward_rows(cudaStream_t stream, const T* x, const Tensor& targets, const Dims& d,
                         const CrossEntropyOptions& o, double* row_loss) {
  const unsigned blocks = row_blocks(d.n, RowLayout<TPR>::kRowsPerBlock);
  const bool t64 = targets.dtype() == DType::kI64;
  if (o.label_smoothing > 0.0) {
    ce_forward_rows_kernel<T, TPR, true><<<blocks, row_block_dim<TPR>(), 0, stream>>>(
        x, targets.raw_data(), t64, d.n, d.v, d.stride, o.ignore_index, o.label_smoothing,
        row_loss);
  } else {
    ce_forward_rows_kernel<T, TPR, false><<<blocks, row_block_dim<TPR>(), 0, stream>>>(
        x, targets.raw_data(), t64, d.n, d.v, d.stride, o.ignore_index, 0.0, row_loss);
  }
  STRATA_CUDA_LAUNCH_CHECK("ce_forward_rows_kernel");
}

template <typename T, int TPR>
void launch_backward_rows(cudaStream_t stream, const T* x, const Tensor& targets, const Dims& d,
                          const CrossEntropyOptions& o, const long long* count, double dloss,
                          T* dx) {
  const unsigned blocks = row_blocks(d.n, RowLayout<TPR>::kRowsPerBlock);
  ce_backward_rows_kernel<T, TPR><<<blocks, row_block_dim<TPR>(), 0, stream>>>(
      x, targets.raw_data(), targets.dtype() == DType::kI64, d.n, d.v, d.stride, o.ignore_index,
      o.label_smoothing, o.normalizer, count, dloss, dx);
  STRATA_CUDA_LAUNCH_CHECK("ce_backward_rows_kernel");
}

// Calls f(std::integral_constant<int, TPR>{}) for the row width of v.
template <typename F>
void dispatch_threads_per_row(int64_t v, F&& f) {
  switch (threads_per_row(v)) {
    case 32:
      f(std::integral_constant<int, 32>{});
      break;
    case 128:
      f(std::integral_constant<int, 128>{});
      break;
    case 256:
      f(std::integral_constant<int, 256>{});
      break;
    case 512:
      f(std::integral_constant<int, 512>{});
      break;
    default:
      f(std::integral_constant<int, 1024>{});
      break;
  }
}

}  // namespace

Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options) {
  constexpr const char* kOp = "cross_entropy_forward";
  const Dims d = check_cross_entropy(ctx, logits, targets, options, kOp);
  const cudaStream_t stream = ::strata::cuda::exec(ctx, kOp).stream();
  // f32 whatever the logits' dtype: a 16-bit loss would round away most of its digits.
  Tensor loss = Tensor::empty({}, DType::kF32, &ctx.allocator());
  const Tensor row_loss = Tensor::empty({d.n > 0 ? d.n : 1}, DType::kF64, &ctx.allocator());
  double* prow = static_cast<double*>(row_loss.raw_data());
  const bool t64 = targets.dtype() == DType::kI64;
  dispatch_float(logits.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.raw_data());
    if (d.n > 0) {
      dispatch_threads_per_row(d.v, [&](auto tpr) {
        launch_forward_rows<T, decltype(tpr)::value>(stream, x, targets, d, options, prow);
      });
    }
    ce_finish_kernel<float><<<1, kFinishThreads, 0, stream>>>(
        prow, targets.raw_data(), t64, d.n, options.ignore_index, options.normalizer,
        static_cast<float*>(loss.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("ce_finish_kernel");
  });
  return loss;
}

Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options, double dloss) {
  constexpr const char* kOp = "cross_entropy_backward";
  const Dims d = check_cross_entropy(ctx, logits, targets, options, kOp);
  const cudaStream_t stream = ::strata::cuda::exec(ctx, kOp).stream();
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), &ctx.allocator());
  if (d.n == 0) return dlogits;
  Tensor count;  // the target count, on the device, when options.normalizer is 0
  const long long* pcount = nullptr;
  if (!(options.normalizer > 0.0)) {
    count = Tensor::empty({1}, DType::kI64, &ctx.allocator());
    pcount = static_cast<const long long*>(count.raw_data());
    ce_count_kernel<<<1, kFinishThreads, 0, stream>>>(
        targets.raw_data(), targets.dtype() == DType::kI64, d.n, options.ignore_index,
        static_cast<long long*>(count.raw_data()));
    STRATA_CUDA_LAUNCH_CHECK("ce_count_kernel");
  }
  dispatch_float(logits.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* x = static_cast<const T*>(logits.raw_data());
    T* dx = static_cast<T*>(dlogits.raw_data());
    dispatch_threads_per_row(d.v, [&](auto tpr) {
      launch_backward_rows<T, decltype(tpr)::value>(stream, x, targets, d, options, pcount, dloss,
                                                    dx);
    });
  });
  return dlogits;
}

}  // namespace strata::ops::cuda
