// CopyEngine: two ordered queues of storage copies (threads on the CPU, streams on CUDA).
#include "parallel/runtime/copy_engine.h"

#include <algorithm>
#include <cstring>

#include "engine/check.h"
#include "engine/cuda_runtime.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct CopyEngine::Queue {
  std::deque<std::shared_ptr<Copy>> waiting;
  bool stop = false;
  std::thread thread;
};

CopyEngine::Copy::~Copy() = default;

bool CopyEngine::Copy::done() const {
  if (done_) return true;
  return event_ != nullptr && event_->done();
}

CopyEngine::CopyEngine(ExecContext& ctx, Allocator& host_pool, std::string pool_flag)
    : ctx_(ctx), host_pool_(host_pool), pool_flag_(std::move(pool_flag)) {
  cuda_ = ctx.device().is_cuda();
  if (cuda_) {
    out_stream_ = std::make_unique<cuda::StreamHandle>(ctx.device().index);
    in_stream_ = std::make_unique<cuda::StreamHandle>(ctx.device().index);
    return;
  }
  out_ = std::make_unique<Queue>();
  in_ = std::make_unique<Queue>();
  out_->thread = std::thread([this] { serve(*out_); });
  in_->thread = std::thread([this] { serve(*in_); });
}

CopyEngine::~CopyEngine() {
  if (cuda_) {
    for (const std::shared_ptr<Copy>& c : in_flight_) {
      if (c->event_ != nullptr) c->event_->synchronize();
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out_->stop = in_->stop = true;
  }
  changed_.notify_all();
  out_->thread.join();
  in_->thread.join();
}

std::shared_ptr<CopyEngine::Copy> CopyEngine::to_host(std::shared_ptr<Storage> device_storage) {
  return issue(std::move(device_storage), true, nullptr);
}

std::shared_ptr<CopyEngine::Copy> CopyEngine::to_device(std::shared_ptr<Storage> host_storage,
                                                        std::shared_ptr<Copy> after) {
  return issue(std::move(host_storage), false, std::move(after));
}

std::shared_ptr<CopyEngine::Copy> CopyEngine::issue(std::shared_ptr<Storage> source, bool to_host,
                                                    std::shared_ptr<Copy> after) {
  STRATA_CHECK(source != nullptr) << "CopyEngine: no storage to copy";
  auto copy = std::make_shared<Copy>();
  copy->bytes_ = source->nbytes();
  copy->to_host_ = to_host;
  if (to_host) {
    try {
      copy->destination_ = std::make_shared<Storage>(host_pool_, copy->bytes_, "swap");
    } catch (const OutOfMemoryError& e) {
      const MemoryStats s = host_pool_.stats();
      throw OutOfMemoryError("the swap pool in host memory is full: cannot hold " +
                             format_bytes(copy->bytes_) + " more (" + pool_flag_ + " " +
                             format_bytes(s.limit) + ", in use " + format_bytes(s.current) +
                             "); raise " + pool_flag_ +
                             " or swap fewer layers (--memory-plan, --memory-policy)");
    }
  } else {
    copy->destination_ = std::make_shared<Storage>(ctx_.allocator(), copy->bytes_, "swap-in");
  }
  copy->source_ = std::move(source);
  if (after != nullptr && !after->done()) copy->after_ = std::move(after);
  copy->issued_ = copy->completed_ = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    (to_host ? stats_.bytes_to_host : stats_.bytes_to_device) += copy->bytes_;
    ++stats_.copies;
    in_flight_.push_back(copy);
  }
  if (cuda_) {
    cuda::StreamHandle& stream = to_host ? *out_stream_ : *in_stream_;
    // After the source's producer (out), or the last user of the reused block (in), and after
    // the copy that filled the source.
    stream.wait_for(cuda::exec_stream(ctx_.cuda()));
    if (copy->after_ != nullptr) copy->after_->event_->block(stream.get());
    cuda::memcpy_async(copy->destination_->data(), copy->source_->data(), copy->bytes_,
                       stream.get());
    copy->event_ = std::make_unique<cuda::HostEvent>(ctx_.device().index);
    copy->event_->record(stream.get());
    return copy;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    (to_host ? out_ : in_)->waiting.push_back(copy);
  }
  changed_.notify_all();
  return copy;
}

