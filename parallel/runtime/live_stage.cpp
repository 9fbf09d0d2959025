// LiveStage: a stage's side of a live migration under async-1f1b (see the header).
#include "parallel/runtime/live_stage.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "engine/check.h"
#include "parallel/runtime/live_protocol.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

bool inside(const BoundaryMove& m, const LayerRange& r) {
  return m.begin >= r.begin && m.end <= r.end;
}

std::string layers_of(const graph::Model& model, const BoundaryMove& m) {
  std::ostringstream s;
  s << model.layer(m.begin).name();
  if (m.end - m.begin > 1) s << "-" << model.layer(m.end - 1).name();
  s << " " << m.src << "->" << m.tgt;
  return s.str();
}

}  // namespace

struct LiveStage::Block {
  BoundaryMove move;
  bool source = false;
  bool live = false;        // holds the layers now (source: until the hand-off; target: from it)
  bool handed_off = false;  // source: posted; target: received
  std::unique_ptr<graph::ParamStore> store;
  std::unique_ptr<graph::Optimizer> optimizer;
  std::unique_ptr<StageMemory> memory;
  std::unique_ptr<WeightVersions> versions;
  int64_t latest = 0;                     // updates applied to the layers
  std::map<int64_t, int64_t> pending;     // micro-batch -> version: backward still to run here
  std::map<int64_t, TensorList> shipped;  // target: the layers' inputs, by micro-batch
  bool grads_pending = false;             // a backward ran since the last update
  int64_t expected = 0;                   // target: items whose layouts the transfer has
  std::unique_ptr<LiveTransfer> transfer;
  std::string what;
};

LayerRange LiveStage::core_range(const LiveMigrationConfig& config, int stage) {
  const LayerRange& a = config.initial.at(static_cast<size_t>(stage));
  const LayerRange& b = config.next.at(static_cast<size_t>(stage));
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

LiveStage::LiveStage(ExecContext& ctx, graph::Model& model, int stage,
                     const LiveMigrationConfig& config, const graph::OptimizerConfig& optimizer,
                     Communicator* dp)
    : ctx_(ctx),
      model_(model),
      stage_(stage),
      config_(config),
      optimizer_(optimizer),
      dp_(dp),
      layout_(config.initial),
      core_(core_range(config, stage)) {
  layout_.add_live_migration(config.next, config.first_backward);
  STRATA_CHECK(core_.begin < core_.end)
      << config.what << ": stage " << stage << " would keep none of its layers [" << core_.begin
      << ", " << core_.end << ") through the migration; move fewer layers at once, or use "
      << "--migration restart";
  STRATA_CHECK(config.comm != nullptr) << config.what << ": no migration communicator";
  STRATA_CHECK(config.make_store != nullptr) << config.what << ": no store maker";
  const size_t slots = graph::optimizer_slot_names(optimizer).size();
  const auto& moves = layout_.migrations().front();
  for (size_t i = 0; i < moves.size(); ++i) {
    const BoundaryMove& m = moves[i];
    if (m.src != stage && m.tgt != stage) continue;
    auto b = std::make_unique<Block>();
    b->move = m;
    b->source = m.src == stage;
    b->live = b->source;
    b->what = config.what + " (" + layers_of(model, m) + ")";
    b->store = config.make_store(m.begin, m.end);
    STRATA_CHECK(b->store->begin() == m.begin && b->store->end() == m.end)
        << b->what << ": the store maker gave layers [" << b->store->begin() << ", "
        << b->store->end() << ")";
    STRATA_CHECK(b->store->tied_copies().empty())
        << b->what << ": the moved layers hold a tied parameter; keep them in place";
    b->store->ensure_state(slots);
    b->optimizer = std::make_unique<graph::Optimizer>(*b->store, optimizer);
    b->memory =
        std::make_unique<StageMemory>(ctx, model, *b->store, m.begin, m.end, MemoryPlan(), nullptr);
    b->versions = std::make_unique<WeightVersions>(ctx, *b->store);
    LiveTransferConfig transfer = config.transfer;
    transfer.tag_base = config.transfer.tag_base + static_cast<int>(i) * 8192;
    // The inputs of micro-batches [K, F), then the hand-off.
    const int64_t items = m.first_forward - m.first_backward + 1;
    b->transfer = std::make_unique<LiveTransfer>(
        *config.comm, b->source ? m.tgt : m.src,
        b->source ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget, items, b->what,
        transfer);
    blocks_.push_back(std::move(b));
  }
  std::sort(blocks_.begin(), blocks_.end(),
            [](const auto& x, const auto& y) { return x->move.begin < y->move.begin; });
}

LiveStage::~LiveStage() = default;

void LiveStage::expect_items(Block& b, int64_t up_to, MicroBatchSource& source) {
  if (b.source) return;
  const BoundaryMove& m = b.move;
  const int64_t inputs = m.first_forward - m.first_backward;
  // The inputs of micro-batches up to `up_to` (asked for as the target reaches them: the rows of
  // a later one would make the data loader skip ahead), then the hand-off.
  const graph::TensorSpecs& specs = model_.specs_before(m.begin);
  while (b.expected < inputs && m.first_backward + b.expected <= up_to) {
    const int64_t j = m.first_backward + b.expected;
    std::vector<std::pair<Shape, DType>> layout;
    for (const auto& spec : specs) {
      Shape shape{source.info(j).rows};
      shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
      layout.push_back({shape, spec.dtype});
    }
    layout.push_back({b.store->params().shape(), b.store->params().dtype()});
    b.transfer->expect(b.expected++, layout);
  }
  if (b.expected != inputs) return;
  std::vector<std::pair<Shape, DType>> handoff{
      {b.store->params().shape(), b.store->params().dtype()}};
  for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
    handoff.push_back({b.store->state(s).shape(), b.store->state(s).dtype()});
  }
  if (b.store->buffers().defined() && b.store->buffers().numel() > 0) {
    handoff.push_back({b.store->buffers().shape(), b.store->buffers().dtype()});
  }
  if (m.tgt < m.src) handoff.push_back({b.store->params().shape(), b.store->params().dtype()});
  b.transfer->expect(b.expected++, handoff);
}

