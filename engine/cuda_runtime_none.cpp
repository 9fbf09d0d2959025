// The CUDA runtime of a build without CUDA: no device exists.
#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/exec_context.h"

namespace strata::cuda {
namespace {

[[noreturn]] void no_cuda(const std::string& what) {
  STRATA_THROW() << what
                 << ": this build of Strata has no CUDA support (configure with "
                    "-DSTRATA_WITH_CUDA=ON on a machine with the CUDA toolkit)";
}

}  // namespace

bool built_with_cuda() { return false; }
std::string device_name(int) { return ""; }
std::string device_uuid(int) { return ""; }
void synchronize_device(int device) { no_cuda("synchronizing cuda:" + std::to_string(device)); }

void synchronize_stream(int device, void*) {
  no_cuda("synchronizing a stream of cuda:" + std::to_string(device));
}
void memcpy_blocking(void*, Device dst_device, void*, const void*, Device src_device, void*,
                     size_t) {
  no_cuda("copy " + src_device.str() + " -> " + dst_device.str());
}
void memcpy_ordered(void*, Device dst_device, void*, const void*, Device src_device, void*,
                    size_t) {
  no_cuda("copy " + src_device.str() + " -> " + dst_device.str());
}
void memset_blocking(void*, int, size_t, Device device, void*) {
  no_cuda("memset on " + device.str());
}
void memcpy_async(void*, const void*, size_t, void*) { no_cuda("asynchronous copy"); }
void memset_async(void*, int, size_t, void*) { no_cuda("asynchronous memset"); }
void copy_strided(void*, const int64_t*, const void*, const int64_t*, const int64_t*, int, size_t,
                  int device, void*) {
  no_cuda("a strided copy on cuda:" + std::to_string(device));
}

HostEvent::HostEvent(int device) { no_cuda("an event on cuda:" + std::to_string(device)); }
HostEvent::~HostEvent() = default;
void HostEvent::record(void*) { no_cuda("an event"); }
bool HostEvent::done() const { return true; }
void HostEvent::synchronize() const {}
void HostEvent::block(void*) const { no_cuda("stream ordering"); }

CudaExec* create_exec(int device) { no_cuda("cuda:" + std::to_string(device)); }
void destroy_exec(CudaExec* exec) {
  STRATA_CHECK(exec == nullptr) << "a CudaExec in a build without CUDA";
}
void* exec_stream(const CudaExec*) { return nullptr; }
void synchronize_exec(const CudaExec*) {}
void set_tf32(CudaExec*, bool) {}
StreamHandle::StreamHandle(int device, bool) {
  no_cuda("a stream on cuda:" + std::to_string(device));
}
StreamHandle::~StreamHandle() = default;
void* StreamHandle::get() const { return nullptr; }
int StreamHandle::device() const { return 0; }
void StreamHandle::wait_for(void*) { no_cuda("stream ordering"); }
void StreamHandle::synchronize() const {}
void range_push(const char*) {}
void range_pop() {}

CachingAllocator::CachingAllocator(int device, void*) : device_(device), stream_(nullptr) {
  no_cuda("cuda:" + std::to_string(device));
}
CachingAllocator::~CachingAllocator() = default;
void* CachingAllocator::allocate(size_t, const char*) { return nullptr; }
void CachingAllocator::deallocate(void*, size_t) {}
size_t CachingAllocator::cached_bytes() const { return 0; }
void CachingAllocator::release_cached() {}
void CachingAllocator::record_use(void*, void*) {}
CachingStats CachingAllocator::caching_stats() const { return {}; }
size_t CachingAllocator::round_size(size_t nbytes) { return nbytes; }

PinnedHostAllocator::PinnedHostAllocator() : state_(nullptr) { no_cuda("pinned host memory"); }
PinnedHostAllocator::~PinnedHostAllocator() = default;
void* PinnedHostAllocator::allocate(size_t, const char*) { return nullptr; }
void PinnedHostAllocator::deallocate(void*, size_t) {}
size_t PinnedHostAllocator::cached_bytes() const { return 0; }
void PinnedHostAllocator::release_cached() {}

CudaAllocator::CudaAllocator(int device_index) : index_(device_index) {
  no_cuda("cuda:" + std::to_string(device_index));
}
void* CudaAllocator::allocate(size_t, const char*) { return nullptr; }
void CudaAllocator::deallocate(void*, size_t) {}

}  // namespace strata::cuda
