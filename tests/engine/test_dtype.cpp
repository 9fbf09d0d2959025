#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/check.h"
#include "engine/dtype.h"

namespace strata {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
}

TEST(DType, UnknownNameListsValidOnes) {
  try {
    parse_dtype("f8");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: f32, f64, f16, bf16, i32, i64, u8"),
              std::string::npos)
        << e.what();
  }
}

TEST(Half, EveryBitPatternRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const Half h{static_cast<uint16_t>(bits)};
    const float f = half_to_float(h);
    const Half back = float_to_half(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(back))) << bits;
    } else {
      EXPECT_EQ(back.bits, h.bits) << "bits " << bits << " value " << f;
    }
  }
}

TEST(Half, KnownValuesAndRounding) {
  EXPECT_EQ(float_to_half(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_half(65504.0f).bits, 0x7bff);       // largest finite
  EXPECT_EQ(float_to_half(65520.0f).bits, 0x7c00);       // rounds to inf
  EXPECT_EQ(float_to_half(5.9604645e-8f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(2.9802322e-8f).bits, 0x0000);  // half of it: ties to even (0)
  EXPECT_EQ(float_to_half(8.940697e-8f).bits, 0x0002);   // 1.5 subnormals: ties to even (2)
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to even gives 1.
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: ties to even gives the latter.
  EXPECT_EQ(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_to_float(BFloat16{0x3f80}), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float f = bf16_to_float(BFloat16{static_cast<uint16_t>(bits)});
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bf16(f).bits, bits);
    }
  }
}

}  // namespace
}  // namespace strata
