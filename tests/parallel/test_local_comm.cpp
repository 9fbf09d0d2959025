// The local backend: the shared conformance checks on 1 to 4 thread ranks and a 2 x 3 grid, plus
// what only the local backend promises (rank-order sums bit for bit, isend completing at once,
// abort reaching every waiter quickly, wait order not mattering).
#include "parallel/comm/local_comm.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

#include "comm_checks.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Runs `fn` on every rank of a new world of `n` ranks, with a timeout so that a bug fails
// instead of hanging.
void run(int n, const std::function<void(LocalCommunicator&)>& fn) {
  LocalWorld world(n);
  run_local_ranks(world, [&](LocalCommunicator& comm) {
    comm.set_timeout(std::chrono::seconds(20));
    fn(comm);
  });
}

class LocalCommSizes : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommSizes, SendRecvRing) { run(GetParam(), comm_checks::send_recv_ring); }

TEST_P(LocalCommSizes, TagsOutOfOrder) { run(GetParam(), comm_checks::tags_out_of_order); }

TEST_P(LocalCommSizes, ZeroSizeTensors) { run(GetParam(), comm_checks::zero_size); }

TEST_P(LocalCommSizes, AllReduceIsTheRankOrderSumOnEveryRank) {
  run(GetParam(), [](Communicator& comm) {
    for (DType dtype : {DType::kF32, DType::kF64, DType::kI32, DType::kI64}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
        // 100003 elements: many chunks with uneven boundaries.
        for (int64_t numel : {1, 1000, 100003}) {
          comm_checks::all_reduce(comm, dtype, op, numel, /*exact=*/true);
        }
      }
    }
  });
}

TEST_P(LocalCommSizes, Broadcast) { run(GetParam(), comm_checks::broadcast); }

TEST_P(LocalCommSizes, AllGather) { run(GetParam(), comm_checks::all_gather); }

TEST_P(LocalCommSizes, ReduceScatter) {
  run(GetParam(), [](Communicator& comm) { comm_checks::reduce_scatter(comm, true); });
}

TEST_P(LocalCommSizes, Barrier) { run(GetParam(), comm_checks::barrier_waits_for_everyone); }

TEST_P(LocalCommSizes, ReceiveTimesOut) { run(GetParam(), comm_checks::receive_times_out); }

INSTANTIATE_TEST_SUITE_P(Ranks, LocalCommSizes, ::testing::Values(1, 2, 3, 4));

TEST(LocalComm, SplitIntoPipelineAndDataParallelGroups) {
  run(6, [](Communicator& comm) { comm_checks::split_grid(comm, 2, 3); });
  run(4, [](Communicator& comm) { comm_checks::split_grid(comm, 2, 2); });
  run(3, [](Communicator& comm) { comm_checks::split_grid(comm, 1, 3); });
}

TEST(LocalComm, SendCompletesAtOnceAndCopiesTheBytes) {
  run(2, [](LocalCommunicator& comm) {
    Tensor t = Tensor::full({5}, 1.0);
    if (comm.rank() == 0) {
      auto s = comm.isend(t, 1, 0);
      EXPECT_TRUE(s->test());
      t.fill_(2.0);  // the message keeps the bytes it was sent with
      comm.isend(t, 1, 0);
    } else {
      Tensor a = Tensor::zeros({5}), b = Tensor::zeros({5});
      auto ra = comm.irecv(a, 0, 0);
      auto rb = comm.irecv(b, 0, 0);
      wait(*rb, comm, "second");
      wait(*ra, comm, "first");
      EXPECT_EQ(a.to_vector<float>(), std::vector<float>(5, 1.0f));
      EXPECT_EQ(b.to_vector<float>(), std::vector<float>(5, 2.0f));
    }
  });
}

TEST(LocalComm, MaxPropagatesNaN) {
  run(3, [](Communicator& comm) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Tensor t = Tensor::from_vector<float>({1.0f, comm.rank() == 1 ? nan : 2.0f}, {2});
    wait(*comm.all_reduce(t, ReduceOp::kMax), comm, "max");
    EXPECT_EQ(t.to_vector<float>()[0], 1.0f);
    EXPECT_TRUE(std::isnan(t.to_vector<float>()[1]));
  });
}

