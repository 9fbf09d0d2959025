// Element-wise activations on CUDA: f32, bf16 and f16, computed in f32 with the CPU's formulas
// (tanhf, no fast-math approximations), as flat maps with 16-byte vector accesses where the
// pointers allow.
#include <cmath>

#include "ops/activation.h"
#include "ops/pointwise_cuda_util.cuh"

namespace strata::ops::cuda {
namespace {

namespace cd = ::strata::ops::cuda_detail;
using ::strata::cuda::CudaExec;

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
constexpr float kGelu3A = static_cast<float>(3 * 0.044715);

struct ReluOp {
  __device__ float operator()(float v) const { return (v > 0.0f || isnan(v)) ? v : 0.0f; }
};
struct ReluBackwardOp {
  __device__ float operator()(float g, float y) const { return y > 0.0f ? g : 0.0f; }
};
struct GeluOp {
  __device__ float operator()(float v) const {
    const float u =
        __fmul_rn(kGeluK, __fadd_rn(v, __fmul_rn(__fmul_rn(__fmul_rn(kGeluA, v), v), v)));
    return __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, tanhf(u)));
  }
};
struct GeluBackwardOp {
  __device__ float operator()(float g, float v) const {
    const float u = kGeluK * (v + kGeluA * v * v * v);
    const float th = tanhf(u);
    const float du = kGeluK * (1.0f + kGelu3A * v * v);
    return g * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du);
  }
};

template <typename Op>
Tensor unary(ExecContext& ctx, const Tensor& x, const char* op_name, Op op) {
  CudaExec& ex = ::strata::cuda::exec(ctx, op_name);
  cd::check_float(x, ctx, op_name, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  cd::dispatch_float(x.dtype(), op_name, [&](auto tag) {
    using T = decltype(tag);
    cd::launch_unary_map(ex, x.numel(), static_cast<const T*>(x.raw_data()),
                         static_cast<T*>(y.raw_data()), op);
  });
  return y;
}

template <typename Op>
Tensor binary_backward(ExecContext& ctx, const Tensor& dy, const Tensor& a, const char* op_name,
                       const char* a_name, Op op) {
  CudaExec& ex = ::strata::cuda::exec(ctx, op_name);
  cd::check_float(dy, ctx, op_name, "dy");
  cd::check_float(a, ctx, op_name, a_name);
  cd::check_same_dtype(dy, a, op_name, "dy", a_name);
  cd::check_shape(dy, a.shape(), op_name, "dy");
  Tensor dx = Tensor::empty(a.shape(), a.dtype(), &ctx.allocator());
  cd::dispatch_float(a.dtype(), op_name, [&](auto tag) {
    using T = decltype(tag);
    cd::launch_binary_map(ex, a.numel(), static_cast<const T*>(dy.raw_data()),
                          static_cast<const T*>(a.raw_data()), static_cast<T*>(dx.raw_data()), op);
  });
  return dx;
}

}  // namespace

Tensor relu_forward(ExecContext& ctx, const Tensor& x) {
  return unary(ctx, x, "relu_forward", ReluOp{});
}

Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  return binary_backward(ctx, dy, y, "relu_backward", "y", ReluBackwardOp{});
}

Tensor gelu_forward(ExecContext& ctx, const Tensor& x) {
  return unary(ctx, x, "gelu_forward", GeluOp{});
}

Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x) {
  return binary_backward(ctx, dy, x, "gelu_backward", "x", GeluBackwardOp{});
}

}  // namespace strata::ops::cuda
