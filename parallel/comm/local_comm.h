// The local backend: ranks are threads of one process (tests, one-machine users, the CPU
// pipeline). A LocalWorld of N ranks hands out N LocalCommunicators, one per thread.
//
//   LocalWorld world(4);
//   run_local_ranks(world, [](LocalCommunicator& comm) { ... comm.all_reduce(t)->wait(...); });
//
// Semantics (beyond parallel/comm/communicator.h):
// - Tensors are contiguous; CUDA tensors go through host copies (taken once the device is done
//   with them) and results are copied back when the operation completes: ordered, not fast.
// - isend copies the bytes into the receiver's mailbox and completes at once: the tensor may be
//   reused as soon as isend returns. irecv matches sends by (source, tag) in FIFO order per tag,
//   in the order the receives were posted; the bytes land in the tensor during test()/wait().
//   A size mismatch between a send and its receive is an error at the receiver.
// - Collectives match by call order on each rank (the k-th collective call of every rank meets;
//   kind, dtype, sizes, op and root must agree, else every rank's wait throws). Once every rank
//   has posted, any waiting rank may do the work: the data is cut into chunks that waiting ranks
//   claim, and each element is reduced in rank order (x0 + x1 + ... + x(N-1)), so the result is
//   bitwise identical on every rank and from run to run, whoever computes it. A rank's wait never
//   depends on another rank waiting, only on every rank having posted.
// - split() is collective over the parent world, subgroup() over its members only; sub-worlds
//   share the parent's abort state.
// - Abort: when a rank fails, LocalWorld::abort (or LocalCommunicator::abort) marks the whole
//   family (the root world and every sub-world) failed; every wait that has not completed, on
//   any rank of the family, then throws CommAborted naming the failed rank (as a rank of the
//   root world) and its message, at once (waits sleep on a condition variable that abort wakes).
//   Operations posted after the abort throw CommAborted too.
// - Thread safety: a LocalCommunicator and its requests belong to one thread (its rank's);
//   different ranks' communicators may be used concurrently. LocalWorld is a cheap handle.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"

namespace strata::parallel {

namespace local_detail {
struct WorldState;
}  // namespace local_detail

class LocalCommunicator final : public Communicator {
 public:
  ~LocalCommunicator() override;
  int rank() const override { return rank_; }
  int size() const override;
  std::string backend() const override { return "local"; }

  std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op = ReduceOp::kSum) override;
  std::unique_ptr<Request> broadcast(const Tensor& t, int root) override;
  std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) override;
  void barrier(const std::string& what) override;
  // The sub-communicator (a LocalCommunicator) inherits this communicator's timeout.
  std::unique_ptr<Communicator> split(int color, int key) override;
  // Collective over `members` only (Communicator::subgroup); a sub-world of the same family.
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& members, int tag) override;

  // Marks the world family failed on behalf of this rank (see LocalWorld::abort).
  void abort(const std::string& message);
  // This rank's rank in the root world (equal to rank() unless this is a sub-world).
  int world_rank() const;

 private:
  friend class LocalWorld;
  LocalCommunicator(std::shared_ptr<local_detail::WorldState> state, int rank);

  std::shared_ptr<local_detail::WorldState> state_;
  int rank_;
};

// A world of `size` ranks. Copies of a LocalWorld refer to the same world.
class LocalWorld {
 public:
  explicit LocalWorld(int size);

  int size() const;
  // The communicator of rank `rank` (0 <= rank < size), for the thread that runs that rank.
  // Each call gives a new handle on the same rank; use one per thread.
  std::unique_ptr<LocalCommunicator> communicator(int rank) const;
  // One communicator per rank, in rank order.
  std::vector<std::unique_ptr<LocalCommunicator>> communicators() const;

  // Rank `rank` failed with `message`: every pending and later wait of every rank of this world
  // and of its sub-worlds throws CommAborted naming the rank and the message. Only the first
  // abort is recorded; later calls do nothing.
  void abort(int rank, const std::string& message) const;
  bool aborted() const;
  // The root-world rank that aborted first and its message; -1 and "" while not aborted.
  int failed_rank() const;
  std::string abort_message() const;

 private:
  std::shared_ptr<local_detail::WorldState> state_;
};

// Runs `fn` on one thread per rank of `world` and joins them. A rank whose `fn` throws aborts
// the world with the exception's message, so that the other ranks fail fast with CommAborted
// instead of waiting for their timeouts. After every thread has ended, the exception of the
// rank that failed first (the cause, not the CommAborted it caused elsewhere) is rethrown.
void run_local_ranks(const LocalWorld& world, const std::function<void(LocalCommunicator&)>& fn);

}  // namespace strata::parallel
