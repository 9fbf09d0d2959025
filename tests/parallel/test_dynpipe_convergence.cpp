// DynPipe's convergence side (parallel/dynpipe/convergence.h): the L and xi^2 estimators on
// losses whose constants are known, Eq. 3's updates, and Algorithm 1's limits
// (papers/dynpipe.md Sec. 5 items 5 and 6).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/dynpipe/convergence.h"
#include "parallel/dynpipe_test_util.h"

namespace strata::parallel::dynpipe {
namespace {

using testing::throws_message;

constexpr double kInf = std::numeric_limits<double>::infinity();

// SGD on f(w) = 1/2 w^T A w (gradient A w) from a random start, with noise added to the steps
// so that they point anywhere: the weights and the gradients at them.
void quadratic_run(const std::vector<std::vector<double>>& A, int iterations, double lr,
                   std::vector<std::vector<double>>* weights,
                   std::vector<std::vector<double>>* gradients, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const size_t n = A.size();
  std::vector<double> w(n);
  for (double& v : w) v = normal(rng);
  for (int t = 0; t < iterations; ++t) {
    std::vector<double> g(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) g[i] += A[i][j] * w[j];
    }
    weights->push_back(w);
    gradients->push_back(g);
    for (size_t i = 0; i < n; ++i) w[i] -= lr * g[i] + 0.1 * normal(rng);
  }
}

TEST(DynPipeConvergence, SmoothnessOfAScaledNormIsExactlyItsScale) {
  // f(w) = 1/2 a ||w||^2: every sample is ||a dw|| / ||dw|| = a (exact for a power of two).
  const std::vector<std::vector<double>> A4 = {{4, 0, 0}, {0, 4, 0}, {0, 0, 4}};
  std::vector<std::vector<double>> w, g;
  quadratic_run(A4, 12, 0.05, &w, &g, 1);
  SmoothnessEstimate e = estimate_smoothness(w, g);
  ASSERT_EQ(e.samples.size(), 11u);
  for (double s : e.samples) EXPECT_EQ(s, 4.0);
  EXPECT_EQ(e.median, 4.0);
  EXPECT_EQ(e.mean, 4.0);
  EXPECT_EQ(e.max, 4.0);
  EXPECT_EQ(e.skipped, 0);
  // Any other scale, to rounding.
  const std::vector<std::vector<double>> A = {{3.7, 0}, {0, 3.7}};
  w.clear();
  g.clear();
  quadratic_run(A, 6, 0.1, &w, &g, 2);
  e = estimate_smoothness(w, g);
  for (double s : e.samples) EXPECT_NEAR(s, 3.7, 1e-12);
}

TEST(DynPipeConvergence, SmoothnessOfAQuadraticLiesBetweenItsEigenvalues) {
  // A = R diag(0.5, 2, 7) R^T, R a rotation in the (0, 1) plane by 0.6 rad: eigenvalues 0.5..7.
  const double c = std::cos(0.6), s = std::sin(0.6);
  const double l0 = 0.5, l1 = 2.0, l2 = 7.0;
  const std::vector<std::vector<double>> A = {{c * c * l0 + s * s * l1, c * s * (l0 - l1), 0},
                                              {c * s * (l0 - l1), s * s * l0 + c * c * l1, 0},
                                              {0, 0, l2}};
  std::vector<std::vector<double>> w, g;
  quadratic_run(A, 40, 0.05, &w, &g, 3);
  const SmoothnessEstimate e = estimate_smoothness(w, g);
  ASSERT_EQ(e.samples.size(), 39u);
  double lo = kInf, hi = 0;
  for (double v : e.samples) {
    EXPECT_GE(v, l0 - 1e-12);
    EXPECT_LE(v, l2 + 1e-12);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LT(lo, hi);  // the samples differ: the steps point in different directions
  EXPECT_LE(e.median, e.max);
  EXPECT_EQ(e.max, hi);
}

TEST(DynPipeConvergence, SameBatchPairsCancelTheBatchNoise) {
  // f(w) = 1/2 a ||w||^2 with a = 2, stochastic gradients a w + n_t, n_t of norm ~10 per batch:
  // pairs on the same batch give exactly a; consecutive iterations mostly measure the noise.
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 3.0);
  const double a = 2.0, lr = 0.01;
  std::vector<double> w = {1, -2, 0.5, 3, -1, 2, 0.25, -0.5, 1.5, -3, 2.5, 1};
  std::vector<WarmupStep> steps;
  std::vector<std::vector<double>> weights, gradients;
  for (int t = 0; t < 9; ++t) {
    std::vector<double> noise(w.size()), g(w.size()), next(w.size()), g_next(w.size());
    for (double& v : noise) v = normal(rng);
    for (size_t k = 0; k < w.size(); ++k) g[k] = a * w[k] + noise[k];
    for (size_t k = 0; k < w.size(); ++k) next[k] = w[k] - lr * g[k];
    for (size_t k = 0; k < w.size(); ++k) g_next[k] = a * next[k] + noise[k];
    steps.push_back({w, g, next, g_next, 1.0});
    weights.push_back(w);
    gradients.push_back(g);
    w = next;
  }
  const WarmupEstimate e = estimate_warmup(steps);
  ASSERT_EQ(e.smoothness.samples.size(), 9u);
  for (double v : e.smoothness.samples) EXPECT_NEAR(v, a, 1e-9);
  // Consecutive stochastic gradients: the noise difference over a step of lr x ||g||.
  EXPECT_GT(estimate_smoothness(weights, gradients).median, 10 * a);
}

TEST(DynPipeConvergence, EstimatorsSkipStillStepsAndRefuseBadInput) {
  // Two identical iterations in the middle: that pair is skipped.
  const std::vector<std::vector<double>> w = {{1, 0}, {0.5, 0}, {0.5, 0}, {0.25, 0}};
  const std::vector<std::vector<double>> g = {{2, 0}, {1, 0}, {1, 0}, {0.5, 0}};
  const SmoothnessEstimate e = estimate_smoothness(w, g);
  EXPECT_EQ(e.skipped, 1);
  EXPECT_EQ(e.samples, (std::vector<double>{2.0, 2.0}));
  // xi^2 = the mean squared norm: (4 + 1 + 1 + 0.25) / 4.
  EXPECT_EQ(estimate_second_moment(g), 6.25 / 4.0);
  EXPECT_EQ(estimate_second_moment({{3, 4}, {3, 4}}), 25.0);
  const std::vector<WarmupStep> steps = {{{1, 0}, {2, 0}, {0.5, 0}, {1, 0}, 2.5},
                                         {{0.5, 0}, {1, 0}, {0.5, 0}, {1, 0}, 2.0},
                                         {{0.5, 0}, {1, 0}, {0.25, 0}, {0.5, 0}, 2.0}};
  const WarmupEstimate warm = estimate_warmup(steps);
  EXPECT_EQ(warm.initial_loss, 2.5);
  EXPECT_EQ(warm.iterations, 3);
  EXPECT_EQ(warm.smoothness.samples, (std::vector<double>{2.0, 2.0}));
  EXPECT_EQ(warm.smoothness.skipped, 1);
  EXPECT_EQ(warm.second_moment, 6.0 / 3.0);  // the gradients at w_t: 4, 1, 1

  EXPECT_NE(throws_message([] { estimate_smoothness({{1}}, {{1}}); }).find("two iterations"),
            std::string::npos);
  EXPECT_NE(throws_message([] {
              estimate_smoothness({{1}, {1}}, {{1}, {2}});
            }).find("weights never changed"),
            std::string::npos);
  EXPECT_NE(throws_message([] {
              estimate_smoothness({{1, 2}, {1}}, {{1, 2}, {1, 2}});
            }).find("the weights of iteration 1 has 1 values"),
            std::string::npos);
  EXPECT_NE(throws_message([] {
              estimate_smoothness({{1}, {2}}, {{1}, {NAN}});
            }).find("gradient of iteration 1 is not finite"),
            std::string::npos);
  std::vector<WarmupStep> bad = steps;
  bad[2].loss = NAN;
  EXPECT_NE(throws_message([&] { estimate_warmup(bad); }).find("the loss of step 2"),
            std::string::npos);
  bad = steps;
  bad[1].next_gradient = {1};
  EXPECT_NE(throws_message([&] {
              estimate_warmup(bad);
            }).find("the next gradient of step 1 has 1 values, the first weights have 2"),
            std::string::npos);
  EXPECT_NE(throws_message([] { estimate_warmup({}); }).find("no step"), std::string::npos);
}

ConvergenceInputs inputs(double lr, double eps, double L, double xi2, double f0) {
  ConvergenceInputs in;
  in.lr = lr;
  in.epsilon = eps;
  in.smoothness = L;
  in.second_moment = xi2;
  in.initial_loss = f0;
  return in;
}

TEST(DynPipeConvergence, Eq3UpdatesGrowWithStagesSmoothnessAndNoise) {
  const ConvergenceInputs base = inputs(0.1, 1.0, 1.0, 1.0, 2.0);
  // S = 1: 2 f0 / (eta (eps - 2 eta^2 L^2 xi^2)) = 4 / (0.1 x 0.98).
  EXPECT_DOUBLE_EQ(required_updates(base, 1), 4.0 / (0.1 * 0.98));
  EXPECT_DOUBLE_EQ(staleness_error(base, 3), 2 * 0.01 * 27);
  double previous = 0;
  for (int S = 1; S <= 3; ++S) {
    const double T = required_updates(base, S);
    EXPECT_GT(T, previous) << S;
    previous = T;
    ConvergenceInputs more = base;
    more.smoothness = 1.5;
    EXPECT_GT(required_updates(more, S), T) << S;
    more = base;
    more.second_moment = 1.5;
    EXPECT_GT(required_updates(more, S), T) << S;
  }
  // S = 4: 2 x 0.01 x 64 = 1.28 >= eps: never.
  EXPECT_EQ(required_updates(base, 4), kInf);
  // Exactly on the limit: eps = 2 eta^2 S^3 L^2 xi^2 (S = 2: 16 x 2^-6 = 0.25, exact) is infinite.
  EXPECT_EQ(required_updates(inputs(0.125, 0.25, 1.0, 1.0, 1.0), 2), kInf);
  EXPECT_TRUE(std::isfinite(required_updates(inputs(0.125, 0.25, 1.0, 1.0, 1.0), 1)));
  // No staleness penalty: T is the same for every S.
  EXPECT_EQ(required_updates(inputs(0.1, 1, 0, 1, 2), 1),
            required_updates(inputs(0.1, 1, 0, 1, 2), 8));
}

TEST(DynPipeConvergence, Algorithm1Limits) {
  const std::vector<double> W = {100, 55, 40, 34, 33, 35};  // ms per iteration, S = 1..6
  // L = 0: T does not depend on S, so the S of least W.
  StageChoice c = choose_stages(inputs(0.1, 1, 0, 5, 2), W, false);
  EXPECT_EQ(c.stages, 5);
  EXPECT_EQ(c.evaluated.size(), 6u);
  // 2 eta^2 L^2 xi^2 < eps <= 16 eta^2 L^2 xi^2: only S = 1 converges, however fast S = 2 is.
  const ConvergenceInputs tight = inputs(0.1, 0.15, 1.0, 1.0, 2.0);  // 0.02 < 0.15 <= 0.16
  c = choose_stages(tight, {100, 1, 1, 1}, false);
  EXPECT_EQ(c.stages, 1);
  EXPECT_TRUE(std::isfinite(c.evaluated[0].total_ms));
  for (int S = 2; S <= 4; ++S) EXPECT_EQ(c.evaluated[S - 1].total_ms, kInf) << S;
  // The turning point stops at S = 2 (T infinite there) with the same choice.
  c = choose_stages(tight, {100, 1, 1, 1}, true);
  EXPECT_EQ(c.stages, 1);
  EXPECT_TRUE(c.stopped_early);
  EXPECT_EQ(c.evaluated.size(), 2u);
  // Epsilon below even S = 1's staleness error: nothing converges.
  c = choose_stages(inputs(0.1, 0.01, 1.0, 1.0, 2.0), W, false);
  EXPECT_EQ(c.stages, 0);
  // A stage count with no plan (infinite W) is passed over.
  c = choose_stages(inputs(0.1, 1, 0, 5, 2), {100, kInf, 40}, false);
  EXPECT_EQ(c.stages, 3);
}

TEST(DynPipeConvergence, TurningPointMatchesFullSearchOnUnimodalProducts) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int early = 0;
  for (int trial = 0; trial < 500; ++trial) {
    // W(S) = a / S + b S + c (convex in S), T(S) from Eq. 3 (convex, increasing): T x W is
    // unimodal over S = 1..8.
    const double a = 10 + 200 * u(rng), b = 5 * u(rng), cst = 5 * u(rng);
    std::vector<double> W;
    for (int S = 1; S <= 8; ++S) W.push_back(a / S + b * S + cst);
    const ConvergenceInputs in = inputs(0.05, 0.5 + u(rng), 2 * u(rng), 2 * u(rng), 1 + u(rng));
    const StageChoice full = choose_stages(in, W, false);
    std::vector<double> product;
    for (const StageCandidate& k : full.evaluated) product.push_back(k.total_ms);
    bool unimodal = true, falling = true;
    for (size_t k = 1; k < product.size(); ++k) {
      if (product[k] > product[k - 1])
        falling = false;
      else if (!falling && product[k] < product[k - 1])
        unimodal = false;
    }
    if (!unimodal) continue;
    const StageChoice fast = choose_stages(in, W, true);
    EXPECT_EQ(fast.stages, full.stages) << "trial " << trial;
    early += fast.stopped_early ? 1 : 0;
  }
  EXPECT_GT(early, 100);  // the rule did stop early in many trials
  // On a product that is not unimodal it is a heuristic: it stops at the first rise.
  const StageChoice heuristic = choose_stages(inputs(0.1, 1, 0, 1, 1), {10, 12, 5}, true);
  EXPECT_EQ(heuristic.stages, 1);
  EXPECT_EQ(choose_stages(inputs(0.1, 1, 0, 1, 1), {10, 12, 5}, false).stages, 3);
}

TEST(DynPipeConvergence, BadInputsNameTheirFlags) {
  const std::vector<double> W = {1.0};
  EXPECT_NE(
      throws_message([&] { choose_stages(inputs(0, 1, 1, 1, 1), W, false); }).find("--dynpipe-lr"),
      std::string::npos);
  EXPECT_NE(throws_message([&] {
              choose_stages(inputs(0.1, -1, 1, 1, 1), W, false);
            }).find("--dynpipe-epsilon"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              choose_stages(inputs(0.1, 1, NAN, 1, 1), W, false);
            }).find("--dynpipe-smoothness"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              choose_stages(inputs(0.1, 1, 1, -2, 1), W, false);
            }).find("--dynpipe-noise"),
            std::string::npos);
  EXPECT_NE(throws_message([&] {
              choose_stages(inputs(0.1, 1, 1, 1, 0), W, false);
            }).find("--dynpipe-initial-loss"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::parallel::dynpipe
