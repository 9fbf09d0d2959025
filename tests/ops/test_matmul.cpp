#include <gtest/gtest.h>

#include "ops/matmul.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

// Naive reference: c[b] = op(a[b]) @ op(b[b]) in double.
Tensor naive_matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int64_t m = ta ? a.size(-1) : a.size(-2), k = ta ? a.size(-2) : a.size(-1);
  const int64_t n = tb ? b.size(-2) : b.size(-1);
  const int64_t batch = a.numel() / (m * k);
  const bool shared = b.dim() == 2 && a.dim() > 2;
  Shape out(a.shape().begin(), a.shape().end() - 2);
  out.push_back(m);
  out.push_back(n);
  std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), c(batch * m * n);
  for (int64_t i = 0; i < batch; ++i) {
    const double* pa = av.data() + i * m * k;
    const double* pb = bv.data() + (shared ? 0 : i * k * n);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < n; ++col) {
        double s = 0;
        for (int64_t j = 0; j < k; ++j) {
          const double x = ta ? pa[j * m + r] : pa[r * k + j];
          const double y = tb ? pb[col * k + j] : pb[j * n + col];
          s += x * y;
        }
        c[(i * m + r) * n + col] = s;
      }
  }
  return Tensor::from_vector(c, out);
}

struct MatmulCase {
  Shape a, b;
  bool ta, tb;
};

class MatmulTest : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTest, MatchesNaiveProductInF32AndF64) {
  const MatmulCase& p = GetParam();
  ExecContext ctx;
  Tensor a = random_tensor(p.a, 1), b = random_tensor(p.b, 2);
  EXPECT_TRUE(
      all_close(ops::matmul(ctx, a, b, p.ta, p.tb), naive_matmul(a, b, p.ta, p.tb), 1e-12, 1e-12));
  Tensor a32 = a.to(DType::kF32), b32 = b.to(DType::kF32);
  EXPECT_TRUE(all_close(ops::matmul(ctx, a32, b32, p.ta, p.tb), naive_matmul(a, b, p.ta, p.tb),
                        1e-5, 1e-5));
}

TEST_P(MatmulTest, FiniteDifferenceGradients) {
  const MatmulCase& p = GetParam();
  ExecContext ctx;
  Tensor a = random_tensor(p.a, 3), b = random_tensor(p.b, 4);
  Tensor c = ops::matmul(ctx, a, b, p.ta, p.tb);
  Tensor dc = random_tensor(c.shape(), 5);
  ops::MatmulGrads g = ops::matmul_backward(ctx, dc, a, b, p.ta, p.tb, true, true);
  auto f = [&](const TensorList& xs) { return ops::matmul(ctx, xs[0], xs[1], p.ta, p.tb); };
  EXPECT_TRUE(gradients_match(f, {a, b}, dc, {g.da, g.db}));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulTest,
    ::testing::Values(MatmulCase{{3, 4}, {4, 5}, false, false},
                      MatmulCase{{4, 3}, {4, 5}, true, false},
                      MatmulCase{{3, 4}, {5, 4}, false, true},
                      MatmulCase{{4, 3}, {5, 4}, true, true},
                      MatmulCase{{2, 3, 3, 4}, {2, 3, 4, 2}, false, false},
                      MatmulCase{{2, 4, 3}, {2, 2, 4}, true, true},
                      MatmulCase{{2, 3, 4}, {4, 5}, false, false},  // shared b, folded
                      MatmulCase{{2, 3, 4}, {5, 4}, false, true},
                      MatmulCase{{2, 4, 3}, {4, 5}, true, false}),  // shared b, looped
    [](const ::testing::TestParamInfo<MatmulCase>& info) {
      const MatmulCase& c = info.param;
      return "a" + std::to_string(c.a.size()) + "d_b" + std::to_string(c.b.size()) + "d" +
             (c.ta ? "_ta" : "") + (c.tb ? "_tb" : "") + "_" + std::to_string(info.index);
    });

TEST(Matmul, RejectsMismatchedShapes) {
  ExecContext ctx;
  EXPECT_THROW(ops::matmul(ctx, random_tensor({3, 4}, 1), random_tensor({5, 6}, 2)), Error);
  EXPECT_THROW(ops::matmul(ctx, random_tensor({2, 3, 4}, 1), random_tensor({3, 4, 5}, 2)), Error);
  EXPECT_THROW(
      ops::matmul(ctx, random_tensor({3, 4}, 1), random_tensor({4, 5}, 2, -1, 1, DType::kF32)),
      Error);
}

TEST(Linear, ForwardMatchesMatmulPlusBias) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3, 4}, 1), w = random_tensor({5, 4}, 2), b = random_tensor({5}, 3);
  Tensor y = ops::linear_forward(ctx, x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  Tensor ref = naive_matmul(x, w, false, true);
  std::vector<double> r = ref.to_vector<double>(), bv = b.to_vector<double>();
  for (size_t i = 0; i < r.size(); ++i) r[i] += bv[i % 5];
  EXPECT_TRUE(all_close(y, Tensor::from_vector(r, {2, 3, 5}), 1e-12, 1e-12));
}

TEST(Linear, FiniteDifferenceGradients) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3, 4}, 1), w = random_tensor({5, 4}, 2), b = random_tensor({5}, 3);
  Tensor dy = random_tensor({2, 3, 5}, 4);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF64), db = Tensor::zeros(b.shape(), DType::kF64);
  Tensor dx = ops::linear_backward(ctx, dy, x, w, dw, db, true);
  auto f = [&](const TensorList& xs) { return ops::linear_forward(ctx, xs[0], xs[1], xs[2]); };
  EXPECT_TRUE(gradients_match(f, {x, w, b}, dy, {dx, dw, db}));
}

TEST(Linear, ParameterGradientsAccumulate) {
  ExecContext ctx;
  Tensor x = random_tensor({6, 4}, 1), w = random_tensor({3, 4}, 2), b = random_tensor({3}, 3);
  Tensor dy = random_tensor({6, 3}, 4);
  Tensor dw = Tensor::zeros(w.shape(), DType::kF64), db = Tensor::zeros(b.shape(), DType::kF64);
  ops::linear_backward(ctx, dy, x, w, dw, db, false);
  Tensor dw1 = dw.clone(), db1 = db.clone();
  Tensor dx = ops::linear_backward(ctx, dy, x, w, dw, db, false);
  EXPECT_FALSE(dx.defined());
  std::vector<double> w2 = dw.to_vector<double>(), w1 = dw1.to_vector<double>();
  for (size_t i = 0; i < w2.size(); ++i) EXPECT_DOUBLE_EQ(w2[i], 2 * w1[i]);
  std::vector<double> b2 = db.to_vector<double>(), b1 = db1.to_vector<double>();
  for (size_t i = 0; i < b2.size(); ++i) EXPECT_DOUBLE_EQ(b2[i], 2 * b1[i]);
}

TEST(Linear, NoBiasAndErrors) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 4}, 1), w = random_tensor({3, 4}, 2);
  Tensor y = ops::linear_forward(ctx, x, w, Tensor());
  EXPECT_TRUE(all_close(y, naive_matmul(x, w, false, true), 1e-12, 1e-12));
  EXPECT_THROW(ops::linear_forward(ctx, x, random_tensor({3, 5}, 2), Tensor()), Error);
  EXPECT_THROW(ops::linear_forward(ctx, x, w, random_tensor({4}, 3)), Error);
}

}  // namespace
}  // namespace strata
