// The MPI backend: ranks are processes launched by mpirun/srun (built only with STRATA_WITH_MPI).
//
//   int main(int argc, char** argv) {
//     strata::parallel::MpiSession mpi(&argc, &argv);  // MPI_Init_thread ... MPI_Finalize
//     std::unique_ptr<strata::parallel::MpiCommunicator> world = mpi.world();
//     ...
//   }
//
// Thread level: the session asks for MPI_THREAD_MULTIPLE and requires at least
// MPI_THREAD_FUNNELED. With MULTIPLE (Open MPI provides it) any thread may use any communicator
// (one thread per communicator and its requests at a time). Below MULTIPLE, communicators
// may only be used from the thread that initialized MPI; other threads get an error saying so.
//
// Semantics (beyond parallel/comm/communicator.h):
// - Point to point: MPI_Isend/MPI_Irecv on the tensor's bytes (MPI_BYTE); MPI's matching rules
//   (by source and tag, non-overtaking within a tag). A receive checks the byte count it got.
// - Collectives: MPI_Iallreduce (in place), MPI_Ibcast, MPI_Iallgather, MPI_Ireduce_scatter_block
//   with the tensor's MPI datatype (f32 MPI_FLOAT, f64 MPI_DOUBLE, i32 MPI_INT32_T, i64
//   MPI_INT64_T) and MPI_SUM/MPI_MAX. The reduction order is MPI's: results are the same on every
//   rank (MPI's algorithms reduce each element once and distribute it) but may differ in the last
//   bits from a rank-order sum.
// - Waiting polls MPI_Test (which also drives MPI's progress), sleeping 50 us at first and
//   backing off to 1 ms, until completion or the deadline (CommTimeout naming this rank, `what`
//   and the timeout). A request destroyed before completion cancels a receive; a send or a
//   collective cannot be cancelled, so its buffers are deliberately kept alive (leaked) because
//   MPI may still touch them; this only happens after a failure.
// - barrier: MPI_Ibarrier with the communicator's timeout. split: the ranks first meet in such a
//   barrier, so that a dead peer gives CommTimeout rather than a hang in MPI_Comm_split (which
//   has no non-blocking form); negative colors give MPI_UNDEFINED and a null communicator.
// - CUDA tensors: passed to MPI directly when the library is CUDA-aware (MPIX_Query_cuda_support),
//   otherwise staged through pinned host buffers (cudaMallocHost): device-to-host before the MPI
//   call, host-to-device when the request completes (in test()/wait(), before it reports
//   completion). Device memory is only touched after the work enqueued so far on the stream that
//   orders it (its allocator's, Allocator::stream(): the context's stream for a context's
//   tensors; the whole device for memory without one): the staging copies run on that stream
//   and wait for it, a CUDA-aware call is preceded by cudaStreamSynchronize. So a tensor produced
//   by its context's ops may be passed right after they were enqueued, and a receive buffer may
//   be memory that earlier kernels of that context used. A received tensor must not be read before
//   its request completes; a completed request's results may be used on any stream. Not
//   stream-ordered: the caller stream is ignored (Communicator::stream_ordered).
// - Errors from MPI calls throw strata::Error through STRATA_MPI_CHECK (parallel/comm/mpi_check.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"

namespace strata::parallel {

class MpiCommunicator;

// This process's place among the processes of a communicator that share its node (memory).
struct NodeRanks {
  int rank = 0;
  int size = 1;
};

// MPI for the lifetime of the object: MPI_Init_thread on construction, MPI_Finalize on
// destruction. When MPI is already initialized (by the program or another library) the session
// only adopts it and does not finalize. MPI cannot be initialized again after MPI_Finalize, so
// one session per process. Sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (so that MPI errors become
// strata::Error) and the log rank (log lines start with "[rank R]").
class MpiSession {
 public:
  explicit MpiSession(int* argc = nullptr, char*** argv = nullptr);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int rank() const { return rank_; }  // in MPI_COMM_WORLD
  int size() const { return size_; }
  int thread_level() const { return thread_level_; }  // MPI_THREAD_FUNNELED ... MULTIPLE
  bool cuda_aware() const { return cuda_aware_; }
  // "MPI rank 0 of 4, MPI_THREAD_MULTIPLE, Open MPI v4.1.4, not CUDA-aware"
  std::string describe() const;
  // A new communicator over all ranks (a duplicate of MPI_COMM_WORLD, freed with it).
  std::unique_ptr<MpiCommunicator> world() const;

 private:
  bool owns_ = false;
  int rank_ = 0;
  int size_ = 1;
  int thread_level_ = MPI_THREAD_SINGLE;
  bool cuda_aware_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // Wraps `comm`; when `owned`, frees it (MPI_Comm_free) on destruction.
  MpiCommunicator(MPI_Comm comm, bool owned);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<Request> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) override;
  void barrier(const std::string& what) override;
  // The sub-communicator (an MpiCommunicator) inherits this communicator's timeout.
  std::unique_ptr<Communicator> split(int color, int key) override;
  // MPI_Comm_create_group over the members (after they exchange a byte with the timeout).
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& members, int tag) override;

  // The ranks of this communicator on this process's node (MPI_Comm_split_type shared),
  // collective: the ranks first meet in a barrier with the communicator's timeout.
  NodeRanks node_ranks();

  MPI_Comm handle() const { return comm_; }
  int world_rank() const { return world_rank_; }
  // True when CUDA tensors go to MPI directly, false when they are staged through host memory.
  bool cuda_aware() const { return cuda_aware_; }

 private:
  void check_thread(const std::string& op) const;
  std::string who() const;  // "rank 1" or "rank 1 (world rank 3)"

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  int world_rank_ = 0;
  int thread_level_ = MPI_THREAD_SINGLE;
  bool cuda_aware_ = false;
};

// Whether this MPI library moves CUDA device memory itself (Open MPI's MPIX_Query_cuda_support;
// false where the library offers no such query). MPI must be initialized.
bool mpi_cuda_aware();

// Ends every rank of the job after a fatal error: MPI_Abort(MPI_COMM_WORLD, code) while MPI is
// initialized, otherwise the process exits with `code`. For the CLI, when the world has more
// than one rank; library code throws instead.
[[noreturn]] void abort_world(int code);

}  // namespace strata::parallel
