#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

struct NaiveAttention {
  Tensor out, probs;  // f64
};

// Plain loops in double, straight from the formulas in ops/attention.h.
NaiveAttention naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& mask, bool causal, double scale) {
  const int64_t nb = q.size(0), nh = q.size(1), nt = q.size(2), nd = q.size(3), ns = k.size(2);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(nd));
  const std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(),
                            vv = v.to_vector<double>();
  const std::vector<int64_t> keep =
      mask.defined() ? mask.to(DType::kI64).to_vector<int64_t>() : std::vector<int64_t>(nb * ns, 1);
  std::vector<double> out(nb * nh * nt * nd, 0.0), probs(nb * nh * nt * ns, 0.0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t bh = b * nh + h;
        std::vector<double> score(ns);
        std::vector<bool> visible(ns);
        bool any = false;
        for (int64_t s = 0; s < ns; ++s) {
          visible[s] = keep[b * ns + s] != 0 && !(causal && s > t + std::max<int64_t>(ns - nt, 0));
          any = any || visible[s];
          double dot = 0;
          for (int64_t d = 0; d < nd; ++d) {
            dot += qv[(bh * nt + t) * nd + d] * kv[(bh * ns + s) * nd + d];
          }
          score[s] = scale * dot;
        }
        if (!any) continue;  // probs and out stay 0
        double m = -1e300, sum = 0;
        for (int64_t s = 0; s < ns; ++s)
          if (visible[s]) m = std::max(m, score[s]);
        for (int64_t s = 0; s < ns; ++s)
          if (visible[s]) sum += std::exp(score[s] - m);
        for (int64_t s = 0; s < ns; ++s) {
          const double p = visible[s] ? std::exp(score[s] - m) / sum : 0.0;
          probs[(bh * nt + t) * ns + s] = p;
          for (int64_t d = 0; d < nd; ++d) {
            out[(bh * nt + t) * nd + d] += p * vv[(bh * ns + s) * nd + d];
          }
        }
      }
  return {Tensor::from_vector(out, {nb, nh, nt, nd}), Tensor::from_vector(probs, {nb, nh, nt, ns})};
}

// lse (B, H, T) against log sum exp of the visible scores in double (-inf for rows without one).
::testing::AssertionResult lse_matches(const Tensor& lse, const Tensor& q, const Tensor& k,
                                       const Tensor& mask, bool causal, double scale) {
  const int64_t nb = q.size(0), nh = q.size(1), nt = q.size(2), nd = q.size(3), ns = k.size(2);
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(nd));
  const std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>(),
                            got = lse.to_vector<double>();
  const std::vector<int64_t> keep =
      mask.defined() ? mask.to(DType::kI64).to_vector<int64_t>() : std::vector<int64_t>(nb * ns, 1);
  for (int64_t bh = 0; bh < nb * nh; ++bh)
    for (int64_t t = 0; t < nt; ++t) {
      const int64_t b = bh / nh;
      double m = -INFINITY, sum = 0.0;
      std::vector<double> scores;
      for (int64_t s = 0; s < ns; ++s) {
        if (keep[b * ns + s] == 0 || (causal && s > t + std::max<int64_t>(ns - nt, 0))) continue;
        double dot = 0;
        for (int64_t d = 0; d < nd; ++d)
          dot += qv[(bh * nt + t) * nd + d] * kv[(bh * ns + s) * nd + d];
        scores.push_back(scale * dot);
        m = std::max(m, scale * dot);
      }
      for (double x : scores) sum += std::exp(x - m);
      const double want = scores.empty() ? -INFINITY : m + std::log(sum);
      const double have = got[bh * nt + t];
      const bool ok = scores.empty() ? (std::isinf(have) && have < 0)
                                     : std::fabs(have - want) <= 1e-5 * (1.0 + std::fabs(want));
      if (!ok) {
        return ::testing::AssertionFailure()
               << "lse of row " << bh * nt + t << " is " << have << ", expected " << want;
      }
    }
  return ::testing::AssertionSuccess();
}

enum class MaskKind { kNone, kU8, kI32, kI64 };

struct AttentionCase {
  int64_t b, h, t, s, d;
  bool causal;
  MaskKind mask;
  bool fully_masked_sample;  // sample 1 masks every key: its rows have nothing to attend
  double scale;
  const char* name;
};

