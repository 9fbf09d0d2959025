// PS+SSP, the HetPipe-like baseline of papers/sdpipe.md Sec. 4: each pipeline is a virtual
// worker; a parameter server on rank 0 (a thread of it, parallel/runtime/service.h) holds the
// global weights W_j of every stage j; replicas synchronize through it under Stale Synchronous
// Parallel with staleness bound s.
//
//   replica i of stage j, update u (its clock c = u + 1 once done):
//     local update: w <- w - lr g (its own optimizer and state)
//     PUSH(j, i, c) with delta = w - w_pulled          PS: W_j += delta / N; clock(j, i) = c
//     pull: the PS answers once min_i' clock(j, i') >= c - s, with W_j; then w = w_pulled = W_j
//
// The update is divided by N so that s = 0 (every pull waits for every replica's clock c) is
// synchronous data parallelism on the mean gradient: with SGD, W after clock c is W before minus
// lr times the mean of the N gradients, as All-Reduce gives (to the order of the float sums).
// A pull that has to wait for the slowest replica is counted (SyncStats::staleness_waits). The
// paper does not give HetPipe's s ([artifact]: every 10 batches); --ssp-staleness sets it. The
// weights carried are the parameters and buffers of the stage (f32), through host memory.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "parallel/runtime/group_average.h"
#include "parallel/runtime/service.h"
#include "parallel/runtime/update_sync.h"

namespace strata::parallel::sdpipe {

class ParameterServer final : public ServiceHandler {
 public:
  ParameterServer(int stages, int replicas, int staleness);
  void on_request(ServiceHost& host, int rank, ServiceMessage request, double now) override;

  // Every pull answered, for tests: the replica's clock and the slowest clock of its stage then.
  struct Pull {
    int stage, replica;
    int64_t clock, min_clock;
  };
  std::vector<Pull> pulls() const;
  SyncStats stats() const;
  int done_ranks() const;

 private:
  void serve(ServiceHost& host, int stage);

  int stages_, replicas_, staleness_;
  std::vector<Tensor> weights_;               // W_j (undefined until a replica sends INIT)
  std::vector<std::vector<int64_t>> clocks_;  // [stage][replica]
  struct Waiting {
    int replica;
    int64_t clock;
  };
  std::vector<std::vector<Waiting>> waiting_;  // pulls not answered yet, per stage
  mutable std::mutex mutex_;
  std::vector<Pull> pulls_;
  SyncStats stats_;
  int done_ = 0;
};

class PsSspSync final : public UpdateSync {
 public:
  // Collective over c.world and c.dp. Sends this replica's initial weights to the server.
  PsSspSync(const UpdateSyncContext& c, int staleness);
  ~PsSspSync() override;
  std::string name() const override { return "ps-ssp"; }
  void after_update(int64_t update) override;
  void finish() override;
  SyncStats stats() const override;
  ParameterServer* server() { return server_.get(); }  // rank 0 only

 private:
  Tensor pack() const;  // parameters then buffers, f32 on the host
  void unpack(const Tensor& flat);

  ExecContext& ctx_;
  graph::ParamStore& store_;
  int stage_, replica_, world_size_;
  std::chrono::milliseconds timeout_;
  Tensor pulled_;  // the weights of the last pull (the base of the next delta)
  std::unique_ptr<GroupAverager> averager_;
  std::unique_ptr<ParameterServer> server_;
  std::unique_ptr<ServiceHost> host_;
  std::unique_ptr<Communicator> service_comm_;
  std::unique_ptr<ServiceClient> client_;
  bool finished_ = false;
};

}  // namespace strata::parallel::sdpipe
