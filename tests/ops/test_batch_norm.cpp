#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ops/batch_norm.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

constexpr double kEps = 1e-5;

struct NaiveStats {
  std::vector<double> mean, var;  // biased variance
  int64_t n = 0;
};

// Per-channel mean and biased variance of x (B, C, ...), by plain loops in double.
NaiveStats naive_stats(const Tensor& x) {
  const int64_t b = x.size(0), c = x.size(1), s = x.numel() / (b * c);
  const std::vector<double> xv = x.to_vector<double>();
  NaiveStats st;
  st.n = b * s;
  st.mean.assign(c, 0.0);
  st.var.assign(c, 0.0);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < c; ++j)
      for (int64_t k = 0; k < s; ++k) st.mean[j] += xv[(i * c + j) * s + k] / st.n;
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < c; ++j)
      for (int64_t k = 0; k < s; ++k) {
        const double d = xv[(i * c + j) * s + k] - st.mean[j];
        st.var[j] += d * d / st.n;
      }
  return st;
}

// y = (x - mean) / sqrt(var + eps) * gamma + beta with the given per-channel statistics.
Tensor naive_normalize(const Tensor& x, const std::vector<double>& mean,
                       const std::vector<double>& var, const Tensor& gamma, const Tensor& beta) {
  const int64_t c = x.size(1), s = x.numel() / (x.size(0) * c);
  std::vector<double> y = x.to_vector<double>();
  const std::vector<double> g =
      gamma.defined() ? gamma.to_vector<double>() : std::vector<double>(c, 1.0);
  const std::vector<double> b =
      beta.defined() ? beta.to_vector<double>() : std::vector<double>(c, 0.0);
  for (size_t i = 0; i < y.size(); ++i) {
    const int64_t j = (static_cast<int64_t>(i) / s) % c;
    y[i] = (y[i] - mean[j]) / std::sqrt(var[j] + kEps) * g[j] + b[j];
  }
  return Tensor::from_vector(y, x.shape());
}

class BatchNormTest : public ::testing::TestWithParam<Shape> {
 protected:
  int64_t channels() const { return GetParam()[1]; }
};

TEST_P(BatchNormTest, TrainForwardMatchesNaiveAndUpdatesRunningStats) {
  ExecContext ctx;
  const double momentum = 0.1;
  Tensor x = random_tensor(GetParam(), 1, -2.0, 3.0);
  Tensor gamma = random_tensor({channels()}, 2), beta = random_tensor({channels()}, 3);
  Tensor rm = random_tensor({channels()}, 4), rv = random_tensor({channels()}, 5, 0.5, 2.0);
  const std::vector<double> rm0 = rm.to_vector<double>(), rv0 = rv.to_vector<double>();
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x, gamma, beta, rm, rv, momentum, kEps);
  const NaiveStats st = naive_stats(x);
  EXPECT_TRUE(all_close(r.y, naive_normalize(x, st.mean, st.var, gamma, beta), 1e-12, 1e-12));
  std::vector<double> invstd, rm1, rv1;
  for (int64_t c = 0; c < channels(); ++c) {
    invstd.push_back(1.0 / std::sqrt(st.var[c] + kEps));
    rm1.push_back((1 - momentum) * rm0[c] + momentum * st.mean[c]);
    rv1.push_back((1 - momentum) * rv0[c] + momentum * st.var[c] * st.n / (st.n - 1));
  }
  EXPECT_TRUE(all_close(r.save_mean, Tensor::from_vector(st.mean, {channels()}), 1e-13, 1e-13));
  EXPECT_TRUE(all_close(r.save_invstd, Tensor::from_vector(invstd, {channels()}), 1e-13, 1e-13));
  EXPECT_TRUE(all_close(rm, Tensor::from_vector(rm1, {channels()}), 1e-13, 1e-13));
  EXPECT_TRUE(all_close(rv, Tensor::from_vector(rv1, {channels()}), 1e-13, 1e-13));
}

