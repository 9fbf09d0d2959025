// Grouped data parallelism: gradient buckets, the launch hooks and the communication thread.
//
// Each communication thread (the gradients', and the batch-norm buffers' when the stage has any)
// runs its launched all-reduces one at a time, in launch order, which is the same on every group
// (the buckets and the instruction lists are), so the k-th collective of every group's thread is
// the same bucket of the same update; the two threads have communicators of their own. It polls
// Request::test with a short backoff (20 us doubling to 0.5 ms) so that it notices a cancellation
// (the executor failed) and applies the communicator's timeout itself, naming the bucket, layers,
// stage and update.
#include "parallel/grouped_dp.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "engine/check.h"
#include "parallel/trace.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

void scale_in_place(const Tensor& t, double factor) {
  if (!t.device().is_cpu()) {
    Tensor h = to_allocator(t, default_cpu_allocator());
    scale_in_place(h, factor);
    t.copy_from(h);
    return;
  }
  if (t.dtype() == DType::kF32) {
    float* p = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(p[i] * factor);
  } else {
    STRATA_CHECK(t.dtype() == DType::kF64) << "grouped DP: buffers must be f32 or f64";
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= factor;
  }
}

void check_grad_sync(const GradSyncConfig& config) {
  STRATA_CHECK(std::isfinite(config.bucket_mb) && config.bucket_mb >= 0)
      << "--dp-bucket-mb must be >= 0 (0 = one bucket per stage), got " << config.bucket_mb;
  STRATA_CHECK(config.delay >= 0) << "--dp-delay must be >= 0 steps, got " << config.delay;
}

std::vector<GradBucket> make_grad_buckets(const graph::ParamStore& store, double bucket_mb) {
  GradSyncConfig check;
  check.bucket_mb = bucket_mb;
  check_grad_sync(check);
  const auto& entries = store.param_entries();
  const int64_t total = store.grads().numel();
  // Where each layer's own (non-alias) gradients start; -1 for a layer without any.
  const size_t layers = store.end() - store.begin();
  std::vector<int64_t> start(layers, -1);
  for (const auto& e : entries) {
    if (!e.alias && start[e.layer_index - store.begin()] < 0) {
      start[e.layer_index - store.begin()] = e.offset;
    }
  }
  // End of layer l's range: the start of the next layer that has parameters, or the buffer's end.
  std::vector<int64_t> end(layers, total);
  int64_t next = total;
  for (size_t l = layers; l-- > 0;) {
    end[l] = next;
    if (start[l] >= 0) next = start[l];
  }
  const double cap = bucket_mb * 1024.0 * 1024.0;
  const double element_bytes = static_cast<double>(dtype_size(store.grads().dtype()));
  // From the last layer down: a layer with gradients joins the open bucket unless that would pass
  // the cap; layers without gradients belong to the bucket of the layers around them.
  std::vector<GradBucket> buckets;
  GradBucket open;
  bool have_open = false;
  for (size_t l = layers; l-- > 0;) {
    if (start[l] < 0) continue;
    const size_t layer = store.begin() + l;
    const int64_t numel = end[l] - start[l];
    if (have_open && cap > 0 && static_cast<double>(open.numel + numel) * element_bytes > cap) {
      open.first_layer = layer + 1;
      buckets.push_back(open);
      have_open = false;
    }
    if (!have_open) {
      open = GradBucket{};
      open.end_layer = buckets.empty() ? store.end() : buckets.back().first_layer;
      have_open = true;
    }
    open.offset = start[l];
    open.numel += numel;
    open.ready_layer = layer;  // the bucket's earliest layer with gradients
  }
  if (have_open) {
    open.first_layer = store.begin();
    buckets.push_back(open);
  }
  // Ready once every layer writing into the range is done: its own layers, and the layers of
  // aliases (tied parameters held by this store) whose owner lies in the range.
  for (GradBucket& b : buckets) {
    for (const auto& e : entries) {
      if (e.alias && e.offset >= b.offset && e.offset < b.offset + b.numel) {
        b.ready_layer = std::min(b.ready_layer, e.layer_index);
      }
    }
  }
  return buckets;
}

