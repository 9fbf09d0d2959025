// AD-PSGD+Pipe, the decentralized baseline of papers/sdpipe.md Sec. 4: after its local update of
// update u, each replica of a stage averages with one peer. The pairs are a random matching drawn
// from the run's seed and u alone (a Fisher-Yates shuffle of the N replicas, consecutive entries
// paired; with N odd the last one is alone), the same on every rank and stage, as in the authors'
// artifact: no central party, but a replica waits for its partner's update u. The pair's
// communicator is cached under a key naming the pair (never released: at most N (N - 1) / 2).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/runtime/group_average.h"
#include "parallel/runtime/update_sync.h"

namespace strata::parallel::sdpipe {

// The partner of `replica` at update `update` among `replicas` (-1: alone this time).
int adpsgd_partner(uint64_t seed, int64_t update, int replicas, int replica);

class AdpsgdSync final : public UpdateSync {
 public:
  // Collective over c.dp (splits it).
  explicit AdpsgdSync(const UpdateSyncContext& c);
  std::string name() const override { return "adpsgd"; }
  void after_update(int64_t update) override;
  void finish() override;
  // This rank's own: its averages (groups of two) and its updates alone.
  SyncStats stats() const override { return stats_; }
  const GroupAverager& averager() const { return *averager_; }

 private:
  ExecContext& ctx_;
  graph::ParamStore& store_;
  int stage_, replica_, replicas_;
  uint64_t seed_;
  std::unique_ptr<GroupAverager> averager_;
  SyncStats stats_;
  bool finished_ = false;
};

}  // namespace strata::parallel::sdpipe