TEST_P(BatchNormTest, F32ForwardCloseToF64Reference) {
  ExecContext ctx;
  // An offset far from zero: a one-pass variance in f32 would lose most digits here.
  Tensor x = random_tensor(GetParam(), 6, 99.0, 101.0);
  Tensor gamma = random_tensor({channels()}, 7), beta = random_tensor({channels()}, 8);
  const NaiveStats st = naive_stats(x);
  const Tensor ref = naive_normalize(x, st.mean, st.var, gamma, beta);
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x.to(DType::kF32), gamma.to(DType::kF32),
                                    beta.to(DType::kF32), Tensor(), Tensor(), 0.1, kEps);
  EXPECT_EQ(r.y.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(r.y, ref, 1e-4, 1e-4));
}

TEST_P(BatchNormTest, EvalForwardUsesRunningStats) {
  ExecContext ctx;
  Tensor x = random_tensor(GetParam(), 9);
  Tensor gamma = random_tensor({channels()}, 10), beta = random_tensor({channels()}, 11);
  Tensor rm = random_tensor({channels()}, 12), rv = random_tensor({channels()}, 13, 0.5, 2.0);
  const Tensor ref =
      naive_normalize(x, rm.to_vector<double>(), rv.to_vector<double>(), gamma, beta);
  EXPECT_TRUE(all_close(ops::batch_norm_forward_eval(ctx, x, gamma, beta, rm, rv, kEps), ref, 1e-12,
                        1e-12));
  Tensor y32 = ops::batch_norm_forward_eval(ctx, x.to(DType::kF32), gamma.to(DType::kF32),
                                            beta.to(DType::kF32), rm.to(DType::kF32),
                                            rv.to(DType::kF32), kEps);
  EXPECT_TRUE(all_close(y32, ref, 1e-5, 1e-5));
  const Tensor plain =
      naive_normalize(x, rm.to_vector<double>(), rv.to_vector<double>(), Tensor(), Tensor());
  EXPECT_TRUE(all_close(ops::batch_norm_forward_eval(ctx, x, Tensor(), Tensor(), rm, rv, kEps),
                        plain, 1e-12, 1e-12));
}

TEST_P(BatchNormTest, BackwardFiniteDifference) {
  ExecContext ctx;
  Tensor x = random_tensor(GetParam(), 14);
  Tensor gamma = random_tensor({channels()}, 15), beta = random_tensor({channels()}, 16);
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x, gamma, beta, Tensor(), Tensor(), 0.1, kEps);
  Tensor dy = random_tensor(x.shape(), 17);
  Tensor dgamma = Tensor::zeros({channels()}, DType::kF64);
  Tensor dbeta = Tensor::zeros({channels()}, DType::kF64);
  Tensor dx =
      ops::batch_norm_backward(ctx, dy, x, gamma, r.save_mean, r.save_invstd, dgamma, dbeta);
  auto f = [&](const TensorList& xs) {
    return ops::batch_norm_forward_train(ctx, xs[0], xs[1], xs[2], Tensor(), Tensor(), 0.1, kEps).y;
  };
  EXPECT_TRUE(gradients_match(f, {x, gamma, beta}, dy, {dx, dgamma, dbeta}));
}

TEST_P(BatchNormTest, BackwardWithoutAffineFiniteDifference) {
  ExecContext ctx;
  Tensor x = random_tensor(GetParam(), 18);
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x, Tensor(), Tensor(), Tensor(), Tensor(), 0.1, kEps);
  Tensor dy = random_tensor(x.shape(), 19);
  Tensor dx = ops::batch_norm_backward(ctx, dy, x, Tensor(), r.save_mean, r.save_invstd, Tensor(),
                                       Tensor());
  auto f = [&](const TensorList& xs) {
    return ops::batch_norm_forward_train(ctx, xs[0], Tensor(), Tensor(), Tensor(), Tensor(), 0.1,
                                         kEps)
        .y;
  };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormTest,
                         ::testing::Values(Shape{6, 4}, Shape{3, 2, 5}, Shape{2, 3, 4, 5},
                                           Shape{2, 3, 2, 2, 3}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.size()) + "d";
                         });

