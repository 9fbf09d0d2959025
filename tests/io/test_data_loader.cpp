#include "io/data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace strata::io {
namespace {

// Sample i: input f32 (3) = {i, i + 0.5, -i}, target i64 = i. Optionally throws on one sample or
// sleeps in every get() (to keep workers busy).
class RangeDataset final : public Dataset {
 public:
  explicit RangeDataset(int64_t n, int64_t bad = -1, int sleep_us = 0)
      : n_(n), bad_(bad), sleep_us_(sleep_us) {}
  std::string name() const override { return "range"; }
  int64_t size() const override { return n_; }
  SampleSpec input_spec() const override { return {{3}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  void get(int64_t index, void* input, void* target) const override {
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleep_us_));
    if (index == bad_) STRATA_THROW() << "range: sample " << index << " is corrupt";
    float* in = static_cast<float*>(input);
    in[0] = static_cast<float>(index);
    in[1] = static_cast<float>(index) + 0.5f;
    in[2] = -static_cast<float>(index);
    *static_cast<int64_t*>(target) = index;
  }

 private:
  int64_t n_;
  int64_t bad_;
  int sleep_us_;
};

DataLoaderOptions make_options(int64_t batch_size, bool shuffle = false, uint64_t seed = 0) {
  DataLoaderOptions o;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.seed = seed;
  return o;
}

// Every batch of one epoch.
std::vector<Batch> epoch_batches(DataLoader& loader, int64_t epoch, int64_t first_step = 0) {
  loader.start_epoch(epoch, first_step);
  std::vector<Batch> batches;
  Batch b;
  while (loader.next(&b)) batches.push_back(b);
  return batches;
}

std::vector<int64_t> targets(const std::vector<Batch>& batches) {
  std::vector<int64_t> out;
  for (const Batch& b : batches) {
    const std::vector<int64_t> t = b.target.to_vector<int64_t>();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

void expect_same_batches(const std::vector<Batch>& a, const std::vector<Batch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].epoch, b[i].epoch);
    EXPECT_EQ(a[i].step, b[i].step);
    EXPECT_EQ(a[i].sample_offset, b[i].sample_offset);
    EXPECT_EQ(a[i].rows, b[i].rows);
    EXPECT_EQ(a[i].input.shape(), b[i].input.shape());
    EXPECT_EQ(a[i].input.to_vector<float>(), b[i].input.to_vector<float>()) << "batch " << i;
    EXPECT_EQ(a[i].target.to_vector<int64_t>(), b[i].target.to_vector<int64_t>()) << "batch " << i;
  }
}

TEST(DataLoader, IdentityOrderAndBatchFields) {
  auto data = std::make_shared<RangeDataset>(10);
  DataLoader loader(data, make_options(4));
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  const std::vector<Batch> batches = epoch_batches(loader, 2);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].input.shape(), (Shape{4, 3}));
  EXPECT_EQ(batches[0].target.shape(), Shape{4});
  EXPECT_EQ(batches[0].target.dtype(), DType::kI64);
  EXPECT_EQ(batches[1].input.to_vector<float>()[0], 4.0f);
  EXPECT_EQ(batches[1].input.to_vector<float>()[1], 4.5f);
  EXPECT_EQ(batches[1].input.to_vector<float>()[2], -4.0f);
  EXPECT_EQ(batches[2].rows, 2);
  EXPECT_EQ(batches[2].input.shape(), (Shape{2, 3}));
  for (int64_t s = 0; s < 3; ++s) {
    EXPECT_EQ(batches[static_cast<size_t>(s)].epoch, 2);
    EXPECT_EQ(batches[static_cast<size_t>(s)].step, s);
    EXPECT_EQ(batches[static_cast<size_t>(s)].sample_offset, 4 * s);
  }
  std::vector<int64_t> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(targets(batches), expected);
  Batch b;
  EXPECT_FALSE(loader.next(&b));  // stays at the end
}

