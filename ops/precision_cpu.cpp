// CPU kernels of the dtype conversions (ops/precision.h), on engine/element.h's per-dtype loads
// and stores.
#include <type_traits>

#include "engine/element.h"
#include "ops/cpu_util.h"
#include "ops/precision.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;

void check_pair(const Tensor& dst, const Tensor& src, const char* op) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{dst, "dst"}, {src, "src"}}) {
    detail::check_cpu(t, op, name);
    STRATA_CHECK(is_floating(t.dtype()))
        << op << ": " << name << " must be a floating dtype, got " << dtype_name(t.dtype());
  }
  detail::check_conversion_pair(dst, src, op);
}

}  // namespace

void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  check_pair(dst, src, "cast_copy_");
  dst.copy_from(src.view(dst.shape()));  // Tensor's conversion: round to nearest even
}

void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src) {
  check_pair(dst, src, "move_add_");
  dispatch_dtype(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_dtype(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      D* pd = static_cast<D*>(dst.raw_data());
      S* ps = static_cast<S*>(src.raw_data());
      detail::parallel_for(dst.numel(), kGrain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          // The sum rounds once, to dst's dtype (in f32 below f64, like the CUDA kernel).
          if constexpr (std::is_same_v<D, double>) {
            pd[i] += load_as_double(ps[i]);
          } else {
            const float sum = static_cast<float>(load_as_double(pd[i])) +
                              static_cast<float>(load_as_double(ps[i]));
            pd[i] = store_from_double<D>(sum);
          }
          ps[i] = S{};
        }
      });
    });
  });
}

}  // namespace strata::ops::cpu
