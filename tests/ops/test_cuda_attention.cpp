// CUDA-vs-CPU parity of the fused attention kernels (ops/attention_cuda.cu): forward out and lse,
// backward dq, dk, dv, in f32 and bf16/f16, over masks, causal offsets, odd and tile-crossing
// sizes, fully masked rows and head dimensions up to 128.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "testing/cuda_parity.h"

namespace strata {
namespace {

using testing::identical;
using testing::parity;
using testing::parity_bound;
using testing::Precision;
using testing::random_f32;
using testing::to_device;
using testing::to_host;

enum class MaskKind { kNone, kU8, kI32, kI64 };

struct Case {
  int64_t b, h, t, s, d;
  bool causal;
  MaskKind mask;
  bool fully_masked_sample;  // sample 1 (B >= 2) masks every key
  double scale;
  const char* name;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name << " (B " << c.b << ", H " << c.h << ", T " << c.t << ", S " << c.s << ", D " << c.d
      << ")";
}

// (B, S) keep mask of the case's dtype on the CPU: a few padded keys per sample, sample 1 all
// padded when asked.
Tensor make_mask(const Case& c) {
  if (c.mask == MaskKind::kNone) return Tensor();
  std::vector<int64_t> keep(c.b * c.s);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t s = 0; s < c.s; ++s) keep[b * c.s + s] = (s * 7 + 3 * b) % 5 == 4 ? 0 : 1;
  if (c.fully_masked_sample && c.b >= 2) std::fill(keep.begin() + c.s, keep.begin() + 2 * c.s, 0);
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

Tensor device_or_undefined(const Tensor& t, ExecContext& ctx) {
  return t.defined() ? to_device(t, ctx) : Tensor();
}

// lse compared where finite; -inf (fully masked rows) must match exactly.
::testing::AssertionResult lse_parity(ExecContext& gpu, const Tensor& actual,
                                      const Tensor& expected, double bound) {
  const std::vector<double> a = to_host(actual, gpu).to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  if (a.size() != e.size()) return ::testing::AssertionFailure() << "lse sizes differ";
  double max_ref = 0.0, max_err = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(e[i])) {
      if (!(std::isinf(a[i]) && a[i] < 0)) {
        return ::testing::AssertionFailure()
               << "lse[" << i << "] = " << a[i] << " for a fully masked row (expected -inf)";
      }
      continue;
    }
    if (!std::isfinite(a[i])) {
      return ::testing::AssertionFailure() << "lse[" << i << "] = " << a[i] << " vs " << e[i];
    }
    max_ref = std::max(max_ref, std::fabs(e[i]));
    max_err = std::max(max_err, std::fabs(a[i] - e[i]));
  }
  if (max_err <= bound * std::max(max_ref, 1.0)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "lse error " << max_err << " (max |lse| " << max_ref << ")";
}

class CudaAttentionTest : public ::testing::TestWithParam<Case> {};

// f32: forward and backward against the CPU reference on the same inputs.
TEST_P(CudaAttentionTest, F32MatchesCpu) {
  STRATA_REQUIRE_CUDA();
  const Case& c = GetParam();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const Tensor q = random_f32({c.b, c.h, c.t, c.d}, 1, -2.0, 2.0);
  const Tensor k = random_f32({c.b, c.h, c.s, c.d}, 2, -2.0, 2.0);
  const Tensor v = random_f32({c.b, c.h, c.s, c.d}, 3);
  const Tensor dout = random_f32({c.b, c.h, c.t, c.d}, 4);
  const Tensor mask = make_mask(c);
  const ops::AttentionOptions options{c.causal, c.scale};
  const double bound = parity_bound(Precision::kF32);

  const ops::AttentionResult ref = ops::attention_forward(cpu, q, k, v, mask, options);
  const ops::AttentionGrads gref = ops::attention_backward(cpu, dout, q, k, v, ref, mask, options);

  const Tensor qd = to_device(q, gpu), kd = to_device(k, gpu), vd = to_device(v, gpu);
  const Tensor maskd = device_or_undefined(mask, gpu);
  const ops::AttentionResult r = ops::attention_forward(gpu, qd, kd, vd, maskd, options);
  EXPECT_FALSE(r.probs.defined());
  EXPECT_EQ(r.out.dtype(), DType::kF32);
  EXPECT_EQ(r.lse.dtype(), DType::kF32);
  EXPECT_TRUE(parity(gpu, r.out, ref.out, bound, "out"));
  EXPECT_TRUE(lse_parity(gpu, r.lse, ref.lse, bound));

  const ops::AttentionGrads g =
      ops::attention_backward(gpu, to_device(dout, gpu), qd, kd, vd, r, maskd, options);
  EXPECT_TRUE(parity(gpu, g.dq, gref.dq, bound, "dq"));
  EXPECT_TRUE(parity(gpu, g.dk, gref.dk, bound, "dk"));
  EXPECT_TRUE(parity(gpu, g.dv, gref.dv, bound, "dv"));
}

// bf16 and f16 inputs: the CUDA op on the rounded values against the f32 CPU op on the same
// rounded values.
TEST_P(CudaAttentionTest, HalfPrecisionMatchesCpu) {
  STRATA_REQUIRE_CUDA();
  const Case& c = GetParam();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const Tensor mask = make_mask(c);
  const ops::AttentionOptions options{c.causal, c.scale};
  for (DType dt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor q = random_f32({c.b, c.h, c.t, c.d}, 5, -2.0, 2.0).to(dt);
    const Tensor k = random_f32({c.b, c.h, c.s, c.d}, 6, -2.0, 2.0).to(dt);
    const Tensor v = random_f32({c.b, c.h, c.s, c.d}, 7).to(dt);
    const Tensor dout = random_f32({c.b, c.h, c.t, c.d}, 8).to(dt);
    const Tensor q32 = q.to(DType::kF32), k32 = k.to(DType::kF32), v32 = v.to(DType::kF32),
                 dout32 = dout.to(DType::kF32);
    const ops::AttentionResult ref = ops::attention_forward(cpu, q32, k32, v32, mask, options);
    const ops::AttentionGrads gref =
        ops::attention_backward(cpu, dout32, q32, k32, v32, ref, mask, options);

    const Tensor qd = to_device(q, gpu), kd = to_device(k, gpu), vd = to_device(v, gpu);
    const Tensor maskd = device_or_undefined(mask, gpu);
    const ops::AttentionResult r = ops::attention_forward(gpu, qd, kd, vd, maskd, options);
    EXPECT_EQ(r.out.dtype(), dt);
    EXPECT_EQ(r.lse.dtype(), DType::kF32);
    const double bound = parity_bound(Precision::kBF16);
    EXPECT_TRUE(parity(gpu, r.out, ref.out, bound, "out"));
    EXPECT_TRUE(lse_parity(gpu, r.lse, ref.lse, parity_bound(Precision::kF32) * 10));
    const ops::AttentionGrads g =
        ops::attention_backward(gpu, to_device(dout, gpu), qd, kd, vd, r, maskd, options);
    EXPECT_EQ(g.dq.dtype(), dt);
    EXPECT_TRUE(parity(gpu, g.dq, gref.dq, bound, "dq"));
    EXPECT_TRUE(parity(gpu, g.dk, gref.dk, bound, "dk"));
    EXPECT_TRUE(parity(gpu, g.dv, gref.dv, bound, "dv"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionTest,
    ::testing::Values(
        Case{1, 1, 1, 1, 1, false, MaskKind::kNone, false, 0.0, "single"},
        Case{2, 3, 7, 7, 5, false, MaskKind::kNone, false, 0.0, "full_odd"},
        Case{2, 3, 7, 7, 5, true, MaskKind::kNone, false, 0.0, "causal_odd"},
        Case{2, 2, 65, 65, 64, true, MaskKind::kNone, false, 0.0, "causal_tile_plus_one"},
        Case{1, 2, 37, 100, 33, true, MaskKind::kNone, false, 0.0, "causal_s_gt_t"},
        Case{1, 2, 100, 37, 48, true, MaskKind::kNone, false, 0.0, "causal_s_lt_t"},
        Case{2, 1, 70, 130, 16, false, MaskKind::kNone, false, 0.7, "full_s_gt_t_scale"},
        Case{2, 2, 50, 77, 64, false, MaskKind::kU8, false, 0.0, "padding_u8"},
        Case{2, 2, 129, 129, 64, true, MaskKind::kI32, false, 0.0, "causal_padding_i32"},
        Case{3, 2, 40, 90, 24, false, MaskKind::kI64, true, 0.0, "padding_i64_fully_masked"},
        Case{2, 1, 66, 66, 8, true, MaskKind::kU8, true, 0.5, "causal_fully_masked"},
        Case{1, 2, 200, 200, 128, true, MaskKind::kNone, false, 0.0, "causal_d128"},
        Case{1, 1, 96, 160, 100, false, MaskKind::kU8, false, 0.0, "full_d100"},
        Case{2, 4, 256, 256, 64, true, MaskKind::kNone, false, 0.0, "gpt2_head"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Large rows: 1000 + 3 keys per query (many key tiles, one online-softmax rescale per tile) with
// spread-out scores.
TEST(CudaAttention, LongRowsMatchCpu) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const int64_t b = 1, h = 2, t = 67, s = 1003, d = 64;
  const Tensor q = random_f32({b, h, t, d}, 11, -3.0, 3.0),
               k = random_f32({b, h, s, d}, 12, -3.0, 3.0);
  const Tensor v = random_f32({b, h, s, d}, 13), dout = random_f32({b, h, t, d}, 14);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const ops::AttentionOptions options{causal, 0.0};
    const ops::AttentionResult ref = ops::attention_forward(cpu, q, k, v, Tensor(), options);
    const ops::AttentionGrads gref =
        ops::attention_backward(cpu, dout, q, k, v, ref, Tensor(), options);
    const Tensor qd = to_device(q, gpu), kd = to_device(k, gpu), vd = to_device(v, gpu);
    const ops::AttentionResult r = ops::attention_forward(gpu, qd, kd, vd, Tensor(), options);
    const double bound = parity_bound(Precision::kF32);
    EXPECT_TRUE(parity(gpu, r.out, ref.out, bound, "out"));
    EXPECT_TRUE(lse_parity(gpu, r.lse, ref.lse, bound));
    const ops::AttentionGrads g =
        ops::attention_backward(gpu, to_device(dout, gpu), qd, kd, vd, r, Tensor(), options);
    EXPECT_TRUE(parity(gpu, g.dq, gref.dq, bound, "dq"));
    EXPECT_TRUE(parity(gpu, g.dk, gref.dk, bound, "dk"));
    EXPECT_TRUE(parity(gpu, g.dv, gref.dv, bound, "dv"));
  }
}

// Every key masked: out and all gradients are exactly 0 (no NaN), lse is -inf.
TEST(CudaAttention, FullyMaskedRowsGiveZeros) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor q = to_device(random_f32({2, 2, 9, 16}, 1, -50.0, 50.0), gpu);
  const Tensor k = to_device(random_f32({2, 2, 9, 16}, 2, -50.0, 50.0), gpu);
  const Tensor v = to_device(random_f32({2, 2, 9, 16}, 3), gpu);
  const Tensor mask = to_device(Tensor::zeros({2, 9}, DType::kU8), gpu);
  const ops::AttentionResult r = ops::attention_forward(gpu, q, k, v, mask, {true, 0.0});
  const Tensor zeros = Tensor::zeros({2, 2, 9, 16});
  EXPECT_TRUE(identical(gpu, r.out, zeros, "out"));
  for (double e : to_host(r.lse, gpu).to_vector<double>()) EXPECT_TRUE(std::isinf(e) && e < 0);
  const ops::AttentionGrads g = ops::attention_backward(
      gpu, to_device(random_f32({2, 2, 9, 16}, 4), gpu), q, k, v, r, mask, {true, 0.0});
  EXPECT_TRUE(identical(gpu, g.dq, zeros, "dq"));
  EXPECT_TRUE(identical(gpu, g.dk, zeros, "dk"));
  EXPECT_TRUE(identical(gpu, g.dv, zeros, "dv"));
}

// The CPU backward accepts the CUDA result (no probs, f32 lse) copied back.
TEST(CudaAttention, CpuBackwardFromCudaLse) {
  STRATA_REQUIRE_CUDA();
  ExecContext cpu;
  ExecContext gpu(Device::cuda(0));
  const Tensor q = random_f32({2, 2, 19, 32}, 1), k = random_f32({2, 2, 23, 32}, 2),
               v = random_f32({2, 2, 23, 32}, 3), dout = random_f32({2, 2, 19, 32}, 4);
  const ops::AttentionOptions options{true, 0.0};
  const ops::AttentionResult ref = ops::attention_forward(cpu, q, k, v, Tensor(), options);
  const ops::AttentionResult r = ops::attention_forward(gpu, to_device(q, gpu), to_device(k, gpu),
                                                        to_device(v, gpu), Tensor(), options);
  ops::AttentionResult back;
  back.out = to_host(r.out, gpu);
  back.lse = to_host(r.lse, gpu);
  const ops::AttentionGrads g =
      ops::attention_backward(cpu, dout, q, k, v, back, Tensor(), options);
  const ops::AttentionGrads gref =
      ops::attention_backward(cpu, dout, q, k, v, ref, Tensor(), options);
  const double bound = parity_bound(Precision::kF32);
  EXPECT_TRUE(parity(cpu, g.dq, gref.dq, bound, "dq"));
  EXPECT_TRUE(parity(cpu, g.dk, gref.dk, bound, "dk"));
  EXPECT_TRUE(parity(cpu, g.dv, gref.dv, bound, "dv"));
}

// Running backward twice gives the same gradients (dq's accumulator is zeroed per call).
TEST(CudaAttention, BackwardIsRepeatable) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor q = to_device(random_f32({1, 3, 70, 64}, 1), gpu);
  const Tensor k = to_device(random_f32({1, 3, 70, 64}, 2), gpu);
  const Tensor v = to_device(random_f32({1, 3, 70, 64}, 3), gpu);
  const Tensor dout = to_device(random_f32({1, 3, 70, 64}, 4), gpu);
  const ops::AttentionResult r = ops::attention_forward(gpu, q, k, v, Tensor(), {true, 0.0});
  const ops::AttentionGrads g1 =
      ops::attention_backward(gpu, dout, q, k, v, r, Tensor(), {true, 0.0});
  const ops::AttentionGrads g2 =
      ops::attention_backward(gpu, dout, q, k, v, r, Tensor(), {true, 0.0});
  EXPECT_TRUE(parity(gpu, g2.dq, to_host(g1.dq, gpu), 1e-6, "dq"));
  EXPECT_TRUE(identical(gpu, g2.dk, to_host(g1.dk, gpu), "dk"));
  EXPECT_TRUE(identical(gpu, g2.dv, to_host(g1.dv, gpu), "dv"));
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

TEST(CudaAttention, BadInputsNameOpAndTensor) {
  STRATA_REQUIRE_CUDA();
  ExecContext gpu(Device::cuda(0));
  const Tensor q = to_device(random_f32({2, 2, 3, 4}, 1), gpu);
  const Tensor k = to_device(random_f32({2, 2, 5, 4}, 2), gpu);
  const Tensor v = to_device(random_f32({2, 2, 5, 4}, 3), gpu);
  const ops::AttentionOptions options;
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(gpu, to_device(random_f32({2, 2, 3, 4}, 1).to(DType::kF64), gpu), k,
                               v, Tensor(), options);
      },
      {"attention_forward: q ", "f64"}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(gpu, q, to_device(random_f32({2, 2, 5, 3}, 2), gpu), v, Tensor(),
                               options);
      },
      {"attention_forward: k "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(gpu, q, k,
                               to_device(random_f32({2, 2, 5, 4}, 3).to(DType::kBF16), gpu),
                               Tensor(), options);
      },
      {"attention_forward: v ", "but q is"}));
  EXPECT_TRUE(throws_naming(
      [&] {
        const Tensor big_q = to_device(random_f32({1, 1, 3, 130}, 1), gpu);
        const Tensor big_k = to_device(random_f32({1, 1, 3, 130}, 2), gpu);
        ops::attention_forward(gpu, big_q, big_k, big_k, Tensor(), options);
      },
      {"attention_forward: head dimension", "128"}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(gpu, q, k, v, to_device(Tensor::zeros({2, 3}, DType::kU8), gpu),
                               options);
      },
      {"attention_forward: key_padding_mask "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(gpu, q, k, v, to_device(Tensor::zeros({2, 5}, DType::kF32), gpu),
                               options);
      },
      {"attention_forward: key_padding_mask "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_forward(gpu, q, k, v, Tensor::zeros({2, 5}, DType::kU8), options);
      },
      {"attention_forward: key_padding_mask ", "cpu"}));
  const ops::AttentionResult r = ops::attention_forward(gpu, q, k, v, Tensor(), options);
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::AttentionResult bad = r;
        bad.lse = Tensor();
        ops::attention_backward(gpu, r.out, q, k, v, bad, Tensor(), options);
      },
      {"attention_backward", "lse"}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::AttentionResult bad = r;
        bad.lse = to_device(random_f32({2, 2, 4}, 5), gpu);
        ops::attention_backward(gpu, r.out, q, k, v, bad, Tensor(), options);
      },
      {"attention_backward: lse "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::attention_backward(gpu, to_device(random_f32({2, 2, 3, 5}, 6), gpu), q, k, v, r,
                                Tensor(), options);
      },
      {"attention_backward: dout "}));
}

}  // namespace
}  // namespace strata
