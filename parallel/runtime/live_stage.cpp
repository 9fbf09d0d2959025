// LiveStage: a stage's side of a live migration under async-1f1b (see the header).
#include "parallel/runtime/live_stage.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <sstream>

#include "engine/check.h"
#include "parallel/grouped_dp.h"
#include "parallel/runtime/live_protocol.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

std::string layer_names(const graph::Model& model, size_t begin, size_t end) {
  std::string s = model.layer(begin).name();
  if (end - begin > 1) s += "-" + model.layer(end - 1).name();
  return s;
}

std::string layers_of(const graph::Model& model, const BoundaryMove& m) {
  std::ostringstream s;
  s << model.layer(m.begin).name();
  if (m.end - m.begin > 1) s << "-" << model.layer(m.end - 1).name();
  s << " " << m.src << "->" << m.tgt;
  return s.str();
}

}  // namespace

// One move of a block's layers to or from this stage.
struct LiveStage::Hop {
  BoundaryMove move;  // src, tgt, K and F of the boundary move; begin, end: the block's layers
  size_t migration = 0;
  bool source = false;
  bool handed_off = false;  // source: posted; target: received
  int64_t expected = 0;     // target: items whose layouts the transfer has
  std::unique_ptr<LiveTransfer> transfer;
  std::string what;
};

struct LiveStage::Block {
  size_t begin = 0, end = 0;  // the layers
  std::vector<Hop> hops;      // this stage's, in order
  size_t hop = 0;             // the next hop not done
  bool live = false;          // holds the layers now
  std::unique_ptr<graph::ParamStore> store;
  std::unique_ptr<graph::Optimizer> optimizer;
  std::unique_ptr<StageMemory> memory;
  std::unique_ptr<WeightVersions> versions;
  int64_t latest = 0;                     // updates applied to the layers
  std::map<int64_t, int64_t> pending;     // micro-batch -> version: backward still to run here
  std::map<int64_t, TensorList> shipped;  // target: the layers' inputs, by micro-batch
  bool grads_pending = false;             // a backward ran since the last update
  // The hop under way: the next one, while any is left.
  Hop* current() { return hop < hops.size() ? &hops[hop] : nullptr; }
  // The source hop whose micro-batches [K, F) include `mb`, if any.
  const Hop* shipping(int64_t mb) const {
    for (const Hop& h : hops) {
      if (h.source && mb >= h.move.first_backward && mb < h.move.first_forward) return &h;
    }
    return nullptr;
  }
};

std::vector<Partition> LiveStage::partitions(const LiveMigrationConfig& config) {
  std::vector<Partition> out{config.initial, config.next};
  for (const LiveMigrationStep& m : config.then) out.push_back(m.next);
  return out;
}

