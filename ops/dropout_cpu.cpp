// Inverted dropout on the CPU with the counter-based Philox masks of ops/dropout.h.
//
// Every element's keep decision is a pure function of (seed, stream, step, global sample index,
// element index within the sample), so the loop is split over flat element ranges in any way and
// the mask is the same for every thread count and every batch split. A thread draws one Philox
// block per four consecutive elements of a sample (one block per counter) and reuses it for the
// four lanes. Kept elements are x * (1 / (1 - p)) with the scale rounded to x's dtype; dropped
// elements are exactly 0 (selected, not multiplied, so an inf or NaN in x does not leak).
#include <cstdint>

#include "engine/philox.h"
#include "ops/cpu_util.h"
#include "ops/dropout.h"

namespace strata::ops::cpu {
namespace {

constexpr const char* kForward = "dropout_forward";
constexpr const char* kBackward = "dropout_backward";
constexpr int64_t kGrain = 1 << 14;

void check_p(double p, const char* op) {
  STRATA_CHECK(p >= 0.0 && p < 1.0) << op << ": p must be in [0, 1), got " << p;
}

}  // namespace

DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng) {
  detail::check_float(x, kForward, "x");
  STRATA_CHECK(x.dim() >= 1) << kForward << ": x must be (B, ...), got a 0-d tensor";
  check_p(p, kForward);
  DropoutResult r;
  if (p == 0.0) {
    r.y = x;
    return r;
  }
  r.y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  r.mask = Tensor::empty(x.shape(), DType::kU8, &ctx.allocator());
  const int64_t batch = x.size(0);
  const int64_t per_sample = batch > 0 ? x.numel() / batch : 0;
  const PhiloxKey key = philox_key(rng.seed, rng.stream);
  const uint32_t step = static_cast<uint32_t>(static_cast<uint64_t>(rng.step));
  const uint64_t first_sample = static_cast<uint64_t>(rng.sample_offset);
  uint8_t* pm = r.mask.data<uint8_t>();
  detail::dispatch_float(x.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const T* px = x.data<T>();
    T* py = r.y.data<T>();
    detail::parallel_for(x.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      int64_t b = i0 / per_sample;
      int64_t e = i0 - b * per_sample;
      PhiloxCounter bits{};
      bool have_bits = false;
      for (int64_t i = i0; i < i1; ++i) {
        if (!have_bits || e % 4 == 0) {
          const uint64_t block = static_cast<uint64_t>(e) / 4;
          const uint32_t sample = static_cast<uint32_t>(first_sample + static_cast<uint64_t>(b));
          const PhiloxCounter counter{
              {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), sample, step}};
          bits = philox4x32_10(counter, key);
          have_bits = true;
        }
        const bool keep = static_cast<double>(philox_uniform(bits.v[e % 4])) >= p;
        pm[i] = keep ? 1 : 0;
        py[i] = keep ? px[i] * scale : T(0);
        if (++e == per_sample) {  // next sample starts a fresh block
          e = 0;
          ++b;
          have_bits = false;
        }
      }
    });
  });
  return r;
}

Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p) {
  detail::check_float(dy, kBackward, "dy");
  check_p(p, kBackward);
  if (!mask.defined()) {
    STRATA_CHECK(p == 0.0) << kBackward << ": mask is undefined but p = " << p
                           << " (only p == 0 runs without a mask)";
    return dy;
  }
  detail::check_cpu(mask, kBackward, "mask");
  STRATA_CHECK(mask.dtype() == DType::kU8)
      << kBackward << ": mask must be u8, got " << dtype_name(mask.dtype());
  detail::check_shape(mask, dy.shape(), kBackward, "mask");
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), &ctx.allocator());
  const uint8_t* pm = mask.data<uint8_t>();
  detail::dispatch_float(dy.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T scale = static_cast<T>(1.0 / (1.0 - p));
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    detail::parallel_for(dy.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pdx[i] = pm[i] != 0 ? pdy[i] * scale : T(0);
    });
  });
  return dx;
}

}  // namespace strata::ops::cpu
