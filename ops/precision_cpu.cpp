// CPU kernels of the dtype conversions (ops/precision.h).
#include <type_traits>

#include "ops/cpu_util.h"
#include "ops/precision.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;

inline double load(const float* p, int64_t i) { return p[i]; }
inline double load(const double* p, int64_t i) { return p[i]; }
inline double load(const Half* p, int64_t i) { return half_to_float(p[i]); }
inline double load(const BFloat16* p, int64_t i) { return bf16_to_float(p[i]); }

// f32 and the 16-bit formats round from f32, like the CUDA kernels; f64 keeps the double.
inline void store(float* p, int64_t i, double v) { p[i] = static_cast<float>(v); }
inline void store(double* p, int64_t i, double v) { p[i] = v; }
inline void store(Half* p, int64_t i, double v) { p[i] = float_to_half(static_cast<float>(v)); }
inline void store(BFloat16* p, int64_t i, double v) { p[i] = float_to_bf16(static_cast<float>(v)); }

void check(const Tensor& t, const char* op, const char* name) {
  detail::check_cpu(t, op, name);
  STRATA_CHECK(is_floating(t.dtype()))
      << op << ": " << name << " must be a floating dtype, got " << dtype_name(t.dtype());
}

// Calls f(T{}) with the storage type of a floating dtype.
template <typename F>
void dispatch_any_float(DType dtype, F&& f) {
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
    default:
      STRATA_THROW() << "unsupported dtype " << dtype_name(dtype);
  }
}

void check_pair(const Tensor& dst, const Tensor& src, const char* op) {
  check(dst, op, "dst");
  check(src, op, "src");
  STRATA_CHECK_EQ(dst.numel(), src.numel())
      << op << ": dst " << dst.str() << " and src " << src.str() << " differ in size";
}

}  // namespace

void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "cast_copy_";
  check_pair(dst, src, kOp);
  dispatch_any_float(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_any_float(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* pd = static_cast<D*>(dst.raw_data());
      const S* ps = static_cast<const S*>(src.raw_data());
      detail::parallel_for(dst.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) store(pd, i, load(ps, i));
      });
    });
  });
}

void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  constexpr const char* kOp = "move_add_";
  check_pair(dst, src, kOp);
  if (dst.shares_storage(src)) {
    const char* d = static_cast<const char*>(dst.raw_data());
    const char* s = static_cast<const char*>(src.raw_data());
    STRATA_CHECK(d + dst.nbytes() <= s || s + src.nbytes() <= d)
        << kOp << ": dst " << dst.str() << " and src " << src.str() << " overlap";
  }
  dispatch_any_float(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_any_float(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* pd = static_cast<D*>(dst.raw_data());
      S* ps = static_cast<S*>(src.raw_data());
      detail::parallel_for(dst.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          // The sum rounds once, to dst's dtype (in f32 for f32, like the CUDA kernel).
          if constexpr (std::is_same_v<D, double>) {
            pd[i] += load(ps, i);
          } else {
            store(pd, i,
                  static_cast<double>(static_cast<float>(load(pd, i)) +
                                      static_cast<float>(load(ps, i))));
          }
          ps[i] = S{};
        }
      });
    });
  });
}

}  // namespace strata::ops::cpu
