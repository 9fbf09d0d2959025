// Layer-keyed checkpoints: the files of one checkpoint and the directory protocol around them.
//
// A checkpoint is a directory ROOT/step-NNNNNN/ (NNNNNN: optimizer steps done):
//
//   manifest.pb          "STRATAMF" u32 version, u32 crc32c(payload), u64 payload bytes, then a
//                        serialized proto::CheckpointManifest (io/proto/strata.proto)
//   tensors/<layer>.bin  one file per layer with tensors: a 64-byte header ("STRATATN", u32
//                        version, u32 header bytes, u64 file bytes, u32 tensor count, u32
//                        crc32c of the preceding 28 bytes, zeros), then the layer's parameters,
//                        buffers and optimizer state, raw little-endian, each 64-byte aligned;
//                        the manifest gives each tensor's offset, size and crc32c
//
// Keys are (layer name, tensor name, kind, slot), never ranks, so any layout of stages and groups
// can load a checkpoint: each store reads the layers it holds. A tied parameter (ParamSpec::
// tied_to) is saved once, under its owner, and loaded from it wherever the tied copy lives.
//
// Atomicity. Files are written into ROOT/step-NNNNNN.tmp/ and fsynced, the manifest last; then
// the directory is fsynced and renamed to step-NNNNNN, ROOT is fsynced, and ROOT/latest (the name
// of the newest checkpoint, one line) is replaced through latest.tmp the same way. A process
// killed at any moment leaves either a complete step-NNNNNN or a *.tmp that readers ignore and
// the next writer removes. find_latest_checkpoint() takes the newest step-* directory whose
// manifest and files check out, whatever `latest` says (it may lag by one after a kill).
//
// Loading reads every tensor a store needs into host temporaries and verifies magic, version,
// sizes, shapes, dtypes and checksums before a single value of the store changes; any mismatch
// throws CheckpointError naming the file and the tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/check.h"
#include "engine/tensor.h"
#include "graph/model.h"
#include "graph/param_store.h"
#include "io/proto/strata.pb.h"

namespace strata::graph {

constexpr uint32_t kCheckpointFormatVersion = 1;

// A checkpoint that cannot be written or read, or does not fit the model.
class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& message) : Error(message) {}
};

// "step-000120".
std::string checkpoint_name(int64_t step);

// The tensors and files one store contributes to a checkpoint.
struct StoreTensors {
  std::vector<proto::CheckpointTensor> tensors;
  std::vector<proto::CheckpointFile> files;
  uint64_t bytes = 0;  // all files together
};

// Writes the layers of `store` (parameters other than tied ones, buffers, and the optimizer state
// slots named in `slots`, which must match store.state_slots()) into `dir`/tensors/, one fsynced
// file per layer that has tensors. Tensors on a device are copied to the host first.
StoreTensors write_store_tensors(const ParamStore& store, const std::vector<std::string>& slots,
                                 const std::string& dir);

// Writes `dir`/manifest.pb (fsynced).
void write_manifest(const std::string& dir, const proto::CheckpointManifest& manifest);
// Reads and checks `dir`/manifest.pb: frame, checksum, format version, and that every tensor lies
// inside a listed file.
proto::CheckpointManifest read_manifest(const std::string& dir);
// read_manifest() plus: every listed file exists and has its recorded size. Cheap (no tensor
// data read); what "complete" means for find_latest_checkpoint().
proto::CheckpointManifest check_checkpoint(const std::string& dir);

// The tensors one store needs, read from a checkpoint and verified, not yet in the store.
class StoreLoad {
 public:
  // Reads every tensor `store` holds (and, for each of `slots`, its optimizer state) from the
  // checkpoint `dir` described by `manifest`. Throws CheckpointError naming the file and tensor
  // when one is missing, has another shape or dtype, lies outside its file, or fails its checksum.
  StoreLoad(const std::string& dir, const proto::CheckpointManifest& manifest,
            const ParamStore& store, const std::vector<std::string>& slots);
  // Copies the values into the store (same store as above).
  void apply(ParamStore& store) const;
  uint64_t bytes() const { return bytes_; }

 private:
  struct Item {
    enum Kind { kParam, kBuffer, kState } kind;
    size_t entry = 0;
    size_t slot = 0;
    Tensor values;  // host
  };
  std::vector<Item> items_;
  uint64_t bytes_ = 0;
};

// Layer names in `manifest` that `model` does not have (a checkpoint of another model).
std::vector<std::string> unknown_layers(const proto::CheckpointManifest& manifest,
                                        const Model& model);

// ---- the directory protocol (one process: rank 0) -------------------------------------------

// Creates ROOT (if needed) and a fresh ROOT/step-NNNNNN.tmp/tensors/; returns the .tmp path.
std::string begin_checkpoint(const std::string& root, int64_t step);
// Makes ROOT/step-NNNNNN.tmp (manifest written) the checkpoint ROOT/step-NNNNNN (replacing an
// older one of that step), then points ROOT/latest at it. Returns the final path.
std::string commit_checkpoint(const std::string& root, int64_t step);
// Removes committed checkpoints beyond the newest `keep_last` (0: keep all) and leftovers of
// interrupted writes and removals (*.tmp, *.old). Returns the names removed.
std::vector<std::string> prune_checkpoints(const std::string& root, int keep_last);

struct CheckpointRef {
  std::string path;
  int64_t step = 0;
};
// The newest complete checkpoint under `root` (see check_checkpoint), or nothing when there is
// none (or no `root`). Incomplete step-* directories are skipped with a warning.
std::optional<CheckpointRef> find_latest_checkpoint(const std::string& root);
// `path` is a checkpoint (it has a manifest.pb) or a root of them (its newest complete one).
// Throws CheckpointError when it is neither.
CheckpointRef resolve_checkpoint(const std::string& path);

}  // namespace strata::graph
