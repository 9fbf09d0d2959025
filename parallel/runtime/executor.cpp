// Executor: interprets a stage's instruction list.
#include "parallel/runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <sstream>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "ops/accuracy.h"
#include "ops/precision.h"
#include "parallel/runtime/live_pause.h"
#include "parallel/runtime/live_tied.h"
#include "parallel/trace.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool is_compute(OpCode op) {
  return op == OpCode::kForward || op == OpCode::kBackward || op == OpCode::kReduceGrads ||
         op == OpCode::kOptimizerStep;
}

// The swap engine, when a layer of this stage swaps.
std::unique_ptr<CopyEngine> make_copy_engine(ExecContext& ctx, const StageRange& range,
                                             const ExecutorConfig& config) {
  if (!config.memory_plan.uses(MemoryPolicy::kSwap, range.begin, range.end)) return nullptr;
  STRATA_CHECK(config.swap_pool != nullptr)
      << "executor: stage " << range.stage << " swaps layers but has no host pool";
  return std::make_unique<CopyEngine>(ctx, *config.swap_pool, "--swap-pool");
}

}  // namespace

struct Executor::InFlight {
  // Forwarded in training, not yet backwarded: its saved tensors are StageMemory's records, and
  // it needs the weight version below.
  bool awaiting_backward = false;
  TensorList inputs;        // received activations (stages > 0)
  TensorList outputs;       // to send forward (stages < S - 1)
  TensorList grad_outputs;  // received gradients (stages < S - 1)
  TensorList grad_inputs;   // to send backward (stages > 0)
  Tensor dlogits;           // last stage: gradient of the loss with respect to the logits
  int64_t weight_version = 0;
};

