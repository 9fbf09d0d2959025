// One conformance suite for every Communicator backend (after ggml's one harness for all
// backends): each check is run by every rank of a communicator, with the same arguments, and
// reports failures through GoogleTest. Inputs are deterministic functions of (rank, seed), so
// every rank can compute what every other rank contributed and hence the expected result.
//
// `exact`: the backend reduces in rank order (the local backend), so sums must equal the rank-order
// sum bit for bit; otherwise (MPI's own order) float sums are compared with a tolerance. Every
// backend must give bitwise identical results on all ranks, which is checked by gathering them.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "engine/philox.h"
#include "parallel/comm/communicator.h"
#include "parallel/topology.h"
#include "testing/testing.h"

namespace strata::parallel::comm_checks {

using Millis = std::chrono::milliseconds;

// Values in [-1, 1) for floating types, integers in [-1000, 1000] otherwise.
inline Tensor input_for(int rank, DType dtype, const Shape& shape, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  PhiloxStream rng(seed, 0xc0cc + static_cast<uint64_t>(rank));
  for (double& x : v) {
    x = is_floating(dtype) ? -1.0 + 2.0 * rng.next_uniform()
                           : static_cast<double>(rng.next_below(2001)) - 1000.0;
  }
  return Tensor::from_vector(v, shape).to(dtype);
}

template <typename T>
void combine(T* acc, const T* x, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) {
    if (op == ReduceOp::kSum) {
      acc[i] += x[i];
    } else if (x[i] > acc[i]) {
      acc[i] = x[i];
    }
  }
}

// x0 op x1 op ... op x(N-1), left to right, in the inputs' dtype.
inline Tensor reduce_in_rank_order(const std::vector<Tensor>& inputs, ReduceOp op) {
  Tensor acc = inputs[0].clone();
  for (size_t q = 1; q < inputs.size(); ++q) {
    const int64_t n = acc.numel();
    switch (acc.dtype()) {
      case DType::kF32:
        combine(acc.data<float>(), inputs[q].data<float>(), n, op);
        break;
      case DType::kF64:
        combine(acc.data<double>(), inputs[q].data<double>(), n, op);
        break;
      case DType::kI32:
        combine(acc.data<int32_t>(), inputs[q].data<int32_t>(), n, op);
        break;
      case DType::kI64:
        combine(acc.data<int64_t>(), inputs[q].data<int64_t>(), n, op);
        break;
      default:
        ADD_FAILURE() << "reduce_in_rank_order: unsupported dtype";
    }
  }
  return acc;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
}

// Gathers `t` from every rank and checks that all copies equal this rank's, bit for bit.
inline void expect_same_on_all_ranks(Communicator& comm, const Tensor& t, const std::string& what) {
  Tensor all = Tensor::empty({comm.size() * t.numel()}, t.dtype());
  wait(*comm.all_gather(t.flatten(), all), comm, "gather " + what);
  for (int q = 0; q < comm.size(); ++q) {
    EXPECT_TRUE(same_bytes(all.narrow(0, q * t.numel(), t.numel()), t.flatten()))
        << what << ": rank " << q << "'s result differs from rank " << comm.rank() << "'s";
  }
}

// Ring: every rank sends an f32 and an i32 tensor to the next rank and receives from the previous.
inline void send_recv_ring(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor f = input_for(r, DType::kF32, {3, 5}, 1), i = input_for(r, DType::kI32, {7}, 2);
  Tensor f_in = Tensor::empty({3, 5}), i_in = Tensor::empty({7}, DType::kI32);
  auto rf = comm.irecv(f_in, prev, 1);
  auto ri = comm.irecv(i_in, prev, 2);
  auto sf = comm.isend(f, next, 1);
  auto si = comm.isend(i, next, 2);
  wait(*ri, comm, "ring recv i32");
  wait(*rf, comm, "ring recv f32");
  wait(*sf, comm, "ring send f32");
  wait(*si, comm, "ring send i32");
  EXPECT_TRUE(same_bytes(f_in, input_for(prev, DType::kF32, {3, 5}, 1)));
  EXPECT_TRUE(same_bytes(i_in, input_for(prev, DType::kI32, {7}, 2)));
}

