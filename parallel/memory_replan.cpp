// The memory plan of a new partition, made on rank 0 and shared (see the header).
#include "parallel/memory_replan.h"

#include <algorithm>

#include "engine/check.h"
#include "parallel/checkpointing.h"

namespace strata::parallel {

std::vector<double> layer_overheads(const std::vector<LayerMemoryCost>& layers,
                                    const PipelinePlan& plan, const Partition& partition) {
  std::vector<double> out(layers.size(), 0.0);
  for (size_t s = 0; s < partition.size() && s < plan.stages.size(); ++s) {
    const LayerRange& r = partition[s];
    double swapped = 0.0;
    for (size_t l = r.begin; l < r.end; ++l) {
      if (plan.plan.at(l) == MemoryPolicy::kSwap) swapped += layers.at(l).saved_bytes;
    }
    const double exposed = plan.stages[s].time.exposed_swap_s;
    for (size_t l = r.begin; l < r.end; ++l) {
      const LayerMemoryCost& c = layers.at(l);
      const double compute = c.forward_s + c.backward_s;
      if (!(compute > 0.0)) continue;
      double added = 0.0;
      if (plan.plan.at(l) == MemoryPolicy::kRecompute) added = c.forward_s;
      if (plan.plan.at(l) == MemoryPolicy::kSwap && swapped > 0.0) {
        added = exposed * c.saved_bytes / swapped;
      }
      out[l] = added / compute;
    }
  }
  return out;
}

double slowest_stage_with_overhead(const Partition& partition, const std::vector<double>& base,
                                   const std::vector<double>& overhead) {
  double slowest = 0.0;
  for (const LayerRange& r : partition) {
    double t = 0.0;
    for (size_t l = r.begin; l < r.end; ++l) {
      t += base.at(l) * (1.0 + (l < overhead.size() ? overhead[l] : 0.0));
    }
    slowest = std::max(slowest, t);
  }
  return slowest;
}

std::vector<StageMemoryPlanRecord> memory_plan_records(const MemoryPlan& plan,
                                                       const std::vector<StagePlan>& stages,
                                                       const Partition& partition,
                                                       const std::vector<std::string>& names) {
  std::vector<StageMemoryPlanRecord> out;
  for (size_t s = 0; s < partition.size() && s < stages.size(); ++s) {
    const StagePlan& p = stages[s];
    StageMemoryPlanRecord r;
    r.stage = static_cast<int>(s);
    r.plan = describe_memory_plan(plan, partition[s].begin, partition[s].end, names);
    r.predicted_peak_bytes = p.memory.peak_bytes;
    r.predicted_forward_s = p.time.forward_s;
    r.predicted_backward_s = p.time.backward_s;
    r.predicted_recompute_s = p.time.recompute_s;
    r.predicted_exposed_swap_s = p.time.exposed_swap_s;
    out.push_back(std::move(r));
  }
  return out;
}

PartitionMemory share_memory_plan(Communicator* world, int rank, const MemoryPlanner& planner,
                                  const Partition& to, size_t layers) {
  // Rank 0's message: a status character (F fits, N does not, E the planner failed), one
  // character per layer (its policy), then the refusal or error.
  PartitionMemory mine;
  std::string message;
  if (rank == 0) {
    try {
      STRATA_CHECK(static_cast<bool>(planner))
          << "--memory-policy auto: rank 0 has no memory planner for the new partition";
      mine = planner(to);
      STRATA_CHECK_EQ(mine.plan.layers.size(), layers) << "the memory plan of the new partition";
      message = mine.feasible ? "F" : "N";
      for (size_t l = 0; l < layers; ++l) message += static_cast<char>('0' + int(mine.plan.at(l)));
      message += mine.refusal;
    } catch (const std::exception& e) {
      message = "E" + std::string(layers, '0') + e.what();
    }
  }
  const std::string got = all_gather_strings(world, message).at(0);
  STRATA_CHECK(got.size() >= 1 + layers)
      << "the memory plan from rank 0: " << got.size() << " bytes for " << layers << " layers";
  if (got[0] == 'E') {
    STRATA_THROW() << "planning the memory of the new partition on rank 0: "
                   << got.substr(1 + layers);
  }
  if (rank == 0) return mine;
  PartitionMemory out;
  out.feasible = got[0] == 'F';
  out.plan.layers.resize(layers);
  for (size_t l = 0; l < layers; ++l)
    out.plan.layers[l] = static_cast<MemoryPolicy>(got[1 + l] - '0');
  out.refusal = got.substr(1 + layers);
  return out;
}

}  // namespace strata::parallel
