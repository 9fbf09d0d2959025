// The CUDA runtime as the rest of the engine sees it, with no CUDA header in sight, so that code
// compiled by the host compiler can ask about devices in every build. The definitions come from
// cuda_runtime.cu in a CUDA build and from cuda_runtime_none.cpp otherwise, where there is no
// device and every device operation is an error saying the build has no CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "engine/allocator.h"
#include "engine/device.h"

namespace strata::cuda {

class CudaExec;

bool built_with_cuda();
// Any error from cudaGetDeviceCount (no driver, "driver version is insufficient", ...) counts
// as zero devices.
int device_count();
std::string device_name(int index);  // "" when the device does not exist
// The device's UUID as 32 hex digits ("" when it does not exist): the same GPU seen by several
// processes, whatever their CUDA_VISIBLE_DEVICES, has one UUID.
std::string device_uuid(int index);
// Waits on the host until cuda:`device` has finished everything enqueued on it, on every stream.
void synchronize_device(int device);
// Copies nbytes between any two of host and CUDA memory, then waits for the copy to finish.
void memcpy_blocking(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes);

// Sets nbytes of device memory to `value` after the device has finished its work, and waits.
void memset_blocking(void* dst, int value, size_t nbytes, Device device);
// Copies nbytes between host and CUDA memory on `stream` (a cudaStream_t) without waiting; the
// host side should be pinned (PinnedHostAllocator) for the copy to overlap anything.
void memcpy_async(void* dst, const void* src, size_t nbytes, void* stream);

// Sets nbytes of device memory to `value` on `stream` (a cudaStream_t) without waiting.
void memset_async(void* dst, int value, size_t nbytes, void* stream);

// An event recorded on a stream, which the host can test and wait for, for code compiled without
// the CUDA headers. Constructing one throws in a build without CUDA.
class HostEvent {
 public:
  explicit HostEvent(int device);
  ~HostEvent();
  HostEvent(const HostEvent&) = delete;
  HostEvent& operator=(const HostEvent&) = delete;
  void record(void* stream);  // a cudaStream_t of the event's device
  bool done() const;          // the work recorded before it has finished (never blocks)
  void synchronize() const;   // waits on the host for that work
  // Makes `stream` (a cudaStream_t of the event's device) wait, on the device, for that work.
  void block(void* stream) const;

 private:
  struct State;
  State* state_ = nullptr;
};

// Creates the CUDA state of an ExecContext on cuda:`device` (stream, handles, workspaces).
CudaExec* create_exec(int device);
// The stream of a CudaExec, as a cudaStream_t.
void* exec_stream(const CudaExec* exec);
// Waits for everything enqueued on the CudaExec's stream.
void synchronize_exec(const CudaExec* exec);
// Selects TF32 tensor-core products for fp32 matrix products on this context (or full fp32).
void set_tf32(CudaExec* exec, bool enabled);

// A non-blocking stream of its own on cuda:`device` (a cuda::Stream, engine/cuda_exec.h) with an
// event for ordering it after other streams, for code compiled without the CUDA headers (the
// executor's send and receive streams). Destroyed with the object; constructing one throws in a
// build without CUDA.
class StreamHandle {
 public:
  // `high_priority`: the device's greatest stream priority (its kernels and copies are scheduled
  // ahead of those of default-priority streams, such as the swap engine's); else the default.
  explicit StreamHandle(int device, bool high_priority = false);
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;

  void* get() const;  // the cudaStream_t
  int device() const;
  // Makes this stream wait, on the device, for the work enqueued on `producer` (a cudaStream_t of
  // the same device) so far: an event recorded there. The host does not wait.
  void wait_for(void* producer);
  // Waits on the host for everything enqueued on this stream so far.
  void synchronize() const;

 private:
  struct State;
  State* state_ = nullptr;
};

// NVTX ranges (shown by Nsight Systems); no-ops without CUDA.
void range_push(const char* name);
void range_pop();

// Statistics of the caching allocator beyond the common MemoryStats.
struct CachingStats {
  size_t reserved = 0;        // bytes held from cudaMalloc (in use + cached)
  size_t device_mallocs = 0;  // cudaMalloc calls
  size_t cache_hits = 0;      // allocations served from cached blocks
  size_t flushes = 0;         // times the cache was emptied to satisfy an allocation
};

// Device memory for the work of one stream, with a cache of freed blocks.
//
// Sizes are rounded to classes (multiples of 512 bytes up to 1 MiB, of 2 MiB above), and a freed
// block returns to the cache, from which a later request of the same class (small) or the best
// fitting block wasting at most a quarter of it (large) is served without cudaMalloc. Reuse is
// safe without synchronization because every allocation and every kernel using it is ordered on
// the allocator's stream. A block that was also used on another stream must be declared with
// record_use() before it is freed: it is then kept back until that stream's work, as of the free,
// is done.
//
// The limit (--mem-limit) counts requested bytes in use, as on the CPU; cached blocks are
// returned to the device when an allocation would push in-use plus cached bytes past the limit,
// or when cudaMalloc fails (then retried once). What still does not fit throws OutOfMemoryError
// naming the op, the request, the limit and the peak.
class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(int device, void* stream);  // stream: a cudaStream_t
  ~CachingAllocator() override;
  void* allocate(size_t nbytes, const char* what = nullptr) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cuda(device_); }
  size_t cached_bytes() const override;
  void release_cached() override;
  // `ptr` (from this allocator) is being used on `stream` too.
  void record_use(void* ptr, void* stream);
  CachingStats caching_stats() const;
  // The size class a request of nbytes is served from.
  static size_t round_size(size_t nbytes);

 private:
  struct State;
  int device_;
  void* stream_;
  State* state_;
};

// Page-locked host memory (cudaHostAlloc) for copies that overlap compute; device() is the CPU.
// Freed blocks are cached by exact size.
class PinnedHostAllocator final : public Allocator {
 public:
  PinnedHostAllocator();
  ~PinnedHostAllocator() override;
  void* allocate(size_t nbytes, const char* what = nullptr) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cpu(); }
  size_t cached_bytes() const override;
  void release_cached() override;

 private:
  struct State;
  State* state_;
};

// Device memory through cudaMalloc/cudaFree with the Allocator accounting and limit, no cache
// (for tests of the caching allocator and for memory that lives as long as the process).
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device_index);
  void* allocate(size_t nbytes, const char* what = nullptr) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
};

}  // namespace strata::cuda
