#include "parallel/dynpipe/policy.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "engine/check.h"
#include "engine/log.h"
#include "parallel/dynpipe/colocation.h"
#include "parallel/dynpipe/repartition.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"

namespace strata::parallel::dynpipe {
namespace {

enum class Kind { kNoRf, kForest, kPipeDreamRe };

std::string join(const std::vector<double>& v) {
  std::ostringstream out;
  out << std::setprecision(3);
  for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "") << v[i];
  return out.str();
}

class DynpipePolicy : public RepartitionPolicy {
 public:
  DynpipePolicy(Kind kind, const PolicyOptions& o, std::unique_ptr<ForestModel> model,
                std::string name)
      : kind_(kind), options_(o), model_(std::move(model)), name_(std::move(name)) {}
  const char* name() const override { return name_.c_str(); }

  RepartitionDecision propose(const RepartitionInput& in) override {
    RepartitionDecision d;
    d.partition = in.partition;
    const size_t L = in.layer_seconds.size();
    const size_t S = in.partition.size();
    STRATA_CHECK(S >= 1 && in.partition.back().end == L)
        << "repartition: a partition of " << in.partition.back().end << " layers for " << L
        << " measured layers";
    for (double b : in.stage_busy_seconds) d.measured_slowest = std::max(d.measured_slowest, b);
    // Solo costs: the least per-step time each layer was measured at.
    if (solo_.size() != L) solo_.assign(L, 0.0);
    for (size_t l = 0; l < L; ++l) {
      const double t = in.layer_seconds[l];
      if (t > 0 && (solo_[l] <= 0 || t < solo_[l])) solo_[l] = t;
    }
    const double samples = std::max(1.0, in.samples_per_step);
    const std::vector<double>& cost = kind_ == Kind::kPipeDreamRe ? in.layer_seconds : solo_;
    std::vector<LayerCost> layers(L);
    double total = 0.0;
    for (size_t l = 0; l < L; ++l) {
      layers[l].forward_ms = 1e3 * cost[l] / samples;  // forward + backward, per sample
      layers[l].output_bytes = at(in.layer_output_bytes, l);
      layers[l].activation_bytes = at(in.layer_activation_bytes, l);
      layers[l].param_bytes = at(in.layer_param_bytes, l);
      total += cost[l];
    }
    if (S == 1 || !(total > 0)) {
      d.reason = S == 1 ? "one stage" : "no layer time measured";
      return d;
    }
    RepartitionOptions ro;
    ro.top_k = options_.top_k;
    ro.micro_batch_size = samples;  // the simulator's stage time: ms per step
    ro.min_gain = options_.threshold;
    std::ostringstream why;
    SlowdownFn slowdown;
    if (kind_ == Kind::kPipeDreamRe) {
      slowdown = per_rank_slowdown(std::vector<double>(S, 1.0));
      why << "measured layer costs";
    } else if (kind_ == Kind::kNoRf) {
      const std::vector<double> f = measured_slowdowns(layers, in.partition, stage_ms(in), ro);
      slowdown = per_rank_slowdown(f);
      why << "measured slowdowns " << join(f);
    } else {
      STRATA_CHECK(in.stage_counters.size() == S)
          << "--repartition dynpipe: the monitor's counters of " << in.stage_counters.size()
          << " stages for " << S << " stages (the monitor must run)";
      for (size_t s = 0; s < S; ++s) {
        if (in.stage_counters[s].empty()) {
          d.reason = "the monitor has no sample of stage " + std::to_string(s) +
                     " yet (one per --monitor-interval-ms): kept";
          return d;
        }
      }
      const SlowdownFn forest = make_forest_slowdown(*model_, layers, in.stage_counters);
      // The forest's prediction for a rank's current stage, raised to what the stage measured
      // when it measured slower (policy.h): a slowdown the counters do not show is not ignored.
      const std::vector<double> measured =
          measured_slowdowns(layers, in.partition, stage_ms(in), ro);
      std::vector<double> f, raise;
      for (size_t s = 0; s < S; ++s) {
        const double p = forest(static_cast<int>(s), in.partition[s]);
        f.push_back(p);
        raise.push_back(std::max(1.0, measured[s] / p));
      }
      slowdown = [forest, raise](int rank, LayerRange range) {
        return forest(rank, range) * raise.at(static_cast<size_t>(rank));
      };
      why << "predicted slowdowns " << join(f) << ", measured " << join(measured);
    }
    const Proposal p = dynpipe::propose(in.partition, layers, slowdown, ro);
    d.current_cost = p.current_cycle_ms / 1e3;
    d.predicted_cost = p.cycle_ms / 1e3;
    d.partition = p.partition;
    d.apply = p.changed;
    why << "; predicted cycle " << 1e3 * d.current_cost << " -> " << 1e3 * d.predicted_cost
        << " ms/step" << (p.changed ? " (gain " : " (no plan better by more than ")
        << (p.changed ? 100 * d.gain() : 100 * options_.threshold) << "%)";
    d.reason = why.str();
    return d;
  }