TEST(DataLoader, DropLast) {
  auto data = std::make_shared<RangeDataset>(10);
  DataLoaderOptions o = make_options(4);
  o.drop_last = true;
  DataLoader loader(data, o);
  EXPECT_EQ(loader.batches_per_epoch(), 2);
  EXPECT_EQ(targets(epoch_batches(loader, 0)), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  o.batch_size = 11;
  EXPECT_EQ(DataLoader(data, o).batches_per_epoch(), 0);
}

TEST(DataLoader, EverySampleExactlyOncePerEpoch) {
  auto data = std::make_shared<RangeDataset>(103);
  DataLoaderOptions o = make_options(8, /*shuffle=*/true, 7);
  o.num_workers = 2;
  DataLoader loader(data, o);
  for (int64_t epoch : {0, 1, 5}) {
    std::vector<int64_t> seen = targets(epoch_batches(loader, epoch));
    ASSERT_EQ(seen.size(), 103u);
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
    EXPECT_EQ(seen, loader.epoch_order(epoch));
  }
}

TEST(DataLoader, ShuffleIsDeterministicFromTheSeed) {
  auto data = std::make_shared<RangeDataset>(50);
  DataLoader a(data, make_options(5, true, 123));
  DataLoader b(data, make_options(5, true, 123));
  DataLoader c(data, make_options(5, true, 124));
  const std::vector<int64_t> order_a = targets(epoch_batches(a, 3));
  EXPECT_EQ(order_a, targets(epoch_batches(b, 3)));
  EXPECT_NE(order_a, targets(epoch_batches(c, 3)));
  std::vector<int64_t> identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(order_a, identity);
}

TEST(DataLoader, DifferentOrderPerEpoch) {
  auto data = std::make_shared<RangeDataset>(50);
  DataLoader loader(data, make_options(5, true, 1));
  const std::vector<int64_t> e0 = targets(epoch_batches(loader, 0));
  const std::vector<int64_t> e1 = targets(epoch_batches(loader, 1));
  EXPECT_NE(e0, e1);
  EXPECT_EQ(e0, targets(epoch_batches(loader, 0)));  // epoch 0 again: the same order
}

TEST(DataLoader, ShardsOfAStepConcatenateToTheUnshardedBatch) {
  auto data = std::make_shared<RangeDataset>(37);  // 4 full batches of 8, then 5 rows
  for (int groups : {2, 4, 8}) {
    DataLoaderOptions o = make_options(8, true, 99);
    DataLoader whole(data, o);
    const std::vector<Batch> full = epoch_batches(whole, 4);
    std::vector<std::vector<Batch>> shards;
    for (int g = 0; g < groups; ++g) {
      o.shard_index = g;
      o.shard_count = groups;
      o.num_workers = g % 2;  // mix synchronous and threaded loaders
      DataLoader loader(data, o);
      EXPECT_EQ(loader.batches_per_epoch(), 5);
      shards.push_back(epoch_batches(loader, 4));
      ASSERT_EQ(shards.back().size(), full.size());
    }
    for (size_t s = 0; s < full.size(); ++s) {
      std::vector<float> inputs;
      std::vector<int64_t> labels;
      int64_t offset = full[s].sample_offset;
      for (int g = 0; g < groups; ++g) {
        const Batch& b = shards[static_cast<size_t>(g)][s];
        EXPECT_EQ(b.step, static_cast<int64_t>(s));
        EXPECT_EQ(b.sample_offset, offset) << "group " << g << " step " << s;
        if (s < 4) {
          EXPECT_EQ(b.rows, 8 / groups);
        }
        offset += b.rows;
        const std::vector<float> in = b.input.to_vector<float>();
        const std::vector<int64_t> t = b.target.to_vector<int64_t>();
        inputs.insert(inputs.end(), in.begin(), in.end());
        labels.insert(labels.end(), t.begin(), t.end());
      }
      EXPECT_EQ(inputs, full[s].input.to_vector<float>()) << groups << " groups, step " << s;
      EXPECT_EQ(labels, full[s].target.to_vector<int64_t>()) << groups << " groups, step " << s;
    }
    // The last batch (5 rows): group g gets rows [floor(5g/G), floor(5(g+1)/G)).
    std::vector<int64_t> last_rows;
    for (int g = 0; g < groups; ++g) last_rows.push_back(shards[static_cast<size_t>(g)][4].rows);
    const std::vector<int64_t> expected_rows = groups == 2 ? std::vector<int64_t>{2, 3}
                                               : groups == 4
                                                   ? std::vector<int64_t>{1, 1, 1, 2}
                                                   : std::vector<int64_t>{0, 1, 0, 1, 1, 0, 1, 1};
    EXPECT_EQ(last_rows, expected_rows);
  }
}

TEST(DataLoader, EmptyShardOfTheLastBatch) {
  auto data = std::make_shared<RangeDataset>(10);  // last batch: 2 rows over 4 groups
  DataLoaderOptions o = make_options(8);
  o.shard_count = 4;
  o.shard_index = 0;
  DataLoader loader(data, o);
  const std::vector<Batch> batches = epoch_batches(loader, 0);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].rows, 0);
  EXPECT_EQ(batches[1].input.shape(), (Shape{0, 3}));
  EXPECT_EQ(batches[1].target.shape(), Shape{0});
}

