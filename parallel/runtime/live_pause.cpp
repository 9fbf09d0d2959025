// PausedStage: DynPipe's paused-update migration under async-1f1b (see the header).
#include "parallel/runtime/live_pause.h"

#include <algorithm>
#include <chrono>

#include "engine/check.h"
#include "ops/elementwise.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kControlTag = 1;  // upstream -> downstream, at each forward j >= P up to K's
constexpr int kAckTag = 2;      // target -> source (a move down), at each backward j in [P, K)

}  // namespace

PausedStage::PausedStage(ExecContext& ctx, graph::Model& model, int stage,
                         const LiveMigrationConfig& config, const graph::OptimizerConfig& optimizer,
                         Communicator* dp)
    : ctx_(ctx),
      model_(model),
      stage_(stage),
      config_(config),
      optimizer_(optimizer),
      layout_(config.initial),
      core_(LiveStage::core_range(config, stage)) {
  const std::string what = config.what + " (--migration dynpipe)";
  STRATA_CHECK(config.paused) << what << ": not a paused migration";
  STRATA_CHECK(config.then.empty())
      << what << ": one migration per run (the take-over is agreed at run time, so a later one "
      << "cannot be laid out in advance); use --migration live for several";
  STRATA_CHECK(dp == nullptr || dp->size() == 1)
      << what << ": one data-parallel group (--groups 1); use --migration live with groups";
  STRATA_CHECK(config.comm != nullptr && config.make_store != nullptr)
      << what << ": no migration communicator or store maker";
  STRATA_CHECK(config.first_backward >= 1) << what << ": the pause must be after micro-batch 0";
  // The boundary that moves (StageLayout checks the partitions; K comes later).
  StageLayout probe(config.initial);
  probe.add_live_migration(config.next, config.first_backward);
  const std::vector<BoundaryMove>& moves = probe.migrations().front();
  STRATA_CHECK_EQ(moves.size(), 1u)
      << what << ": the partitions move layers across " << moves.size()
      << " stage boundaries; this protocol moves one boundary per run (use --migration live)";
  move_ = moves.front();
  move_.first_backward = move_.first_forward = -1;
  STRATA_CHECK(core_.begin < core_.end)
      << what << ": stage " << stage << " would keep none of its layers";
  stats_.pause_at = config.first_backward;
  // The latest take-over K = j + S (j >= P, a forward) whose F = K + S - src - 1 is in the run.
  const int S = layout_.stages();
  STRATA_CHECK(config.micro_batches <= 0 ||
               config.first_backward + 2 * S - move_.src - 1 < config.micro_batches)
      << what << ": the run's " << config.micro_batches << " micro-batches end before the move "
      << "can (it pauses at micro-batch " << config.first_backward << " and needs at least "
      << 2 * S - move_.src << " more); migrate earlier or run longer";
  // Every stage splits the migration's communicator twice, in the same order (collective).
  const bool here = stage == move_.src || stage == move_.tgt;
  transfer_comm_ = config.comm->split(here ? 0 : -1, stage);
  control_comm_ = config.comm->split(here ? 0 : -1, stage);
  if (!here) return;
  role_ = stage == move_.src ? Role::kSource : Role::kTarget;
  std::string layers = model.layer(move_.begin).name();
  if (move_.end - move_.begin > 1) layers += "-" + model.layer(move_.end - 1).name();
  what_ = what + " (" + layers + " " + std::to_string(move_.src) + "->" +
          std::to_string(move_.tgt) + ")";
  make_stores();
  STRATA_CHECK(!store_->buffers().defined() || store_->buffers().numel() == 0)
      << what_ << ": the moved layers hold running statistics, which the source's forwards keep "
      << "changing while the state travels; move layers without them, or use --migration live";
  live_ = role_ == Role::kSource;
  // The frozen state, the inputs of [K, F) (F - K = S - src - 1), the flush.
  transfer_ = std::make_unique<LiveTransfer>(
      *transfer_comm_, 1 - transfer_comm_->rank(),
      role_ == Role::kSource ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget,
      int64_t{S - move_.src - 1} + 2, what_, config.transfer);
  if (role_ == Role::kTarget) {
    std::vector<std::pair<Shape, DType>> state{
        {store_->params().shape(), store_->params().dtype()}};
    for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
      state.push_back({store_->state(s).shape(), store_->state(s).dtype()});
    }
    transfer_->expect(expected_++, state);
  }
}

PausedStage::~PausedStage() = default;