Executor::Executor(ExecContext& ctx, graph::Model& model, graph::ParamStore& store,
                   StageRange range, StageComms comms, const ExecutorConfig& config, Trace* trace)
    : ctx_(ctx),
      model_(model),
      store_(store),
      range_(range),
      comms_(comms),
      config_(config),
      trace_(trace),
      optimizer_(store, config.optimizer),
      optimizer_steps_(config.first_step),
      transfers_(ctx, model, range, comms,
                 store.mixed() ? std::optional<DType>(store.compute_dtype()) : std::nullopt,
                 config.lookahead, trace),
      copies_(make_copy_engine(ctx, range, config)),
      memory_(ctx, model, store, store.begin(), store.end(), config.memory_plan, copies_.get(),
              trace),
      versions_(ctx, store),
      uploader_(ctx) {
  if (config.weight_cache) {
    STRATA_CHECK(!is_synchronous(config.kind))
        << "--weight-cache on needs a schedule that stashes weight versions (async-1f1b, 2bw), "
           "not "
        << schedule_name(config.kind);
    STRATA_CHECK(config.swap_pool != nullptr)
        << "executor: stage " << range.stage << " caches weights but has no host pool";
    weight_copies_ = std::make_unique<CopyEngine>(ctx, *config.swap_pool, "--swap-pool");
    versions_.use_cache(weight_copies_.get());
  }
  memory_.set_prefetch_layers(config.prefetch_layers);
  memory_.set_drain_before_swap_in(config.kind == ScheduleKind::kGPipe);
  if (config.injector != nullptr && config.injector->per_layer()) {  // --inject slow, grow
    Injector* injector = config.injector;
    memory_.set_layer_observer(
        [injector](size_t layer, bool backward, int64_t step, double seconds) {
          injector->after_layer(layer, backward, step, seconds);
        });
  }
  STRATA_CHECK(range.stages >= 1 && range.stage >= 0 && range.stage < range.stages)
      << "executor: stage " << range.stage << " of " << range.stages;
  STRATA_CHECK(range.begin < range.end && range.end <= model.size())
      << "executor: stage " << range.stage << " has the empty layer range [" << range.begin << ", "
      << range.end << ")";
  // A live migration: the store holds the stage's core layers (those that do not move).
  const LayerRange held = config.live != nullptr ? LiveStage::core_range(*config.live, range.stage)
                                                 : LayerRange{range.begin, range.end};
  STRATA_CHECK_EQ(store.begin(), held.begin) << "executor: the ParamStore holds other layers";
  STRATA_CHECK_EQ(store.end(), held.end) << "executor: the ParamStore holds other layers";
  // Gradients of tied parameters split between this stage and another: the owner side holds the
  // owner entry, the other side a copy (ParamStore::tied_copies).
  if (comms.tied != nullptr) {
    for (size_t i : store.tied_copies()) tied_grads_.push_back(store.grad(i));
    if (tied_grads_.empty()) {
      tied_owner_side_ = true;
      for (size_t l = range.end; l < model.size(); ++l) {
        for (const graph::ParamSpec& spec : model.layer(l).param_specs()) {
          if (spec.tied_to.empty()) continue;
          const auto& entries = store.param_entries();
          for (size_t i = 0; i < entries.size(); ++i) {
            if (entries[i].full_name() == spec.tied_to) tied_grads_.push_back(store.grad(i));
          }
        }
      }
    }
    STRATA_CHECK(!tied_grads_.empty())
        << "executor: stage " << range.stage << " was given a tied-parameter communicator but "
        << "holds no tied parameter";
  }
  check_grad_sync(config.grad_sync);
  STRATA_CHECK(config.update_sync == nullptr ||
               (is_synchronous(config.kind) && (comms.dp == nullptr || comms.dp->size() == 1)))
      << "executor: stage " << range.stage << ": a replica synchronization ("
      << config.update_sync->name() << ") needs a synchronous schedule and replaces the "
      << "data-parallel gradient all-reduce";
  STRATA_CHECK(config.grad_sync.delay == 0 || is_synchronous(config.kind))
      << "--dp-delay " << config.grad_sync.delay << " needs a synchronous schedule (gpipe or "
      << "1f1b); " << schedule_name(config.kind) << " already updates without a flush";
  // CUDA: the all-reduces of tied parameters and of the data-parallel gradients are ordered
  // after the compute stream (the transfers have streams of their own: StageTransfers).
  if (ctx.device().is_cuda()) {
    auto use_stream = [this](Communicator* c, void* stream) {
      if (c == nullptr) return;
      c->set_caller_stream(stream);
      stream_users_.push_back(c);
    };
    use_stream(comms.pipe, compute_stream());
    use_stream(comms.tied, compute_stream());
    use_stream(comms.dp, compute_stream());  // before the split below, which inherits it
  }
  if (config.live != nullptr) {
    check_live();
    // Several groups: the moved layers' all-reduces on a communicator of their own (the
    // executor's thread issues them, GroupedDp's threads the core's).
    if (comms.dp != nullptr && comms.dp->size() > 1)
      live_dp_ = comms.dp->split(0, comms.dp->rank());
    LiveMigrationConfig live = *config.live;
    if (config.injector != nullptr && config.injector->per_layer()) {  // the moved layers too
      Injector* injector = config.injector;
      live.layer_observer = [injector](size_t layer, bool backward, int64_t step, double seconds) {
        injector->after_layer(layer, backward, step, seconds);
      };
    }
    if (live.paused) {
      live_ = std::make_unique<PausedStage>(ctx, model, range.stage, live, config.optimizer,
                                            live_dp_.get());
    } else {
      live_ = std::make_unique<LiveStage>(ctx, model, range.stage, live, config.optimizer,
                                          live_dp_.get());
    }
    const StageLayout& layout = live_->layout();
    const int stage = range.stage;
    transfers_.set_boundaries([&layout, stage](int64_t mb, bool gradient) {
      return gradient ? layout.backward_range(stage, mb).end
                      : layout.forward_range(stage, mb).begin;
    });
  }
  if (comms.dp != nullptr && comms.dp->size() > 1) {
    // A communicator of its own for the communication thread (collective over the groups).
    grouped_dp_ =
        std::make_unique<GroupedDp>(comms.dp->split(0, comms.dp->rank()), store, config.grad_sync,
                                    range.stage, trace, config.grad_sync_observer);
  }
}

