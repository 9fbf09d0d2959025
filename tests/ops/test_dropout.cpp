#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/philox.h"
#include "ops/dropout.h"
#include "testing/testing.h"

namespace strata {
namespace {

using testing::all_close;
using testing::gradients_match;
using testing::random_tensor;

// The keep mask straight from the formula in ops/dropout.h, one Philox block per element.
std::vector<uint8_t> naive_mask(const Shape& shape, double p, const RngOffsets& rng) {
  const int64_t batch = shape[0], per_sample = shape_numel(shape) / batch;
  const PhiloxKey key = philox_key(rng.seed, rng.stream);
  std::vector<uint8_t> mask;
  for (int64_t b = 0; b < batch; ++b) {
    const uint64_t sample = static_cast<uint64_t>(rng.sample_offset + b);
    for (int64_t e = 0; e < per_sample; ++e) {
      const uint64_t block = static_cast<uint64_t>(e) / 4;
      const PhiloxCounter counter{{static_cast<uint32_t>(block & 0xffffffffu),
                                   static_cast<uint32_t>(block >> 32),
                                   static_cast<uint32_t>(sample & 0xffffffffu),
                                   static_cast<uint32_t>(rng.step & 0xffffffff)}};
      const uint32_t bits = philox4x32_10(counter, key).v[e % 4];
      mask.push_back(philox_uniform(bits) >= p ? 1 : 0);
    }
  }
  return mask;
}

std::vector<uint8_t> mask_of(const Tensor& mask) { return mask.to_vector<uint8_t>(); }

RngOffsets offsets(uint64_t seed, uint64_t stream, int64_t step, int64_t sample_offset) {
  RngOffsets rng;
  rng.seed = seed;
  rng.stream = stream;
  rng.step = step;
  rng.sample_offset = sample_offset;
  return rng;
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

TEST(Dropout, ForwardFollowsTheDocumentedFormula) {
  ExecContext ctx;
  const double p = 0.3;
  // 7 elements per sample: blocks straddle no sample boundary, the last block of each is partial.
  Tensor x = random_tensor({5, 7}, 1);
  const RngOffsets rng = offsets(1234, 3, 17, 40);
  ops::DropoutResult r = ops::dropout_forward(ctx, x, p, rng);
  ASSERT_EQ(r.mask.dtype(), DType::kU8);
  const std::vector<uint8_t> expected = naive_mask(x.shape(), p, rng);
  EXPECT_EQ(mask_of(r.mask), expected);
  std::vector<double> y = x.to_vector<double>();
  for (size_t i = 0; i < y.size(); ++i) y[i] = expected[i] ? y[i] / (1 - p) : 0.0;
  EXPECT_TRUE(all_close(r.y, Tensor::from_vector(y, x.shape()), 1e-15, 1e-15));
}

TEST(Dropout, LargeTensorKeepRateAndFormula) {
  ExecContext ctx;
  const double p = 0.25;
  Tensor x = Tensor::full({64, 4099}, 1.0, DType::kF32);  // big enough for several threads
  const RngOffsets rng = offsets(7, 11, 1, 0);
  ops::DropoutResult r = ops::dropout_forward(ctx, x, p, rng);
  const std::vector<uint8_t> mask = mask_of(r.mask);
  EXPECT_EQ(mask, naive_mask(x.shape(), p, rng));
  int64_t kept = 0;
  for (uint8_t m : mask) kept += m;
  const double rate = static_cast<double>(kept) / static_cast<double>(mask.size());
  EXPECT_NEAR(rate, 1 - p, 0.005);  // about 6 standard deviations
  const std::vector<float> y = r.y.to_vector<float>();
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y[i], mask[i] ? 1.0f / 0.75f : 0.0f);
}

TEST(Dropout, MaskDoesNotDependOnMicroBatchSplit) {
  ExecContext ctx;
  const double p = 0.5;
  Tensor x = random_tensor({6, 5, 3}, 2);
  ops::DropoutResult whole = ops::dropout_forward(ctx, x, p, offsets(99, 2, 5, 12));
  ops::DropoutResult first =
      ops::dropout_forward(ctx, x.narrow(0, 0, 4).contiguous(), p, offsets(99, 2, 5, 12));
  ops::DropoutResult second =
      ops::dropout_forward(ctx, x.narrow(0, 4, 2).contiguous(), p, offsets(99, 2, 5, 16));
  std::vector<uint8_t> joined = mask_of(first.mask);
  const std::vector<uint8_t> tail = mask_of(second.mask);
  joined.insert(joined.end(), tail.begin(), tail.end());
  EXPECT_EQ(mask_of(whole.mask), joined);
  EXPECT_TRUE(all_close(whole.y.narrow(0, 4, 2), second.y, 0, 0));
}

TEST(Dropout, StepStreamAndSeedChangeTheMask) {
  ExecContext ctx;
  Tensor x = random_tensor({4, 64}, 3);
  auto mask = [&](const RngOffsets& rng) {
    return mask_of(ops::dropout_forward(ctx, x, 0.5, rng).mask);
  };
  const std::vector<uint8_t> base = mask(offsets(1, 2, 3, 4));
  EXPECT_EQ(mask(offsets(1, 2, 3, 4)), base);  // deterministic
  EXPECT_NE(mask(offsets(1, 2, 4, 4)), base);  // step
  EXPECT_NE(mask(offsets(1, 3, 3, 4)), base);  // stream (layer)
  EXPECT_NE(mask(offsets(2, 2, 3, 4)), base);  // seed
  EXPECT_NE(mask(offsets(1, 2, 3, 5)), base);  // sample offset
}

TEST(Dropout, F32AndF64ShareTheMask) {
  ExecContext ctx;
  Tensor x = random_tensor({3, 10}, 4);
  const RngOffsets rng = offsets(5, 6, 7, 8);
  ops::DropoutResult r64 = ops::dropout_forward(ctx, x, 0.4, rng);
  ops::DropoutResult r32 = ops::dropout_forward(ctx, x.to(DType::kF32), 0.4, rng);
  EXPECT_EQ(mask_of(r32.mask), mask_of(r64.mask));
  EXPECT_TRUE(all_close(r32.y, r64.y, 1e-6, 1e-6));
}

TEST(Dropout, ZeroProbabilityIsIdentity) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3}, 5);
  ops::DropoutResult r = ops::dropout_forward(ctx, x, 0.0, offsets(1, 1, 1, 1));
  EXPECT_TRUE(r.y.shares_storage(x));
  EXPECT_FALSE(r.mask.defined());
  Tensor dy = random_tensor({2, 3}, 6);
  EXPECT_TRUE(ops::dropout_backward(ctx, dy, Tensor(), 0.0).shares_storage(dy));
}

