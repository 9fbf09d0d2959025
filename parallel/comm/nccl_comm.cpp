// NCCL backend: one ncclComm_t, one non-blocking CUDA stream and one "caller ready" event per
// communicator, shared (State) by the communicator and its requests so that a request outlives
// nothing it needs.
//
// Ordering. Each launch first makes the communicator's stream wait for an event recorded on the
// caller's stream (when one is set), then enqueues the NCCL call, then records a completion event
// that Request::test queries. Point-to-point operations are not launched when posted: they wait
// in a pending list that is launched as one ncclGroupStart/End group at the first test/wait/
// collective/barrier/split, because separately launched ncclSend/ncclRecv calls serialize on the
// stream and a ring (everyone sends to the next and receives from the previous) would deadlock.
//
// Failure. A wait past its deadline, or an asynchronous NCCL error seen while polling, aborts the
// communicator (ncclCommAbort frees it and stops its kernels); the state remembers why, and every
// later call throws CommAborted with that reason. Tensors of requests dropped before completion
// are kept by the state until the communicator is gone, since the device may still write them.
#include "parallel/comm/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "engine/cuda_check.h"
#include "parallel/comm/nccl_check.h"

namespace strata::parallel {
namespace nccl_detail {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTag = 32768;

// A completion event; `recorded` once the operation it marks has been enqueued.
struct Completion {
  cudaEvent_t event = nullptr;
  bool recorded = false;
  Completion() { STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
  ~Completion() { cudaEventDestroy(event); }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
};

struct P2p {
  bool send;
  Tensor tensor;
  int peer;
};

struct State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t caller_ready = nullptr;
  cudaStream_t caller_stream = nullptr;
  int device = 0;
  int rank = 0;
  int size = 1;
  bool aborted = false;
  std::string abort_reason;
  std::vector<P2p> pending;                  // posted sends/receives, not launched yet
  std::shared_ptr<Completion> pending_done;  // the event their requests wait on
  std::vector<Tensor> orphans;               // tensors of requests dropped before completion
  int32_t* barrier_word = nullptr;           // one i32 on the device, for barrier()

  State(ncclComm_t c, int dev) : comm(c), device(dev) {
    STRATA_CUDA_CHECK(cudaSetDevice(device));
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&caller_ready, cudaEventDisableTiming));
    STRATA_CUDA_CHECK(cudaMalloc(&barrier_word, sizeof(int32_t)));
    STRATA_CUDA_CHECK(cudaMemsetAsync(barrier_word, 0, sizeof(int32_t), stream));  // 0 + 0 = 0
    STRATA_NCCL_CHECK(ncclCommUserRank(comm, &rank));
    STRATA_NCCL_CHECK(ncclCommCount(comm, &size));
  }

  // Destroying waits for the communicator's operations; with operations whose requests were
  // dropped unfinished (after a failure), abort instead, which cannot hang on a dead peer.
  ~State() {
    cudaSetDevice(device);
    if (!aborted && orphans.empty()) {
      ncclCommDestroy(comm);
    } else if (!aborted) {
      ncclCommAbort(comm);
    }
    cudaFree(barrier_word);
    cudaEventDestroy(caller_ready);
    cudaStreamDestroy(stream);
  }

  std::string who() const { return "rank " + std::to_string(rank); }

  void check_usable(const std::string& op) const {
    if (aborted) {
      throw CommAborted("nccl comm: " + who() + ": " + op +
                        ": the communicator was aborted: " + abort_reason);
    }
  }

  void abort(const std::string& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    ncclCommAbort(comm);
  }

