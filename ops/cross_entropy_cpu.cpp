// Cross-entropy fused with log-softmax on the CPU.
//
// Per row, with m = max_j x_j and lse = m + log sum_j exp(x_j - m) (the shift keeps exp from
// overflowing; the sum is accumulated in double), and since the smoothed target q sums to 1:
//   loss_i = -sum_j q_j (x_j - lse) = lse - (1 - eps) x_t - (eps / V) sum_j x_j.
// Row losses are kept apart and added in row order in double, so the result does not depend on
// the thread count. The backward recomputes softmax from the logits (nothing is saved):
//   dlogits_ij = dloss / normalizer * (exp(x_ij - lse_i) - q_ij).
// Targets are validated in one serial pass before any parallel work, so errors name the row.
//
// f32 logits take vectorized row loops (ops/cpu_math.h): the maximum, then the exponentials in
// f32 summed in blocks of kSumBlock (f32 lanes within a block, the block sums in double), and in
// the backward one exponential per element, written straight to dlogits.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/cpu_math.h"
#include "ops/cpu_util.h"
#include "ops/cross_entropy.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;  // logits per parallel chunk, at least

struct CrossEntropyDims {
  int64_t n = 0, v = 0;
  double normalizer = 0.0;  // resolved: options.normalizer, or the count; 0 when nothing counts
};

CrossEntropyDims check_cross_entropy(const Tensor& logits, const Tensor& targets,
                                     const CrossEntropyOptions& options, const char* op) {
  detail::check_float(logits, op, "logits");
  STRATA_CHECK_EQ(logits.dim(), 2) << op << ": logits must be (N, V), got " << logits.shape_str();
  CrossEntropyDims d;
  d.n = logits.size(0);
  d.v = logits.size(1);
  STRATA_CHECK_GE(d.v, 1) << op << ": logits " << logits.shape_str() << " has no classes";
  detail::check_index(targets, op, "targets");
  detail::check_shape(targets, {d.n}, op, "targets");
  const double eps = options.label_smoothing;
  STRATA_CHECK(eps >= 0.0 && eps < 1.0)
      << op << ": options.label_smoothing must be in [0, 1), got " << eps;
  STRATA_CHECK(options.normalizer >= 0.0 && std::isfinite(options.normalizer))
      << op << ": options.normalizer must be finite and >= 0 (0 means the target count), got "
      << options.normalizer;
  int64_t count = 0;
  for (int64_t i = 0; i < d.n; ++i) {
    const int64_t t = detail::index_at(targets, i);
    if (t == options.ignore_index) continue;
    STRATA_CHECK(t >= 0 && t < d.v)
        << op << ": targets[" << i << "] = " << t << " is out of range for V = " << d.v
        << " (must be in [0, " << d.v << ") or ignore_index " << options.ignore_index << ")";
    ++count;
  }
  d.normalizer = options.normalizer > 0.0 ? options.normalizer : static_cast<double>(count);
  return d;
}

// log sum_j exp(x_j) of one row, shifted by its maximum.
template <typename T>
double log_sum_exp(const T* x, int64_t v) {
  const T m = *std::max_element(x, x + v);
  double sum = 0.0;
  for (int64_t j = 0; j < v; ++j) sum += std::exp(x[j] - m);
  return static_cast<double>(m) + std::log(sum);
}

constexpr int64_t kSumBlock = 1024;  // f32 exponentials summed in f32 per block, then in double

float row_max_f32(const float* x, int64_t v) {
  float m = x[0];
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < v; ++j) m = std::max(m, x[j]);
  return m;
}