LayerRange LiveStage::core_range(const LiveMigrationConfig& config, int stage) {
  const LayerRange first = config.initial.at(static_cast<size_t>(stage));
  if (config.open) return {first.begin, first.begin};
  LayerRange core = first;
  for (const Partition& p : partitions(config)) {
    const LayerRange& r = p.at(static_cast<size_t>(stage));
    core = {std::max(core.begin, r.begin), std::min(core.end, r.end)};
  }
  if (core.begin >= core.end) return {first.begin, first.begin};  // it keeps none of its layers
  return core;
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
  STRATA_CHECK(config.comm != nullptr) << config.what << ": no migration communicator";
  STRATA_CHECK(config.make_store != nullptr) << config.what << ": no store maker";
  if (config.open) {  // every layer of the stage a block of its own, no hop yet
    const LayerRange r = config.initial.at(static_cast<size_t>(stage));
    for (size_t l = r.begin; l < r.end; ++l) {
      auto b = std::make_unique<Block>();
      b->begin = l;
      b->end = l + 1;
      b->live = true;
      make_block_stores(*b);
      blocks_.push_back(std::move(b));
    }
    return;
  }
  layout_.add_live_migration(config.next, config.first_backward);
  for (const LiveMigrationStep& m : config.then)
    layout_.add_live_migration(m.next, m.first_backward);
  // The pieces: maximal runs of layers with the same stage in every partition; those that change
  // stage are blocks, with a hop per migration that moves them. Every stage enumerates every hop
  // in the same order (a communicator split each, collective over the migration's).
  const std::vector<Partition> parts = partitions(config);
  auto owner = [&](size_t p, size_t layer) {
    for (size_t s = 0; s < parts[p].size(); ++s) {
      if (layer >= parts[p][s].begin && layer < parts[p][s].end) return static_cast<int>(s);
    }
    return -1;
  };
  auto owners = [&](size_t layer) {
    std::vector<int> o;
    for (size_t p = 0; p < parts.size(); ++p) o.push_back(owner(p, layer));
    return o;
  };
  const auto& moves = layout_.migrations();
  for (size_t begin = 0; begin < model.size();) {
    const std::vector<int> o = owners(begin);
    size_t end = begin + 1;
    while (end < model.size() && owners(end) == o) ++end;
    std::unique_ptr<Block> b;
    for (size_t i = 0; i + 1 < o.size(); ++i) {
      if (o[i] == o[i + 1]) continue;
      // The hop's two stages: ranks 0 and 1 (by stage) of a communicator of their own.
      const bool here = o[i] == stage || o[i + 1] == stage;
      std::unique_ptr<Communicator> comm = config.comm->split(here ? 0 : -1, stage);
      if (!here) continue;
      const BoundaryMove* whole = nullptr;
      for (const BoundaryMove& m : moves[i]) {
        if (m.begin <= begin && end <= m.end) whole = &m;
      }
      STRATA_CHECK(whole != nullptr && whole->src == o[i] && whole->tgt == o[i + 1])
          << config.what << ": layers [" << begin << ", " << end << ") are in no move of migration "
          << i + 1;
      if (b == nullptr) {
        b = std::make_unique<Block>();
        b->begin = begin;
        b->end = end;
        b->live = o[0] == stage;
      }
      std::string name = config.what;
      if (i > 0 && i - 1 < config.then.size()) name = config.then[i - 1].what;
      b->hops.push_back(make_hop(*whole, begin, end, i, *comm, name));
      hop_comms_.push_back(std::move(comm));
    }
    if (b != nullptr) {
      make_block_stores(*b);
      blocks_.push_back(std::move(b));
    }
    begin = end;
  }
}

LiveStage::Hop LiveStage::make_hop(const BoundaryMove& whole, size_t begin, size_t end,
                                   size_t migration, Communicator& comm, const std::string& name) {
  Hop h;
  h.move = whole;
  h.move.begin = begin;
  h.move.end = end;
  h.migration = migration;
  h.source = whole.src == stage_;
  h.what = name + " (" + layers_of(model_, h.move) + ")";
  // The inputs of micro-batches [K, F), then the hand-off.
  const int64_t items = h.move.first_forward - h.move.first_backward + 1;
  h.transfer = std::make_unique<LiveTransfer>(
      comm, 1 - comm.rank(), h.source ? LiveTransfer::Role::kSource : LiveTransfer::Role::kTarget,
      items, h.what, config_.transfer);
  return h;
}

void LiveStage::add_migration(const Partition& next, int64_t first_backward,
                              const std::string& what) {
  STRATA_CHECK(config_.open) << what << ": the run's migrations were laid out before it started";
  const size_t migration = layout_.migrations().size();
  layout_.add_live_migration(next, first_backward);
  // A hop per moved layer, every stage splitting the migration's communicator once per moved
  // layer, in the same order (boundaries, then layers, in order).
  for (const BoundaryMove& m : layout_.migrations().back()) {
    for (size_t l = m.begin; l < m.end; ++l) {
      const bool here = m.src == stage_ || m.tgt == stage_;
      std::unique_ptr<Communicator> comm = config_.comm->split(here ? 0 : -1, stage_);
      if (!here) continue;
      auto it = std::find_if(blocks_.begin(), blocks_.end(),
                             [l](const std::unique_ptr<Block>& b) { return b->begin >= l; });
      if (it == blocks_.end() || (*it)->begin != l) {  // the layer comes here for the first time
        STRATA_CHECK(m.tgt == stage_) << what << ": stage " << stage_ << " gives "
                                      << model_.layer(l).name() << ", which it never held";
        auto b = std::make_unique<Block>();
        b->begin = l;
        b->end = l + 1;
        it = blocks_.insert(it, std::move(b));
      }
      Block& b = **it;
      if (!b.live && b.store == nullptr) make_block_stores(b);  // to receive the hand-off into
      b.hops.push_back(make_hop(m, l, l + 1, migration, *comm, what));
      hop_comms_.push_back(std::move(comm));
    }
  }
}