void LiveStage::receive_handoff(Block& b, const std::string& waiter, MicroBatchSource& source) {
  expect_items(b, b.move.first_forward, source);
  const auto start = Clock::now();
  const BoundaryMove& m = b.move;
  const int S = layout_.stages();
  const auto on_device = [&](const Tensor& host) {
    Tensor t = Tensor::empty(host.shape(), host.dtype(), &ctx_.allocator());
    t.copy_from(host);
    return t;
  };
  // The shipped micro-batches: their inputs, and the weights their forward used at the source
  // (Eq. 4 there) as stashed versions.
  for (int64_t j = m.first_backward; j < m.first_forward; ++j) {
    std::vector<Tensor> item = b.transfer->wait(j - m.first_backward, waiter);
    const int64_t version = async_forward_version(S, m.src, j);
    if (!b.versions->kept(version)) {
      b.store->params().copy_from(item.back());
      b.versions->stash(version);
    }
    item.pop_back();
    TensorList inputs;
    for (const Tensor& t : item) inputs.push_back(on_device(t));
    b.shipped[j] = std::move(inputs);
    b.pending[j] = version;
    ++stats_.inputs_received;
  }
  const std::vector<Tensor> handoff =
      b.transfer->wait(m.first_forward - m.first_backward, waiter + " (the hand-off)");
  size_t k = 1;  // [0]: the parameters, put in last (the latest version)
  for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
    b.store->state(s).copy_from(handoff[k++]);
  }
  if (b.store->buffers().defined() && b.store->buffers().numel() > 0) {
    b.store->buffers().copy_from(handoff[k++]);
  }
  if (m.tgt < m.src && !b.versions->kept(m.first_backward - 1)) {  // a move up: version K - 1
    b.store->params().copy_from(handoff[k]);
    b.versions->stash(m.first_backward - 1);
  }
  b.store->params().copy_from(handoff[0]);
  b.latest = m.first_backward;  // the source applied the updates of micro-batches [0, K)
  b.live = true;
  b.handed_off = true;
  ++stats_.handoffs_received;
  stats_.handoff_wait_seconds += std::chrono::duration<double>(Clock::now() - start).count();
}

