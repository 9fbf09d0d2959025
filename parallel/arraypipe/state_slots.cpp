#include "parallel/arraypipe/state_slots.h"

#include <algorithm>
#include <chrono>

#include "engine/check.h"

namespace strata::parallel::arraypipe {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A flat buffer whose storage it covers whole (the copy engine moves whole storages).
void check_whole(const Tensor& t, int job) {
  STRATA_CHECK(t.offset() == 0 && t.storage()->nbytes() == t.nbytes())
      << "array memory: job " << job << "'s state buffer is a view, not a whole storage";
}

}  // namespace

std::vector<Tensor*> state_values(graph::ParamStore& store) {
  graph::ParamStore::FlatBuffers f = store.flat_buffers();
  std::vector<Tensor*> values{f.params, f.buffers};
  values.insert(values.end(), f.state.begin(), f.state.end());
  if (f.working_params != nullptr) values.push_back(f.working_params);
  return values;
}

size_t block_state_bytes(graph::ParamStore& store) {
  size_t bytes = 0;
  for (const Tensor* t : state_values(store)) bytes += t->nbytes();
  bytes += store.params().nbytes();  // the gradients (f32, like the parameters)
  if (store.mixed()) bytes += store.working_params().nbytes();  // the working gradients
  return bytes;
}

namespace {

// The gradients are zero between a job's blocks (its update zeroes them inside its backward
// block): they leave with the state and come back as zeros.
void drop_grads(graph::ParamStore& store) {
  graph::ParamStore::FlatBuffers f = store.flat_buffers();
  if (f.working_grads != nullptr) *f.working_grads = Tensor();
  *f.grads = Tensor();
}

void restore_grads(graph::ParamStore& store, Allocator& device) {
  const Tensor& params = store.params();
  graph::ParamStore::FlatBuffers f = store.flat_buffers();
  *f.grads = Tensor::zeros(params.shape(), params.dtype(), &device);
  if (store.mixed()) {
    *f.working_grads = Tensor::zeros(params.shape(), store.compute_dtype(), &device);
  }
}

}  // namespace

StateSlots::StateSlots(Binder& binder, int slots, CopyEngine* engine, bool keep_grads)
    : binder_(binder),
      device_(binder.allocator()),
      slots_(slots),
      engine_(engine),
      keep_grads_(keep_grads) {
  STRATA_CHECK(slots >= 1) << "--array-slots must be >= 1, got " << slots;
  stats_.slots = slots;
}

StateSlots::~StateSlots() {
  if (engine_ == nullptr) return;
  // Copies in flight hold their sources; let them finish before the states go.
  for (State& s : states_) {
    for (auto& c : s.loads) engine_->wait(*c);
  }
  for (auto& c : outgoing_) engine_->wait(*c);
}

int StateSlots::occupied() const {
  int n = 0;
  for (const State& s : states_) n += s.where != Where::kHost ? 1 : 0;
  return n;
}

bool StateSlots::on_device(int job) const {
  STRATA_CHECK(job >= 0 && job < static_cast<int>(states_.size())) << "array memory: job " << job;
  return states_[static_cast<size_t>(job)].where != Where::kHost;
}

void StateSlots::admit(int job) {
  STRATA_CHECK_EQ(job, static_cast<int>(states_.size())) << "array memory: jobs out of order";
  states_.push_back(State{});
  stats_.state_bytes = std::max(stats_.state_bytes, block_state_bytes(binder_.store(job)));
  if (occupied() <= slots_) return;
  STRATA_CHECK(engine_ != nullptr)
      << "array memory: " << states_.size() << " jobs in " << slots_ << " slots need a copy engine";
  offload(job);
  for (auto& c : outgoing_) engine_->wait(*c);
}

