// Helpers of the libFuzzer targets (tests/fuzz/*_fuzz.cpp).
//
// Readers that take a path get the input through a file in a private scratch directory: one per
// process (libFuzzer's -jobs/-fork workers are processes), removed at exit. Expected rejections
// are strata::Error (every reader's documented failure); anything else (a sanitizer report, an
// uncaught exception of another type, a broken property checked with FUZZ_CHECK) is a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace strata::fuzz {

// A property of the reader that must hold: prints and aborts so that libFuzzer saves the input.
#define FUZZ_CHECK(cond)                                                                    \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::string(tmp && *tmp ? tmp : "/tmp") + "/strata-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  // Writes `bytes` to path()/`name` (creating its directory) and returns the full path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::filesystem::path p = std::filesystem::path(path_) / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    FUZZ_CHECK(out.good());
    return p.string();
  }
  // Removes everything inside path() (the inputs of the previous run).
  void clear() const {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(path_, ec))
      std::filesystem::remove_all(entry.path(), ec);
  }

 private:
  std::string path_;
};

// The one scratch directory of this process.
inline const ScratchDir& scratch() {
  static const ScratchDir dir;
  return dir;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

}  // namespace strata::fuzz