Executor::~Executor() {
  // The caller streams set here may not outlive this executor (its send and receive streams).
  for (Communicator* c : stream_users_) c->set_caller_stream(nullptr);
}

StageMemoryStats Executor::memory_stats() const {
  StageMemoryStats core = memory_.stats();
  if (live_ == nullptr) return core;
  StageMemoryStats whole;
  const size_t L = model_.size();
  whole.layer_forward_seconds.assign(L, 0.0);
  whole.layer_backward_seconds.assign(L, 0.0);
  whole.layer_output_bytes.assign(L, 0.0);
  whole.layer_activation_bytes.assign(L, 0.0);
  add_memory_counters(core, &whole);
  add_layer_stats(core, &whole);
  live_->add_layer_stats(&whole);
  return whole;
}

void Executor::check_live() const {
  const LiveMigrationConfig& live = *config_.live;
  const std::string what = live.what + ": --migration live";
  STRATA_CHECK(config_.kind == ScheduleKind::kAsync1F1B)
      << what << " inside a run needs async-1f1b, not " << schedule_name(config_.kind);
  const bool holds_initial = live.initial.size() == static_cast<size_t>(range_.stages) &&
                             live.initial[range_.stage] == LayerRange{range_.begin, range_.end};
  STRATA_CHECK(holds_initial) << what << ": stage " << range_.stage
                              << " does not hold its layers of the initial partition";
  STRATA_CHECK(!store_.mixed()) << what << " needs float32 weights (--precision fp32)";
  // The shipped tensors go through host buffers and the stores' copies without stream order: on
  // a GPU that path is not built (nor tested); --migration restart moves layers there.
  STRATA_CHECK(!ctx_.device().is_cuda())
      << what << " with async-1f1b runs on CPU ranks only; use --migration restart on a GPU";
  // A tied parameter split between stages: its owner and user stay on their stages, so the
  // tied all-reduce pairs each update on the same two stages throughout (live_tied.h).
  check_live_tied(model_, live);
  STRATA_CHECK(config_.optimizer.clip_grad_norm == 0 && !config_.global_norm)
      << what << " with async-1f1b: no --clip-grad-norm, --nan-policy skip or --loss-scale (they "
      << "need a gradient norm over the moved layers' stores)";
  STRATA_CHECK(config_.update_sync == nullptr && !config_.weight_cache)
      << what << ": no --sync or --weight-cache";
  STRATA_CHECK(!config_.memory_plan.uses(MemoryPolicy::kSwap, 0, model_.size()) &&
               !config_.memory_plan.uses(MemoryPolicy::kRecompute, 0, model_.size()))
      << what << " keeps every layer's saved tensors: no --memory-plan swap or recompute";
}

graph::ForwardOptions Executor::training_options(int64_t mb, MicroBatchSource& source) const {
  const MicroBatchSource::Info info = source.info(mb);
  graph::ForwardOptions options;
  options.training = true;
  options.seed = config_.seed;
  options.step = info.step;
  options.sample_offset = info.sample_offset;
  options.keep_tape = true;
  return options;
}

void* Executor::compute_stream() const { return cuda::exec_stream(ctx_.cuda()); }

Executor::InFlight& Executor::state(int64_t mb) {
  auto it = in_flight_.find(mb);
  if (it == in_flight_.end()) it = in_flight_.emplace(mb, std::make_unique<InFlight>()).first;
  return *it->second;
}

