// vPIPE Eq. 1-2 for one stage under a per-layer plan (see the header for the readings chosen).
#include "parallel/vpipe/memory_model.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::parallel {

std::vector<LayerMemoryCost> layer_memory_costs(const std::vector<LayerCost>& costs, int64_t rows) {
  STRATA_CHECK_GT(rows, 0) << "layer_memory_costs: rows per micro-batch";
  const double b = static_cast<double>(rows);
  std::vector<LayerMemoryCost> out;
  for (const LayerCost& c : costs) {
    LayerMemoryCost m;
    m.name = c.name;
    m.forward_s = c.forward_ms * b / 1e3;
    m.backward_s = c.backward_ms * b / 1e3;
    m.saved_bytes = c.saved_bytes * b;
    m.shared_bytes = std::min(c.shared_bytes, c.saved_bytes) * b;
    m.input_bytes = c.input_bytes * b;
    m.output_bytes = c.output_bytes * b;
    m.forward_peak_bytes = c.forward_peak_bytes * b;
    m.backward_peak_bytes = c.backward_peak_bytes * b;
    m.param_bytes = c.param_bytes;
    out.push_back(m);
  }
  return out;
}

int64_t dependent_copies(const StageSetting& s) {
  STRATA_CHECK(s.stages >= 1 && s.stage >= 0 && s.stage < s.stages && s.micro_batches >= 1)
      << "stage setting: stage " << s.stage << " of " << s.stages << ", " << s.micro_batches
      << " micro-batches";
  if (s.schedule == ScheduleKind::kGPipe) return s.micro_batches;
  return std::min<int64_t>(s.stages - s.stage, s.micro_batches);
}