TensorList LiveStage::forward(int64_t mb, const TensorList& inputs,
                              const graph::ForwardOptions& options, const CoreForward& core,
                              MicroBatchSource& source) {
  for (auto& b : blocks_) expect_items(*b, mb, source);
  const LayerRange range = layout_.forward_range(stage_, mb);
  TensorList x = inputs;
  bool core_done = false;
  auto run_core = [&] {
    x = core(x);
    core_done = true;
  };
  for (auto& bp : blocks_) {
    Block& b = *bp;
    if (!core_done && b.move.begin >= core_.end) run_core();
    if (!inside(b.move, range)) continue;
    if (!b.source && !b.handed_off) {
      receive_handoff(
          b, "Forward(mb " + std::to_string(mb) + ") on stage " + std::to_string(stage_), source);
    }
    STRATA_CHECK(b.live) << b.what << ": Forward(mb " << mb << ") on stage " << stage_
                         << " after the layers left it";
    // Eq. 4: the version of the stage that runs the forward.
    const int64_t version = async_forward_version(layout_.stages(), stage_, mb);
    b.versions->use(version, b.latest, "Forward (moved layers)", mb);
    graph::ForwardOptions o = options;
    o.weight_version = static_cast<uint64_t>(version);
    const TensorList in = x;
    x = b.memory->forward(mb, in, o);
    if (b.source && mb >= b.move.first_backward && mb < b.move.first_forward) {
      // Its backward runs on the target: the inputs and the weights go there, the tapes go.
      std::vector<Tensor> item;
      for (const Tensor& t : in) {
        STRATA_CHECK(t.defined()) << b.what << ": an undefined input of the moved layers";
        item.push_back(t);
      }
      item.push_back(b.store->params());
      b.transfer->post(mb - b.move.first_backward, item);
      b.memory->drop(mb);
      ++stats_.inputs_sent;
    } else {
      b.pending[mb] = version;
    }
  }
  if (!core_done) run_core();
  return x;
}

TensorList LiveStage::backward(int64_t mb, const TensorList& grads,
                               const graph::ForwardOptions& options, const CoreBackward& core,
                               MicroBatchSource& source) {
  const LayerRange range = layout_.backward_range(stage_, mb);
  TensorList g = grads;
  bool core_done = false;
  auto run_core = [&] {
    g = core(g);
    core_done = true;
  };
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    Block& b = **it;
    if (!core_done && b.move.end <= core_.begin) run_core();
    if (!inside(b.move, range)) continue;
    const std::string waiter =
        "Backward(mb " + std::to_string(mb) + ") on stage " + std::to_string(stage_);
    if (!b.source && !b.handed_off) receive_handoff(b, waiter, source);
    STRATA_CHECK(b.live) << b.what << ": " << waiter << " after the layers left it";
    const auto p = b.pending.find(mb);
    STRATA_CHECK(p != b.pending.end())
        << b.what << ": " << waiter << " finds no forward of the moved layers";
    b.versions->use(p->second, b.latest, "Backward (moved layers)", mb);
    const auto shipped = b.shipped.find(mb);
    if (shipped != b.shipped.end()) {
      // Forwarded at the source: replay it here on the same inputs, weights and options (its
      // running statistics as they are: one forward updates them, at the source).
      Tensor buffers = b.store->bound_buffers(b.move.begin, b.move.end);
      const Tensor kept = buffers.defined() ? buffers.clone() : Tensor();
      graph::ForwardOptions o = options;
      o.weight_version = static_cast<uint64_t>(p->second);
      b.memory->forward(mb, shipped->second, o);
      if (kept.defined()) buffers.copy_from(kept);
      b.shipped.erase(shipped);
      ++stats_.replayed_backwards;
    }
    g = b.memory->backward(mb, g);
    b.pending.erase(p);
    b.grads_pending = true;
    release_unneeded(b);
  }
  if (!core_done) run_core();
  return g;
}

void LiveStage::release_unneeded(Block& b) {
  b.versions->release_if([&](int64_t version) {
    for (const auto& [mb, v] : b.pending) {
      if (v == version) return false;
    }
    return true;
  });
}

void LiveStage::reduce_over_groups(Block& b, int64_t step) {
  const std::string what = b.what + ": the all-reduce over the groups of update " +
                           std::to_string(step) + " on stage " + std::to_string(stage_);
  // On copies: a communicator may hold on to the tensors of a collective after its wait (the
  // local one until every rank has seen it), and the store's storages are to be freed at the
  // hand-off.
  Tensor grads = b.store->grads().clone();
  dp_->all_reduce(grads)->wait(dp_->timeout(), what + " (gradients)");
  b.store->grads().copy_from(grads);
  const Tensor& buffers = b.store->buffers();
  if (!buffers.defined() || buffers.numel() == 0) return;
  // x 1/G in double, as GroupedDp averages the core's statistics (float32, host memory: the
  // migration runs on CPU ranks only).
  STRATA_CHECK(buffers.dtype() == DType::kF32 && buffers.device().is_cpu())
      << what << ": the statistics must be float32 in host memory";
  Tensor sum = buffers.clone();
  dp_->all_reduce(sum)->wait(dp_->timeout(), what + " (running statistics)");
  const double factor = 1.0 / static_cast<double>(dp_->size());
  const float* in = sum.data<float>();
  float* out = buffers.data<float>();
  for (int64_t i = 0; i < buffers.numel(); ++i) out[i] = static_cast<float>(in[i] * factor);
}

