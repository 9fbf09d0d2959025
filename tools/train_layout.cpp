// strata train's partition and memory plan (see the header).
#include "tools/train_layout.h"

#include <algorithm>
#include <cstdio>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "parallel/partition/projection.h"
#include "parallel/runtime/copy_engine.h"
#include "tools/common.h"
#include "tools/profile_command.h"

namespace strata::tools {

int64_t micro_batch_rows(const TrainOptions& o, const parallel::PipelineConfig& p) {
  return std::max<int64_t>(1, o.batch_size / p.groups / p.micro_batches);
}

TrainLayout::TrainLayout(const TrainOptions& options, std::shared_ptr<const io::Dataset> train,
                         const parallel::PipelineConfig& pipeline, const graph::Model& model)
    : o_(options), train_(std::move(train)), pipeline_(pipeline), model_(model) {
  for (size_t i = 0; i < model.size(); ++i) names_.push_back(model.layer(i).name());
}

std::vector<parallel::LayerCost> layer_costs_for(const TrainOptions& o,
                                                 std::shared_ptr<const io::Dataset> train,
                                                 const parallel::PipelineConfig& pipeline,
                                                 const graph::Model& model) {
  if (!o.profile.empty()) {
    std::vector<parallel::LayerCost> costs = parallel::read_profile_file(o.profile);
    parallel::check_profile_matches(costs, model, o.profile);
    return costs;
  }
  ProfileOptions p;
  p.model = o.model;
  p.size = o.size;
  p.model_spec = o.model_spec;
  p.batch_size = micro_batch_rows(o, pipeline);
  p.steps = 2;
  p.threads = o.threads;
  p.seed = o.seed;
  return parallel::layer_costs(profile_model(p, std::move(train)).profiler->layers());
}

const std::vector<parallel::LayerCost>& TrainLayout::costs() {
  if (!costs_) costs_ = layer_costs_for(o_, train_, pipeline_, model_);
  return *costs_;
}

parallel::Partition TrainLayout::partition() {
  const int S = pipeline_.stages;
  if (S == 1) return {{0, model_.size()}};
  if (o_.partition == "uniform") return parallel::uniform_partition(model_.size(), S);
  if (o_.partition != "auto") return parallel::parse_partition(o_.partition, names_, S);
  parallel::PartitionOptions po;
  po.schedule = pipeline_.schedule;
  po.micro_batches = pipeline_.micro_batches;
  po.micro_batch_size = micro_batch_rows(o_, pipeline_);
  po.bandwidth_bytes_per_second = o_.bandwidth_gbps * 1e9;
  // The partitioner's memory check assumes every layer keeps its tensors; with swap or
  // recompute the memory plan, not the cut, meets --mem-limit.
  po.mem_limit_bytes = o_.mem_limit.empty() || o_.memory_policy != "keep"
                           ? 0.0
                           : static_cast<double>(parse_bytes(o_.mem_limit));
  po.optimizer_slots = o_.optimizer == "sgd" ? 1 : 2;
  if (o_.partitioner == "projection") {
    parallel::ProjectionOptions projection;
    projection.normalize = o_.ampa_normalize == "on";
    projection.threshold = o_.ampa_threshold;
    projection.guard = parallel::parse_ampa_guard(o_.ampa_guard);
    parallel::AmpaResult ampa;
    const parallel::Partition p =
        parallel::projection_partition(costs(), S, po, projection, &ampa).partition;
    note_ = parallel::describe_ampa(ampa) + "; --ampa-normalize " + o_.ampa_normalize +
            ", --ampa-threshold " + format_number(o_.ampa_threshold) + ", --ampa-guard " +
            o_.ampa_guard;
    return p;
  }
  return parallel::balanced_partition(costs(), S, po).partition;
}

parallel::StageSetting TrainLayout::stage_setting() {
  parallel::StageSetting setting;
  setting.schedule = pipeline_.schedule;
  setting.micro_batches = pipeline_.micro_batches;
  setting.optimizer_slots = o_.optimizer == "sgd" ? (o_.momentum > 0 ? 1 : 0) : 2;
  setting.mixed = o_.precision == "bf16" || o_.precision == "fp16";
  setting.prefetch_layers = pipeline_.prefetch_layers;
  setting.weight_cache = pipeline_.weight_cache;
  // The host-device bandwidth of the swap engine, measured here once (the CPU's emulated device:
  // a memory copy; rank 0's device otherwise stands for every rank's).
  if (bandwidth_ <= 0.0) {
    CpuAllocator device_memory, pool;
    // --threads, as training will run: an ExecContext sets this thread's OpenMP thread count,
    // and products summed over another count round differently.
    ExecContext ctx(Device::cpu(), &device_memory, o_.threads);
    bandwidth_ = parallel::measure_copy_bandwidth(ctx, pool);
  }
  setting.bandwidth = bandwidth_;
  return setting;
}

parallel::PartitionMemory TrainLayout::plan_partition(const parallel::Partition& partition) {
  const size_t L = model_.size();
  parallel::PartitionMemory out;
  out.feasible = true;
  out.layer_overhead.assign(L, 0.0);
  if (o_.memory_policy != "auto") {
    const parallel::MemoryPlan base = parallel::MemoryPlan::uniform(
        L, parallel::parse_memory_policy(o_.memory_policy, "--memory-policy"));
    out.plan = parallel::parse_memory_plan(o_.memory_plan, names_, base);
    return out;
  }
  const double limit = o_.mem_limit.empty() ? 0.0 : static_cast<double>(parse_bytes(o_.mem_limit));
  const parallel::StageSetting setting = stage_setting();
  const std::vector<parallel::LayerMemoryCost> layers =
      parallel::layer_memory_costs(costs(), micro_batch_rows(o_, pipeline_));
  parallel::PipelinePlan plan = parallel::plan_pipeline(layers, partition, setting, limit);
  for (size_t s = 0; s < plan.stages.size() && out.feasible; ++s) {
    const parallel::StagePlan& p = plan.stages[s];
    if (p.feasible) continue;
    out.feasible = false;
    out.refusal = "--mem-limit " + o_.mem_limit + " is too small for stage " + std::to_string(s) +
                  " (layers " + names_[partition[s].begin] + ".." + names_[partition[s].end - 1] +
                  "): its smallest plan (every layer swapped, or every layer recomputed) needs " +
                  format_bytes(static_cast<size_t>(p.smallest_peak_bytes)) + " per rank (" +
                  format_bytes(static_cast<size_t>(p.memory.constant_bytes)) +
                  " of it for parameters, gradients and optimizer state)";
  }
  plan.plan = parallel::parse_memory_plan(o_.memory_plan, names_, plan.plan);
  out.plan = plan.plan;
  out.layer_overhead = parallel::layer_overheads(layers, plan, partition);
  out.stages = std::move(plan.stages);
  return out;
}

parallel::MemoryPlan TrainLayout::memory_plan(const parallel::Partition& partition) {
  parallel::PartitionMemory memory = plan_partition(partition);
  if (!memory.feasible) {
    STRATA_THROW() << memory.refusal
                   << "; raise --mem-limit, use more --stages or fewer --micro-batches, or a "
                      "smaller --batch-size";
  }
  if (o_.memory_policy == "auto") {
    parallel::PipelinePlan plan;
    plan.plan = memory.plan;
    plan.stages = std::move(memory.stages);
    auto_plan_ = std::move(plan);
  }
  return memory.plan;
}

void TrainLayout::check_migrations(const std::vector<parallel::Migration>& migrations) {
  if (o_.memory_policy != "auto") return;
  for (const parallel::Migration& m : migrations) {
    parallel::Partition to;
    for (const auto& [b, e] : m.partition) to.push_back({b, e});
    const parallel::PartitionMemory memory = plan_partition(to);
    STRATA_CHECK(memory.feasible)
        << "--migrate-at " << m.step << ":" << parallel::partition_string(to, names_)
        << ": the layers cannot move there: " << memory.refusal
        << " (--memory-policy auto plans the new partition before the move)";
  }
}

std::string describe_memory(const TrainOptions& o, const parallel::PipelineConfig& p,
                            const std::vector<std::string>& names,
                            const std::optional<parallel::PipelinePlan>& auto_plan) {
  const parallel::MemoryPlan& plan = p.memory_plan;
  bool uniform = true;
  for (size_t i = 1; i < names.size(); ++i) uniform = uniform && plan.at(i) == plan.at(0);
  std::string text;
  if (uniform && !auto_plan) {
    text = std::string(parallel::memory_policy_name(plan.at(0))) + " (every layer)";
  } else {
    for (size_t s = 0; s < p.partition.size(); ++s) {
      text +=
          (s ? "; " : "") + std::string("stage ") + std::to_string(s) + ": " +
          parallel::describe_memory_plan(plan, p.partition[s].first, p.partition[s].second, names);
      if (auto_plan && s < auto_plan->stages.size()) {
        text += " (predicted peak " +
                format_bytes(static_cast<size_t>(auto_plan->stages[s].memory.peak_bytes)) + ")";
      }
    }
  }
  if (o.memory_policy == "auto") {
    text += o.mem_limit.empty() ? "; auto without --mem-limit keeps every layer"
                                : "; auto, vPIPE's planner under --mem-limit " + o.mem_limit;
  }
  if (plan.uses(parallel::MemoryPolicy::kSwap, 0, names.size())) {
    text += "; swap pool " + o.swap_pool + " per rank";
  }
  return text;
}

std::string describe_migrations(const std::vector<parallel::Migration>& migrations,
                                const std::vector<std::string>& names, const std::string& mode) {
  std::string text;
  for (const parallel::Migration& m : migrations) {
    parallel::Partition p;
    for (const auto& [b, e] : m.partition) p.push_back({b, e});
    text += (text.empty() ? "" : "; ") + std::string("before step ") + std::to_string(m.step) +
            ": " + parallel::partition_string(p, names);
  }
  return text + " (" + mode + ")";
}

}  // namespace strata::tools