void Executor::forward(int64_t mb, MicroBatchSource& source, bool training, StepStats* stats) {
  InFlight& f = state(mb);
  const MicroBatchSource::Info info = source.info(mb);
  TensorList inputs = first_stage() ? source.input(mb) : std::move(f.inputs);
  f.inputs.clear();
  for (Tensor& t : inputs) {
    t = on_device(t);
    if (store_.mixed() && t.defined() && is_floating(t.dtype())) {
      t = ops::cast(ctx_, t, store_.compute_dtype());  // images: rounded to 16 bits
    }
  }
  graph::ForwardOptions options;
  options.training = training;
  options.seed = config_.seed;
  options.step = info.step;
  options.sample_offset = info.sample_offset;
  int64_t version = optimizer_steps_;
  if (training && config_.kind == ScheduleKind::k2BW) {
    if (run_first_step_ < 0) {
      run_first_step_ = info.step;
      run_first_version_ = optimizer_steps_;
    }
    version = run_first_version_ + two_bw_version(info.step, run_first_step_);
  }
  options.weight_version = static_cast<uint64_t>(version);
  options.keep_tape = training;
  f.weight_version = version;
  TensorList outputs;
  if (training && live_ != nullptr) {
    outputs = live_->forward(
        mb, inputs, options,
        [&](const TensorList& x) {
          versions_.use(version, optimizer_steps_, "Forward", mb);
          return memory_.forward(mb, x, options);
        },
        source);
    f.awaiting_backward = true;
  } else if (training) {
    // 2bw: the step's version, which is older than the latest once the step before updated.
    versions_.use(version, optimizer_steps_, "Forward", mb);
    outputs = memory_.forward(mb, inputs, options);
    f.awaiting_backward = true;
  } else {
    Tape tape;  // evaluation keeps nothing
    outputs = model_.forward(ctx_, range_.begin, range_.end, inputs, tape, options);
  }
  if (!last_stage()) {
    f.outputs = std::move(outputs);
    return;
  }
  STRATA_CHECK(!outputs.empty() && outputs[0].dim() >= 2)
      << "the model's last layer must output (B, ..., classes), got "
      << (outputs.empty() ? std::string("nothing") : outputs[0].shape_str());
  const Tensor& logits = outputs[0];
  const Tensor host_target = source.target(mb);  // counted here, before it goes to the device
  const Tensor target = on_device(host_target);
  const Shape flat_targets(logits.shape().begin(), logits.shape().end() - 1);
  STRATA_CHECK(target.shape() == flat_targets)
      << "targets of shape " << target.shape_str() << " do not match logits of shape "
      << logits.shape_str();
  const Tensor flat_logits = logits.reshape({-1, logits.size(-1)});
  const Tensor flat_target = target.reshape({-1});
  ops::CrossEntropyOptions loss = config_.loss;
  loss.normalizer = training ? info.loss_normalizer : 1.0;  // evaluation: sum of the losses
  // The loss is read when the program ends (collect_losses): reading it here would make the host
  // wait for the device before it could queue the backward.
  losses_.push_back(ops::cross_entropy_forward(ctx_, flat_logits, flat_target, loss));
  stats->counted += ops::count_targets(host_target.reshape({-1}), loss.ignore_index);
  if (!training) {  // accuracy is reported for evaluations only (it waits for the device)
    stats->top1 += ops::topk_correct(ctx_, flat_logits, flat_target, 1, loss.ignore_index);
    if (flat_logits.size(1) >= 5) {
      stats->top5 += ops::topk_correct(ctx_, flat_logits, flat_target, 5, loss.ignore_index);
    }
  }
  if (training) {
    f.dlogits = ops::cross_entropy_backward(ctx_, flat_logits, flat_target, loss, loss_scale_)
                    .view(logits.shape());
  }
}

