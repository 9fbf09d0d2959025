// The caching device allocator and the pinned host allocator (see engine/cuda_runtime.h).
//
// Errors. Every CUDA call here is checked and an error names the call. deallocate() runs from
// Storage's destructor and cannot throw: an error there (recording the event that guards a block
// used on another stream) leaves the block out of the cache for good (it may still be in use) and
// is thrown by the next allocate() of this allocator. The destructor ignores errors (it can only
// let go of memory).
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/cuda_check.h"
#include "engine/cuda_runtime.h"

namespace strata::cuda {
namespace {

constexpr size_t kSmallQuantum = 512;
constexpr size_t kSmallMax = size_t{1} << 20;
constexpr size_t kLargeQuantum = size_t{2} << 20;

// Another stream that used a block (record_use), with the event that will mark the end of that
// use once the block is freed (created by record_use, recorded by deallocate).
struct OtherUse {
  cudaStream_t stream;
  cudaEvent_t event;
};

struct Block {
  size_t size = 0;              // the size class, as allocated by cudaMalloc
  std::vector<OtherUse> users;  // other streams that used it (record_use)
};

// A freed block still used by other streams: reusable once every event has fired.
struct PendingBlock {
  void* ptr;
  std::vector<cudaEvent_t> events;
};

std::string cuda_error(cudaError_t status) {
  return "CUDA error " + std::to_string(static_cast<int>(status)) + " (" +
         cudaGetErrorName(status) + "): " + cudaGetErrorString(status);
}

}  // namespace

struct CachingAllocator::State {
  mutable std::mutex mutex;
  std::unordered_map<void*, Block> live;     // handed out
  std::multimap<size_t, void*> free_blocks;  // size class -> cached block
  std::unordered_map<void*, size_t> free_size;
  std::vector<PendingBlock> pending;
  size_t cached = 0;  // bytes of free_blocks and pending
  CachingStats stats;
  std::string deferred_error;  // an error deallocate() could not throw (see the top)
};

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes <= kSmallMax) return (nbytes + kSmallQuantum - 1) / kSmallQuantum * kSmallQuantum;
  return (nbytes + kLargeQuantum - 1) / kLargeQuantum * kLargeQuantum;
}

CachingAllocator::CachingAllocator(int device, void* stream)
    : device_(device), stream_(stream), state_(new State) {}

CachingAllocator::~CachingAllocator() {
  // Tensors must be gone by now; whatever is still live leaks rather than being freed under them.
  try {
    release_cached();
  } catch (const Error&) {  // a destructor only lets go: the device is failing anyway
  }
  for (auto& [ptr, block] : state_->live) {
    for (const OtherUse& u : block.users) cudaEventDestroy(u.event);
  }
  delete state_;
}