double LiveStage::update(int64_t step) {
  double sq = 0.0;
  for (auto& bp : blocks_) {
    Block& b = *bp;
    if (!b.grads_pending) continue;
    if (dp_ != nullptr && dp_->size() > 1) reduce_over_groups(b, step);
    b.versions->restore_latest();
    for (const auto& [mb, v] : b.pending) {
      if (v == b.latest) {
        b.versions->stash(b.latest);  // still needed by a backward to come
        break;
      }
    }
    // The hand-off of a move up also carries the version before it: the target's first forward
    // of the layers (Forward(F), before its Backward(K - 1)) uses it by Eq. 4.
    const bool hands_off = b.source && b.latest + 1 == b.move.first_backward;
    const Tensor before =
        hands_off && b.move.tgt < b.move.src ? b.store->params().clone() : Tensor();
    double local = 0.0;
    b.optimizer->step(ctx_, step, [&local](double l) {
      local = l;
      return l;
    });
    b.store->zero_grads(ctx_);
    ++b.latest;
    b.grads_pending = false;
    sq += local;
    ++stats_.moved_updates;
    if (!hands_off) continue;
    // The last backward of the layers here is done: the hand-off, and the layers go.
    STRATA_CHECK(b.pending.empty())
        << b.what << ": stage " << stage_ << " hands off with " << b.pending.size()
        << " backwards of the moved layers still to run";
    STRATA_CHECK_EQ(b.memory->live_records(), 0)
        << b.what << ": stage " << stage_ << " hands off with saved tensors left";
    {
      std::vector<Tensor> handoff{b.store->params()};  // copied by post()
      for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
        handoff.push_back(b.store->state(s));
      }
      if (b.store->buffers().defined() && b.store->buffers().numel() > 0) {
        handoff.push_back(b.store->buffers());
      }
      if (before.defined()) handoff.push_back(before);
      b.transfer->post(b.move.first_forward - b.move.first_backward, handoff);
    }
    ++stats_.handoffs_sent;
    // The bytes given back: the block's store's storages (parameters, gradients, optimizer state,
    // buffers) whose last owner was the block. Counted by the storages themselves, not by the
    // allocator's bytes in use, which the transfer thread changes meanwhile (its chunks).
    std::vector<std::pair<std::weak_ptr<Storage>, size_t>> owned;
    auto own = [&owned](const Tensor& t) {
      if (!t.defined()) return;
      for (const auto& o : owned) {
        if (o.first.lock() == t.storage()) return;  // views of one storage count once
      }
      owned.emplace_back(t.storage(), t.storage()->nbytes());
    };
    own(b.store->params());
    own(b.store->grads());
    own(b.store->buffers());
    for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
      own(b.store->state(s));
    }
    b.memory.reset();
    b.versions.reset();
    b.optimizer.reset();
    b.store.reset();
    for (const auto& [storage, bytes] : owned) {
      if (storage.expired()) stats_.freed_bytes += bytes;
    }
    b.live = false;
    b.handed_off = true;
  }
  return sq;
}

std::vector<const graph::ParamStore*> LiveStage::stores() const {
  std::vector<const graph::ParamStore*> out;
  for (const auto& b : blocks_) {
    if (b->live) out.push_back(b->store.get());
  }
  return out;
}

void LiveStage::restore_latest() {
  for (auto& b : blocks_) {
    if (b->versions) b->versions->restore_latest();
  }
}

int64_t LiveStage::live_records() const {
  int64_t n = 0;
  for (const auto& b : blocks_) {
    if (b->memory) n += b->memory->live_records();
  }
  return n;
}

void LiveStage::finish() {
  for (auto& b : blocks_) {
    STRATA_CHECK(b->handed_off) << b->what << ": the run ended on stage " << stage_
                                << " before the hand-off (micro-batch " << b->move.first_backward
                                << "); migrate earlier in the run";
    STRATA_CHECK(b->pending.empty() && b->shipped.empty())
        << b->what << ": stage " << stage_ << " finished with " << b->pending.size()
        << " backwards of moved layers still to run";
    b->transfer->finish();
    const LiveTransferStats t = b->transfer->stats();
    (b->source ? stats_.bytes_sent : stats_.bytes_received) += t.bytes;
  }
}

}  // namespace strata::parallel