TEST(LocalComm, WaitOrderDoesNotMatter) {
  // Rank 0 waits for the second all_reduce first, rank 1 for the first: neither depends on the
  // other waiting, only on both having posted.
  run(2, [](Communicator& comm) {
    Tensor a = Tensor::full({70000}, 1.0), b = Tensor::full({70000}, 2.0);
    auto ra = comm.all_reduce(a);
    auto rb = comm.all_reduce(b);
    if (comm.rank() == 0) std::swap(ra, rb);
    wait(*ra, comm, "first wait");
    wait(*rb, comm, "second wait");
    EXPECT_EQ(a.to_vector<float>(), std::vector<float>(70000, 2.0f));
    EXPECT_EQ(b.to_vector<float>(), std::vector<float>(70000, 4.0f));
  });
}

TEST(LocalComm, TestPollsToCompletion) {
  run(2, [](Communicator& comm) {
    Tensor t = Tensor::full({100000}, 1.0 + comm.rank(), DType::kF64);
    auto r = comm.all_reduce(t);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!r->test()) ASSERT_LT(Clock::now(), deadline);
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(100000, 3.0));
  });
}

// Request::wait_on_stream on a backend that completes on the host (local, mpi): a host wait, so
// the results are there when it returns, whatever the stream (null here: the CPU has none); and
// it times out like wait(). NCCL's (a device wait) needs a GPU: CudaPipelineMpi, NcclComm.
TEST(LocalComm, WaitOnStreamWaitsOnTheHost) {
  run(2, [](Communicator& comm) {
    Tensor t = Tensor::full({1000}, 1.0 + comm.rank(), DType::kF64);
    auto r = comm.all_reduce(t);
    r->wait_on_stream(nullptr, comm.timeout(), "all_reduce waited on a stream");
    EXPECT_TRUE(r->test());
    EXPECT_EQ(t.to_vector<double>(), std::vector<double>(1000, 3.0));
    if (comm.rank() == 1) {
      Tensor never = Tensor::zeros({4});
      auto lonely = comm.irecv(never, 0, 7);
      EXPECT_THROW(lonely->wait_on_stream(nullptr, Millis(50), "a receive nobody sends"),
                   CommTimeout);
    }
  });
}

TEST(LocalComm, MismatchedCollectivesFailOnEveryRank) {
  std::atomic<int> errors{0};
  run(2, [&](Communicator& comm) {
    Tensor t = Tensor::zeros({comm.rank() == 0 ? 4 : 5});
    try {
      wait(*comm.all_reduce(t), comm, "mismatched all_reduce");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("differs between ranks"), std::string::npos);
      ++errors;
    }
  });
  EXPECT_EQ(errors.load(), 2);
}

TEST(LocalComm, ReceiveOfTheWrongSizeIsAnError) {
  run(2, [](Communicator& comm) {
    if (comm.rank() == 0) {
      comm.isend(Tensor::zeros({3}), 1, 0);
    } else {
      Tensor t = Tensor::zeros({4});
      EXPECT_THROW(wait(*comm.irecv(t, 0, 0), comm, "recv"), Error);
    }
  });
}

TEST(LocalComm, BadArgumentsNameTheProblem) {
  LocalWorld world(2);
  auto comm = world.communicator(0);
  Tensor t = Tensor::zeros({4});
  EXPECT_THROW(comm->isend(t, 2, 0), Error);
  EXPECT_THROW(comm->isend(t, 1, 40000), Error);
  EXPECT_THROW(comm->irecv(t.view({2, 2}).transpose(0, 1), 1, 0), Error);
  EXPECT_THROW(comm->all_reduce(Tensor::zeros({2}, DType::kU8)), Error);
  EXPECT_THROW(comm->all_gather(t, Tensor::zeros({7})), Error);
  EXPECT_THROW(world.communicator(2), Error);
  EXPECT_THROW(LocalWorld(0), Error);
}

