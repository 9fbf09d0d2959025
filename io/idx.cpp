// IDX reading and writing.
//
// A file is read whole into memory (MNIST's largest file is 47 MB uncompressed), inflated with
// zlib when it starts with the gzip magic 1f 8b (concatenated gzip members are accepted, as gunzip
// does), then the header is checked field by field so that an error can say at which offset of
// the uncompressed stream what was expected and what was found. The elements are moved, not
// copied, out of the decompressed buffer and byte-swapped in place on little-endian hosts.
#include "io/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>

namespace strata::io {
namespace {

constexpr bool kHostIsLittleEndian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

std::string hex_byte(uint8_t b) {
  static const char kDigits[] = "0123456789ABCDEF";
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 15];
}

bool is_known_type(uint8_t code) {
  switch (code) {
    case 0x08:
    case 0x09:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x0E:
      return true;
    default:
      return false;
  }
}

// Reverses the bytes of each element (big-endian <-> little-endian), in place.
void swap_elements(uint8_t* data, size_t nbytes, size_t element_size) {
  if (element_size == 1) return;
  for (size_t i = 0; i + element_size <= nbytes; i += element_size) {
    std::reverse(data + i, data + i + element_size);
  }
}

uint32_t read_be32(const uint8_t* p) {
  return (static_cast<uint32_t>(p[0]) << 24) | (static_cast<uint32_t>(p[1]) << 16) |
         (static_cast<uint32_t>(p[2]) << 8) | static_cast<uint32_t>(p[3]);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "idx: cannot open '" << path << "': " << std::strerror(err);
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  for (;;) {
    const size_t n = std::fread(chunk, 1, sizeof(chunk), f);
    bytes.insert(bytes.end(), chunk, chunk + n);
    if (n < sizeof(chunk)) break;
  }
  if (std::ferror(f)) {
    const int err = errno;
    STRATA_THROW() << "idx: error reading '" << path << "' at byte " << bytes.size() << ": "
                   << std::strerror(err);
  }
  return bytes;
}

// Inflates a gzip file (one or more members) held in memory.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& path) {
  z_stream zs{};
  STRATA_CHECK_EQ(inflateInit2(&zs, 15 + 16), Z_OK) << "idx: zlib inflateInit2 failed";
  std::unique_ptr<z_stream, int (*)(z_stream*)> ender(&zs, &inflateEnd);

  // The gzip trailer holds the uncompressed size modulo 2^32: a good first guess for the buffer,
  // capped by deflate's best ratio (about 1032:1) so a damaged trailer cannot ask for too much.
  std::vector<uint8_t> out;
  size_t guess = 1 << 20;
  if (in.size() >= 18) {
    const uint8_t* t = in.data() + in.size() - 4;
    const size_t isize = static_cast<size_t>(t[0]) | (static_cast<size_t>(t[1]) << 8) |
                         (static_cast<size_t>(t[2]) << 16) | (static_cast<size_t>(t[3]) << 24);
    guess = std::max(guess, std::min(isize + 1, in.size() * 1032));
  }
  out.resize(guess);

  constexpr size_t kMaxChunk = size_t{1} << 30;  // z_stream counts in 32-bit uInt
  size_t in_pos = 0;
  size_t out_pos = 0;
  for (;;) {
    if (out_pos == out.size()) out.resize(out.size() * 2);
    const size_t in_avail = std::min(in.size() - in_pos, kMaxChunk);
    const size_t out_avail = std::min(out.size() - out_pos, kMaxChunk);
    zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
    zs.avail_in = static_cast<uInt>(in_avail);
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(out_avail);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_avail - zs.avail_in;
    out_pos += out_avail - zs.avail_out;
    if (rc == Z_STREAM_END) {
      if (in_pos == in.size()) break;
      if (in.size() - in_pos >= 2 && in[in_pos] == 0x1f && in[in_pos + 1] == 0x8b) {
        inflateReset(&zs);  // another gzip member follows
        continue;
      }
      STRATA_THROW() << "idx: " << path << ": trailing garbage after the gzip stream: expected "
                     << "the file to end at compressed byte " << in_pos << ", found "
                     << (in.size() - in_pos) << " more bytes";
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && in_pos < in.size()) continue;  // needed more output space
    if (rc == Z_BUF_ERROR) {
      STRATA_THROW() << "idx: " << path << ": truncated gzip stream: expected more compressed "
                     << "data, file ends at compressed byte " << in.size()
                     << " (uncompressed offset " << out_pos << "); re-download the file";
    }
    STRATA_THROW() << "idx: " << path << ": corrupt gzip stream at compressed byte " << in_pos
                   << " (uncompressed offset " << out_pos
                   << "): " << (zs.msg != nullptr ? zs.msg : "zlib error " + std::to_string(rc))
                   << "; re-download the file";
  }
  out.resize(out_pos);
  return out;
}