TEST(BatchNorm, RunningStatsKnownValues) {
  ExecContext ctx;
  // One channel holding 1, 2, 3, 4: mean 2.5, biased variance 1.25, unbiased 5 / 3.
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {4, 1});
  Tensor rm = Tensor::zeros({1}, DType::kF64), rv = Tensor::full({1}, 1.0, DType::kF64);
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x, Tensor(), Tensor(), rm, rv, 0.1, 0.0);
  EXPECT_DOUBLE_EQ(rm.item<double>(), 0.25);
  EXPECT_DOUBLE_EQ(rv.item<double>(), 0.9 + 0.1 * 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(r.save_mean.item<double>(), 2.5);
  EXPECT_DOUBLE_EQ(r.save_invstd.item<double>(), 1.0 / std::sqrt(1.25));
  ops::batch_norm_forward_train(ctx, x, Tensor(), Tensor(), rm, rv, 0.1, 0.0);
  EXPECT_DOUBLE_EQ(rm.item<double>(), 0.9 * 0.25 + 0.25);
}

TEST(BatchNorm, ParameterGradientsAccumulate) {
  ExecContext ctx;
  Tensor x = random_tensor({4, 3, 5}, 1), dy = random_tensor({4, 3, 5}, 2);
  Tensor gamma = random_tensor({3}, 3), beta = random_tensor({3}, 4);
  ops::BatchNormTrainResult r =
      ops::batch_norm_forward_train(ctx, x, gamma, beta, Tensor(), Tensor(), 0.1, kEps);
  Tensor dgamma = Tensor::zeros({3}, DType::kF64), dbeta = Tensor::zeros({3}, DType::kF64);
  Tensor dx1 =
      ops::batch_norm_backward(ctx, dy, x, gamma, r.save_mean, r.save_invstd, dgamma, dbeta);
  const std::vector<double> g1 = dgamma.to_vector<double>(), b1 = dbeta.to_vector<double>();
  Tensor dx2 =
      ops::batch_norm_backward(ctx, dy, x, gamma, r.save_mean, r.save_invstd, dgamma, dbeta);
  const std::vector<double> g2 = dgamma.to_vector<double>(), b2 = dbeta.to_vector<double>();
  for (size_t i = 0; i < g2.size(); ++i) EXPECT_DOUBLE_EQ(g2[i], 2 * g1[i]);
  for (size_t i = 0; i < b2.size(); ++i) EXPECT_DOUBLE_EQ(b2[i], 2 * b1[i]);
  EXPECT_TRUE(all_close(dx2, dx1, 0, 0));  // dx is returned fresh, not accumulated
}

// Runs f, expects a strata::Error whose message contains every one of `words`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error thrown; expected one mentioning '" << words.back() << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& word : words) {
      EXPECT_NE(message.find(word), std::string::npos) << "'" << word << "' not in: " << message;
    }
  }
}

