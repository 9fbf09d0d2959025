// Re-layout of a stage's store: kept layers copied, moved layers exchanged (see the header).
#include "parallel/runtime/relayout.h"

#include <chrono>
#include <map>

#include "engine/check.h"
#include "parallel/comm/link_queue.h"

namespace strata::parallel {
namespace {

// Tags wrap below the communicators' limit (32768); messages of one pair and tag arrive in the
// order they were sent, and both sides walk the tensors in the same order.
constexpr int kTagSpan = 16384;

int stage_of(const Partition& p, size_t layer) {
  for (size_t s = 0; s < p.size(); ++s) {
    if (layer >= p[s].begin && layer < p[s].end) return static_cast<int>(s);
  }
  return -1;
}

void check_partition(const Partition& p, size_t layers, const char* which) {
  size_t next = 0;
  for (const LayerRange& r : p) {
    STRATA_CHECK(r.begin == next && r.begin < r.end)
        << "relayout: the " << which << " partition is not a cover of the layers in order";
    next = r.end;
  }
  STRATA_CHECK(layers == 0 || next == layers)
      << "relayout: the " << which << " partition ends at layer " << next << " of " << layers;
}

// Index of the entry named `name` among `entries`, or -1.
int find_entry(const std::vector<graph::ParamStore::Entry>& entries, const std::string& name) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].full_name() == name) return static_cast<int>(i);
  }
  return -1;
}

// The tensors a parameter entry carries: value, gradient, optimizer state.
std::vector<Tensor> param_tensors(const graph::ParamStore& store, size_t i) {
  std::vector<Tensor> t{store.param(i), store.grad(i)};
  for (size_t s = 0; s < store.state_slots(); ++s) t.push_back(store.state_view(s, i));
  return t;
}

}  // namespace

std::vector<LayerMove> layer_moves(const Partition& from, const Partition& to) {
  STRATA_CHECK_EQ(from.size(), to.size())
      << "relayout: " << from.size() << " stages before, " << to.size() << " after";
  check_partition(from, 0, "current");
  check_partition(to, from.empty() ? 0 : from.back().end, "new");
  std::vector<LayerMove> moves;
  const size_t layers = from.empty() ? 0 : from.back().end;
  for (size_t l = 0; l < layers; ++l) {
    const int a = stage_of(from, l), b = stage_of(to, l);
    if (a != b) moves.push_back({l, a, b});
  }
  return moves;
}

std::string describe_moves(const std::vector<LayerMove>& moves,
                           const std::vector<std::string>& names) {
  std::string text;
  for (const LayerMove& m : moves) {
    text += (text.empty() ? "" : ", ") + names.at(m.layer) + " " + std::to_string(m.from_stage) +
            "->" + std::to_string(m.to_stage);
  }
  return text.empty() ? "nothing" : text;
}