struct IdxHeader {
  std::vector<int64_t> dims;
  IdxType type = IdxType::kU8;
  size_t header_bytes = 0;
  size_t data_bytes = 0;
};

// Checks the header and the total size of an uncompressed IDX stream.
IdxHeader parse_header(const uint8_t* bytes, size_t size, const std::string& name,
                       bool compressed) {
  std::ostringstream where_s;
  where_s << "idx: " << name << ": ";
  const std::string where = where_s.str();
  const char* stream = compressed ? " of the uncompressed stream" : "";
  if (size < 4) {
    STRATA_THROW() << where << "truncated header: expected a 4-byte magic at offset 0" << stream
                   << ", file ends at offset " << size;
  }
  if (bytes[0] != 0 || bytes[1] != 0) {
    STRATA_THROW() << where << "bad magic at offset 0" << stream
                   << ": expected two zero bytes, found " << hex_byte(bytes[0]) << " "
                   << hex_byte(bytes[1]) << " (not an IDX file?)";
  }
  if (!is_known_type(bytes[2])) {
    STRATA_THROW() << where << "bad magic at offset 2" << stream
                   << ": expected a type code 0x08 (u8), 0x09 (i8), 0x0B (i16), 0x0C (i32), "
                   << "0x0D (f32) or 0x0E (f64), found " << hex_byte(bytes[2]);
  }
  if (bytes[3] == 0) {
    STRATA_THROW() << where << "bad magic at offset 3" << stream
                   << ": expected a dimension count of at least 1, found 0";
  }
  IdxHeader header;
  header.type = static_cast<IdxType>(bytes[2]);
  const size_t ndim = bytes[3];
  header.header_bytes = 4 + 4 * ndim;
  if (size < header.header_bytes) {
    STRATA_THROW() << where << "truncated header: expected " << ndim
                   << " big-endian u32 sizes at offsets 4.." << header.header_bytes << stream
                   << ", file ends at offset " << size;
  }
  const size_t element = idx_type_size(header.type);
  size_t data_bytes = element;
  bool overflow = false;
  for (size_t d = 0; d < ndim; ++d) {
    const uint32_t n = read_be32(bytes + 4 + 4 * d);
    header.dims.push_back(n);
    // int64 bounds, not size_t ones: numel() multiplies the sizes as int64_t, in this order, so a
    // product past 2^63 must be refused even when a later size of 0 makes the total 0.
    constexpr auto kMax = static_cast<size_t>(std::numeric_limits<int64_t>::max());
    if (n != 0 && data_bytes > kMax / n) overflow = true;
    data_bytes *= n;
  }
  if (overflow) {
    std::string dims;
    for (int64_t n : header.dims) dims += (dims.empty() ? "" : ", ") + std::to_string(n);
    STRATA_THROW() << where << "sizes (" << dims << ") at offset 4" << stream
                   << " describe more bytes than any file holds";
  }
  header.data_bytes = data_bytes;
  const size_t end = header.header_bytes + data_bytes;
  if (size < end) {
    STRATA_THROW() << where << "truncated data: expected " << data_bytes
                   << " data bytes after the header at offset " << header.header_bytes << stream
                   << ", file ends at offset " << size;
  }
  if (size > end) {
    STRATA_THROW() << where << "trailing garbage: expected the file to end at offset " << end
                   << stream << " (header and " << data_bytes << " data bytes), found "
                   << (size - end) << " more bytes";
  }
  return header;
}

}  // namespace

size_t idx_type_size(IdxType type) {
  switch (type) {
    case IdxType::kU8:
    case IdxType::kI8:
      return 1;
    case IdxType::kI16:
      return 2;
    case IdxType::kI32:
    case IdxType::kF32:
      return 4;
    case IdxType::kF64:
      return 8;
  }
  STRATA_THROW() << "idx: unknown type code " << static_cast<int>(type);
}

