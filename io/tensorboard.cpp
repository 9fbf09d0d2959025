// TensorBoard event files (see the header): the Event message serialized by the protobuf code
// generated from io/proto/tensorboard.proto, framed as TFRecords with masked CRC-32C.
#include "io/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "engine/check.h"
#include "engine/crc32c.h"
#include "io/proto/tensorboard.pb.h"

namespace strata::io {
namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  STRATA_CHECK(!ec) << "--tensorboard " << dir << ": cannot create the directory: " << ec.message();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(unix_seconds())) +
          "." + host + "." + std::to_string(getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  STRATA_CHECK(file_ != nullptr) << "--tensorboard " << dir << ": cannot create the event file "
                                 << path_ << ": " << std::strerror(errno);
  tensorboard::Event version;
  version.set_wall_time(unix_seconds());
  version.set_file_version("brain.Event:2");
  write_record(version.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(const std::vector<std::pair<std::string, double>>& scalars,
                                    int64_t step) {
  if (scalars.empty()) return;
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = event.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write_record(event.SerializeAsString());
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string header;
  put_le(&header, data.size(), 8);
  const uint32_t length_crc = masked_crc32c(header.data(), 8);
  put_le(&header, length_crc, 4);
  std::string footer;
  put_le(&footer, masked_crc32c(data.data(), data.size()), 4);
  const bool ok = std::fwrite(header.data(), 1, header.size(), file_) == header.size() &&
                  std::fwrite(data.data(), 1, data.size(), file_) == data.size() &&
                  std::fwrite(footer.data(), 1, footer.size(), file_) == footer.size() &&
                  std::fflush(file_) == 0;
  STRATA_CHECK(ok) << "cannot write the TensorBoard event file " << path_ << ": "
                   << std::strerror(errno);
}

}  // namespace strata::io
