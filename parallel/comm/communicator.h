// Communicator: point-to-point and collective communication among the ranks of a group, behind
// one interface with three backends: MPI (processes; CPU tensors, CUDA tensors staged through
// host memory), NCCL (CUDA tensors on their own stream), and local (ranks are threads of one
// process, for tests and one-machine users).
//
// Every operation is asynchronous and returns a Request; nothing blocks until Request::wait.
// Every wait has a deadline: a wait that passes it throws CommTimeout naming this rank and what
// it was waiting for (the caller's description: "RecvAct(mb 3) from stage 1, step 7"), so that a
// dead or stuck peer makes every rank fail within the timeout instead of hanging.
//
// Collectives are in place (all_reduce, broadcast) or write a separate output (all_gather,
// reduce_scatter). Reductions sum in rank order, so results are identical on every rank and
// repeatable from run to run (the local backend; MPI's own order for the MPI backend).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/tensor.h"

namespace strata::parallel {

// A wait that passed its deadline. The message names the rank, what it waited for and how long.
class CommTimeout : public Error {
 public:
  explicit CommTimeout(const std::string& message) : Error(message) {}
};

// A peer failed (a thread of the local backend threw, an MPI rank aborted): the message names it.
class CommAborted : public Error {
 public:
  explicit CommAborted(const std::string& message) : Error(message) {}
};

class Request {
 public:
  virtual ~Request() = default;
  // True once the operation has completed (never blocks).
  virtual bool test() = 0;
  // Blocks until completion or until `timeout` passes, then throws CommTimeout with `what` in the
  // message. A zero timeout waits forever.
  virtual void wait(std::chrono::milliseconds timeout, const std::string& what) = 0;
  // Orders `stream` (a cudaStream_t of the request's device) after the operation: work enqueued
  // on it from now on sees the operation complete. A stream-ordered backend (nccl) makes the
  // stream wait on the device (cudaStreamWaitEvent) and returns at once, without the host waiting;
  // the caller must still test() or wait() the request later (say at the end of the step), which
  // is where a dead peer shows as CommTimeout. The other backends wait on the host (wait()).
  virtual void wait_on_stream(void* stream, std::chrono::milliseconds timeout,
                              const std::string& what) {
    wait(timeout, what);
  }
};

enum class ReduceOp { kSum, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi", "nccl", "local"

  // Sends/receives the bytes of a contiguous tensor to/from rank `peer` of this communicator.
  // Tags (0 <= tag < 32768) tell apart messages between the same pair; a receive matches the
  // send of the same tag from `peer`. The tensor must stay alive and untouched until the request
  // completes.
  virtual std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) = 0;
  virtual std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) = 0;

  // In place, on every rank's tensor of the same shape and dtype (f32, f64, i32, i64).
  virtual std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) = 0;
  virtual std::unique_ptr<Request> broadcast(const Tensor& t, int root) = 0;
  // out = concat over ranks of `in` along a new leading dimension of size size() (out has
  // size() * in.numel() elements).
  virtual std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) = 0;
  // Sums `in` (size() * out.numel() elements) over ranks and gives rank r the r-th slice.
  virtual std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) = 0;
  // Every rank arrives before any leaves (subject to the communicator's timeout).
  virtual void barrier(const std::string& what) = 0;

  // Ranks with the same color form a new communicator, ordered by key (then by old rank). Every
  // rank must call it (collective). A negative color gives a null result for that rank.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // A communicator of `members` (distinct ranks of this communicator, in the new rank order),
  // collective over those ranks only: each of them calls it with the same list and tag (0 <= tag
  // < 32768), the other ranks do not take part. Calls on disjoint sets of members may run at the
  // same time; calls that share a rank must be made in the same order by every rank they share.
  // The members first meet with this communicator's timeout, so a peer that is gone gives
  // CommTimeout. The result inherits the timeout (and the caller stream). Backends that cannot
  // (nccl alone, without its MPI half) throw strata::Error.
  virtual std::unique_ptr<Communicator> subgroup(const std::vector<int>& members, int tag);

  // CUDA tensors and streams. A backend that moves CUDA tensors as device work on a stream of its
  // own (nccl) is stream-ordered: each operation is ordered, by events and without host
  // synchronization, after the work enqueued on the caller stream (a cudaStream_t; null: none, the
  // caller makes the tensors ready) at the moment it is launched, and a transfer in flight is
  // device work, so a device-wide synchronization waits for it (the engine's blocking copies wait
  // for their memory's stream only, cuda::memcpy_blocking). The other backends (mpi, local)
  // ignore the caller stream: they read or write a CUDA tensor after the work of the stream that
  // orders its memory (its allocator's), and a completed request's results are ready for any
  // stream.
  virtual bool stream_ordered() const { return false; }
  virtual void set_caller_stream(void* stream) {}

  // The deadline of barrier() and of the waits the library issues itself.
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_{std::chrono::minutes(5)};
};

// Throws strata::Error unless `members` are distinct ranks of a communicator of `size` ranks
// that include `rank`, and 0 <= tag < 32768 (the backends' common check of subgroup()).
void check_subgroup(const std::vector<int>& members, int tag, int rank, int size,
                    const std::string& backend);

// Waits for a request with the communicator's timeout.
inline void wait(Request& r, const Communicator& comm, const std::string& what) {
  r.wait(comm.timeout(), what);
}

}  // namespace strata::parallel
