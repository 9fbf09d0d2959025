// StageMemory: records of saved tensors per micro-batch and layer; swap and recompute.
#include "parallel/runtime/stage_memory.h"

#include <algorithm>
#include <chrono>

#include "engine/check.h"
#include "parallel/trace.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// A saved tensor of a swapped layer while its bytes are away: which storage of the micro-batch,
// and the view's geometry over it. A tensor that is not the device allocator's (nothing to gain
// by moving it) or is undefined stays as it was, in `kept`.
struct StageMemory::SavedView {
  int storage = -1;
  Tensor kept;
  int64_t offset = 0;
  Shape shape, strides;
  DType dtype = DType::kF32;
};

// A storage of a micro-batch's swapped layers, copied out once however many views and layers
// refer to it.
struct StageMemory::SwapStorage {
  std::weak_ptr<Storage> device;          // the original, while something holds it
  std::shared_ptr<CopyEngine::Copy> out;  // to the host pool
  std::shared_ptr<CopyEngine::Copy> in;   // back to the device, once started
  int users = 0;                          // swapped layers whose backward has not run
};

struct StageMemory::LayerRecord {
  MemoryPolicy policy = MemoryPolicy::kKeep;
  LayerTape tape;
  bool live = false;     // created by the forward, not yet consumed by the backward
  bool away = false;     // swap: the tape's tensors are in the host pool (views below)
  bool dropped = false;  // recompute: the tape is dropped until the segment is replayed
  std::vector<SavedView> views;
  std::vector<int> storages;  // swap: the micro-batch's storages this layer refers to, once each
};

struct StageMemory::MicroBatch {
  int64_t id = 0;
  std::vector<LayerRecord> layers;           // the stage's layers, in order
  graph::ForwardOptions options;             // to replay recompute segments
  std::map<size_t, TensorList> checkpoints;  // a recompute segment's first layer -> its inputs
  std::vector<SwapStorage> storages;
};

StageMemory::StageMemory(ExecContext& ctx, graph::Model& model, graph::ParamStore& store,
                         size_t begin, size_t end, MemoryPlan plan, CopyEngine* copies,
                         Trace* trace)
    : ctx_(ctx),
      model_(model),
      store_(store),
      begin_(begin),
      end_(end),
      plan_(std::move(plan)),
      copies_(copies),
      trace_(trace) {
  // Empty: a stage whose layers all move live (its forwards and backwards pass through here).
  STRATA_CHECK(begin <= end && end <= model.size())
      << "stage memory: layer range [" << begin << ", " << end << ")";
  swaps_ = plan_.uses(MemoryPolicy::kSwap, begin, end);
  stats_.first_layer = begin;
  stats_.layer_forward_seconds.assign(end - begin, 0.0);
  stats_.layer_backward_seconds.assign(end - begin, 0.0);
  stats_.layer_output_bytes.assign(end - begin, 0.0);
  stats_.layer_activation_bytes.assign(end - begin, 0.0);
  STRATA_CHECK(!swaps_ || copies_ != nullptr)
      << "stage memory: layers " << begin << "-" << end - 1 << " swap but no copy engine is given";
  // Device memory that swap-outs still hold goes before an allocation is refused.
  if (swaps_) ctx_.allocator().set_pressure_handler([this](size_t) { return relieve_pressure(); });
}

StageMemory::~StageMemory() {
  if (swaps_) ctx_.allocator().set_pressure_handler(nullptr);
  micro_batches_.clear();
}

void StageMemory::set_prefetch_layers(int layers) {
  STRATA_CHECK_GE(layers, 1) << "stage memory: prefetch depth";
  prefetch_layers_ = layers;
}

StageMemory::MicroBatch& StageMemory::micro_batch(int64_t mb) {
  auto it = micro_batches_.find(mb);
  STRATA_CHECK(it != micro_batches_.end())
      << "stage memory: micro-batch " << mb << " has no records on layers " << begin_ << "-"
      << end_ - 1 << " (backward before forward?)";
  return *it->second;
}