GroupedDp::GroupedDp(std::unique_ptr<Communicator> comm, graph::ParamStore& store,
                     const GradSyncConfig& config, int stage, Trace* trace,
                     GradSyncObserver observer)
    : store_(store), config_(config), stage_(stage), trace_(trace), observer_(std::move(observer)) {
  STRATA_CHECK(comm != nullptr) << "grouped DP needs a data-parallel communicator";
  check_grad_sync(config);
  grads_.comm = std::move(comm);
  group_ = grads_.comm->rank();
  groups_ = grads_.comm->size();
  // Collective over the stage's groups, which all hold the same layers (and buffers).
  if (store.buffers().numel() > 0 && config.buffers_channel) {
    buffers_ = std::make_unique<Channel>();
    buffers_->comm = grads_.comm->split(0, group_);
  }
  buckets_ = make_grad_buckets(store, config.bucket_mb);
  launched_.assign(buckets_.size(), false);
  // The ring lives where the gradients do (on a CUDA stage: device memory from the stage's
  // caching allocator), so filling and applying a slot are device copies on the stage's stream.
  for (int i = 0; i < config.delay + (config.delay > 0 ? 1 : 0); ++i) {
    slots_.push_back(
        Tensor::zeros({store.grads().numel()}, store.grads().dtype(), &store.grads().allocator()));
  }
  grads_.thread = std::thread([this] { thread_main(grads_); });
  if (buffers_) buffers_->thread = std::thread([this] { thread_main(*buffers_); });
}

GroupedDp::~GroupedDp() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    // Work left over means the executor failed: do not wait for peers that may never come.
    if (!active_.empty()) cancel_ = true;
  }
  changed_.notify_all();
  grads_.thread.join();
  if (buffers_) buffers_->thread.join();
}

Tensor GroupedDp::slot(int64_t update) const {
  return slots_[static_cast<size_t>(update % static_cast<int64_t>(slots_.size()))];
}

void GroupedDp::emit(GradSyncEvent::Kind kind, int64_t update, int bucket,
                     Clock::time_point t) const {
  if (observer_) observer_(GradSyncEvent{kind, stage_, group_, update, bucket, t});
}

void GroupedDp::layer_done(int64_t update, size_t layer) {
  if (update != launching_update_) {
    launching_update_ = update;
    launched_.assign(buckets_.size(), false);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!launched_[b] && buckets_[b].ready_layer >= layer) launch(update, static_cast<int>(b));
  }
}

void GroupedDp::launch(int64_t update, int bucket) {
  launched_[static_cast<size_t>(bucket)] = true;
  const GradBucket& b = buckets_[static_cast<size_t>(bucket)];
  emit(GradSyncEvent::kLaunch, update, bucket, Clock::now());
  Tensor t = store_.grads().narrow(0, b.offset, b.numel);
  if (!slots_.empty()) {
    // Delayed: the all-reduce works on a copy, so the next steps may reuse the store's buffer.
    // On a device the copy is ordered on the stage's stream without the host waiting; the
    // all-reduce reads it after that stream's work (communicator.h).
    Tensor copy = slot(update).narrow(0, b.offset, b.numel);
    copy_across_devices_async(copy, t);
    t = copy;
  }
  std::ostringstream what;
  what << "all-reduce of gradient bucket " << bucket << " (layers " << b.first_layer << ".."
       << b.end_layer - 1 << ") of stage " << stage_ << ", update " << update
       << " (grouped data parallelism)";
  enqueue(update, bucket, t, what.str());
}

void GroupedDp::enqueue(int64_t update, int bucket, const Tensor& tensor, const std::string& what) {
  auto job = std::make_shared<Job>();
  job->update = update;
  job->bucket = bucket;
  job->tensor = tensor;
  job->what = what;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    channel_of(bucket).queue.push_back(job);
    active_.push_back(job);
  }
  changed_.notify_all();
}

void GroupedDp::end_backward(int64_t update) {
  if (update != launching_update_) {
    launching_update_ = update;
    launched_.assign(buckets_.size(), false);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!launched_[b]) launch(update, static_cast<int>(b));
  }
  if (store_.buffers().numel() > 0) {
    emit(GradSyncEvent::kLaunch, update, -1, Clock::now());
    enqueue(update, -1, store_.buffers(),
            "all-reduce of the batch-norm statistics of stage " + std::to_string(stage_) +
                ", update " + std::to_string(update) + " (grouped data parallelism)");
  }
  unapplied_.push_back(update);
  if (!config_.overlap && config_.delay == 0) wait_jobs(update, false);
}

void GroupedDp::wait_jobs(int64_t update, bool buffers) {
  emit(GradSyncEvent::kWaitBegin, update, buffers ? -1 : 0, Clock::now());
  wait_jobs_quietly(update, buffers);
  emit(GradSyncEvent::kWaitEnd, update, buffers ? -1 : 0, Clock::now());
}

