// An emulated link between ranks (the device's cost model, named as such in every output; not a
// measured network): `strata train --link-mbps N` wraps the world communicator in a
// ShapedCommunicator, and every communicator split from it, so that the point-to-point messages a
// rank sends to another rank cross a link of N megabits/s per direction (parallel/comm/
// link_queue.h: one message at a time, non-preemptive; with flow control the training messages
// first, else FIFO). On one machine the ranks talk over shared memory, where chunking and
// priorities change nothing measurable; the link makes a migration's state large against the
// bandwidth, as DynPipe's Table III ablation needs (../shared/papers/dynpipe.md §2.10, §4).
//
// A rank shapes what it sends: one lane per destination rank (the world's numbering), shared by
// every communicator split from the wrapped world, so the pipeline's activations and gradients
// and a migration's chunks (marked bulk by TrafficClassScope on the thread that sends them)
// queue on the same link. A lane's thread takes the next message by the discipline, holds it for
// its transmission time (bytes / rate), then hands it to the wrapped communicator; the send's
// request completes once the wrapped send has. Receives and collectives pass through unshaped
// (the pipeline's traffic is point to point). The lanes record per class the messages, bytes,
// queueing delays and, for bulk, the first start and last finish (seconds since the link was made).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/link_queue.h"

namespace strata::parallel {

struct LinkLaneReport {
  int from = 0, to = 0;  // world ranks
  LinkClassCounters training, bulk;
};

// One rank's outgoing links.
class ShapedLink {
 public:
  // `world_rank`: this rank's. `bytes_per_second` per direction; `priority`: flow control.
  ShapedLink(int world_rank, double bytes_per_second, bool priority);
  // Stops the lanes: messages not yet handed over fail their requests (the link closed).
  ~ShapedLink();
  ShapedLink(const ShapedLink&) = delete;
  ShapedLink& operator=(const ShapedLink&) = delete;

  double now() const;  // seconds since the link was made (the origin of the reported times)

  // Queues `t` for `peer` of `inner` (world rank `world_peer`) as class `c`.
  std::unique_ptr<Request> send(Communicator& inner, const Tensor& t, int peer, int tag,
                                int world_peer, TrafficClass c);

  // Blocks until no message of `comm` waits on a lane or is being handed to it.
  void drain(const Communicator* comm);

  // The lanes used so far, by destination.
  std::vector<LinkLaneReport> report();
  double bytes_per_second() const { return rate_; }
  bool priority() const { return priority_; }

 private:
  struct Lane;
  Lane& lane(int world_peer);

  int rank_;
  double rate_;
  bool priority_;
  std::chrono::steady_clock::time_point origin_;
  std::mutex mutex_;
  std::map<int, std::unique_ptr<Lane>> lanes_;
};

class ShapedCommunicator : public Communicator {
 public:
  // `inner`'s rank r is world rank world_ranks[r]. Takes ownership of `owned` when given (the
  // splits); `inner` outlives this otherwise (the world).
  ShapedCommunicator(Communicator* inner, std::unique_ptr<Communicator> owned,
                     std::shared_ptr<ShapedLink> link, std::vector<int> world_ranks);
  // The world: rank r of `inner` is world rank r.
  static std::unique_ptr<ShapedCommunicator> wrap_world(Communicator& world,
                                                        std::shared_ptr<ShapedLink> link);
  // Lets the messages queued on it go first (drain()).
  ~ShapedCommunicator() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  std::unique_ptr<Request> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Request> irecv(const Tensor& t, int peer, int tag) override {
    return inner_->irecv(t, peer, tag);
  }
  std::unique_ptr<Request> all_reduce(const Tensor& t, ReduceOp op) override {
    return inner_->all_reduce(t, op);
  }
  std::unique_ptr<Request> broadcast(const Tensor& t, int root) override {
    return inner_->broadcast(t, root);
  }
  std::unique_ptr<Request> all_gather(const Tensor& in, const Tensor& out) override {
    return inner_->all_gather(in, out);
  }
  std::unique_ptr<Request> reduce_scatter(const Tensor& in, const Tensor& out) override {
    return inner_->reduce_scatter(in, out);
  }
  void barrier(const std::string& what) override { inner_->barrier(what); }
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::unique_ptr<Communicator> subgroup(const std::vector<int>& members, int tag) override;
  bool stream_ordered() const override { return inner_->stream_ordered(); }
  void set_caller_stream(void* stream) override { inner_->set_caller_stream(stream); }

  const ShapedLink& link() const { return *link_; }

 private:
  std::unique_ptr<Communicator> wrap(std::unique_ptr<Communicator> child,
                                     std::vector<int> world_ranks);

  Communicator* inner_;
  std::unique_ptr<Communicator> owned_;
  std::shared_ptr<ShapedLink> link_;
  std::vector<int> world_ranks_;
};

}  // namespace strata::parallel