// Rank 0 sends tags 10, 11, 12, 12 to rank 1, which posts its receives as 12, 11, 12, 10 and
// waits for them in reverse: receives match by tag, FIFO within a tag.
inline void tags_out_of_order(Communicator& comm) {
  if (comm.size() < 2) return;
  const std::vector<int> send_tags = {10, 11, 12, 12};
  if (comm.rank() == 0) {
    std::vector<Tensor> msgs;
    std::vector<std::unique_ptr<Request>> reqs;
    for (size_t k = 0; k < send_tags.size(); ++k) {
      msgs.push_back(Tensor::full({4}, 100.0 * static_cast<double>(k + 1)));
      reqs.push_back(comm.isend(msgs.back(), 1, send_tags[k]));
    }
    for (auto& q : reqs) wait(*q, comm, "tagged send");
  } else if (comm.rank() == 1) {
    const std::vector<int> recv_tags = {12, 11, 12, 10};
    const std::vector<double> expected = {300, 200, 400, 100};  // message k carries 100 (k + 1)
    std::vector<Tensor> bufs;
    std::vector<std::unique_ptr<Request>> reqs;
    for (int tag : recv_tags) {
      bufs.push_back(Tensor::zeros({4}));
      reqs.push_back(comm.irecv(bufs.back(), 0, tag));
    }
    for (size_t k = reqs.size(); k-- > 0;) {
      wait(*reqs[k], comm, "tagged recv");
      EXPECT_EQ(bufs[k].to_vector<double>(), std::vector<double>(4, expected[k]))
          << "receive " << k << " (tag " << recv_tags[k] << ")";
    }
  }
}

inline void zero_size(Communicator& comm) {
  const int n = comm.size(), r = comm.rank();
  Tensor empty_f = Tensor::empty({0}), empty_i = Tensor::empty({2, 0}, DType::kI32);
  Tensor in_f = Tensor::empty({0}), in_i = Tensor::empty({2, 0}, DType::kI32);
  auto rf = comm.irecv(in_f, (r + n - 1) % n, 3);
  auto ri = comm.irecv(in_i, (r + n - 1) % n, 4);
  auto sf = comm.isend(empty_f, (r + 1) % n, 3);
  auto si = comm.isend(empty_i, (r + 1) % n, 4);
  for (Request* q : {rf.get(), ri.get(), sf.get(), si.get()}) wait(*q, comm, "zero-size p2p");
  wait(*comm.all_reduce(empty_f), comm, "zero-size all_reduce");
  wait(*comm.broadcast(empty_i, 0), comm, "zero-size broadcast");
  Tensor out = Tensor::empty({0});
  wait(*comm.all_gather(empty_f, out), comm, "zero-size all_gather");
  wait(*comm.reduce_scatter(Tensor::empty({0}), Tensor::empty({0})), comm,
       "zero-size reduce_scatter");
}

inline void all_reduce(Communicator& comm, DType dtype, ReduceOp op, int64_t numel, bool exact) {
  const uint64_t seed = 100 + static_cast<uint64_t>(numel) + static_cast<uint64_t>(dtype);
  const std::string what = std::string("all_reduce ") + dtype_name(dtype) +
                           (op == ReduceOp::kSum ? " sum " : " max ") + std::to_string(numel);
  Tensor t = input_for(comm.rank(), dtype, {numel}, seed);
  wait(*comm.all_reduce(t, op), comm, what);
  std::vector<Tensor> inputs;
  for (int q = 0; q < comm.size(); ++q) inputs.push_back(input_for(q, dtype, {numel}, seed));
  const Tensor expected = reduce_in_rank_order(inputs, op);
  if (exact || !is_floating(dtype) || op == ReduceOp::kMax) {
    EXPECT_TRUE(same_bytes(t, expected)) << what << ": not the rank-order result, bit for bit";
  } else {
    EXPECT_TRUE(testing::all_close(t, expected, 1e-6 * comm.size(), 1e-6)) << what;
  }
  expect_same_on_all_ranks(comm, t, what);
}

