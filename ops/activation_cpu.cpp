// Element-wise activations on the CPU, computed in the input's dtype.
//
// relu(x) = x for x > 0, else 0; NaN stays NaN so that a diverging run shows. Its backward
// passes dy where y > 0.
// GELU is the tanh form of Hendrycks & Gimpel (2016), as in GPT-2. With
//   u = k (x + a x^3),  k = sqrt(2 / pi),  a = 0.044715,
//   gelu(x)  = 0.5 x (1 + tanh u)
//   gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) k (1 + 3 a x^2)
// which is the exact derivative of the tanh form (not of the erf form). f32 tensors use the same
// function through 0.5 (1 + tanh u) = sigmoid(2 u), vectorized (ops/cpu_math.h):
//   gelu(x)  = x s,  gelu'(x) = s + 2 x s (1 - s) k (1 + 3 a x^2),  s = sigmoid(2 u).
#include <cmath>

#include "ops/activation.h"
#include "ops/cpu_math.h"
#include "ops/cpu_util.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

// y = f(x) element-wise, into a new tensor like x.
template <typename F>
Tensor unary(ExecContext& ctx, const Tensor& x, const char* op, F f) {
  detail::check_float(x, op, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    detail::parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) py[i] = f(px[i]);
    });
  });
  return y;
}

// dx = f(dy, a) element-wise, where a is the saved tensor (`a_name`) the derivative needs.
template <typename F>
Tensor binary_backward(ExecContext& ctx, const Tensor& dy, const Tensor& a, const char* op,
                       const char* a_name, F f) {
  detail::check_float(dy, op, "dy");
  detail::check_float(a, op, a_name);
  detail::check_same_dtype(dy, a, op, "dy", a_name);
  detail::check_shape(dy, a.shape(), op, "dy");
  Tensor dx = Tensor::empty(a.shape(), a.dtype(), &ctx.allocator());
  detail::dispatch_float(a.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    const T* pa = a.data<T>();
    T* pdx = dx.data<T>();
    detail::parallel_for(a.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pdx[i] = f(pdy[i], pa[i]);
    });
  });
  return dx;
}

// The f32 GELU loops (vectorized); dy is null for the forward.
void gelu_f32(const float* x, const float* dy, float* out, int64_t n) {
  constexpr float k = static_cast<float>(kGeluK), a = static_cast<float>(kGeluA);
  detail::parallel_for(n, kGrain, [&](int64_t i0, int64_t i1) {
    if (dy == nullptr) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const float v = x[i];
        out[i] = v * cpu_math::sigmoid(2.0f * k * (v + a * v * v * v));
      }
      return;
    }
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const float v = x[i];
      const float s = cpu_math::sigmoid(2.0f * k * (v + a * v * v * v));
      out[i] = dy[i] * (s + 2.0f * v * s * (1.0f - s) * k * (1.0f + 3.0f * a * v * v));
    }
  });
}

}  // namespace

Tensor relu_forward(ExecContext& ctx, const Tensor& x) {
  return unary(ctx, x, "relu_forward",
               [](auto v) { return (v > 0 || std::isnan(v)) ? v : decltype(v)(0); });
}

Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  return binary_backward(ctx, dy, y, "relu_backward", "y",
                         [](auto g, auto v) { return v > 0 ? g : decltype(g)(0); });
}

Tensor gelu_forward(ExecContext& ctx, const Tensor& x) {
  if (x.dtype() == DType::kF32) {
    detail::check_float(x, "gelu_forward", "x");
    Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
    gelu_f32(x.data<float>(), nullptr, y.data<float>(), x.numel());
    return y;
  }
  return unary(ctx, x, "gelu_forward", [](auto v) {
    using T = decltype(v);
    const T u = T(kGeluK) * (v + T(kGeluA) * v * v * v);
    return T(0.5) * v * (T(1) + std::tanh(u));
  });
}

Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x) {
  if (x.dtype() == DType::kF32 && dy.dtype() == DType::kF32) {
    detail::check_float(dy, "gelu_backward", "dy");
    detail::check_float(x, "gelu_backward", "x");
    detail::check_shape(dy, x.shape(), "gelu_backward", "dy");
    Tensor dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
    gelu_f32(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel());
    return dx;
  }
  return binary_backward(ctx, dy, x, "gelu_backward", "x", [](auto g, auto v) {
    using T = decltype(v);
    const T u = T(kGeluK) * (v + T(kGeluA) * v * v * v);
    const T th = std::tanh(u);
    const T du = T(kGeluK) * (T(1) + T(3 * kGeluA) * v * v);
    return g * (T(0.5) * (T(1) + th) + T(0.5) * v * (T(1) - th * th) * du);
  });
}

}  // namespace strata::ops::cpu
