// vPIPE Algorithm 2 (see the header for the readings chosen).
#include "parallel/vpipe/swap_recompute_planner.h"

#include <algorithm>
#include <numeric>

#include "engine/check.h"

namespace strata::parallel {
namespace {

struct Candidate {
  size_t layer = 0;  // within the stage
  MemoryPolicy op = MemoryPolicy::kSwap;
  double gain = 0.0;
  double bytes = 0.0;
};

StagePlan evaluate(const std::vector<LayerMemoryCost>& layers, size_t first, const MemoryPlan& plan,
                   const StageSetting& setting, double limit) {
  StagePlan p;
  p.plan = plan;
  p.memory = estimate_stage_memory(layers, first, plan, setting);
  p.time = estimate_stage_time(layers, first, plan, setting);
  p.feasible = limit <= 0.0 || p.memory.peak_bytes <= limit;
  return p;
}

}  // namespace

StagePlan plan_stage(const std::vector<LayerMemoryCost>& layers, size_t first, size_t model_layers,
                     const StageSetting& setting, double limit) {
  STRATA_CHECK(!layers.empty() && first + layers.size() <= model_layers)
      << "plan_stage: layers " << first << ".." << first + layers.size() << " of " << model_layers;
  STRATA_CHECK_GT(setting.bandwidth, 0.0) << "plan_stage: bandwidth";
  MemoryPlan plan = MemoryPlan::uniform(model_layers, MemoryPolicy::kKeep);
  StagePlan current = evaluate(layers, first, plan, setting, limit);
  if (current.feasible) return current;

  // Steps 1-2: each layer's cheaper op and its gain.
  std::vector<Candidate> order;
  for (size_t j = 0; j < layers.size(); ++j) {
    const LayerMemoryCost& l = layers[j];
    if (l.saved_bytes <= 0.0) continue;
    Candidate c;
    c.layer = j;
    c.bytes = l.saved_bytes;
    const double transfer = l.saved_bytes / setting.bandwidth;
    c.op = transfer > l.forward_s ? MemoryPolicy::kRecompute : MemoryPolicy::kSwap;
    const double cost = c.op == MemoryPolicy::kRecompute ? l.forward_s : transfer;
    c.gain = cost > 0.0 ? l.saved_bytes / cost : l.saved_bytes * 1e30;
    order.push_back(c);
  }
  std::stable_sort(order.begin(), order.end(), [](const Candidate& a, const Candidate& b) {
    if (a.gain != b.gain) return a.gain > b.gain;
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.layer < b.layer;
  });
  // Step 3: the PCIe budget of one micro-batch's window.
  const StageTimeEstimate keep_time = current.time;
  double space = setting.bandwidth * (keep_time.forward_s + keep_time.backward_s);
  std::vector<bool> taken(order.size(), false);
  // Step 5: swaps hidden in the window, while the stage is over its limit.
  for (size_t c = 0; c < order.size() && !current.feasible; ++c) {
    if (order[c].op != MemoryPolicy::kSwap || 2.0 * order[c].bytes > space) continue;
    space -= 2.0 * order[c].bytes;
    plan.layers[first + order[c].layer] = MemoryPolicy::kSwap;
    taken[c] = true;
    current = evaluate(layers, first, plan, setting, limit);
  }
  // Step 6: the cheaper op of the next layers, until the stage fits.
  for (size_t c = 0; c < order.size() && !current.feasible; ++c) {
    if (taken[c]) continue;
    plan.layers[first + order[c].layer] = order[c].op;
    taken[c] = true;
    current = evaluate(layers, first, plan, setting, limit);
  }
  if (current.feasible) return current;
  // Fallbacks: every layer swapped, every layer recomputed; the faster fitting one.
  double smallest = current.memory.peak_bytes;
  StagePlan best = current;
  bool found = false;
  for (MemoryPolicy all : {MemoryPolicy::kSwap, MemoryPolicy::kRecompute}) {
    MemoryPlan uniform = MemoryPlan::uniform(model_layers, MemoryPolicy::kKeep);
    for (size_t j = 0; j < layers.size(); ++j) uniform.layers[first + j] = all;
    StagePlan candidate = evaluate(layers, first, uniform, setting, limit);
    smallest = std::min(smallest, candidate.memory.peak_bytes);
    if (candidate.feasible && (!found || candidate.time.step_s(setting.micro_batches) <
                                             best.time.step_s(setting.micro_batches))) {
      best = candidate;
      found = true;
    }
  }
  best.smallest_peak_bytes = smallest;
  if (!found) best.feasible = false;
  return best;
}

PipelinePlan plan_pipeline(const std::vector<LayerMemoryCost>& layers, const Partition& partition,
                           const StageSetting& base, double limit) {
  PipelinePlan out;
  out.plan = MemoryPlan::uniform(layers.size(), MemoryPolicy::kKeep);
  for (size_t s = 0; s < partition.size(); ++s) {
    StageSetting setting = base;
    setting.stage = static_cast<int>(s);
    setting.stages = static_cast<int>(partition.size());
    const LayerRange& r = partition[s];
    STRATA_CHECK(r.begin < r.end && r.end <= layers.size())
        << "plan_pipeline: stage " << s << " has layers [" << r.begin << ", " << r.end << ")";
    const std::vector<LayerMemoryCost> stage(layers.begin() + static_cast<std::ptrdiff_t>(r.begin),
                                             layers.begin() + static_cast<std::ptrdiff_t>(r.end));
    StagePlan p = plan_stage(stage, r.begin, layers.size(), setting, limit);
    for (size_t i = r.begin; i < r.end; ++i) out.plan.layers[i] = p.plan.at(i);
    out.feasible = out.feasible && p.feasible;
    out.stages.push_back(std::move(p));
  }
  return out;
}

}  // namespace strata::parallel
