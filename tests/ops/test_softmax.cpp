#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/softmax.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

// Softmax over the last dimension in double, with plain loops; an all -inf row gives zeros.
Tensor naive_softmax(const Tensor& x) {
  const int64_t c = x.size(-1), rows = x.numel() / c;
  std::vector<double> v = x.to_vector<double>();
  for (int64_t r = 0; r < rows; ++r) {
    double* row = v.data() + r * c;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < c; ++j) m = std::max(m, row[j]);
    if (std::isinf(m) && m < 0) {
      for (int64_t j = 0; j < c; ++j) row[j] = 0.0;
      continue;
    }
    double sum = 0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(row[j] - m);
    for (int64_t j = 0; j < c; ++j) row[j] = std::exp(row[j] - m) / sum;
  }
  return Tensor::from_vector(v, x.shape());
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

TEST(Softmax, ForwardMatchesNaiveReference) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3, 9}, 1, -5.0, 5.0);
  Tensor y = ops::softmax_forward(ctx, x);
  EXPECT_TRUE(all_close(y, naive_softmax(x), 1e-15, 1e-13));
  const std::vector<double> v = y.to_vector<double>();
  for (int r = 0; r < 6; ++r) {
    double sum = 0;
    for (int j = 0; j < 9; ++j) sum += v[r * 9 + j];
    EXPECT_NEAR(sum, 1.0, 1e-14);
  }
}

TEST(Softmax, F32CloseToF64Reference) {
  ExecContext ctx;
  Tensor x = random_tensor({128, 100}, 2, -8.0, 8.0);  // rows split over threads
  Tensor y = ops::softmax_forward(ctx, x.to(DType::kF32));
  EXPECT_EQ(y.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(y, naive_softmax(x.to(DType::kF32)), 1e-7, 1e-5));
}

TEST(Softmax, LargeLogitsAndMaskedEntries) {
  ExecContext ctx;
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0: huge logits (no overflow); row 1: partly -inf; row 2: all -inf gives zeros.
  Tensor x = Tensor::from_vector(std::vector<float>{1000.0f, 1001.0f, 999.0f, 1000.0f, -inf, 0.5f,
                                                    -inf, 1.5f, -inf, -inf, -inf, -inf},
                                 {3, 4});
  Tensor y = ops::softmax_forward(ctx, x);
  const std::vector<float> v = y.to_vector<float>();
  for (float e : v) EXPECT_TRUE(std::isfinite(e));
  EXPECT_TRUE(all_close(y, naive_softmax(x), 1e-7, 1e-6));
  EXPECT_EQ(v[4], 0.0f);
  EXPECT_EQ(v[6], 0.0f);
  for (int j = 8; j < 12; ++j) EXPECT_EQ(v[j], 0.0f);
}

TEST(Softmax, FiniteDifferenceGradient) {
  ExecContext ctx;
  Tensor x = random_tensor({3, 2, 7}, 3, -3.0, 3.0);
  Tensor y = ops::softmax_forward(ctx, x);
  Tensor dy = random_tensor(x.shape(), 4);
  Tensor dx = ops::softmax_backward(ctx, dy, y);
  auto f = [&](const TensorList& xs) { return ops::softmax_forward(ctx, xs[0]); };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

TEST(Softmax, F32BackwardCloseToF64) {
  ExecContext ctx;
  Tensor x = random_tensor({16, 50}, 5, -4.0, 4.0), dy = random_tensor(x.shape(), 6);
  Tensor dx64 = ops::softmax_backward(ctx, dy, ops::softmax_forward(ctx, x));
  Tensor dx32 =
      ops::softmax_backward(ctx, dy.to(DType::kF32), ops::softmax_forward(ctx, x.to(DType::kF32)));
  EXPECT_TRUE(all_close(dx32, dx64, 1e-6, 1e-4));
}

TEST(Softmax, BadInputsNameOpAndTensor) {
  ExecContext ctx;
  Tensor y = random_tensor({3, 4}, 1);
  EXPECT_TRUE(throws_naming([&] { ops::softmax_forward(ctx, Tensor::zeros({3}, DType::kU8)); },
                            {"softmax_forward: x "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::softmax_forward(ctx, Tensor::zeros({3, 0}));
      },
      {"softmax_forward: x "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::softmax_backward(ctx, random_tensor({3, 5}, 2), y);
      },
      {"softmax_backward: dy "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::softmax_backward(ctx, random_tensor({3, 4}, 2, -1, 1, DType::kF32), y);
      },
      {"softmax_backward: dy ", "but y is"}));
}

}  // namespace
}  // namespace strata
