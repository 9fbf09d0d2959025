// The CUDA runtime seen by the engine: device discovery, streams and events, the state of a CUDA
// ExecContext (stream, library handles, workspaces), copies and plain device memory.
#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/cublas_lazy.h"
#include "engine/cuda_check.h"
#include "engine/cuda_exec.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"

namespace strata::cuda {

bool built_with_cuda() { return true; }

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

void synchronize_stream(int device, void* stream) {
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  if (stream == nullptr) {
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }
}

namespace {

// A copy on a stream of its own after the whole device(s) finished: for device memory that no
// stream orders (CudaAllocator), outside the training path.
void memcpy_after_device(void* dst, Device dst_device, const void* src, Device src_device,
                         size_t nbytes) {
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  if (src_device.is_cuda() && src_device.index != device) synchronize_device(src_device.index);
  synchronize_device(device);
  Stream stream(device);
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream.get()));
  stream.synchronize();
}

}  // namespace

namespace {

// Enqueues the copy on the stream memcpy_blocking describes and returns that stream (null: done
// already, the fallback for memory without a stream).
cudaStream_t enqueue_copy(void* dst, Device dst_device, void* dst_stream, const void* src,
                          Device src_device, void* src_stream, size_t nbytes) {
  if ((dst_device.is_cuda() && dst_stream == nullptr) ||
      (src_device.is_cuda() && src_stream == nullptr)) {
    memcpy_after_device(dst, dst_device, src, src_device, nbytes);
    return nullptr;
  }
  const bool on_dst = dst_device.is_cuda();
  const int device = on_dst ? dst_device.index : src_device.index;
  auto stream = static_cast<cudaStream_t>(on_dst ? dst_stream : src_stream);
  if (on_dst && src_device.is_cuda() && src_stream != dst_stream) {
    // The source's producer runs on another stream (of this device or another): order after it.
    STRATA_CUDA_CHECK(cudaSetDevice(src_device.index));
    Event produced;
    produced.record(static_cast<cudaStream_t>(src_stream));
    STRATA_CUDA_CHECK(cudaSetDevice(device));
    produced.block(stream);
  }
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream));
  return stream;
}

}  // namespace

void memcpy_blocking(void* dst, Device dst_device, void* dst_stream, const void* src,
                     Device src_device, void* src_stream, size_t nbytes) {
  if (nbytes == 0) return;
  cudaStream_t stream =
      enqueue_copy(dst, dst_device, dst_stream, src, src_device, src_stream, nbytes);
  if (stream != nullptr) STRATA_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void memcpy_ordered(void* dst, Device dst_device, void* dst_stream, const void* src,
                    Device src_device, void* src_stream, size_t nbytes) {
  if (nbytes == 0) return;
  enqueue_copy(dst, dst_device, dst_stream, src, src_device, src_stream, nbytes);
}

void memset_blocking(void* dst, int value, size_t nbytes, Device device, void* stream) {
  if (nbytes == 0) return;
  if (stream == nullptr) {
    synchronize_device(device.index);
    Stream own(device.index);
    STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, own.get()));
    own.synchronize();
    return;
  }
  STRATA_CUDA_CHECK(cudaSetDevice(device.index));
  STRATA_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, static_cast<cudaStream_t>(stream)));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
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

namespace {

constexpr int kMaxStridedDims = 8;

struct StridedCopy {
  int64_t shape[kMaxStridedDims];
  int64_t dst[kMaxStridedDims];
  int64_t src[kMaxStridedDims];
  int ndim;
  int64_t n;
};

// Element i (row-major over the shape) from src's strides to dst's.
template <typename E>
__global__ void copy_strided_kernel(E* __restrict__ dst, const E* __restrict__ src, StridedCopy c) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < c.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, d_off = 0, s_off = 0;
    for (int d = c.ndim - 1; d >= 0; --d) {
      const int64_t k = rest % c.shape[d];
      rest /= c.shape[d];
      d_off += k * c.dst[d];
      s_off += k * c.src[d];
    }
    dst[d_off] = src[s_off];
  }
}

}  // namespace

void copy_strided(void* dst, const int64_t* dst_strides, const void* src,
                  const int64_t* src_strides, const int64_t* shape, int ndim, size_t elem_size,
                  int device, void* stream) {
  STRATA_CHECK(ndim >= 0 && ndim <= kMaxStridedDims)
      << "copy_strided: " << ndim << " dimensions (at most " << kMaxStridedDims << ")";
  StridedCopy c{};
  c.ndim = ndim;
  c.n = 1;
  for (int d = 0; d < ndim; ++d) {
    c.shape[d] = shape[d];
    c.dst[d] = dst_strides[d];
    c.src[d] = src_strides[d];
    c.n *= shape[d];
  }
  if (c.n == 0) return;
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  std::unique_ptr<Stream> own;
  if (stream == nullptr) {
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
    own = std::make_unique<Stream>(device);
    stream = own->get();
  }
  auto s = static_cast<cudaStream_t>(stream);
  constexpr int kThreads = 256;
  const int64_t blocks64 = std::min<int64_t>((c.n + kThreads - 1) / kThreads, int64_t{1} << 16);
  const unsigned blocks = static_cast<unsigned>(blocks64);
  switch (elem_size) {
    case 1:
      copy_strided_kernel<uint8_t><<<blocks, kThreads, 0, s>>>(static_cast<uint8_t*>(dst),
                                                               static_cast<const uint8_t*>(src), c);
      break;
    case 2:
      copy_strided_kernel<uint16_t><<<blocks, kThreads, 0, s>>>(
          static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), c);
      break;
    case 4:
      copy_strided_kernel<uint32_t><<<blocks, kThreads, 0, s>>>(
          static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), c);
      break;
    case 8:
      copy_strided_kernel<uint64_t><<<blocks, kThreads, 0, s>>>(
          static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), c);
      break;
    default:
      STRATA_THROW() << "copy_strided: elements of " << elem_size << " bytes";
  }
  STRATA_CUDA_LAUNCH_CHECK("copy_strided_kernel");
  if (own != nullptr) own->synchronize();
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
  load_cublas();  // loaded here, not when the program starts (engine/cublas_lazy.h)
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
  if (blas_lt_workspace_ != nullptr) cudaFree(blas_lt_workspace_);
#ifdef STRATA_WITH_CUDNN
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
#endif
  if (blas_lt_ != nullptr) cublasLtDestroy(blas_lt_);
  if (blas_ != nullptr) cublasDestroy(blas_);
}

CudaExec& exec(const ExecContext& ctx, const char* op) {
  CudaExec* x = ctx.cuda();
  STRATA_CHECK(x != nullptr) << (op != nullptr ? op : "a CUDA op") << " needs a CUDA context, got "
                             << ctx.device().str();
  // Kernels launch on the current device: make it the context's (a thread-local setting, cheap).
  STRATA_CUDA_CHECK(cudaSetDevice(x->device()));
  return *x;
}

Tensor scratch(const ExecContext& ctx, size_t bytes, const char* what) {
  const int64_t n = static_cast<int64_t>(bytes > 0 ? bytes : 1);
  auto storage = std::make_shared<Storage>(ctx.allocator(), static_cast<size_t>(n), what);
  return Tensor(std::move(storage), 0, {n}, {1}, DType::kU8);
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
