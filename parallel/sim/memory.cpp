// Stage memory (see memory.h). The tape of a micro-batch is built as a list of storages, each
// owned by the layer that keeps it; a layer's policy decides where its storages live.
#include "parallel/sim/memory.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::parallel::sim {

double stage_param_bytes(const std::vector<LayerModel>& layers, LayerRange range) {
  double bytes = 0.0;
  for (size_t l = range.begin; l < range.end; ++l) {
    const LayerWork& w = layers[l].work;
    bytes += w.param_bytes;
    const bool owner_here = w.tied_owner >= static_cast<int64_t>(range.begin) &&
                            w.tied_owner < static_cast<int64_t>(range.end);
    if (owner_here) bytes -= w.tied_bytes;  // an alias of the owner's storage
  }
  return bytes;
}

StageStatic stage_static(const std::vector<LayerModel>& layers, LayerRange range,
                         const StaticOptions& o) {
  StageStatic m;
  const double p = stage_param_bytes(layers, range);
  m.params = p;
  m.grads = p;
  m.optimizer = o.optimizer_slots * p;
  m.working = o.mixed_precision ? p : 0.0;  // 2 bytes weight + 2 bytes gradient per f32 param
  m.stash = static_cast<double>(o.stashed_versions) * p;
  m.delayed = o.data_parallel && o.dp_delay > 0 ? (o.dp_delay + 1) * p : 0.0;
  return m;
}

MicroBatchMemory micro_batch_memory(const std::vector<LayerModel>& layers, LayerRange range,
                                    const std::vector<MemoryPolicy>& policy, double rows,
                                    bool last_stage) {
  STRATA_CHECK(range.begin < range.end && range.end <= layers.size())
      << "micro_batch_memory: layers [" << range.begin << ", " << range.end << ") of "
      << layers.size();
  STRATA_CHECK(policy.empty() || policy.size() == layers.size())
      << "micro_batch_memory: " << policy.size() << " policies for " << layers.size() << " layers";
  auto policy_of = [&](size_t l) { return policy.empty() ? MemoryPolicy::kKeep : policy[l]; };
  const size_t lo = range.begin, hi = range.end;
  // Storage bytes kept per owner layer; `checkpoint[l]`: the input of layer l must stay.
  std::vector<double> owned(hi - lo, 0.0);
  // held_input[l]: the bytes of layer l's input are already kept by some owner (l's or l-1's).
  std::vector<bool> input_kept(hi - lo + 1, false);
  MicroBatchMemory m;
  for (size_t l = lo; l < hi; ++l) {
    const LayerWork& w = layers[l].work;
    owned[l - lo] += w.own_saved.at(rows);
    if (l == lo && w.saves_input) {
      owned[0] += w.input_bytes * rows;
      input_kept[0] = true;
    }
    const bool next_keeps = l + 1 < hi && layers[l + 1].work.saves_input;
    if (w.saves_output) {
      owned[l - lo] += w.output_bytes * rows;
    } else if (next_keeps) {
      owned[l + 1 - lo] += w.output_bytes * rows;
    }
    input_kept[l + 1 - lo] = w.saves_output || next_keeps;
  }
  // Transients. Forward of layer l: the tapes of the layers before it, its input (unless a tape
  // or the received buffer already holds it), its output and its kernels' temporaries. Backward
  // of layer l: the tapes of the layers after it are gone; its output gradient (unless it is the
  // received gradient or the loss gradient), its input gradient and its temporaries.
  double kept_before = 0.0, kept_total = 0.0;
  for (size_t l = lo; l < hi; ++l) kept_total += owned[l - lo];
  for (size_t l = lo; l < hi; ++l) {
    const LayerWork& w = layers[l].work;
    const double input = l > lo && !input_kept[l - lo] ? w.input_bytes * rows : 0.0;
    m.forward_workspace =
        std::max(m.forward_workspace,
                 kept_before + input + w.output_bytes * rows + w.forward_workspace.at(rows));
    kept_before += owned[l - lo];
  }
  double kept_after = 0.0;
  for (size_t l = hi; l-- > lo;) {
    const LayerWork& w = layers[l].work;
    const double grad_out = l + 1 < hi ? w.output_bytes * rows : 0.0;
    m.backward_workspace =
        std::max(m.backward_workspace,
                 grad_out + w.input_bytes * rows + w.backward_workspace.at(rows) - kept_after);
    kept_after += owned[l - lo];
  }
  for (size_t l = lo; l < hi; ++l) {
    switch (policy_of(l)) {
      case MemoryPolicy::kKeep:
        m.keep += owned[l - lo];
        break;
      case MemoryPolicy::kSwap:
        m.swap += owned[l - lo];
        break;
      case MemoryPolicy::kRecompute:
        m.recompute += owned[l - lo];
        m.recompute_seconds += layers[l].forward_s.at(rows);
        break;
    }
  }
  // Runs of recomputed layers: their input stays (unless a kept or swapped storage holds it),
  // and their tape is rebuilt for one micro-batch during the backward.
  for (size_t a = lo; a < hi;) {
    if (policy_of(a) != MemoryPolicy::kRecompute) {
      ++a;
      continue;
    }
    size_t c = a;
    double run = 0.0;
    while (c < hi && policy_of(c) == MemoryPolicy::kRecompute) run += owned[c++ - lo];
    const bool held_elsewhere = input_kept[a - lo] && a > lo &&
                                policy_of(a - 1) != MemoryPolicy::kRecompute &&
                                layers[a - 1].work.saves_output;
    if (!held_elsewhere) m.keep += layers[a].work.input_bytes * rows;
    m.recompute_peak = std::max(m.recompute_peak, run);
    a = c;
  }
  m.input = layers[lo].work.input_bytes * rows;
  m.output = layers[hi - 1].work.output_bytes * rows;
  m.send_output = layers[hi - 1].work.saves_output ? 0.0 : m.output;
  if (last_stage) m.loss_grad = m.output;
  return m;
}

}  // namespace strata::parallel::sim
