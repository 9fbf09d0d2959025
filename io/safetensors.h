// The safetensors format (Hugging Face, github.com/huggingface/safetensors), the weight files of
// the Hugging Face hub and of torchvision conversions:
//
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object, UTF-8, padded with spaces:
//               {"name": {"dtype": "F32", "shape": [3, 4], "data_offsets": [begin, end]}, ...,
//                "__metadata__": {"key": "value", ...}}        (optional, strings only)
//   the rest  the data buffer: tensor `name` is bytes [begin, end) of it, row-major, little-endian
//
// The reader checks the whole header before it reads a byte of the buffer, as the reference
// reader does: the header length fits the file (and 100 MB), the JSON is valid UTF-8 and an object
// without duplicate names, every entry has a known dtype, a shape of non-negative integers and
// offsets begin <= end with end - begin == numel x element size, and the ranges, sorted, tile the
// buffer exactly (no overlap, no gap, nothing after the last). Errors name the file, the tensor,
// what was expected and what was found.
//
// The writer sorts tensors by element size (largest first), then by name, so that with the
// header padded to a multiple of 8 bytes every tensor starts at a multiple of its element size
// (the reference writer's order), and writes through a temporary file renamed into place.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace strata::io {

// The reference reader's limit on the header length N.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100000000;

// Bytes per element of a format dtype ("F32", "BF16", "BOOL", "F8_E4M3", ...); 0 if unknown.
size_t safetensors_dtype_size(const std::string& name);
// The Strata dtype of a format dtype: F32, F64, F16, BF16, I32, I64, U8; nullopt for the others
// (BOOL, I8, I16, U16, U32, U64, F8_*), which a file may hold but Strata cannot load.
std::optional<DType> dtype_from_safetensors(const std::string& name);
// "F32", "F64", "F16", "BF16", "I32", "I64", "U8".
const char* safetensors_dtype_name(DType dtype);

// One entry of a header.
struct SafetensorsInfo {
  std::string name;
  std::string dtype;            // as in the file
  Shape shape;                  // () for a scalar
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
};

// A safetensors file opened for reading: the header is read and checked by the constructor (which
// throws strata::Error naming the file and the tensor on any inconsistency); tensors are read on
// demand. Not copyable; reading is thread-safe (pread).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // Every tensor, in the order of the data buffer.
  const std::vector<SafetensorsInfo>& tensors() const { return tensors_; }
  const SafetensorsInfo* find(const std::string& name) const;  // null if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }  // N

  // Tensor `name` as a new contiguous CPU tensor of its own dtype. Errors name the file and the
  // tensor: an absent name, a dtype Strata has no type for, a failed read.
  Tensor read(const std::string& name) const;

 private:
  void read_header();

  std::string path_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0, header_bytes_ = 0;
  std::vector<SafetensorsInfo> tensors_;
  std::map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (CPU tensors of any layout; names unique, non-empty, not "__metadata__") and
// `metadata` to `path` as described above. Errors name the file, and the tensor where one is at
// fault.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::io
