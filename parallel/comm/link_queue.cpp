// An emulated link's queue and Eq. 8 (see the header).
#include "parallel/comm/link_queue.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::parallel {
namespace {

thread_local TrafficClass tls_class = TrafficClass::kTraining;

int index_of(TrafficClass c) { return c == TrafficClass::kTraining ? 0 : 1; }

}  // namespace

const char* traffic_class_name(TrafficClass c) {
  return c == TrafficClass::kTraining ? "training" : "bulk";
}

TrafficClass current_traffic_class() { return tls_class; }

TrafficClassScope::TrafficClassScope(TrafficClass c) : saved_(tls_class) { tls_class = c; }

TrafficClassScope::~TrafficClassScope() { tls_class = saved_; }

PriorityQueueModel priority_queue_model(double lambda_training, double lambda_bulk, double mu) {
  STRATA_CHECK(lambda_training > 0 && lambda_bulk > 0 && mu > 0)
      << "the priority queue model needs positive rates (lambda1 " << lambda_training
      << ", lambda2 " << lambda_bulk << ", mu " << mu << ")";
  PriorityQueueModel m;
  m.rho = (lambda_training + lambda_bulk) / mu;
  STRATA_CHECK(m.rho < 1.0) << "the priority queue model has no steady state at rho = " << m.rho
                            << " (lambda1 + lambda2 must stay below mu)";
  m.lq_training = lambda_training * m.rho / (mu - lambda_training);
  m.lq_bulk = lambda_bulk * m.rho / ((mu - lambda_training) * (1.0 - m.rho));
  m.wq_training = m.lq_training / lambda_training;
  m.wq_bulk = m.lq_bulk / lambda_bulk;
  return m;
}

LinkQueue::LinkQueue(double bytes_per_second, bool priority)
    : rate_(bytes_per_second), priority_(priority) {
  STRATA_CHECK(bytes_per_second > 0) << "an emulated link of " << bytes_per_second << " bytes/s";
}

uint64_t LinkQueue::push(size_t bytes, TrafficClass c, double now) {
  const uint64_t id = next_id_++;
  (c == TrafficClass::kTraining ? training_ : bulk_).push_back({id, bytes, now});
  return id;
}

size_t LinkQueue::waiting(TrafficClass c) const {
  return c == TrafficClass::kTraining ? training_.size() : bulk_.size();
}

const LinkClassCounters& LinkQueue::counters(TrafficClass c) const {
  return counters_[index_of(c)];
}

std::optional<LinkQueue::Transmission> LinkQueue::start(double now) {
  if (now < busy_until_ || empty()) return std::nullopt;
  bool training;
  if (training_.empty() || bulk_.empty()) {
    training = !training_.empty();
  } else {
    // Flow control: training first. FIFO: the earlier arrival (ids are in arrival order).
    training = priority_ || training_.front().id < bulk_.front().id;
  }
  std::deque<Waiting>& q = training ? training_ : bulk_;
  const Waiting w = q.front();
  q.pop_front();
  Transmission t;
  t.id = w.id;
  t.traffic = training ? TrafficClass::kTraining : TrafficClass::kBulk;
  t.bytes = w.bytes;
  t.start = std::max(now, w.arrival);
  t.finish = t.start + static_cast<double>(w.bytes) / rate_;
  busy_until_ = t.finish;
  LinkClassCounters& k = counters_[index_of(t.traffic)];
  ++k.messages;
  k.bytes += w.bytes;
  const double wait = t.start - w.arrival;
  k.wait_seconds += wait;
  k.max_wait_seconds = std::max(k.max_wait_seconds, wait);
  if (k.first_start < 0) k.first_start = t.start;
  k.last_finish = t.finish;
  return t;
}

}  // namespace strata::parallel