 private:
  static double at(const std::vector<double>& v, size_t i) { return i < v.size() ? v[i] : 0.0; }
  // Each stage's measured ms per step: the sum of its layers' over the window.
  static std::vector<double> stage_ms(const RepartitionInput& in) {
    std::vector<double> out(in.partition.size(), 0.0);
    for (size_t s = 0; s < in.partition.size(); ++s) {
      for (size_t l = in.partition[s].begin; l < in.partition[s].end; ++l) {
        out[s] += 1e3 * in.layer_seconds[l];
      }
    }
    return out;
  }
  Kind kind_;
  PolicyOptions options_;
  std::unique_ptr<ForestModel> model_;
  std::string name_;
  std::vector<double> solo_;  // per layer, seconds per step
};

}  // namespace

std::vector<std::string> dynpipe_features() { return slowdown_features(); }

std::unique_ptr<RepartitionPolicy> make_policy(const PolicyOptions& o) {
  STRATA_CHECK(o.threshold >= 0.0 && o.threshold < 1.0)
      << "--repartition-threshold " << o.threshold << " must be in [0, 1) (a relative gain)";
  STRATA_CHECK(o.fallback.empty() || o.fallback == "no-rf")
      << "--slowdown-fallback " << o.fallback << ": valid is no-rf";
  if (o.name == "vpipe") return make_vpipe_policy(o.threshold);
  if (o.name == "dynpipe-no-rf") {
    return std::make_unique<DynpipePolicy>(Kind::kNoRf, o, nullptr, o.name);
  }
  if (o.name == "pipedream-re") {
    return std::make_unique<DynpipePolicy>(Kind::kPipeDreamRe, o, nullptr, o.name);
  }
  if (o.name == "dynpipe") {
    STRATA_CHECK(!o.model_path.empty())
        << "--repartition dynpipe needs --slowdown-model FILE (fit one with strata fit-slowdown "
           "on strata profile --colocation's data), or use --repartition dynpipe-no-rf";
    try {
      auto model =
          std::make_unique<ForestModel>(ForestModel::load(o.model_path, dynpipe_features()));
      return std::make_unique<DynpipePolicy>(Kind::kForest, o, std::move(model), o.name);
    } catch (const Error& e) {
      if (o.fallback != "no-rf") {
        STRATA_THROW() << "--repartition dynpipe: " << e.message()
                       << "; training stops (pass --slowdown-fallback no-rf to go on with the "
                          "last measured slowdowns instead)";
      }
      if (o.log) {
        STRATA_LOG(WARN) << "--repartition dynpipe: " << e.message()
                         << "; falling back to dynpipe-no-rf (--slowdown-fallback no-rf)";
      }
      return std::make_unique<DynpipePolicy>(Kind::kNoRf, o, nullptr, "dynpipe-no-rf (fallback)");
    }
  }
  STRATA_THROW() << "--repartition " << o.name
                 << ": unknown policy (valid: off, vpipe, dynpipe, dynpipe-no-rf, pipedream-re)";
}

}  // namespace strata::parallel::dynpipe

namespace strata::parallel {

std::unique_ptr<RepartitionPolicy> make_repartition_policy(const std::string& name,
                                                           double threshold) {
  dynpipe::PolicyOptions o;
  o.name = name;
  o.threshold = threshold;
  return dynpipe::make_policy(o);
}

}  // namespace strata::parallel
