// Optimizer updates, the squared norm and in-place gradient scaling on CUDA (optimizer_cpu.cpp is
// the specification).
//
// sgd_step and adamw_step are one fused element-wise pass over the flat tensors (16-byte loads
// and stores when every tensor is 16-byte aligned, a scalar tail): each element's update is
// computed in double from the stored f32 values and rounded once per stored tensor, exactly as
// the CPU does, with the scalar factors (bias corrections, decay) computed on the host in double
// as the CPU computes them. The kernels are memory-bound; double arithmetic costs nothing here.
// sum_of_squares: each thread accumulates x^2 in double over a strided share of the tensor, the
// block adds its threads in a fixed tree, and one block adds the block partials in order, so the
// result is deterministic on a given device; the value is copied to the host, which synchronizes
// the context's stream (the op returns a host double).
// scale_inplace: t = float(coef) * t, rounded as ops::scale rounds, for scale_gradients.
#include <cmath>

#include "ops/loss_cuda_common.cuh"
#include "ops/optimizer.h"

namespace strata::ops::cuda {
namespace {

using namespace ::strata::ops::cuda_detail;

constexpr int kThreads = 256;
constexpr int kFinishThreads = 1024;

// A gradient or state tensor that must match param (f32) in shape and dtype.
void check_like_param(const Tensor& t, const Tensor& param, const ExecContext& ctx, const char* op,
                      const char* name) {
  check_cuda(t, ctx, op, name);
  check_same_dtype(t, param, op, name, "param");
  check_shape(t, param.shape(), op, name);
}

bool aligned16(const void* p) { return aligned_to(p, 16); }

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

struct SgdParams {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, use_momentum, first;
};

__device__ __forceinline__ void sgd_one(float& p, float g, float& buf, const SgdParams& o) {
  double d = static_cast<double>(g) + o.weight_decay * static_cast<double>(p);
  if (o.use_momentum) {
    const float b = static_cast<float>(
        o.first ? d : o.momentum * static_cast<double>(buf) + (1.0 - o.dampening) * d);
    buf = b;
    d = o.nesterov ? d + o.momentum * static_cast<double>(b) : static_cast<double>(b);
  }
  p = static_cast<float>(static_cast<double>(p) - o.lr * d);
}

// vec: p, g and buf (when used) are 16-byte aligned.
__global__ void __launch_bounds__(kThreads)
    sgd_step_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf,
                    int64_t n, SgdParams o, bool vec) {
  const int64_t tid = thread_index(), stride = thread_count();
  int64_t start = 0;
  if (vec) {
    const int64_t nvec = n / 4;
    float4* p4 = reinterpret_cast<float4*>(p);
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* b4 = reinterpret_cast<float4*>(buf);
    for (int64_t q = tid; q < nvec; q += stride) {
      float4 pv = p4[q];
      const float4 gv = g4[q];
      float4 bv = o.use_momentum ? b4[q] : make_float4(0.f, 0.f, 0.f, 0.f);
      sgd_one(pv.x, gv.x, bv.x, o);
      sgd_one(pv.y, gv.y, bv.y, o);
      sgd_one(pv.z, gv.z, bv.z, o);
      sgd_one(pv.w, gv.w, bv.w, o);
      p4[q] = pv;
      if (o.use_momentum) b4[q] = bv;
    }
    start = nvec * 4;
  }
  for (int64_t i = start + tid; i < n; i += stride) {
    float pi = p[i];
    float bi = o.use_momentum ? buf[i] : 0.0f;
    sgd_one(pi, g[i], bi, o);
    p[i] = pi;
    if (o.use_momentum) buf[i] = bi;
  }
}

struct AdamParams {
  double beta1, beta2, eps, step_size, bc2_sqrt, decay;
};

__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v,
                                          const AdamParams& o) {
  const double gi = g;
  const float mi = static_cast<float>(o.beta1 * static_cast<double>(m) + (1.0 - o.beta1) * gi);
  const float vi = static_cast<float>(o.beta2 * static_cast<double>(v) + (1.0 - o.beta2) * gi * gi);
  m = mi;
  v = vi;
  const double denom = sqrt(static_cast<double>(vi)) / o.bc2_sqrt + o.eps;
  p = static_cast<float>(static_cast<double>(p) * o.decay -
                         o.step_size * static_cast<double>(mi) / denom);
}