int64_t StageMemory::live_records() const {
  int64_t n = 0;
  for (const auto& [mb, m] : micro_batches_) {
    for (const LayerRecord& r : m->layers) n += r.live ? 1 : 0;
  }
  return n;
}

void StageMemory::record_layer_bytes(size_t layer, const TensorList& outputs,
                                     const LayerTape& tape) {
  double out = 0.0, saved = 0.0, rows = 0.0;
  for (const Tensor& t : outputs) {
    if (!t.defined()) continue;
    out += static_cast<double>(t.nbytes());
    if (rows == 0.0 && !t.shape().empty()) rows = static_cast<double>(t.shape()[0]);
  }
  for (const Tensor& t : tape.saved) {
    if (t.defined()) saved += static_cast<double>(t.nbytes());
  }
  rows = std::max(rows, 1.0);
  stats_.layer_output_bytes[layer - begin_] = out / rows;
  stats_.layer_activation_bytes[layer - begin_] = (out + saved) / rows;
}

TensorList StageMemory::forward(int64_t mb, const TensorList& inputs,
                                const graph::ForwardOptions& options) {
  STRATA_CHECK(options.keep_tape && options.training)
      << "stage memory: records are for training forwards";
  STRATA_CHECK(!holds(mb)) << "stage memory: micro-batch " << mb << " forwarded twice";
  // The swap-outs of earlier micro-batches are done before this one's forward starts, so that
  // at most one micro-batch's swapped tensors are on their way out (what the memory model
  // counts): copies slower than compute hold compute back here (vPIPE Eq. 2's exposed swap)
  // rather than device memory.
  if (swaps_) {
    const auto start = Clock::now();
    copies_->drain_to_host();
    stats_.swap_wait_seconds += seconds_since(start);
  }
  auto owned = std::make_unique<MicroBatch>();
  MicroBatch& m = *owned;
  micro_batches_[mb] = std::move(owned);
  stats_.max_micro_batches = std::max(stats_.max_micro_batches, live_micro_batches());
  m.id = mb;
  m.options = options;
  m.layers.resize(end_ - begin_);
  TensorList x = inputs;
  for (size_t i = begin_; i < end_; ++i) {
    LayerRecord& record = m.layers[i - begin_];
    record.policy = plan_.at(i);
    const bool segment_start = record.policy == MemoryPolicy::kRecompute &&
                               (i == begin_ || plan_.at(i - 1) != MemoryPolicy::kRecompute);
    if (segment_start) m.checkpoints[i] = x;
    const auto layer_start = Clock::now();
    x = model_.forward_layer(ctx_, i, x, record.tape, options);
    if (layer_observer_) layer_observer_(i, false, options.step, seconds_since(layer_start));
    stats_.layer_forward_seconds[i - begin_] += seconds_since(layer_start);
    record_layer_bytes(i, x, record.tape);
    record.live = true;
    ++stats_.records_created;
    if (record.policy == MemoryPolicy::kRecompute) {
      record.tape.clear();
      record.dropped = true;
    } else if (record.policy == MemoryPolicy::kSwap) {
      swap_out(m, record);
    }
  }
  return x;
}

void StageMemory::swap_out(MicroBatch& m, LayerRecord& record) {
  Allocator& device = ctx_.allocator();
  for (const Tensor& t : record.tape.saved) {
    SavedView v;
    if (!t.defined() || &t.storage()->allocator() != &device) {
      v.kept = t;
      record.views.push_back(std::move(v));
      continue;
    }
    const std::shared_ptr<Storage>& storage = t.storage();
    int k = -1;
    for (size_t j = 0; j < m.storages.size() && k < 0; ++j) {
      if (m.storages[j].device.lock() == storage) k = static_cast<int>(j);
    }
    if (k < 0) {
      SwapStorage s;
      s.device = storage;
      s.out = copies_->to_host(storage);
      stats_.swapped_out_bytes += storage->nbytes();
      m.storages.push_back(std::move(s));
      k = static_cast<int>(m.storages.size()) - 1;
    }
    if (std::find(record.storages.begin(), record.storages.end(), k) == record.storages.end()) {
      record.storages.push_back(k);
      ++m.storages[k].users;
    }
    v.storage = k;
    v.offset = t.offset();
    v.shape = t.shape();
    v.strides = t.strides();
    v.dtype = t.dtype();
    record.views.push_back(std::move(v));
  }
  record.tape.saved.clear();  // the copies hold the device storages until they are done
  record.away = true;
}