void StateSlots::offload(int job) {
  State& s = states_[static_cast<size_t>(job)];
  if (s.where == Where::kLoading) wait_loaded(job, false, false);
  STRATA_CHECK(s.where == Where::kDevice) << "array memory: job " << job << " is not resident";
  // One eviction in flight at a time: the previous one is done before this one starts.
  if (!outgoing_.empty()) {
    const auto start = Clock::now();
    for (auto& c : outgoing_) engine_->wait(*c);
    stats_.offload_wait_seconds += seconds_since(start);
    outgoing_.clear();
  }
  // The layers let go of the job's views first, so that its device memory goes with the copies.
  if (binder_.bound() == job) binder_.unbind();
  graph::ParamStore& store = binder_.store(job);
  const std::vector<Tensor*> values = state_values(store);
  s.outs.assign(values.size(), nullptr);
  for (size_t i = 0; i < values.size(); ++i) {
    Tensor& v = *values[i];
    if (v.numel() == 0) continue;
    check_whole(v, job);
    s.outs[i] = engine_->to_host(v.storage());
    stats_.bytes_to_host += v.nbytes();
    v = Tensor(s.outs[i]->destination(), 0, v.shape(), v.strides(), v.dtype());
    outgoing_.push_back(s.outs[i]);
  }
  if (!keep_grads_) drop_grads(store);
  s.where = Where::kHost;
  ++stats_.offloads;
}

void StateSlots::load(int job, bool prefetch) {
  State& s = states_[static_cast<size_t>(job)];
  STRATA_CHECK(s.where == Where::kHost) << "array memory: job " << job << " is not on the host";
  graph::ParamStore& store = binder_.store(job);
  const std::vector<Tensor*> values = state_values(store);
  s.loads.clear();
  for (size_t i = 0; i < values.size(); ++i) {
    Tensor& v = *values[i];
    if (v.numel() == 0) continue;
    check_whole(v, job);
    const std::shared_ptr<CopyEngine::Copy> after = i < s.outs.size() ? s.outs[i] : nullptr;
    auto copy = engine_->to_device(v.storage(), after && !after->done() ? after : nullptr);
    stats_.bytes_to_device += v.nbytes();
    v = Tensor(copy->destination(), 0, v.shape(), v.strides(), v.dtype());
    s.loads.push_back(std::move(copy));
  }
  s.outs.clear();
  if (!keep_grads_) restore_grads(store, device_);
  s.where = Where::kLoading;
  ++stats_.loads;
  if (prefetch) ++stats_.prefetched;
}

void StateSlots::wait_loaded(int job, bool counted, bool late) {
  State& s = states_[static_cast<size_t>(job)];
  if (s.where != Where::kLoading) return;
  engine_->poll();
  for (const auto& c : s.loads) late = late || !c->done();
  const auto start = Clock::now();
  for (const auto& c : s.loads) engine_->order_before_compute(*c);
  if (late && counted) {
    ++stats_.stalls;
    stats_.stall_seconds += seconds_since(start);
  }
  s.loads.clear();
  s.where = Where::kDevice;
}

void StateSlots::before_block(const std::vector<int>& upcoming) {
  STRATA_CHECK(!upcoming.empty()) << "array memory: no block";
  const int job = upcoming.front();
  STRATA_CHECK(job >= 0 && job < static_cast<int>(states_.size())) << "array memory: job " << job;
  if (engine_ != nullptr) {
    // The next K distinct jobs, this block's first.
    std::vector<int> window;
    for (int j : upcoming) {
      if (static_cast<int>(window.size()) == slots_) break;
      if (std::find(window.begin(), window.end(), j) == window.end()) window.push_back(j);
    }
    auto next_use = [&](int j) {
      const auto it = std::find(upcoming.begin(), upcoming.end(), j);
      return it == upcoming.end() ? upcoming.size() : static_cast<size_t>(it - upcoming.begin());
    };
    const bool own_on_host = states_[static_cast<size_t>(job)].where == Where::kHost;
    for (int w : window) {
      if (states_[static_cast<size_t>(w)].where != Where::kHost) continue;
      if (occupied() >= slots_) {
        int victim = -1;
        for (int j = 0; j < static_cast<int>(states_.size()); ++j) {
          if (states_[static_cast<size_t>(j)].where == Where::kHost) continue;
          if (std::find(window.begin(), window.end(), j) != window.end()) continue;
          if (victim < 0 || next_use(j) > next_use(victim)) victim = j;
        }
        if (victim < 0) break;  // every slot holds a job of the window
        offload(victim);
      }
      load(w, w != job);
    }
    // A load issued only now could not have arrived: a stall, whatever the copy's speed.
    if (own_on_host) ++stats_.not_prefetched;
    wait_loaded(job, true, own_on_host);
    engine_->poll();
  }
  binder_.bind(job);
}

SlotStats StateSlots::stats() const { return stats_; }

}  // namespace strata::parallel::arraypipe
