// The worker's side of SDPipe (Alg. 1, lines 7-10): after its local update, replica i of stage j
// averages its weights with the group the scheduler names, peer to peer.
//
//   last Backward of update u begins   READY(j, i, u) to the scheduler (--sync-query async: the
//                                      answer is decided while the backward runs)
//   OptimizerStep: local update        (--sync-query blocking: READY now)
//   after_update(u)                    wait for GROUP, drop the communicators it says to release,
//                                      average parameters and buffers with the members
//                                      (GroupAverager; nothing for a group of one)
//
// What is averaged (papers/sdpipe.md Sec. 6 item 11): the parameters (f32 masters) and the
// buffers (batch-norm running statistics); optimizer state stays local (see the variance-reduced
// Adam, graph/optimizer.h, for what that does to Adam's second moment). A READY is sent when the
// last backward starts, after --inject's straggler sleep, so a straggler is late to the window.
// The scheduler knows which updates every rank meets after (UpdateSyncContext::barrier_after, the
// same on every rank): it takes those READYs as pausing, and holds no group back waiting for a
// replica that is already at the meeting.
//
// The scheduler (scheduler_service.h) runs on rank 0 in a thread of its own; rank 0's worker
// talks to it in memory. At the end every rank says DONE; rank 0 stops the service once all have,
// and every stage averages over all its replicas, so the run ends with one model.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/runtime/group_average.h"
#include "parallel/runtime/service.h"
#include "parallel/runtime/update_sync.h"
#include "parallel/sdpipe/scheduler_service.h"
#include "parallel/sdpipe/sync_config.h"

namespace strata::parallel::sdpipe {

// Parameters and buffers of a stage: what the replicas average.
std::vector<Tensor> replica_tensors(graph::ParamStore& store);

// Rank 0 at the end of a run: waits until `done()` reaches `ranks` (every rank said DONE), within
// `timeout`, then stops the service (rethrowing its failure).
void stop_when_done(ServiceHost& host, const std::function<int()>& done, int ranks,
                    std::chrono::milliseconds timeout);

// The end of a replica's run with local updates (SDPipe and PS+SSP alike): DONE to the rank-0
// service; on rank 0 (`host` not null) stop_when_done; then every replica of the stage takes the
// mean of them all.
void finish_replica(ExecContext& ctx, graph::ParamStore& store, int stage, int replica,
                    ServiceClient& client, ServiceHost* host, const std::function<int()>& done,
                    int world_size, std::chrono::milliseconds timeout, GroupAverager& averager);

class SdpipeSync final : public UpdateSync {
 public:
  // Collective over c.world and c.dp (splits both).
  SdpipeSync(const UpdateSyncContext& c, const SyncConfig& config);
  ~SdpipeSync() override;

  std::string name() const override { return "sdpipe"; }
  void last_backward_begins(int64_t update) override;
  void after_update(int64_t update) override;
  void finish() override;
  SyncStats stats() const override;

  // Per update, for tests: when READY went out, when GROUP was in hand, when the averaging ended
  // (seconds of std::chrono::steady_clock's epoch), the group and how it was checked.
  struct Query {
    int64_t update = 0;
    double sent = 0, answered = 0, averaged = 0;
    std::vector<int> members;
    std::string check;
  };
  const std::vector<Query>& queries() const { return queries_; }
  const GroupAverager& averager() const { return *averager_; }
  SchedulerService* service() { return service_.get(); }  // rank 0 only

 private:
  void ready(int64_t update);
  double now() const;

  ExecContext& ctx_;
  graph::ParamStore& store_;
  int stage_, replica_, world_size_;
  int64_t updates_;
  bool async_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<GroupAverager> averager_;
  // Rank 0: the scheduler and its host; declared so that the client goes first, then the host's
  // thread, then the handler it used.
  std::unique_ptr<SchedulerService> service_;
  std::unique_ptr<ServiceHost> host_;
  std::unique_ptr<Communicator> service_comm_;  // other ranks: their handle
  std::unique_ptr<ServiceClient> client_;
  std::vector<Query> queries_;
  bool finished_ = false;
};

}  // namespace strata::parallel::sdpipe
