// Element-wise float math for the CPU kernels, written so that the compiler vectorizes a loop that
// calls it (branch-free: selects, not branches; no library calls). With STRATA_NATIVE (the
// default) the loops compile for the build machine's vector unit (AVX-512 on the development
// machine); a portable build (-DSTRATA_NATIVE=OFF) vectorizes them for SSE2.
//
//   exp(x):      Cody-Waite reduction x = n ln2 + r, |r| <= ln2 / 2, and a degree-6 polynomial of
//                e^r (Cephes' expf coefficients), scaled by 2^n through the exponent bits.
//                Within 2 ulp of e^x on [-87.3, 88.7]; 0 below, +inf above, NaN stays NaN.
//   sigmoid(x):  1 / (1 + exp(-x)), saturating to 0 and 1.
//
// The kernels use these for f32 tensors only; f64 tensors (the finite-difference gradient checks)
// keep the library's std::exp and std::tanh.
#pragma once

#include <cstdint>
#include <cstring>

namespace strata::ops::cpu_math {

inline float bits_to_float(uint32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof(f));
  return f;
}

inline float exp(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.72283f;
  const float xc = x < kLo ? kLo : (x > kHi ? kHi : x);
  // n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer in float.
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n as 2^h 2^(n - h): n reaches 128 near the top of the range, past the largest exponent.
  // A NaN x leaves n NaN, whose conversion to an integer is undefined: it scales by 2^0 instead
  // (p is NaN already). The exponent fields are non-negative for every other n.
  const int32_t ni = static_cast<int32_t>(n == n ? n : 0.0f), h = ni >> 1;
  const float y = p * bits_to_float(static_cast<uint32_t>(h + 127) << 23) *
                  bits_to_float(static_cast<uint32_t>(ni - h + 127) << 23);
  const float under = x < kLo ? 0.0f : y;
  return x > kHi ? __builtin_inff() : under;  // NaN fails both tests and stays NaN
}

inline float sigmoid(float x) { return 1.0f / (1.0f + exp(-x)); }

}  // namespace strata::ops::cpu_math