// vec: every tensor is 16-byte aligned.
__global__ void __launch_bounds__(kThreads)
    adamw_step_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                      float* __restrict__ v, int64_t n, AdamParams o, bool vec) {
  const int64_t tid = thread_index(), stride = thread_count();
  int64_t start = 0;
  if (vec) {
    const int64_t nvec = n / 4;
    float4* p4 = reinterpret_cast<float4*>(p);
    const float4* g4 = reinterpret_cast<const float4*>(g);
    float4* m4 = reinterpret_cast<float4*>(m);
    float4* v4 = reinterpret_cast<float4*>(v);
    for (int64_t q = tid; q < nvec; q += stride) {
      float4 pv = p4[q];
      const float4 gv = g4[q];
      float4 mv = m4[q];
      float4 vv = v4[q];
      adamw_one(pv.x, gv.x, mv.x, vv.x, o);
      adamw_one(pv.y, gv.y, mv.y, vv.y, o);
      adamw_one(pv.z, gv.z, mv.z, vv.z, o);
      adamw_one(pv.w, gv.w, mv.w, vv.w, o);
      p4[q] = pv;
      m4[q] = mv;
      v4[q] = vv;
    }
    start = nvec * 4;
  }
  for (int64_t i = start + tid; i < n; i += stride) {
    float pi = p[i], mi = m[i], vi = v[i];
    adamw_one(pi, g[i], mi, vi, o);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

struct AdamVrParams {
  double beta1, beta2, eps, lr, bc1, bc2, decay, scale;
};

// ops/optimizer.h's adamw_vr_step, one element, in double as on the CPU.
__global__ void __launch_bounds__(kThreads)
    adamw_vr_step_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                         float* __restrict__ v, float* __restrict__ m2, int64_t n, AdamVrParams o) {
  const int64_t tid = thread_index(), stride = thread_count();
  for (int64_t i = tid; i < n; i += stride) {
    const double gi = g[i];
    const float mi = static_cast<float>(o.beta1 * static_cast<double>(m[i]) + (1.0 - o.beta1) * gi);
    const float m2i =
        static_cast<float>(o.beta2 * static_cast<double>(m2[i]) + (1.0 - o.beta2) * gi);
    const float vi =
        static_cast<float>(o.beta2 * static_cast<double>(v[i]) + (1.0 - o.beta2) * gi * gi);
    m[i] = mi;
    m2[i] = m2i;
    v[i] = vi;
    const double mean = static_cast<double>(m2i) / o.bc2;
    const double second = static_cast<double>(vi) / o.bc2;
    const double vs = mean * mean + o.scale * fmax(second - mean * mean, 0.0);
    p[i] = static_cast<float>(static_cast<double>(p[i]) * o.decay -
                              o.lr * (static_cast<double>(mi) / o.bc1) / (sqrt(vs) + o.eps));
  }
}

// partial[blockIdx.x] = sum of x^2 over this block's share, in double.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sum_of_squares_partial_kernel(const T* __restrict__ x, int64_t n,
                                  double* __restrict__ partial) {
  __shared__ double sh[32];
  double acc = 0.0;
  for_each_in_row(x, n, thread_index(), thread_count(), [&](auto cnt, int64_t, const float* vals) {
#pragma unroll
    for (int u = 0; u < decltype(cnt)::value; ++u) {
      const double d = vals[u];
      acc += d * d;
    }
  });
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = sum of the partials, in a fixed order; one block.
__global__ void __launch_bounds__(kFinishThreads)
    sum_partials_kernel(const double* __restrict__ partial, int64_t count,
                        double* __restrict__ out) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
  acc = block_sum(acc, sh);
  if (threadIdx.x == 0) out[0] = acc;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) scale_inplace_kernel(T* x, int64_t n, float s) {
  map_row(x, x, n, thread_index(), thread_count(), [&](int64_t, float v) { return s * v; });
}

}  // namespace

void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step) {
  constexpr const char* kOp = "sgd_step";
  check_f32(param, ctx, kOp, "param");
  check_like_param(grad, param, ctx, kOp, "grad");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const double lr = options.lr, mom = options.momentum, damp = options.dampening;
  const double wd = options.weight_decay;
  detail::check_sgd_options(options, kOp);
  const bool use_momentum = mom > 0;
  if (use_momentum) check_like_param(momentum_buf, param, ctx, kOp, "momentum_buf");
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kOp);
  const int64_t n = param.numel();
  if (n == 0) return;
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* buf = use_momentum ? static_cast<float*>(momentum_buf.raw_data()) : nullptr;
  const bool vec = aligned16(p) && aligned16(g) && (!use_momentum || aligned16(buf));
  const SgdParams o{lr, mom, damp, wd, options.nesterov, use_momentum, step == 1};
  sgd_step_kernel<<<::strata::cuda::blocks_for(vec ? (n + 3) / 4 : n, kThreads, x), kThreads, 0,
                    x.stream()>>>(p, g, buf, n, o, vec);
  STRATA_CUDA_LAUNCH_CHECK("sgd_step_kernel");
}