inline void broadcast(Communicator& comm) {
  for (int root : {comm.size() - 1, 0}) {
    for (DType dtype : {DType::kF32, DType::kI64}) {
      Tensor t = input_for(comm.rank(), dtype, {3, 7}, 7);
      wait(*comm.broadcast(t, root), comm, "broadcast");
      EXPECT_TRUE(same_bytes(t, input_for(root, dtype, {3, 7}, 7)))
          << "broadcast " << dtype_name(dtype) << " from root " << root;
    }
  }
}

inline void all_gather(Communicator& comm) {
  const int n = comm.size();
  Tensor in = input_for(comm.rank(), DType::kF64, {2, 3}, 8);
  Tensor out = Tensor::empty({n, 2, 3}, DType::kF64);
  wait(*comm.all_gather(in, out), comm, "all_gather");
  for (int q = 0; q < n; ++q) {
    EXPECT_TRUE(same_bytes(out.select(0, q), input_for(q, DType::kF64, {2, 3}, 8)))
        << "all_gather slice " << q;
  }
}

inline void reduce_scatter(Communicator& comm, bool exact) {
  const int n = comm.size(), m = 5;
  for (DType dtype : {DType::kF32, DType::kI64}) {
    Tensor in = input_for(comm.rank(), dtype, {n * m}, 9);
    Tensor out = Tensor::empty({m}, dtype);
    wait(*comm.reduce_scatter(in, out), comm, "reduce_scatter");
    std::vector<Tensor> slices;
    for (int q = 0; q < n; ++q) {
      slices.push_back(input_for(q, dtype, {n * m}, 9).narrow(0, comm.rank() * m, m).clone());
    }
    const Tensor expected = reduce_in_rank_order(slices, ReduceOp::kSum);
    if (exact || !is_floating(dtype)) {
      EXPECT_TRUE(same_bytes(out, expected)) << "reduce_scatter " << dtype_name(dtype);
    } else {
      EXPECT_TRUE(testing::all_close(out, expected, 1e-6 * n, 1e-6)) << "reduce_scatter";
    }
  }
}

