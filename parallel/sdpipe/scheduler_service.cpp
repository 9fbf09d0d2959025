// SchedulerService: messages in and out of GroupScheduler.
#include "parallel/sdpipe/scheduler_service.h"

#include <algorithm>

#include "engine/check.h"
#include "io/proto/strata.pb.h"
#include "parallel/sdpipe/sync_graph.h"

namespace strata::parallel::sdpipe {

SchedulerService::SchedulerService(const SchedulerConfig& config, int comm_cache,
                                   const std::string& trace_path, int64_t hang_after)
    : scheduler_(config),
      comm_cache_(comm_cache),
      hang_after_(hang_after),
      comms_(static_cast<size_t>(config.stages)),
      releases_(static_cast<size_t>(config.stages)),
      trace_path_(trace_path) {
  STRATA_CHECK(comm_cache >= 1) << "SDPipe scheduler: a communicator cache of " << comm_cache;
  if (!trace_path.empty()) {
    trace_.open(trace_path, std::ios::out | std::ios::trunc);
    STRATA_CHECK(trace_.good()) << "--sync-trace " << trace_path << ": cannot write it";
  }
}

void SchedulerService::on_request(ServiceHost& host, int rank, ServiceMessage request, double now) {
  if (hang_after_ >= 0 && ++requests_ > hang_after_) {
    host.freeze();  // the test of a scheduler that hangs: nothing is answered from here on
    return;
  }
  proto::SyncRequest r;
  STRATA_CHECK(r.ParseFromString(request.bytes))
      << host.name() << ": an unreadable request from rank " << rank;
  if (r.kind() == proto::SyncRequest::DONE) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++done_;
    return;
  }
  STRATA_CHECK(r.kind() == proto::SyncRequest::READY)
      << host.name() << ": rank " << rank << " sent a request of kind " << r.kind();
  const int S = scheduler_.config().stages;
  STRATA_CHECK(rank == r.replica() * S + r.stage())
      << host.name() << ": rank " << rank << " sent READY as stage " << r.stage() << " of pipeline "
      << r.replica();
  const bool pause = barrier_after_ && barrier_after_(r.iteration());
  if (trace_.is_open()) {
    TraceEvent e;
    e.event = "ready";
    e.stage = r.stage();
    e.replica = r.replica();
    e.iteration = r.iteration();
    e.last = r.last();
    e.pause = pause;
    e.t = now;
    trace_ << trace_event_json(e) << "\n";
  }
  send(host, scheduler_.ready(r.stage(), r.replica(), r.iteration(), r.last(), now, pause));
}

void SchedulerService::on_tick(ServiceHost& host, double now) {
  if (scheduler_.next_deadline() <= now) send(host, scheduler_.poll(now));
}

void SchedulerService::send(ServiceHost& host, const std::vector<Group>& groups) {
  const int S = scheduler_.config().stages;
  for (const GroupScheduler::Hold& h : scheduler_.take_holds()) {
    if (!trace_.is_open()) continue;
    TraceEvent e;
    e.event = "hold";
    e.stage = h.stage;
    e.members = h.members;
    e.t = h.t;
    trace_ << trace_event_json(e) << "\n";
  }
  for (const Group& g : groups) {
    // The members' communicator (none for a group of one).
    int64_t id = -1;
    if (g.members.size() > 1) {
      auto& cached = comms_[g.stage];
      auto it = cached.find(g.members);
      if (it == cached.end()) {
        if (static_cast<int>(cached.size()) >= comm_cache_) {
          auto lru = std::min_element(
              cached.begin(), cached.end(),
              [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
          for (int m : lru->first) releases_[g.stage][m].push_back(lru->second.id);
          cached.erase(lru);
        }
        it = cached.emplace(g.members, CommEntry{next_id_++, 0}).first;
      }
      it->second.used = ++uses_;
      id = it->second.id;
    }
    proto::SyncReply reply;
    for (int m : g.members) reply.add_members(m);
    reply.set_clock(g.clock);
    reply.set_comm_id(id);
    reply.set_check(group_check_name(g.check));
    for (int m : g.members) {
      proto::SyncReply mine = reply;
      for (int64_t released : releases_[g.stage][m]) mine.add_release(released);
      releases_[g.stage][m].clear();
      ServiceMessage message;
      STRATA_CHECK(mine.SerializeToString(&message.bytes));
      host.reply(m * S + g.stage, std::move(message));
    }
    if (trace_.is_open()) {
      TraceEvent e;
      e.event = "group";
      e.stage = g.stage;
      e.clock = g.clock;
      e.members = g.members;
      e.iterations = g.iterations;
      e.check = group_check_name(g.check);
      e.t = g.closed;
      e.window = g.window;
      trace_ << trace_event_json(e) << "\n";
      trace_.flush();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.groups;
    stats_.members += static_cast<int64_t>(g.members.size());
    stats_.enforcement_waits = scheduler_.enforcement_waits();
    stats_.skipped_validations = scheduler_.skipped_validations();
  }
}

SyncStats SchedulerService::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

int SchedulerService::done_ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

}  // namespace strata::parallel::sdpipe
