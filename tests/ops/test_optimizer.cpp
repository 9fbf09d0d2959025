#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/optimizer.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
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

Tensor vec(const std::vector<double>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

// ---- SGD ---------------------------------------------------------------------------------------

// The recurrence of torch.optim.SGD, written out in double:
//   g = grad + wd p
//   buf = g (first step) or momentum buf + (1 - dampening) g
//   g = g + momentum buf (nesterov) or buf
//   p = p - lr g
struct SgdReference {
  std::vector<double> p, buf;
  void step(const std::vector<double>& grad, const ops::SgdOptions& o, int64_t t) {
    for (size_t i = 0; i < p.size(); ++i) {
      double g = grad[i] + o.weight_decay * p[i];
      if (o.momentum > 0) {
        buf[i] = t == 1 ? g : o.momentum * buf[i] + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * g;
    }
  }
};

struct SgdCase {
  const char* name;
  ops::SgdOptions options;
};

ops::SgdOptions sgd(double lr, double momentum, double dampening, bool nesterov, double wd) {
  ops::SgdOptions o;
  o.lr = lr;
  o.momentum = momentum;
  o.dampening = dampening;
  o.nesterov = nesterov;
  o.weight_decay = wd;
  return o;
}

class SgdTest : public ::testing::TestWithParam<SgdCase> {};

// param, grad and the momentum buffer are views into larger flat buffers, as the trainer lays
// them out; elements outside the views must stay untouched.
TEST_P(SgdTest, FiveStepsMatchTheReferenceOnViewsOfFlatBuffers) {
  const ops::SgdOptions& o = GetParam().options;
  for (DType dtype : {DType::kF64, DType::kF32}) {
    ExecContext ctx;
    const Tensor params = random_tensor({20}, 1, -1, 1, dtype);
    const Tensor grads = Tensor::zeros({20}, dtype);
    const Tensor state = Tensor::zeros({20}, dtype);
    const Tensor p = params.narrow(0, 5, 12).view({3, 4});
    const Tensor g = grads.narrow(0, 5, 12).view({3, 4});
    const Tensor buf = state.narrow(0, 5, 12).view({3, 4});
    const std::vector<double> p0 = params.to_vector<double>();
    SgdReference ref{p.to_vector<double>(), std::vector<double>(12, 0.0)};
    for (int64_t t = 1; t <= 5; ++t) {
      const Tensor grad = random_tensor({3, 4}, 100 + t, -1, 1, dtype);
      g.copy_from(grad);
      ops::sgd_step(ctx, p, g, o.momentum > 0 ? buf : Tensor(), o, t);
      ref.step(grad.to_vector<double>(), o, t);
    }
    const double tol = dtype == DType::kF64 ? 1e-14 : 1e-6;
    EXPECT_TRUE(all_close(p, Tensor::from_vector(ref.p, {3, 4}), tol, tol));
    if (o.momentum > 0) {
      EXPECT_TRUE(all_close(buf, Tensor::from_vector(ref.buf, {3, 4}), tol, tol));
    }
    const std::vector<double> p1 = params.to_vector<double>();
    for (int64_t i : {0, 1, 2, 3, 4, 17, 18, 19}) EXPECT_EQ(p1[i], p0[i]) << "element " << i;
    const std::vector<double> s = state.to_vector<double>();
    for (int64_t i : {0, 4, 17, 19}) EXPECT_EQ(s[i], 0.0) << "state element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Options, SgdTest,
    ::testing::Values(SgdCase{"plain", sgd(0.1, 0, 0, false, 0)},
                      SgdCase{"weight_decay", sgd(0.1, 0, 0, false, 0.05)},
                      SgdCase{"momentum", sgd(0.05, 0.9, 0, false, 0)},
                      SgdCase{"dampening", sgd(0.05, 0.9, 0.3, false, 0.01)},
                      SgdCase{"nesterov", sgd(0.05, 0.9, 0, true, 0)},
                      SgdCase{"nesterov_weight_decay", sgd(0.02, 0.8, 0, true, 0.1)}),
    [](const ::testing::TestParamInfo<SgdCase>& info) { return info.param.name; });

TEST(Sgd, TwoStepsByHand) {
  ExecContext ctx;
  // lr 0.1, momentum 0.9, weight decay 0.1, the same gradient (0.5, 1, -1) twice.
  const Tensor p = vec({1.0, -2.0, 0.5}), g = vec({0.5, 1.0, -1.0}), buf = vec({7, 7, 7});
  const ops::SgdOptions o = sgd(0.1, 0.9, 0, false, 0.1);
  // Step 1: g' = g + 0.1 p = (0.6, 0.8, -0.95); buf = g' (the old buffer is ignored);
  //         p = p - 0.1 buf = (0.94, -2.08, 0.595).
  ops::sgd_step(ctx, p, g, buf, o, 1);
  EXPECT_TRUE(all_close(buf, vec({0.6, 0.8, -0.95}), 1e-15, 0));
  EXPECT_TRUE(all_close(p, vec({0.94, -2.08, 0.595}), 1e-15, 0));
  // Step 2: g' = (0.594, 0.792, -0.9405); buf = 0.9 buf + g' = (1.134, 1.512, -1.7955);
  //         p = (0.8266, -2.2312, 0.77455).
  ops::sgd_step(ctx, p, g, buf, o, 2);
  EXPECT_TRUE(all_close(buf, vec({1.134, 1.512, -1.7955}), 1e-15, 0));
  EXPECT_TRUE(all_close(p, vec({0.8266, -2.2312, 0.77455}), 1e-15, 0));
}

TEST(Sgd, NesterovStepByHand) {
  ExecContext ctx;
  // Step 1 with nesterov: buf = g = (1, -2); update g + 0.5 buf = (1.5, -3); lr 0.1.
  const Tensor p = vec({0.0, 1.0}), g = vec({1.0, -2.0}), buf = vec({0.0, 0.0});
  ops::sgd_step(ctx, p, g, buf, sgd(0.1, 0.5, 0, true, 0), 1);
  EXPECT_TRUE(all_close(p, vec({-0.15, 1.3}), 1e-15, 0));
  // Step 2: buf = 0.5 (1, -2) + (1, -2) = (1.5, -3); update g + 0.5 buf = (1.75, -3.5).
  ops::sgd_step(ctx, p, g, buf, sgd(0.1, 0.5, 0, true, 0), 2);
  EXPECT_TRUE(all_close(p, vec({-0.325, 1.65}), 1e-15, 0));
}

TEST(Sgd, RejectsBadArguments) {
  ExecContext ctx;
  const Tensor p = vec({1, 2, 3}), g = vec({1, 1, 1}), buf = vec({0, 0, 0});
  expect_error([&] { ops::sgd_step(ctx, p, g, Tensor(), sgd(0.1, 0.9, 0, false, 0), 1); },
               {"sgd_step", "momentum_buf is undefined"});
  expect_error([&] { ops::sgd_step(ctx, p, g, buf, sgd(0.1, 0.9, 0.1, true, 0), 1); },
               {"sgd_step", "nesterov", "dampening"});
  expect_error([&] { ops::sgd_step(ctx, p, g, buf, sgd(0.1, 0, 0, true, 0), 1); },
               {"sgd_step", "nesterov"});
  expect_error(
      [&] {
        ops::sgd_step(ctx, p, vec({1, 1}), buf, sgd(0.1, 0, 0, false, 0), 1);
      },
      {"sgd_step", "grad has shape (2,)"});
  expect_error([&] { ops::sgd_step(ctx, p, g.to(DType::kF32), buf, sgd(0.1, 0, 0, false, 0), 1); },
               {"sgd_step", "grad is f32"});
  expect_error([&] { ops::sgd_step(ctx, p, g, buf, sgd(0.1, 0, 0, false, 0), 0); },
               {"sgd_step", "step"});
  expect_error([&] { ops::sgd_step(ctx, p, g, buf, sgd(-1, 0, 0, false, 0), 1); },
               {"sgd_step", "options.lr"});
  expect_error([&] { ops::sgd_step(ctx, p, g, buf, sgd(0.1, 0, 0, false, -0.1), 1); },
               {"sgd_step", "options.weight_decay"});
}

// ---- AdamW -------------------------------------------------------------------------------------

// The recurrence of torch.optim.AdamW, written out in double:
//   p = p (1 - lr wd)
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
struct AdamWReference {
  std::vector<double> p, m, v;
  void step(const std::vector<double>& g, const ops::AdamWOptions& o, int64_t t) {
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(o.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
  }
};

ops::AdamWOptions adamw(double lr, double b1, double b2, double eps, double wd) {
  ops::AdamWOptions o;
  o.lr = lr;
  o.beta1 = b1;
  o.beta2 = b2;
  o.eps = eps;
  o.weight_decay = wd;
  return o;
}

TEST(AdamW, SixStepsMatchTheReferenceOnViewsOfFlatBuffers) {
  for (const ops::AdamWOptions& o :
       {adamw(1e-2, 0.9, 0.999, 1e-8, 0.01), adamw(3e-3, 0.8, 0.95, 1e-6, 0.0),
        adamw(1e-2, 0.0, 0.5, 1e-8, 0.1)}) {
    for (DType dtype : {DType::kF64, DType::kF32}) {
      ExecContext ctx;
      const Tensor flat = random_tensor({40}, 1, -1, 1, dtype);  // [p | m | v | padding]
      const Tensor p = flat.narrow(0, 1, 10).view({2, 5});
      const Tensor m = flat.narrow(0, 11, 10).view({2, 5});
      const Tensor v = flat.narrow(0, 21, 10).view({2, 5});
      m.zero_();
      v.zero_();
      const std::vector<double> before = flat.to_vector<double>();
      AdamWReference ref{p.to_vector<double>(), std::vector<double>(10, 0.0),
                         std::vector<double>(10, 0.0)};
      for (int64_t t = 1; t <= 6; ++t) {
        const Tensor g = random_tensor({2, 5}, 200 + t, -2, 2, dtype);
        ops::adamw_step(ctx, p, g, m, v, o, t);
        ref.step(g.to_vector<double>(), o, t);
      }
      const double tol = dtype == DType::kF64 ? 1e-14 : 1e-6;
      EXPECT_TRUE(all_close(p, Tensor::from_vector(ref.p, {2, 5}), tol, tol));
      EXPECT_TRUE(all_close(m, Tensor::from_vector(ref.m, {2, 5}), tol, tol));
      EXPECT_TRUE(all_close(v, Tensor::from_vector(ref.v, {2, 5}), tol, tol));
      const std::vector<double> after = flat.to_vector<double>();
      for (int64_t i : {0, 31, 35, 39}) EXPECT_EQ(after[i], before[i]) << "element " << i;
    }
  }
}

TEST(AdamW, FirstStepByHand) {
  ExecContext ctx;
  // lr 0.1, wd 0.01: p *= 0.999 -> (0.999, -1.998). On step 1 the bias corrections give
  // m_hat = g and v_hat = g^2, so the update is lr g / (|g| + eps):
  //   0.1 * 0.5 / (0.5 + 1e-8) = 0.099999998, 0.1 * 0.25 / (0.25 + 1e-8) = 0.099999996.
  const Tensor p = vec({1.0, -2.0}), g = vec({0.5, -0.25}), m = vec({0, 0}), v = vec({0, 0});
  ops::adamw_step(ctx, p, g, m, v, adamw(0.1, 0.9, 0.999, 1e-8, 0.01), 1);
  EXPECT_TRUE(all_close(m, vec({0.05, -0.025}), 1e-16, 0));  // 1 - 0.9 rounds in double
  EXPECT_TRUE(all_close(v, vec({0.00025, 0.0000625}), 1e-17, 0));
  EXPECT_TRUE(all_close(
      p, vec({0.999 - 0.1 * 0.5 / (0.5 + 1e-8), -1.998 + 0.1 * 0.25 / 0.25000001}), 1e-15, 0));
  EXPECT_TRUE(all_close(p, vec({0.899000002, -1.898000004}), 1e-12, 0));
}

TEST(AdamW, RejectsBadArguments) {
  ExecContext ctx;
  const Tensor p = vec({1, 2}), g = vec({1, 1}), m = vec({0, 0}), v = vec({0, 0});
  expect_error([&] { ops::adamw_step(ctx, p, g, m, vec({0}), adamw(0.1, 0.9, 0.99, 1e-8, 0), 1); },
               {"adamw_step", "v has shape (1,)"});
  expect_error([&] { ops::adamw_step(ctx, p, g, Tensor(), v, adamw(0.1, 0.9, 0.99, 1e-8, 0), 1); },
               {"adamw_step", "m is undefined"});
  expect_error([&] { ops::adamw_step(ctx, p, g, m, v, adamw(0.1, 1.0, 0.99, 1e-8, 0), 1); },
               {"adamw_step", "options.beta1"});
  expect_error([&] { ops::adamw_step(ctx, p, g, m, v, adamw(0.1, 0.9, -0.1, 1e-8, 0), 1); },
               {"adamw_step", "options.beta2"});
  expect_error([&] { ops::adamw_step(ctx, p, g, m, v, adamw(0.1, 0.9, 0.99, 1e-8, 0), 0); },
               {"adamw_step", "step"});
}

// ---- norms and clipping ------------------------------------------------------------------------

TEST(SumOfSquares, MatchesNaiveAndIsThreadCountIndependent) {
  const Tensor x = random_tensor({100003}, 1, -1, 1, DType::kF32);
  double ref = 0.0;
  for (double v : x.to_vector<double>()) ref += v * v;
  ExecContext one(Device::cpu(), nullptr, 1);
  const double s1 = ops::sum_of_squares(one, x);
  ExecContext two(Device::cpu(), nullptr, 2);
  const double s2 = ops::sum_of_squares(two, x);
  EXPECT_NEAR(s1, ref, 1e-12 * ref);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(ops::sum_of_squares(two, vec({3, -4})), 25.0);
  expect_error([&] { ops::sum_of_squares(two, Tensor::zeros({2}, DType::kI32)); },
               {"sum_of_squares", "t must be f32 or f64"});
}

TEST(GlobalGradNorm, CombinesTensorsAndSkipsUndefinedOnes) {
  ExecContext ctx;
  EXPECT_DOUBLE_EQ(ops::global_grad_norm(ctx, {vec({3}), Tensor(), vec({0, 4, 12})}), 13.0);
  EXPECT_EQ(ops::global_grad_norm(ctx, {}), 0.0);
}

TEST(ClipGradNorm, ScalesViewsInPlaceWhenAboveMaxNorm) {
  ExecContext ctx;
  const Tensor flat = vec({3, 0, 4, 12, 99});  // grads (3,), (2,) and (1,) viewed; 99 outside
  const TensorList grads = {flat.narrow(0, 0, 1), flat.narrow(0, 1, 2), flat.narrow(0, 3, 1)};
  const double norm = ops::clip_grad_norm(ctx, grads, 6.5);
  EXPECT_DOUBLE_EQ(norm, 13.0);
  const double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_TRUE(all_close(flat, vec({3 * coef, 0, 4 * coef, 12 * coef, 99}), 1e-15, 1e-15));
  EXPECT_NEAR(ops::global_grad_norm(ctx, grads), 6.5, 1e-6);
}

TEST(ClipGradNorm, IsExactInF32EvenForHugeNorms) {
  ExecContext ctx;
  const Tensor g = random_tensor({1000}, 1, -1e4, 1e4, DType::kF32);
  const std::vector<float> before = g.to_vector<float>();
  const double norm = ops::clip_grad_norm(ctx, {g}, 1e-3);
  const double coef = 1e-3 / (norm + 1e-6);
  const std::vector<float> after = g.to_vector<float>();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i], static_cast<float>(coef) * before[i]) << "element " << i;
  }
}

TEST(ClipGradNorm, LeavesSmallAndNonFiniteNormsAlone) {
  ExecContext ctx;
  const Tensor g = vec({0.3, -0.4});
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm(ctx, {g}, 1.0), 0.5);
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{0.3, -0.4}));
  const Tensor bad = vec({1.0, std::numeric_limits<double>::quiet_NaN()});
  const Tensor other = vec({100.0});
  EXPECT_TRUE(std::isnan(ops::clip_grad_norm(ctx, {other, bad}, 1.0)));
  EXPECT_EQ(other.to_vector<double>()[0], 100.0);
  const Tensor inf = vec({std::numeric_limits<double>::infinity()});
  EXPECT_TRUE(std::isinf(ops::clip_grad_norm(ctx, {other, inf}, 1.0)));
  EXPECT_EQ(other.to_vector<double>()[0], 100.0);
  expect_error([&] { ops::clip_grad_norm(ctx, {g}, 0.0); }, {"clip_grad_norm", "max_norm"});
}