void LiveStage::make_block_stores(Block& b) {
  const std::string what = config_.what + " (" + layer_names(model_, b.begin, b.end) + ")";
  b.store = config_.make_store(b.begin, b.end);
  STRATA_CHECK(b.store->begin() == b.begin && b.store->end() == b.end)
      << what << ": the store maker gave layers [" << b.store->begin() << ", " << b.store->end()
      << ")";
  STRATA_CHECK(b.store->tied_copies().empty())
      << what << ": the moved layers hold a tied parameter; keep them in place";
  b.store->ensure_state(graph::optimizer_slot_names(optimizer_).size());
  b.optimizer = std::make_unique<graph::Optimizer>(*b.store, optimizer_);
  b.memory =
      std::make_unique<StageMemory>(ctx_, model_, *b.store, b.begin, b.end, MemoryPlan(), nullptr);
  if (config_.layer_observer) b.memory->set_layer_observer(config_.layer_observer);
  b.versions = std::make_unique<WeightVersions>(ctx_, *b.store);
}

LiveStage::~LiveStage() = default;

void LiveStage::expect_items(Block& b, Hop& h, int64_t up_to, MicroBatchSource& source) {
  if (h.source || h.handed_off || b.store == nullptr) return;
  const BoundaryMove& m = h.move;
  const int64_t inputs = m.first_forward - m.first_backward;
  if (h.expected > inputs) return;
  // The inputs of micro-batches up to `up_to` (asked for as the target reaches them: the rows of
  // a later one would make the data loader skip ahead), then the hand-off.
  const graph::TensorSpecs& specs = model_.specs_before(m.begin);
  while (h.expected < inputs && m.first_backward + h.expected <= up_to) {
    const int64_t j = m.first_backward + h.expected;
    std::vector<std::pair<Shape, DType>> layout;
    for (const auto& spec : specs) {
      Shape shape{source.info(j).rows};
      shape.insert(shape.end(), spec.shape.begin(), spec.shape.end());
      layout.push_back({shape, spec.dtype});
    }
    layout.push_back({b.store->params().shape(), b.store->params().dtype()});
    h.transfer->expect(h.expected++, layout);
  }
  if (h.expected != inputs) return;
  std::vector<std::pair<Shape, DType>> handoff{
      {b.store->params().shape(), b.store->params().dtype()}};
  for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
    handoff.push_back({b.store->state(s).shape(), b.store->state(s).dtype()});
  }
  if (b.store->buffers().defined() && b.store->buffers().numel() > 0) {
    handoff.push_back({b.store->buffers().shape(), b.store->buffers().dtype()});
  }
  if (m.tgt < m.src) handoff.push_back({b.store->params().shape(), b.store->params().dtype()});
  h.transfer->expect(h.expected++, handoff);
}

