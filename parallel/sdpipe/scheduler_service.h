// SDPipe's scheduler as a service on rank 0 (parallel/runtime/service.h): READY(stage, replica,
// iteration) in, GROUP(members) out to every member, protobuf messages (proto::SyncRequest,
// proto::SyncReply) over the service's own communicator. The policy is GroupScheduler; this adds:
// - the members' communicator ids: a new id for a group of members seen for the first time on a
//   stage, the same id while it stays cached, at most `comm_cache` per stage (least recently used
//   released: each member is told in its next reply, so every member creates and drops a group's
//   communicator at the same point of its own sequence: GroupAverager's contract);
// - the (arrival, group) trace (--sync-trace), written as it happens;
// - counters for the log (SyncStats), read from the training thread of rank 0.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/runtime/service.h"
#include "parallel/runtime/update_sync.h"
#include "parallel/sdpipe/group_scheduler.h"

namespace strata::parallel::sdpipe {

// World rank of replica (pipeline) i's stage j: i * stages + j (parallel/topology.h).
class SchedulerService final : public ServiceHandler {
 public:
  SchedulerService(const SchedulerConfig& config, int comm_cache, const std::string& trace_path,
                   int64_t hang_after = -1);
  void on_request(ServiceHost& host, int rank, ServiceMessage request, double now) override;
  void on_tick(ServiceHost& host, double now) override;
  // The updates after which every rank meets (UpdateSyncContext::barrier_after): their READYs
  // pause (GroupScheduler::ready). Before start().
  void set_barriers(std::function<bool(int64_t)> barrier_after) {
    barrier_after_ = std::move(barrier_after);
  }

  SyncStats stats() const;
  int done_ranks() const;  // ranks that sent DONE

 private:
  void send(ServiceHost& host, const std::vector<Group>& groups);

  GroupScheduler scheduler_;
  std::function<bool(int64_t)> barrier_after_;
  int comm_cache_;
  int64_t hang_after_, requests_ = 0;
  struct CommEntry {
    int64_t id;
    uint64_t used;
  };
  std::vector<std::map<std::vector<int>, CommEntry>> comms_;   // per stage
  std::vector<std::map<int, std::vector<int64_t>>> releases_;  // per stage: replica -> ids
  int64_t next_id_ = 0;
  uint64_t uses_ = 0;
  std::ofstream trace_;
  std::string trace_path_;
  mutable std::mutex mutex_;  // stats_ and done_
  SyncStats stats_;
  int done_ = 0;
};

}  // namespace strata::parallel::sdpipe