StageMemoryEstimate estimate_stage_memory(const std::vector<LayerMemoryCost>& layers, size_t first,
                                          const MemoryPlan& plan, const StageSetting& setting) {
  STRATA_CHECK(!layers.empty()) << "estimate_stage_memory: a stage without layers";
  StageMemoryEstimate e;
  e.copies = dependent_copies(setting);
  const size_t n = layers.size();
  auto policy = [&](size_t j) { return plan.at(first + j); };
  auto keeps = [&](size_t j) { return policy(j) == MemoryPolicy::kKeep; };
  // Constant: parameters, gradients, optimizer state; mixed precision's 16-bit working copies of
  // parameters and gradients; async-1f1b's and 2bw's stashed versions of the stage's parameters.
  double params = 0.0;
  for (const LayerMemoryCost& l : layers) params += l.param_bytes;
  e.constant_bytes = params * (2.0 + setting.optimizer_slots) + (setting.mixed ? params : 0.0);
  const int64_t stashed = stashed_weight_versions(setting.schedule, setting.stages, setting.stage,
                                                  setting.micro_batches);
  if (stashed > 0 && setting.weight_cache) {
    e.constant_bytes += params;  // the one cached version
  } else {
    e.constant_bytes += params * static_cast<double>(stashed);
    // The runtime's forward or backward on a stashed version also keeps a copy of the current
    // weights.
    if (stashed > 0 && !setting.paper_model) e.constant_bytes += params;
  }
  // Dependent, per micro-batch.
  for (size_t j = 0; j < n; ++j) {
    const LayerMemoryCost& l = layers[j];
    const double own = l.saved_bytes - l.shared_bytes;
    if (keeps(j)) e.dependent_bytes += own;
    const bool previous_keeps = j > 0 && keeps(j - 1);
    if (keeps(j) || previous_keeps) e.dependent_bytes += l.shared_bytes;
    const bool segment_start = policy(j) == MemoryPolicy::kRecompute &&
                               (j == 0 || policy(j - 1) != MemoryPolicy::kRecompute);
    if (segment_start && !setting.paper_model) {
      // The segment's inputs, less what the layer before keeps of them.
      e.dependent_bytes += std::max(0.0, l.input_bytes - (previous_keeps ? l.shared_bytes : 0.0));
    }
  }
  if (setting.paper_model) {
    e.peak_bytes = e.eq1_bytes();
    return e;
  }
  // Beside the records: the last stage keeps each micro-batch's loss gradient from its forward
  // to its backward; the others hold output gradients (and inputs) received ahead.
  const bool last = setting.stage == setting.stages - 1;
  e.boundary_bytes = layers.back().output_bytes * (last ? static_cast<double>(e.copies) : 2.0) +
                     (setting.stage > 0 ? layers.front().input_bytes : 0.0);
  // The first swapped layers a backward needs (the last ones of the stage), which SwapIn brings
  // in ahead of it: under gpipe the next micro-batch's, during this one's backward; under 1f1b
  // a micro-batch's, during the forward that precedes its backward.
  double first_window = 0.0;
  {
    int more = setting.prefetch_layers;
    for (size_t i = n; i-- > 0 && more > 0;) {
      if (policy(i) != MemoryPolicy::kSwap) continue;
      first_window += layers[i].saved_bytes;
      --more;
    }
  }
  const bool gpipe = setting.schedule == ScheduleKind::kGPipe;
  // The worst transient of one layer. A forward runs while the swap-outs of its micro-batch's
  // earlier layers may still hold their device memory (the runtime lets at most one micro-batch's
  // be on their way out).
  double swapping_out = 0.0;
  for (size_t j = 0; j < n; ++j) {
    e.transient_bytes = std::max(e.transient_bytes, swapping_out + layers[j].forward_peak_bytes +
                                                        (gpipe ? 0.0 : first_window));
    if (policy(j) == MemoryPolicy::kSwap) swapping_out += layers[j].saved_bytes;
  }
  // Under 1f1b and async-1f1b each backward follows a forward whose swap-outs start just before
  // it, and the runtime drains them only before the next forward (so that the copies overlap
  // this backward): every backward layer's transient counts one micro-batch's swapped bytes.
  // Under gpipe only the first backward of a step follows a forward, and the M - 1 forwards
  // before it gave the copies their time.
  for (size_t j = 0; j < n; ++j) {
    double extra = gpipe ? 0.0 : swapping_out;
    if (policy(j) == MemoryPolicy::kRecompute) {
      // The backward of a segment's last layer replays the whole segment; each layer's backward
      // then runs with the tapes of the segment's layers before it and its own (those after it
      // are released), and the replay's forward of layer i with the tapes of a..i-1 beside
      // layer i's forward temporaries.
      size_t a = j;
      while (a > 0 && policy(a - 1) == MemoryPolicy::kRecompute) --a;
      const bool last_of_segment = j + 1 == n || policy(j + 1) != MemoryPolicy::kRecompute;
      double replayed = 0.0;
      for (size_t i = a; i <= j; ++i) {
        if (last_of_segment) {
          e.transient_bytes =
              std::max(e.transient_bytes, extra + replayed + layers[i].forward_peak_bytes);
        }
        replayed += layers[i].saved_bytes;
      }
      extra += replayed;
    } else if (policy(j) == MemoryPolicy::kSwap) {
      // This layer back, the next swapped layers on their way in, and under gpipe the next
      // micro-batch's first ones.
      extra += layers[j].saved_bytes + (gpipe ? first_window : 0.0);
      int more = setting.prefetch_layers;
      for (size_t i = j; i-- > 0 && more > 0;) {
        if (policy(i) != MemoryPolicy::kSwap) continue;
        extra += layers[i].saved_bytes;
        --more;
      }
    }
    e.transient_bytes = std::max(e.transient_bytes, extra + layers[j].backward_peak_bytes);
  }
  e.peak_bytes = e.constant_bytes + static_cast<double>(e.copies) * e.dependent_bytes +
                 e.boundary_bytes + e.transient_bytes;
  return e;
}

StageTimeEstimate estimate_stage_time(const std::vector<LayerMemoryCost>& layers, size_t first,
                                      const MemoryPlan& plan, const StageSetting& setting) {
  STRATA_CHECK_GT(setting.bandwidth, 0.0) << "estimate_stage_time: bandwidth";
  StageTimeEstimate t;
  double backward = 0.0, swapped = 0.0;
  for (size_t j = 0; j < layers.size(); ++j) {
    const LayerMemoryCost& l = layers[j];
    const MemoryPolicy p = plan.at(first + j);
    t.forward_s += l.forward_s;
    backward += l.backward_s;
    if (p == MemoryPolicy::kRecompute) t.recompute_s += l.forward_s;  // vPIPE Eq. 2: R_i f_i
    if (p == MemoryPolicy::kSwap) swapped += l.saved_bytes;
  }
  backward += t.recompute_s;
  t.swap_bytes = 2.0 * swapped;  // out and back in
  const double window = t.forward_s + backward;
  t.exposed_swap_s = std::max(0.0, t.swap_bytes / setting.bandwidth - window);  // Eq. 2
  t.backward_s = backward + t.exposed_swap_s;
  return t;
}

}  // namespace strata::parallel
