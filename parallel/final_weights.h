// `strata train --save-weights FILE`: the weights a run ends with, every stage's layers in one
// safetensors file under Strata's names (models/weight_files.h), written by world rank 0, for
// any schedule (the asynchronous one included, after its last micro-batch has drained) and any
// layout. Parameters and buffers (running statistics) are the f32 masters; a tied parameter is
// written once, by its owner's stage.
#pragma once

#include <map>
#include <string>

#include "graph/model.h"
#include "graph/param_store.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

// Collective over `world` (null: a single process). Group 0's stage s sends its store's
// parameters and buffers to rank 0, which writes `path` with `full_model` (rank 0 only: a second
// instance of the model, bound to nothing) holding them. `metadata` goes into the file's header.
void save_final_weights(Communicator* world, int stage, int group, const graph::Model& model,
                        const graph::ParamStore& store, graph::Model* full_model,
                        const std::string& path,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::parallel