namespace {

// Moves pending blocks whose events have all fired to the free lists. Caller holds the mutex.
void collect_pending(int device, std::vector<PendingBlock>* pending,
                     std::multimap<size_t, void*>* free_blocks,
                     const std::unordered_map<void*, size_t>& sizes) {
  for (size_t i = 0; i < pending->size();) {
    PendingBlock& p = (*pending)[i];
    bool done = true;
    for (cudaEvent_t e : p.events) {
      const cudaError_t status = cudaEventQuery(e);
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        done = false;
        break;
      }
      if (status != cudaSuccess) {
        (void)cudaGetLastError();
        STRATA_THROW() << "caching allocator of cuda:" << device
                       << ": cudaEventQuery of the event guarding a freed block used on another "
                          "stream failed: "
                       << cuda_error(status);
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    for (cudaEvent_t e : p.events) STRATA_CUDA_CHECK(cudaEventDestroy(e));
    const size_t size = sizes.at(p.ptr);
    free_blocks->emplace(size, p.ptr);
    (*pending)[i] = pending->back();
    pending->pop_back();
  }
}

// Waits for every pending block and moves it to the free lists. Caller holds the mutex.
void drain_pending(std::vector<PendingBlock>* pending, std::multimap<size_t, void*>* free_blocks,
                   const std::unordered_map<void*, size_t>& sizes) {
  for (PendingBlock& p : *pending) {
    for (cudaEvent_t e : p.events) {
      STRATA_CUDA_CHECK(cudaEventSynchronize(e));
      STRATA_CUDA_CHECK(cudaEventDestroy(e));
    }
    free_blocks->emplace(sizes.at(p.ptr), p.ptr);
  }
  pending->clear();
}

}  // namespace

void* CachingAllocator::allocate(size_t nbytes, const char* what) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->deferred_error.empty()) {
      const std::string error = std::move(state_->deferred_error);
      state_->deferred_error.clear();
      STRATA_THROW() << "caching allocator of cuda:" << device_ << ": " << error;
    }
  }
  reserve(nbytes, what);
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  try {
    if (!s.pending.empty()) collect_pending(device_, &s.pending, &s.free_blocks, s.free_size);
  } catch (...) {
    release(nbytes);
    throw;
  }

  // A cached block: the same class for small requests, the best fit wasting at most a quarter
  // for large ones.
  auto it = s.free_blocks.lower_bound(size);
  if (it != s.free_blocks.end() &&
      (size <= kSmallMax ? it->first == size : it->first <= size + size / 4)) {
    void* ptr = it->second;
    const size_t block_size = it->first;
    s.free_blocks.erase(it);
    s.free_size.erase(ptr);
    s.cached -= block_size;
    s.live[ptr] = Block{block_size, {}};
    ++s.stats.cache_hits;
    return ptr;
  }

  // Returns cached blocks to the device, the largest first, until in-use plus cached bytes and
  // `room` fit under `limit` (every block with limit 0): only as many cudaFree as needed, since
  // each one waits for the whole device.
  auto evict = [&](size_t limit, size_t room) {
    if (!s.pending.empty()) drain_pending(&s.pending, &s.free_blocks, s.free_size);
    bool any = false;
    while (!s.free_blocks.empty() && (limit == 0 || in_use() + s.cached + room > limit)) {
      auto largest = std::prev(s.free_blocks.end());
      const size_t block_size = largest->first;
      void* ptr = largest->second;
      s.free_blocks.erase(largest);
      s.free_size.erase(ptr);
      s.cached -= block_size;
      s.stats.reserved -= block_size;
      ++s.stats.evicted_blocks;
      any = true;
      STRATA_CUDA_CHECK(cudaFree(ptr));
    }
    if (any) ++s.stats.flushes;
  };
  void* ptr = nullptr;
  try {
    STRATA_CUDA_CHECK(cudaSetDevice(device_));
    // The limit counts bytes in use (this request included); cached bytes on top of it go back
    // to the device first, only as many as keep in-use plus cached bytes under the limit.
    const size_t limit = this->limit();
    if (limit != 0 && s.cached > 0 && in_use() + s.cached > limit) evict(limit, 0);
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation && s.cached > 0) {
      (void)cudaGetLastError();
      evict(0, 0);  // the device is full: give back the whole cache and try once more
      status = cudaMalloc(&ptr, size);
    }
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      if (status != cudaErrorMemoryAllocation) {
        STRATA_THROW() << "caching allocator of cuda:" << device_ << ": cudaMalloc of "
                       << format_bytes(size) << " failed: " << cuda_error(status);
      }
      release(nbytes);
      throw_out_of_memory(nbytes, what, cudaGetErrorString(status));
    }
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (...) {
    release(nbytes);
    throw;
  }
  ++s.stats.device_mallocs;
  s.stats.reserved += size;
  s.live[ptr] = Block{size, {}};
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr != nullptr) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    State& s = *state_;
    auto it = s.live.find(ptr);
    if (it != s.live.end()) {
      Block block = std::move(it->second);
      s.live.erase(it);
      if (block.users.empty()) {
        // Later work on our stream is ordered after every earlier use: reusable at once.
        s.free_size[ptr] = block.size;
        s.cached += block.size;
        s.free_blocks.emplace(block.size, ptr);
      } else {
        PendingBlock p{ptr, {}};
        cudaError_t failed = cudaSetDevice(device_);
        for (const OtherUse& u : block.users) {
          const cudaError_t status =
              failed == cudaSuccess ? cudaEventRecord(u.event, u.stream) : failed;
          if (status != cudaSuccess && failed == cudaSuccess) failed = status;
          p.events.push_back(u.event);
        }
        if (failed == cudaSuccess) {
          s.free_size[ptr] = block.size;
          s.cached += block.size;
          s.pending.push_back(std::move(p));
        } else {
          // Without the event the block might be reused while the other stream still reads it:
          // it is never reused (nor freed), and the next allocate() reports the error.
          (void)cudaGetLastError();
          for (cudaEvent_t e : p.events) cudaEventDestroy(e);
          s.deferred_error = "recording the event that guards a freed block (" +
                             format_bytes(block.size) +
                             ") used on another stream failed: " + cuda_error(failed) +
                             "; the block is kept out of the cache";
        }
      }
    }
  }
  release(nbytes);
}

