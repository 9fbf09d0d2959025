#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/layer_norm.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

struct NaiveLayerNorm {
  Tensor y, mean, rstd;  // f64
};

// Plain loops in double: y = (x - mean) / sqrt(var + eps) * gamma + beta, biased variance.
NaiveLayerNorm naive_layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                double eps) {
  const int64_t c = x.size(-1), rows = x.numel() / c;
  const std::vector<double> xv = x.to_vector<double>();
  const std::vector<double> g =
      gamma.defined() ? gamma.to_vector<double>() : std::vector<double>(c, 1.0);
  const std::vector<double> b =
      beta.defined() ? beta.to_vector<double>() : std::vector<double>(c, 0.0);
  std::vector<double> y(xv.size()), mean(rows), rstd(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0;
    for (int64_t j = 0; j < c; ++j) m += xv[r * c + j];
    m /= c;
    double var = 0;
    for (int64_t j = 0; j < c; ++j) var += (xv[r * c + j] - m) * (xv[r * c + j] - m);
    var /= c;
    mean[r] = m;
    rstd[r] = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < c; ++j) y[r * c + j] = (xv[r * c + j] - m) * rstd[r] * g[j] + b[j];
  }
  return {Tensor::from_vector(y, x.shape()), Tensor::from_vector(mean, {rows}),
          Tensor::from_vector(rstd, {rows})};
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

TEST(LayerNorm, ForwardMatchesNaiveReference) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3, 8}, 1, -2.0, 3.0);
  Tensor gamma = random_tensor({8}, 2), beta = random_tensor({8}, 3);
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x, gamma, beta, 1e-5);
  NaiveLayerNorm ref = naive_layer_norm(x, gamma, beta, 1e-5);
  EXPECT_TRUE(all_close(r.y, ref.y, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(r.mean, ref.mean, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(r.rstd, ref.rstd, 1e-12, 1e-12));
  EXPECT_EQ(r.mean.shape(), (Shape{6}));
}

TEST(LayerNorm, ForwardWithoutScaleOrShift) {
  ExecContext ctx;
  Tensor x = random_tensor({5, 7}, 1), gamma = random_tensor({7}, 2), beta = random_tensor({7}, 3);
  EXPECT_TRUE(all_close(ops::layer_norm_forward(ctx, x, Tensor(), Tensor(), 1e-5).y,
                        naive_layer_norm(x, Tensor(), Tensor(), 1e-5).y, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(ops::layer_norm_forward(ctx, x, gamma, Tensor(), 1e-5).y,
                        naive_layer_norm(x, gamma, Tensor(), 1e-5).y, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(ops::layer_norm_forward(ctx, x, Tensor(), beta, 1e-5).y,
                        naive_layer_norm(x, Tensor(), beta, 1e-5).y, 1e-12, 1e-12));
}

TEST(LayerNorm, F32CloseToF64Reference) {
  ExecContext ctx;
  // Rows far from zero mean: the two-pass variance must not cancel in f32.
  Tensor x = random_tensor({256, 96}, 1, 99.0, 101.0);  // rows split over threads
  Tensor gamma = random_tensor({96}, 2), beta = random_tensor({96}, 3);
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x.to(DType::kF32), gamma.to(DType::kF32),
                                                   beta.to(DType::kF32), 1e-5);
  EXPECT_EQ(r.y.dtype(), DType::kF32);
  EXPECT_EQ(r.mean.dtype(), DType::kF32);
  NaiveLayerNorm ref =
      naive_layer_norm(x.to(DType::kF32), gamma.to(DType::kF32), beta.to(DType::kF32), 1e-5);
  EXPECT_TRUE(all_close(r.y, ref.y, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(r.mean, ref.mean, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(r.rstd, ref.rstd, 1e-5, 1e-5));
}

TEST(LayerNorm, FiniteDifferenceGradients) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3, 5}, 1, -2.0, 2.0);
  Tensor gamma = random_tensor({5}, 2), beta = random_tensor({5}, 3);
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x, gamma, beta, 1e-5);
  Tensor dy = random_tensor(x.shape(), 4);
  Tensor dgamma = Tensor::zeros({5}, DType::kF64), dbeta = Tensor::zeros({5}, DType::kF64);
  Tensor dx = ops::layer_norm_backward(ctx, dy, x, gamma, r.mean, r.rstd, dgamma, dbeta);
  auto f = [&](const TensorList& xs) {
    return ops::layer_norm_forward(ctx, xs[0], xs[1], xs[2], 1e-5).y;
  };
  EXPECT_TRUE(gradients_match(f, {x, gamma, beta}, dy, {dx, dgamma, dbeta}));
}

