#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "engine/philox.h"

namespace strata {
namespace {

// Known-answer vectors of Philox4x32-10 from Random123's kat_vectors.
TEST(Philox, KnownAnswers) {
  PhiloxCounter r = philox4x32_10(PhiloxCounter{{0, 0, 0, 0}}, PhiloxKey{{0, 0}});
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
  r = philox4x32_10(PhiloxCounter{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                    PhiloxKey{{0xffffffffu, 0xffffffffu}});
  EXPECT_EQ(r.v[0], 0x408f276du);
  EXPECT_EQ(r.v[1], 0x41c83b0eu);
  EXPECT_EQ(r.v[2], 0xa20bc7c6u);
  EXPECT_EQ(r.v[3], 0x6d5451fdu);
  r = philox4x32_10(PhiloxCounter{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                    PhiloxKey{{0xa4093822u, 0x299f31d0u}});
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdcceb);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Philox, StreamIsAFunctionOfItsOffset) {
  PhiloxStream a(42, 7);
  std::vector<uint32_t> first;
  for (int i = 0; i < 10; ++i) first.push_back(a.next_u32());
  PhiloxStream b(42, 7);
  b.set_offset(5);
  for (int i = 5; i < 10; ++i) EXPECT_EQ(b.next_u32(), first[i]);
  PhiloxStream other(42, 8);
  EXPECT_NE(other.next_u32(), first[0]);
}

TEST(Philox, UniformAndNormalMoments) {
  PhiloxStream s(1, 2);
  double sum = 0, sum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const float u = s.next_uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  sum = 0;
  for (int i = 0; i < n; ++i) {
    const double z = s.next_normal();
    sum += z;
    sum2 += z * z;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0, 0.02);
}

TEST(Philox, BoundedIntegersCoverTheRange) {
  PhiloxStream s(3, 4);
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t x = s.next_below(10);
    ASSERT_LT(x, 10u);
    seen.insert(x);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Philox, StableHashIsFnv1a) {
  EXPECT_EQ(stable_hash(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(stable_hash("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_NE(stable_hash("blocks.0.attn"), stable_hash("blocks.1.attn"));
}

}  // namespace
}  // namespace strata
