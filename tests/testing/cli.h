// Running the `strata` binary from a test: its exit status and its stdout and stderr together.
// The test target defines STRATA_CLI_PATH (the binary's path, from $<TARGET_FILE:strata_cli>).
#pragma once

#include <sys/wait.h>

#include <unistd.h>
#include <cstdio>
#include <filesystem>

#include <string>

#include <gtest/gtest.h>

namespace strata::testing {

struct CliResult {
  int status;
  std::string output;  // stdout and stderr together
};

// Runs `strata ARGS` through the shell and waits for it (status -1 when it did not exit).
inline CliResult run_cli(const std::string& args) {
  const std::string cmd = std::string(STRATA_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

#ifdef STRATA_MPIEXEC
// The launcher of `ranks` MPI ranks on this machine (the test target defines STRATA_MPIEXEC):
// root allowed (containers), shared memory, ranks that yield while they wait. In a sanitized
// build the ranks unwind allocations with the slow unwinder, as ctest's mpirun tests do
// (tests/CMakeLists.txt): the fast one stops in Open MPI's unloaded plugins ("<unknown module>"),
// where the suppressions of Open MPI's libraries cannot match; the leak checks stay on.
inline std::string mpirun(int ranks) {
  std::string env =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
      "OMPI_MCA_mpi_yield_when_idle=1 ";
#if defined(__SANITIZE_ADDRESS__)
  env += "ASAN_OPTIONS=fast_unwind_on_malloc=0:detect_stack_use_after_return=1 ";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  env += "ASAN_OPTIONS=fast_unwind_on_malloc=0:detect_stack_use_after_return=1 ";
#endif
#endif
  return env + STRATA_MPIEXEC + " --oversubscribe -np " + std::to_string(ranks);
}
#endif

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// An empty directory NAME under the test's temporary directory (removed first if it exists).
inline std::string fresh_temp_dir(const std::string& name) {
  // One per process: the same test may run twice at once (ctest -j with a repeat, or by hand).
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace strata::testing
