// CRC-32C against published check values, the hardware path against the portable one, and
// extension over split buffers.
#include "engine/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/philox.h"

namespace strata {
namespace {

TEST(Crc32c, KnownValues) {
  // The CRC catalogue's check value, and RFC 3720 (iSCSI) B.4 test vectors.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c_extend_portable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  std::vector<uint8_t> ascending(32);
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
}

TEST(Crc32c, HardwareMatchesPortableAndExtends) {
  PhiloxStream rng(3, 4);
  std::vector<uint8_t> data(10007);
  for (auto& b : data) b = static_cast<uint8_t>(rng.next_uniform() * 256);
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 1000, 10007}) {
    EXPECT_EQ(crc32c(data.data(), n), crc32c_extend_portable(0, data.data(), n)) << n;
  }
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {1, 5, 4096, 10000}) {
    EXPECT_EQ(crc32c_extend(crc32c(data.data(), cut), data.data() + cut, data.size() - cut), whole);
  }
  data[5000] ^= 0x10;  // one bit
  EXPECT_NE(crc32c(data.data(), data.size()), whole);
}

}  // namespace
}  // namespace strata
