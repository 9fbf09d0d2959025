// ArrayPipe's memory manager (parallel/arraypipe/state_slots.h) and slot model
// (parallel/arraypipe/slot_model.h): K slots of block states per stage, the others in the host
// pool, prefetched in the block order; states come back bit for bit, the device holds at most
// K + 1 states, a block whose state was not prefetched waits and is counted.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "engine/allocator.h"
#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "models/registry.h"
#include "parallel/arraypipe/binder.h"
#include "parallel/arraypipe/slot_model.h"
#include "parallel/arraypipe/state_slots.h"
#include "parallel/runtime/copy_engine.h"

namespace strata::parallel::arraypipe {
namespace {

std::unique_ptr<graph::Model> small_cnn() {
  return graph::build_model(models::model_spec("cnn", "tiny", {1, 28, 28}, 10));
}

std::vector<char> bytes_of(const Tensor& t) {
  std::vector<char> b(t.nbytes());
  if (!b.empty()) std::memcpy(b.data(), t.raw_data(), b.size());
  return b;
}

// Every job's values (parameters, buffers, optimizer state) as bytes.
std::vector<std::vector<char>> snapshot(Binder& binder, int job) {
  std::vector<std::vector<char>> out;
  for (const Tensor* t : state_values(binder.store(job))) out.push_back(bytes_of(*t));
  return out;
}

TEST(ArrayPipeSlots, StatesComeBackBitForBitWithinKPlusOneStates) {
  auto model = small_cnn();
  CpuAllocator device, pool;
  ExecContext ctx(Device::cpu(), &device, 1);
  CopyEngine engine(ctx, pool, "--swap-pool");
  engine.set_copy_delay(std::chrono::microseconds(2000));
  Binder binder(*model, 0, model->size(), device);
  constexpr int kJobs = 4, kSlots = 2;
  StateSlots slots(binder, kSlots, &engine, false);
  std::vector<std::vector<std::vector<char>>> expected;
  for (int j = 0; j < kJobs; ++j) {
    binder.add_job(static_cast<uint64_t>(j + 1), 1);
    // A distinct optimizer state, so that a mixed-up slot would show.
    binder.store(j).state(0).fill_(static_cast<double>(j) + 0.5);
    expected.push_back(snapshot(binder, j));
    slots.admit(j);
  }
  const size_t state = block_state_bytes(binder.store(0));
  EXPECT_EQ(slots.stats().state_bytes, state);
  EXPECT_TRUE(slots.on_device(0) && slots.on_device(1));
  EXPECT_FALSE(slots.on_device(2) || slots.on_device(3));
  EXPECT_LE(device.stats().peak, (kSlots + 1) * state + state / 2);
  // A round-robin block order, as a gpipe-like task graph gives a stage: prefetches follow it.
  const std::vector<int> order = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int round = 0; round < 3; ++round) {
    for (size_t b = 0; b < order.size(); ++b) {
      std::vector<int> upcoming(order.begin() + static_cast<std::ptrdiff_t>(b), order.end());
      upcoming.insert(upcoming.end(), order.begin(), order.end());
      slots.before_block(upcoming);
      const int job = order[b];
      EXPECT_EQ(binder.bound(), job);
      EXPECT_TRUE(binder.store(job).grads().defined());
      EXPECT_EQ(snapshot(binder, job), expected[static_cast<size_t>(job)]) << "job " << job;
      EXPECT_EQ(binder.store(job).params().device(), Device::cpu());
    }
  }
  const SlotStats s = slots.stats();
  EXPECT_GT(s.loads, 0);
  EXPECT_GT(s.prefetched, 0);
  EXPECT_EQ(s.offloads, s.loads + 2);  // two jobs went out at admission
  // States move whole, and at most K slots plus one eviction on its way out are on the device.
  EXPECT_LE(device.stats().peak, (kSlots + 1) * state + state / 2);
  EXPECT_EQ(s.bytes_to_host, s.bytes_to_device + 2 * (state - binder.store(0).params().nbytes()));
}

TEST(ArrayPipeSlots, OneSlotStallsOnEverySwitch) {
  auto model = small_cnn();
  CpuAllocator device, pool;
  ExecContext ctx(Device::cpu(), &device, 1);
  CopyEngine engine(ctx, pool, "--swap-pool");
  Binder binder(*model, 0, model->size(), device);
  StateSlots slots(binder, 1, &engine, false);
  for (int j = 0; j < 3; ++j) {
    binder.add_job(static_cast<uint64_t>(j + 1), 0);
    slots.admit(j);
  }
  EXPECT_EQ(slots.stats().offloads, 2);
  for (int job : {0, 1, 2, 1, 0}) {
    slots.use(job);
    EXPECT_EQ(binder.bound(), job);
  }
  const SlotStats s = slots.stats();
  // Jobs 1, 2, 1, 0 were on the host when their use came: loaded then, waited for.
  EXPECT_EQ(s.loads, 4);
  EXPECT_EQ(s.not_prefetched, 4);
  EXPECT_EQ(s.stalls, 4);
  EXPECT_EQ(s.prefetched, 0);
  EXPECT_THROW(StateSlots(binder, 0, &engine, false), Error);
}

SlotModelStage stage(double state, double held, double transient, int jobs) {
  SlotModelStage s;
  s.state_bytes = state;
  s.grads_bytes = state / 4;
  s.held_bytes.assign(static_cast<size_t>(jobs), held);
  s.transient_bytes.assign(static_cast<size_t>(jobs), transient);
  return s;
}

TEST(ArrayPipeSlots, SlotModelPicksTheMostSlotsThatFit) {
  // 4 jobs: peak(K) = (K + [K < 4]) x 100 + 4 x 10 + 5.
  const SlotModelStage s = stage(100, 10, 5, 4);
  EXPECT_DOUBLE_EQ(modelled_slot_peak(s, 1, false), 245);
  EXPECT_DOUBLE_EQ(modelled_slot_peak(s, 3, false), 445);
  EXPECT_DOUBLE_EQ(modelled_slot_peak(s, 4, false), 445);  // every job resident, nothing moves
  EXPECT_DOUBLE_EQ(modelled_slot_peak(s, 9, false), 445);
  // keep_grads: the gradients of the jobs without a slot stay on the device too.
  EXPECT_DOUBLE_EQ(modelled_slot_peak(s, 1, true), 245 + 2 * 25);
  EXPECT_EQ(choose_slots({s}, 244, false).slots, 0);  // too small for one job
  EXPECT_EQ(choose_slots({s}, 245, false).slots, 1);
  EXPECT_EQ(choose_slots({s}, 344, false).slots, 1);
  EXPECT_EQ(choose_slots({s}, 345, false).slots, 2);
  EXPECT_EQ(choose_slots({s}, 445, false).slots, 4);
  // More memory never gives fewer slots, nor a smaller array.
  int last = 0, last_array = 0;
  for (double limit = 200; limit < 1000; limit += 7) {
    const int k = choose_slots({s}, limit, false).slots;
    EXPECT_GE(k, last);
    last = k;
    const int n = largest_array(s, 1, limit, false);
    EXPECT_GE(n, last_array);
    last_array = n;
  }
  EXPECT_EQ(largest_array(s, 1, 245, false), 4);
  EXPECT_EQ(largest_array(s, 1, 255, false), 5);
  // The worst stage decides.
  SlotChoice c = choose_slots({s, stage(150, 10, 5, 4)}, 445, false);
  EXPECT_EQ(c.slots, 1);  // 2 slots would need 3 x 150 + 45 on stage 1
  c = choose_slots({s, stage(150, 10, 5, 4)}, 495, false);
  EXPECT_EQ(c.slots, 2);
  EXPECT_EQ(c.worst_stage, 1);
  EXPECT_DOUBLE_EQ(c.peak_bytes[0], 345);
  EXPECT_DOUBLE_EQ(c.peak_bytes[1], 3 * 150 + 45);
}

}  // namespace
}  // namespace strata::parallel::arraypipe