TEST(LayerNorm, FiniteDifferenceGradientsWithoutAffine) {
  ExecContext ctx;
  Tensor x = random_tensor({4, 6}, 5, -2.0, 2.0);
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x, Tensor(), Tensor(), 1e-5);
  Tensor dy = random_tensor(x.shape(), 6);
  Tensor dx = ops::layer_norm_backward(ctx, dy, x, Tensor(), r.mean, r.rstd, Tensor(), Tensor());
  auto f = [&](const TensorList& xs) {
    return ops::layer_norm_forward(ctx, xs[0], Tensor(), Tensor(), 1e-5).y;
  };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

TEST(LayerNorm, F32BackwardCloseToF64) {
  ExecContext ctx;
  // Big enough that rows (dx) and columns (dgamma, dbeta) are split over threads.
  Tensor x = random_tensor({256, 160}, 1, -2.0, 2.0);
  Tensor gamma = random_tensor({160}, 2), beta = random_tensor({160}, 3);
  Tensor dy = random_tensor(x.shape(), 4);
  auto run = [&](DType dtype, Tensor* dgamma, Tensor* dbeta) {
    *dgamma = Tensor::zeros({160}, dtype);
    *dbeta = Tensor::zeros({160}, dtype);
    ops::LayerNormResult r =
        ops::layer_norm_forward(ctx, x.to(dtype), gamma.to(dtype), beta.to(dtype), 1e-5);
    return ops::layer_norm_backward(ctx, dy.to(dtype), x.to(dtype), gamma.to(dtype), r.mean, r.rstd,
                                    *dgamma, *dbeta);
  };
  Tensor dg64, db64, dg32, db32;
  Tensor dx64 = run(DType::kF64, &dg64, &db64);
  Tensor dx32 = run(DType::kF32, &dg32, &db32);
  EXPECT_TRUE(all_close(dx32, dx64, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(dg32, dg64, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(db32, db64, 1e-5, 1e-4));
}

TEST(LayerNorm, ParameterGradientsAccumulate) {
  ExecContext ctx;
  Tensor x = random_tensor({3, 4, 8}, 1), gamma = random_tensor({8}, 2),
         beta = random_tensor({8}, 3);
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x, gamma, beta, 1e-5);
  Tensor dy = random_tensor(x.shape(), 4);
  Tensor dgamma = Tensor::zeros({8}, DType::kF64), dbeta = Tensor::zeros({8}, DType::kF64);
  Tensor dx1 = ops::layer_norm_backward(ctx, dy, x, gamma, r.mean, r.rstd, dgamma, dbeta);
  Tensor dgamma1 = dgamma.clone(), dbeta1 = dbeta.clone();
  Tensor dx2 = ops::layer_norm_backward(ctx, dy, x, gamma, r.mean, r.rstd, dgamma, dbeta);
  EXPECT_TRUE(all_close(dx2, dx1, 0, 0));  // dx is overwritten, not accumulated
  const std::vector<double> g2 = dgamma.to_vector<double>(), g1 = dgamma1.to_vector<double>();
  const std::vector<double> b2 = dbeta.to_vector<double>(), b1 = dbeta1.to_vector<double>();
  for (size_t i = 0; i < g2.size(); ++i) {
    EXPECT_DOUBLE_EQ(g2[i], 2 * g1[i]);
    EXPECT_DOUBLE_EQ(b2[i], 2 * b1[i]);
  }
}

TEST(LayerNorm, BadInputsNameOpAndTensor) {
  ExecContext ctx;
  Tensor x = random_tensor({3, 4}, 1), gamma = random_tensor({4}, 2);
  EXPECT_TRUE(
      throws_naming([&] { ops::layer_norm_forward(ctx, x, random_tensor({5}, 2), Tensor(), 1e-5); },
                    {"layer_norm_forward: gamma "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::layer_norm_forward(ctx, x, gamma, random_tensor({4}, 3, -1, 1, DType::kF32), 1e-5);
      },
      {"layer_norm_forward: beta "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::layer_norm_forward(ctx, Tensor::zeros({3, 4}, DType::kI32), gamma, Tensor(), 1e-5);
      },
      {"layer_norm_forward: x "}));
  ops::LayerNormResult r = ops::layer_norm_forward(ctx, x, gamma, Tensor(), 1e-5);
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::layer_norm_backward(ctx, random_tensor({4, 3}, 4), x, gamma, r.mean, r.rstd, Tensor(),
                                 Tensor());
      },
      {"layer_norm_backward: dy "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::layer_norm_backward(ctx, random_tensor({3, 4}, 4), x, gamma, r.rstd.to(DType::kF32),
                                 r.rstd, Tensor(), Tensor());
      },
      {"layer_norm_backward: mean "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::layer_norm_backward(ctx, random_tensor({3, 4}, 4), x, gamma, r.mean, r.rstd,
                                 Tensor::zeros({3}, DType::kF64), Tensor());
      },
      {"layer_norm_backward: dgamma "}));
}

}  // namespace
}  // namespace strata
