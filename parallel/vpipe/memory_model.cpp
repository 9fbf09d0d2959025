// vPIPE Eq. 1-2 for one stage under a per-layer plan (see the header for the readings chosen).
#include "parallel/vpipe/memory_model.h"

#include <algorithm>
#include <map>

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

ReceiveBuffers receive_buffers(const StageSetting& s) {
  ReceiveBuffers most;
  if (s.stages == 1) return most;
  // An asynchronous program (async-1f1b, 2bw) runs over the whole training: enough micro-batches
  // for its steady state, whole steps of M.
  const int64_t micro_batches =
      is_synchronous(s.schedule)
          ? s.micro_batches
          : s.micro_batches * ((4 * s.stages + s.micro_batches - 1) / s.micro_batches);
  const Program program = make_schedule(s.schedule, s.stages, micro_batches).programs[s.stage];
  // Where each micro-batch's received tensors are used.
  std::map<int64_t, size_t> forward_at, backward_at;
  for (size_t i = 0; i < program.size(); ++i) {
    if (program[i].op == OpCode::kForward) forward_at[program[i].micro_batch] = i;
    if (program[i].op == OpCode::kBackward) backward_at[program[i].micro_batch] = i;
  }
  // At instruction i the receives among program[0, i + lookahead] are posted; a buffer lives
  // until the instruction that uses it.
  for (size_t i = 0; i < program.size(); ++i) {
    const OpCode op = program[i].op;
    if (op != OpCode::kForward && op != OpCode::kBackward) continue;
    ReceiveBuffers::Held held;
    const size_t posted = std::min(program.size(), i + static_cast<size_t>(s.lookahead) + 1);
    for (size_t j = 0; j < posted; ++j) {
      const Instruction& in = program[j];
      if (in.op == OpCode::kRecvAct && forward_at.at(in.micro_batch) >= i) ++held.activations;
      if (in.op == OpCode::kRecvGrad && backward_at.at(in.micro_batch) >= i) ++held.gradients;
    }
    ReceiveBuffers::Held& at = op == OpCode::kForward ? most.forward : most.backward;
    at.activations = std::max(at.activations, held.activations);
    at.gradients = std::max(at.gradients, held.gradients);
  }
  return most;
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
  // Dependent, per micro-batch; held[j] is what layers 0..j of the stage hold of it.
  std::vector<double> held(n, 0.0);
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
    held[j] = e.dependent_bytes;
  }
  if (setting.paper_model) {
    e.peak_bytes = e.eq1_bytes();
    return e;
  }
  // Beside the records: the last stage keeps each micro-batch's loss gradient from its forward
  // to its backward; the others hold output gradients (and inputs) received ahead.
  const bool last = setting.stage == setting.stages - 1;
  // The first stage holds the step's input batch, all M micro-batches of it, as the loader put
  // it on the device; the last stage each micro-batch's loss gradient from its forward to its
  // backward. The others' receive buffers count with the forward or backward that runs beside
  // them (below).
  e.boundary_bytes =
      (last ? layers.back().output_bytes * static_cast<double>(e.copies) : 0.0) +
      (setting.stage == 0 ? layers.front().input_bytes * static_cast<double>(setting.micro_batches)
                          : 0.0);
  const ReceiveBuffers received = receive_buffers(setting);
  auto receive_bytes = [&](const ReceiveBuffers::Held& held) {
    return layers.front().input_bytes * static_cast<double>(held.activations) +
           layers.back().output_bytes * static_cast<double>(held.gradients);
  };
  const double forward_received = receive_bytes(received.forward);
  const double backward_received = receive_bytes(received.backward);
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
  // The worst moment of the micro-batch that runs, above the copies - 1 others held whole: during
  // the forward of layer j it holds what layers before j keep, during the backward of layer j what
  // layers up to j keep (those after j have run their backward and released theirs) and the
  // gradient of j's output, beside j's own temporaries. The transient is that moment less one
  // whole micro-batch's dependent memory (peak = constant + copies x dependent + boundary +
  // transient).
  const double dependent = e.dependent_bytes;
  double worst = 0.0;
  auto before = [&](size_t j) { return j == 0 ? 0.0 : held[j - 1]; };
  auto incoming = [&](size_t j) { return j + 1 < n ? layers[j].output_bytes : 0.0; };
  // A forward runs while the swap-outs of its micro-batch's earlier layers may still hold their
  // device memory (the runtime lets at most one micro-batch's be on their way out).
  double swapping_out = 0.0;
  for (size_t j = 0; j < n; ++j) {
    worst = std::max(worst, forward_received + before(j) + swapping_out +
                                layers[j].forward_peak_bytes + (gpipe ? 0.0 : first_window));
    if (policy(j) == MemoryPolicy::kSwap) swapping_out += layers[j].saved_bytes;
  }
  // Under 1f1b and async-1f1b each backward follows a forward whose swap-outs start just before
  // it, and the runtime drains them only before the next forward (so that the copies overlap
  // this backward): every backward layer's transient counts one micro-batch's swapped bytes.
  // Under gpipe only the first backward of a step follows a forward, and the M - 1 forwards
  // before it gave the copies their time.
  for (size_t j = 0; j < n; ++j) {
    double extra = backward_received + held[j] + incoming(j) + (gpipe ? 0.0 : swapping_out);
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
          worst = std::max(worst, extra + replayed + layers[i].forward_peak_bytes);
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
    worst = std::max(worst, extra + layers[j].backward_peak_bytes);
  }
  e.transient_bytes = std::max(0.0, worst - dependent);
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
