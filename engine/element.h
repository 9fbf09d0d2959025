// Elements by dtype, for CPU loops over tensors of any dtype: loads through double, stores
// from double (rounding to nearest even into f16/bf16, as dtype.h's conversions do), element
// conversion, and dispatch from a DType to its C++ storage type. Shared by Tensor's conversions
// and the CPU kernels that take 16-bit tensors (ops/precision_cpu.cpp, ops/dispatch.cpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/check.h"
#include "engine/dtype.h"

namespace strata {

template <typename T>
inline double load_as_double(const T& v) {
  return static_cast<double>(v);
}
template <>
inline double load_as_double<Half>(const Half& v) {
  return half_to_float(v);
}
template <>
inline double load_as_double<BFloat16>(const BFloat16& v) {
  return bf16_to_float(v);
}

template <typename T>
inline T store_from_double(double v) {
  return static_cast<T>(v);
}
template <>
inline Half store_from_double<Half>(double v) {
  return float_to_half(static_cast<float>(v));
}
template <>
inline BFloat16 store_from_double<BFloat16>(double v) {
  return float_to_bf16(static_cast<float>(v));
}
template <>
inline float store_from_double<float>(double v) {
  return static_cast<float>(v);
}
template <>
inline uint8_t store_from_double<uint8_t>(double v) {
  return static_cast<uint8_t>(static_cast<int64_t>(v));
}

template <typename Dst, typename Src>
inline Dst convert_element(const Src& v) {
  if constexpr (std::is_same_v<Dst, Src>) {
    return v;
  } else if constexpr (std::is_integral_v<Dst> && std::is_integral_v<Src>) {
    return static_cast<Dst>(v);
  } else {
    return store_from_double<Dst>(load_as_double<Src>(v));
  }
}

// Calls f(type_tag) with a value of the C++ type of `dtype`.
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kF64:
      f(double{});
      return;
    case DType::kF16:
      f(Half{});
      return;
    case DType::kBF16:
      f(BFloat16{});
      return;
    case DType::kI32:
      f(int32_t{});
      return;
    case DType::kI64:
      f(int64_t{});
      return;
    case DType::kU8:
      f(uint8_t{});
      return;
  }
  STRATA_THROW() << "invalid dtype";
}

}  // namespace strata
