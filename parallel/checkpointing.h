// Checkpoints of a pipeline: the collective protocol over the ranks (graph/checkpoint.h holds the
// files and the directory protocol).
//
// Saving (every rank calls it at the same step boundary):
//   1. rank 0 creates ROOT/step-NNNNNN.tmp/;
//   2. the ranks of group 0 write the layers of their stage (the groups hold identical weights);
//   3. every rank's tensor records reach rank 0 (an all-gather, which is also the barrier), which
//      writes the manifest, renames the directory, points `latest` at it and prunes old ones.
// Loading: each rank reads the manifest and the layers it owns into temporaries and verifies
// them; only when every rank succeeded does any rank copy them into its store.
// A failure of any rank in any phase throws on every rank, with every failing rank's message.
//
// All ranks must see the same file system (a shared one when ranks run on several machines).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "graph/checkpoint.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "io/proto/strata.pb.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

// Every rank's string, on every rank, in rank order (a single process: {mine}).
std::vector<std::string> all_gather_strings(Communicator* world, const std::string& mine);

// Collective: throws graph::CheckpointError on every rank when any rank's `error` is not empty,
// naming `what` and each failing rank with its message.
void agree_or_throw(Communicator* world, const std::string& error, const std::string& what);

struct SavedCheckpoint {
  std::string path;  // ROOT/step-NNNNNN
  uint64_t bytes = 0;
  double seconds = 0.0;
  std::vector<std::string> pruned;  // checkpoints and leftovers removed
};

// Collective. `manifest` holds everything but the tensors and files (rank 0's is written).
// `writes`: this rank writes its store's layers (the ranks of group 0).
SavedCheckpoint save_checkpoint(Communicator* world, const std::string& root, int64_t step,
                                int keep_last, const proto::CheckpointManifest& manifest,
                                const graph::ParamStore& store,
                                const std::vector<std::string>& slots, bool writes);

// Collective: the checkpoint to resume from. `resume` is "auto" (the newest complete checkpoint
// under `root`, or nothing when there is none) or a path (a checkpoint, or a root of them; an
// error when it holds none). Rank 0 decides and every rank gets its answer.
std::optional<graph::CheckpointRef> choose_checkpoint(Communicator* world,
                                                      const std::string& resume,
                                                      const std::string& root);

// Vets a checkpoint's manifest before any tensor is read: throws for a mismatched configuration;
// returns the names of further state slots to read after the optimizer's (the store must hold
// them by then), e.g. the delayed gradients of --dp-delay.
using CheckpointVet = std::function<std::vector<std::string>(const proto::CheckpointManifest&)>;

// Collective: loads the checkpoint at `path` into `store`: parameters, buffers and the state
// slots `slots` (then the ones `vet` adds) into the store's first state slots. `vet` may be null.
// Rank 0 also refuses a checkpoint with layers the model lacks. Returns the manifest.
proto::CheckpointManifest load_checkpoint(Communicator* world, const std::string& path,
                                          const graph::Model& model, graph::ParamStore& store,
                                          const std::vector<std::string>& slots,
                                          const CheckpointVet& vet = nullptr);

}  // namespace strata::parallel