void Executor::backward(int64_t mb, bool last_of_update, MicroBatchSource& source) {
  auto it = in_flight_.find(mb);
  STRATA_CHECK(it != in_flight_.end() && it->second->awaiting_backward)
      << "executor: Backward(mb " << mb << ") on stage " << range_.stage << " before its Forward";
  InFlight& f = *it->second;
  if (last_of_update && config_.update_sync != nullptr) {
    config_.update_sync->last_backward_begins(updates_);
  }
  const TensorList grads = last_stage() ? TensorList{f.dlogits} : std::move(f.grad_outputs);
  // Weight stashing: run the backward on the weights the forward saw.
  if (live_ == nullptr) versions_.use(f.weight_version, optimizer_steps_, "Backward", mb);
  // The update's last backward pass launches each gradient bucket once its layers are done
  // (under mixed precision, once their gradients are in the f32 masters).
  std::function<void(size_t)> hook;
  const bool early_buckets = last_of_update && grouped_dp_ != nullptr && config_.grad_sync.overlap;
  if (early_buckets) {
    hook = [this](size_t layer) {
      store_.flush_layer_grads(ctx_, layer);
      grouped_dp_->layer_done(updates_, layer);
    };
  }
  TensorList grad_inputs;
  if (live_ != nullptr) {
    grad_inputs = live_->backward(
        mb, grads, training_options(mb, source),
        [&](const TensorList& g) {
          versions_.use(f.weight_version, optimizer_steps_, "Backward", mb);
          return memory_.backward(mb, g, hook);
        },
        source);
  } else {
    grad_inputs = memory_.backward(mb, grads, hook);
  }
  if (!early_buckets) store_.flush_grads(ctx_);  // mixed precision: into the f32 masters
  if (!first_stage()) f.grad_inputs = std::move(grad_inputs);
  f.awaiting_backward = false;  // no longer needs its weight version
  f.dlogits = Tensor();
  f.grad_outputs.clear();
  // async-1f1b: stashed versions nobody in flight needs any more (2bw drops its versions at the
  // updates: the rest of the step still needs them).
  if (config_.kind != ScheduleKind::kAsync1F1B) return;
  versions_.release_if([&](int64_t version) {
    for (const auto& [other, g] : in_flight_) {
      if (other != mb && g->weight_version == version && g->awaiting_backward) return false;
    }
    return true;
  });
}

void Executor::reduce_gradients() {
  const auto start = Clock::now();
  if (grouped_dp_ != nullptr && !config_.grad_sync.overlap && comms_.pipe != nullptr &&
      comms_.pipe->size() > 1) {
    // --dp-overlap off, the paper's naive solution: no all-reduce before the whole pipeline's
    // backward is done (the first stage finishes last).
    comms_.pipe->barrier("ReduceGrads (--dp-overlap off: the end of the whole backward) on stage " +
                         std::to_string(range_.stage));
  }
  if (grouped_dp_ != nullptr) grouped_dp_->end_backward(updates_);
  ++updates_;
  collective_seconds_ += seconds_since(start);
}

void Executor::optimizer_step(StepStats* stats) {
  // The gradient this update applies: this one's, or (--dp-delay D) the one of D updates ago.
  if (grouped_dp_ != nullptr) {
    const auto start = Clock::now();
    const bool ready = grouped_dp_->gradients_for(updates_ - 1);
    collective_seconds_ += seconds_since(start);
    if (!ready) {
      store_.zero_grads(ctx_);  // the first D updates only launch their all-reduce
      return;
    }
  }
  apply_update(stats);
  if (config_.update_sync != nullptr) {  // the local update is done: now the replicas meet
    const auto start = Clock::now();
    config_.update_sync->after_update(updates_ - 1);
    collective_seconds_ += seconds_since(start);
  }
}