void GroupedDp::wait_jobs_quietly(int64_t update, bool buffers) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto mine = [&](const std::shared_ptr<Job>& j) {
    return j->update == update && (j->bucket < 0) == buffers;
  };
  changed_.wait(lock, [&] {
    if (error_) return true;
    for (const auto& j : active_) {
      if (mine(j) && !j->done) return false;
    }
    return true;
  });
  if (error_) std::rethrow_exception(error_);
  active_.erase(std::remove_if(active_.begin(), active_.end(), mine), active_.end());
}

bool GroupedDp::gradients_for(int64_t update) {
  if (store_.buffers().numel() > 0) {
    wait_jobs(update, true);
    scale_in_place(store_.buffers(), 1.0 / static_cast<double>(groups_));
  }
  if (update < config_.delay) return false;
  take_gradients(update - config_.delay);
  return true;
}

void GroupedDp::take_gradients(int64_t update) {
  auto it = std::find(unapplied_.begin(), unapplied_.end(), update);
  STRATA_CHECK(it != unapplied_.end()) << "grouped DP: the gradient of update " << update
                                       << " of stage " << stage_ << " was never launched";
  wait_jobs(update, false);
  if (!slots_.empty()) copy_across_devices_async(store_.grads(), slot(update));
  unapplied_.erase(it);
}

Tensor GroupedDp::reduced_gradient(int64_t update) {
  STRATA_CHECK(!slots_.empty()) << "grouped DP: only a delayed all-reduce (--dp-delay > 0) is "
                                   "kept after its update";
  STRATA_CHECK(std::find(unapplied_.begin(), unapplied_.end(), update) != unapplied_.end())
      << "grouped DP: the gradient of update " << update << " of stage " << stage_
      << " is not pending";
  wait_jobs(update, false);
  return slot(update);
}

void GroupedDp::restore_gradient(int64_t update, const Tensor& reduced) {
  STRATA_CHECK(!slots_.empty() && static_cast<int>(unapplied_.size()) < config_.delay)
      << "grouped DP: stage " << stage_ << " cannot hold another delayed gradient (--dp-delay "
      << config_.delay << ", " << unapplied_.size() << " pending)";
  STRATA_CHECK(update > launching_update_ &&
               std::find(unapplied_.begin(), unapplied_.end(), update) == unapplied_.end())
      << "grouped DP: update " << update << " of stage " << stage_ << " was already launched";
  STRATA_CHECK_EQ(reduced.numel(), store_.grads().numel())
      << "grouped DP: a restored gradient of stage " << stage_ << " has the wrong size";
  slot(update).copy_from(reduced);
  unapplied_.push_back(update);
}

std::vector<int64_t> GroupedDp::pending_updates() const { return unapplied_; }

bool GroupedDp::idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_.empty();
}

void GroupedDp::thread_main(Channel& channel) {
  std::deque<std::shared_ptr<Job>>& queue = channel.queue;
  Communicator& comm = *channel.comm;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return cancel_ || stop_ || !queue.empty(); });
      if (cancel_ || (stop_ && queue.empty())) return;
      job = queue.front();
      queue.pop_front();
    }
    try {
      const Clock::time_point start = Clock::now();
      emit(GradSyncEvent::kStart, job->update, job->bucket, start);
      std::unique_ptr<Request> request = comm.all_reduce(job->tensor);
      auto pause = std::chrono::microseconds(20);
      const std::chrono::milliseconds timeout = comm.timeout();
      while (!request->test()) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (cancel_) return;  // the request is abandoned; its peers fail on their own
        }
        if (timeout.count() > 0 && Clock::now() - start > timeout) {
          std::ostringstream s;
          s << "rank " << group_ << " of the data-parallel communicator of stage " << stage_
            << " timed out after " << timeout.count() << " ms waiting for the " << job->what;
          throw CommTimeout(s.str());
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(500));
      }
      const Clock::time_point end = Clock::now();
      emit(GradSyncEvent::kEnd, job->update, job->bucket, end);
      if (trace_ != nullptr) {
        trace_->record_span(
            job->bucket < 0 ? "AllReduce buffers" : "AllReduce b" + std::to_string(job->bucket),
            start, end, Trace::kGradSyncLane);
      }
      std::lock_guard<std::mutex> lock(mutex_);
      job->done = true;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

}  // namespace strata::parallel