// Variance-reduced AdamW (SDPipe, papers/sdpipe.md Sec. 5 item 11).
ops::AdamWVrOptions adamw_vr(double lr, double b1, double b2, double wd, double scale) {
  ops::AdamWVrOptions o;
  o.adam = adamw(lr, b1, b2, 1e-8, wd);
  o.variance_scale = scale;
  return o;
}

// With variance_scale 1 it is AdamW (its extra moment aside), to rounding.
TEST(AdamWVr, WithScaleOneIsAdamW) {
  for (DType dtype : {DType::kF64, DType::kF32}) {
    ExecContext ctx;
    const Tensor p = random_tensor({50}, 3, -1, 1, dtype), q = p.clone();
    const Tensor m = Tensor::zeros({50}, dtype), v = Tensor::zeros({50}, dtype);
    const Tensor m2 = Tensor::zeros({50}, dtype), ma = m.clone(), va = v.clone();
    for (int64_t t = 1; t <= 8; ++t) {
      const Tensor g = random_tensor({50}, 300 + t, -2, 2, dtype);
      ops::adamw_vr_step(ctx, p, g, m, v, m2, adamw_vr(1e-2, 0.9, 0.999, 0.01, 1.0), t);
      ops::adamw_step(ctx, q, g, ma, va, adamw(1e-2, 0.9, 0.999, 1e-8, 0.01), t);
    }
    const double tol = dtype == DType::kF64 ? 1e-12 : 1e-6;
    EXPECT_TRUE(all_close(p, q, tol, tol));
    EXPECT_TRUE(all_close(m, ma, 0, 0));
    EXPECT_TRUE(all_close(v, va, 0, 0));
  }
}

