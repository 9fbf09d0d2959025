// The NCCL backend: CUDA tensors, one device per rank, moved by NCCL on the communicator's own
// stream (built only with STRATA_WITH_NCCL and STRATA_WITH_MPI: the ncclUniqueId travels over
// MPI).
//
//   MpiSession mpi(&argc, &argv);
//   auto world = mpi.world();
//   NcclCommunicator nccl(*world, Device::cuda(discover_process().local_rank));
//   nccl.set_caller_stream(compute_stream);   // optional: order after the caller's stream
//   auto r = nccl.all_reduce(grads);
//   wait(*r, nccl, "ReduceGrads(bucket 0)");
//
// Semantics (beyond parallel/comm/communicator.h):
// - Tensors are contiguous CUDA tensors on the communicator's device. Reductions take f32, f64,
//   f16, bf16, i32 and i64 (NCCL's types); the order of a reduction is NCCL's (the same bits on
//   every rank).
// - Streams: every operation runs on the communicator's own stream (never the legacy default
//   stream). With a caller stream set, the operation first waits (cudaStreamWaitEvent, no host
//   synchronization) for an event recorded on the caller's stream, so it sees everything the
//   caller enqueued before; without one, the caller must make sure the tensors are ready.
//   Request::test() is cudaEventQuery of an event recorded after the operation; wait() polls it
//   (50 us backing off to 1 ms) until the deadline. A completed request's results may be used on
//   any stream. Request::wait_on_stream(s) instead makes stream s wait for that event on the
//   device (cudaStreamWaitEvent): a consumer on s (the compute stream reading a received
//   activation) needs no host thread polling; the request is tested later for errors and the
//   timeout.
// - Point to point: NCCL has no tags. Sends and receives posted back to back are collected and
//   launched as one NCCL group (ncclGroupStart/End) when the caller first tests or waits on any
//   request, posts a collective, or calls barrier/split; so a ring of isend + irecv does not
//   deadlock. Between a pair of ranks, receives match sends in the order they were posted, and
//   the tag must be the same on both sides (it is checked to be in range, not matched): post
//   them in the same order on both ranks, with the same sizes.
// - Timeout: a wait that passes its deadline aborts the NCCL communicator (ncclCommAbort), so
//   that no kernel is left spinning on a dead peer, and throws CommTimeout; every later
//   operation or wait on it throws CommAborted. An asynchronous NCCL error does the same with
//   strata::Error.
// - split uses ncclCommSplit (after a barrier with the communicator's timeout, so a dead peer
//   gives CommTimeout rather than a hang); a negative color gives a null result.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/device.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi_comm.h"

namespace strata::parallel {

namespace nccl_detail {
struct State;
}  // namespace nccl_detail

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`: its rank 0 creates the ncclUniqueId, a broadcast over
  // `bootstrap` (with its timeout) hands it to every rank, and each rank joins with
  // ncclCommInitRank on `device` (a CUDA device; one per rank). Ranks and size are those of
  // `bootstrap`.
  NcclCommunicator(MpiCommunicator& bootstrap, Device device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<Request> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) override;
  void barrier(const std::string& what) override;
  // The sub-communicator (an NcclCommunicator on the same device, with its own stream) inherits
  // the timeout and the caller stream.
  std::unique_ptr<Communicator> split(int color, int key) override;

  // The stream (a cudaStream_t) that produces this communicator's input tensors and consumes
  // its outputs, or null (the caller synchronizes). Later operations are ordered after the work
  // enqueued on it when they are launched.
  bool stream_ordered() const override { return true; }
  void set_caller_stream(void* stream) override;
  void* caller_stream() const;
  Device device() const;
  // The communicator's own stream (a cudaStream_t).
  void* stream() const;

 private:
  explicit NcclCommunicator(std::shared_ptr<nccl_detail::State> state);

  std::shared_ptr<nccl_detail::State> state_;
};

// The communicator of MPI ranks on CUDA devices with NCCL (strata train --comm nccl): CUDA tensors
// travel over NCCL (an NcclCommunicator on this rank's device), host tensors over MPI (the
// trainer's metrics, the partition, checkpoints' records, the gradient norm), chosen per call by
// the tensor's device. Ranks, size and rank order are those of the MPI communicator, and both
// halves are split together (split: MPI_Comm_split and ncclCommSplit with the same color and
// key, both ordering by key, then by parent rank). barrier() is MPI's. all_gather and
// reduce_scatter need their input and output on the same side. Stream-ordered for CUDA tensors
// (NCCL's semantics, above: point-to-point operations have no tags and match in posting order);
// the MPI half ignores streams.
//
// NCCL cannot put two ranks of one communicator on the same GPU ("Duplicate GPU detected"): every
// rank needs a device of its own. NCCL's communicator creation (ncclCommInitRank, ncclCommSplit)
// blocks without a deadline; it is preceded by an MPI exchange with the timeout, so a peer that is
// already gone gives CommTimeout, but one that dies in between hangs it.
class NcclMpiCommunicator final : public Communicator {
 public:
  // Collective over `host`: its ranks create an NCCL communicator on `device` (this rank's GPU).
  // The result takes `host`'s timeout.
  NcclMpiCommunicator(std::unique_ptr<MpiCommunicator> host, Device device);
  ~NcclMpiCommunicator() override;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "nccl"; }

  std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<Request> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) override;
  void barrier(const std::string& what) override;
  // Both halves, with this communicator's timeout and caller stream.
  std::unique_ptr<Communicator> split(int color, int key) override;
  // The MPI half's subgroup, then a new NCCL communicator over it (ncclCommInitRank with a
  // unique id from the first member), with this communicator's timeout and caller stream.
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& members, int tag) override;

  bool stream_ordered() const override { return true; }
  void set_caller_stream(void* stream) override { device_->set_caller_stream(stream); }

  MpiCommunicator& host() { return *host_; }
  NcclCommunicator& nccl() { return *device_; }

 private:
  NcclMpiCommunicator(std::unique_ptr<MpiCommunicator> host,
                      std::unique_ptr<NcclCommunicator> device);
  // The half that carries tensors on `t`'s device, with this communicator's timeout.
  Communicator& half(const Tensor& t);
  // The same for an operation with an input and an output, which must be on one side.
  Communicator& half(const Tensor& in, const Tensor& out, const char* op);

  std::unique_ptr<MpiCommunicator> host_;
  std::unique_ptr<NcclCommunicator> device_;
};

}  // namespace strata::parallel