void StageMemory::start_copy_in(MicroBatch& m, size_t layer) {
  LayerRecord& record = m.layers[layer - begin_];
  if (!record.away) return;
  for (const SavedView& v : record.views) {
    if (v.storage < 0) continue;
    SwapStorage& s = m.storages[v.storage];
    if (s.in != nullptr) continue;
    s.in = copies_->to_device(s.out->destination(), s.out);
    stats_.swapped_in_bytes += s.in->bytes();
  }
}

void StageMemory::prefetch_below(MicroBatch& m, size_t below) {
  int started = 0;
  for (size_t i = below; i-- > begin_ && started < prefetch_layers_;) {
    if (!m.layers[i - begin_].away) continue;
    start_copy_in(m, i);
    ++started;
  }
}

void StageMemory::prefetch(int64_t mb) {
  if (!swaps_) return;
  if (drain_before_swap_in_) {
    const auto start = Clock::now();
    copies_->drain_to_host();
    stats_.swap_wait_seconds += seconds_since(start);
  }
  prefetch_below(micro_batch(mb), end_);
}

void StageMemory::bring_back(MicroBatch& m, LayerRecord& record) {
  const auto start = Clock::now();
  TensorList saved;
  for (const SavedView& v : record.views) {
    if (v.storage < 0) {
      saved.push_back(v.kept);
      continue;
    }
    SwapStorage& s = m.storages[v.storage];
    copies_->order_before_compute(*s.in);
    saved.emplace_back(s.in->destination(), v.offset, v.shape, v.strides, v.dtype);
  }
  record.tape.saved = std::move(saved);
  record.views.clear();
  record.away = false;
  stats_.swap_wait_seconds += seconds_since(start);
}

void StageMemory::replay(MicroBatch& m, size_t segment_begin, size_t segment_end) {
  const auto start = Clock::now();
  // Batch norm updates its running statistics in every training forward: the replay's update
  // is undone, so that they move once per micro-batch, as without recompute.
  const Tensor buffers = store_.bound_buffers(segment_begin, segment_end);
  const Tensor before = buffers.defined() ? buffers.clone() : Tensor();
  auto checkpoint = m.checkpoints.find(segment_begin);
  STRATA_CHECK(checkpoint != m.checkpoints.end())
      << "stage memory: no checkpoint for the recompute segment starting at layer "
      << model_.layer(segment_begin).name();
  TensorList x = std::move(checkpoint->second);
  m.checkpoints.erase(checkpoint);
  for (size_t j = segment_begin; j < segment_end; ++j) {
    LayerRecord& record = m.layers[j - begin_];
    x = model_.forward_layer(ctx_, j, x, record.tape, m.options);
    record.dropped = false;
  }
  if (before.defined()) buffers.copy_from(before);
  stats_.recompute_seconds += seconds_since(start);
  stats_.recomputed_layers += static_cast<int64_t>(segment_end - segment_begin);
}