  // Makes the communicator's stream wait for the work enqueued on the caller's stream so far.
  void order_after_caller() {
    STRATA_CUDA_CHECK(cudaSetDevice(device));
    if (caller_stream == nullptr) return;
    STRATA_CUDA_CHECK(cudaEventRecord(caller_ready, caller_stream));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream, caller_ready, 0));
  }

  // Launches the pending sends and receives as one NCCL group.
  void flush() {
    if (pending.empty()) return;
    check_usable("launching sends/receives");
    order_after_caller();
    STRATA_NCCL_CHECK(ncclGroupStart());
    for (const P2p& p : pending) {
      if (p.send) {
        STRATA_NCCL_CHECK(
            ncclSend(p.tensor.raw_data(), p.tensor.nbytes(), ncclUint8, p.peer, comm, stream));
      } else {
        STRATA_NCCL_CHECK(
            ncclRecv(p.tensor.raw_data(), p.tensor.nbytes(), ncclUint8, p.peer, comm, stream));
      }
    }
    STRATA_NCCL_CHECK(ncclGroupEnd());
    STRATA_CUDA_CHECK(cudaEventRecord(pending_done->event, stream));
    pending_done->recorded = true;
    pending.clear();
    pending_done = nullptr;
  }

  // Aborts and throws on an asynchronous NCCL error.
  void check_async_error(const std::string& op) {
    ncclResult_t async = ncclSuccess;
    STRATA_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    if (async == ncclSuccess || async == ncclInProgress) return;
    const std::string reason = std::string("asynchronous NCCL error ") + ncclGetErrorString(async) +
                               ": " + ncclGetLastError(comm);
    abort(reason);
    STRATA_THROW() << "nccl comm: " << who() << ": " << op << ": " << reason;
  }
};

class NcclRequest final : public Request {
 public:
  NcclRequest(std::shared_ptr<State> state, std::shared_ptr<Completion> done,
              std::vector<Tensor> tensors, std::string op)
      : state_(std::move(state)),
        done_event_(std::move(done)),
        tensors_(std::move(tensors)),
        op_(std::move(op)) {}

  ~NcclRequest() override {
    if (!done_) {
      for (Tensor& t : tensors_) state_->orphans.push_back(std::move(t));
    }
  }

  bool test() override {
    if (done_) return true;
    state_->check_usable(op_);
    if (!done_event_->recorded) state_->flush();
    STRATA_CUDA_CHECK(cudaSetDevice(state_->device));
    const cudaError_t status = cudaEventQuery(done_event_->event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      state_->check_async_error(op_);
      return false;
    }
    STRATA_CUDA_CHECK(status);
    done_ = true;
    tensors_.clear();
    return true;
  }

  // The stream waits on the device for the completion event (launching the pending group first);
  // the host does not wait. test()/wait() later still see a failure or a timeout.
  void wait_on_stream(void* stream, std::chrono::milliseconds timeout,
                      const std::string& what) override {
    if (done_) return;
    state_->check_usable(op_ + " (" + what + ")");
    if (!done_event_->recorded) state_->flush();
    STRATA_CUDA_CHECK(cudaSetDevice(state_->device));
    STRATA_CUDA_CHECK(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done_event_->event, 0));
  }

  void wait(std::chrono::milliseconds timeout, const std::string& what) override {
    const Clock::time_point start = Clock::now();
    auto pause = std::chrono::microseconds(50);
    while (!test()) {
      if (timeout.count() > 0 && Clock::now() - start >= timeout) {
        const std::string message = "nccl comm: " + state_->who() + " timed out after " +
                                    std::to_string(timeout.count()) + " ms waiting for " + what +
                                    " (" + op_ + ")";
        state_->abort(message);
        throw CommTimeout(message);
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<Completion> done_event_;
  std::vector<Tensor> tensors_;
  std::string op_;
  bool done_ = false;
};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  STRATA_THROW() << "nccl comm: invalid dtype " << static_cast<int>(dtype);
}

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + "(" + dtype_name(t.dtype()) + ", " + std::to_string(t.numel()) +
         " elements";
}

}  // namespace nccl_detail

using nccl_detail::Completion;
using nccl_detail::NcclRequest;
using nccl_detail::State;

