// `strata train --array ... --array-slots K|auto` (issue 17 item 3): the block-state slots of the
// array's memory manager (parallel/arraypipe/state_slots.h); auto asks the slot model
// (parallel/arraypipe/slot_model.h, on vPIPE's memory model of each stage at each job's
// micro-batch, and each job's block state as the stores lay it out) for the most slots that fit
// --mem-limit.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/model.h"
#include "io/dataset.h"
#include "parallel/trainer.h"
#include "tools/train_command.h"

namespace strata::tools {

// --array-slots: K >= 1, or 0 for auto (which needs --mem-limit); refused by name otherwise.
int parse_array_slots(const TrainOptions& o);

struct ArraySlots {
  int slots = 0;     // 0: every job resident (no --array-slots)
  std::string line;  // what was decided and from what (printed by rank 0)
};

// Parses --array-slots (refusing K < 1 by name); auto: profiles the model on `train` (or reads
// --profile), models every stage and refuses a --mem-limit too small for one job, naming the
// stage and the bytes. Every rank computes the same (the profile decides nothing but the count).
ArraySlots array_slots(const TrainOptions& o, std::shared_ptr<const io::Dataset> train,
                       const graph::Model& model, const parallel::PipelineConfig& pipeline,
                       const std::vector<parallel::TrainConfig>& configs);

}  // namespace strata::tools
