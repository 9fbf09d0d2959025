// An emulated link between ranks (see the header).
#include "parallel/comm/shaped_comm.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "engine/check.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// A send's progress: queued on the link, then handed to the wrapped communicator.
struct SendState {
  std::mutex mutex;
  std::condition_variable handed;
  std::unique_ptr<Request> inner;
  std::string error;
};

class ShapedSend : public Request {
 public:
  explicit ShapedSend(std::shared_ptr<SendState> state) : state_(std::move(state)) {}

  bool test() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->error.empty()) STRATA_THROW() << state_->error;
    return state_->inner != nullptr && state_->inner->test();
  }

  void wait(std::chrono::milliseconds timeout, const std::string& what) override {
    const auto start = Clock::now();
    Request* inner = nullptr;
    {
      std::unique_lock<std::mutex> lock(state_->mutex);
      const auto ready = [&] { return state_->inner != nullptr || !state_->error.empty(); };
      if (timeout.count() > 0) {
        if (!state_->handed.wait_for(lock, timeout, ready)) {
          throw CommTimeout(what + ": the message waited " + std::to_string(timeout.count()) +
                            " ms on the emulated link (--link-mbps) without being sent");
        }
      } else {
        state_->handed.wait(lock, ready);
      }
      if (!state_->error.empty()) STRATA_THROW() << what << ": " << state_->error;
      inner = state_->inner.get();
    }
    std::chrono::milliseconds left{0};
    if (timeout.count() > 0) {
      const auto spent =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      left = std::max(std::chrono::milliseconds(1), timeout - spent);
    }
    inner->wait(left, what);
  }

 private:
  std::shared_ptr<SendState> state_;
};

}  // namespace

struct ShapedLink::Lane {
  struct Pending {
    Communicator* comm = nullptr;
    Tensor tensor;  // alive until handed over
    int peer = 0, tag = 0;
    std::shared_ptr<SendState> state;
  };
  Lane(ShapedLink& link, int to) : link(link), to(to), queue(link.rate_, link.priority_) {}

  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      changed.wait(lock, [&] { return stop || !queue.empty(); });
      if (stop) break;
      // The link is free once the last transmission's time has passed (the sleep below may wake
      // a rounding error before it).
      const std::optional<LinkQueue::Transmission> tx =
          queue.start(std::max(link.now(), queue.busy_until()));
      STRATA_CHECK(tx.has_value()) << "emulated link " << link.rank_ << "->" << to
                                   << ": a message waits on a free link and none starts";
      Pending p = std::move(pending.at(tx->id));
      pending.erase(tx->id);
      sending = p.comm;
      lock.unlock();
      // The message holds the link for its transmission time (not interrupted).
      std::this_thread::sleep_until(link.origin_ + std::chrono::ceil<Clock::duration>(
                                                       std::chrono::duration<double>(tx->finish)));
      std::unique_ptr<Request> inner;
      std::string error;
      try {
        inner = p.comm->isend(p.tensor, p.peer, p.tag);
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        std::lock_guard<std::mutex> state_lock(p.state->mutex);
        p.state->inner = std::move(inner);
        p.state->error = error;
      }
      p.state->handed.notify_all();
      lock.lock();
      sending = nullptr;
      changed.notify_all();  // a drain() waits for this
    }
    // Closed: what waits fails its request.
    for (auto& [id, p] : pending) {
      {
        std::lock_guard<std::mutex> state_lock(p.state->mutex);
        p.state->error = "the emulated link " + std::to_string(link.rank_) + "->" +
                         std::to_string(to) + " closed before the message was sent";
      }
      p.state->handed.notify_all();
    }
    pending.clear();
  }

  // Whether a message of `comm` is queued or being sent (call with the mutex held).
  bool holds(const Communicator* comm) const {
    if (sending == comm) return true;
    for (const auto& [id, p] : pending) {
      if (p.comm == comm) return true;
    }
    return false;
  }

  ShapedLink& link;
  int to;
  Communicator* sending = nullptr;  // the communicator of the message in transmission
  std::mutex mutex;
  std::condition_variable changed;
  LinkQueue queue;
  std::map<uint64_t, Pending> pending;
  bool stop = false;
  std::thread thread;
};

ShapedLink::ShapedLink(int world_rank, double bytes_per_second, bool priority)
    : rank_(world_rank), rate_(bytes_per_second), priority_(priority), origin_(Clock::now()) {
  STRATA_CHECK(bytes_per_second > 0) << "--link-mbps: the emulated link needs a positive rate";
}

ShapedLink::~ShapedLink() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [to, lane] : lanes_) {
    {
      std::lock_guard<std::mutex> lane_lock(lane->mutex);
      lane->stop = true;
    }
    lane->changed.notify_all();
    lane->thread.join();
  }
}

