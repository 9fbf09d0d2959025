#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "ops/cross_entropy.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_ids;
using testing::random_tensor;

void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no strata::Error thrown";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& n : needles) {
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' not in: " << what;
    }
  }
}

// Naive reference straight from the definition, in double: explicit log-softmax (direct, via the
// max-shifted log of the sum of exponentials) and an explicit smoothed target distribution q.
double naive_loss(const Tensor& logits, const Tensor& targets, const ops::CrossEntropyOptions& o) {
  const int64_t n = logits.size(0), v = logits.size(1);
  const std::vector<double> x = logits.to_vector<double>();
  const std::vector<int64_t> t = targets.to_vector<int64_t>();
  double total = 0.0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == o.ignore_index) continue;
    ++count;
    double m = x[i * v];
    for (int64_t j = 0; j < v; ++j) m = std::max(m, x[i * v + j]);
    double s = 0.0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[i * v + j] - m);
    for (int64_t j = 0; j < v; ++j) {
      const double logp = x[i * v + j] - m - std::log(s);
      const double q = (j == t[i] ? 1.0 - o.label_smoothing : 0.0) + o.label_smoothing / v;
      total -= q * logp;
    }
  }
  const double normalizer = o.normalizer > 0 ? o.normalizer : static_cast<double>(count);
  return normalizer > 0 ? total / normalizer : 0.0;
}

// Targets in [0, v) with every third row set to ignore_index.
Tensor targets_with_ignored(int64_t n, int64_t v, int64_t ignore, uint64_t seed) {
  std::vector<int64_t> t = random_ids({n}, v, seed).to_vector<int64_t>();
  for (int64_t i = 1; i < n; i += 3) t[i] = ignore;
  return Tensor::from_vector(t, {n});
}

struct CeCase {
  double label_smoothing;
  bool with_ignored;
  double normalizer;
};

class CrossEntropyTest : public ::testing::TestWithParam<CeCase> {
 protected:
  ops::CrossEntropyOptions options() const {
    ops::CrossEntropyOptions o;
    o.label_smoothing = GetParam().label_smoothing;
    o.normalizer = GetParam().normalizer;
    o.ignore_index = -100;
    return o;
  }
  Tensor targets(int64_t n, int64_t v, uint64_t seed) const {
    return GetParam().with_ignored ? targets_with_ignored(n, v, -100, seed)
                                   : random_ids({n}, v, seed);
  }
};

TEST_P(CrossEntropyTest, ForwardMatchesNaiveInF64AndF32) {
  ExecContext ctx;
  const Tensor logits = random_tensor({7, 5}, 1, -3, 3);
  const Tensor t = targets(7, 5, 2);
  const ops::CrossEntropyOptions o = options();
  const double ref = naive_loss(logits, t, o);
  const Tensor loss = ops::cross_entropy_forward(ctx, logits, t, o);
  EXPECT_EQ(loss.shape(), Shape{});
  EXPECT_EQ(loss.dtype(), DType::kF64);
  EXPECT_NEAR(loss.item<double>(), ref, 1e-13);
  const Tensor loss32 =
      ops::cross_entropy_forward(ctx, logits.to(DType::kF32), t.to(DType::kI32), o);
  EXPECT_EQ(loss32.dtype(), DType::kF32);
  EXPECT_NEAR(loss32.item<double>(), ref, 1e-5);
}

TEST_P(CrossEntropyTest, BackwardFiniteDifference) {
  ExecContext ctx;
  const Tensor logits = random_tensor({6, 4}, 3, -2, 2);
  const Tensor t = targets(6, 4, 4);
  const ops::CrossEntropyOptions o = options();
  const double dloss = 0.7;
  const Tensor dlogits = ops::cross_entropy_backward(ctx, logits, t, o, dloss);
  auto f = [&](const TensorList& xs) { return ops::cross_entropy_forward(ctx, xs[0], t, o); };
  EXPECT_TRUE(gradients_match(f, {logits}, Tensor::full({}, dloss, DType::kF64), {dlogits}));
  if (GetParam().with_ignored) {
    const std::vector<double> g = dlogits.to_vector<double>();
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(g[1 * 4 + j], 0.0);  // row 1 is ignored
  }
}