TEST(Dropout, BackwardScalesByTheMask) {
  ExecContext ctx;
  const double p = 0.2;
  Tensor x = random_tensor({4, 6}, 7), dy = random_tensor({4, 6}, 8);
  const RngOffsets rng = offsets(3, 1, 2, 0);
  ops::DropoutResult r = ops::dropout_forward(ctx, x, p, rng);
  Tensor dx = ops::dropout_backward(ctx, dy, r.mask, p);
  std::vector<double> expected = dy.to_vector<double>();
  const std::vector<uint8_t> m = mask_of(r.mask);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = m[i] ? expected[i] / (1 - p) : 0.0;
  EXPECT_TRUE(all_close(dx, Tensor::from_vector(expected, dy.shape()), 1e-15, 1e-15));
  // The mask is a pure function of the offsets, so forward is a fixed linear map of x.
  auto f = [&](const TensorList& xs) { return ops::dropout_forward(ctx, xs[0], p, rng).y; };
  EXPECT_TRUE(gradients_match(f, {x}, dy, {dx}));
}

TEST(Dropout, BadInputsNameOpAndTensor) {
  ExecContext ctx;
  Tensor x = random_tensor({2, 3}, 1);
  EXPECT_TRUE(throws_naming([&] { ops::dropout_forward(ctx, x, 1.0, RngOffsets()); },
                            {"dropout_forward: p "}));
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::dropout_forward(ctx, Tensor::zeros({2, 3}, DType::kI32), 0.5, RngOffsets());
      },
      {"dropout_forward: x "}));
  ops::DropoutResult r = ops::dropout_forward(ctx, x, 0.5, RngOffsets());
  EXPECT_TRUE(throws_naming(
      [&] {
        ops::dropout_backward(ctx, random_tensor({3, 2}, 2), r.mask, 0.5);
      },
      {"dropout_backward: mask "}));
  EXPECT_TRUE(throws_naming([&] { ops::dropout_backward(ctx, x, x, 0.5); },
                            {"dropout_backward: mask ", "u8"}));
  EXPECT_TRUE(throws_naming([&] { ops::dropout_backward(ctx, x, Tensor(), 0.5); },
                            {"dropout_backward: mask "}));
}

}  // namespace
}  // namespace strata
