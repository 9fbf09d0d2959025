// The Dataset interface: random access to samples of a fixed shape and dtype.
//
// A dataset knows how to produce sample i; batching, shuffling, sharding and prefetching are the
// DataLoader's (io/data_loader.h). Samples are written straight into the rows of a batch tensor,
// so a dataset never allocates per sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/tensor.h"

namespace strata::io {

struct SampleSpec {
  Shape shape;  // of one sample, without the batch dimension; {} for a scalar (a class label)
  DType dtype = DType::kF32;
  size_t nbytes() const { return static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype); }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::string name() const = 0;  // "fashion-mnist/train"
  virtual int64_t size() const = 0;
  virtual SampleSpec input_spec() const = 0;
  virtual SampleSpec target_spec() const = 0;
  virtual int64_t num_classes() const { return 0; }  // 0: not a classification dataset
  // Writes sample `index` (0 <= index < size()) to `input` and `target`, laid out as the specs
  // say. Called concurrently from the loader's threads: must be thread-safe. Errors (a corrupt
  // file) throw strata::Error naming the file and the sample.
  virtual void get(int64_t index, void* input, void* target) const = 0;
  // Sample `index` as epoch `epoch` of a run sees it. The DataLoader calls this one, with the epoch
  // of its start_epoch. A dataset with random augmentation overrides it and draws its randomness
  // from (seed, epoch, index) alone, so a sample is the same whichever thread makes it and in
  // whatever order; its get(index) is epoch 0. The default ignores the epoch.
  virtual void get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const {
    get(index, input, target);
  }
  // Samples whose file could not be read and that the dataset replaced by another sample instead
  // of failing (ImageFolderOptions::skip_bad_samples), so far; 0 for datasets that never skip.
  // Thread-safe.
  virtual int64_t skipped_samples() const { return 0; }
};

// The samples [first, first + count) of `base` as a dataset of their own (tests and quick runs
// train on a subsample of a real dataset).
std::shared_ptr<const Dataset> make_subset(std::shared_ptr<const Dataset> base, int64_t first,
                                           int64_t count);

}  // namespace strata::io
