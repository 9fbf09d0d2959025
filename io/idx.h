// IDX files: the array format of MNIST and Fashion-MNIST (yann.lecun.com/exdb/mnist).
//
//   offset 0   0x00 0x00                    two zero bytes
//   offset 2   type code                    0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E
//   f64 offset 3   ndim                         1 or more offset 4   ndim big-endian u32 sizes then
//   the elements in C order, multi-byte types big-endian
//
// read_idx takes a raw file or a gzip-compressed one (told apart by the gzip magic bytes 1f 8b,
// never by the name) and returns the array with its elements in host byte order. Every error is a
// strata::Error naming the file, the byte offset in the uncompressed stream, what was expected
// there and what was found: a missing file, a bad magic, a truncated header or data, trailing
// bytes, a corrupt gzip stream.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/check.h"

namespace strata::io {

enum class IdxType : uint8_t {
  kU8 = 0x08,
  kI8 = 0x09,
  kI16 = 0x0B,
  kI32 = 0x0C,
  kF32 = 0x0D,
  kF64 = 0x0E,
};

size_t idx_type_size(IdxType type);       // bytes per element
const char* idx_type_name(IdxType type);  // "u8", "i8", "i16", "i32", "f32", "f64"

template <typename T>
struct IdxTypeOf;
template <>
struct IdxTypeOf<uint8_t> {
  static constexpr IdxType value = IdxType::kU8;
};
template <>
struct IdxTypeOf<int8_t> {
  static constexpr IdxType value = IdxType::kI8;
};
template <>
struct IdxTypeOf<int16_t> {
  static constexpr IdxType value = IdxType::kI16;
};
template <>
struct IdxTypeOf<int32_t> {
  static constexpr IdxType value = IdxType::kI32;
};
template <>
struct IdxTypeOf<float> {
  static constexpr IdxType value = IdxType::kF32;
};
template <>
struct IdxTypeOf<double> {
  static constexpr IdxType value = IdxType::kF64;
};

// An IDX array in memory: `data` holds numel() elements of `type`, C order, host byte order.
struct IdxArray {
  std::vector<int64_t> dims;
  IdxType type = IdxType::kU8;
  std::vector<uint8_t> data;

  int64_t numel() const;
  size_t header_bytes() const { return 4 + 4 * dims.size(); }

  // Element i as T, where T must be the C++ type of `type` (checked).
  template <typename T>
  T at(int64_t i) const {
    STRATA_CHECK(IdxTypeOf<T>::value == type)
        << "idx: reading " << idx_type_name(IdxTypeOf<T>::value) << " elements of a "
        << idx_type_name(type) << " array";
    STRATA_CHECK(i >= 0 && static_cast<size_t>(i + 1) * sizeof(T) <= data.size())
        << "idx: element " << i << " out of range (" << numel() << " elements)";
    T value;
    std::memcpy(&value, data.data() + static_cast<size_t>(i) * sizeof(T), sizeof(T));
    return value;
  }

  // An array of T holding `values` (their count must match the product of `dims`).
  template <typename T>
  static IdxArray from_values(std::vector<int64_t> dims, const std::vector<T>& values) {
    IdxArray array;
    array.dims = std::move(dims);
    array.type = IdxTypeOf<T>::value;
    STRATA_CHECK_EQ(static_cast<int64_t>(values.size()), array.numel())
        << "idx: the values do not fill the dims";
    array.data.resize(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(array.data.data(), values.data(), array.data.size());
    return array;
  }
};

// Reads an IDX file, raw or gzip-compressed.
IdxArray read_idx(const std::string& path);

// Parses the uncompressed bytes of an IDX file; `name` (a path) is what errors call it.
IdxArray parse_idx(const uint8_t* bytes, size_t size, const std::string& name);

// Writes `array` as an IDX file, gzip-compressed when `gzip` is true. Throws strata::Error naming
// the path when the file cannot be written.
void write_idx(const std::string& path, const IdxArray& array, bool gzip = false);

// The bytes of `array` as an uncompressed IDX file (big-endian header and elements).
std::vector<uint8_t> encode_idx(const IdxArray& array);

}  // namespace strata::io
