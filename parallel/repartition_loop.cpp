#include "parallel/repartition_loop.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/check.h"
#include "engine/log.h"
#include "parallel/dynpipe/policy.h"

namespace strata::parallel {

RepartitionLoop::RepartitionLoop(const RepartitionConfig& config, std::vector<std::string> names,
                                 int rank, int stage, int stages, int groups, int64_t total_steps)
    : config_(config),
      names_(std::move(names)),
      rank_(rank),
      stage_(stage),
      stages_(stages),
      groups_(groups),
      total_(total_steps) {
  if (config.policy == "off") return;
  STRATA_CHECK_GE(config.every, 2) << "--repartition-every must be at least 2 steps";
  dynpipe::PolicyOptions o;
  o.name = config.policy;
  o.threshold = config.threshold;
  o.model_path = config.slowdown_model;
  o.fallback = config.slowdown_fallback;
  o.top_k = static_cast<size_t>(std::max<int64_t>(0, config.top_k));
  o.log = rank == 0;
  policy_ = dynpipe::make_policy(o);
  layer_start_.assign(names_.size(), 0.0);
}

int64_t RepartitionConfig::resolve_every(const RepartitionConfig& config, int64_t steps_per_epoch) {
  if (config.every != 0) return config.every;
  return config.policy == "pipedream-re" ? steps_per_epoch : 20;
}

void RepartitionLoop::describe(const graph::Model& model, int world, double samples_per_step,
                               MemoryPlanner memory) {
  if (rank_ == 0) memory_ = std::move(memory);
  layer_params_.assign(names_.size(), 0.0);
  for (size_t l = 0; l < names_.size() && l < model.size(); ++l) {
    for (const graph::ParamSpec& p : model.layer(l).param_specs()) {
      layer_params_[l] += static_cast<double>(shape_numel(p.shape)) * sizeof(float);
    }
  }
  samples_per_step_ = samples_per_step;
  if (config_.monitor_interval_ms > 0) {
    monitor_ = std::make_unique<dynpipe::StageMonitor>(config_.monitor_interval_ms, rank_, stage_,
                                                       rank_ / std::max(1, stages_), world);
  }
}

bool RepartitionLoop::decides_after(int64_t step) const {
  return active() && stages_ > 1 && (step + 1) % config_.every == 0 && step + 2 < total_;
}

std::vector<double> RepartitionLoop::contribution(int64_t step, const StageMemoryStats& memory,
                                                  double busy_seconds, const Ranges&) {
  if (!active()) return {};
  if (!seen_first_) {
    seen_first_ = true;
    // The run's first step (allocations, first touches of the weights) is left out of the
    // first window: its layer times start after it.
    for (size_t i = 0; i < memory.layer_forward_seconds.size(); ++i) {
      layer_start_[memory.first_layer + i] =
          memory.layer_forward_seconds[i] + memory.layer_backward_seconds[i];
    }
    if (!decides_after(step)) return {};
  }
  ++window_steps_;
  window_busy_ += busy_seconds;
  std::vector<double> out;
  if (decides_after(step)) {
    const size_t L = names_.size();
    out.assign(3 * L + static_cast<size_t>(stages_) + 1, 0.0);
    const size_t bytes = L + static_cast<size_t>(stages_) + 1;
    for (size_t i = 0; i < memory.layer_forward_seconds.size(); ++i) {
      const size_t l = memory.first_layer + i;
      const double now = memory.layer_forward_seconds[i] + memory.layer_backward_seconds[i];
      out[l] = now - layer_start_[l];
      layer_start_[l] = now;
      // The layers' bytes per sample (DynPipe's layer features), from one group.
      if (rank_ < stages_ && i < memory.layer_output_bytes.size()) {
        out[bytes + l] = memory.layer_output_bytes[i];
        out[bytes + L + l] = memory.layer_activation_bytes[i];
      }
    }
    out[L + static_cast<size_t>(stage_)] = window_busy_;
    // The window's length, counted once (by rank 0): every rank's is the same.
    out[L + static_cast<size_t>(stages_)] = rank_ == 0 ? static_cast<double>(window_steps_) : 0.0;
    window_steps_ = 0;
    window_busy_ = 0.0;
  } else if (step > 0 && decides_after(step - 1)) {
    // The decision of the last step, from rank 0: a flag and the S - 1 cuts.
    out.assign(static_cast<size_t>(stages_), 0.0);
    if (rank_ == 0 && pending_ && pending_->apply) {
      out[0] = 1.0;
      for (int s = 1; s < stages_; ++s) {
        out[static_cast<size_t>(s)] = static_cast<double>(pending_->partition[s].begin);
      }
    }
    pending_.reset();
  }
  return out;
}

std::optional<RepartitionRecord> RepartitionLoop::absorb(int64_t step,
                                                         const std::vector<double>& sum,
                                                         const Ranges& ranges) {
  Partition current;
  for (const auto& [b, e] : ranges) current.push_back({b, e});
  if (!active()) return std::nullopt;
  const size_t L = names_.size();
  if (decides_after(step)) {
    STRATA_CHECK_EQ(sum.size(), 3 * L + static_cast<size_t>(stages_) + 1)
        << "repartition statistics";
    if (rank_ != 0) return std::nullopt;
    RepartitionInput in;
    in.step = step + 1;
    in.window_steps = std::llround(sum[L + static_cast<size_t>(stages_)]);
    in.partition = current;
    const double per = 1.0 / (static_cast<double>(groups_) * std::max<int64_t>(1, in.window_steps));
    for (size_t l = 0; l < L; ++l) in.layer_seconds.push_back(sum[l] * per);
    for (int s = 0; s < stages_; ++s) {
      in.stage_busy_seconds.push_back(sum[L + static_cast<size_t>(s)] * per);
    }
    const size_t bytes = L + static_cast<size_t>(stages_) + 1;
    in.layer_output_bytes.assign(sum.begin() + bytes, sum.begin() + bytes + L);
    in.layer_activation_bytes.assign(sum.begin() + bytes + L, sum.begin() + bytes + 2 * L);
    in.layer_param_bytes = layer_params_;
    in.samples_per_step = samples_per_step_;
    if (monitor_) in.stage_counters = stage_counters();
    in.memory = memory_;
    RepartitionRecord r;
    r.step = step + 1;
    r.policy = policy_->name();
    r.current = partition_string(current, names_);
    r.layer_seconds = in.layer_seconds;
    r.stage_busy_seconds = in.stage_busy_seconds;
    if (due_partition_) {
      // A decided move has not gone yet (an asynchronous run drains for it later): this window
      // measured the layout it leaves.
      r.decision.partition = current;
      r.decision.reason = due_step_ > step
                              ? "the move decided before goes before step " +
                                    std::to_string(due_step_) + ": no decision until it has"
                              : "the move decided before step " + std::to_string(due_step_) +
                                    " is still switching stages (live): no decision until it has";
    } else if (in.window_steps * 2 < config_.every) {
      // The window began at a migration: too short to judge the new layout.
      r.decision.partition = current;
      r.decision.reason = "window of " + std::to_string(in.window_steps) +
                          " steps since the last migration is too short";
    } else {
      r.decision = policy_->propose(in);
      check_measured(in, current, &r);
      check_memory(&r.decision);
      for (DroppedPartition& p : r.decision.infeasible) {
        p.name = partition_string(p.partition, names_);
      }
    }
    r.proposed = partition_string(r.decision.partition, names_);
    pending_apply_ = -1;
    if (r.decision.apply) {
      pending_apply_ =
          apply_step_ ? apply_step_(step + 2, current, r.decision.partition) : step + 2;
      if (pending_apply_ < 0) {
        r.decision.apply = false;
        last_move_.reset();
        r.decision.reason +=
            "; but the asynchronous pipeline has no step left before the end of its run where "
            "it can drain for the move: kept";
      }
    }
    if (r.decision.apply) r.apply_step = pending_apply_;
    pending_ = r.decision;
    return r;
  }
  if (step > 0 && decides_after(step - 1)) {
    STRATA_CHECK_EQ(sum.size(), static_cast<size_t>(stages_)) << "repartition decision";
    if (sum[0] > 0.5) {
      Ranges p;
      Partition to;
      size_t begin = 0;
      for (int s = 1; s <= stages_; ++s) {
        const size_t end = s < stages_ ? static_cast<size_t>(std::llround(sum[s])) : L;
        p.push_back({begin, end});
        to.push_back({begin, end});
        begin = end;
      }
      // Every rank asks the apply-step function as rank 0 did when it decided (deterministic).
      due_step_ = apply_step_ ? apply_step_(step + 1, current, to) : step + 1;
      STRATA_CHECK(due_step_ > step &&
                   (rank_ != 0 || pending_apply_ < 0 || due_step_ == pending_apply_))
          << "--repartition: the move decided after step " << step << " goes before step "
          << due_step_ << " here, before step " << pending_apply_ << " in rank 0's record";
      learned_at_ = step;
      due_partition_ = p;
    }
  }
  return std::nullopt;
}

void RepartitionLoop::check_measured(const RepartitionInput& in, const Partition& current,
                                     RepartitionRecord* r) {
  double measured = 0.0;
  for (double b : in.stage_busy_seconds) measured = std::max(measured, b);
  RepartitionDecision& d = r->decision;
  const std::string now = r->current;
  const double margin = config_.threshold;
  if (last_move_ && now == last_move_->to && measured > last_move_->measured * (1.0 + margin)) {
    // The policy's last move made the slowest stage slower, beyond the noise margin: back.
    rejected_[now] = Rejection{partition_string(last_move_->from, names_), last_move_->measured};
    std::ostringstream why;
    why << "measured slowest stage " << 1000 * measured << " ms/step after the move from "
        << partition_string(last_move_->from, names_) << ", " << 1000 * last_move_->measured
        << " before it (more than " << 100 * margin << "% slower): moving back";
    d.apply = true;
    d.partition = last_move_->from;
    d.reason = why.str();
    last_move_.reset();
    return;
  }
  last_move_.reset();
  if (!d.apply) return;
  const std::string proposed = partition_string(d.partition, names_);
  auto rejected = rejected_.find(proposed);
  if (rejected != rejected_.end()) {
    const Rejection& was = rejected->second;
    // Only a layout that got slower by well beyond the noise (kRetryMargins margins: a slowdown
    // began) makes the old verdict stale; one that measures about the same or faster does not.
    const double retry = kRetryMargins * margin;
    const bool same = was.from == now && measured <= was.measured * (1.0 + retry);
    if (same) {
      std::ostringstream why;
      why << "; but " << proposed << " was tried from " << now << " and measured slower, and "
          << now << " measures " << 1000 * measured << " ms/step, not more than " << 100 * retry
          << "% above the " << 1000 * was.measured << " it measured then: kept";
      d.apply = false;
      d.reason += why.str();
      return;
    }
    // The layout got slower beyond the retry margin (or it is another layout): stale.
    std::ostringstream why;
    why << "; " << proposed << " measured slower once, from " << was.from << " at "
        << 1000 * was.measured << " ms/step; now " << now << " at " << 1000 * measured
        << ": tried again";
    d.reason += why.str();
    rejected_.erase(rejected);
  }
  // The layout's measurement the move is judged against: the window's, or, when the stages'
  // latest monitor interval (the steps just before the decision) measured slower than the
  // window by more than kRetryMargins margins (a slowdown began late in the window, which a
  // policy reading fresh counters reacts to at once), that interval's. Judged against the
  // window's steps from before the slowdown, a move that recovers from it measured "slower"
  // and was undone.
  double before = measured;
  if (monitor_) {
    std::vector<double> sum(static_cast<size_t>(stages_), 0.0);
    std::vector<int> seen(static_cast<size_t>(stages_), 0);
    for (const dynpipe::MonitorSample& s : monitor_->latest()) {
      if (s.seq == 0 || s.steps <= 0 || s.stage < 0 || s.stage >= stages_) continue;
      sum[static_cast<size_t>(s.stage)] += s.busy_seconds / static_cast<double>(s.steps);
      ++seen[static_cast<size_t>(s.stage)];
    }
    double recent = 0.0;
    for (size_t st = 0; st < sum.size(); ++st) {
      if (seen[st] > 0) recent = std::max(recent, sum[st] / seen[st]);
    }
    if (recent > measured * (1.0 + kRetryMargins * margin)) {
      before = recent;
      std::ostringstream why;
      why << "; judged against the latest monitor interval's slowest stage, " << 1000 * recent
          << " ms/step (the window's: " << 1000 * measured << ")";
      d.reason += why.str();
    }
  }
  last_move_ = Move{current, proposed, before};
}

void RepartitionLoop::check_memory(RepartitionDecision* d) const {
  if (!memory_ || !d->apply) return;
  const PartitionMemory memory = memory_(d->partition);
  if (!memory.feasible) {
    // A policy that does not plan memory itself proposed a partition that cannot fit.
    d->apply = false;
    d->infeasible.push_back({d->partition, memory.refusal, ""});
    d->reason += "; but " + partition_string(d->partition, names_) +
                 " does not fit --mem-limit: " + memory.refusal + ": kept";
    return;
  }
  for (size_t s = 0; s < d->partition.size(); ++s) {
    d->memory_plan +=
        (s ? "; stage " : "stage ") + std::to_string(s) + ": " +
        describe_memory_plan(memory.plan, d->partition[s].begin, d->partition[s].end, names_);
  }
}

std::optional<RepartitionRecord> RepartitionLoop::exchange(
    int64_t step, const StageMemoryStats& memory, double busy_seconds, const Ranges& current,
    std::vector<double>* metrics, const std::function<void(std::vector<double>*)>& sum) {
  const size_t own = metrics->size();
  // The monitor's samples (every step while it runs), then the loop's statistics or decision.
  std::vector<double> extra;
  if (monitor_) extra = monitor_->contribution(step, busy_seconds);
  const size_t samples = extra.size();
  const std::vector<double> loop = contribution(step, memory, busy_seconds, current);
  extra.insert(extra.end(), loop.begin(), loop.end());
  metrics->insert(metrics->end(), extra.begin(), extra.end());
  sum(metrics);
  const auto begin = metrics->begin() + static_cast<std::ptrdiff_t>(own);
  fresh_.clear();
  if (monitor_) {
    fresh_ =
        monitor_->absorb(std::vector<double>(begin, begin + static_cast<std::ptrdiff_t>(samples)));
  }
  const std::vector<double> summed(begin + static_cast<std::ptrdiff_t>(samples), metrics->end());
  metrics->resize(own);
  return absorb(step, summed, current);
}

std::vector<std::map<std::string, double>> RepartitionLoop::stage_counters() const {
  std::vector<std::map<std::string, double>> out(static_cast<size_t>(stages_));
  std::vector<int> seen(static_cast<size_t>(stages_), 0);
  for (const dynpipe::MonitorSample& s : monitor_->latest()) {
    if (s.seq == 0 || s.stage < 0 || s.stage >= stages_) continue;
    const size_t st = static_cast<size_t>(s.stage);
    for (const auto& [name, v] : s.counter_map()) out[st][name] += v;
    ++seen[st];
  }
  for (size_t st = 0; st < out.size(); ++st) {
    for (auto& [name, v] : out[st]) v /= std::max(1, seen[st]);
  }
  return out;
}

void RepartitionLoop::check(const RepartitionConfig& config, bool synchronous, bool restart,
                            bool swaps, bool live_async) {
  if (config.policy == "off") return;
  STRATA_CHECK(synchronous || restart || live_async)
      << "--repartition with an asynchronous schedule: the layers move live under async-1f1b "
         "with --migration live only; use --migration restart (the pipeline drains only where "
         "the loop decides a move, at the first step after the decision where the run cut there "
         "agrees with the one that ran)";
  STRATA_CHECK(synchronous || !swaps)
      << "--repartition with async-1f1b and swapped layers (--memory-policy / --memory-plan): "
         "not supported (the swap prefetches are laid out for the asynchronous run before a "
         "move is decided); use a synchronous schedule (1f1b, gpipe) or keep/recompute";
}

std::optional<RepartitionLoop::Ranges> RepartitionLoop::due(int64_t step) const {
  if (due_partition_ && due_step_ == step) return due_partition_;
  return std::nullopt;
}

std::optional<int64_t> RepartitionLoop::learned(int64_t step) const {
  if (due_partition_ && learned_at_ == step) return due_step_;
  return std::nullopt;
}

void RepartitionLoop::migrated(const StageMemoryStats* now) {
  // A new executor counts layer times from zero, a kept one from where it is; the window
  // restarts.
  std::fill(layer_start_.begin(), layer_start_.end(), 0.0);
  if (now != nullptr) {
    for (size_t i = 0; i < now->layer_forward_seconds.size(); ++i) {
      layer_start_[now->first_layer + i] =
          now->layer_forward_seconds[i] + now->layer_backward_seconds[i];
    }
  }
  window_steps_ = 0;
  window_busy_ = 0.0;
  due_partition_.reset();
  due_step_ = -1;
  learned_at_ = -1;
}

}  // namespace strata::parallel
