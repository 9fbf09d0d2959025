// LiveTransfer: chunked, flow-controlled, low-priority transfers of a live migration (see the
// header).
#include "parallel/runtime/live_transfer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "engine/check.h"
#include "parallel/comm/link_queue.h"

namespace strata::parallel {
namespace {

constexpr int kTagSpan = 8192;  // tags per transfer: prepare, ready, then the chunks (wrapping)

size_t item_bytes(const std::vector<Tensor>& tensors) {
  size_t bytes = 0;
  for (const Tensor& t : tensors) bytes += t.nbytes();
  return bytes;
}

}  // namespace

LiveTransfer::LiveTransfer(Communicator& comm, int peer, Role role, int64_t items, std::string what,
                           LiveTransferConfig config)
    : comm_(comm),
      peer_(peer),
      role_(role),
      count_(items),
      what_(std::move(what)),
      config_(config),
      start_(std::chrono::steady_clock::now()) {
  STRATA_CHECK(peer >= 0 && peer < comm.size() && peer != comm.rank())
      << what_ << ": peer " << peer << " of a communicator of " << comm.size() << " (rank "
      << comm.rank() << ")";
  STRATA_CHECK(items >= 0) << what_ << ": " << items << " items";
  STRATA_CHECK(config.tag_base >= 0 && config.tag_base + kTagSpan <= 32768)
      << what_ << ": tags from " << config.tag_base << " leave the communicators' range";
  thread_ = std::thread([this] { run(); });
}

LiveTransfer::~LiveTransfer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LiveTransfer::post(int64_t id, const std::vector<Tensor>& tensors) {
  STRATA_CHECK(role_ == Role::kSource) << what_ << ": the target cannot post item " << id;
  auto item = std::make_unique<Item>();
  item->id = id;
  for (const Tensor& t : tensors) item->tensors.push_back(t.contiguous().clone());
  const size_t bytes = item_bytes(item->tensors);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) STRATA_THROW() << error_;
    STRATA_CHECK(id == next_post_ && id < count_)
        << what_ << ": item " << id << " posted, expected item " << next_post_ << " of " << count_;
    ++next_post_;
    held_ += bytes;
    queue_.push_back(std::move(item));
  }
  changed_.notify_all();
}

void LiveTransfer::expect(int64_t id, const std::vector<std::pair<Shape, DType>>& layout) {
  STRATA_CHECK(role_ == Role::kTarget) << what_ << ": the source cannot expect item " << id;
  auto item = std::make_unique<Item>();
  item->id = id;
  for (const auto& [shape, dtype] : layout) item->tensors.push_back(Tensor::empty(shape, dtype));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) STRATA_THROW() << error_;
    STRATA_CHECK(id == next_expect_ && id < count_)
        << what_ << ": item " << id << " expected, expected item " << next_expect_ << " of "
        << count_;
    ++next_expect_;
    queue_.push_back(std::move(item));
  }
  changed_.notify_all();
}

bool LiveTransfer::arrived(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = done_.find(id);
  return it != done_.end() && it->second->done;
}

std::vector<Tensor> LiveTransfer::wait(int64_t id, const std::string& waiter) {
  STRATA_CHECK(role_ == Role::kTarget) << what_ << ": the source waits for no item";
  std::unique_lock<std::mutex> lock(mutex_);
  const auto ready = [&] {
    auto it = done_.find(id);
    return !error_.empty() || (it != done_.end() && it->second->done);
  };
  const std::chrono::milliseconds timeout = comm_.timeout();
  if (timeout.count() > 0) {
    if (!changed_.wait_for(lock, timeout, ready)) {
      throw CommTimeout(what_ + ": " + waiter + " waited " + std::to_string(timeout.count()) +
                        " ms for item " + std::to_string(id) + " from rank " +
                        std::to_string(peer_));
    }
  } else {
    changed_.wait(lock, ready);
  }
  if (!error_.empty())
    STRATA_THROW() << error_ << " (" << waiter << " waits for item " << id << ")";
  return done_.at(id)->tensors;
}

void LiveTransfer::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto all = [&] { return !error_.empty() || completed_ == count_; };
  const std::chrono::milliseconds timeout = comm_.timeout();
  if (timeout.count() > 0) {
    if (!changed_.wait_for(lock, timeout, all)) {
      throw CommTimeout(what_ + ": " + std::to_string(completed_) + " of " +
                        std::to_string(count_) + " items through after " +
                        std::to_string(timeout.count()) + " ms (rank " +
                        std::to_string(comm_.rank()) + ", peer " + std::to_string(peer_) + ")");
    }
  } else {
    changed_.wait(lock, all);
  }
  if (!error_.empty()) STRATA_THROW() << error_;
}

size_t LiveTransfer::held_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return held_;
}

LiveTransferStats LiveTransfer::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void LiveTransfer::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) error_ = message;
  }
  changed_.notify_all();
}

