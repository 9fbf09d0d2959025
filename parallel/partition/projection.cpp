// GroPipe's performance projection (Eqs. 1-9) and AMPA (Algorithm 1); the choices the paper
// leaves open are listed in projection.h.
//
// AMPA keeps the partitions as sizes over the layer sequence; a move shifts one boundary by one
// layer, so every partition stays contiguous. Partition sums are recomputed from prefix sums
// after each move (O(k)), which keeps them exact for the tie-breaking comparisons.
#include "parallel/partition/projection.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel {
namespace {

std::vector<double> partition_sums(const std::vector<double>& prefix,
                                   const std::vector<size_t>& sizes) {
  std::vector<double> sums;
  size_t at = 0;
  for (size_t s : sizes) {
    sums.push_back(prefix[at + s] - prefix[at]);
    at += s;
  }
  return sums;
}

// PD / mu: the scale-free stopping quantity (0 for equal or all-zero sums).
double relative_dispersion(const std::vector<double>& sums, int exponent) {
  double mean = 0.0;
  for (double v : sums) mean += v;
  mean /= static_cast<double>(sums.size());
  return mean > 0.0 ? performance_dispersion(sums, exponent) / mean : 0.0;
}

}  // namespace

AmpaGuard parse_ampa_guard(const std::string& name) {
  if (name == "off") return AmpaGuard::kOff;
  if (name == "even") return AmpaGuard::kEven;
  if (name == "dp") return AmpaGuard::kDp;
  STRATA_THROW() << "unknown --ampa-guard '" << name << "' (valid: off, even, dp)";
}

const char* ampa_guard_name(AmpaGuard guard) {
  switch (guard) {
    case AmpaGuard::kOff:
      return "off";
    case AmpaGuard::kEven:
      return "even";
    case AmpaGuard::kDp:
      return "dp";
  }
  return "?";
}

void check_projection_options(const ProjectionOptions& options) {
  STRATA_CHECK(options.exponent >= 1)
      << "AMPA: the exponent of Eq. 8 must be >= 1, got " << options.exponent;
  STRATA_CHECK(std::isfinite(options.threshold) && options.threshold >= 0.0)
      << "--ampa-threshold must be >= 0 (PD / mean of the partition times), got "
      << options.threshold;
  STRATA_CHECK(options.max_moves >= 0) << "AMPA: max_moves must be >= 0 (0: 4 L^2 k)";
}

std::string describe_ampa(const AmpaResult& r) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3);
  const std::string how = r.criterion_met
                              ? "criterion met after " + std::to_string(r.moves) + " moves"
                              : "best of " + std::to_string(r.moves) + " moves";
  if (r.chosen == "ampa") return "AMPA, " + how;
  o << (r.chosen == "even" ? "the even split" : "the exact min-max partition")
    << " (AMPA's partition, " << how << ", has a slowest stage of " << r.ampa_slowest_ms
    << " ms; the even split " << r.even_slowest_ms << " ms";
  if (r.dp_slowest_ms >= 0.0) o << ", the min-max partition " << r.dp_slowest_ms << " ms";
  o << ")";
  return o.str();
}

double projection_recurrence(const std::vector<std::vector<double>>& t) {
  STRATA_CHECK(!t.empty() && !t[0].empty()) << "projection: no micro-batches or partitions";
  const size_t k = t[0].size();
  // row[j] = T_{i-1, j} before the update, T_{i, j} after (1-based j; row[0] = 0).
  std::vector<double> row(k + 1, 0.0);
  for (size_t i = 0; i < t.size(); ++i) {
    STRATA_CHECK_EQ(t[i].size(), k) << "projection: micro-batch " << i << " has " << t[i].size()
                                    << " partition times, micro-batch 0 has " << k;
    for (size_t j = 1; j <= k; ++j) {
      STRATA_CHECK(t[i][j - 1] >= 0.0)
          << "projection: negative time t[" << i << "][" << j - 1 << "] = " << t[i][j - 1];
      row[j] = t[i][j - 1] + std::max(row[j - 1], row[j]);  // GroPipe Eq. 2
    }
  }
  return row[k];
}

size_t projection_bottleneck(const std::vector<double>& stage_times) {
  STRATA_CHECK(!stage_times.empty()) << "projection: no partitions";
  return static_cast<size_t>(std::max_element(stage_times.begin(), stage_times.end()) -
                             stage_times.begin());  // GroPipe Eq. 4
}

double projection_closed_form(const std::vector<double>& stage_times, int64_t micro_batches) {
  STRATA_CHECK(micro_batches >= 1) << "projection: micro-batches must be at least 1";
  const size_t n = projection_bottleneck(stage_times);
  for (double v : stage_times) STRATA_CHECK(v >= 0.0) << "projection: negative stage time " << v;
  const double stable = static_cast<double>(micro_batches) * stage_times[n];  // Eq. 5
  double rising = 0.0;                                                        // Eq. 6
  for (size_t p = n + 1; p < stage_times.size(); ++p) rising += stage_times[p];
  for (size_t q = 0; q < n; ++q) rising += stage_times[q];
  return stable + rising;  // Eq. 3
}

double projected_step_time(const std::vector<double>& forward_times,
                           const std::vector<double>& backward_times, int64_t micro_batches) {
  STRATA_CHECK_EQ(forward_times.size(), backward_times.size())
      << "projection: forward and backward times for different partition counts";
  return projection_closed_form(forward_times, micro_batches) +
         projection_closed_form(backward_times, micro_batches);  // Eq. 1
}

std::vector<double> min_max_normalize(const std::vector<double>& times) {
  if (times.empty()) return {};
  const auto [lo, hi] = std::minmax_element(times.begin(), times.end());
  const double min = *lo, range = *hi - *lo;
  std::vector<double> out;
  for (double t : times) out.push_back(range > 0.0 ? (t - min) / range : 1.0);  // Eq. 9
  return out;
}