void CopyEngine::serve(Queue& queue) {
  for (;;) {
    std::shared_ptr<Copy> copy;
    std::chrono::microseconds delay;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return queue.stop || !queue.waiting.empty(); });
      if (queue.waiting.empty()) return;  // stopping, nothing left
      copy = queue.waiting.front();
      queue.waiting.pop_front();
      delay = delay_;
      // The copy that filled this one's source (the other queue serves it).
      if (copy->after_ != nullptr) changed_.wait(lock, [&] { return copy->after_->done_.load(); });
      copy->after_.reset();
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::memcpy(copy->destination_->data(), copy->source_->data(), copy->bytes_);
    std::shared_ptr<Storage> source;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      source = std::move(copy->source_);
      finish(*copy);
      // Let go of the copy before a waiter can see it done: its destination then goes with its
      // owner's last reference, not whenever this thread gets here (measured peaks would depend
      // on the thread's timing).
      copy.reset();
    }
    source.reset();  // a swap-out's device memory goes here, outside the lock
    changed_.notify_all();
  }
}

void CopyEngine::finish(Copy& copy) {
  copy.done_ = true;
  copy.completed_ = Clock::now();
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [&](const std::shared_ptr<Copy>& c) { return c.get() == &copy; }),
                   in_flight_.end());
}

void CopyEngine::order_before_compute(Copy& copy) {
  if (cuda_) {
    copy.event_->block(cuda::exec_stream(ctx_.cuda()));
    return;
  }
  const auto start = Clock::now();
  wait(copy);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.compute_wait_seconds += seconds;
}

void CopyEngine::wait(Copy& copy) {
  if (cuda_) {
    copy.event_->synchronize();
    std::shared_ptr<Storage> source;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!copy.done_) {
        source = std::move(copy.source_);
        finish(copy);
      }
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return copy.done_.load(); });
}

bool CopyEngine::drain_to_host() {
  std::vector<std::shared_ptr<Copy>> out;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::shared_ptr<Copy>& c : in_flight_) {
      if (c->to_host_) out.push_back(c);
    }
  }
  for (const std::shared_ptr<Copy>& c : out) wait(*c);
  return !out.empty();
}

void CopyEngine::poll() {
  if (!cuda_) return;  // the queues' threads finish their copies
  std::vector<std::shared_ptr<Storage>> sources;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<Copy>> seen;
    for (const std::shared_ptr<Copy>& c : in_flight_) {
      if (c->event_->done()) seen.push_back(c);
    }
    for (const std::shared_ptr<Copy>& c : seen) {
      sources.push_back(std::move(c->source_));
      finish(*c);
    }
  }
}

void CopyEngine::set_copy_delay(std::chrono::microseconds delay) {
  std::lock_guard<std::mutex> lock(mutex_);
  delay_ = delay;
}

CopyEngine::Stats CopyEngine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

double measure_copy_bandwidth(ExecContext& ctx, Allocator& host_pool, size_t bytes, int rounds) {
  STRATA_CHECK(bytes > 0 && rounds >= 1)
      << "measure_copy_bandwidth: " << bytes << " bytes, " << rounds << " rounds";
  CopyEngine copies(ctx, host_pool, "the host pool");
  auto source = std::make_shared<Storage>(ctx.allocator(), bytes, "bandwidth probe");
  if (!ctx.device().is_cuda()) std::memset(source->data(), 1, bytes);  // touch the pages
  double seconds = 0.0;
  for (int r = 0; r <= rounds; ++r) {
    const auto start = Clock::now();
    auto out = copies.to_host(source);
    auto in = copies.to_device(out->destination(), out);
    copies.wait(*in);
    if (r > 0) seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  return seconds > 0 ? 2.0 * static_cast<double>(bytes) * rounds / seconds : 0.0;
}

}  // namespace strata::parallel