// The G x S layout of parallel/topology.h (rank = g * S + s): a pipeline communicator per group
// (color g, key s) and a data-parallel communicator per stage (color s, key g).
inline void split_grid(Communicator& comm, int groups, int stages) {
  ASSERT_EQ(comm.size(), groups * stages);
  const Topology topo(comm.size(), groups, stages, comm.rank());
  std::unique_ptr<Communicator> pipe = comm.split(topo.group(), topo.stage());
  std::unique_ptr<Communicator> dp = comm.split(topo.stage(), topo.group());
  ASSERT_TRUE(pipe && dp);
  EXPECT_EQ(pipe->size(), stages);
  EXPECT_EQ(pipe->rank(), topo.stage());
  EXPECT_EQ(dp->size(), groups);
  EXPECT_EQ(dp->rank(), topo.group());
  EXPECT_EQ(dp->timeout(), comm.timeout());

  // Gradient all-reduce across groups: the sum over g of what rank (g, s) holds.
  Tensor grad = Tensor::full({6}, 1.0 + topo.rank(), DType::kF64);
  wait(*dp->all_reduce(grad), *dp, "dp all_reduce");
  double expected = 0.0;
  for (int g = 0; g < groups; ++g) expected += 1.0 + topo.rank_of(g, topo.stage());
  EXPECT_EQ(grad.to_vector<double>(), std::vector<double>(6, expected));

  // Activations down the pipeline: stage s sends to s + 1 of the same group.
  Tensor act = Tensor::full({4}, 10.0 * topo.rank());
  std::unique_ptr<Request> send, recv;
  Tensor in = Tensor::zeros({4});
  if (topo.stage() + 1 < stages) send = pipe->isend(act, topo.stage() + 1, 5);
  if (topo.stage() > 0) recv = pipe->irecv(in, topo.stage() - 1, 5);
  if (recv) {
    wait(*recv, *pipe, "RecvAct");
    EXPECT_EQ(in.to_vector<double>(),
              std::vector<double>(4, 10.0 * topo.rank_of(topo.group(), topo.stage() - 1)));
  }
  if (send) wait(*send, *pipe, "SendAct");
  dp->barrier("dp barrier");
  pipe->barrier("pipe barrier");

  // Keys order the new ranks (reversed here); a negative color leaves a rank out.
  std::unique_ptr<Communicator> reversed = comm.split(0, -comm.rank());
  ASSERT_TRUE(reversed);
  EXPECT_EQ(reversed->rank(), comm.size() - 1 - comm.rank());
  std::unique_ptr<Communicator> evens = comm.split(comm.rank() % 2 == 0 ? 7 : -1, 0);
  EXPECT_EQ(evens != nullptr, comm.rank() % 2 == 0);
  if (evens) {
    EXPECT_EQ(evens->size(), (comm.size() + 1) / 2);
    Tensor one = Tensor::full({1}, 1.0, DType::kI64);
    wait(*evens->all_reduce(one), *evens, "evens all_reduce");
    EXPECT_EQ(one.item<int64_t>(), evens->size());
  }
}

// Rank 0 arrives late; nobody may leave the barrier before it arrives. Rank 0 then broadcasts
// the moment it arrived (steady_clock is the machine's monotonic clock, shared by the threads and
// processes of one host), and every rank checks it left after that moment.
inline void barrier_waits_for_everyone(Communicator& comm) {
  if (comm.rank() == 0) std::this_thread::sleep_for(Millis(150));
  const int64_t arrived = std::chrono::steady_clock::now().time_since_epoch().count();
  comm.barrier("late barrier");
  const int64_t left = std::chrono::steady_clock::now().time_since_epoch().count();
  Tensor t = Tensor::full({1}, 0.0, DType::kI64);
  if (comm.rank() == 0) t.data<int64_t>()[0] = arrived;
  wait(*comm.broadcast(t, 0), comm, "broadcast of rank 0's arrival");
  EXPECT_GE(left, t.item<int64_t>())
      << "rank " << comm.rank() << " left the barrier before rank 0 arrived";
}

// Rank 1 never sends; rank 0's receive times out with a message naming rank 0, what it waited
// for and the timeout. Every rank then meets in a barrier.
inline void receive_times_out(Communicator& comm) {
  if (comm.size() < 2) return;
  if (comm.rank() == 0) {
    Tensor t = Tensor::empty({8});
    auto r = comm.irecv(t, 1, 99);
    const std::string what = "RecvAct(mb 3) from stage 1, step 7";
    const auto start = std::chrono::steady_clock::now();
    try {
      r->wait(Millis(300), what);
      ADD_FAILURE() << "the receive completed although rank 1 never sent";
    } catch (const CommTimeout& e) {
      const auto elapsed = std::chrono::steady_clock::now() - start;
      EXPECT_GE(elapsed, Millis(300));
      EXPECT_LT(elapsed, Millis(1300));
      const std::string message = e.what();
      EXPECT_NE(message.find("rank 0"), std::string::npos) << message;
      EXPECT_NE(message.find(what), std::string::npos) << message;
      EXPECT_NE(message.find("300 ms"), std::string::npos) << message;
    }
  }
  comm.barrier("after the timeout");
}

}  // namespace strata::parallel::comm_checks
