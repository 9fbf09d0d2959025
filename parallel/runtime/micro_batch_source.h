// Where a stage's micro-batches come from: the first stage asks for inputs, the last for targets,
// every stage for the bookkeeping of a micro-batch (its step, rows, position in the global batch
// and the loss normalizer of its update). parallel/micro_batches.h reads them from a DataLoader.
#pragma once

#include <cstdint>

#include "engine/tensor.h"

namespace strata::parallel {

class MicroBatchSource {
 public:
  struct Info {
    int64_t step = 0;           // optimizer step the micro-batch belongs to (RNG key)
    int64_t sample_offset = 0;  // position of its first row within the step's global batch
    int64_t rows = 0;
    double loss_normalizer = 1.0;  // counted targets of the step's global batch
  };
  virtual ~MicroBatchSource() = default;
  virtual Info info(int64_t micro_batch) = 0;
  virtual TensorList input(int64_t micro_batch) = 0;  // first stage
  virtual Tensor target(int64_t micro_batch) = 0;     // last stage
};

}  // namespace strata::parallel