// log sum_j exp(x_j) of an f32 row, and (sum_x != nullptr) sum_j x_j, both in double.
double log_sum_exp_f32(const float* x, int64_t v, double* sum_x) {
  const float m = row_max_f32(x, v);
  double sum = 0.0, total_x = 0.0;
  for (int64_t j0 = 0; j0 < v; j0 += kSumBlock) {
    const int64_t j1 = std::min(v, j0 + kSumBlock);
    float block = 0.0f, block_x = 0.0f;
#pragma omp simd reduction(+ : block, block_x)
    for (int64_t j = j0; j < j1; ++j) {
      block += cpu_math::exp(x[j] - m);
      block_x += x[j];
    }
    sum += block;
    total_x += block_x;
  }
  if (sum_x != nullptr) *sum_x = total_x;
  return static_cast<double>(m) + std::log(sum);
}

}  // namespace

Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options) {
  constexpr const char* kOp = "cross_entropy_forward";
  const CrossEntropyDims d = check_cross_entropy(logits, targets, options, kOp);
  const double eps = options.label_smoothing;
  std::vector<double> row_loss(static_cast<size_t>(d.n), 0.0);
  Tensor loss = Tensor::empty({}, logits.dtype(), &ctx.allocator());
  detail::dispatch_float(logits.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = logits.data<T>();
    detail::parallel_for(d.n, std::max<int64_t>(1, kGrain / d.v), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = detail::index_at(targets, i);
        if (t == options.ignore_index) continue;
        const T* x = px + i * d.v;
        if constexpr (std::is_same_v<T, float>) {
          // The smoothing term only with smoothing: 0 x sum_x would be NaN for a row with a -inf
          // logit (a padded vocabulary's columns, when num_classes leaves them in).
          double sum_x = 0.0;
          row_loss[i] = log_sum_exp_f32(x, d.v, eps > 0.0 ? &sum_x : nullptr) -
                        (1.0 - eps) * static_cast<double>(x[t]);
          if (eps > 0.0) row_loss[i] -= eps / static_cast<double>(d.v) * sum_x;
          continue;
        }
        double loss_i = log_sum_exp(x, d.v) - (1.0 - eps) * static_cast<double>(x[t]);
        if (eps > 0.0) {
          double sum_x = 0.0;
          for (int64_t j = 0; j < d.v; ++j) sum_x += x[j];
          loss_i -= eps / static_cast<double>(d.v) * sum_x;
        }
        row_loss[i] = loss_i;
      }
    });
    double total = 0.0;
    for (double l : row_loss) total += l;
    loss.data<T>()[0] = static_cast<T>(d.normalizer > 0.0 ? total / d.normalizer : 0.0);
  });
  return loss;
}

Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options, double dloss) {
  constexpr const char* kOp = "cross_entropy_backward";
  const CrossEntropyDims d = check_cross_entropy(logits, targets, options, kOp);
  const double eps = options.label_smoothing;
  const double off_target = eps / static_cast<double>(d.v);  // q_j for j != target
  const double row_scale = d.normalizer > 0.0 ? dloss / d.normalizer : 0.0;
  Tensor dlogits = Tensor::empty(logits.shape(), logits.dtype(), &ctx.allocator());
  detail::dispatch_float(logits.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = logits.data<T>();
    T* pdx = dlogits.data<T>();
    detail::parallel_for(d.n, std::max<int64_t>(1, kGrain / d.v), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = detail::index_at(targets, i);
        T* dx = pdx + i * d.v;
        if (t == options.ignore_index) {
          std::fill(dx, dx + d.v, T(0));
          continue;
        }
        const T* x = px + i * d.v;
        if constexpr (std::is_same_v<T, float>) {
          const float lse = static_cast<float>(log_sum_exp_f32(x, d.v, nullptr));
          const float scale = static_cast<float>(row_scale);
          const float shift = static_cast<float>(row_scale * off_target);
#pragma omp simd
          for (int64_t j = 0; j < d.v; ++j) dx[j] = scale * cpu_math::exp(x[j] - lse) - shift;
          dx[t] -= static_cast<float>(row_scale * (1.0 - eps));
          continue;
        }
        const double lse = log_sum_exp(x, d.v);
        for (int64_t j = 0; j < d.v; ++j) {
          const double p = std::exp(static_cast<double>(x[j]) - lse);
          dx[j] = static_cast<T>(row_scale * (p - off_target));
        }
        dx[t] = static_cast<T>(
            row_scale * (std::exp(static_cast<double>(x[t]) - lse) - off_target - (1.0 - eps)));
      }
    });
  });
  return dlogits;
}

}  // namespace strata::ops::cpu
