// The caching device allocator and the pinned host allocator (see engine/cuda_runtime.h).
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/cuda_check.h"
#include "engine/cuda_runtime.h"

namespace strata::cuda {
namespace {

constexpr size_t kSmallQuantum = 512;
constexpr size_t kSmallMax = size_t{1} << 20;
constexpr size_t kLargeQuantum = size_t{2} << 20;

struct Block {
  size_t size = 0;                    // the size class, as allocated by cudaMalloc
  std::vector<cudaStream_t> streams;  // other streams that used it (record_use)
};

// A freed block still used by other streams: reusable once every event has fired.
struct PendingBlock {
  void* ptr;
  std::vector<cudaEvent_t> events;
};

}  // namespace

struct CachingAllocator::State {
  mutable std::mutex mutex;
  std::unordered_map<void*, Block> live;     // handed out
  std::multimap<size_t, void*> free_blocks;  // size class -> cached block
  std::unordered_map<void*, size_t> free_size;
  std::vector<PendingBlock> pending;
  size_t cached = 0;  // bytes of free_blocks and pending
  CachingStats stats;
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
  release_cached();
  delete state_;
}

namespace {

// Moves pending blocks whose events have all fired to the free lists. Caller holds the mutex.
void collect_pending(std::vector<PendingBlock>* pending, std::multimap<size_t, void*>* free_blocks,
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
    }
    if (!done) {
      ++i;
      continue;
    }
    for (cudaEvent_t e : p.events) cudaEventDestroy(e);
    const size_t size = sizes.at(p.ptr);
    free_blocks->emplace(size, p.ptr);
    (*pending)[i] = pending->back();
    pending->pop_back();
  }
}

}  // namespace

void* CachingAllocator::allocate(size_t nbytes, const char* what) {
  reserve(nbytes, what);
  const size_t size = round_size(nbytes);
  std::lock_guard<std::mutex> lock(state_->mutex);
  State& s = *state_;
  if (!s.pending.empty()) collect_pending(&s.pending, &s.free_blocks, s.free_size);

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

  const size_t limit = this->limit();
  auto flush = [&]() {
    // Blocks may only be freed once the stream is done with them.
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    for (PendingBlock& p : s.pending) {
      for (cudaEvent_t e : p.events) {
        cudaEventSynchronize(e);
        cudaEventDestroy(e);
      }
      s.free_blocks.emplace(s.free_size.at(p.ptr), p.ptr);
    }
    s.pending.clear();
    for (auto& [block_size, ptr] : s.free_blocks) {
      cudaFree(ptr);
      s.stats.reserved -= block_size;
    }
    s.free_blocks.clear();
    s.free_size.clear();
    s.cached = 0;
    ++s.stats.flushes;
  };
  STRATA_CUDA_CHECK(cudaSetDevice(device_));
  // The limit counts bytes in use; cached bytes on top of it go back to the device first.
  if (limit != 0 && in_use() + s.cached > limit && s.cached > 0) flush();

  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status != cudaSuccess && s.cached > 0) {
    (void)cudaGetLastError();
    flush();
    status = cudaMalloc(&ptr, size);
  }
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    release(nbytes);
    throw_out_of_memory(nbytes, what, cudaGetErrorString(status));
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
      s.free_size[ptr] = block.size;
      s.cached += block.size;
      if (block.streams.empty()) {
        // Later work on our stream is ordered after every earlier use: reusable at once.
        s.free_blocks.emplace(block.size, ptr);
      } else {
        cudaSetDevice(device_);
        PendingBlock p{ptr, {}};
        for (cudaStream_t other : block.streams) {
          cudaEvent_t e = nullptr;
          if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess) {
            cudaEventRecord(e, other);
            p.events.push_back(e);
          }
        }
        s.pending.push_back(std::move(p));
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
  cudaSetDevice(device_);
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (PendingBlock& p : s.pending) {
    for (cudaEvent_t e : p.events) {
      cudaEventSynchronize(e);
      cudaEventDestroy(e);
    }
    s.free_blocks.emplace(s.free_size.at(p.ptr), p.ptr);
  }
  s.pending.clear();
  for (auto& [block_size, ptr] : s.free_blocks) {
    cudaFree(ptr);
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
  for (cudaStream_t known : it->second.streams) {
    if (known == s) return;
  }
  it->second.streams.push_back(s);
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
  release_cached();
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
    for (void* ptr : blocks) cudaFreeHost(ptr);
  }
  state_->free.clear();
  state_->cached = 0;
}

}  // namespace strata::cuda
