#include "io/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "engine/check.h"

namespace strata::io {

JsonlWriter::JsonlWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    STRATA_CHECK(!ec) << "cannot create directory '" << parent.string() << "' for metrics file '"
                      << path << "': " << ec.message();
  }
  file_ = std::fopen(path.c_str(), "w");
  STRATA_CHECK(file_ != nullptr) << "cannot open metrics file '" << path
                                 << "' for writing: " << std::strerror(errno);
}

JsonlWriter::~JsonlWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlWriter::write(const nlohmann::json& record) {
  if (file_ == nullptr) return;
  const std::string line = record.dump() + "\n";
  const size_t written = std::fwrite(line.data(), 1, line.size(), file_);
  STRATA_CHECK_EQ(written, line.size())
      << "short write to metrics file '" << path_ << "': " << std::strerror(errno);
  std::fflush(file_);
}

}  // namespace strata::io