void PausedStage::make_stores() {
  store_ = config_.make_store(move_.begin, move_.end);
  STRATA_CHECK(store_->begin() == move_.begin && store_->end() == move_.end)
      << what_ << ": the store maker gave other layers";
  STRATA_CHECK(store_->tied_copies().empty())
      << what_ << ": the moved layers hold a tied parameter; keep them in place";
  store_->ensure_state(graph::optimizer_slot_names(optimizer_).size());
  optimizer_state_ = std::make_unique<graph::Optimizer>(*store_, optimizer_);
  memory_ = std::make_unique<StageMemory>(ctx_, model_, *store_, move_.begin, move_.end,
                                          MemoryPlan(), nullptr);
  versions_ = std::make_unique<WeightVersions>(ctx_, *store_);
}

void PausedStage::send_control(int tag, int64_t value) {
  Tensor t = Tensor::full({1}, static_cast<double>(value), DType::kI64);
  auto request = control_comm_->isend(t, 1 - control_comm_->rank(), tag);
  sends_.emplace_back(t, std::move(request));
  while (!sends_.empty() && sends_.front().second->test()) sends_.pop_front();
}

int64_t PausedStage::receive_control(int tag, const std::string& waiter) {
  Tensor t = Tensor::zeros({1}, DType::kI64);
  control_comm_->irecv(t, 1 - control_comm_->rank(), tag)
      ->wait(control_comm_->timeout(),
             what_ + ": " + waiter + (tag == kControlTag ? " (the take-over)" : " (the ack)"));
  return t.item<int64_t>();
}

bool PausedStage::take_state(bool block) {
  if (state_taken_) return true;
  if (!block && !transfer_->arrived(0)) return false;
  const auto start = Clock::now();
  const std::vector<Tensor> state = transfer_->wait(0, "the frozen state");
  stats_.handoff_wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  store_->params().copy_from(state[0]);
  for (size_t s = 0; s + 1 < state.size(); ++s) store_->state(s).copy_from(state[s + 1]);
  latest_ = config_.first_backward;  // the source applied the updates of [0, P)
  state_taken_ = true;
  ++stats_.handoffs_received;
  return true;
}

void PausedStage::decided(int64_t k) {
  const int S = layout_.stages();
  move_.first_backward = k;
  move_.first_forward = k + S - move_.src - 1;
  layout_.add_live_migration(config_.next, k);
  stats_.take_over = k;
  if (role_ != Role::kTarget) return;
  take_state(true);  // held already, unless the run's end forced the decision
  live_ = true;
  // The backwards of [K, F) replay here on the frozen weights.
  for (int64_t j = k; j < move_.first_forward; ++j) pending_[j] = latest_;
}

void PausedStage::expect_inputs(int64_t up_to, MicroBatchSource& source) {
  if (role_ != Role::kTarget || move_.first_backward < 0) return;
  const graph::TensorSpecs& specs = model_.specs_before(move_.begin);
  while (expected_ - 1 < inputs() && move_.first_backward + expected_ - 1 <= up_to) {
    const int64_t j = move_.first_backward + expected_ - 1;
    std::vector<std::pair<Shape, DType>> layout;
    for (const auto& spec : specs) {
      Shape shape{source.info(j).rows};
      shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
      layout.push_back({shape, spec.dtype});
    }
    transfer_->expect(expected_++, layout);
  }
  if (expected_ - 1 == inputs()) {  // the flush: the source's buffered gradients, their count
    transfer_->expect(
        expected_++, {{store_->grads().shape(), store_->grads().dtype()}, {Shape{1}, DType::kI64}});
  }
}

