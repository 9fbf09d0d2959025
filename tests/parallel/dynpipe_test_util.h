// Helpers the DynPipe tests share: an error's message, and a fresh temporary directory.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "engine/check.h"

namespace strata::parallel::dynpipe::testing {

// The message of the strata::Error `f` throws ("(no error)" when it throws none).
inline std::string throws_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

// An empty directory NAME under the test's temporary directory (one per process).
inline std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace strata::parallel::dynpipe::testing