// A (B, S) mask of the case's dtype: mostly kept, with a few padded keys.
Tensor make_mask(const AttentionCase& c) {
  if (c.mask == MaskKind::kNone) return Tensor();
  std::vector<int64_t> keep(c.b * c.s);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t s = 0; s < c.s; ++s) keep[b * c.s + s] = (s + 2 * b) % 3 == 2 ? 0 : 1;
  if (c.fully_masked_sample) std::fill(keep.begin() + c.s, keep.begin() + 2 * c.s, 0);
  Tensor m = Tensor::from_vector(keep, {c.b, c.s});
  switch (c.mask) {
    case MaskKind::kU8:
      return m.to(DType::kU8);
    case MaskKind::kI32:
      return m.to(DType::kI32);
    default:
      return m;
  }
}

void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << c.name << " (B " << c.b << ", H " << c.h << ", T " << c.t << ", S " << c.s << ", D " << c.d
      << ")";
}

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionTest, ForwardMatchesNaiveReference) {
  const AttentionCase& c = GetParam();
  ExecContext ctx;
  Tensor q = random_tensor({c.b, c.h, c.t, c.d}, 1, -2.0, 2.0);
  Tensor k = random_tensor({c.b, c.h, c.s, c.d}, 2, -2.0, 2.0);
  Tensor v = random_tensor({c.b, c.h, c.s, c.d}, 3);
  Tensor mask = make_mask(c);
  ops::AttentionOptions options{c.causal, c.scale};
  NaiveAttention ref = naive_attention(q, k, v, mask, c.causal, c.scale);
  ops::AttentionResult r = ops::attention_forward(ctx, q, k, v, mask, options);
  EXPECT_TRUE(all_close(r.out, ref.out, 1e-13, 1e-12));
  EXPECT_TRUE(all_close(r.probs, ref.probs, 1e-14, 1e-12));
  EXPECT_EQ(r.lse.shape(), (Shape{c.b, c.h, c.t}));
  EXPECT_TRUE(lse_matches(r.lse, q, k, mask, c.causal, c.scale));
  ops::AttentionResult r32 = ops::attention_forward(ctx, q.to(DType::kF32), k.to(DType::kF32),
                                                    v.to(DType::kF32), mask, options);
  EXPECT_EQ(r32.out.dtype(), DType::kF32);
  EXPECT_TRUE(all_close(r32.out, ref.out, 2e-6, 1e-5));
  EXPECT_TRUE(all_close(r32.probs, ref.probs, 2e-6, 1e-5));
}

TEST_P(AttentionTest, FiniteDifferenceGradients) {
  const AttentionCase& c = GetParam();
  ExecContext ctx;
  Tensor q = random_tensor({c.b, c.h, c.t, c.d}, 4, -2.0, 2.0);
  Tensor k = random_tensor({c.b, c.h, c.s, c.d}, 5, -2.0, 2.0);
  Tensor v = random_tensor({c.b, c.h, c.s, c.d}, 6);
  Tensor mask = make_mask(c);
  ops::AttentionOptions options{c.causal, c.scale};
  ops::AttentionResult r = ops::attention_forward(ctx, q, k, v, mask, options);
  Tensor dout = random_tensor(r.out.shape(), 7);
  ops::AttentionGrads g = ops::attention_backward(ctx, dout, q, k, v, r, mask, options);
  auto f = [&](const TensorList& xs) {
    return ops::attention_forward(ctx, xs[0], xs[1], xs[2], mask, options).out;
  };
  EXPECT_TRUE(gradients_match(f, {q, k, v}, dout, {g.dq, g.dk, g.dv}));
}

// Backward from lse alone (what the fused CUDA kernel saves) equals backward from probs.
TEST_P(AttentionTest, BackwardFromLseMatchesBackwardFromProbs) {
  const AttentionCase& c = GetParam();
  ExecContext ctx;
  Tensor q = random_tensor({c.b, c.h, c.t, c.d}, 12, -2.0, 2.0);
  Tensor k = random_tensor({c.b, c.h, c.s, c.d}, 13, -2.0, 2.0);
  Tensor v = random_tensor({c.b, c.h, c.s, c.d}, 14);
  Tensor dout = random_tensor({c.b, c.h, c.t, c.d}, 15);
  Tensor mask = make_mask(c);
  ops::AttentionOptions options{c.causal, c.scale};
  for (DType dt : {DType::kF64, DType::kF32}) {
    ops::AttentionResult r =
        ops::attention_forward(ctx, q.to(dt), k.to(dt), v.to(dt), mask, options);
    ops::AttentionGrads from_probs =
        ops::attention_backward(ctx, dout.to(dt), q.to(dt), k.to(dt), v.to(dt), r, mask, options);
    ops::AttentionResult lse_only = r;
    lse_only.probs = Tensor();
    ops::AttentionGrads from_lse = ops::attention_backward(ctx, dout.to(dt), q.to(dt), k.to(dt),
                                                           v.to(dt), lse_only, mask, options);
    const double tol = dt == DType::kF64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(all_close(from_lse.dq, from_probs.dq, tol, tol));
    EXPECT_TRUE(all_close(from_lse.dk, from_probs.dk, tol, tol));
    EXPECT_TRUE(all_close(from_lse.dv, from_probs.dv, tol, tol));
  }
}

