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
// The number of CUDA devices, asked once per process. An error from cudaGetDeviceCount (no
// driver, "driver version is insufficient", a missing library) counts as zero devices and is
// logged once (a warning naming the CUDA error), except cudaErrorNoDevice, which is what a
// machine without a GPU says; device_count_error() keeps the message either way.
int device_count();
// Why device_count() is zero: "" when it is not, or when this build has no CUDA (see
// built_with_cuda()); else the error of cudaGetDeviceCount ("CUDA error 35
// (cudaErrorInsufficientDriver): ...").
std::string device_count_error();
// What device_count() asks, without caching or logging: cudaGetDeviceCount in a CUDA build (0
// and the error's text in *error when it fails), 0 without CUDA. Its own source file
// (cuda_probe.cu, cuda_probe_none.cpp), so that a test can link a probe that fails instead.
int probe_device_count(std::string* error);
std::string device_name(int index);  // "" when the device does not exist
// The device's UUID as 32 hex digits ("" when it does not exist): the same GPU seen by several
// processes, whatever their CUDA_VISIBLE_DEVICES, has one UUID.
std::string device_uuid(int index);
// Waits on the host until cuda:`device` has finished everything enqueued on it, on every stream.
void synchronize_device(int device);
// Waits on the host for the work enqueued so far on `stream` (a cudaStream_t of cuda:`device`),
// or, when it is null (memory with no stream order, Allocator::stream()), on the whole device.
void synchronize_stream(int device, void* stream);

// Copies nbytes between any two of host and CUDA memory and waits for the copy, without waiting
// for the rest of the device. `dst_stream` and `src_stream` are the streams that order the two
// sides' memory (Allocator::stream(); null for host memory): the copy runs on the destination's
// stream when it is device memory, else on the source's, after the work enqueued so far on both
// (an event orders a source stream that is not the copy's), and only that stream is waited for.
// Device memory with no stream order (null stream on a device side) falls back to waiting for
// every stream of its device first.
void memcpy_blocking(void* dst, Device dst_device, void* dst_stream, const void* src,
                     Device src_device, void* src_stream, size_t nbytes);

// The same copy without the wait: ordered on the destination's stream (or the source's) as above;
// the host must not read a host destination before that stream is synchronized. Device memory
// with no stream order falls back to memcpy_blocking.
void memcpy_ordered(void* dst, Device dst_device, void* dst_stream, const void* src,
                    Device src_device, void* src_stream, size_t nbytes);

// Sets nbytes of device memory to `value`, ordered and waited for on `stream` as above (null:
// after the whole device has finished its work).
void memset_blocking(void* dst, int value, size_t nbytes, Device device, void* stream);
// Copies nbytes between host and CUDA memory on `stream` (a cudaStream_t) without waiting; the
// host side should be pinned (PinnedHostAllocator) for the copy to overlap anything.
void memcpy_async(void* dst, const void* src, size_t nbytes, void* stream);

// Copies the elements of a strided view into another (a gather or a scatter: a channels-last
// tensor made contiguous), on the device: `shape` (ndim <= 8 dimensions) elements of elem_size
// bytes (1, 2, 4 or 8) from src to dst with the given strides in elements, ordered on `stream`
// (a cudaStream_t of the memory's device; null: after the whole device, and waited for).
void copy_strided(void* dst, const int64_t* dst_strides, const void* src,
                  const int64_t* src_strides, const int64_t* shape, int ndim, size_t elem_size,
                  int device, void* stream);

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
  size_t flushes = 0;         // allocations that returned cached blocks to the device first
  size_t evicted_blocks = 0;  // cached blocks returned to the device (cudaFree) that way
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
// The limit (--mem-limit) counts requested bytes in use, as on the CPU; when an allocation that
// misses the cache would push in-use plus cached bytes past the limit, cached blocks are returned
// to the device, the largest first, only as many as it takes (a cudaFree waits for the whole
// device); when cudaMalloc fails, the whole cache is, and it is retried once. What still does not
// fit throws OutOfMemoryError naming the op, the request, the limit and the peak. Any other CUDA
// error (an event that cannot be created or queried, a failing cudaFree) is a strata::Error naming
// the call (see cuda_allocator.cu for the one deallocate() cannot throw).
class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(int device, void* stream);  // stream: a cudaStream_t
  ~CachingAllocator() override;
  void* allocate(size_t nbytes, const char* what = nullptr) override;
  void deallocate(void* ptr, size_t nbytes) override;
  Device device() const override { return Device::cuda(device_); }
  size_t cached_bytes() const override;
  void release_cached() override;
  void* stream() const override { return stream_; }
  // `ptr` (from this allocator) is being used on `stream` too. Creates the event that will guard
  // the block when it is freed (throws naming cudaEventCreateWithFlags if that fails).
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
  bool page_locked() const override { return true; }

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
