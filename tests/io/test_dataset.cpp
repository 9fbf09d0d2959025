#include "io/dataset.h"

#include <gtest/gtest.h>

#include <string>

namespace strata::io {
namespace {

// Sample i: input f32 (2) = {i, -i}, target i64 = i.
class RangeDataset final : public Dataset {
 public:
  explicit RangeDataset(int64_t n) : n_(n) {}
  std::string name() const override { return "range"; }
  int64_t size() const override { return n_; }
  SampleSpec input_spec() const override { return {{2}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return 7; }
  void get(int64_t index, void* input, void* target) const override {
    STRATA_CHECK(index >= 0 && index < n_) << "range: sample " << index;
    static_cast<float*>(input)[0] = static_cast<float>(index);
    static_cast<float*>(input)[1] = -static_cast<float>(index);
    *static_cast<int64_t*>(target) = index;
  }

 private:
  int64_t n_;
};

int64_t target_of(const Dataset& d, int64_t i) {
  float input[2];
  int64_t target = -1;
  d.get(i, input, &target);
  EXPECT_EQ(input[0], static_cast<float>(target));
  return target;
}

TEST(Subset, MapsIndicesAndKeepsSpecs) {
  auto base = std::make_shared<RangeDataset>(10);
  auto subset = make_subset(base, 3, 4);
  EXPECT_EQ(subset->size(), 4);
  EXPECT_EQ(subset->name(), "range[3:7]");
  EXPECT_EQ(subset->input_spec().shape, Shape{2});
  EXPECT_EQ(subset->input_spec().dtype, DType::kF32);
  EXPECT_EQ(subset->target_spec().shape, Shape{});
  EXPECT_EQ(subset->target_spec().dtype, DType::kI64);
  EXPECT_EQ(subset->num_classes(), 7);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(target_of(*subset, i), 3 + i);
}

TEST(Subset, OfASubsetAndEmptyAndWhole) {
  auto base = std::make_shared<RangeDataset>(10);
  auto inner = make_subset(make_subset(base, 2, 8), 5, 3);  // base samples 7, 8, 9
  EXPECT_EQ(inner->size(), 3);
  EXPECT_EQ(target_of(*inner, 0), 7);
  EXPECT_EQ(target_of(*inner, 2), 9);
  EXPECT_EQ(make_subset(base, 10, 0)->size(), 0);
  EXPECT_EQ(make_subset(base, 0, 10)->size(), 10);
}

TEST(Subset, KeepsTheBaseAlive) {
  std::shared_ptr<const Dataset> subset;
  {
    auto base = std::make_shared<RangeDataset>(5);
    subset = make_subset(base, 1, 2);
  }
  EXPECT_EQ(target_of(*subset, 1), 2);
}

TEST(Subset, RangeOutsideTheBaseIsAnError) {
  auto base = std::make_shared<RangeDataset>(10);
  EXPECT_THROW(make_subset(base, -1, 2), Error);
  EXPECT_THROW(make_subset(base, 0, -1), Error);
  EXPECT_THROW(make_subset(base, 11, 0), Error);
  EXPECT_THROW(make_subset(nullptr, 0, 0), Error);
  try {
    make_subset(base, 8, 3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[8, 8 + 3)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("range, which has 10 samples"), std::string::npos) << msg;
  }
}

TEST(Subset, IndexOutsideTheSubsetIsAnError) {
  auto subset = make_subset(std::make_shared<RangeDataset>(10), 2, 3);
  float input[2];
  int64_t target;
  EXPECT_THROW(subset->get(3, input, &target), Error);
  EXPECT_THROW(subset->get(-1, input, &target), Error);
}

// Sample i in epoch e: input {i, e}; it reports `skipped` skipped samples.
class EpochDataset final : public Dataset {
 public:
  std::string name() const override { return "epochs"; }
  int64_t size() const override { return 10; }
  SampleSpec input_spec() const override { return {{2}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  void get(int64_t index, void* input, void* target) const override {
    get_in_epoch(0, index, input, target);
  }
  void get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const override {
    static_cast<float*>(input)[0] = static_cast<float>(index);
    static_cast<float*>(input)[1] = static_cast<float>(epoch);
    *static_cast<int64_t*>(target) = index;
  }
  int64_t skipped_samples() const override { return 4; }
};

TEST(Subset, ForwardsTheEpochAndTheSkippedCount) {
  auto subset = make_subset(std::make_shared<EpochDataset>(), 3, 5);
  float input[2];
  int64_t target = -1;
  subset->get_in_epoch(6, 2, input, &target);
  EXPECT_EQ(input[0], 5.0f);
  EXPECT_EQ(input[1], 6.0f);
  EXPECT_EQ(target, 5);
  EXPECT_THROW(subset->get_in_epoch(0, 5, input, &target), Error);
  EXPECT_EQ(subset->skipped_samples(), 4);
}

TEST(Dataset, DefaultsIgnoreTheEpochAndSkipNothing) {
  RangeDataset base(4);
  float input[2];
  int64_t target = -1;
  base.get_in_epoch(9, 3, input, &target);
  EXPECT_EQ(input[0], 3.0f);
  EXPECT_EQ(target, 3);
  EXPECT_EQ(base.skipped_samples(), 0);
}

}  // namespace
}  // namespace strata::io
