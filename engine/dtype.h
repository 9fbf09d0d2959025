// Element types and the 16-bit floating-point formats.
//
// f32 is the training type on the CPU; f64 exists for finite-difference gradient checks; f16 and
// bf16 are storage formats for mixed precision (converted to f32 to compute on the CPU); i32, i64
// and u8 hold labels, token ids, indices and raw pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace strata {

enum class DType : uint8_t { kF32, kF64, kF16, kBF16, kI32, kI64, kU8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "f32", "bf16", ...
// Parses the names above; throws strata::Error listing the valid names otherwise.
DType parse_dtype(const std::string& name);
bool is_floating(DType dtype);

// IEEE 754 binary16, stored as its bits.
struct Half {
  uint16_t bits = 0;
};
// bfloat16: the upper half of an f32, stored as its bits.
struct BFloat16 {
  uint16_t bits = 0;
};

float half_to_float(Half h);
Half float_to_half(float f);  // round to nearest even; overflow gives +-inf, NaN stays NaN

inline float bf16_to_float(BFloat16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline BFloat16 float_to_bf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>(u >> 16)};
}

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kF64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kI64;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kU8;
};

template <typename T>
constexpr DType dtype_of() {
  return DTypeOf<T>::value;
}

}  // namespace strata
