#include "parallel/dynpipe/repartition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "engine/check.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"

namespace strata::parallel::dynpipe {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_layers(const std::vector<LayerCost>& layers) {
  STRATA_CHECK(!layers.empty()) << "re-partition of an empty model";
  for (const LayerCost& l : layers) {
    STRATA_CHECK(std::isfinite(l.forward_ms) && std::isfinite(l.backward_ms) &&
                 std::isfinite(l.output_bytes) && l.forward_ms >= 0 && l.backward_ms >= 0 &&
                 l.output_bytes >= 0)
        << "layer '" << l.name << "' has a negative or non-finite cost";
  }
}

void check_partition(const Partition& p, size_t layers, const char* what) {
  STRATA_CHECK(!p.empty()) << what << " partition has no stages";
  size_t next = 0;
  for (const LayerRange& r : p) {
    STRATA_CHECK(r.begin == next && r.end > r.begin)
        << what << " partition is not contiguous: a stage [" << r.begin << ", " << r.end
        << ") where layer " << next << " was expected to start one";
    next = r.end;
  }
  STRATA_CHECK(next == layers) << what << " partition covers " << next << " layers of " << layers;
}

// Prefix sums of forward + backward ms per sample.
std::vector<double> compute_prefix(const std::vector<LayerCost>& layers) {
  std::vector<double> prefix(layers.size() + 1, 0.0);
  for (size_t i = 0; i < layers.size(); ++i) {
    prefix[i + 1] = prefix[i] + layers[i].forward_ms + layers[i].backward_ms;
  }
  return prefix;
}

// Eq. 7 on one GPU per side for the cut before layer `l` (l > 0), ms.
double cut_ms(const std::vector<LayerCost>& layers, size_t l, const RepartitionOptions& o) {
  if (o.bandwidth_bps <= 0) return 0.0;
  return 2.0 * o.micro_batch_size * layers[l - 1].output_bytes / o.bandwidth_bps * 1e3;
}

double checked_slowdown(const SlowdownFn& slowdown, int rank, LayerRange r) {
  const double f = slowdown(rank, r);
  STRATA_CHECK(std::isfinite(f) && f > 0)
      << "slowdown of rank " << rank << " for layers " << r.begin << "-" << r.end - 1 << " is " << f
      << " (must be positive and finite)";
  return f;
}

}  // namespace

SlowdownFn per_rank_slowdown(const std::vector<double>& factors) {
  for (size_t r = 0; r < factors.size(); ++r) {
    STRATA_CHECK(std::isfinite(factors[r]) && factors[r] > 0)
        << "slowdown of rank " << r << " must be positive and finite, got " << factors[r];
  }
  return [factors](int rank, LayerRange) {
    STRATA_CHECK(rank >= 0 && static_cast<size_t>(rank) < factors.size())
        << "no slowdown for rank " << rank << " (" << factors.size() << " given)";
    return factors[static_cast<size_t>(rank)];
  };
}

std::vector<LayerRange> condense(const std::vector<LayerCost>& layers, size_t top_k,
                                 const Partition& keep) {
  check_layers(layers);
  const size_t m = layers.size();
  std::vector<bool> ends(m, false);  // ends[i]: a block ends after layer i
  ends[m - 1] = true;
  if (top_k == 0 || top_k >= m) {
    std::fill(ends.begin(), ends.end(), true);
  } else {
    std::vector<size_t> order(m);
    std::iota(order.begin(), order.end(), 0);
    // Most time first; ties: the earlier layer.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return layers[a].forward_ms + layers[a].backward_ms >
             layers[b].forward_ms + layers[b].backward_ms;
    });
    for (size_t k = 0; k < top_k; ++k) ends[order[k]] = true;
  }
  if (!keep.empty()) {
    check_partition(keep, m, "the kept");
    for (const LayerRange& r : keep) ends[r.end - 1] = true;
  }
  std::vector<LayerRange> blocks;
  size_t begin = 0;
  for (size_t i = 0; i < m; ++i) {
    if (ends[i]) {
      blocks.push_back({begin, i + 1});
      begin = i + 1;
    }
  }
  return blocks;
}

