// DataLoader: a small work queue keyed by step.
//
// start_epoch fixes the epoch order (a shared, immutable vector) and opens a window of steps.
// Workers claim steps in increasing order, at most `prefetch` ahead of the consumer, assemble them
// outside the lock (Dataset::get straight into the rows of freshly allocated batch tensors) and
// file them in a map by step; next() waits for exactly its step, so batches come out in order no
// matter which worker finishes first. Every epoch has a generation number: start_epoch and the
// destructor bump it, workers poll it between samples and drop the work of an old generation, so
// cancelling never waits for more than the one sample being read. Errors travel as
// exception_ptrs in the slot of their step, so the consumer sees the batches before the failure
// and then the failure, on its own thread.
#include "io/data_loader.h"

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cerrno>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include "engine/check.h"
#include "engine/philox.h"

namespace strata::io {
namespace {

// The error of a sample, with where it happened; out-of-memory stays out-of-memory.
std::exception_ptr wrap_error(const std::string& context, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemoryError& e) {
    return std::make_exception_ptr(OutOfMemoryError(context + ": " + e.message(), e.where()));
  } catch (const std::exception& e) {
    return std::make_exception_ptr(Error(context + ": " + error_message(e), error_where(e)));
  } catch (...) {
    return std::make_exception_ptr(Error(context + ": unknown exception"));
  }
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  STRATA_CHECK(dataset_ != nullptr) << "DataLoader: no dataset";
  const std::string who = "DataLoader(" + dataset_->name() + "): ";
  STRATA_CHECK(options_.batch_size >= 1)
      << who << "batch_size must be at least 1, got " << options_.batch_size;
  STRATA_CHECK(options_.shard_count >= 1)
      << who << "shard_count must be at least 1, got " << options_.shard_count;
  STRATA_CHECK(options_.shard_index >= 0 && options_.shard_index < options_.shard_count)
      << who << "shard_index " << options_.shard_index << " is outside [0, " << options_.shard_count
      << ")";
  STRATA_CHECK(options_.batch_size % options_.shard_count == 0)
      << who << "the global batch_size " << options_.batch_size
      << " is not divisible by the number of data-parallel groups " << options_.shard_count
      << ": every group must get the same number of rows per step; choose a batch size that is "
      << "a multiple of " << options_.shard_count;
  STRATA_CHECK(options_.num_workers >= 0)
      << who << "num_workers must be 0 or more, got " << options_.num_workers;
  STRATA_CHECK(options_.prefetch >= 1)
      << who << "prefetch must be at least 1, got " << options_.prefetch;
  allocator_ = options_.allocator != nullptr ? options_.allocator : &default_cpu_allocator();
  STRATA_CHECK(allocator_->device().is_cpu())
      << who << "batches are assembled in host memory, but the allocator is on "
      << allocator_->device().str() << "; give a host (or pinned host) allocator";

  input_spec_ = dataset_->input_spec();
  target_spec_ = dataset_->target_spec();
  const int64_t n = dataset_->size();
  const int64_t b = options_.batch_size;
  batches_per_epoch_ = options_.drop_last ? n / b : (n + b - 1) / b;

  workers_.reserve(static_cast<size_t>(options_.num_workers));
  for (int i = 0; i < options_.num_workers; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    cancel_locked();
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int64_t DataLoader::global_rows(int64_t step) const {
  STRATA_CHECK(step >= 0 && step < batches_per_epoch_)
      << "DataLoader(" << dataset_->name() << "): step " << step << " outside [0, "
      << batches_per_epoch_ << ")";
  return std::min(options_.batch_size, dataset_->size() - step * options_.batch_size);
}

void DataLoader::shard_rows(int64_t step, int64_t* begin, int64_t* end) const {
  const int64_t b = global_rows(step);
  const int64_t g = options_.shard_index;
  const int64_t groups = options_.shard_count;
  *begin = g * b / groups;
  *end = (g + 1) * b / groups;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_->size()));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!options_.shuffle) return order;
  // Fisher-Yates (Knuth's Algorithm P), one stream per epoch.
  PhiloxStream rng(options_.seed, stable_hash("shuffle"), static_cast<uint64_t>(epoch));
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.next_below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

void DataLoader::cancel_locked() {
  current_.generation = generation_.fetch_add(1) + 1;
  active_ = false;
  ready_.clear();
}

bool DataLoader::cancelled(uint64_t generation) const {
  return generation_.load(std::memory_order_relaxed) != generation;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_step) {
  STRATA_CHECK(epoch >= 0) << "DataLoader(" << dataset_->name() << "): negative epoch " << epoch;
  STRATA_CHECK(first_step >= 0 && first_step <= batches_per_epoch_)
      << "DataLoader(" << dataset_->name() << "): first_step " << first_step << " outside [0, "
      << batches_per_epoch_ << "] (batches per epoch)";
  auto order = std::make_shared<const std::vector<int64_t>>(epoch_order(epoch));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_locked();
    current_.epoch = epoch;
    current_.order = std::move(order);
    claim_step_ = first_step;
    consume_step_ = first_step;
    active_ = true;
  }
  failed_ = nullptr;
  started_ = true;
  work_cv_.notify_all();
}

