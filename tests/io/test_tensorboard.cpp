// TensorBoard event files read back by an independent reader (tests/testing/event_file.h): every
// record's two checksums, the file version event, and every scalar's tag, value and step.
#include "io/tensorboard.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/check.h"
#include "engine/crc32c.h"
#include "testing/event_file.h"

namespace strata::io {
namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(TensorBoard, MaskedCrcMatchesTheBitwiseDefinition) {
  const std::string s = "123456789";
  EXPECT_EQ(testing::bitwise_crc32c(reinterpret_cast<const uint8_t*>(s.data()), s.size()),
            0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(masked_crc32c(s.data(), s.size()), testing::tfrecord_mask(0xE3069283u));
}

TEST(TensorBoard, EventsReadBackWithEveryChecksumAndValue) {
  const std::string dir = fresh_dir("strata_tb_events");
  std::string path;
  {
    TensorBoardWriter tb(dir + "/run");
    path = tb.path();
    tb.add_scalars({{"train/loss", 2.5}, {"train/lr", 1e-3}}, 10);
    tb.add_scalar("eval/accuracy", 0.875, 20);
    tb.add_scalar("train/loss", -1.0 / 3.0, 1LL << 40);
  }
  EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
  const testing::EventFile f = testing::read_event_file(path);
  ASSERT_EQ(f.error, "");
  ASSERT_EQ(f.records, 4);
  ASSERT_EQ(f.events.size(), 4u);
  EXPECT_EQ(f.events[0].file_version, "brain.Event:2");
  EXPECT_GT(f.events[0].wall_time, 1.6e9);
  ASSERT_EQ(f.events[1].scalars.size(), 2u);
  EXPECT_EQ(f.events[1].step, 10);
  EXPECT_EQ(f.events[1].scalars[0].tag, "train/loss");
  EXPECT_EQ(f.events[1].scalars[0].value, 2.5f);
  EXPECT_EQ(f.events[1].scalars[1].tag, "train/lr");
  EXPECT_EQ(f.events[1].scalars[1].value, 1e-3f);
  EXPECT_EQ(f.events[2].step, 20);
  EXPECT_EQ(f.events[2].scalars.at(0).value, 0.875f);
  EXPECT_EQ(f.events[3].step, 1LL << 40);
  EXPECT_EQ(f.events[3].scalars.at(0).value, static_cast<float>(-1.0 / 3.0));
  EXPECT_GE(f.events[3].wall_time, f.events[0].wall_time);

  // The reader notices a flipped byte: in a record's data, and in a length.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string bad = dir + "/bad";
  std::string flipped = bytes;
  flipped[bytes.size() - 6] ^= 0x01;  // inside the last record's data
  std::ofstream(bad, std::ios::binary) << flipped;
  EXPECT_NE(testing::read_event_file(bad).error.find("data checksum"), std::string::npos);
  flipped = bytes;
  flipped[0] ^= 0x01;  // the first record's length
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << flipped;
  EXPECT_NE(testing::read_event_file(bad).error.find("length checksum"), std::string::npos);
}

TEST(TensorBoard, UnwritableDirectoryNamesTheFlag) {
  const std::string dir = fresh_dir("strata_tb_file");
  std::ofstream(dir + "/f") << "x";
  try {
    TensorBoardWriter tb(dir + "/f/run");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("--tensorboard " + dir + "/f/run"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata::io
