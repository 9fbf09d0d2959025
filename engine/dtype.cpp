// DType tables and binary16 conversion (bit manipulation, so the result is the same on every
// compiler and does not depend on F16C being available).
#include "engine/dtype.h"

#include "engine/check.h"

namespace strata {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  STRATA_THROW() << "invalid dtype " << static_cast<int>(dtype);
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "invalid";
}

DType parse_dtype(const std::string& name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    if (name == dtype_name(d)) return d;
  }
  STRATA_THROW() << "unknown dtype '" << name << "' (valid: f32, f64, f16, bf16, i32, i64, u8)";
}

bool is_floating(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 ||
         dtype == DType::kBF16;
}

float half_to_float(Half h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  uint32_t exponent = (h.bits >> 10) & 0x1fu;
  uint32_t mantissa = h.bits & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // inf or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mantissa & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

Half float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {                     // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) return Half{sign};  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    // value = mantissa * 2^(exponent - 150) = m * 2^-24  =>  m = mantissa >> (126 - exponent)
    const int shift = 126 - static_cast<int>(exponent);
    const uint32_t shifted = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t result = shifted;
    if (rest > halfway || (rest == halfway && (shifted & 1u))) ++result;
    return Half{static_cast<uint16_t>(sign | result)};
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t rebased = abs - (static_cast<uint32_t>(127 - 15) << 23);
  const uint32_t rest = rebased & 0x1fffu;
  uint32_t result = rebased >> 13;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
  return Half{static_cast<uint16_t>(sign | result)};
}

}  // namespace strata