const char* idx_type_name(IdxType type) {
  switch (type) {
    case IdxType::kU8:
      return "u8";
    case IdxType::kI8:
      return "i8";
    case IdxType::kI16:
      return "i16";
    case IdxType::kI32:
      return "i32";
    case IdxType::kF32:
      return "f32";
    case IdxType::kF64:
      return "f64";
  }
  return "unknown";
}

int64_t IdxArray::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

IdxArray parse_idx(const uint8_t* bytes, size_t size, const std::string& name) {
  const IdxHeader header = parse_header(bytes, size, name, /*compressed=*/false);
  IdxArray array;
  array.dims = header.dims;
  array.type = header.type;
  array.data.assign(bytes + header.header_bytes, bytes + size);
  if (kHostIsLittleEndian) {
    swap_elements(array.data.data(), array.data.size(), idx_type_size(array.type));
  }
  return array;
}

IdxArray read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_file(path);
  const bool compressed = bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
  if (compressed) bytes = gunzip(bytes, path);
  const IdxHeader header = parse_header(bytes.data(), bytes.size(), path, compressed);
  IdxArray array;
  array.dims = header.dims;
  array.type = header.type;
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(header.header_bytes));
  array.data = std::move(bytes);
  if (kHostIsLittleEndian) {
    swap_elements(array.data.data(), array.data.size(), idx_type_size(array.type));
  }
  return array;
}

std::vector<uint8_t> encode_idx(const IdxArray& array) {
  STRATA_CHECK(!array.dims.empty() && array.dims.size() <= 255)
      << "idx: an array needs 1 to 255 dimensions, got " << array.dims.size();
  STRATA_CHECK(is_known_type(static_cast<uint8_t>(array.type)))
      << "idx: unknown type code " << static_cast<int>(array.type);
  for (int64_t d : array.dims) {
    STRATA_CHECK(d >= 0 && d <= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()))
        << "idx: size " << d << " does not fit a u32";
  }
  const size_t element = idx_type_size(array.type);
  STRATA_CHECK_EQ(array.data.size(), static_cast<size_t>(array.numel()) * element)
      << "idx: the data does not match the dims";
  std::vector<uint8_t> out;
  out.reserve(array.header_bytes() + array.data.size());
  out.push_back(0);
  out.push_back(0);
  out.push_back(static_cast<uint8_t>(array.type));
  out.push_back(static_cast<uint8_t>(array.dims.size()));
  for (int64_t d : array.dims) {
    const uint32_t n = static_cast<uint32_t>(d);
    out.push_back(static_cast<uint8_t>(n >> 24));
    out.push_back(static_cast<uint8_t>(n >> 16));
    out.push_back(static_cast<uint8_t>(n >> 8));
    out.push_back(static_cast<uint8_t>(n));
  }
  const size_t header = out.size();
  out.insert(out.end(), array.data.begin(), array.data.end());
  if (kHostIsLittleEndian) swap_elements(out.data() + header, out.size() - header, element);
  return out;
}

void write_idx(const std::string& path, const IdxArray& array, bool gzip) {
  std::vector<uint8_t> bytes = encode_idx(array);
  if (gzip) {
    z_stream zs{};
    STRATA_CHECK_EQ(
        deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK)
        << "idx: zlib deflateInit2 failed";
    std::unique_ptr<z_stream, int (*)(z_stream*)> ender(&zs, &deflateEnd);
    STRATA_CHECK(bytes.size() < (size_t{1} << 31)) << "idx: " << path << ": too large to gzip";
    std::vector<uint8_t> packed(deflateBound(&zs, bytes.size()));
    zs.next_in = bytes.data();
    zs.avail_in = static_cast<uInt>(bytes.size());
    zs.next_out = packed.data();
    zs.avail_out = static_cast<uInt>(packed.size());
    const int rc = deflate(&zs, Z_FINISH);
    STRATA_CHECK_EQ(rc, Z_STREAM_END) << "idx: " << path << ": gzip compression failed";
    packed.resize(zs.total_out);
    bytes = std::move(packed);
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    const int err = errno;
    STRATA_THROW() << "idx: cannot create '" << path << "': " << std::strerror(err);
  }
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  const int write_err = errno;
  const bool closed = std::fclose(f) == 0;
  if (written != bytes.size() || !closed) {
    STRATA_THROW() << "idx: error writing '" << path << "' (" << written << " of " << bytes.size()
                   << " bytes written): " << std::strerror(write_err);
  }
}

}  // namespace strata::io