void Executor::apply_update(StepStats* stats) {
  // The moved layers first: a source's hand-off follows its update of them, and must not wait
  // for the tied all-reduce below, whose other stage may be waiting for the hand-off (a move up
  // to it, or to a stage it waits for: the target's Forward(F) comes before its update K - 1).
  const double live_sq = live_ != nullptr ? live_->update(optimizer_steps_) : 0.0;
  // Tied parameters split between stages: after the sum over the groups, the sum of the copies.
  const auto tied_start = Clock::now();
  if (comms_.tied != nullptr) {
    for (const Tensor& g : tied_grads_) {
      auto r = comms_.tied->all_reduce(g);
      r->wait(comms_.tied->timeout(),
              "OptimizerStep (tied parameters) on stage " + std::to_string(range_.stage));
    }
  }
  collective_seconds_ += seconds_since(tied_start);
  versions_.restore_latest();  // the optimizer updates the latest weights
  if (config_.kind == ScheduleKind::k2BW) {
    // The step just done used the version before this one, which nobody needs any more; the next
    // step uses this one (its forwards may have begun).
    const int64_t now = optimizer_steps_;
    versions_.release_if([now](int64_t version) { return version < now; });
    versions_.stash(now);
  } else {
    // Versions still needed by a micro-batch in flight are stashed before the update.
    for (const auto& [mb, f] : in_flight_) {
      if (f->awaiting_backward && f->weight_version == optimizer_steps_) {
        versions_.stash(optimizer_steps_);
      }
    }
  }
  // Only clipping and agreed skips (ExecutorConfig::global_norm) need the global norm before the
  // update; otherwise the stage's share goes into the step's statistics and the optimizer waits
  // for no other stage.
  double local_sq = 0.0;
  graph::Optimizer::GlobalSum global_sum = [&local_sq](double local) {
    local_sq = local;
    return local;
  };
  if (comms_.pipe != nullptr && comms_.pipe->size() > 1 &&
      (config_.optimizer.clip_grad_norm > 0 || config_.global_norm)) {
    global_sum = [this, &local_sq](double local) {
      local_sq = local;
      const auto start = Clock::now();
      Tensor t = Tensor::full({1}, local, DType::kF64);
      auto r = comms_.pipe->all_reduce(t);
      r->wait(comms_.pipe->timeout(),
              "OptimizerStep (gradient norm) on stage " + std::to_string(range_.stage));
      collective_seconds_ += seconds_since(start);
      return t.item<double>();
    };
  }
  const graph::OptimizerStepInfo info =
      optimizer_.step(ctx_, optimizer_steps_, global_sum, loss_scale_);
  local_sq += live_sq;  // the moved layers'
  store_.zero_grads(ctx_);
  ++optimizer_steps_;
  // Mixed precision: the asynchronous schedule computes on the new weights within this program
  // (a synchronous one refreshes them when its next program starts).
  if (!is_synchronous(config_.kind)) store_.load_working_params(ctx_);
  stats->lr = info.lr;
  stats->grad_norm = info.grad_norm;
  stats->grad_sq = local_sq / (loss_scale_ * loss_scale_);  // unscaled
  ++stats->optimizer_steps;
  if (info.skipped || info.non_finite) {  // non_finite alone: applied, the trainer stops the run
    ++stats->skipped_steps;
    stats->first_non_finite = info.first_non_finite;
  }
}

int64_t Executor::flush_gradients() {
  if (grouped_dp_ == nullptr) return 0;
  int64_t applied = 0;
  StepStats ignored;
  for (int64_t update : grouped_dp_->pending_updates()) {
    grouped_dp_->take_gradients(update);
    apply_update(&ignored);
    ++applied;
  }
  return applied;
}

void Executor::set_loss_scale(double scale) {
  STRATA_CHECK(scale >= 1.0 && std::isfinite(scale)) << "executor: loss scale " << scale;
  STRATA_CHECK(scale == 1.0 || (is_synchronous(config_.kind) && config_.grad_sync.delay == 0))
      << "loss scaling needs a synchronous schedule without --dp-delay (a gradient must be "
         "unscaled by the scale it was computed with)";
  loss_scale_ = scale;
}

std::vector<Tensor> Executor::delayed_gradients() {
  std::vector<Tensor> out;
  if (grouped_dp_ == nullptr || config_.grad_sync.delay == 0) return out;
  const auto start = Clock::now();
  for (int64_t update : grouped_dp_->pending_updates()) {
    out.push_back(grouped_dp_->reduced_gradient(update));
  }
  collective_seconds_ += seconds_since(start);
  return out;
}

void Executor::restore_delayed_gradients(const std::vector<Tensor>& reduced) {
  if (reduced.empty()) return;
  STRATA_CHECK(grouped_dp_ != nullptr && config_.grad_sync.delay > 0)
      << "executor: stage " << range_.stage << " was given " << reduced.size()
      << " delayed gradients but runs without --dp-delay over several groups";
  STRATA_CHECK_EQ(updates_, 0) << "executor: delayed gradients are restored before the first step";
  for (const Tensor& g : reduced) grouped_dp_->restore_gradient(updates_++, g);
}