double simulate_cycle(const std::vector<LayerCost>& layers, const Partition& partition,
                      const SlowdownFn& slowdown, const RepartitionOptions& o,
                      std::vector<double>* stage_ms) {
  check_layers(layers);
  check_partition(partition, layers.size(), "the simulated");
  const std::vector<double> prefix = compute_prefix(layers);
  if (stage_ms != nullptr) stage_ms->clear();
  double cycle = 0.0;
  for (size_t s = 0; s < partition.size(); ++s) {
    const LayerRange r = partition[s];
    const double t = checked_slowdown(slowdown, static_cast<int>(s), r) * o.micro_batch_size *
                     (prefix[r.end] - prefix[r.begin]);
    if (stage_ms != nullptr) stage_ms->push_back(t);
    cycle = s == 0 ? t : two_stage_time(cycle, t, cut_ms(layers, r.begin, o), o.rule);
  }
  return cycle;
}

Proposal propose(const Partition& current, const std::vector<LayerCost>& layers,
                 const SlowdownFn& slowdown, const RepartitionOptions& o) {
  check_layers(layers);
  check_partition(current, layers.size(), "the current");
  STRATA_CHECK(o.micro_batch_size > 0 && std::isfinite(o.micro_batch_size))
      << "micro-batch size must be positive, got " << o.micro_batch_size;
  STRATA_CHECK(o.min_gain >= 0 && o.min_gain < 1)
      << "the minimum gain must be in [0, 1), got " << o.min_gain;
  const std::vector<LayerRange> blocks = condense(layers, o.top_k, current);
  const std::vector<double> prefix = compute_prefix(layers);
  const size_t B = blocks.size(), S = current.size();

  Proposal p;
  p.blocks = B;
  p.current_cycle_ms = simulate_cycle(layers, current, slowdown, o);

  // best[s][j]: least cycle time of blocks [0, j) as s + 1 stages on ranks 0..s; from[s][j]: the
  // first block of the last of those stages.
  std::vector<std::vector<double>> best(S, std::vector<double>(B + 1, kInf));
  std::vector<std::vector<size_t>> from(S, std::vector<size_t>(B + 1, 0));
  const auto stage_time = [&](size_t s, size_t i, size_t j) {
    const LayerRange r{blocks[i].begin, blocks[j - 1].end};
    return checked_slowdown(slowdown, static_cast<int>(s), r) * o.micro_batch_size *
           (prefix[r.end] - prefix[r.begin]);
  };
  for (size_t j = 1; j <= B; ++j) best[0][j] = stage_time(0, 0, j);
  for (size_t s = 1; s < S; ++s) {
    for (size_t j = s + 1; j <= B; ++j) {
      for (size_t i = s; i < j; ++i) {
        if (!std::isfinite(best[s - 1][i])) continue;
        const double w = two_stage_time(best[s - 1][i], stage_time(s, i, j),
                                        cut_ms(layers, blocks[i].begin, o), o.rule);
        if (w < best[s][j]) {
          best[s][j] = w;
          from[s][j] = i;
        }
      }
    }
  }
  Partition found(S);
  size_t j = B;
  for (size_t s = S; s-- > 0;) {
    const size_t i = s == 0 ? 0 : from[s][j];
    found[s] = {blocks[i].begin, blocks[j - 1].end};
    j = i;
  }
  const double found_ms = std::isfinite(best[S - 1][B]) ? best[S - 1][B] : kInf;
  if (found_ms < p.current_cycle_ms * (1.0 - o.min_gain) && found != current) {
    p.partition = found;
    p.changed = true;
  } else {
    p.partition = current;
  }
  p.cycle_ms = simulate_cycle(layers, p.partition, slowdown, o, &p.stage_ms);
  return p;
}

