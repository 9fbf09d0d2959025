#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

// Element-wise f in double, as an f64 tensor.
template <typename F>
Tensor naive_map(const Tensor& x, F f) {
  std::vector<double> v = x.to_vector<double>();
  for (double& e : v) e = f(e);
  return Tensor::from_vector(v, x.shape());
}

double naive_gelu(double x) {
  const double pi = 3.14159265358979323846;
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

// Values in [-3, -0.05] and [0.05, 3]: no finite-difference step crosses relu's kink.
Tensor away_from_zero(const Shape& shape, uint64_t seed) {
  return naive_map(random_tensor(shape, seed, -1.0, 1.0),
                   [](double v) { return v < 0 ? v * 2.95 - 0.05 : v * 2.95 + 0.05; });
}

// f throws a strata::Error whose message contains every one of `words`.
template <typename F>
::testing::AssertionResult throws_naming(F&& f, const std::vector<std::string>& words) {
  try {
    f();
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& w : words) {
      if (message.find(w) == std::string::npos) {
        return ::testing::AssertionFailure() << "message does not name '" << w << "': " << message;
      }
    }
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no strata::Error was thrown";
}

TEST(Relu, ForwardMatchesNaiveReference) {
  ExecContext ctx;
  Tensor x = random_tensor({3, 5, 7}, 1, -2.0, 2.0);
  Tensor ref = naive_map(x, [](double v) { return v > 0 ? v : 0.0; });
  EXPECT_TRUE(all_close(ops::relu_forward(ctx, x), ref, 0, 0));
  Tensor y32 = ops::relu_forward(ctx, x.to(DType::kF32));
  EXPECT_EQ(y32.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(y32, ref, 1e-7, 1e-7));
}

TEST(Relu, NanPropagates) {
  ExecContext ctx;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> y =
      ops::relu_forward(ctx, Tensor::from_vector(std::vector<double>{-1.0, nan, 2.0}, {3}))
          .to_vector<double>();
  EXPECT_EQ(y[0], 0.0);
  EXPECT_TRUE(std::isnan(y[1]));
  EXPECT_EQ(y[2], 2.0);
}

TEST(Relu, FiniteDifferenceGradient) {
  ExecContext ctx;
  Tensor x = away_from_zero({4, 6}, 2);
  Tensor y = ops::relu_forward(ctx, x);
  Tensor dy = random_tensor(x.shape(), 3);
  Tensor dx = ops::relu_backward(ctx, dy, y);
  auto f = [&](const TensorList& xs) { return ops::relu_forward(ctx, xs[0]); };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

TEST(Gelu, ForwardMatchesNaiveReference) {
  ExecContext ctx;
  Tensor x = random_tensor({4, 33}, 1, -6.0, 6.0);
  Tensor ref = naive_map(x, naive_gelu);
  EXPECT_TRUE(all_close(ops::gelu_forward(ctx, x), ref, 1e-14, 1e-14));
  Tensor y32 = ops::gelu_forward(ctx, x.to(DType::kF32));
  EXPECT_EQ(y32.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(y32, naive_map(x.to(DType::kF32), naive_gelu), 1e-6, 1e-5));
}

TEST(Gelu, LargeInputsStayFinite) {
  ExecContext ctx;
  Tensor x = Tensor::from_vector(std::vector<float>{-1e4f, -30.0f, 30.0f, 1e4f}, {4});
  std::vector<float> y = ops::gelu_forward(ctx, x).to_vector<float>();
  std::vector<float> dx = ops::gelu_backward(ctx, Tensor::full({4}, 1.0), x).to_vector<float>();
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[3], 1e4f);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(y[i]));
    EXPECT_TRUE(std::isfinite(dx[i]));
  }
  EXPECT_NEAR(dx[0], 0.0f, 1e-6f);
  EXPECT_NEAR(dx[3], 1.0f, 1e-6f);
}

TEST(Gelu, FiniteDifferenceGradient) {
  ExecContext ctx;
  Tensor x = random_tensor({5, 9}, 2, -4.0, 4.0);
  Tensor dy = random_tensor(x.shape(), 3);
  Tensor dx = ops::gelu_backward(ctx, dy, x);
  auto f = [&](const TensorList& xs) { return ops::gelu_forward(ctx, xs[0]); };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

TEST(Gelu, F32BackwardCloseToF64) {
  ExecContext ctx;
  Tensor x = random_tensor({256, 256}, 4, -5.0, 5.0), dy = random_tensor(x.shape(), 5);
  Tensor dx64 = ops::gelu_backward(ctx, dy, x);
  Tensor dx32 = ops::gelu_backward(ctx, dy.to(DType::kF32), x.to(DType::kF32));
  EXPECT_TRUE(all_close(dx32, dx64, 1e-6, 1e-5));
}

TEST(Activation, BadInputsNameOpAndTensor) {
  ExecContext ctx;
  Tensor x = random_tensor({3, 4}, 1);
  EXPECT_TRUE(throws_naming([&] { ops::relu_forward(ctx, Tensor::zeros({3}, DType::kI64)); },
                            {"relu_forward: x "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::relu_backward(ctx, random_tensor({4, 3}, 2), x);
      },
      {"relu_backward: dy "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::gelu_backward(ctx, random_tensor({3, 4}, 2, -1, 1, DType::kF32), x);
      },
      {"gelu_backward: dy ", "but x is"}));
  EXPECT_TRUE(throws_naming([&] { ops::gelu_forward(ctx, x.transpose(0, 1)); },
                            {"gelu_forward: x ", "contiguous"}));
}

}  // namespace
}  // namespace strata