bool DataLoader::assemble(const Epoch& epoch, int64_t step, Slot* slot) const {
  const int64_t b = options_.batch_size;
  int64_t begin = 0, end = 0;
  shard_rows(step, &begin, &end);
  const int64_t rows = end - begin;
  Batch batch;
  batch.epoch = epoch.epoch;
  batch.step = step;
  batch.sample_offset = step * b + begin;
  batch.rows = rows;
  std::ostringstream where;
  where << "DataLoader(" << dataset_->name() << ") epoch " << epoch.epoch << " step " << step;
  try {
    Shape input_shape{rows};
    input_shape.insert(input_shape.end(), input_spec_.shape.begin(), input_spec_.shape.end());
    Shape target_shape{rows};
    target_shape.insert(target_shape.end(), target_spec_.shape.begin(), target_spec_.shape.end());
    batch.input = Tensor::empty(input_shape, input_spec_.dtype, allocator_);
    batch.target = Tensor::empty(target_shape, target_spec_.dtype, allocator_);
  } catch (...) {
    slot->error = wrap_error(where.str(), std::current_exception());
    return true;
  }
  auto* input = static_cast<uint8_t*>(batch.input.raw_data());
  auto* target = static_cast<uint8_t*>(batch.target.raw_data());
  const size_t input_bytes = input_spec_.nbytes();
  const size_t target_bytes = target_spec_.nbytes();
  for (int64_t r = 0; r < rows; ++r) {
    if (cancelled(epoch.generation)) return false;
    const int64_t position = batch.sample_offset + r;
    const int64_t index = (*epoch.order)[static_cast<size_t>(position)];
    try {
      dataset_->get_in_epoch(epoch.epoch, index, input + static_cast<size_t>(r) * input_bytes,
                             target + static_cast<size_t>(r) * target_bytes);
    } catch (...) {
      where << ": dataset " << dataset_->name() << " sample " << index << " (position " << position
            << " of the epoch order)";
      slot->error = wrap_error(where.str(), std::current_exception());
      return true;
    }
  }
  slot->batch = std::move(batch);
  return true;
}

void DataLoader::worker_loop() {
#ifdef __linux__
  // Loading yields to compute: a worker runs at a lower priority (nice + kWorkerNice, this thread
  // only), so on cores shared with the training threads it takes the time they leave; when the
  // trainer waits for a batch, its cores are idle and the worker gets them. Best effort: a
  // failure (a sandbox forbidding it) leaves the worker at the process's priority.
  constexpr int kWorkerNice = 10;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int nice_now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(19, nice_now + kWorkerNice));
#endif
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [this] {
      return stop_ || (active_ && claim_step_ < batches_per_epoch_ &&
                       claim_step_ < consume_step_ + options_.prefetch);
    });
    if (stop_) return;
    const int64_t step = claim_step_++;
    const Epoch epoch = current_;
    lock.unlock();
    Slot slot;
    const bool finished = assemble(epoch, step, &slot);
    lock.lock();
    if (finished && epoch.generation == current_.generation) {
      ready_.emplace(step, std::move(slot));
      ready_cv_.notify_all();
    }
  }
}

bool DataLoader::next(Batch* batch) {
  STRATA_CHECK(batch != nullptr) << "DataLoader::next: null batch";
  STRATA_CHECK(started_) << "DataLoader(" << dataset_->name()
                         << ")::next: call start_epoch(epoch) first";
  if (failed_) std::rethrow_exception(failed_);
  Slot slot;
  if (workers_.empty()) {
    if (consume_step_ >= batches_per_epoch_) return false;
    assemble(current_, consume_step_, &slot);
    ++consume_step_;
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    if (consume_step_ >= batches_per_epoch_) return false;
    ready_cv_.wait(lock, [this] { return ready_.count(consume_step_) > 0; });
    auto it = ready_.find(consume_step_);
    slot = std::move(it->second);
    ready_.erase(it);
    ++consume_step_;
    if (slot.error) cancel_locked();  // the epoch is over: stop assembling its later steps
    lock.unlock();
    work_cv_.notify_all();
  }
  if (slot.error) {
    failed_ = slot.error;
    std::rethrow_exception(failed_);
  }
  *batch = std::move(slot.batch);
  return true;
}

}  // namespace strata::io