TEST(DataLoader, BatchNotDivisibleByGroupsIsAnError) {
  auto data = std::make_shared<RangeDataset>(10);
  DataLoaderOptions o = make_options(10);
  o.shard_count = 4;
  try {
    DataLoader loader(data, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("batch_size 10 is not divisible by the number of data-parallel groups 4"),
              std::string::npos)
        << msg;
  }
}

TEST(DataLoader, InvalidOptions) {
  auto data = std::make_shared<RangeDataset>(10);
  DataLoaderOptions o = make_options(0);
  EXPECT_THROW(DataLoader(data, o), Error);
  o = make_options(4);
  o.prefetch = 0;
  EXPECT_THROW(DataLoader(data, o), Error);
  o = make_options(4);
  o.shard_count = 2;
  o.shard_index = 2;
  EXPECT_THROW(DataLoader(data, o), Error);
  o = make_options(4);
  o.num_workers = -1;
  EXPECT_THROW(DataLoader(data, o), Error);
  EXPECT_THROW(DataLoader(nullptr, make_options(4)), Error);

  DataLoader loader(data, make_options(4));
  Batch b;
  EXPECT_THROW(loader.next(&b), Error);  // no start_epoch yet
  EXPECT_THROW(loader.start_epoch(0, 4), Error);
  EXPECT_THROW(loader.start_epoch(-1), Error);
  loader.start_epoch(0, 3);  // resuming at the end is fine: nothing left
  EXPECT_FALSE(loader.next(&b));
}

TEST(DataLoader, ResumeAtFirstStepGivesTheRemainingBatches) {
  auto data = std::make_shared<RangeDataset>(45);
  for (int workers : {0, 2}) {
    DataLoaderOptions o = make_options(6, true, 5);
    o.num_workers = workers;
    o.shard_count = 2;
    o.shard_index = 1;
    DataLoader loader(data, o);
    const std::vector<Batch> full = epoch_batches(loader, 2);
    DataLoader resumed(data, o);
    const std::vector<Batch> rest = epoch_batches(resumed, 2, 3);
    ASSERT_EQ(rest.size() + 3, full.size());
    expect_same_batches(rest, std::vector<Batch>(full.begin() + 3, full.end()));
  }
}

TEST(DataLoader, WorkersGiveTheSameBatchesAsTheCallingThread) {
  auto data = std::make_shared<RangeDataset>(200);
  DataLoaderOptions o = make_options(7, true, 11);
  DataLoader sync(data, o);
  o.num_workers = 3;
  o.prefetch = 4;
  DataLoader threaded(data, o);
  for (int64_t epoch : {0, 1}) {
    expect_same_batches(epoch_batches(sync, epoch), epoch_batches(threaded, epoch));
  }
  o.prefetch = 1;  // one batch ahead, two workers idle
  DataLoader narrow(data, o);
  expect_same_batches(epoch_batches(sync, 3), epoch_batches(narrow, 3));
}

