// Tied parameters in a live migration (parallel/runtime/live_stage.h).
//
// A tied parameter whose owner and user layers sit on two stages (GPT-2's token embedding and
// output head, BERT's word embedding and MLM decoder) has a copy on each; at every update the
// executor sums the two copies' gradients over the tied communicator (the stages holding them),
// so both apply the same update. Under async-1f1b the update of micro-batch m on each stage
// follows its backward of m, so the sum pairs m's gradient from both stages, each computed on
// the version Eq. 4 gives that stage (vPIPE §2.7, ../shared/papers/vpipe.md).
//
// A live move keeps that pairing as long as the owner and the user stay where they are: the
// layers that move are others (the blocks of live_stage.h hold no tied parameter), and the pair
// of stages of the tied communicator is the same before and after every migration. A move that
// carries the owner or the user would change that pair at its hand-off, which is not built:
// check_live_tied refuses it before training, naming the layer and the migration.
#pragma once

#include "graph/model.h"
#include "parallel/runtime/live_stage.h"

namespace strata::parallel {

// Throws (naming the layer, its tied parameter, the stages and the migration) when a migration
// of `config` moves a layer that owns or uses a tied parameter.
void check_live_tied(const graph::Model& model, const LiveMigrationConfig& config);

}  // namespace strata::parallel
