// PS+SSP: the server's state per stage and the worker's push/pull.
#include "parallel/sdpipe/ps_ssp.h"

#include <algorithm>

#include "engine/check.h"
#include "io/proto/strata.pb.h"
#include "parallel/sdpipe/sdpipe_sync.h"

namespace strata::parallel::sdpipe {

ParameterServer::ParameterServer(int stages, int replicas, int staleness)
    : stages_(stages),
      replicas_(replicas),
      staleness_(staleness),
      weights_(static_cast<size_t>(stages)),
      clocks_(static_cast<size_t>(stages), std::vector<int64_t>(static_cast<size_t>(replicas), 0)),
      waiting_(static_cast<size_t>(stages)) {
  STRATA_CHECK(staleness >= 0) << "--ssp-staleness must be >= 0, got " << staleness;
}

void ParameterServer::on_request(ServiceHost& host, int rank, ServiceMessage request, double) {
  proto::SyncRequest r;
  STRATA_CHECK(r.ParseFromString(request.bytes))
      << host.name() << ": an unreadable request from rank " << rank;
  if (r.kind() == proto::SyncRequest::DONE) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++done_;
    return;
  }
  const int j = r.stage(), i = r.replica();
  STRATA_CHECK(j >= 0 && j < stages_ && i >= 0 && i < replicas_ && rank == i * stages_ + j)
      << host.name() << ": rank " << rank << " wrote as stage " << j << " of pipeline " << i;
  const Tensor& payload = request.payload;
  STRATA_CHECK(payload.defined()) << host.name() << ": rank " << rank << " sent no weights";
  if (r.kind() == proto::SyncRequest::INIT) {
    if (!weights_[j].defined()) {
      weights_[j] = payload.clone();
    } else {
      STRATA_CHECK_EQ(weights_[j].numel(), payload.numel())
          << host.name() << ": replicas of stage " << j << " hold different numbers of weights";
    }
    return;
  }
  STRATA_CHECK(r.kind() == proto::SyncRequest::PUSH)
      << host.name() << ": rank " << rank << " sent a request of kind " << r.kind();
  STRATA_CHECK(weights_[j].defined() && weights_[j].numel() == payload.numel())
      << host.name() << ": a push of " << payload.numel() << " values for stage " << j;
  float* w = weights_[j].data<float>();
  const float* d = payload.data<float>();
  const float share = 1.0f / static_cast<float>(replicas_);
  for (int64_t k = 0; k < payload.numel(); ++k) w[k] += d[k] * share;
  clocks_[j][i] = r.iteration();
  waiting_[j].push_back({i, r.iteration()});
  serve(host, j);
  if (std::any_of(waiting_[j].begin(), waiting_[j].end(),
                  [i](const Waiting& w) { return w.replica == i; })) {
    // This pull has to wait for a slower replica.
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.staleness_waits;
  }
}

void ParameterServer::serve(ServiceHost& host, int j) {
  const int64_t slowest = *std::min_element(clocks_[j].begin(), clocks_[j].end());
  auto& waiting = waiting_[j];
  for (auto it = waiting.begin(); it != waiting.end();) {
    if (it->clock - staleness_ > slowest) {
      ++it;
      continue;
    }
    proto::SyncReply reply;
    reply.set_clock(it->clock);
    reply.set_min_clock(slowest);
    ServiceMessage m;
    STRATA_CHECK(reply.SerializeToString(&m.bytes));
    m.payload = weights_[j].clone();  // kept alive until sent
    host.reply(it->replica * stages_ + j, std::move(m));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pulls_.push_back({j, it->replica, it->clock, slowest});
      ++stats_.groups;
      ++stats_.members;
    }
    it = waiting.erase(it);
  }
}

std::vector<ParameterServer::Pull> ParameterServer::pulls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pulls_;
}

SyncStats ParameterServer::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

int ParameterServer::done_ranks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

PsSspSync::PsSspSync(const UpdateSyncContext& c, int staleness)
    : ctx_(*c.ctx),
      store_(*c.store),
      stage_(c.stage),
      replica_(c.group),
      world_size_(c.world->size()),
      timeout_(c.world->timeout()) {
  STRATA_CHECK(c.world != nullptr && c.dp != nullptr)
      << "--sync ps-ssp needs the world and the stage's data-parallel communicator";
  std::unique_ptr<Communicator> service_comm = c.world->split(0, c.world->rank());
  averager_ = std::make_unique<GroupAverager>(c.dp->split(0, c.group));
  const std::string name = "the parameter server";
  if (c.world->rank() == 0) {
    server_ = std::make_unique<ParameterServer>(c.stages, c.groups, staleness);
    host_ = std::make_unique<ServiceHost>(std::move(service_comm), name);
    host_->start(server_.get());
    client_ = std::make_unique<ServiceClient>(nullptr, host_.get(), name, timeout_);
  } else {
    service_comm_ = std::move(service_comm);
    client_ = std::make_unique<ServiceClient>(service_comm_.get(), nullptr, name, timeout_);
  }
  pulled_ = pack();
  proto::SyncRequest r;
  r.set_kind(proto::SyncRequest::INIT);
  r.set_stage(stage_);
  r.set_replica(replica_);
  ServiceMessage m;
  STRATA_CHECK(r.SerializeToString(&m.bytes));
  m.payload = pulled_.clone();
  client_->send(m);
}

PsSspSync::~PsSspSync() {
  client_.reset();
  host_.reset();
}

Tensor PsSspSync::pack() const {
  const int64_t p = store_.params().numel(), b = store_.buffers().numel();
  Tensor flat = Tensor::empty({p + b}, DType::kF32);
  if (p > 0) flat.narrow(0, 0, p).copy_from(store_.params().to(DType::kF32));
  if (b > 0) flat.narrow(0, p, b).copy_from(store_.buffers().to(DType::kF32));
  return flat;
}

void PsSspSync::unpack(const Tensor& flat) {
  const int64_t p = store_.params().numel(), b = store_.buffers().numel();
  if (p > 0) store_.params().copy_from(flat.narrow(0, 0, p));
  if (b > 0) store_.buffers().copy_from(flat.narrow(0, p, b));
  store_.load_working(ctx_);
}

void PsSspSync::after_update(int64_t update) {
  Tensor delta = pack();
  float* d = delta.data<float>();
  const float* base = pulled_.data<float>();
  for (int64_t k = 0; k < delta.numel(); ++k) d[k] -= base[k];
  proto::SyncRequest r;
  r.set_kind(proto::SyncRequest::PUSH);
  r.set_stage(stage_);
  r.set_replica(replica_);
  r.set_iteration(update + 1);
  ServiceMessage m;
  STRATA_CHECK(r.SerializeToString(&m.bytes));
  m.payload = delta;
  client_->send(m);
  client_->receive(pulled_, "the weights of clock " + std::to_string(update + 1) + " of stage " +
                                std::to_string(stage_) + ", pipeline " + std::to_string(replica_));
  unpack(pulled_);
}

void PsSspSync::finish() {
  if (finished_) return;
  finished_ = true;
  finish_replica(
      ctx_, store_, stage_, replica_, *client_, host_.get(),
      [this] { return server_->done_ranks(); }, world_size_, timeout_, *averager_);
}

SyncStats PsSspSync::stats() const { return server_ ? server_->stats() : SyncStats{}; }

}  // namespace strata::parallel::sdpipe
