// An independent reader of TensorBoard event files, for tests: it shares no code with the writer
// (io/tensorboard.cpp uses engine/crc32c and the protobuf classes generated from
// io/proto/tensorboard.proto). Here the CRC-32C is computed bit by bit from the polynomial and
// the Event/Summary messages are decoded from the protobuf wire format by hand, with the field
// numbers TensorFlow publishes (event.proto: wall_time 1, step 2, file_version 3, summary 5;
// summary.proto: Summary.value 1, Value.tag 1, Value.simple_value 2).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace strata::testing {

inline uint32_t bitwise_crc32c(const uint8_t* p, size_t n) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int b = 0; b < 8; ++b) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

inline uint32_t tfrecord_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

struct EventScalar {
  std::string tag;
  float value = 0;
};

struct ReadEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<EventScalar> scalars;
};

struct EventFile {
  std::vector<ReadEvent> events;
  std::string error;  // the first framing, checksum or decoding problem; empty if none
  int records = 0;    // records whose both checksums matched
};

namespace event_file_detail {

inline bool varint(const std::string& s, size_t* pos, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && *pos < s.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(s[(*pos)++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;
}

// Calls `field(number, wire_type, varint_value, bytes)` for every field of `s`; false on a
// malformed message.
template <typename F>
bool fields(const std::string& s, F&& field) {
  size_t pos = 0;
  while (pos < s.size()) {
    uint64_t key = 0;
    if (!varint(s, &pos, &key)) return false;
    const int number = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
    uint64_t v = 0;
    std::string bytes;
    if (type == 0) {
      if (!varint(s, &pos, &v)) return false;
    } else if (type == 1 || type == 5) {
      const size_t n = type == 1 ? 8 : 4;
      if (pos + n > s.size()) return false;
      bytes = s.substr(pos, n);
      pos += n;
    } else if (type == 2) {
      if (!varint(s, &pos, &v) || pos + v > s.size()) return false;
      bytes = s.substr(pos, v);
      pos += v;
    } else {
      return false;
    }
    if (!field(number, type, v, bytes)) return false;
  }
  return true;
}

}  // namespace event_file_detail

inline EventFile read_event_file(const std::string& path) {
  namespace d = event_file_detail;
  EventFile out;
  std::ifstream in(path, std::ios::binary);
  const std::string data{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  size_t pos = 0;
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(data[at + i]);
    return v;
  };
  while (pos < data.size()) {
    if (pos + 12 > data.size()) {
      out.error = "truncated header at byte " + std::to_string(pos);
      return out;
    }
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(data[pos + i]);
    const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
    if (u32(pos + 8) != tfrecord_mask(bitwise_crc32c(bytes + pos, 8))) {
      out.error = "length checksum mismatch at byte " + std::to_string(pos);
      return out;
    }
    if (pos + 12 + length + 4 > data.size()) {
      out.error = "truncated record at byte " + std::to_string(pos);
      return out;
    }
    const std::string payload = data.substr(pos + 12, length);
    if (u32(pos + 12 + length) !=
        tfrecord_mask(bitwise_crc32c(bytes + pos + 12, static_cast<size_t>(length)))) {
      out.error = "data checksum mismatch in the record at byte " + std::to_string(pos);
      return out;
    }
    ++out.records;
    pos += 12 + length + 4;
    ReadEvent e;
    const bool ok = d::fields(payload, [&](int n, int t, uint64_t v, const std::string& b) {
      if (n == 1 && t == 1) std::memcpy(&e.wall_time, b.data(), 8);
      if (n == 2 && t == 0) e.step = static_cast<int64_t>(v);
      if (n == 3 && t == 2) e.file_version = b;
      if (n == 5 && t == 2) {  // Summary
        return d::fields(b, [&](int sn, int st, uint64_t, const std::string& sb) {
          if (sn != 1 || st != 2) return true;
          EventScalar s;
          const bool value_ok = d::fields(sb, [&](int vn, int vt, uint64_t, const std::string& vb) {
            if (vn == 1 && vt == 2) s.tag = vb;
            if (vn == 2 && vt == 5) std::memcpy(&s.value, vb.data(), 4);
            return true;
          });
          e.scalars.push_back(s);
          return value_ok;
        });
      }
      return true;
    });
    if (!ok) {
      out.error = "undecodable Event in record " + std::to_string(out.records);
      return out;
    }
    out.events.push_back(e);
  }
  return out;
}

}  // namespace strata::testing
