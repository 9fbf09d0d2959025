// The CUDA runtime seen by the engine: device discovery, streams and events, the state of a CUDA
// ExecContext (stream, library handles, workspaces), copies and plain device memory.
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <string>

#include "engine/cuda_check.h"
#include "engine/cuda_exec.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"

namespace strata::cuda {

bool built_with_cuda() { return true; }

int device_count() {
  int n = 0;
  const cudaError_t status = cudaGetDeviceCount(&n);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return n;
}

std::string device_name(int index) {
  if (index < 0 || index >= device_count()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "";
  return prop.name;
}

std::string device_uuid(int index) {
  if (index < 0 || index >= device_count()) return "";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return "";
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (char byte : prop.uuid.bytes) {
    const auto b = static_cast<unsigned char>(byte);
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

void synchronize_device(int device) {
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  STRATA_CUDA_CHECK(cudaDeviceSynchronize());
}

void memcpy_blocking(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t nbytes) {
  if (nbytes == 0) return;
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  // The source may still be being written by kernels on some context's stream (ops never wait):
  // let the device finish everything first. Copies on a hot path use memcpy_async on the
  // stream that produced the data instead.
  STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    STRATA_CUDA_CHECK(cudaSetDevice(src_device.index));
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
    STRATA_CUDA_CHECK(cudaSetDevice(device));
  }
  cudaStream_t stream = nullptr;
  STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const cudaError_t copy = cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream);
  const cudaError_t sync = cudaStreamSynchronize(stream);
  STRATA_CUDA_CHECK(cudaStreamDestroy(stream));
  STRATA_CUDA_CHECK(copy);
  STRATA_CUDA_CHECK(sync);
}

void memset_blocking(void* dst, int value, size_t nbytes, Device device) {
  if (nbytes == 0) return;
  STRATA_CUDA_CHECK(cudaSetDevice(device.index));
  STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  Stream stream(device.index);
  STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, stream.get()));
  stream.synchronize();
}

void memcpy_async(void* dst, const void* src, size_t nbytes, void* stream) {
  if (nbytes == 0) return;
  STRATA_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
}

void memset_async(void* dst, int value, size_t nbytes, void* stream) {
  if (nbytes == 0) return;
  STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, static_cast<cudaStream_t>(stream)));
}

struct HostEvent::State {
  int device;
  Event event;
  explicit State(int d) : device(d) {}
};

HostEvent::HostEvent(int device) {
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  state_ = new State(device);
}
HostEvent::~HostEvent() { delete state_; }
void HostEvent::record(void* stream) {
  STRATA_CUDA_CHECK(cudaSetDevice(state_->device));
  state_->event.record(static_cast<cudaStream_t>(stream));
}
bool HostEvent::done() const { return state_->event.query(); }
void HostEvent::synchronize() const { state_->event.synchronize(); }
void HostEvent::block(void* stream) const {
  STRATA_CUDA_CHECK(cudaSetDevice(state_->device));
  state_->event.block(static_cast<cudaStream_t>(stream));
}

void range_push(const char* name) { nvtxRangePushA(name); }
void range_pop() { nvtxRangePop(); }

// ---- streams and events ------------------------------------------------------------------------

Stream::Stream(int device, int priority) : device_(device) {
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  STRATA_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }
}

