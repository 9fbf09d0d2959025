// Metrics sinks: JSON Lines, one object per line, flushed as written so that a crash loses
// nothing already reported.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace strata::io {

class JsonlWriter {
 public:
  // Opens `path` for writing (truncating), creating missing parent directories. An empty path
  // makes a writer that drops everything. Errors name the path.
  explicit JsonlWriter(const std::string& path);
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace strata::io