void LiveStage::receive_handoff(Block& b, const std::string& waiter, MicroBatchSource& source) {
  Hop* hp = b.current();
  STRATA_CHECK(hp != nullptr && !hp->source)
      << config_.what << ": " << waiter << " needs " << layer_names(model_, b.begin, b.end)
      << ", which no migration brings to stage " << stage_;
  Hop& h = *hp;
  expect_items(b, h, h.move.first_forward, source);
  const auto start = Clock::now();
  const BoundaryMove& m = h.move;
  const int S = layout_.stages();
  const auto on_device = [&](const Tensor& host) {
    Tensor t = Tensor::empty(host.shape(), host.dtype(), &ctx_.allocator());
    t.copy_from(host);
    return t;
  };
  // The shipped micro-batches: their inputs, and the weights their forward used at the source
  // (Eq. 4 there) as stashed versions.
  for (int64_t j = m.first_backward; j < m.first_forward; ++j) {
    std::vector<Tensor> item = h.transfer->wait(j - m.first_backward, waiter);
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
      h.transfer->wait(m.first_forward - m.first_backward, waiter + " (the hand-off)");
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
  h.handed_off = true;
  ++b.hop;
  ++stats_.handoffs_received;
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  stats_.handoff_wait_seconds += waited;
  stats_.migration_wait_seconds.resize(layout_.migrations().size(), 0.0);
  stats_.migration_wait_seconds[h.migration] += waited;
}

TensorList LiveStage::forward(int64_t mb, const TensorList& inputs,
                              const graph::ForwardOptions& options, const CoreForward& core,
                              MicroBatchSource& source) {
  for (auto& b : blocks_) {
    for (Hop& h : b->hops) expect_items(*b, h, mb, source);
  }
  const LayerRange range = layout_.forward_range(stage_, mb);
  TensorList x = inputs;
  bool core_done = false;
  auto run_core = [&] {
    x = core(x);
    core_done = true;
  };
  for (auto& bp : blocks_) {
    Block& b = *bp;
    if (!core_done && b.begin >= core_.end) run_core();
    if (!(b.begin >= range.begin && b.end <= range.end)) continue;
    const std::string waiter =
        "Forward(mb " + std::to_string(mb) + ") on stage " + std::to_string(stage_);
    if (!b.live) receive_handoff(b, waiter, source);
    // Eq. 4: the version of the stage that runs the forward.
    const int64_t version = async_forward_version(layout_.stages(), stage_, mb);
    b.versions->use(version, b.latest, "Forward (moved layers)", mb);
    graph::ForwardOptions o = options;
    o.weight_version = static_cast<uint64_t>(version);
    const TensorList in = x;
    x = b.memory->forward(mb, in, o);
    if (const Hop* h = b.shipping(mb)) {
      // Its backward runs on the target: the inputs and the weights go there, the tapes go.
      std::vector<Tensor> item;
      for (const Tensor& t : in) {
        STRATA_CHECK(t.defined()) << h->what << ": an undefined input of the moved layers";
        item.push_back(t);
      }
      item.push_back(b.store->params());
      h->transfer->post(mb - h->move.first_backward, item);
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
    if (!core_done && b.end <= core_.begin) run_core();
    if (!(b.begin >= range.begin && b.end <= range.end)) continue;
    const std::string waiter =
        "Backward(mb " + std::to_string(mb) + ") on stage " + std::to_string(stage_);
    if (!b.live) receive_handoff(b, waiter, source);
    const auto p = b.pending.find(mb);
    STRATA_CHECK(p != b.pending.end()) << config_.what << ": " << waiter << " finds no forward of "
                                       << layer_names(model_, b.begin, b.end);
    b.versions->use(p->second, b.latest, "Backward (moved layers)", mb);
    const auto shipped = b.shipped.find(mb);
    if (shipped != b.shipped.end()) {
      // Forwarded at the source: replay it here on the same inputs, weights and options (its
      // running statistics as they are: one forward updates them, at the source).
      Tensor buffers = b.store->bound_buffers(b.begin, b.end);
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
  const std::string what = config_.what + " (" + layer_names(model_, b.begin, b.end) +
                           "): the all-reduce over the groups of update " + std::to_string(step) +
                           " on stage " + std::to_string(stage_);
  // On copies: a communicator may hold on to the tensors of a collective after its wait (the
  // local one until every rank has seen it), and the store's storages are to be freed at the
  // hand-off.
  Tensor grads = b.store->grads().clone();
  dp_->all_reduce(grads)->wait(dp_->timeout(), what + " (gradients)");
  b.store->grads().copy_from(grads);
  const Tensor& buffers = b.store->buffers();
  if (!buffers.defined() || buffers.numel() == 0) return;
  // The sum x 1/G, as GroupedDp averages the stage's own statistics.
  Tensor sum = buffers.clone();
  dp_->all_reduce(sum)->wait(dp_->timeout(), what + " (running statistics)");
  buffers.copy_from(sum);
  scale_in_place(buffers, 1.0 / static_cast<double>(dp_->size()));
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
    const Hop* h = b.current();
    const bool hands_off = h != nullptr && h->source && b.latest + 1 == h->move.first_backward;
    const Tensor before =
        hands_off && h->move.tgt < h->move.src ? b.store->params().clone() : Tensor();
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
    if (hands_off) hand_off(b, before);
  }
  return sq;
}

void LiveStage::hand_off(Block& b, const Tensor& before) {
  Hop& h = *b.current();
  // The last backward of the layers here is done: the hand-off, and the layers go.
  STRATA_CHECK(b.pending.empty()) << h.what << ": stage " << stage_ << " hands off with "
                                  << b.pending.size()
                                  << " backwards of the moved layers still to run";
  STRATA_CHECK_EQ(b.memory->live_records(), 0)
      << h.what << ": stage " << stage_ << " hands off with saved tensors left";
  {
    std::vector<Tensor> handoff{b.store->params()};  // copied by post()
    for (size_t s = 0; s < graph::optimizer_slot_names(optimizer_).size(); ++s) {
      handoff.push_back(b.store->state(s));
    }
    if (b.store->buffers().defined() && b.store->buffers().numel() > 0) {
      handoff.push_back(b.store->buffers());
    }
    if (before.defined()) handoff.push_back(before);
    h.transfer->post(h.move.first_forward - h.move.first_backward, handoff);
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
  // Its statistics stay with this stage; the layers' bytes are their new stage's to report.
  StageMemoryStats times = b.memory->stats();
  std::fill(times.layer_output_bytes.begin(), times.layer_output_bytes.end(), 0.0);
  std::fill(times.layer_activation_bytes.begin(), times.layer_activation_bytes.end(), 0.0);
  if (handed_.layer_forward_seconds.empty()) {
    for (auto* v : {&handed_.layer_forward_seconds, &handed_.layer_backward_seconds,
                    &handed_.layer_output_bytes, &handed_.layer_activation_bytes}) {
      v->assign(model_.size(), 0.0);
    }
  }
  add_memory_counters(times, &handed_);
  parallel::add_layer_stats(times, &handed_);
  b.memory.reset();
  b.versions.reset();
  b.optimizer.reset();
  b.store.reset();
  for (const auto& [storage, bytes] : owned) {
    if (storage.expired()) stats_.freed_bytes += bytes;
  }
  b.live = false;
  h.handed_off = true;
  ++b.hop;
  // The layers come back in a later migration: stores to receive them into.
  if (b.current() != nullptr) make_block_stores(b);
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

void LiveStage::add_layer_stats(StageMemoryStats* whole) const {
  for (const auto& b : blocks_) {
    if (!b->memory) continue;
    const StageMemoryStats part = b->memory->stats();
    add_memory_counters(part, whole);
    parallel::add_layer_stats(part, whole);
  }
  if (handed_.layer_forward_seconds.empty()) return;
  add_memory_counters(handed_, whole);
  parallel::add_layer_stats(handed_, whole);
}

int64_t LiveStage::live_records() const {
  int64_t n = 0;
  for (const auto& b : blocks_) {
    if (b->memory) n += b->memory->live_records();
  }
  return n;
}

void LiveStage::finish() {
  stats_.migration_bytes.assign(layout_.migrations().size(), 0);
  stats_.migration_wait_seconds.resize(layout_.migrations().size(), 0.0);
  for (auto& b : blocks_) {
    for (Hop& h : b->hops) {
      STRATA_CHECK(h.handed_off) << h.what << ": the run ended on stage " << stage_
                                 << " before the hand-off (micro-batch " << h.move.first_backward
                                 << "); migrate earlier in the run";
      h.transfer->finish();
      const LiveTransferStats t = h.transfer->stats();
      (h.source ? stats_.bytes_sent : stats_.bytes_received) += t.bytes;
      stats_.migration_bytes[h.migration] += t.bytes;
    }
    STRATA_CHECK(b->pending.empty() && b->shipped.empty())
        << config_.what << ": stage " << stage_ << " finished with " << b->pending.size()
        << " backwards of moved layers still to run";
  }
}

}  // namespace strata::parallel
