// Averaging a stage's weights with a group of its replicas, peer to peer (SDPipe Eq. 2, AD-PSGD's
// pairs): every member ends with (1/|S|) sum over the members of their tensors, bit for bit the
// same on every member; the replicas outside the group are not touched.
//
// Communicators. A group's collective runs on a communicator of its own members
// (Communicator::subgroup of the stage's peers: MPI_Comm_create_group, or NCCL over it for CUDA
// tensors), created on the group's first use and cached under a key the caller gives. Groups on
// disjoint members (and groups of different stages, whose peers are different communicators) run
// at the same time without meeting; a rank takes part in one group at a time, in the order every
// member agrees on. The key must mean the same members on every member, and a member must find
// it cached exactly when the other members do: either keys are never released (AD-PSGD: one per
// pair), or a central party decides creation and release for all (SDPipe's scheduler, which
// tells each member when to release).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

class GroupAverager {
 public:
  struct Stats {
    int64_t averages = 0;  // group averages this rank took part in (groups of 2 or more)
    int64_t created = 0;   // communicators created
    int64_t reused = 0;    // averages on a cached communicator
    int64_t released = 0;  // communicators released
    int64_t live = 0;      // communicators held now
    double seconds = 0.0;  // time in averages (creation included)
  };

  // `peers`: this stage's replicas (rank = replica); used only by this object from now on.
  explicit GroupAverager(std::unique_ptr<Communicator> peers);
  int rank() const { return peers_->rank(); }
  int size() const { return peers_->size(); }
  Communicator& peers() { return *peers_; }

  // Averages `tensors` (contiguous f32/f64, the same shapes on every member; undefined or empty
  // ones are skipped) in place over `members` (distinct ranks of the peers, ascending, this rank
  // among them). One member: nothing to do. `key` >= 0 names the members' communicator (see
  // above). `what` names the operation in timeouts.
  void average(ExecContext& ctx, const std::vector<int>& members, int64_t key,
               const std::vector<Tensor>& tensors, const std::string& what);
  // Averages over every replica, on the peers' communicator (collective over all of them).
  void average_all(ExecContext& ctx, const std::vector<Tensor>& tensors, const std::string& what);
  // Drops the communicator of `key` (nothing when it is not cached).
  void release(int64_t key);
  bool cached(int64_t key) const { return cache_.count(key) > 0; }
  const Stats& stats() const { return stats_; }

 private:
  void reduce(ExecContext& ctx, Communicator& comm, int members, const std::vector<Tensor>& tensors,
              const std::string& what);

  std::unique_ptr<Communicator> peers_;
  struct Entry {
    std::vector<int> members;
    std::unique_ptr<Communicator> comm;
  };
  std::map<int64_t, Entry> cache_;
  Stats stats_;
};

}  // namespace strata::parallel