void Stream::synchronize() const { STRATA_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(bool timing) {
  STRATA_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) { STRATA_CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::block(cudaStream_t stream) const {
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}
bool Event::query() const {
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  STRATA_CUDA_CHECK(status);
  return true;
}
void Event::synchronize() const { STRATA_CUDA_CHECK(cudaEventSynchronize(event_)); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

struct StreamHandle::State {
  Stream stream;
  Event ready;  // recorded on a producer stream by wait_for
  State(int device, int priority) : stream(device, priority) {}
};

namespace {

int greatest_priority(int device) {
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  int least = 0, greatest = 0;
  STRATA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

}  // namespace

StreamHandle::StreamHandle(int device, bool high_priority)
    : state_(new State(device, high_priority ? greatest_priority(device) : 0)) {}
StreamHandle::~StreamHandle() { delete state_; }
void* StreamHandle::get() const { return state_->stream.get(); }
int StreamHandle::device() const { return state_->stream.device(); }
void StreamHandle::wait_for(void* producer) {
  STRATA_CUDA_CHECK(cudaSetDevice(state_->stream.device()));
  state_->ready.record(static_cast<cudaStream_t>(producer));
  state_->ready.block(state_->stream.get());
}
void StreamHandle::synchronize() const { state_->stream.synchronize(); }

// ---- the state of a CUDA ExecContext -----------------------------------------------------------

#ifdef STRATA_WITH_CUDNN
std::string cudnn_last_error_suffix() {
  char message[512] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  return message[0] != 0 ? std::string(" (") + message + ")" : std::string();
}
#endif

CudaExec::CudaExec(int device) : stream_(device) {
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  sm_count_ = prop.multiProcessorCount;
  compute_capability_ = prop.major * 10 + prop.minor;
  STRATA_CUBLAS_CHECK(cublasCreate(&blas_));
  STRATA_CUBLAS_CHECK(cublasSetStream(blas_, stream_.get()));
  STRATA_CUBLAS_CHECK(cublasLtCreate(&blas_lt_));
#ifdef STRATA_WITH_CUDNN
  STRATA_CUDNN_CHECK(cudnnCreate(&cudnn_));
  STRATA_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_.get()));
#endif
  STRATA_CUDA_CHECK(cudaMalloc(&blas_lt_workspace_, kBlasLtWorkspaceBytes));
  STRATA_CUBLAS_CHECK(cublasSetWorkspace(blas_, blas_lt_workspace_, kBlasLtWorkspaceBytes));
}

CudaExec::~CudaExec() {
  cudaSetDevice(stream_.device());
  cudaStreamSynchronize(stream_.get());
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (blas_lt_workspace_ != nullptr) cudaFree(blas_lt_workspace_);
#ifdef STRATA_WITH_CUDNN
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
#endif
  if (blas_lt_ != nullptr) cublasLtDestroy(blas_lt_);
  if (blas_ != nullptr) cublasDestroy(blas_);
}

void* CudaExec::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  STRATA_CUDA_CHECK(cudaSetDevice(device()));
  if (scratch_ != nullptr) {
    // Kernels enqueued earlier may still read the old buffer.
    STRATA_CUDA_CHECK(cudaStreamSynchronize(stream()));
    STRATA_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  const size_t rounded = (bytes + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);
  const cudaError_t status = cudaMalloc(&scratch_, rounded);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    scratch_ = nullptr;
    STRATA_THROW() << "out of memory on cuda:" << device() << ": cannot allocate a workspace of "
                   << format_bytes(rounded) << " (" << cudaGetErrorString(status) << ")";
  }
  scratch_bytes_ = rounded;
  return scratch_;
}

CudaExec& exec(const ExecContext& ctx, const char* op) {
  CudaExec* x = ctx.cuda();
  STRATA_CHECK(x != nullptr) << (op != nullptr ? op : "a CUDA op") << " needs a CUDA context, got "
                             << ctx.device().str();
  // Kernels launch on the current device: make it the context's (a thread-local setting, cheap).
  STRATA_CUDA_CHECK(cudaSetDevice(x->device()));
  return *x;
}

CudaExec* create_exec(int device) {
  check_device_available(Device::cuda(device));
  return new CudaExec(device);
}
void destroy_exec(CudaExec* exec) { delete exec; }
void* exec_stream(const CudaExec* exec) { return exec->stream(); }
void synchronize_exec(const CudaExec* exec) {
  STRATA_CUDA_CHECK(cudaStreamSynchronize(exec->stream()));
}
void set_tf32(CudaExec* exec, bool enabled) {
  exec->set_math_mode(enabled ? MathMode::kTf32 : MathMode::kFp32);
}

// ---- plain device memory -----------------------------------------------------------------------

CudaAllocator::CudaAllocator(int device_index) : index_(device_index) {
  check_device_available(Device::cuda(device_index));
}

void* CudaAllocator::allocate(size_t nbytes, const char* what) {
  reserve(nbytes, what);
  STRATA_CUDA_CHECK(cudaSetDevice(index_));
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, nbytes == 0 ? 1 : nbytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    release(nbytes);
    throw_out_of_memory(nbytes, what, cudaGetErrorString(status));
  }
  return ptr;
}

void CudaAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr != nullptr) {
    cudaSetDevice(index_);
    cudaFree(ptr);
  }
  release(nbytes);
}

}  // namespace strata::cuda