namespace {

void check_tensor(const State& s, const Tensor& t, const std::string& op, const char* name) {
  STRATA_CHECK(t.defined()) << "nccl comm " << op << ": " << name << " is undefined";
  STRATA_CHECK(t.device() == Device::cuda(s.device))
      << "nccl comm " << op << ": " << name << " is " << t.str()
      << "; this communicator moves tensors on cuda:" << s.device;
  STRATA_CHECK(t.is_contiguous()) << "nccl comm " << op << ": " << name << " " << t.str()
                                  << " must be contiguous";
}

void check_reducible(const Tensor& t, const std::string& op) {
  STRATA_CHECK(t.dtype() != DType::kU8)
      << "nccl comm " << op << ": cannot reduce u8 tensors (f32, f64, f16, bf16, i32, i64)";
}

// Enqueues a collective after the pending sends/receives and the caller's stream, and returns
// the request that waits for it.
template <typename Launch>
std::unique_ptr<Request> launch(const std::shared_ptr<State>& s, std::vector<Tensor> tensors,
                                const std::string& op, Launch nccl_call) {
  s->check_usable(op);
  s->flush();
  s->order_after_caller();
  STRATA_NCCL_CHECK(nccl_call());
  auto done = std::make_shared<Completion>();
  STRATA_CUDA_CHECK(cudaEventRecord(done->event, s->stream));
  done->recorded = true;
  return std::make_unique<NcclRequest>(s, std::move(done), std::move(tensors), op);
}

}  // namespace

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, Device device) {
  STRATA_CHECK(device.is_cuda()) << "NcclCommunicator: device must be a CUDA device, got "
                                 << device.str();
  check_device_available(device);
  ncclUniqueId id;
  Tensor id_bytes = Tensor::zeros({static_cast<int64_t>(sizeof(id))}, DType::kU8);
  if (bootstrap.rank() == 0) {
    STRATA_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.raw_data(), &id, sizeof(id));
  }
  wait(*bootstrap.broadcast(id_bytes, 0), bootstrap, "the ncclUniqueId from rank 0");
  std::memcpy(&id, id_bytes.raw_data(), sizeof(id));
  STRATA_CUDA_CHECK(cudaSetDevice(device.index));
  ncclComm_t comm = nullptr;
  STRATA_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  state_ = std::make_shared<State>(comm, device.index);
  set_timeout(bootstrap.timeout());
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
Device NcclCommunicator::device() const { return Device::cuda(state_->device); }
void* NcclCommunicator::stream() const { return state_->stream; }

void NcclCommunicator::set_caller_stream(void* stream) {
  state_->caller_stream = static_cast<cudaStream_t>(stream);
}

void* NcclCommunicator::caller_stream() const { return state_->caller_stream; }

std::unique_ptr<Request> NcclCommunicator::isend(const Tensor& t, int peer, int tag) {
  const std::string op = "isend to rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
  state_->check_usable(op);
  check_tensor(*state_, t, op, "tensor");
  STRATA_CHECK(peer >= 0 && peer < size())
      << "nccl comm " << op << ": no such rank (size " << size() << ")";
  STRATA_CHECK(tag >= 0 && tag < nccl_detail::kMaxTag)
      << "nccl comm " << op << ": tag must be in [0, " << nccl_detail::kMaxTag << ")";
  if (!state_->pending_done) state_->pending_done = std::make_shared<Completion>();
  state_->pending.push_back({true, t, peer});
  return std::make_unique<NcclRequest>(state_, state_->pending_done, std::vector<Tensor>{t}, op);
}

std::unique_ptr<Request> NcclCommunicator::irecv(const Tensor& t, int peer, int tag) {
  const std::string op = "irecv from rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
  state_->check_usable(op);
  check_tensor(*state_, t, op, "tensor");
  STRATA_CHECK(peer >= 0 && peer < size())
      << "nccl comm " << op << ": no such rank (size " << size() << ")";
  STRATA_CHECK(tag >= 0 && tag < nccl_detail::kMaxTag)
      << "nccl comm " << op << ": tag must be in [0, " << nccl_detail::kMaxTag << ")";
  if (!state_->pending_done) state_->pending_done = std::make_shared<Completion>();
  state_->pending.push_back({false, t, peer});
  return std::make_unique<NcclRequest>(state_, state_->pending_done, std::vector<Tensor>{t}, op);
}