std::unique_ptr<graph::ParamStore> relayout_store(graph::Model& model, const graph::ParamStore& old,
                                                  const Partition& from, const Partition& to,
                                                  int stage, Communicator* pipe,
                                                  Allocator& allocator, RelayoutStats* stats,
                                                  int tag_base) {
  const auto start = std::chrono::steady_clock::now();
  const TrafficClassScope bulk(TrafficClass::kBulk);  // below training on an emulated link
  const std::vector<LayerMove> moves = layer_moves(from, to);
  STRATA_CHECK(stage >= 0 && static_cast<size_t>(stage) < to.size())
      << "relayout: stage " << stage << " of " << to.size();
  STRATA_CHECK(old.begin() == from[stage].begin && old.end() == from[stage].end)
      << "relayout: stage " << stage << "'s store holds layers [" << old.begin() << ", "
      << old.end() << "), its partition says [" << from[stage].begin << ", " << from[stage].end
      << ")";
  STRATA_CHECK(moves.empty() || pipe != nullptr) << "relayout: layers move but there is no pipe";
  auto store = std::make_unique<graph::ParamStore>(model, to[stage].begin, to[stage].end, allocator,
                                                   old.params().dtype(), old.compute_dtype());
  store->ensure_state(old.state_slots());
  // The layers kept: their entries' values copied from the old store (an alias keeps its owner's).
  const auto& new_params = store->param_entries();
  const auto& old_params = old.param_entries();
  for (size_t i = 0; i < new_params.size(); ++i) {
    const size_t l = new_params[i].layer_index;
    if (new_params[i].alias || l < from[stage].begin || l >= from[stage].end) continue;
    const int j = find_entry(old_params, new_params[i].full_name());
    STRATA_CHECK(j >= 0) << "relayout: " << new_params[i].full_name() << " is not in the store";
    const std::vector<Tensor> src = param_tensors(old, static_cast<size_t>(j));
    const std::vector<Tensor> dst = param_tensors(*store, i);
    for (size_t k = 0; k < src.size(); ++k) dst[k].copy_from(src[k]);
  }
  for (size_t i = 0; i < store->buffer_entries().size(); ++i) {
    const size_t l = store->buffer_entries()[i].layer_index;
    if (l < from[stage].begin || l >= from[stage].end) continue;
    const int j = find_entry(old.buffer_entries(), store->buffer_entries()[i].full_name());
    STRATA_CHECK(j >= 0) << "relayout: buffer " << store->buffer_entries()[i].full_name()
                         << " is not in the store";
    store->buffer(i).copy_from(old.buffer(static_cast<size_t>(j)));
  }
  // The layers moved: every stage walks the same list of tensors, numbering them for tags.
  std::vector<std::unique_ptr<Request>> sends;
  std::vector<Tensor> outgoing;  // kept alive until the sends complete
  RelayoutStats local;
  int tag = tag_base;
  const std::string what = "relayout of stage " + std::to_string(stage);
  for (const LayerMove& m : moves) {
    const graph::Layer& layer = model.layer(m.layer);
    const bool sends_it = m.from_stage == stage, receives_it = m.to_stage == stage;
    auto exchange = [&](const std::vector<Tensor>& src, const std::vector<Tensor>& dst,
                        bool skip_copy) {
      for (size_t k = 0; k < std::max(src.size(), dst.size()); ++k, ++tag) {
        if (sends_it) {
          outgoing.push_back(src[k].contiguous());
          sends.push_back(pipe->isend(outgoing.back(), m.to_stage, tag % kTagSpan));
          local.bytes_sent += outgoing.back().nbytes();
        }
        if (receives_it) {
          Tensor in = Tensor::empty(dst[k].shape(), dst[k].dtype());
          pipe->irecv(in, m.from_stage, tag % kTagSpan)
              ->wait(pipe->timeout(),
                     what + ": " + layer.name() + " from stage " + std::to_string(m.from_stage));
          if (!skip_copy) dst[k].copy_from(in);
          local.bytes_received += in.nbytes();
        }
      }
    };
    for (const graph::ParamSpec& spec : layer.param_specs()) {
      const std::string name = layer.name() + "." + spec.name;
      std::vector<Tensor> src, dst;
      bool alias = false;
      if (sends_it) {
        const int j = find_entry(old_params, name);
        STRATA_CHECK(j >= 0) << what << ": " << name << " is not in the store";
        src = param_tensors(old, static_cast<size_t>(j));
      }
      if (receives_it) {
        const int i = find_entry(new_params, name);
        STRATA_CHECK(i >= 0) << what << ": " << name << " is not in the new store";
        dst = param_tensors(*store, static_cast<size_t>(i));
        alias = new_params[static_cast<size_t>(i)].alias;
      }
      if (sends_it || receives_it) {
        exchange(src, dst, alias);
      } else {
        tag += static_cast<int>(2 + old.state_slots());
      }
    }
    for (const graph::ParamSpec& spec : layer.buffer_specs()) {
      const std::string name = layer.name() + "." + spec.name;
      std::vector<Tensor> src, dst;
      if (sends_it) {
        const int j = find_entry(old.buffer_entries(), name);
        STRATA_CHECK(j >= 0) << what << ": buffer " << name << " is not in the store";
        src = {old.buffer(static_cast<size_t>(j))};
      }
      if (receives_it) {
        const int i = find_entry(store->buffer_entries(), name);
        STRATA_CHECK(i >= 0) << what << ": buffer " << name << " is not in the new store";
        dst = {store->buffer(static_cast<size_t>(i))};
      }
      if (sends_it || receives_it) {
        exchange(src, dst, false);
      } else {
        ++tag;
      }
    }
  }
  for (auto& r : sends) r->wait(pipe->timeout(), what + " (sends)");
  local.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stats != nullptr) *stats = local;
  return store;
}

}  // namespace strata::parallel
