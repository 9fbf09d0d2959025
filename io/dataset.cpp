// Dataset subsets: a view of a contiguous range of another dataset's samples. The subset keeps its
// base alive through the shared_ptr and forwards get() with the index shifted, so it costs no
// memory and is as thread-safe as the base.
#include "io/dataset.h"

#include <utility>

#include "engine/check.h"

namespace strata::io {
namespace {

class SubsetDataset final : public Dataset {
 public:
  SubsetDataset(std::shared_ptr<const Dataset> base, int64_t first, int64_t count)
      : base_(std::move(base)), first_(first), count_(count) {}

  std::string name() const override {
    return base_->name() + "[" + std::to_string(first_) + ":" + std::to_string(first_ + count_) +
           "]";
  }
  int64_t size() const override { return count_; }
  SampleSpec input_spec() const override { return base_->input_spec(); }
  SampleSpec target_spec() const override { return base_->target_spec(); }
  int64_t num_classes() const override { return base_->num_classes(); }

  void get(int64_t index, void* input, void* target) const override {
    STRATA_CHECK(index >= 0 && index < count_)
        << name() << ": sample " << index << " out of range (size " << count_ << ")";
    base_->get(first_ + index, input, target);
  }
  void get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const override {
    STRATA_CHECK(index >= 0 && index < count_)
        << name() << ": sample " << index << " out of range (size " << count_ << ")";
    base_->get_in_epoch(epoch, first_ + index, input, target);
  }
  int64_t skipped_samples() const override { return base_->skipped_samples(); }

 private:
  std::shared_ptr<const Dataset> base_;
  int64_t first_;
  int64_t count_;
};

}  // namespace

std::shared_ptr<const Dataset> make_subset(std::shared_ptr<const Dataset> base, int64_t first,
                                           int64_t count) {
  STRATA_CHECK(base != nullptr) << "make_subset: no base dataset";
  const int64_t size = base->size();
  STRATA_CHECK(first >= 0 && count >= 0 && first <= size && count <= size - first)
      << "make_subset: samples [" << first << ", " << first << " + " << count << ") are outside "
      << base->name() << ", which has " << size << " samples";
  return std::make_shared<SubsetDataset>(std::move(base), first, count);
}

}  // namespace strata::io
