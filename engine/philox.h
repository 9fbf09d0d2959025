// Philox4x32-10, the counter-based generator of Salmon et al. (SC'11, "Parallel random numbers:
// as easy as 1, 2, 3"). A random value is a pure function of (key, counter), so any element of
// any stream can be computed directly, in any order, on the CPU or in a CUDA kernel, with the
// same result. Strata keys its streams by meaning rather than by position:
//
//   dropout mask of element e of global sample n in layer l at step t, with seed s:
//     key = philox_key(s, l), counter = {e / 4, 0, n, t}, lane e % 4
//
// so splitting a batch into micro-batches or data-parallel groups never changes a mask.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define STRATA_HOST_DEVICE __host__ __device__
#else
#define STRATA_HOST_DEVICE
#endif

namespace strata {

struct PhiloxCounter {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

STRATA_HOST_DEVICE inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Ten rounds of Philox4x32 (the Random123 reference constants).
STRATA_HOST_DEVICE inline PhiloxCounter philox4x32_10(PhiloxCounter ctr, PhiloxKey key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key.v[0] += kW0;
      key.v[1] += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, ctr.v[0], &hi0, &lo0);
    philox_mulhilo(kM1, ctr.v[2], &hi1, &lo1);
    ctr = PhiloxCounter{{hi1 ^ ctr.v[1] ^ key.v[0], lo1, hi0 ^ ctr.v[3] ^ key.v[1], lo0}};
  }
  return ctr;
}

// Uniform in [0, 1) with 24 random bits: exactly representable in f32, identical everywhere.
STRATA_HOST_DEVICE inline float philox_uniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Mixes a 64-bit seed with a stream id (a layer index, a hash of a parameter name) into a key.
STRATA_HOST_DEVICE inline PhiloxKey philox_key(uint64_t seed, uint64_t stream) {
  // splitmix64 of the stream id, so neighbouring ids give unrelated keys.
  uint64_t z = stream + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const uint64_t k = seed ^ z;
  return PhiloxKey{{static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)}};
}

// 64-bit FNV-1a of a name: a stable stream id for "blocks.3.attn.weight" whatever rank builds it.
uint64_t stable_hash(const std::string& text);

// A sequential stream over one key: values 0, 1, 2, ... of counter {i/4 (64 bit), sub (64 bit)}.
// Used for parameter initialization and data shuffling on the host. The state (key, subsequence,
// offset) is plain data and can be checkpointed.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t stream, uint64_t subsequence = 0);

  uint32_t next_u32();
  float next_uniform();  // [0, 1)
  float next_normal();   // standard normal (Box-Muller on two uniforms)
  // Uniform integer in [0, n) without modulo bias (n > 0).
  uint64_t next_below(uint64_t n);

  uint64_t offset() const { return offset_; }  // values consumed so far
  void set_offset(uint64_t offset);

 private:
  PhiloxKey key_;
  uint64_t subsequence_;
  uint64_t offset_ = 0;
  PhiloxCounter block_{};
  uint64_t block_index_ = ~0ull;
};

}  // namespace strata
