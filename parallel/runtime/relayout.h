// Re-laying out a pipeline's layers over its stages (vPIPE §2.3, §3.3): which layers change
// stage when the partition goes from `from` to `to`, and the exchange of their state.
//
// A layer's state is what its ParamStore entries hold: the f32 master parameters, their
// gradients, every optimizer state slot (AdamW's moments, SGD's momentum) and the buffers
// (running statistics). Mixed precision's 16-bit working copies are not moved: the executor
// refreshes them from the masters. Entries are exchanged by their full names in a fixed order
// (each moved layer's parameters, then its buffers), so sender and receiver agree without a
// header. A tied parameter (GPT-2's head weight is the token embedding) is exchanged like any
// other: a stage that receives one whose owner it already holds keeps the owner's (they are
// equal by construction), one that now holds a copy gets the owner's values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "parallel/comm/communicator.h"
#include "parallel/partition/partition.h"

namespace strata::parallel {

struct LayerMove {
  size_t layer = 0;
  int from_stage = 0;
  int to_stage = 0;
};

// Every layer whose stage differs between `from` and `to` (same number of stages, both covering
// the layers in order), in layer order. Throws naming the partitions otherwise.
std::vector<LayerMove> layer_moves(const Partition& from, const Partition& to);

// "blocks.3 0->1, blocks.4 0->1"
std::string describe_moves(const std::vector<LayerMove>& moves,
                           const std::vector<std::string>& layer_names);

struct RelayoutStats {
  size_t bytes_sent = 0;
  size_t bytes_received = 0;
  double seconds = 0.0;
};

// Collective over `pipe` (the stages of one pipeline, rank = stage; null for one stage): this
// stage's store for layers to[stage], holding the values of `old` (the store of from[stage])
// for the layers it keeps and those received from their previous stages for the layers it
// gains; the layers it loses are sent to their new stages. `old` must outlive the call; the
// caller drops it afterwards (the new store binds the layers it holds). Tags from `tag_base`.
std::unique_ptr<graph::ParamStore> relayout_store(graph::Model& model, const graph::ParamStore& old,
                                                  const Partition& from, const Partition& to,
                                                  int stage, Communicator* pipe,
                                                  Allocator& allocator, RelayoutStats* stats,
                                                  int tag_base = 0);

}  // namespace strata::parallel
