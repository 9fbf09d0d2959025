#include "tools/train_array_memory.h"

#include <algorithm>

#include "engine/check.h"
#include "graph/optimizer.h"
#include "parallel/arraypipe/array_trainer.h"
#include "parallel/arraypipe/slot_model.h"
#include "parallel/partition/partition.h"
#include "parallel/vpipe/memory_model.h"
#include "tools/common.h"
#include "tools/train_layout.h"

namespace strata::tools {
namespace {

namespace ap = parallel::arraypipe;

std::string bytes(double b) { return format_bytes(static_cast<size_t>(std::max(0.0, b))); }

int64_t aligned(int64_t n) { return (n + 15) / 16 * 16; }  // graph/param_store.h's layout

// One job's block state on layers [begin, end): the store's flat buffers as graph/param_store.h
// lays them out (every entry at a multiple of 16 elements, a tied parameter whose owner is in
// the range once), f32 parameters, gradients, `slots` optimizer states and the statistics, and
// under mixed precision the 16-bit working parameters and gradients. Returns {state, grads}.
std::pair<double, double> stage_state_bytes(const graph::Model& model, size_t begin, size_t end,
                                            int slots, bool mixed) {
  int64_t params = 0, buffers = 0;
  std::vector<std::string> names;
  for (size_t l = begin; l < end; ++l) {
    const graph::Layer& layer = model.layer(l);
    for (const graph::ParamSpec& p : layer.param_specs()) {
      names.push_back(layer.name() + "." + p.name);
      const bool alias =
          !p.tied_to.empty() && std::find(names.begin(), names.end(), p.tied_to) != names.end();
      if (!alias) params += aligned(shape_numel(p.shape));
    }
    for (const graph::ParamSpec& b : layer.buffer_specs()) buffers += aligned(shape_numel(b.shape));
  }
  const double grads = 4.0 * static_cast<double>(params);
  double state = 4.0 * static_cast<double>(params * (2 + slots) + buffers);
  if (mixed) state += 2.0 * 2.0 * static_cast<double>(params);
  return {state, grads};
}

}  // namespace

int parse_array_slots(const TrainOptions& o) {
  if (o.array_slots == "auto") {
    STRATA_CHECK(!o.mem_limit.empty())
        << "--array-slots auto needs --mem-limit (the device memory per rank the slots must fit)";
    return 0;
  }
  int k = 0;
  size_t used = 0;
  try {
    k = std::stoi(o.array_slots, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  STRATA_CHECK(used > 0 && used == o.array_slots.size())
      << "--array-slots must be a number of slots >= 1 or auto, got '" << o.array_slots << "'";
  STRATA_CHECK(k >= 1) << "--array-slots must be >= 1 (block-state slots per stage), got " << k;
  return k;
}

ArraySlots array_slots(const TrainOptions& o, std::shared_ptr<const io::Dataset> train,
                       const graph::Model& model, const parallel::PipelineConfig& pipeline,
                       const std::vector<parallel::TrainConfig>& configs) {
  ArraySlots out;
  if (o.array_slots.empty()) return out;
  const int J = static_cast<int>(configs.size());
  const int k = parse_array_slots(o);
  if (k > 0) {
    out.slots = k;
    out.line = "array memory: --array-slots " + std::to_string(k) + " of " + std::to_string(J) +
               " jobs" +
               (k >= J ? " (every job resident: nothing moves)"
                       : ", the other jobs' states in the host pool, prefetched in the task "
                         "graph's order");
    return out;
  }
  const double limit = static_cast<double>(parse_bytes(o.mem_limit));
  const std::vector<parallel::LayerCost> costs = layer_costs_for(o, train, pipeline, model);
  const bool keep_grads = ap::splits_tied_parameter(model, pipeline);
  const int S = pipeline.stages;
  std::vector<ap::SlotModelStage> stages(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    const auto [first, end] = pipeline.partition[static_cast<size_t>(s)];
    ap::SlotModelStage& st = stages[static_cast<size_t>(s)];
    for (const parallel::TrainConfig& c : configs) {
      parallel::StageSetting setting;
      setting.stage = s;
      setting.stages = S;
      setting.schedule = parallel::ScheduleKind::kGPipe;  // each job's blocks are its gpipe step
      setting.micro_batches = pipeline.micro_batches;
      setting.optimizer_slots = static_cast<int>(graph::optimizer_slot_names(c.optimizer).size());
      setting.mixed = c.compute_dtype != DType::kF32;
      setting.prefetch_layers = pipeline.prefetch_layers;
      const std::vector<parallel::LayerMemoryCost> all =
          parallel::layer_memory_costs(costs, c.batch_size / pipeline.micro_batches);
      const std::vector<parallel::LayerMemoryCost> layers(
          all.begin() + static_cast<std::ptrdiff_t>(first),
          all.begin() + static_cast<std::ptrdiff_t>(end));
      const parallel::StageMemoryEstimate e =
          parallel::estimate_stage_memory(layers, first, pipeline.memory_plan, setting);
      const auto [state, grads] =
          stage_state_bytes(model, first, end, setting.optimizer_slots, setting.mixed);
      st.state_bytes = std::max(st.state_bytes, state);
      st.grads_bytes = std::max(st.grads_bytes, grads);
      st.held_bytes.push_back(static_cast<double>(e.copies) * e.dependent_bytes + e.boundary_bytes);
      st.transient_bytes.push_back(e.transient_bytes);
    }
  }
  const ap::SlotChoice choice = ap::choose_slots(stages, limit, keep_grads);
  const ap::SlotModelStage& worst = stages[static_cast<size_t>(choice.worst_stage)];
  const double held = *std::max_element(worst.held_bytes.begin(), worst.held_bytes.end());
  const double transient =
      *std::max_element(worst.transient_bytes.begin(), worst.transient_bytes.end());
  const std::string inputs =
      "state " + bytes(worst.state_bytes) +
      " per job (parameters, gradients, optimizer state, statistics), forward blocks "
      "held up to " +
      bytes(held) + " per job, transient " + bytes(transient) +
      (keep_grads ? ", every job's gradients resident (a tied parameter "
                    "split between stages)"
                  : "");
  if (choice.slots == 0) {
    STRATA_THROW() << "--mem-limit " << o.mem_limit << " is too small for one job of the array: "
                   << "stage " << choice.worst_stage << " needs "
                   << bytes(choice.peak_bytes[static_cast<size_t>(choice.worst_stage)])
                   << " with one slot (" << inputs << ", " << J
                   << " jobs' forward blocks held at once); raise --mem-limit, use more "
                   << "--stages, smaller batch sizes or fewer jobs";
  }
  out.slots = choice.slots;
  const int more = ap::largest_array(worst, choice.slots, limit, keep_grads);
  out.line = "array memory: --array-slots auto under --mem-limit " + o.mem_limit + ": " +
             std::to_string(choice.slots) + " of " + std::to_string(J) + " slots (modelled peak " +
             bytes(choice.peak_bytes[static_cast<size_t>(choice.worst_stage)]) + " on stage " +
             std::to_string(choice.worst_stage) + "; " + inputs + "); up to " +
             std::to_string(more) + " such jobs would fit with " + std::to_string(choice.slots) +
             " slots";
  return out;
}

}  // namespace strata::tools
