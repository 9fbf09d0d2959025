// Top-k accuracy on the CPU.
//
// No sort: the target's rank is the number of classes that a stable descending sort would place
// before it (larger logit, or an equal logit at a smaller index), and the row counts when that
// rank is below k. NaN ranks above every number and equal to NaN, as in PyTorch's sort. One pass
// over each row, rows in parallel; targets are validated serially first.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/accuracy.h"
#include "ops/cpu_util.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // logits per parallel chunk, at least

// True when a stable descending sort puts (a, at index i) before (b, at index j).
template <typename T>
bool ranks_before(T a, int64_t i, T b, int64_t j) {
  const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
  if (a_nan || b_nan) return a_nan && (!b_nan || i < j);
  return a > b || (a == b && i < j);
}

}  // namespace

int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k,
                     int64_t ignore_index) {
  constexpr const char* kOp = "topk_correct";
  detail::check_float(logits, kOp, "logits");
  STRATA_CHECK_EQ(logits.dim(), 2) << kOp << ": logits must be (N, C), got " << logits.shape_str();
  const int64_t n = logits.size(0), c = logits.size(1);
  detail::check_index(targets, kOp, "targets");
  detail::check_shape(targets, {n}, kOp, "targets");
  STRATA_CHECK(k >= 1 && k <= c) << kOp << ": k = " << k << " must be in [1, C = " << c
                                 << "] for logits " << logits.shape_str();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = detail::index_at(targets, i);
    STRATA_CHECK(t == ignore_index || (t >= 0 && t < c))
        << kOp << ": targets[" << i << "] = " << t << " is out of range for C = " << c
        << " (must be in [0, " << c << ") or ignore_index " << ignore_index << ")";
  }
  std::vector<uint8_t> hit(static_cast<size_t>(n), 0);
  detail::dispatch_float(logits.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = logits.data<T>();
    detail::parallel_for(n, std::max<int64_t>(1, kGrain / c), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = detail::index_at(targets, i);
        if (t == ignore_index) continue;
        const T* x = px + i * c;
        const T xt = x[t];
        int64_t rank = 0;
        for (int64_t j = 0; j < c && rank < k; ++j) {
          if (ranks_before(x[j], j, xt, t)) ++rank;
        }
        hit[i] = rank < k;
      }
    });
  });
  int64_t correct = 0;
  for (uint8_t h : hit) correct += h;
  return correct;
}

}  // namespace strata::ops::cpu
