#include "engine/philox.h"

namespace strata {

uint64_t stable_hash(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

PhiloxStream::PhiloxStream(uint64_t seed, uint64_t stream, uint64_t subsequence)
    : key_(philox_key(seed, stream)), subsequence_(subsequence) {}

void PhiloxStream::set_offset(uint64_t offset) { offset_ = offset; }

uint32_t PhiloxStream::next_u32() {
  const uint64_t block = offset_ / 4;
  if (block != block_index_) {
    PhiloxCounter ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                       static_cast<uint32_t>(subsequence_),
                       static_cast<uint32_t>(subsequence_ >> 32)}};
    block_ = philox4x32_10(ctr, key_);
    block_index_ = block;
  }
  return block_.v[offset_++ % 4];
}

float PhiloxStream::next_uniform() { return philox_uniform(next_u32()); }

float PhiloxStream::next_normal() {
  // One normal per two uniforms (the sine half is dropped) so that the offset alone is the whole
  // state of the stream. u1 in (0, 1] so the log is finite.
  const double u1 = 1.0 - static_cast<double>(next_uniform());
  const double u2 = static_cast<double>(next_uniform());
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 6.283185307179586 * u2;
  return static_cast<float>(radius * std::cos(angle));
}

uint64_t PhiloxStream::next_below(uint64_t n) {
  // Rejection sampling on 64-bit draws (Lemire's threshold).
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = (static_cast<uint64_t>(next_u32()) << 32) | next_u32();
    if (x >= threshold) return x % n;
  }
}

}  // namespace strata