INSTANTIATE_TEST_SUITE_P(Options, CrossEntropyTest,
                         ::testing::Values(CeCase{0.0, false, 0.0}, CeCase{0.1, false, 0.0},
                                           CeCase{0.0, true, 0.0}, CeCase{0.2, true, 0.0},
                                           CeCase{0.0, false, 9.5}, CeCase{0.1, true, 16.0}),
                         [](const ::testing::TestParamInfo<CeCase>& info) {
                           const CeCase& c = info.param;
                           return std::string(c.label_smoothing > 0 ? "smooth" : "hard") +
                                  (c.with_ignored ? "_ignore" : "") +
                                  (c.normalizer > 0 ? "_normalizer" : "");
                         });

TEST(CrossEntropy, HandComputedTwoClassValue) {
  ExecContext ctx;
  // Row 0: logits (0, ln 3), target 1: p = 3/4, loss = -ln(3/4). Row 1 is ignored.
  const Tensor logits =
      Tensor::from_vector(std::vector<double>{0.0, std::log(3.0), 5.0, 1.0}, {2, 2});
  const Tensor targets = Tensor::from_vector(std::vector<int64_t>{1, 7}, {2});
  ops::CrossEntropyOptions o;
  o.ignore_index = 7;
  EXPECT_NEAR(ops::cross_entropy_forward(ctx, logits, targets, o).item<double>(), -std::log(0.75),
              1e-15);
  // With smoothing 0.2 (V = 2): q = (0.1, 0.9), loss = -0.1 ln(1/4) - 0.9 ln(3/4).
  o.label_smoothing = 0.2;
  EXPECT_NEAR(ops::cross_entropy_forward(ctx, logits, targets, o).item<double>(),
              -0.1 * std::log(0.25) - 0.9 * std::log(0.75), 1e-15);
  // dlogits of row 0 = p - q = (0.25 - 0.1, 0.75 - 0.9); row 1 is zero.
  const Tensor d = ops::cross_entropy_backward(ctx, logits, targets, o, 1.0);
  EXPECT_TRUE(
      all_close(d, Tensor::from_vector(std::vector<double>{0.15, -0.15, 0, 0}, {2, 2}), 1e-15, 0));
}

TEST(CrossEntropy, NormalizerMakesMicroBatchesAddUpToTheGlobalMean) {
  ExecContext ctx;
  const Tensor logits = random_tensor({8, 6}, 1, -2, 2);
  const Tensor t = targets_with_ignored(8, 6, -100, 2);
  ops::CrossEntropyOptions o;
  const double global = ops::cross_entropy_forward(ctx, logits, t, o).item<double>();
  o.normalizer = static_cast<double>(ops::count_targets(t, o.ignore_index));
  double sum = 0.0;
  for (int64_t m = 0; m < 2; ++m) {
    const Tensor lm = logits.narrow(0, 4 * m, 4).contiguous();
    const Tensor tm = t.narrow(0, 4 * m, 4).contiguous();
    sum += ops::cross_entropy_forward(ctx, lm, tm, o).item<double>();
  }
  EXPECT_NEAR(sum, global, 1e-14);
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndGradient) {
  ExecContext ctx;
  const Tensor logits = random_tensor({3, 4}, 1);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  const ops::CrossEntropyOptions o;
  EXPECT_EQ(ops::cross_entropy_forward(ctx, logits, t, o).item<double>(), 0.0);
  EXPECT_TRUE(all_close(ops::cross_entropy_backward(ctx, logits, t, o, 1.0),
                        Tensor::zeros({3, 4}, DType::kF64), 0, 0));
  EXPECT_EQ(ops::cross_entropy_forward(ctx, Tensor::zeros({0, 4}, DType::kF64),
                                       Tensor::zeros({0}, DType::kI64), o)
                .item<double>(),
            0.0);
}

TEST(CrossEntropy, StableForLargeLogits) {
  ExecContext ctx;
  const Tensor logits = random_tensor({4, 5}, 1);
  const Tensor shifted = random_tensor({4, 5}, 1, 999.0, 1001.0);  // same draws, +1000
  const Tensor t = random_ids({4}, 5, 2);
  const ops::CrossEntropyOptions o;
  const double a = ops::cross_entropy_forward(ctx, logits, t, o).item<double>();
  const double b = ops::cross_entropy_forward(ctx, shifted.to(DType::kF32), t, o).item<double>();
  EXPECT_TRUE(std::isfinite(b));
  EXPECT_NEAR(a, b, 1e-3);  // f32 resolution at 1000 is 6e-5 per logit
  const Tensor d = ops::cross_entropy_backward(ctx, shifted.to(DType::kF32), t, o, 1.0);
  EXPECT_TRUE(all_close(d, ops::cross_entropy_backward(ctx, logits, t, o, 1.0), 1e-4, 0));
}