// A constant gradient has no variance: whatever the scale, the step is AdamW's (vs == vh).
TEST(AdamWVr, ConstantGradientKeepsTheSecondMoment) {
  ExecContext ctx;
  const Tensor p = vec({1.0, -2.0, 0.5}), q = p.clone();
  const Tensor g = vec({0.3, -0.7, 2.0});
  const Tensor m = vec({0, 0, 0}), v = vec({0, 0, 0}), m2 = vec({0, 0, 0});
  const Tensor ma = m.clone(), va = v.clone();
  for (int64_t t = 1; t <= 20; ++t) {
    ops::adamw_vr_step(ctx, p, g, m, v, m2, adamw_vr(1e-2, 0.9, 0.99, 0.0, 0.25), t);
    ops::adamw_step(ctx, q, g, ma, va, adamw(1e-2, 0.9, 0.99, 1e-8, 0.0), t);
  }
  EXPECT_TRUE(all_close(p, q, 1e-12, 1e-12));
}

// i.i.d. noise around a mean: the rebuilt second moment is about mean^2 + var / N, seen through
// the step size: a single element, after many steps, moves by lr mh / sqrt(vs).
TEST(AdamWVr, NoiseIsScaledByOneOverN) {
  const double mean = 0.5, sd = 2.0, b2 = 0.999;
  const int64_t steps = 20000;
  for (double n : {1.0, 4.0, 16.0}) {
    ExecContext ctx;
    const Tensor p = vec({0.0}), m = vec({0}), v = vec({0}), m2 = vec({0});
    std::mt19937_64 rng(5);
    std::normal_distribution<double> noise(mean, sd);
    double before = 0;
    for (int64_t t = 1; t <= steps; ++t) {
      before = p.item<double>();
      ops::adamw_vr_step(ctx, p, vec({noise(rng)}), m, v, m2, adamw_vr(1.0, 0.0, b2, 0.0, 1.0 / n),
                         t);
    }
    // beta1 = 0: mh = g of the last step; the step was g / sqrt(vs). Rebuild vs from m2 and v.
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(steps));
    const double mh = m2.item<double>() / bc2, vh = v.item<double>() / bc2;
    const double vs = mh * mh + (vh - mh * mh) / n;
    EXPECT_NEAR(mh, mean, 0.3);
    EXPECT_NEAR(vh - mh * mh, sd * sd, 0.6);
    EXPECT_NEAR(vs, mean * mean + sd * sd / n, 0.6 / n + 0.3);
    const double last_g = m.item<double>();
    EXPECT_NEAR(before - p.item<double>(), last_g / (std::sqrt(vs) + 1e-8), 1e-9);
  }
}

TEST(AdamWVr, RejectsBadArguments) {
  ExecContext ctx;
  const Tensor p = vec({1, 2}), g = vec({1, 1}), m = vec({0, 0}), v = vec({0, 0});
  expect_error(
      [&] { ops::adamw_vr_step(ctx, p, g, m, v, vec({0}), adamw_vr(0.1, 0.9, 0.99, 0, 1), 1); },
      {"adamw_vr_step", "m2 has shape (1,)"});
  expect_error(
      [&] {
        ops::adamw_vr_step(ctx, p, g, m, v, vec({0, 0}), adamw_vr(0.1, 0.9, 0.99, 0, 0), 1);
      },
      {"adamw_vr_step", "options.variance_scale"});
}

}  // namespace
}  // namespace strata