std::unique_ptr<Request> NcclCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  const std::string name =
      nccl_detail::describe("all_reduce", t) + (op == ReduceOp::kSum ? ", sum)" : ", max)");
  check_tensor(*state_, t, name, "tensor");
  check_reducible(t, name);
  State& s = *state_;
  return launch(state_, {t}, name, [&] {
    return ncclAllReduce(t.raw_data(), t.raw_data(), static_cast<size_t>(t.numel()),
                         nccl_detail::nccl_type(t.dtype()),
                         op == ReduceOp::kSum ? ncclSum : ncclMax, s.comm, s.stream);
  });
}

std::unique_ptr<Request> NcclCommunicator::broadcast(const Tensor& t, int root) {
  const std::string name =
      nccl_detail::describe("broadcast", t) + ", root " + std::to_string(root) + ")";
  check_tensor(*state_, t, name, "tensor");
  STRATA_CHECK(root >= 0 && root < size())
      << "nccl comm " << name << ": no such rank (size " << size() << ")";
  State& s = *state_;
  return launch(state_, {t}, name, [&] {
    return ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, s.comm, s.stream);
  });
}

std::unique_ptr<Request> NcclCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  const std::string name = nccl_detail::describe("all_gather", in) + ")";
  check_tensor(*state_, in, name, "input");
  check_tensor(*state_, out, name, "output");
  STRATA_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size())
      << "nccl comm " << name << ": output " << out.str() << " must be " << dtype_name(in.dtype())
      << " with " << size() << " x " << in.numel() << " elements";
  State& s = *state_;
  return launch(state_, {in, out}, name, [&] {
    return ncclAllGather(in.raw_data(), out.raw_data(), in.nbytes(), ncclUint8, s.comm, s.stream);
  });
}

std::unique_ptr<Request> NcclCommunicator::reduce_scatter(const Tensor& in, const Tensor& out) {
  const std::string name = nccl_detail::describe("reduce_scatter", in) + ")";
  check_tensor(*state_, in, name, "input");
  check_tensor(*state_, out, name, "output");
  check_reducible(in, name);
  STRATA_CHECK(out.dtype() == in.dtype() && out.numel() * size() == in.numel())
      << "nccl comm " << name << ": output " << out.str() << " must be " << dtype_name(in.dtype())
      << " with " << in.numel() << " / " << size() << " elements";
  State& s = *state_;
  return launch(state_, {in, out}, name, [&] {
    return ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()),
                             nccl_detail::nccl_type(in.dtype()), ncclSum, s.comm, s.stream);
  });
}

void NcclCommunicator::barrier(const std::string& what) {
  State& s = *state_;
  std::unique_ptr<Request> r = launch(state_, {}, "barrier", [&] {
    return ncclAllReduce(s.barrier_word, s.barrier_word, 1, ncclInt32, ncclSum, s.comm, s.stream);
  });
  r->wait(timeout(), what);
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  barrier("split(color " + std::to_string(color) + ", key " + std::to_string(key) + ")");
  ncclComm_t sub = nullptr;
  STRATA_NCCL_CHECK(
      ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr));
  if (sub == nullptr) return nullptr;
  std::unique_ptr<NcclCommunicator> result(
      new NcclCommunicator(std::make_shared<State>(sub, state_->device)));
  result->set_timeout(timeout());
  result->set_caller_stream(state_->caller_stream);
  return result;
}

// ---- NcclMpiCommunicator -----------------------------------------------------------------------

NcclMpiCommunicator::NcclMpiCommunicator(std::unique_ptr<MpiCommunicator> host, Device device)
    : host_(std::move(host)) {
  STRATA_CHECK(host_ != nullptr) << "NcclMpiCommunicator: no MPI communicator given";
  device_ = std::make_unique<NcclCommunicator>(*host_, device);
  set_timeout(host_->timeout());
}

