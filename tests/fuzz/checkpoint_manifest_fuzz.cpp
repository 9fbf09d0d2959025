// Checkpoint manifests (graph/checkpoint.h): check_checkpoint() on a directory holding the input.
//
// Input: [manifest][tensor file], split at the first "STRATATN" (the tensor file's magic), which
// is written as tensors/t.bin (the name the seeds' manifests list). A manifest part that starts
// with "STRATAMF" is written as is; otherwise it is the protobuf payload and gets a valid frame
// (magic, version, CRC-32C, length), and the tensor header's CRC is made valid too, so that the
// search reaches the checks behind the checksums instead of stopping at them.
//
// Property: an accepted manifest's tensors lie inside their files (no offset + bytes overflow)
// and have shapes of non-negative sizes whose byte count fits.
#include <cstring>

#include "engine/check.h"
#include "engine/crc32c.h"
#include "fuzz/fuzz_util.h"
#include "graph/checkpoint.h"

namespace {

template <typename T>
void put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string_view input = fuzz::as_text(data, size);
  const size_t split = std::min(input.find("STRATATN"), input.size());
  const std::string_view manifest = input.substr(0, split);
  std::string tensors(input.substr(split));

  std::string file;
  if (manifest.substr(0, 8) == "STRATAMF") {
    file = std::string(manifest);
  } else {
    file = "STRATAMF";
    put<uint32_t>(&file, graph::kCheckpointFormatVersion);
    put<uint32_t>(&file, crc32c(manifest.data(), manifest.size()));
    put<uint64_t>(&file, manifest.size());
    file += manifest;
  }
  if (tensors.size() >= 32) {
    const uint32_t crc = crc32c(tensors.data(), 28);
    std::memcpy(tensors.data() + 28, &crc, 4);
  }
  const fuzz::ScratchDir& dir = fuzz::scratch();
  dir.clear();
  dir.write("manifest.pb", file);
  if (!tensors.empty()) dir.write("tensors/t.bin", tensors);

  try {
    const proto::CheckpointManifest m = graph::check_checkpoint(dir.path());
    std::map<std::string, uint64_t> files;
    for (const proto::CheckpointFile& f : m.file()) files[f.file()] = f.bytes();
    for (const proto::CheckpointTensor& t : m.tensor()) {
      FUZZ_CHECK(files.count(t.file()) == 1);
      const uint64_t file_bytes = files[t.file()];
      FUZZ_CHECK(t.offset() <= file_bytes && t.bytes() <= file_bytes - t.offset());
      for (int64_t d : t.shape()) FUZZ_CHECK(d >= 0);
    }
  } catch (const Error&) {
  }
  return 0;
}
