// Safetensors reading (pread, header checked whole before any data is read) and writing (through
// a temporary file). The checks follow the reference implementation's (safetensors/src/tensor.rs:
// header length bound, JSON object, per-entry byte counts, ranges tiling the buffer exactly), and
// add two of its own: the header must be valid UTF-8 (checked byte by byte, so the error can say
// where), and a name may appear once (a JSON parser keeps the last of duplicates silently, which
// would hide a second, lying entry). Numbers are read as unsigned 64-bit integers and every
// product is checked for overflow, so that no header can make a size wrap around.
//
// Byte order: the format is little-endian. The length prefix is decoded byte by byte; tensor bytes
// are copied as they are, which is right on the little-endian hosts Strata builds for.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/check.h"
#include "io/unicode.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

namespace strata::io {
namespace {

using nlohmann::json;

struct FormatDType {
  const char* name;
  size_t size;
};

// Every dtype of the format (safetensors/src/tensor.rs, enum Dtype).
constexpr FormatDType kFormatDTypes[] = {{"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1},
                                         {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
                                         {"BF16", 2},    {"I32", 4}, {"U32", 4}, {"F32", 4},
                                         {"F64", 8},     {"I64", 8}, {"U64", 8}, {"F8_E8M0", 1}};

std::string errno_str(int err) { return std::strerror(err); }

// Reads exactly `n` bytes at `offset`; false at end of file (errno 0) or on an error.
bool pread_all(int fd, void* out, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = 0;
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

// The byte offset (into `text`) of the first byte that is not well-formed UTF-8, or npos.
size_t first_invalid_utf8(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0;
  while (i < text.size()) {
    uint32_t cp = 0;
    const size_t len = unicode::decode_utf8(p + i, text.size() - i, &cp);
    if (cp == unicode::kInvalidCodePoint) return i;
    i += len;
  }
  return std::string::npos;
}

std::string hex_byte(unsigned char b) {
  static const char kDigits[] = "0123456789ABCDEF";
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 15];
}

// A non-negative integer of the header, or an error naming `what`.
uint64_t header_uint(const json& v, const std::string& where, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  STRATA_THROW() << where << ": " << what << " must be a non-negative integer, found " << v.dump();
}

SafetensorsInfo parse_entry(const std::string& name, const json& v, uint64_t buffer_bytes,
                            const std::string& where) {
  SafetensorsInfo info;
  info.name = name;
  STRATA_CHECK(v.is_object()) << where << ": expected an object with dtype, shape and "
                              << "data_offsets, found " << v.dump();
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    STRATA_CHECK(v.contains(key)) << where << ": no \"" << key << "\" in " << v.dump();
  }
  const json& dtype = v["dtype"];
  STRATA_CHECK(dtype.is_string()) << where << ": dtype must be a string, found " << dtype.dump();
  info.dtype = dtype.get<std::string>();
  const size_t element = safetensors_dtype_size(info.dtype);
  STRATA_CHECK(element > 0) << where << ": unknown dtype \"" << info.dtype
                            << "\" (the format's dtypes: BOOL, U8, I8, I16, U16, F16, BF16, I32, "
                               "U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2, F8_E8M0)";
  const json& shape = v["shape"];
  STRATA_CHECK(shape.is_array()) << where << ": shape must be an array, found " << shape.dump();
  uint64_t numel = 1;
  for (const json& d : shape) {
    const uint64_t n = header_uint(d, where, "every dimension of shape " + shape.dump());
    STRATA_CHECK(n <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) &&
                 !__builtin_mul_overflow(numel, n, &numel))
        << where << ": shape " << shape.dump() << " has more elements than 2^63";
    info.shape.push_back(static_cast<int64_t>(n));
  }
  const json& offsets = v["data_offsets"];
  STRATA_CHECK(offsets.is_array() && offsets.size() == 2)
      << where << ": data_offsets must be [begin, end], found " << offsets.dump();
  info.begin = header_uint(offsets[0], where, "data_offsets[0]");
  info.end = header_uint(offsets[1], where, "data_offsets[1]");
  STRATA_CHECK(info.begin <= info.end) << where << ": data_offsets [" << info.begin << ", "
                                       << info.end << "] are out of order (begin after end)";
  uint64_t bytes = 0;
  STRATA_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(element), &bytes))
      << where << ": shape " << shape.dump() << " of " << info.dtype << " overflows 2^64 bytes";
  STRATA_CHECK_EQ(info.end - info.begin, bytes)
      << where << ": data_offsets [" << info.begin << ", " << info.end << "] hold "
      << info.end - info.begin << " bytes, but shape " << shape.dump() << " of " << info.dtype
      << " needs " << numel << " x " << element << " = " << bytes << " bytes";
  STRATA_CHECK(info.end <= buffer_bytes)
      << where << ": data_offsets [" << info.begin << ", " << info.end
      << "] end beyond the data buffer of " << buffer_bytes << " bytes (truncated file?)";
  return info;
}

}  // namespace