double performance_dispersion(const std::vector<double>& partition_times, int exponent) {
  STRATA_CHECK(!partition_times.empty()) << "performance dispersion of no partitions";
  STRATA_CHECK(exponent >= 1) << "performance dispersion: exponent must be >= 1, got " << exponent;
  const double k = static_cast<double>(partition_times.size());
  double mean = 0.0;
  for (double t : partition_times) mean += t;
  mean /= k;
  if (mean == 0.0) return 0.0;
  double sum = 0.0;
  for (double t : partition_times) sum += std::pow(t - mean, exponent);
  return sum / (k * mean);  // GroPipe Eq. 8
}

AmpaResult ampa(const std::vector<double>& layer_times, int partitions,
                const ProjectionOptions& options) {
  const size_t L = layer_times.size();
  STRATA_CHECK(partitions >= 1 && static_cast<size_t>(partitions) <= L)
      << "AMPA: " << partitions << " partitions of " << L << " layers";
  check_projection_options(options);
  for (size_t l = 0; l < L; ++l) {
    STRATA_CHECK(layer_times[l] >= 0.0 && std::isfinite(layer_times[l]))
        << "AMPA: layer " << l << " has the time " << layer_times[l];
  }
  const size_t k = static_cast<size_t>(partitions);
  // Lines 1-2: the (normalized) times, as prefix sums.
  const std::vector<double> t = options.normalize ? min_max_normalize(layer_times) : layer_times;
  std::vector<double> prefix(L + 1, 0.0);
  for (size_t l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + t[l];
  // Line 3: the even split.
  std::vector<size_t> sizes;
  for (size_t i = 0; i < k; ++i) sizes.push_back(L / k + (i < L % k ? 1 : 0));

  AmpaResult result;
  const int64_t cap =
      options.max_moves > 0 ? options.max_moves : 4 * static_cast<int64_t>(L * L * k);
  std::vector<size_t> best = sizes;
  std::vector<double> best_sums = partition_sums(prefix, sizes);
  double best_max = *std::max_element(best_sums.begin(), best_sums.end());
  double best_pd = relative_dispersion(best_sums, options.exponent);
  auto consider = [&] {
    const std::vector<double> sums = partition_sums(prefix, sizes);
    const double top = *std::max_element(sums.begin(), sums.end());
    const double pd = relative_dispersion(sums, options.exponent);
    if (top < best_max || (top == best_max && pd < best_pd)) {
      best = sizes, best_max = top, best_pd = pd;
    }
  };
  auto finish = [&](bool met) {
    result.sizes = met ? sizes : best;
    result.criterion_met = met;
    result.dispersion = relative_dispersion(partition_sums(prefix, result.sizes), options.exponent);
    return result;
  };
  for (;;) {  // line 4
    std::vector<double> sums = partition_sums(prefix, sizes);
    const size_t max = projection_bottleneck(sums);  // line 5
    for (;;) {                                       // line 6
      sums = partition_sums(prefix, sizes);
      const size_t min =
          static_cast<size_t>(std::min_element(sums.begin(), sums.end()) - sums.begin());  // line 7
      if (relative_dispersion(sums, options.exponent) <= options.threshold) {
        return finish(true);  // lines 8-9
      }
      if (max == min || result.moves >= cap) return finish(false);
      size_t h;
      if (max <= min) {  // lines 11-13: the last layer of p_{min-1} goes to p_min
        h = min - 1;
        if (sizes[h] <= 1) return finish(false);
      } else {  // lines 14-16: the first layer of p_{min+1} goes to p_min
        h = min + 1;
        if (sizes[h] <= 1) return finish(false);
      }
      --sizes[h];
      ++sizes[min];
      ++result.moves;
      consider();
      if (max == h) break;  // lines 18-19
    }
  }
}

PartitionPlan projection_partition(const std::vector<LayerCost>& costs, int stages,
                                   const PartitionOptions& options,
                                   const ProjectionOptions& projection, AmpaResult* result) {
  std::vector<double> times;
  for (const LayerCost& c : costs) times.push_back(c.forward_ms + c.backward_ms);
  AmpaResult r = ampa(times, stages, projection);
  Partition partition;
  size_t at = 0;
  for (size_t s : r.sizes) {
    partition.push_back({at, at + s});
    at += s;
  }
  PartitionPlan best = evaluate_partition(costs, partition, options);
  r.ampa_partition = partition;
  r.ampa_slowest_ms = best.slowest_ms;
  // The guard: another candidate replaces the current one only when strictly better, a partition
  // within the memory limit always being better than one over it.
  auto better = [](const PartitionPlan& a, const PartitionPlan& b) {
    if (a.memory_error.empty() != b.memory_error.empty()) return a.memory_error.empty();
    return a.slowest_ms < b.slowest_ms;
  };
  if (projection.guard != AmpaGuard::kOff) {
    const PartitionPlan even =
        evaluate_partition(costs, uniform_partition(costs.size(), stages), options);
    r.even_slowest_ms = even.slowest_ms;
    if (better(even, best)) best = even, r.chosen = "even";
  }
  if (projection.guard == AmpaGuard::kDp) {
    try {
      const PartitionPlan dp = balanced_partition(costs, stages, options);
      r.dp_slowest_ms = dp.slowest_ms;
      if (better(dp, best)) best = dp, r.chosen = "dp";
    } catch (const Error&) {
      // No partition fits the memory limit: the candidates above carry their memory_error.
    }
  }
  if (result != nullptr) *result = r;
  return best;
}

}  // namespace strata::parallel