void Executor::execute(const Instruction& in, MicroBatchSource& source, StepStats* stats) {
  try {
    execute_op(in, source, stats);
  } catch (const OutOfMemoryError& e) {
    // Which stage, instruction and micro-batch ran out (the layer and bytes are in the message).
    std::string where = describe(in);
    if (in.micro_batch >= 0) {
      const MicroBatchSource::Info info = source.info(in.micro_batch);
      where +=
          " (step " + std::to_string(info.step + 1) + ", " + std::to_string(info.rows) + " rows)";
    }
    throw OutOfMemoryError(where + ": " + e.message(), e.where());
  }
}

void Executor::execute_op(const Instruction& in, MicroBatchSource& source, StepStats* stats) {
  const auto start = Clock::now();
  const double collective_before = collective_seconds_;
  const bool inject =
      config_.injector != nullptr && (in.op == OpCode::kForward || in.op == OpCode::kBackward);
  const int64_t step = inject ? source.info(in.micro_batch).step : 0;
  if (inject) config_.injector->before(in.op, step, in.micro_batch);
  const auto op_start = Clock::now();
  switch (in.op) {
    case OpCode::kRecvAct:
      state(in.micro_batch).inputs = transfers_.receive(in, source);
      break;
    case OpCode::kRecvGrad:
      state(in.micro_batch).grad_outputs = transfers_.receive(in, source);
      break;
    case OpCode::kForward:
      forward(in.micro_batch, source, true, stats);
      break;
    case OpCode::kSendAct: {
      InFlight& f = state(in.micro_batch);
      transfers_.send(in.op, in.micro_batch, f.outputs);
      f.outputs.clear();
      break;
    }
    case OpCode::kBackward:
      backward(in.micro_batch, last_backward_, source);
      if (config_.grad_sync_observer) {
        GradSyncEvent e;
        e.kind = GradSyncEvent::kBackwardEnd;
        e.stage = range_.stage;
        e.group = comms_.dp != nullptr ? comms_.dp->rank() : 0;
        e.update = updates_;
        e.micro_batch = in.micro_batch;
        e.time = Clock::now();
        config_.grad_sync_observer(e);
      }
      if (first_stage()) in_flight_.erase(in.micro_batch);
      break;
    case OpCode::kSendGrad: {
      transfers_.send(in.op, in.micro_batch, state(in.micro_batch).grad_inputs);
      in_flight_.erase(in.micro_batch);
      break;
    }
    case OpCode::kReduceGrads:
      reduce_gradients();
      break;
    case OpCode::kOptimizerStep:
      optimizer_step(stats);
      break;
    case OpCode::kSwapIn:
      memory_.prefetch(in.micro_batch);
      break;
  }
  if (inject) config_.injector->after(in.op, step, in.micro_batch, seconds_since(op_start));
  // Time blocked in a collective waits for the other ranks: it is not work.
  const double seconds = seconds_since(start) - (collective_seconds_ - collective_before);
  if (is_compute(in.op)) stats->busy_seconds += seconds;
  if (trace_ != nullptr) trace_->record(in, start, Clock::now());
}

StepStats Executor::run(const Program& program, MicroBatchSource& source) {
  const auto start = Clock::now();
  StepStats stats;
  store_.load_working(ctx_);  // mixed precision: the weights and statistics as they are now
  for (size_t i = 0; i < program.size(); ++i) {
    if (range_.stages > 1) {
      transfers_.post_ahead(program, i, source);
      transfers_.poll();  // a transfer seen in flight here was in flight when the instruction began
    }
    if (program[i].op == OpCode::kBackward) {
      // The last backward of an update: the next Backward or ReduceGrads is a ReduceGrads.
      last_backward_ = false;
      for (size_t j = i + 1; j < program.size(); ++j) {
        if (program[j].op == OpCode::kBackward) break;
        if (program[j].op == OpCode::kReduceGrads) {
          last_backward_ = true;
          break;
        }
      }
    }
    execute(program[i], source, &stats);
    prefetch_weights(program, i, source);
    if (range_.stages > 1) transfers_.poll();
    memory_.poll();
  }
  versions_.restore_latest();  // between programs the store holds the latest weights
  if (live_ != nullptr) live_->restore_latest();
  collect_losses(&stats);
  stats.wall_seconds = seconds_since(start);
  return stats;
}