TensorList StageMemory::backward(int64_t mb, const TensorList& grad_outputs,
                                 const std::function<void(size_t)>& after_layer) {
  MicroBatch& m = micro_batch(mb);
  TensorList grads = grad_outputs;
  if (swaps_) prefetch_below(m, end_);  // no SwapIn ahead: the first copies start now
  for (size_t i = end_; i-- > begin_;) {
    const auto layer_start = Clock::now();
    LayerRecord& record = m.layers[i - begin_];
    STRATA_CHECK(record.live) << "stage memory: layer " << model_.layer(i).name()
                              << " of micro-batch " << mb << " has no record";
    if (record.dropped) {
      size_t first = i;
      while (first > begin_ && plan_.at(first - 1) == MemoryPolicy::kRecompute &&
             m.layers[first - 1 - begin_].dropped) {
        --first;
      }
      replay(m, first, i + 1);
    }
    if (record.away) {
      start_copy_in(m, i);
      bring_back(m, record);
      prefetch_below(m, i);  // the next swapped layers' copies run during this backward
    }
    grads = model_.backward_layer(ctx_, i, grads, record.tape);
    release(m, i);
    if (layer_observer_) layer_observer_(i, true, m.options.step, seconds_since(layer_start));
    stats_.layer_backward_seconds[i - begin_] += seconds_since(layer_start);
    if (after_layer) after_layer(i);
  }
  STRATA_CHECK(m.checkpoints.empty()) << "stage memory: micro-batch " << mb
                                      << " kept a recompute checkpoint its backward never used";
  micro_batches_.erase(mb);
  return grads;
}

void StageMemory::release(MicroBatch& m, size_t layer) {
  LayerRecord& record = m.layers[layer - begin_];
  record.tape.clear();
  record.live = false;
  ++stats_.records_released;
  // A storage no swapped layer still needs: its host copy goes back to the pool, and the device
  // copy goes with the tapes that held it.
  for (int k : record.storages) {
    SwapStorage& s = m.storages[k];
    if (--s.users > 0) continue;
    if (trace_ != nullptr) {
      const std::string what = model_.layer(layer).name() + " " + std::to_string(m.id);
      trace_->record_span("swap out " + what, s.out->issued(), s.out->completed(),
                          Trace::kSwapLane);
      if (s.in != nullptr) {
        trace_->record_span("swap in " + what, s.in->issued(), s.in->completed(), Trace::kSwapLane);
      }
    }
    s.in.reset();
    s.out.reset();
  }
  record.storages.clear();
}

void StageMemory::drop(int64_t mb) {
  auto it = micro_batches_.find(mb);
  if (it == micro_batches_.end()) return;
  for (const LayerRecord& r : it->second->layers) stats_.records_released += r.live ? 1 : 0;
  micro_batches_.erase(it);
}

void StageMemory::poll() {
  if (copies_ != nullptr) copies_->poll();
}

bool StageMemory::relieve_pressure() { return copies_ != nullptr && copies_->drain_to_host(); }

void add_memory_counters(const StageMemoryStats& part, StageMemoryStats* total) {
  total->records_created += part.records_created;
  total->records_released += part.records_released;
  total->max_micro_batches = std::max(total->max_micro_batches, part.max_micro_batches);
  total->swapped_out_bytes += part.swapped_out_bytes;
  total->swapped_in_bytes += part.swapped_in_bytes;
  total->recompute_seconds += part.recompute_seconds;
  total->recomputed_layers += part.recomputed_layers;
  total->swap_wait_seconds += part.swap_wait_seconds;
}

void add_layer_stats(const StageMemoryStats& part, StageMemoryStats* whole) {
  for (size_t i = 0; i < part.layer_forward_seconds.size(); ++i) {
    const size_t l = part.first_layer + i - whole->first_layer;
    whole->layer_forward_seconds.at(l) += part.layer_forward_seconds[i];
    whole->layer_backward_seconds.at(l) += part.layer_backward_seconds[i];
    if (part.layer_output_bytes[i] > 0)
      whole->layer_output_bytes.at(l) = part.layer_output_bytes[i];
    if (part.layer_activation_bytes[i] > 0) {
      whole->layer_activation_bytes.at(l) = part.layer_activation_bytes[i];
    }
  }
}

}  // namespace strata::parallel