TensorList PausedStage::forward(int64_t mb, const TensorList& inputs,
                                const graph::ForwardOptions& options, const CoreForward& core,
                                MicroBatchSource& source) {
  const int64_t P = config_.first_backward;
  const int S = layout_.stages();
  if (in_hop() && mb >= P && move_.first_backward < 0) {
    const std::string waiter =
        "Forward(mb " + std::to_string(mb) + ") on stage " + std::to_string(stage_);
    if (upstream()) {
      // The target holds the state: it takes the layers over S micro-batches on. At the last
      // forward where the move still ends (F) inside the run it does anyway, and the target
      // waits for the state (counted in the wait seconds).
      const bool held = role_ == Role::kTarget ? take_state(false) : acked_;
      const int64_t k = mb + S, N = config_.micro_batches;
      const bool last = N > 0 && k + S - move_.src - 1 == N - 1;
      const bool decide = held || last;
      send_control(kControlTag, decide ? k : -1);
      if (decide) decided(k);
    } else {
      const int64_t k = receive_control(kControlTag, waiter);
      if (k >= 0) decided(k);
    }
  }
  expect_inputs(mb, source);
  const LayerRange range = layout_.forward_range(stage_, mb);
  const bool runs = in_hop() && move_.begin >= range.begin && move_.end <= range.end;
  if (!runs) return core(inputs);
  STRATA_CHECK(live_) << what_ << ": Forward(mb " << mb << ") on stage " << stage_
                      << " needs the moved layers, which it does not hold";
  const bool core_first = move_.begin >= core_.end;
  TensorList x = core_first ? core(inputs) : inputs;
  versions_->use(latest_, latest_, "Forward (moved layers)", mb);
  graph::ForwardOptions o = options;
  o.weight_version = static_cast<uint64_t>(latest_);
  const TensorList in = x;
  x = memory_->forward(mb, in, o);
  if (role_ == Role::kSource && move_.first_backward >= 0 && mb >= move_.first_backward &&
      mb < move_.first_forward) {
    // Its backward runs on the target, on the same (frozen) weights: only the inputs go.
    std::vector<Tensor> item;
    for (const Tensor& t : in) {
      STRATA_CHECK(t.defined()) << what_ << ": an undefined input of the moved layers";
      item.push_back(t);
    }
    transfer_->post(1 + mb - move_.first_backward, item);
    memory_->drop(mb);
    ++stats_.inputs_sent;
  } else {
    pending_[mb] = latest_;
  }
  return core_first ? x : core(x);
}

TensorList PausedStage::backward(int64_t mb, const TensorList& grads,
                                 const graph::ForwardOptions& options, const CoreBackward& core,
                                 MicroBatchSource& source) {
  const int64_t P = config_.first_backward;
  const bool down = move_.tgt > move_.src;
  if (in_hop() && down && mb >= P && (move_.first_backward < 0 || mb < move_.first_backward)) {
    // A move down: the target tells the source at each backward whether it holds the state.
    if (role_ == Role::kTarget) {
      send_control(kAckTag, take_state(false) ? 1 : 0);
    } else if (receive_control(kAckTag, "Backward(mb " + std::to_string(mb) + ") on stage " +
                                            std::to_string(stage_)) == 1) {
      acked_ = true;
    }
  }
  last_backward_ = mb;
  const LayerRange range = layout_.backward_range(stage_, mb);
  const bool runs = in_hop() && move_.begin >= range.begin && move_.end <= range.end;
  if (!runs) return core(grads);
  const std::string waiter =
      "Backward(mb " + std::to_string(mb) + ") on stage " + std::to_string(stage_);
  STRATA_CHECK(live_) << what_ << ": " << waiter << " needs the moved layers";
  const bool core_first = move_.end <= core_.begin;  // L before the core: its backward after
  TensorList g = core_first ? core(grads) : grads;
  const auto p = pending_.find(mb);
  STRATA_CHECK(p != pending_.end()) << what_ << ": " << waiter << " finds no forward";
  versions_->use(p->second, latest_, "Backward (moved layers)", mb);
  if (role_ == Role::kTarget && mb < move_.first_forward) {
    // Forwarded at the source on the frozen weights: replay it here from the shipped inputs.
    expect_inputs(mb, source);
    const auto start = Clock::now();
    std::vector<Tensor> item = transfer_->wait(1 + mb - move_.first_backward, waiter);
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    stats_.handoff_wait_seconds += waited;
    TensorList in;
    for (const Tensor& t : item) {
      Tensor d = Tensor::empty(t.shape(), t.dtype(), &ctx_.allocator());
      d.copy_from(t);
      in.push_back(d);
    }
    graph::ForwardOptions o = options;
    o.weight_version = static_cast<uint64_t>(p->second);
    memory_->forward(mb, in, o);
    ++stats_.inputs_received;
    ++stats_.replayed_backwards;
  }
  g = memory_->backward(mb, g);
  pending_.erase(p);
  grads_pending_ = true;
  if (mb >= P && !resumed_) ++stats_.buffered_grads;
  versions_->release_if([&](int64_t version) {
    for (const auto& [other, v] : pending_) {
      if (v == version) return false;
    }
    return true;
  });
  return core_first ? g : core(g);
}

void PausedStage::step_layers(int64_t step) {
  versions_->restore_latest();
  for (const auto& [mb, v] : pending_) {
    if (v == latest_) {
      versions_->stash(latest_);  // still needed by a backward to come
      break;
    }
  }
  optimizer_state_->step(ctx_, step, [](double l) { return l; });
  store_->zero_grads(ctx_);
  ++latest_;
  ++stats_.moved_updates;
}