void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step) {
  constexpr const char* kOp = "adamw_step";
  check_f32(param, ctx, kOp, "param");
  check_like_param(grad, param, ctx, kOp, "grad");
  check_like_param(m, param, ctx, kOp, "m");
  check_like_param(v, param, ctx, kOp, "v");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const double lr = options.lr, b1 = options.beta1, b2 = options.beta2, eps = options.eps;
  const double wd = options.weight_decay;
  detail::check_adamw_options(options, kOp);
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kOp);
  const int64_t n = param.numel();
  if (n == 0) return;
  const double t = static_cast<double>(step);
  AdamParams o;
  o.beta1 = b1;
  o.beta2 = b2;
  o.eps = eps;
  o.step_size = lr / (1.0 - std::pow(b1, t));
  o.bc2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
  o.decay = 1.0 - lr * wd;
  float* p = static_cast<float*>(param.raw_data());
  const float* g = static_cast<const float*>(grad.raw_data());
  float* pm = static_cast<float*>(m.raw_data());
  float* pv = static_cast<float*>(v.raw_data());
  const bool vec = aligned16(p) && aligned16(g) && aligned16(pm) && aligned16(pv);
  adamw_step_kernel<<<::strata::cuda::blocks_for(vec ? (n + 3) / 4 : n, kThreads, x), kThreads, 0,
                      x.stream()>>>(p, g, pm, pv, n, o, vec);
  STRATA_CUDA_LAUNCH_CHECK("adamw_step_kernel");
}

void adamw_vr_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& m2, const AdamWVrOptions& options, int64_t step) {
  constexpr const char* kOp = "adamw_vr_step";
  check_f32(param, ctx, kOp, "param");
  check_like_param(grad, param, ctx, kOp, "grad");
  check_like_param(m, param, ctx, kOp, "m");
  check_like_param(v, param, ctx, kOp, "v");
  check_like_param(m2, param, ctx, kOp, "m2");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const AdamWOptions& a = options.adam;
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
  const double scale = options.variance_scale;
  detail::check_adamw_vr_options(options, kOp);
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kOp);
  const int64_t n = param.numel();
  if (n == 0) return;
  const double t = static_cast<double>(step);
  const AdamVrParams o{
      b1, b2, eps, lr, 1.0 - std::pow(b1, t), 1.0 - std::pow(b2, t), 1.0 - lr * wd, scale};
  adamw_vr_step_kernel<<<::strata::cuda::blocks_for(n, kThreads, x), kThreads, 0, x.stream()>>>(
      static_cast<float*>(param.raw_data()), static_cast<const float*>(grad.raw_data()),
      static_cast<float*>(m.raw_data()), static_cast<float*>(v.raw_data()),
      static_cast<float*>(m2.raw_data()), n, o);
  STRATA_CUDA_LAUNCH_CHECK("adamw_vr_step_kernel");
}

double sum_of_squares(ExecContext& ctx, const Tensor& t) {
  constexpr const char* kOp = "sum_of_squares";
  check_float(t, ctx, kOp, "t");
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kOp);
  const cudaStream_t stream = x.stream();
  const int64_t per_thread = 16 / static_cast<int64_t>(t.element_size());  // one 16-byte load
  const unsigned blocks =
      ::strata::cuda::blocks_for((n + per_thread - 1) / per_thread, kThreads, x);
  const Tensor partial =
      Tensor::empty({static_cast<int64_t>(blocks) + 1}, DType::kF64, &ctx.allocator());
  double* pp = static_cast<double*>(partial.raw_data());
  double* result = pp + blocks;
  dispatch_float(t.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    sum_of_squares_partial_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(t.raw_data()), n, pp);
    STRATA_CUDA_LAUNCH_CHECK("sum_of_squares_partial_kernel");
  });
  sum_partials_kernel<<<1, kFinishThreads, 0, stream>>>(pp, blocks, result);
  STRATA_CUDA_LAUNCH_CHECK("sum_partials_kernel");
  double host = 0.0;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, stream));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void scale_inplace(ExecContext& ctx, const Tensor& t, double coef) {
  constexpr const char* kOp = "scale_inplace";
  check_float(t, ctx, kOp, "t");
  const int64_t n = t.numel();
  const ::strata::cuda::CudaExec& x = ::strata::cuda::exec(ctx, kOp);
  if (n == 0) return;
  const float s = static_cast<float>(coef);
  const int64_t per_thread = 16 / static_cast<int64_t>(t.element_size());
  const unsigned blocks =
      ::strata::cuda::blocks_for((n + per_thread - 1) / per_thread, kThreads, x);
  dispatch_float(t.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    scale_inplace_kernel<T>
        <<<blocks, kThreads, 0, x.stream()>>>(static_cast<T*>(t.raw_data()), n, s);
    STRATA_CUDA_LAUNCH_CHECK("scale_inplace_kernel");
  });
}

}  // namespace strata::ops::cuda
