// SdpipeSync: the worker's READY / GROUP / average cycle (see the header).
#include "parallel/sdpipe/sdpipe_sync.h"

#include <thread>

#include "engine/check.h"
#include "io/proto/strata.pb.h"

namespace strata::parallel::sdpipe {

std::vector<Tensor> replica_tensors(graph::ParamStore& store) {
  return {store.params(), store.buffers()};
}

void stop_when_done(ServiceHost& host, const std::function<int()>& done, int ranks,
                    std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  while (done() < ranks) {
    if (timeout.count() > 0 && std::chrono::steady_clock::now() - start > timeout) {
      host.stop();  // its own failure first, if it had one
      throw CommTimeout("rank 0 timed out after " + std::to_string(timeout.count()) +
                        " ms waiting for every rank to finish with " + host.name() + " (" +
                        std::to_string(done()) + " of " + std::to_string(ranks) + " did)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  host.stop();
}

SdpipeSync::SdpipeSync(const UpdateSyncContext& c, const SyncConfig& config)
    : ctx_(*c.ctx),
      store_(*c.store),
      stage_(c.stage),
      replica_(c.group),
      world_size_(c.world->size()),
      updates_(c.updates),
      async_(config.async_query),
      timeout_(c.world->timeout()) {
  STRATA_CHECK(c.world != nullptr && c.dp != nullptr)
      << "--sync sdpipe needs the world and the stage's data-parallel communicator";
  std::unique_ptr<Communicator> service_comm = c.world->split(0, c.world->rank());
  averager_ = std::make_unique<GroupAverager>(c.dp->split(0, c.group));
  const std::string name = "the SDPipe scheduler";
  if (c.world->rank() == 0) {
    SchedulerConfig sc;
    sc.stages = c.stages;
    sc.replicas = c.groups;
    sc.window_kind = config.window_kind;
    sc.window = config.window;
    sc.history = config.history;
    sc.token = config.token;
    service_ =
        std::make_unique<SchedulerService>(sc, config.comm_cache, config.trace, config.hang_after);
    service_->set_barriers(c.barrier_after);  // every rank has the same
    host_ = std::make_unique<ServiceHost>(std::move(service_comm), name);
    host_->start(service_.get());
    client_ = std::make_unique<ServiceClient>(nullptr, host_.get(), name, timeout_);
  } else {
    service_comm_ = std::move(service_comm);
    client_ = std::make_unique<ServiceClient>(service_comm_.get(), nullptr, name, timeout_);
  }
}

SdpipeSync::~SdpipeSync() {
  client_.reset();
  host_.reset();  // joins the thread (after a failure elsewhere)
}

double SdpipeSync::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void SdpipeSync::ready(int64_t update) {
  proto::SyncRequest r;
  r.set_kind(proto::SyncRequest::READY);
  r.set_stage(stage_);
  r.set_replica(replica_);
  r.set_iteration(update);
  r.set_last(update + 1 >= updates_);
  ServiceMessage m;
  STRATA_CHECK(r.SerializeToString(&m.bytes));
  client_->send(m);
  Query q;
  q.update = update;
  q.sent = now();
  queries_.push_back(q);
}

void SdpipeSync::last_backward_begins(int64_t update) {
  if (async_) ready(update);
}

void SdpipeSync::after_update(int64_t update) {
  if (!async_) ready(update);
  STRATA_CHECK(!queries_.empty() && queries_.back().update == update)
      << "SDPipe: stage " << stage_ << ", replica " << replica_ << " finished update " << update
      << " without having sent its READY";
  Query& q = queries_.back();
  const std::string what = "the group of update " + std::to_string(update + 1) + " of stage " +
                           std::to_string(stage_) + ", pipeline " + std::to_string(replica_);
  const ServiceMessage m = client_->receive(Tensor(), what);
  proto::SyncReply reply;
  STRATA_CHECK(reply.ParseFromString(m.bytes)) << "SDPipe: an unreadable reply for " << what;
  q.answered = now();
  for (int64_t id : reply.release()) averager_->release(id);
  q.members.assign(reply.members().begin(), reply.members().end());
  q.check = reply.check();
  averager_->average(ctx_, q.members, reply.comm_id(), replica_tensors(store_),
                     "SDPipe averaging of " + what);
  store_.load_working(ctx_);  // mixed precision: the 16-bit copies of the averaged masters
  q.averaged = now();
}

void finish_replica(ExecContext& ctx, graph::ParamStore& store, int stage, int replica,
                    ServiceClient& client, ServiceHost* host, const std::function<int()>& done,
                    int world_size, std::chrono::milliseconds timeout, GroupAverager& averager) {
  proto::SyncRequest r;
  r.set_kind(proto::SyncRequest::DONE);
  r.set_stage(stage);
  r.set_replica(replica);
  ServiceMessage m;
  STRATA_CHECK(r.SerializeToString(&m.bytes));
  client.send(m);
  if (host != nullptr) stop_when_done(*host, done, world_size, timeout);
  averager.average_all(ctx, replica_tensors(store),
                       "the final average of stage " + std::to_string(stage));
  store.load_working(ctx);
}

void SdpipeSync::finish() {
  if (finished_) return;
  finished_ = true;
  finish_replica(
      ctx_, store_, stage_, replica_, *client_, host_.get(),
      [this] { return service_->done_ranks(); }, world_size_, timeout_, *averager_);
}

SyncStats SdpipeSync::stats() const { return service_ ? service_->stats() : SyncStats{}; }

}  // namespace strata::parallel::sdpipe