Proposal propose(const Partition& current, const std::vector<LayerCost>& layers,
                 const std::vector<double>& rank_slowdown, const RepartitionOptions& o) {
  STRATA_CHECK(rank_slowdown.size() == current.size())
      << rank_slowdown.size() << " slowdowns for the " << current.size() << " ranks of the plan";
  return propose(current, layers, per_rank_slowdown(rank_slowdown), o);
}

std::vector<double> measured_slowdowns(const std::vector<LayerCost>& layers,
                                       const Partition& current,
                                       const std::vector<double>& measured_stage_ms,
                                       const RepartitionOptions& o) {
  STRATA_CHECK(measured_stage_ms.size() == current.size())
      << measured_stage_ms.size() << " measured stage times for " << current.size() << " stages";
  std::vector<double> solo;
  simulate_cycle(layers, current, per_rank_slowdown(std::vector<double>(current.size(), 1.0)), o,
                 &solo);
  std::vector<double> factors(current.size());
  for (size_t s = 0; s < current.size(); ++s) {
    STRATA_CHECK(std::isfinite(measured_stage_ms[s]) && measured_stage_ms[s] > 0)
        << "measured time of stage " << s << " must be positive, got " << measured_stage_ms[s];
    STRATA_CHECK(solo[s] > 0) << "stage " << s << " has no solo time to compare with";
    factors[s] = measured_stage_ms[s] / solo[s];
  }
  return factors;
}

SlowdownFn make_forest_slowdown(const ForestModel& model, const std::vector<LayerCost>& layers,
                                const std::vector<std::map<std::string, double>>& rank_counters) {
  check_layers(layers);
  const std::vector<std::string>& features = model.features();
  const size_t m = layers.size(), f = features.size();
  // weighted[r][i]: prefix sums of predicted slowdown x solo time over the layers, per rank.
  auto weighted = std::make_shared<std::vector<std::vector<double>>>();
  auto time = std::make_shared<std::vector<double>>(compute_prefix(layers));
  // The rows are the profile's (slowdown_features.h): the model must be of that feature set.
  const std::vector<std::string> expected = slowdown_features();
  STRATA_CHECK(features == expected)
      << "the slowdown model's features (" << join_names(features) << ") are not feature set "
      << kFeatureSet << " (" << join_names(expected) << ")";
  for (size_t r = 0; r < rank_counters.size(); ++r) {
    const CpuCounters counters = counters_from_map(rank_counters[r], "rank " + std::to_string(r));
    std::vector<float> rows;
    rows.reserve(m * f);
    for (size_t i = 0; i < m; ++i) {
      const LayerCost& l = layers[i];
      LayerFeatures lf;
      lf.solo_ms = l.forward_ms + l.backward_ms;
      lf.param_bytes = l.param_bytes;
      lf.output_bytes = l.output_bytes;
      lf.activation_bytes = l.activation_bytes;
      for (double v : slowdown_feature_row(lf, counters)) rows.push_back(static_cast<float>(v));
    }
    const std::vector<float> pred = model.predict(rows.data(), m);
    std::vector<double> prefix(m + 1, 0.0);
    for (size_t i = 0; i < m; ++i) {
      const double t = layers[i].forward_ms + layers[i].backward_ms;
      prefix[i + 1] = prefix[i] + std::max(1e-3, static_cast<double>(pred[i])) * t;
    }
    weighted->push_back(std::move(prefix));
  }
  return [weighted, time](int rank, LayerRange r) {
    STRATA_CHECK(rank >= 0 && static_cast<size_t>(rank) < weighted->size())
        << "no counters for rank " << rank << " (" << weighted->size() << " given)";
    const std::vector<double>& w = (*weighted)[static_cast<size_t>(rank)];
    const double t = (*time)[r.end] - (*time)[r.begin];
    return t > 0 ? (w[r.end] - w[r.begin]) / t : 1.0;
  };
}

}  // namespace strata::parallel::dynpipe
