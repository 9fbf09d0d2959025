// The emulated link (parallel/comm/link_queue.h, shaped_comm.h): Eq. 8's calculator, the queue's
// order with and without flow control and its byte accounting, driven in virtual time; and the
// shaped communicator over local ranks (bytes intact, classes and world ranks counted). No
// timing in any assertion.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "parallel/comm/link_queue.h"
#include "parallel/comm/local_comm.h"
#include "parallel/comm/shaped_comm.h"

namespace strata::parallel {
namespace {

TEST(PriorityQueueModel, Eq8PaperCase) {
  // ../shared/papers/dynpipe.md §5 item 17: lambda1 = lambda2 = 1, mu = 4.
  const PriorityQueueModel m = priority_queue_model(1.0, 1.0, 4.0);
  EXPECT_DOUBLE_EQ(m.rho, 0.5);
  EXPECT_NEAR(m.lq_training, 1.0 / 6.0, 1e-12);
  EXPECT_NEAR(m.lq_bulk, 1.0 / 3.0, 1e-12);
  // Little's law, and the standard form Wq1 = rho / (mu (1 - rho1)).
  EXPECT_NEAR(m.wq_training, 0.5 / (4.0 * (1.0 - 0.25)), 1e-12);
  EXPECT_NEAR(m.wq_bulk, 0.5 / (4.0 * 0.75 * 0.5), 1e-12);
}

TEST(PriorityQueueModel, RefusesWithoutSteadyState) {
  EXPECT_THROW(priority_queue_model(2.0, 2.0, 4.0), Error);  // rho = 1
  EXPECT_THROW(priority_queue_model(0.0, 1.0, 4.0), Error);
}

// A bulk message on the link, a second one queued, a training message arriving meanwhile.
std::vector<LinkQueue::Transmission> three_messages(bool priority, LinkQueue* q) {
  std::vector<LinkQueue::Transmission> out;
  q->push(1000, TrafficClass::kBulk, 0.0);  // 1 s at 1000 B/s
  q->push(1000, TrafficClass::kBulk, 0.0);
  out.push_back(*q->start(0.0));
  EXPECT_FALSE(q->start(0.5).has_value()) << "the link is busy until 1 s";
  q->push(100, TrafficClass::kTraining, 0.5);
  out.push_back(*q->start(1.0));
  out.push_back(*q->start(out.back().finish));
  EXPECT_TRUE(q->empty());
  return out;
}

TEST(LinkQueue, FlowControlSendsTrainingFirstButNeverInterrupts) {
  LinkQueue q(1000.0, true);
  const auto t = three_messages(true, &q);
  EXPECT_EQ(t[0].id, 0u);
  EXPECT_EQ(t[0].traffic, TrafficClass::kBulk);
  EXPECT_EQ(t[1].id, 2u) << "the training message overtakes the queued bulk one";
  EXPECT_DOUBLE_EQ(t[1].start, 1.0) << "but waits for the bulk message in transmission";
  EXPECT_DOUBLE_EQ(t[1].finish, 1.1);
  EXPECT_EQ(t[2].id, 1u);
  EXPECT_DOUBLE_EQ(t[2].finish, 2.1);
  const LinkClassCounters& train = q.counters(TrafficClass::kTraining);
  EXPECT_EQ(train.messages, 1);
  EXPECT_EQ(train.bytes, 100u);
  EXPECT_DOUBLE_EQ(train.wait_seconds, 0.5);
  const LinkClassCounters& bulk = q.counters(TrafficClass::kBulk);
  EXPECT_EQ(bulk.messages, 2);
  EXPECT_EQ(bulk.bytes, 2000u);
  EXPECT_DOUBLE_EQ(bulk.wait_seconds, 1.1);
  EXPECT_DOUBLE_EQ(bulk.first_start, 0.0);
  EXPECT_DOUBLE_EQ(bulk.last_finish, 2.1);
}

TEST(LinkQueue, FifoWithoutFlowControl) {
  LinkQueue q(1000.0, false);
  const auto t = three_messages(false, &q);
  EXPECT_EQ(t[0].id, 0u);
  EXPECT_EQ(t[1].id, 1u) << "FIFO: the earlier bulk message first";
  EXPECT_EQ(t[2].id, 2u);
  EXPECT_DOUBLE_EQ(t[2].start, 2.0);
  EXPECT_DOUBLE_EQ(q.counters(TrafficClass::kTraining).wait_seconds, 1.5);
  EXPECT_EQ(q.counters(TrafficClass::kBulk).bytes + q.counters(TrafficClass::kTraining).bytes,
            2100u);
}

// Virtual time: `bulk` bytes queued at 0 in chunks of `chunk`, one training message of 100 B
// arriving at 0.05 s; returns the training message's wait.
double training_wait(size_t bulk, size_t chunk, bool priority) {
  LinkQueue q(1000.0, priority);
  for (size_t sent = 0; sent < bulk; sent += chunk) {
    q.push(std::min(chunk, bulk - sent), TrafficClass::kBulk, 0.0);
  }
  double now = 0.0;
  bool arrived = false;
  while (!q.empty() || !arrived) {
    if (!arrived && q.busy_until() >= 0.05) {
      q.push(100, TrafficClass::kTraining, 0.05);
      arrived = true;
    }
    const auto t = q.start(now);
    if (t.has_value()) now = t->finish;
  }
  EXPECT_EQ(q.counters(TrafficClass::kBulk).bytes, bulk);
  EXPECT_EQ(q.counters(TrafficClass::kBulk).messages,
            static_cast<int64_t>((bulk + chunk - 1) / chunk));
  return q.counters(TrafficClass::kTraining).wait_seconds;
}

TEST(LinkQueue, ChunksLetTrainingInBetween) {
  // Whole: 10 s of bulk ahead of it either way (non-preemptive).
  EXPECT_NEAR(training_wait(10000, 10000, true), 9.95, 1e-9);
  EXPECT_NEAR(training_wait(10000, 10000, false), 9.95, 1e-9);
  // Chunks of 1 s: with flow control it waits for the chunk in transmission only; FIFO behind all.
  EXPECT_NEAR(training_wait(10000, 1000, true), 0.95, 1e-9);
  EXPECT_NEAR(training_wait(10000, 1000, false), 9.95, 1e-9);
}

TEST(ShapedCommunicator, DeliversBytesAndCountsClassesByWorldRank) {
  LocalWorld world(3);
  std::vector<std::vector<LinkLaneReport>> reports(3);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    auto link = std::make_shared<ShapedLink>(comm.rank(), 1e9, true);
    auto shaped = ShapedCommunicator::wrap_world(comm, link);
    // Reversed order: the split's rank r is world rank 2 - r.
    std::unique_ptr<Communicator> rev = shaped->split(0, 2 - comm.rank());
    ASSERT_EQ(rev->rank(), 2 - comm.rank());
    if (comm.rank() == 0) {  // split rank 2 -> split rank 0 (world 2)
      const Tensor a = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
      rev->isend(a, 0, 5)->wait(rev->timeout(), "training send");
      const TrafficClassScope bulk(TrafficClass::kBulk);
      const Tensor b = Tensor::from_vector(std::vector<float>(100, 7.0f), {100});
      auto r1 = rev->isend(b, 0, 6);
      auto r2 = shaped->isend(b, 1, 7);  // world rank 1
      r1->wait(rev->timeout(), "bulk send");
      r2->wait(shaped->timeout(), "bulk send");
    } else if (comm.rank() == 2) {
      Tensor a = Tensor::zeros({3}, DType::kF32);
      Tensor b = Tensor::zeros({100}, DType::kF32);
      rev->irecv(a, 2, 5)->wait(rev->timeout(), "recv a");
      rev->irecv(b, 2, 6)->wait(rev->timeout(), "recv b");
      EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3}));
      EXPECT_EQ(b.to_vector<float>(), std::vector<float>(100, 7.0f));
    } else {
      Tensor b = Tensor::zeros({100}, DType::kF32);
      shaped->irecv(b, 0, 7)->wait(shaped->timeout(), "recv b");
      EXPECT_EQ(b.to_vector<float>(), std::vector<float>(100, 7.0f));
    }
    reports[static_cast<size_t>(comm.rank())] = link->report();
  });
  EXPECT_TRUE(reports[1].empty());
  EXPECT_TRUE(reports[2].empty()) << "receives are not shaped";
  ASSERT_EQ(reports[0].size(), 2u);
  const LinkLaneReport& to1 = reports[0][0];
  const LinkLaneReport& to2 = reports[0][1];
  EXPECT_EQ(to1.to, 1);
  EXPECT_EQ(to1.training.messages, 0);
  EXPECT_EQ(to1.bulk.bytes, 400u);
  EXPECT_EQ(to2.to, 2);
  EXPECT_EQ(to2.training.messages, 1);
  EXPECT_EQ(to2.training.bytes, 12u);
  EXPECT_EQ(to2.bulk.messages, 1);
  EXPECT_EQ(to2.bulk.bytes, 400u);
}

}  // namespace
}  // namespace strata::parallel