// An f32 batch norm over 224 x 224 planes (50176 values per image and channel) gives gradients
// within 1e-6 relative of the same op in float64 on the same values: its sums are accumulated in
// double (an f32 sum per plane drifts by ~1e-5 to 1e-4 at these sizes).
TEST(BatchNorm, F32GradientsAt224PxMatchFloat64To1e6) {
  ExecContext ctx;
  const Shape shape{2, 3, 224, 224};
  const Tensor x = random_tensor(shape, 11, -1.0, 2.0, DType::kF32);
  const Tensor dy = random_tensor(shape, 12, -1.0, 1.0, DType::kF32);
  const Tensor gamma = random_tensor({3}, 13, 0.5, 1.5, DType::kF32);
  const Tensor beta = random_tensor({3}, 14, -0.5, 0.5, DType::kF32);
  struct Out {
    std::vector<double> y, dx, dgamma, dbeta;
  };
  auto run = [&](DType dtype) {
    const Tensor g = gamma.to(dtype);
    const Tensor dgamma = Tensor::zeros({3}, dtype), dbeta = Tensor::zeros({3}, dtype);
    const ops::BatchNormTrainResult r = ops::batch_norm_forward_train(
        ctx, x.to(dtype), g, beta.to(dtype), Tensor(), Tensor(), 0.1, kEps);
    const Tensor dx = ops::batch_norm_backward(ctx, dy.to(dtype), x.to(dtype), g, r.save_mean,
                                               r.save_invstd, dgamma, dbeta);
    return Out{r.y.to_vector<double>(), dx.to_vector<double>(), dgamma.to_vector<double>(),
               dbeta.to_vector<double>()};
  };
  const Out f32 = run(DType::kF32), f64 = run(DType::kF64);
  // Relative to the largest magnitude of the float64 result (element-wise relative error is
  // meaningless where a value is near 0).
  auto max_relative = [](const std::vector<double>& a, const std::vector<double>& b) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::fabs(a[i] - b[i]));
      scale = std::max(scale, std::fabs(b[i]));
    }
    return diff / scale;
  };
  EXPECT_LE(max_relative(f32.y, f64.y), 1e-6);
  EXPECT_LE(max_relative(f32.dx, f64.dx), 1e-6);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(f32.dgamma[c], f64.dgamma[c], 1e-6 * std::fabs(f64.dgamma[c])) << "channel " << c;
    EXPECT_NEAR(f32.dbeta[c], f64.dbeta[c], 1e-6 * std::fabs(f64.dbeta[c])) << "channel " << c;
  }
}

TEST(BatchNorm, RejectsBadInputs) {
  ExecContext ctx;
  Tensor x = random_tensor({4, 3, 2}, 1), c3 = random_tensor({3}, 2);
  const char* train = "batch_norm_forward_train";
  expect_error(
      [&] { ops::batch_norm_forward_train(ctx, random_tensor({4}, 1), c3, c3, {}, {}, 0.1, 1e-5); },
      {train, "x"});
  expect_error(
      [&] { ops::batch_norm_forward_train(ctx, x, random_tensor({4}, 2), c3, {}, {}, 0.1, 1e-5); },
      {train, "gamma"});
  expect_error(
      [&] { ops::batch_norm_forward_train(ctx, x, c3, c3.to(DType::kF32), {}, {}, 0.1, 1e-5); },
      {train, "beta", "f32"});
  expect_error([&] { ops::batch_norm_forward_train(ctx, x, c3, c3, c3.clone(), {}, 0.1, 1e-5); },
               {train, "running_var"});
  expect_error(
      [&] {
        ops::batch_norm_forward_train(ctx, random_tensor({1, 3}, 1), c3, c3, {}, {}, 0.1, 1e-5);
      },
      {train, "more than one"});
  expect_error(
      [&] { ops::batch_norm_forward_train(ctx, x.to(DType::kI64), {}, {}, {}, {}, 0.1, 1e-5); },
      {train, "x", "i64"});
  expect_error([&] { ops::batch_norm_forward_eval(ctx, x, c3, c3, {}, {}, 1e-5); },
               {"batch_norm_forward_eval", "running_mean"});
  expect_error(
      [&] { ops::batch_norm_forward_eval(ctx, x, c3, c3, c3, random_tensor({2}, 3), 1e-5); },
      {"batch_norm_forward_eval", "running_var"});
  expect_error(
      [&] {
        ops::batch_norm_backward(ctx, random_tensor({4, 3, 3}, 3), x, c3, c3, c3, {}, {});
      },
      {"batch_norm_backward", "dy"});
  expect_error([&] { ops::batch_norm_backward(ctx, x, x, c3, random_tensor({2}, 3), c3, {}, {}); },
               {"batch_norm_backward", "save_mean"});
  expect_error(
      [&] { ops::batch_norm_backward(ctx, x, x, c3, c3, c3, Tensor::zeros({3}, DType::kF32), {}); },
      {"batch_norm_backward", "dgamma"});
}

}  // namespace
}  // namespace strata