size_t CachingAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->cached;
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  STRATA_CUDA_CHECK(cudaSetDevice(device_));
  // Cached blocks may still be read by work enqueued before they were freed.
  STRATA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  drain_pending(&s.pending, &s.free_blocks, s.free_size);
  for (auto& [block_size, ptr] : s.free_blocks) {
    STRATA_CUDA_CHECK(cudaFree(ptr));
    s.stats.reserved -= block_size;
  }
  s.free_blocks.clear();
  s.free_size.clear();
  s.cached = 0;
}

void CachingAllocator::record_use(void* ptr, void* stream) {
  if (stream == stream_) return;
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto it = state_->live.find(ptr);
  STRATA_CHECK(it != state_->live.end())
      << "record_use: " << ptr << " was not allocated by this allocator (cuda:" << device_ << ")";
  auto s = static_cast<cudaStream_t>(stream);
  for (const OtherUse& known : it->second.users) {
    if (known.stream == s) return;
  }
  STRATA_CUDA_CHECK(cudaSetDevice(device_));
  cudaEvent_t event = nullptr;
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  it->second.users.push_back({s, event});
}

CachingStats CachingAllocator::caching_stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

// ---- pinned host memory ------------------------------------------------------------------------

struct PinnedHostAllocator::State {
  mutable std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free;
  size_t cached = 0;
};

PinnedHostAllocator::PinnedHostAllocator() : state_(new State) {}

PinnedHostAllocator::~PinnedHostAllocator() {
  try {
    release_cached();
  } catch (const Error&) {  // a destructor only lets go
  }
  delete state_;
}

void* PinnedHostAllocator::allocate(size_t nbytes, const char* what) {
  reserve(nbytes, what);
  const size_t size = CachingAllocator::round_size(nbytes);
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->free.find(size);
    if (it != state_->free.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      state_->cached -= size;
      return ptr;
    }
  }
  void* ptr = nullptr;
  const cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    release(nbytes);
    throw_out_of_memory(nbytes, what, cudaGetErrorString(status));
  }
  return ptr;
}

void PinnedHostAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr != nullptr) {
    const size_t size = CachingAllocator::round_size(nbytes);
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->free[size].push_back(ptr);
    state_->cached += size;
  }
  release(nbytes);
}

size_t PinnedHostAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->cached;
}

void PinnedHostAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (auto& [size, blocks] : state_->free) {
    for (void* ptr : blocks) STRATA_CUDA_CHECK(cudaFreeHost(ptr));
  }
  state_->free.clear();
  state_->cached = 0;
}

}  // namespace strata::cuda