NcclMpiCommunicator::NcclMpiCommunicator(std::unique_ptr<MpiCommunicator> host,
                                         std::unique_ptr<NcclCommunicator> device)
    : host_(std::move(host)), device_(std::move(device)) {
  STRATA_CHECK(host_->rank() == device_->rank() && host_->size() == device_->size())
      << "NcclMpiCommunicator: the MPI half is rank " << host_->rank() << " of " << host_->size()
      << " but the NCCL half rank " << device_->rank() << " of " << device_->size();
}

// The NCCL half goes first: its destruction waits for (or aborts) operations still in flight.
NcclMpiCommunicator::~NcclMpiCommunicator() { device_.reset(); }

Communicator& NcclMpiCommunicator::half(const Tensor& t) {
  Communicator& c = t.defined() && t.device().is_cuda() ? static_cast<Communicator&>(*device_)
                                                        : static_cast<Communicator&>(*host_);
  c.set_timeout(timeout());
  return c;
}

Communicator& NcclMpiCommunicator::half(const Tensor& in, const Tensor& out, const char* op) {
  STRATA_CHECK(in.defined() && out.defined() && in.device().is_cuda() == out.device().is_cuda())
      << "nccl+mpi comm " << op << ": input " << (in.defined() ? in.str() : "undefined")
      << " and output " << (out.defined() ? out.str() : "undefined")
      << " must both be CUDA tensors (NCCL) or both host tensors (MPI)";
  return half(in);
}

std::unique_ptr<Request> NcclMpiCommunicator::isend(const Tensor& t, int peer, int tag) {
  return half(t).isend(t, peer, tag);
}

std::unique_ptr<Request> NcclMpiCommunicator::irecv(const Tensor& t, int peer, int tag) {
  return half(t).irecv(t, peer, tag);
}

std::unique_ptr<Request> NcclMpiCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  return half(t).all_reduce(t, op);
}

std::unique_ptr<Request> NcclMpiCommunicator::broadcast(const Tensor& t, int root) {
  return half(t).broadcast(t, root);
}

std::unique_ptr<Request> NcclMpiCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  return half(in, out, "all_gather").all_gather(in, out);
}

std::unique_ptr<Request> NcclMpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out) {
  return half(in, out, "reduce_scatter").reduce_scatter(in, out);
}

void NcclMpiCommunicator::barrier(const std::string& what) {
  host_->set_timeout(timeout());
  host_->barrier(what);
}

std::unique_ptr<Communicator> NcclMpiCommunicator::split(int color, int key) {
  host_->set_timeout(timeout());
  device_->set_timeout(timeout());
  std::unique_ptr<Communicator> host = host_->split(color, key);
  std::unique_ptr<Communicator> device = device_->split(color, key);
  STRATA_CHECK((host == nullptr) == (device == nullptr))
      << "nccl+mpi comm split(color " << color << ", key " << key
      << "): the MPI and NCCL halves disagree on membership";
  if (host == nullptr) return nullptr;
  std::unique_ptr<MpiCommunicator> mpi(static_cast<MpiCommunicator*>(host.release()));
  std::unique_ptr<NcclCommunicator> nccl(static_cast<NcclCommunicator*>(device.release()));
  std::unique_ptr<NcclMpiCommunicator> result(
      new NcclMpiCommunicator(std::move(mpi), std::move(nccl)));
  result->set_timeout(timeout());
  return result;
}

std::unique_ptr<Communicator> NcclMpiCommunicator::subgroup(const std::vector<int>& members,
                                                            int tag) {
  host_->set_timeout(timeout());
  std::unique_ptr<Communicator> host = host_->subgroup(members, tag);
  std::unique_ptr<MpiCommunicator> mpi(static_cast<MpiCommunicator*>(host.release()));
  auto nccl = std::make_unique<NcclCommunicator>(*mpi, device_->device());
  std::unique_ptr<NcclMpiCommunicator> result(
      new NcclMpiCommunicator(std::move(mpi), std::move(nccl)));
  result->set_timeout(timeout());
  result->set_caller_stream(device_->caller_stream());
  return result;
}

}  // namespace strata::parallel