TEST(LocalComm, BarrierTimesOut) {
  LocalWorld world(2);
  auto comm = world.communicator(0);
  comm->set_timeout(Millis(200));
  const auto start = Clock::now();
  try {
    comm->barrier("Barrier(step 4)");
    ADD_FAILURE() << "the barrier passed with rank 1 absent";
  } catch (const CommTimeout& e) {
    EXPECT_GE(Clock::now() - start, Millis(200));
    EXPECT_NE(std::string(e.what()).find("Barrier(step 4)"), std::string::npos) << e.what();
  }
}

// One rank throws: the others, blocked in a receive from it and in a collective, fail at once
// with CommAborted naming it, and run_local_ranks rethrows the original error.
TEST(LocalComm, AFailedRankAbortsTheOthersQuickly) {
  LocalWorld world(3);
  std::atomic<int> aborted{0};
  const auto start = Clock::now();
  try {
    run_local_ranks(world, [&](LocalCommunicator& comm) {
      comm.set_timeout(std::chrono::seconds(30));
      if (comm.rank() == 2) {
        std::this_thread::sleep_for(Millis(50));
        throw std::runtime_error("loss is NaN at step 7");
      }
      try {
        Tensor t = Tensor::zeros({4});
        if (comm.rank() == 0) {
          wait(*comm.irecv(t, 2, 0), comm, "RecvAct(mb 0) from stage 2");
        } else {
          wait(*comm.all_reduce(t), comm, "ReduceGrads");
        }
        ADD_FAILURE() << "rank " << comm.rank() << " completed a wait on a failed rank";
      } catch (const CommAborted& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
        EXPECT_NE(message.find("loss is NaN at step 7"), std::string::npos) << message;
        EXPECT_NE(message.find(comm.rank() == 0 ? "RecvAct" : "ReduceGrads"), std::string::npos)
            << message;
        ++aborted;
      }
      EXPECT_THROW(comm.isend(Tensor::zeros({1}), 0, 0), CommAborted);  // posting after abort
    });
    ADD_FAILURE() << "run_local_ranks did not rethrow";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "loss is NaN at step 7");
  }
  EXPECT_EQ(aborted.load(), 2);
  EXPECT_LT(Clock::now() - start, Millis(2000));
  EXPECT_TRUE(world.aborted());
  EXPECT_EQ(world.failed_rank(), 2);
}

// An abort through a sub-world reaches waiters of the root world, naming the root-world rank.
TEST(LocalComm, AbortReachesTheWholeFamily) {
  LocalWorld world(4);
  auto rank_fn = [&](LocalCommunicator& comm) {
    comm.set_timeout(std::chrono::seconds(30));
    auto sub = comm.split(comm.rank() / 2, 0);
    auto* local = dynamic_cast<LocalCommunicator*>(sub.get());
    ASSERT_NE(local, nullptr);
    EXPECT_EQ(local->world_rank(), comm.rank());
    if (comm.rank() == 3) {
      local->abort("stage 1 ran out of memory");
      return;
    }
    // Ranks 0 and 1 wait in the root world, rank 2 in its sub-world with the aborting rank 3.
    Tensor t = Tensor::zeros({2});
    auto r = comm.rank() == 2 ? sub->all_reduce(t) : comm.all_reduce(t);
    try {
      r->wait(std::chrono::seconds(30), "all_reduce");
      ADD_FAILURE() << "rank " << comm.rank() << " completed a wait on a failed world";
    } catch (const CommAborted& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("rank 3 of the local world failed: stage 1 ran out of memory"),
                std::string::npos)
          << message;
      throw;
    }
  };
  EXPECT_THROW(run_local_ranks(world, rank_fn), CommAborted);
  EXPECT_EQ(world.failed_rank(), 3);
  EXPECT_EQ(world.abort_message(), "stage 1 ran out of memory");
}

}  // namespace
}  // namespace strata::parallel
