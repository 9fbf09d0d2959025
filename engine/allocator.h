// Allocators with accounting and an optional limit.
//
// Every byte a tensor owns comes from an Allocator, which counts the bytes in use (current), the
// most ever in use (peak) and refuses an allocation that would pass its limit with an
// OutOfMemoryError naming the device, the request, the limit and the peak:
//
//   out of memory on cpu: cannot allocate 512.00 MiB (limit 1.00 GiB, in use 600.00 MiB,
//   peak 600.00 MiB)
//
// A limit lets memory planning (swap, recompute, job arrays) be tested on the CPU as on a GPU.
// Allocators are passed explicitly (ExecContext::allocator()); default_cpu_allocator() is the one
// used when nothing else is given.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/device.h"

namespace strata {

struct MemoryStats {
  size_t current = 0;      // bytes in use
  size_t peak = 0;         // the most bytes ever in use (since the last reset_peak)
  size_t limit = 0;        // 0: no limit
  size_t allocations = 0;  // allocations served
  size_t cached = 0;       // bytes freed by tensors and kept for reuse (not counted in current)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Never returns null: throws OutOfMemoryError instead. `what` (an op or tensor name) goes
  // into the error when given.
  virtual void* allocate(size_t nbytes, const char* what = nullptr) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual Device device() const = 0;

  MemoryStats stats() const;
  // Bytes the allocator holds for reuse beyond those in use; 0 for a non-caching allocator.
  virtual size_t cached_bytes() const { return 0; }
  // Returns cached blocks to the system.
  virtual void release_cached() {}
  // The CUDA stream (a cudaStream_t) that orders every use and reuse of this allocator's memory
  // (a context's caching allocator: its stream), or null (host memory, or device memory with no
  // stream order). Copies of its memory are ordered on that stream (engine/cuda_runtime.h).
  virtual void* stream() const { return nullptr; }
  // Host memory the device reads directly in an asynchronous copy (page-locked, cudaHostAlloc).
  virtual bool page_locked() const { return false; }
  // 0 removes the limit. A limit below the bytes in use only refuses later allocations.
  void set_limit(size_t bytes) { limit_.store(bytes); }
  size_t limit() const { return limit_.load(); }
  void reset_peak() { peak_.store(current_.load()); }
  // A second peak for measuring one stretch of work (the layer profiler) without touching the
  // run's peak: the most bytes in use since the last reset_window_peak().
  void reset_window_peak() { window_peak_.store(current_.load()); }
  size_t window_peak() const { return window_peak_.load(); }
  // Called when an allocation would pass the limit, before failing: the handler may free memory
  // that is on its way out (tensors being swapped to host memory) and returns true when it freed
  // some, and the allocation is tried again. Called on the allocating thread with no lock held;
  // null removes it.
  using PressureHandler = std::function<bool(size_t nbytes)>;
  void set_pressure_handler(PressureHandler handler);

 protected:
  // Accounting shared by all allocators: reserve() throws OutOfMemoryError when the limit would
  // be passed; release() returns bytes.
  void reserve(size_t nbytes, const char* what);
  void release(size_t nbytes);
  size_t in_use() const { return current_.load(); }
  [[noreturn]] void throw_out_of_memory(size_t nbytes, const char* what, const char* reason) const;

 private:
  std::atomic<size_t> current_{0};
  std::atomic<size_t> peak_{0};
  std::atomic<size_t> limit_{0};
  std::atomic<size_t> allocations_{0};
  std::atomic<size_t> window_peak_{0};
  std::mutex handler_mutex_;
  std::shared_ptr<PressureHandler> pressure_handler_;
};

// 64-byte aligned host memory from the C library, with a cache of freed blocks.
//
// A training step allocates the same sizes every step; handing a freed block back to the C
// library and asking again costs a page fault per 4 KiB touched (the library maps large blocks
// afresh), which on a small CNN was a fifth of the run time. So freed blocks are kept in
// exact-size free lists (sizes rounded up to 64 bytes, or 4 KiB past 64 KiB) and reused. The
// limit applies to bytes in use; cached blocks are returned to the system when an allocation
// would otherwise push in-use plus cached bytes past the limit, and on release_cached().
class CpuAllocator final : public Allocator {
 public:
  explicit CpuAllocator(bool caching = true) : caching_(caching) {}
  ~CpuAllocator() override;
  void* allocate(size_t nbytes, const char* what = nullptr) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cpu(); }
  size_t cached_bytes() const override;
  void release_cached() override;

 private:
  void release_cached_locked();

  bool caching_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // rounded size -> blocks
  size_t cached_ = 0;
};

// The process's default CPU allocator (used when a caller gives none).
CpuAllocator& default_cpu_allocator();

// "512MiB", "2GiB", "1.5GB", "1000000" (bytes) -> bytes. Units: B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024), K/M/G/T taken as KiB/MiB/GiB/TiB. Throws strata::Error
// naming the text otherwise.
size_t parse_bytes(const std::string& text);
// 1536 -> "1.50 KiB"
std::string format_bytes(size_t bytes);

}  // namespace strata
