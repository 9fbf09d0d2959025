// TensorBoard event files: scalars that `tensorboard --logdir DIR` plots, written by Strata's own
// code (no TensorFlow): Event messages (io/proto/tensorboard.proto, TensorFlow's field numbers)
// in TFRecord framing, each record
//
//   uint64 length (little endian) | uint32 masked_crc32c(length) | data | uint32
//   masked_crc32c(data)
//
// where masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 for c = CRC-32C of x. The file is
// DIR/events.out.tfevents.<unix seconds>.<host>.<pid>, the name TensorBoard looks for; its first
// event carries file_version "brain.Event:2". Every event is flushed when written, so a run that
// dies keeps what it had logged, and TensorBoard shows a run while it trains.
//
//   io::TensorBoardWriter tb("runs/tb");
//   tb.add_scalar("train/loss", 3.21, step);
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace strata::io {

// The record framing's checksum of `size` bytes at `data`.
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it. Errors name the directory.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  const std::string& path() const { return path_; }
  // One event at `step` holding every (tag, value) as a simple_value scalar.
  void add_scalars(const std::vector<std::pair<std::string, double>>& scalars, int64_t step);
  void add_scalar(const std::string& tag, double value, int64_t step) {
    add_scalars({{tag, value}}, step);
  }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace strata::io