TEST_P(AttentionTest, F32BackwardCloseToF64) {
  const AttentionCase& c = GetParam();
  ExecContext ctx;
  Tensor q = random_tensor({c.b, c.h, c.t, c.d}, 8, -2.0, 2.0);
  Tensor k = random_tensor({c.b, c.h, c.s, c.d}, 9, -2.0, 2.0);
  Tensor v = random_tensor({c.b, c.h, c.s, c.d}, 10);
  Tensor dout = random_tensor({c.b, c.h, c.t, c.d}, 11);
  Tensor mask = make_mask(c);
  ops::AttentionOptions options{c.causal, c.scale};
  auto grads = [&](DType dt) {
    ops::AttentionResult r =
        ops::attention_forward(ctx, q.to(dt), k.to(dt), v.to(dt), mask, options);
    return ops::attention_backward(ctx, dout.to(dt), q.to(dt), k.to(dt), v.to(dt), r, mask,
                                   options);
  };
  ops::AttentionGrads g64 = grads(DType::kF64), g32 = grads(DType::kF32);
  EXPECT_TRUE(all_close(g32.dq, g64.dq, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(g32.dk, g64.dk, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(g32.dv, g64.dv, 1e-5, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, AttentionTest,
    ::testing::Values(
        AttentionCase{2, 2, 4, 4, 3, false, MaskKind::kNone, false, 0.0, "full"},
        AttentionCase{2, 2, 4, 4, 3, true, MaskKind::kNone, false, 0.0, "causal"},
        AttentionCase{1, 2, 3, 5, 4, true, MaskKind::kNone, false, 0.0, "causal_s_gt_t"},
        AttentionCase{1, 2, 5, 3, 2, true, MaskKind::kNone, false, 0.0, "causal_s_lt_t"},
        AttentionCase{2, 1, 3, 5, 3, false, MaskKind::kNone, false, 0.7, "full_s_gt_t_scale"},
        AttentionCase{2, 2, 3, 5, 3, false, MaskKind::kU8, false, 0.0, "padding_u8"},
        AttentionCase{2, 2, 4, 6, 2, true, MaskKind::kI32, false, 0.0, "causal_padding_i32"},
        AttentionCase{2, 2, 3, 4, 3, false, MaskKind::kI64, true, 0.0, "padding_i64_fully_masked"},
        AttentionCase{2, 1, 4, 4, 3, true, MaskKind::kU8, true, 0.5, "causal_fully_masked"}),
    [](const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; });

TEST(Attention, FullyMaskedRowsGiveZerosNotNaN) {
  ExecContext ctx;
  Tensor q = random_tensor({1, 1, 3, 4}, 1, -50.0, 50.0);
  Tensor k = random_tensor({1, 1, 3, 4}, 2, -50.0, 50.0), v = random_tensor({1, 1, 3, 4}, 3);
  Tensor mask = Tensor::zeros({1, 3}, DType::kU8);
  ops::AttentionResult r = ops::attention_forward(ctx, q, k, v, mask, {true, 0.0});
  for (double e : r.out.to_vector<double>()) EXPECT_EQ(e, 0.0);
  for (double e : r.probs.to_vector<double>()) EXPECT_EQ(e, 0.0);
  ops::AttentionGrads g =
      ops::attention_backward(ctx, random_tensor({1, 1, 3, 4}, 4), q, k, v, r, mask, {true, 0.0});
  for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) {
    for (double e : t->to_vector<double>()) EXPECT_EQ(e, 0.0);
  }
}

TEST(Attention, LargerShapesOnTheThreadedPath) {
  ExecContext ctx;
  const int64_t b = 2, h = 4, t = 48, s = 64, d = 16;
  Tensor q = random_tensor({b, h, t, d}, 1, -1.0, 1.0),
         k = random_tensor({b, h, s, d}, 2, -1.0, 1.0);
  Tensor v = random_tensor({b, h, s, d}, 3), dout = random_tensor({b, h, t, d}, 4);
  std::vector<uint8_t> keep(b * s, 1);
  for (int64_t j = s - 5; j < s; ++j) keep[s + j] = 0;  // sample 1: the last 5 keys are padding
  Tensor mask = Tensor::from_vector(keep, {b, s});
  const ops::AttentionOptions options{true, 0.0};
  NaiveAttention ref = naive_attention(q, k, v, mask, true, 0.0);
  auto to32 = [](const Tensor& x) { return x.to(DType::kF32); };
  ops::AttentionResult r64 = ops::attention_forward(ctx, q, k, v, mask, options);
  ops::AttentionResult r32 = ops::attention_forward(ctx, to32(q), to32(k), to32(v), mask, options);
  EXPECT_TRUE(all_close(r64.out, ref.out, 1e-13, 1e-12));
  EXPECT_TRUE(all_close(r32.out, ref.out, 2e-6, 1e-5));
  ops::AttentionGrads g64 = ops::attention_backward(ctx, dout, q, k, v, r64, mask, options);
  ops::AttentionGrads g32 =
      ops::attention_backward(ctx, to32(dout), to32(q), to32(k), to32(v), r32, mask, options);
  EXPECT_TRUE(all_close(g32.dq, g64.dq, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(g32.dk, g64.dk, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(g32.dv, g64.dv, 1e-5, 1e-4));
}

TEST(Attention, CausalLastQuerySeesEveryKey) {
  ExecContext ctx;
  Tensor q = random_tensor({1, 1, 2, 3}, 1), k = random_tensor({1, 1, 5, 3}, 2);
  ops::AttentionResult r =
      ops::attention_forward(ctx, q, k, random_tensor({1, 1, 5, 3}, 3), Tensor(), {true, 0.0});
  const std::vector<double> p = r.probs.to_vector<double>();  // (2, 5)
  for (int s = 0; s < 4; ++s) EXPECT_GT(p[s], 0.0);           // query 0 sees keys 0..3
  EXPECT_EQ(p[4], 0.0);
  for (int s = 0; s < 5; ++s) EXPECT_GT(p[5 + s], 0.0);  // query 1 sees all 5
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

TEST(Attention, BadInputsNameOpAndTensor) {
  ExecContext ctx;
  Tensor q = random_tensor({2, 2, 3, 4}, 1), k = random_tensor({2, 2, 5, 4}, 2),
         v = random_tensor({2, 2, 5, 4}, 3);
  const ops::AttentionOptions options;
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(ctx, q, random_tensor({2, 2, 5, 3}, 2), v, Tensor(), options);
      },
      {"attention_forward: k "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(ctx, q, k, random_tensor({2, 2, 4, 4}, 3), Tensor(), options);
      },
      {"attention_forward: v "}));
  EXPECT_TRUE(throws_naming(
      [&] { ops::attention_forward(ctx, q, k, v.to(DType::kF32), Tensor(), options); },
      {"attention_forward: v ", "but q is"}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(ctx, q, k, v, Tensor::zeros({2, 3}, DType::kU8), options);
      },
      {"attention_forward: key_padding_mask "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(ctx, q, k, v, Tensor::zeros({2, 5}, DType::kF32), options);
      },
      {"attention_forward: key_padding_mask "}));
  ops::AttentionResult r = ops::attention_forward(ctx, q, k, v, Tensor(), options);
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::AttentionResult bad = r;
        bad.probs = random_tensor({2, 2, 3, 4}, 4);
        ops::attention_backward(ctx, r.out, q, k, v, bad, Tensor(), options);
      },
      {"attention_backward: probs "}));
  EXPECT_TRUE(
      throws_naming([&] { ops::attention_backward(ctx, r.probs, q, k, v, r, Tensor(), options); },
                    {"attention_backward: dout "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::AttentionResult bad = r;
        bad.probs = Tensor();
        bad.lse = random_tensor({2, 2, 4}, 5);
        ops::attention_backward(ctx, r.out, q, k, v, bad, Tensor(), options);
      },
      {"attention_backward: lse "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_backward(ctx, r.out, q, k, v, r, Tensor::zeros({2, 4}, DType::kU8), options);
      },
      {"attention_backward: key_padding_mask "}));
}

}  // namespace
}  // namespace strata