void LiveTransfer::run() {
  if (config_.low_priority) {
    // The thread's own nice value (Linux: per thread); the compute threads keep theirs.
    const bool lowered = setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19) == 0;
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.low_priority = lowered;
  }
  try {
    if (role_ == Role::kSource) {
      run_source();
    } else {
      run_target();
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  // Nothing may stay posted on buffers about to go (a transfer cut short).
  while (!in_flight_.empty()) {
    try {
      in_flight_.front().request->wait(comm_.timeout(), what_ + " (closing)");
    } catch (const std::exception&) {
    }
    in_flight_.pop_front();
  }
}

void LiveTransfer::run_source() {
  const std::string where = what_ + " (source, rank " + std::to_string(comm_.rank()) + ")";
  Tensor prepare = Tensor::full({1}, static_cast<double>(count_), DType::kI64);
  comm_.isend(prepare, peer_, config_.tag_base)->wait(comm_.timeout(), where + ": prepare");
  Tensor ready = Tensor::zeros({1}, DType::kI64);
  comm_.irecv(ready, peer_, config_.tag_base + 1)->wait(comm_.timeout(), where + ": ready");
  STRATA_CHECK_EQ(ready.item<int64_t>(), count_)
      << where << ": the target expects " << ready.item<int64_t>() << " items, the source sends "
      << count_;
  for (int64_t n = 0; n < count_; ++n) {
    std::unique_ptr<Item> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped: what was posted is still sent
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    move_item(*item, true);
    while (!in_flight_.empty()) complete_oldest();  // an item is through before it is dropped
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_ -= item_bytes(item->tensors);
      ++completed_;
      ++stats_.items;
      stats_.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    changed_.notify_all();
  }
}

void LiveTransfer::run_target() {
  const std::string where = what_ + " (target, rank " + std::to_string(comm_.rank()) + ")";
  Tensor prepare = Tensor::zeros({1}, DType::kI64);
  comm_.irecv(prepare, peer_, config_.tag_base)->wait(comm_.timeout(), where + ": prepare");
  // The target's layers are made (it constructed this end): ready, with its own count so that a
  // disagreement fails both ends.
  Tensor ready = Tensor::full({1}, static_cast<double>(count_), DType::kI64);
  comm_.isend(ready, peer_, config_.tag_base + 1)->wait(comm_.timeout(), where + ": ready");
  STRATA_CHECK_EQ(prepare.item<int64_t>(), count_)
      << where << ": the source sends " << prepare.item<int64_t>() << " items, the target expects "
      << count_;
  for (int64_t n = 0; n < count_; ++n) {
    std::unique_ptr<Item> item;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    move_item(*item, false);
    while (!in_flight_.empty()) complete_oldest();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      item->done = true;
      ++completed_;
      ++stats_.items;
      stats_.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      done_[item->id] = std::move(item);
    }
    changed_.notify_all();
  }
}

void LiveTransfer::move_item(Item& item, bool send) {
  // An emulated link (--link-mbps) queues the data below the training messages (prepare and ready
  // are not bulk: they open the transfer when the run starts).
  const TrafficClassScope bulk(TrafficClass::kBulk);
  for (size_t k = 0; k < item.tensors.size(); ++k) {
    const Tensor& t = item.tensors[k];
    if (t.numel() == 0) continue;
    const Tensor flat = t.view({t.numel()});
    const int64_t per_chunk =
        config_.chunk_bytes == 0
            ? t.numel()
            : std::max<int64_t>(1,
                                static_cast<int64_t>(config_.chunk_bytes / dtype_size(t.dtype())));
    for (int64_t start = 0; start < t.numel(); start += per_chunk) {
      const Tensor chunk = flat.narrow(0, start, std::min(per_chunk, t.numel() - start));
      // Flow control: the oldest chunks complete before more than the window is in flight.
      while (config_.window_bytes > 0 && !in_flight_.empty() &&
             in_flight_bytes_ + chunk.nbytes() > config_.window_bytes) {
        complete_oldest();
      }
      const int tag = config_.tag_base + 2 + tag_ % (kTagSpan - 2);
      ++tag_;
      Pending p;
      p.buffer = chunk;
      p.request = send ? comm_.isend(chunk, peer_, tag) : comm_.irecv(chunk, peer_, tag);
      p.bytes = chunk.nbytes();
      in_flight_bytes_ += p.bytes;
      in_flight_.push_back(std::move(p));
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.chunks;
      stats_.bytes += chunk.nbytes();
      stats_.peak_in_flight_bytes = std::max(stats_.peak_in_flight_bytes, in_flight_bytes_);
    }
  }
}

void LiveTransfer::complete_oldest() {
  Pending& p = in_flight_.front();
  p.request->wait(comm_.timeout(), what_ + ": a chunk " +
                                       (role_ == Role::kSource ? std::string("to") : "from") +
                                       " rank " + std::to_string(peer_));
  in_flight_bytes_ -= p.bytes;
  in_flight_.pop_front();
}

}  // namespace strata::parallel
