// How the replicas of a stage across the data-parallel groups come to agree, when they do not
// all-reduce their gradients (parallel/grouped_dp.h, the default): a strategy object the executor
// calls at two points of every update, and the trainer at the end of the run.
//
// With such an object each replica updates its weights with its own gradient (the gradient of
// its group's mean loss: the loss normalizer is the group's, not the global batch's), then the
// object brings the replicas together: averaging with a group of peers (SDPipe,
// parallel/sdpipe/sdpipe_sync.h), with one random peer (AD-PSGD), or through a parameter server
// (PS+SSP). Nothing here waits for every replica unless the strategy says so, which is the point:
// the trainer then agrees on metrics only at log points (parallel/trainer.h).
//
//   executor, update u:  ... Backward (the last of u: last_backward_begins(u)) ... ReduceGrads
//                        OptimizerStep: the local update, then after_update(u)
//   trainer, end:        finish() on every rank (collective over the whole world)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/exec_context.h"
#include "graph/param_store.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

// What a strategy did, for the log and --metrics (rank 0 holds the central view where there is
// one: SDPipe's scheduler, the parameter server). Counters since the start of the run.
struct SyncStats {
  int64_t groups = 0;               // group synchronizations decided (every stage)
  int64_t members = 0;              // the sum of their sizes
  int64_t enforcement_waits = 0;    // SDPipe: candidate groups held back until they connect
  int64_t skipped_validations = 0;  // SDPipe: accepted unchecked (another stage held the token)
  int64_t staleness_waits = 0;      // PS+SSP: pulls that waited for the slowest replica
  double mean_group() const { return groups > 0 ? static_cast<double>(members) / groups : 0.0; }
  // This minus `earlier`: the counts of an interval.
  SyncStats since(const SyncStats& earlier) const {
    return {groups - earlier.groups, members - earlier.members,
            enforcement_waits - earlier.enforcement_waits,
            skipped_validations - earlier.skipped_validations,
            staleness_waits - earlier.staleness_waits};
  }
};

class UpdateSync {
 public:
  virtual ~UpdateSync() = default;
  // "sdpipe", "adpsgd", "ps-ssp" (the --sync value).
  virtual std::string name() const = 0;
  // The last Backward of update u (counting from 0 in this run) is about to run: a strategy that
  // asks someone about update u can ask now, so that the answer overlaps the backward.
  virtual void last_backward_begins(int64_t update) {}
  // The local update of update u is done (also when it was skipped for a non-finite gradient:
  // the peers wait for it either way). Changes the store's weights (masters and buffers; the
  // working copies of mixed precision are reloaded).
  virtual void after_update(int64_t update) = 0;
  // The end of the run, on every rank (a collective over the world): the replicas of every stage
  // end identical (the mean of the replicas), and central services stop.
  virtual void finish() = 0;
  // See SyncStats (meaningful on rank 0; zeros where a strategy keeps none).
  virtual SyncStats stats() const { return {}; }
};

// What a strategy is made from, on every rank (collectively: the factory may split `world` and
// `dp`). `dp`: this stage in every group (rank = group); `world`: every rank (rank = group *
// stages + stage). `updates`: the updates this rank will run.
struct UpdateSyncContext {
  ExecContext* ctx = nullptr;
  graph::ParamStore* store = nullptr;
  Communicator* world = nullptr;
  Communicator* dp = nullptr;
  int stage = 0, group = 0, stages = 1, groups = 1;
  int64_t updates = 0;
  uint64_t seed = 0;
  // Whether every rank meets (a collective over the world: the trainer's log points) after update
  // u of this run; empty: never. A strategy must not make a replica wait, at update u, for a peer
  // that is already at that meeting.
  std::function<bool(int64_t)> barrier_after;
};
using UpdateSyncFactory = std::function<std::unique_ptr<UpdateSync>(const UpdateSyncContext&)>;

}  // namespace strata::parallel