void ShapedLink::drain(const Communicator* comm) {
  std::vector<Lane*> lanes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [to, lane] : lanes_) lanes.push_back(lane.get());
  }
  for (Lane* lane : lanes) {
    std::unique_lock<std::mutex> lock(lane->mutex);
    lane->changed.wait(lock, [&] { return lane->stop || !lane->holds(comm); });
  }
}

double ShapedLink::now() const {
  return std::chrono::duration<double>(Clock::now() - origin_).count();
}

ShapedLink::Lane& ShapedLink::lane(int world_peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& l = lanes_[world_peer];
  if (l == nullptr) {
    l = std::make_unique<Lane>(*this, world_peer);
    l->thread = std::thread([lane = l.get()] { lane->run(); });
  }
  return *l;
}

std::unique_ptr<Request> ShapedLink::send(Communicator& inner, const Tensor& t, int peer, int tag,
                                          int world_peer, TrafficClass c) {
  auto state = std::make_shared<SendState>();
  Lane& l = lane(world_peer);
  {
    std::lock_guard<std::mutex> lock(l.mutex);
    const uint64_t id = l.queue.push(t.nbytes(), c, now());
    l.pending[id] = Lane::Pending{&inner, t, peer, tag, state};
  }
  l.changed.notify_all();
  return std::make_unique<ShapedSend>(state);
}

std::vector<LinkLaneReport> ShapedLink::report() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LinkLaneReport> out;
  for (auto& [to, lane] : lanes_) {
    std::lock_guard<std::mutex> lane_lock(lane->mutex);
    out.push_back({rank_, to, lane->queue.counters(TrafficClass::kTraining),
                   lane->queue.counters(TrafficClass::kBulk)});
  }
  return out;
}

ShapedCommunicator::ShapedCommunicator(Communicator* inner, std::unique_ptr<Communicator> owned,
                                       std::shared_ptr<ShapedLink> link,
                                       std::vector<int> world_ranks)
    : inner_(inner),
      owned_(std::move(owned)),
      link_(std::move(link)),
      world_ranks_(std::move(world_ranks)) {
  STRATA_CHECK(inner_ != nullptr && link_ != nullptr) << "a shaped communicator without its parts";
  STRATA_CHECK_EQ(static_cast<int>(world_ranks_.size()), inner_->size())
      << "a shaped communicator's world ranks";
  set_timeout(inner_->timeout());
}

ShapedCommunicator::~ShapedCommunicator() {
  // Messages sent and never waited for still go (as the wrapped backend would have sent them)
  // before the communicator they go on does.
  link_->drain(inner_);
}

std::unique_ptr<ShapedCommunicator> ShapedCommunicator::wrap_world(
    Communicator& world, std::shared_ptr<ShapedLink> link) {
  std::vector<int> ranks(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) ranks[static_cast<size_t>(r)] = r;
  return std::make_unique<ShapedCommunicator>(&world, nullptr, std::move(link), std::move(ranks));
}

std::unique_ptr<Request> ShapedCommunicator::isend(const Tensor& t, int peer, int tag) {
  STRATA_CHECK(peer >= 0 && peer < size())
      << "isend to rank " << peer << " of a communicator of " << size();
  const int world_peer = world_ranks_[static_cast<size_t>(peer)];
  if (peer == rank()) return inner_->isend(t, peer, tag);  // no link to itself
  return link_->send(*inner_, t, peer, tag, world_peer, current_traffic_class());
}

std::unique_ptr<Communicator> ShapedCommunicator::wrap(std::unique_ptr<Communicator> child,
                                                       std::vector<int> world_ranks) {
  Communicator* raw = child.get();
  auto out =
      std::make_unique<ShapedCommunicator>(raw, std::move(child), link_, std::move(world_ranks));
  out->set_timeout(timeout());
  return out;
}

std::unique_ptr<Communicator> ShapedCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> child = inner_->split(color, key);
  if (child == nullptr) return nullptr;
  // The child's ranks in the world's numbering (collective over the child, as the split was).
  const int mine = world_ranks_[static_cast<size_t>(rank())];
  Tensor in = Tensor::full({1}, static_cast<double>(mine), DType::kI64);
  Tensor out = Tensor::zeros({child->size()}, DType::kI64);
  child->all_gather(in, out)->wait(child->timeout(), "the emulated link's split");
  std::vector<int> ranks;
  for (int64_t r : out.to_vector<int64_t>()) ranks.push_back(static_cast<int>(r));
  return wrap(std::move(child), std::move(ranks));
}

std::unique_ptr<Communicator> ShapedCommunicator::subgroup(const std::vector<int>& members,
                                                           int tag) {
  std::unique_ptr<Communicator> child = inner_->subgroup(members, tag);
  std::vector<int> ranks;
  for (int m : members) ranks.push_back(world_ranks_.at(static_cast<size_t>(m)));
  return wrap(std::move(child), std::move(ranks));
}

}  // namespace strata::parallel