void PausedStage::post_flush() {
  STRATA_CHECK(pending_.empty()) << what_ << ": stage " << stage_ << " flushes with "
                                 << pending_.size() << " backwards of the moved layers to run";
  STRATA_CHECK_EQ(memory_->live_records(), 0)
      << what_ << ": stage " << stage_ << " flushes with saved tensors left";
  const Tensor count = Tensor::full({1}, static_cast<double>(stats_.buffered_grads), DType::kI64);
  transfer_->post(1 + inputs(), {store_->grads(), count});
  ++stats_.handoffs_sent;
  memory_.reset();
  versions_.reset();
  optimizer_state_.reset();
  store_.reset();
  live_ = false;
}

void PausedStage::apply_flush(int64_t mb, int64_t step, const std::string& waiter) {
  const auto start = Clock::now();
  const std::vector<Tensor> flush = transfer_->wait(1 + inputs(), waiter);
  stats_.handoff_wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t count = flush[1].item<int64_t>();
  STRATA_CHECK_EQ(count, move_.first_backward - config_.first_backward)
      << what_ << ": the flush holds " << count << " gradients, the source's backwards of [P, K) "
      << "are " << move_.first_backward - config_.first_backward;
  stats_.flushed_grads = count;
  Tensor grads = Tensor::empty(flush[0].shape(), flush[0].dtype(), &ctx_.allocator());
  grads.copy_from(flush[0]);
  versions_->restore_latest();
  ops::add_(ctx_, store_->grads(), grads);  // the target's [K, R], then the source's [P, K)
  stats_.resume = mb;
  resumed_ = true;
  step_layers(step);
}

double PausedStage::update(int64_t step) {
  last_step_ = step;
  if (!live_ || !grads_pending_) return 0.0;
  grads_pending_ = false;
  const int64_t mb = last_backward_, P = config_.first_backward;
  if (role_ == Role::kSource) {
    if (mb < P) step_layers(step);
    if (mb == P - 1) {
      // The pause: the state after P updates is frozen from here on and goes behind training.
      versions_->restore_latest();
      std::vector<Tensor> state{store_->params()};  // copied by post()
      for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
        state.push_back(store_->state(s));
      }
      transfer_->post(0, state);
      state_posted_ = true;
    }
    if (move_.first_backward >= 0 && mb == move_.first_backward - 1) post_flush();
    return 0.0;
  }
  if (resumed_) {
    step_layers(step);
  } else if (expected_ > 1 + inputs() && transfer_->arrived(1 + inputs())) {
    apply_flush(mb, step, "update of micro-batch " + std::to_string(mb));
  }
  return 0.0;
}

void PausedStage::add_layer_stats(StageMemoryStats* whole) const {
  if (memory_ == nullptr) return;
  const StageMemoryStats part = memory_->stats();
  add_memory_counters(part, whole);
  parallel::add_layer_stats(part, whole);
}

void PausedStage::add_migration(const Partition&, int64_t, const std::string& what) {
  STRATA_THROW() << what << ": --migration dynpipe moves the one migration laid out before the "
                 << "run; a move decided while it runs goes with --migration live";
}

void PausedStage::restore_latest() {
  if (versions_) versions_->restore_latest();
}

int64_t PausedStage::live_records() const { return memory_ ? memory_->live_records() : 0; }

std::vector<const graph::ParamStore*> PausedStage::stores() const {
  if (live_ && store_) return {store_.get()};
  return {};
}

void PausedStage::finish() {
  stats_.migration_bytes.assign(1, 0);
  stats_.migration_wait_seconds.assign(1, 0.0);
  if (!in_hop()) return;
  STRATA_CHECK(move_.first_backward >= 0)
      << what_ << ": the run ended on stage " << stage_ << " before the take-over: the target "
      << "did not hold the moved layers' state in time (paused from micro-batch "
      << config_.first_backward << "); migrate earlier, run longer, or use a faster link";
  if (role_ == Role::kTarget && !resumed_) {
    // The flush comes after the run's last update: applied now, as at that update.
    apply_flush(last_backward_, last_step_, "the end of the run");
  }
  transfer_->finish();
  for (auto& [t, request] : sends_) request->wait(control_comm_->timeout(), what_ + ": control");
  sends_.clear();
  STRATA_CHECK(role_ == Role::kTarget || state_posted_)
      << what_ << ": stage " << stage_ << " never posted the frozen state";
  STRATA_CHECK(pending_.empty()) << what_ << ": stage " << stage_ << " finished with "
                                 << pending_.size() << " backwards of moved layers still to run";
  const LiveTransferStats t = transfer_->stats();
  (role_ == Role::kSource ? stats_.bytes_sent : stats_.bytes_received) += t.bytes;
  stats_.migration_bytes[0] = t.bytes;
  stats_.migration_wait_seconds[0] = stats_.handoff_wait_seconds;
}

}  // namespace strata::parallel