// Sample i in epoch e: input {i, e}, target i.
class EpochDataset final : public Dataset {
 public:
  std::string name() const override { return "epochs"; }
  int64_t size() const override { return 9; }
  SampleSpec input_spec() const override { return {{2}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  void get(int64_t index, void* input, void* target) const override {
    ADD_FAILURE() << "the loader must call get_in_epoch";
    get_in_epoch(0, index, input, target);
  }
  void get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const override {
    static_cast<float*>(input)[0] = static_cast<float>(index);
    static_cast<float*>(input)[1] = static_cast<float>(epoch);
    *static_cast<int64_t*>(target) = index;
  }
};

TEST(DataLoader, ReadsSamplesInTheEpochOfStartEpoch) {
  for (int workers : {0, 2}) {
    DataLoaderOptions o = make_options(4, true, 5);
    o.num_workers = workers;
    DataLoader loader(std::make_shared<EpochDataset>(), o);
    for (int64_t epoch : {0, 3, 1}) {
      int64_t rows = 0;
      for (const Batch& b : epoch_batches(loader, epoch)) {
        const std::vector<float> in = b.input.to_vector<float>();
        for (int64_t r = 0; r < b.rows; ++r) EXPECT_EQ(in[2 * r + 1], static_cast<float>(epoch));
        rows += b.rows;
      }
      EXPECT_EQ(rows, 9) << "workers " << workers << " epoch " << epoch;
    }
  }
}

TEST(DataLoader, BatchesComeFromTheGivenAllocator) {
  auto data = std::make_shared<RangeDataset>(20);
  CpuAllocator alloc;
  DataLoaderOptions o = make_options(5);
  o.allocator = &alloc;
  o.num_workers = 2;
  DataLoader loader(data, o);
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(&b));
  EXPECT_EQ(&b.input.allocator(), &alloc);
  EXPECT_EQ(&b.target.allocator(), &alloc);
  EXPECT_GT(alloc.stats().allocations, 0u);
}

TEST(DataLoader, SampleErrorReachesNextWithItsMessage) {
  auto data = std::make_shared<RangeDataset>(40, /*bad=*/13);
  for (int workers : {0, 3}) {
    DataLoaderOptions o = make_options(4);
    o.num_workers = workers;
    o.prefetch = 3;
    DataLoader loader(data, o);
    loader.start_epoch(0);
    Batch b;
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(loader.next(&b)) << s;  // samples 0..11
    try {
      loader.next(&b);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("range: sample 13 is corrupt"), std::string::npos) << msg;
      EXPECT_NE(msg.find("dataset range sample 13"), std::string::npos) << msg;
      EXPECT_NE(msg.find("epoch 0 step 3"), std::string::npos) << msg;
    }
    EXPECT_THROW(loader.next(&b), Error);  // the epoch stays failed
    loader.start_epoch(1, 4);              // a fresh epoch past the bad batch works
    ASSERT_TRUE(loader.next(&b));
    EXPECT_EQ(b.target.to_vector<int64_t>()[0], 16);
  }
}

TEST(DataLoader, StartEpochCancelsTheEpochInFlight) {
  auto data = std::make_shared<RangeDataset>(300, -1, /*sleep_us=*/50);
  DataLoaderOptions o = make_options(10, true, 3);
  o.num_workers = 3;
  o.prefetch = 4;
  DataLoader loader(data, o);
  loader.start_epoch(0);
  Batch b;
  ASSERT_TRUE(loader.next(&b));
  ASSERT_TRUE(loader.next(&b));
  const std::vector<Batch> epoch1 = epoch_batches(loader, 1);
  o.num_workers = 0;
  DataLoader fresh(data, o);
  expect_same_batches(epoch1, epoch_batches(fresh, 1));
}

TEST(DataLoader, DestroyingMidEpochReturnsPromptly) {
  // 1000 samples of 1 ms each: a full epoch would take far longer than the bound below.
  auto data = std::make_shared<RangeDataset>(1000, -1, /*sleep_us=*/1000);
  DataLoaderOptions o = make_options(50);
  o.num_workers = 3;
  o.prefetch = 4;
  const auto start = std::chrono::steady_clock::now();
  {
    DataLoader loader(data, o);
    loader.start_epoch(0);
    Batch b;
    ASSERT_TRUE(loader.next(&b));
  }
  { DataLoader never_started(data, o); }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 0.5);
}

}  // namespace
}  // namespace strata::io