void Executor::prefetch_weights(const Program& program, size_t i, MicroBatchSource& source) {
  if (!versions_.cached_on_host()) return;
  for (size_t j = i + 1; j < program.size(); ++j) {
    const Instruction& in = program[j];
    // An update first brings the latest weights back (a copy to the device): the prefetch waits
    // until after it, so that the two copies are not on the device at once.
    if (in.op == OpCode::kOptimizerStep) return;
    if (in.op == OpCode::kBackward) {
      auto it = in_flight_.find(in.micro_batch);
      if (it != in_flight_.end() && it->second->awaiting_backward) {
        versions_.prefetch(it->second->weight_version);
      }
      return;
    }
    if (in.op == OpCode::kForward) {
      if (config_.kind == ScheduleKind::k2BW && run_first_step_ >= 0) {
        versions_.prefetch(run_first_version_ +
                           two_bw_version(source.info(in.micro_batch).step, run_first_step_));
      }
      return;
    }
  }
}

void Executor::collect_losses(StepStats* stats) {
  for (const Tensor& loss : losses_) stats->loss += loss.to(DType::kF64).item<double>();
  losses_.clear();
}

void Executor::finish() {
  transfers_.drain();
  STRATA_CHECK(transfers_.posted_receives() == 0)
      << "executor: stage " << range_.stage << " finished with " << transfers_.posted_receives()
      << " receives still posted";
  STRATA_CHECK(in_flight_.empty()) << "executor: stage " << range_.stage << " finished with "
                                   << in_flight_.size() << " micro-batches in flight";
  STRATA_CHECK_EQ(memory_.live_records(), 0)
      << "executor: stage " << range_.stage << " finished with saved tensors still recorded";
  STRATA_CHECK(grouped_dp_ == nullptr || config_.grad_sync.delay > 0 || grouped_dp_->idle())
      << "executor: stage " << range_.stage << " finished with gradient all-reduces pending";
  if (live_ != nullptr) {
    STRATA_CHECK_EQ(live_->live_records(), 0)
        << "executor: stage " << range_.stage << " finished with moved layers' saved tensors";
    live_->finish();
  }
  versions_.clear();
  run_first_step_ = -1;
}

StepStats Executor::evaluate(int64_t first, int64_t count, MicroBatchSource& source) {
  const auto start = Clock::now();
  STRATA_CHECK(live_ == nullptr) << "executor: stage " << range_.stage
                                 << " evaluates with the executor of a run that migrates live; "
                                    "evaluate with an executor of the final layout";
  StepStats stats;
  versions_.restore_latest();
  store_.load_working(ctx_);
  Program program;
  for (int64_t mb = first; mb < first + count; ++mb) {
    if (!first_stage()) program.push_back({OpCode::kRecvAct, mb});
    program.push_back({OpCode::kForward, mb});
    if (!last_stage()) program.push_back({OpCode::kSendAct, mb});
  }
  for (size_t i = 0; i < program.size(); ++i) {
    const Instruction& in = program[i];
    if (range_.stages > 1) transfers_.post_ahead(program, i, source);
    if (in.op == OpCode::kForward) {
      const auto t0 = Clock::now();
      forward(in.micro_batch, source, false, &stats);
      stats.busy_seconds += seconds_since(t0);
      if (last_stage()) in_flight_.erase(in.micro_batch);
    } else {
      execute(in, source, &stats);
      if (in.op == OpCode::kSendAct) in_flight_.erase(in.micro_batch);
    }
    if (range_.stages > 1) transfers_.poll();
  }
  collect_losses(&stats);
  stats.wall_seconds = seconds_since(start);
  return stats;
}

}  // namespace strata::parallel