TEST(CrossEntropy, LargeBatchTakesTheParallelPath) {
  ExecContext ctx;
  const Tensor logits = random_tensor({64, 600}, 1, -4, 4);
  const Tensor t = targets_with_ignored(64, 600, -100, 2);
  ops::CrossEntropyOptions o;
  o.label_smoothing = 0.1;
  EXPECT_NEAR(ops::cross_entropy_forward(ctx, logits, t, o).item<double>(),
              naive_loss(logits, t, o), 1e-12);
  const Tensor d = ops::cross_entropy_backward(ctx, logits, t, o, 1.0);
  // Each counted row of dlogits sums to 0 (softmax and q both sum to 1).
  const std::vector<double> g = d.to_vector<double>();
  for (int64_t i = 0; i < 64; ++i) {
    double s = 0.0;
    for (int64_t j = 0; j < 600; ++j) s += g[i * 600 + j];
    EXPECT_NEAR(s, 0.0, 1e-15);
  }
}

TEST(CountTargets, CountsTargetsThatAreNotIgnored) {
  EXPECT_EQ(
      ops::count_targets(Tensor::from_vector(std::vector<int64_t>{1, -100, 3, -100}, {4}), -100),
      2);
  EXPECT_EQ(ops::count_targets(Tensor::from_vector(std::vector<int32_t>{0, 0, 5}, {3}), 0), 1);
  expect_error([] { ops::count_targets(Tensor::zeros({3}, DType::kF32), -100); },
               {"count_targets", "targets must be i32 or i64"});
}

TEST(CrossEntropy, RejectsBadInputsNamingOpRowAndValue) {
  ExecContext ctx;
  const Tensor logits = random_tensor({3, 5}, 1);
  const ops::CrossEntropyOptions o;
  auto fwd = [&](const Tensor& t) { ops::cross_entropy_forward(ctx, logits, t, o); };
  expect_error(
      [&] {
        fwd(Tensor::from_vector(std::vector<int64_t>{0, 4, 5}, {3}));
      },
      {"cross_entropy_forward", "targets[2] = 5", "V = 5"});
  expect_error(
      [&] {
        fwd(Tensor::from_vector(std::vector<int64_t>{-1, 4, 0}, {3}));
      },
      {"cross_entropy_forward", "targets[0] = -1", "V = 5"});
  expect_error(
      [&] {
        ops::cross_entropy_backward(
            ctx, logits, Tensor::from_vector(std::vector<int32_t>{0, 9, 1}, {3}), o, 1.0);
      },
      {"cross_entropy_backward", "targets[1] = 9", "V = 5"});
  expect_error(
      [&] {
        fwd(Tensor::from_vector(std::vector<int64_t>{0, 1}, {2}));
      },
      {"cross_entropy_forward", "targets has shape (2,)", "(3,)"});
  expect_error([&] { fwd(Tensor::zeros({3}, DType::kF64)); },
               {"cross_entropy_forward", "targets must be i32 or i64"});
  expect_error(
      [&] {
        ops::cross_entropy_forward(ctx, random_tensor({3, 5, 1}, 1),
                                   Tensor::zeros({3}, DType::kI64), o);
      },
      {"cross_entropy_forward", "logits must be (N, V)"});
  ops::CrossEntropyOptions bad;
  bad.label_smoothing = 1.0;
  expect_error(
      [&] { ops::cross_entropy_forward(ctx, logits, Tensor::zeros({3}, DType::kI64), bad); },
      {"cross_entropy_forward", "label_smoothing"});
  bad.label_smoothing = 0.0;
  bad.normalizer = -1.0;
  expect_error(
      [&] { ops::cross_entropy_forward(ctx, logits, Tensor::zeros({3}, DType::kI64), bad); },
      {"cross_entropy_forward", "normalizer"});
}

}  // namespace
}  // namespace strata
