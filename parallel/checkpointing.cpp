// The collective side of checkpoints (parallel/checkpointing.h). Every phase ends in an
// all-gather of each rank's outcome, so that ranks never wait on a rank that already failed
// and every rank reports the same error.
#include "parallel/checkpointing.h"

#include <algorithm>
#include <chrono>

#include "engine/check.h"

namespace strata::parallel {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Runs `body`, returning its exception's message ("" when it succeeded).
template <typename F>
std::string capture(F&& body) {
  try {
    body();
    return "";
  } catch (const std::exception& e) {
    const std::string m = error_message(e);
    return m.empty() ? "unknown error" : m;
  }
}

}  // namespace

std::vector<std::string> all_gather_strings(Communicator* world, const std::string& mine) {
  if (world == nullptr || world->size() == 1) return {mine};
  const int n = world->size();
  Tensor len = Tensor::from_vector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor lens = Tensor::empty({n}, DType::kI64);
  auto r = world->all_gather(len, lens);
  r->wait(world->timeout(), "gathering string sizes");
  const std::vector<int64_t> sizes = lens.to_vector<int64_t>();
  const int64_t longest = *std::max_element(sizes.begin(), sizes.end());
  Tensor bytes = Tensor::zeros({std::max<int64_t>(longest, 1)}, DType::kU8);
  std::copy(mine.begin(), mine.end(), bytes.data<uint8_t>());
  Tensor all = Tensor::empty({n * bytes.numel()}, DType::kU8);
  r = world->all_gather(bytes, all);
  r->wait(world->timeout(), "gathering strings");
  std::vector<std::string> out;
  const uint8_t* p = all.data<uint8_t>();
  for (int i = 0; i < n; ++i) {
    out.emplace_back(reinterpret_cast<const char*>(p + i * bytes.numel()),
                     static_cast<size_t>(sizes[i]));
  }
  return out;
}

void agree_or_throw(Communicator* world, const std::string& error, const std::string& what) {
  const std::vector<std::string> errors = all_gather_strings(world, error);
  std::string message;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    if (!message.empty()) message += "; ";
    if (errors.size() > 1) message += "rank " + std::to_string(r) + ": ";
    message += errors[r];
  }
  if (!message.empty()) throw graph::CheckpointError(what + ": " + message);
}

SavedCheckpoint save_checkpoint(Communicator* world, const std::string& root, int64_t step,
                                int keep_last, const proto::CheckpointManifest& manifest,
                                const graph::ParamStore& store,
                                const std::vector<std::string>& slots, bool writes) {
  const auto start = std::chrono::steady_clock::now();
  const int rank = world != nullptr ? world->rank() : 0;
  const std::string what = "writing the checkpoint of step " + std::to_string(step) + " in " + root;
  std::string tmp = root + "/" + graph::checkpoint_name(step) + ".tmp";
  agree_or_throw(
      world, rank == 0 ? capture([&] { tmp = graph::begin_checkpoint(root, step); }) : "", what);

  // Each writer's records travel as a partial manifest; an error as "E" + message.
  std::string mine = "O";
  const std::string error = capture([&] {
    if (!writes) return;
    const graph::StoreTensors written = graph::write_store_tensors(store, slots, tmp);
    proto::CheckpointManifest part;
    for (const auto& t : written.tensors) *part.add_tensor() = t;
    for (const auto& f : written.files) *part.add_file() = f;
    mine += part.SerializeAsString();
  });
  if (!error.empty()) mine = "E" + error;
  const std::vector<std::string> parts = all_gather_strings(world, mine);
  std::string errors;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].empty() || parts[r][0] != 'E') continue;
    errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " +
              parts[r].substr(1);
  }
  if (!errors.empty()) throw graph::CheckpointError(what + ": " + errors);

  SavedCheckpoint saved;
  saved.path = root + "/" + graph::checkpoint_name(step);
  std::string commit_error;
  if (rank == 0) {
    commit_error = capture([&] {
      proto::CheckpointManifest full = manifest;
      full.set_format_version(graph::kCheckpointFormatVersion);
      full.set_step(step);
      full.clear_tensor();
      full.clear_file();
      for (const std::string& p : parts) {
        proto::CheckpointManifest part;
        STRATA_CHECK(part.ParseFromArray(p.data() + 1, static_cast<int>(p.size() - 1)))
            << "a rank's tensor records do not parse";
        for (const auto& t : part.tensor()) *full.add_tensor() = t;
        for (const auto& f : part.file()) {
          saved.bytes += f.bytes();
          *full.add_file() = f;
        }
      }
      graph::write_manifest(tmp, full);
      saved.path = graph::commit_checkpoint(root, step);
      saved.pruned = graph::prune_checkpoints(root, keep_last);
    });
  }
  agree_or_throw(world, commit_error, what);
  saved.seconds = seconds_since(start);
  return saved;
}

std::optional<graph::CheckpointRef> choose_checkpoint(Communicator* world,
                                                      const std::string& resume,
                                                      const std::string& root) {
  const int rank = world != nullptr ? world->rank() : 0;
  std::optional<graph::CheckpointRef> ref;
  const std::string error = rank != 0 ? "" : capture([&] {
    if (resume == "auto") {
      STRATA_CHECK(!root.empty()) << "--resume auto needs --checkpoint-dir";
      ref = graph::find_latest_checkpoint(root);
    } else {
      ref = graph::resolve_checkpoint(resume);
    }
  });
  agree_or_throw(world, error, "choosing the checkpoint to resume from");
  // Rank 0's answer: "" (none) or "<step> <path>".
  const std::string answer = rank == 0 && ref ? std::to_string(ref->step) + " " + ref->path : "";
  const std::string got = all_gather_strings(world, answer)[0];
  if (got.empty()) return std::nullopt;
  const size_t space = got.find(' ');
  return graph::CheckpointRef{got.substr(space + 1), std::stoll(got.substr(0, space))};
}

proto::CheckpointManifest load_checkpoint(Communicator* world, const std::string& path,
                                          const graph::Model& model, graph::ParamStore& store,
                                          const std::vector<std::string>& slots,
                                          const CheckpointVet& vet) {
  const int rank = world != nullptr ? world->rank() : 0;
  proto::CheckpointManifest manifest;
  std::unique_ptr<graph::StoreLoad> loaded;
  const std::string error = capture([&] {
    manifest = graph::read_manifest(path);
    std::vector<std::string> all_slots = slots;
    if (vet) {
      for (std::string& s : vet(manifest)) all_slots.push_back(std::move(s));
    }
    if (rank == 0) {
      const std::vector<std::string> unknown = graph::unknown_layers(manifest, model);
      if (!unknown.empty()) {
        std::string names;
        for (const std::string& n : unknown) names += (names.empty() ? "" : ", ") + n;
        throw graph::CheckpointError("checkpoint " + path + " has tensors of layers the model " +
                                     model.name() + " does not have: " + names +
                                     " (a checkpoint of another model)");
      }
    }
    loaded = std::make_unique<graph::StoreLoad>(path, manifest, store, all_slots);
  });
  agree_or_throw(world, error, "loading the checkpoint " + path);
  loaded->apply(store);
  return manifest;
}

}  // namespace strata::parallel