size_t safetensors_dtype_size(const std::string& name) {
  for (const FormatDType& d : kFormatDTypes) {
    if (name == d.name) return d.size;
  }
  return 0;
}

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F64") return DType::kF64;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  return std::nullopt;
}

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
  }
  STRATA_THROW() << "safetensors: no format dtype for dtype " << static_cast<int>(dtype);
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    STRATA_THROW() << "safetensors: cannot open '" << path << "': " << errno_str(err);
  }
  // A constructor that throws runs no destructor: close the file on the way out.
  try {
    read_header();
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void SafetensorsReader::read_header() {
  const std::string file = "safetensors file " + path_;
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    STRATA_THROW() << file << ": cannot stat: " << errno_str(err);
  }
  file_bytes_ = static_cast<uint64_t>(st.st_size);
  STRATA_CHECK(file_bytes_ >= 8) << file << ": " << file_bytes_
                                 << " bytes, too short for the 8-byte header length that starts "
                                    "a safetensors file";
  unsigned char prefix[8];
  STRATA_CHECK(pread_all(fd_, prefix, sizeof(prefix), 0))
      << file << ": cannot read the header length: " << errno_str(errno);
  for (int i = 7; i >= 0; --i) header_bytes_ = (header_bytes_ << 8) | prefix[i];
  STRATA_CHECK(header_bytes_ <= file_bytes_ - 8)
      << file << ": the header length (bytes 0-7) is " << header_bytes_ << " bytes, beyond the "
      << file_bytes_ - 8 << " bytes that follow it (truncated, or not a safetensors file?)";
  STRATA_CHECK(header_bytes_ <= kSafetensorsMaxHeaderBytes)
      << file << ": the header length (bytes 0-7) is " << header_bytes_
      << " bytes, more than the format's limit of " << kSafetensorsMaxHeaderBytes;
  STRATA_CHECK(header_bytes_ >= 2) << file << ": the header length (bytes 0-7) is " << header_bytes_
                                   << ", too short for a JSON object";
  std::string header(header_bytes_, '\0');
  STRATA_CHECK(pread_all(fd_, header.data(), header.size(), 8))
      << file << ": cannot read the " << header_bytes_ << "-byte header: " << errno_str(errno);
  const size_t bad = first_invalid_utf8(header);
  STRATA_CHECK(bad == std::string::npos)
      << file << ": the header is not valid UTF-8: byte "
      << hex_byte(static_cast<unsigned char>(header[bad])) << " at file offset " << 8 + bad;

  // Names at depth 1 (tensor names and __metadata__), to catch duplicates the parser would merge.
  std::set<std::string> names;
  std::string duplicate;
  json doc;
  try {
    doc = json::parse(header, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!names.insert(key).second && duplicate.empty()) duplicate = key;
      }
      return true;
    });
  } catch (const json::exception& e) {
    STRATA_THROW() << file << ": the header is not valid JSON (header byte offsets count from "
                   << "file offset 8): " << e.what();
  }
  STRATA_CHECK(doc.is_object()) << file << ": the header must be a JSON object, found a "
                                << doc.type_name();
  STRATA_CHECK(duplicate.empty()) << file << ": tensor '" << duplicate
                                  << "' appears more than once in the header";

  const uint64_t buffer_bytes = file_bytes_ - 8 - header_bytes_;
  for (const auto& [name, value] : doc.items()) {
    if (name == "__metadata__") {
      STRATA_CHECK(value.is_object()) << file << ": __metadata__ must be an object of strings, "
                                      << "found " << value.dump();
      for (const auto& [key, text] : value.items()) {
        STRATA_CHECK(text.is_string()) << file << ": __metadata__ entry '" << key
                                       << "' must be a string, found " << text.dump();
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_entry(name, value, buffer_bytes, file + ": tensor '" + name + "'"));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const SafetensorsInfo& a, const SafetensorsInfo& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // Sorted ranges must tile [0, buffer_bytes): each starts where the previous one ended.
  uint64_t at = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsInfo& t = tensors_[i];
    if (t.begin < at) {
      STRATA_THROW() << file << ": tensor '" << t.name << "' bytes [" << t.begin << ", " << t.end
                     << ") overlap tensor '" << tensors_[i - 1].name << "' bytes ["
                     << tensors_[i - 1].begin << ", " << tensors_[i - 1].end << ")";
    }
    STRATA_CHECK(t.begin == at) << file << ": tensor '" << t.name << "' starts at buffer byte "
                                << t.begin << ", leaving a "
                                << "gap of " << t.begin - at << " bytes after "
                                << (i == 0 ? std::string("the start of the buffer")
                                           : "tensor '" + tensors_[i - 1].name + "'");
    at = t.end;
  }
  STRATA_CHECK_EQ(at, buffer_bytes)
      << file << ": the data buffer holds " << buffer_bytes << " bytes but the tensors cover " << at
      << " (trailing data after "
      << (tensors_.empty() ? std::string("the header") : "tensor '" + tensors_.back().name + "'")
      << ")";
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsInfo* SafetensorsReader::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const SafetensorsInfo* info = find(name);
  STRATA_CHECK(info != nullptr) << "safetensors file " << path_ << ": no tensor '" << name << "'";
  const std::optional<DType> dtype = dtype_from_safetensors(info->dtype);
  STRATA_CHECK(dtype.has_value())
      << "safetensors file " << path_ << ": tensor '" << name << "' has dtype " << info->dtype
      << ", which Strata cannot load (F32, F64, F16, BF16, I32, I64, U8)";
  Tensor t = Tensor::empty(info->shape, *dtype);
  const uint64_t offset = 8 + header_bytes_ + info->begin;
  if (t.nbytes() > 0 && !pread_all(fd_, t.raw_data(), t.nbytes(), offset)) {
    const int err = errno;
    STRATA_THROW() << "safetensors file " << path_ << ": cannot read tensor '" << name
                   << "' (bytes " << offset << " to " << offset + t.nbytes() << " of the file): "
                   << (err == 0 ? std::string("the file ended early (changed since it was opened?)")
                                : errno_str(err));
  }
  return t;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string file = "safetensors file " + path;
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    STRATA_CHECK(!name.empty()) << file << ": a tensor has an empty name";
    STRATA_CHECK(name != "__metadata__") << file << ": '__metadata__' cannot name a tensor";
    STRATA_CHECK(names.insert(name).second) << file << ": tensor '" << name << "' given twice";
    STRATA_CHECK(t.defined()) << file << ": tensor '" << name << "' is undefined";
    STRATA_CHECK(t.device().is_cpu()) << file << ": tensor '" << name << "' is on "
                                      << t.device().str() << "; copy it to the CPU first";
  }
  // Largest elements first, then by name: every tensor starts aligned to its element size.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const size_t ea = tensors[a].second.element_size(), eb = tensors[b].second.element_size();
    return ea != eb ? ea > eb : tensors[a].first < tensors[b].first;
  });
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (size_t i : order) {
    const Tensor& t = tensors[i].second;
    json shape = json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    header[tensors[i].first] = {{"dtype", safetensors_dtype_name(t.dtype())},
                                {"shape", shape},
                                {"data_offsets", {at, at + t.nbytes()}}};
    at += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    STRATA_THROW() << file
                   << ": cannot encode the header (names and metadata must be UTF-8): " << e.what();
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<unsigned char>(text.size() >> (8 * i));

  const std::string temp = path + ".tmp";
  FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << file << ": cannot create '" << temp << "': " << errno_str(err);
  }
  bool ok = std::fwrite(prefix, 1, 8, f) == 8 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::string failed_at = ok ? "" : "the header";
  for (size_t i : order) {
    if (!ok) break;
    const Tensor c = tensors[i].second.contiguous();
    ok = c.nbytes() == 0 || std::fwrite(c.raw_data(), 1, c.nbytes(), f) == c.nbytes();
    if (!ok) failed_at = "tensor '" + tensors[i].first + "'";
  }
  const int write_err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed) {
    std::remove(temp.c_str());
    STRATA_THROW() << file << ": writing " << (ok ? std::string("the file") : failed_at) << " to '"
                   << temp << "' failed: " << errno_str(ok ? errno : write_err);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(temp.c_str());
    STRATA_THROW() << file << ": cannot rename '" << temp << "' to '" << path
                   << "': " << errno_str(err);
  }
}

}  // namespace strata::io
