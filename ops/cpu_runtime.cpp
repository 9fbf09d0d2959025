#include "ops/cpu_runtime.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace strata::ops::cpu_runtime {
namespace {

constexpr char kMarker[] = "STRATA_CPU_RUNTIME";

bool tuned_by_us() {
  const char* marker = std::getenv(kMarker);
  return marker != nullptr && std::strcmp(marker, "tuned") == 0;
}

}  // namespace

void tune_process_environment(char** argv) {
  if (std::getenv(kMarker) != nullptr) return;  // "keep", or already "tuned"
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv(kMarker, "tuned", 1);
  execv("/proc/self/exe", argv);
  std::fprintf(stderr,
               "warning: could not re-execute %s with OMP_WAIT_POLICY=passive (%s): idle OpenMP "
               "threads spin, which slows training on a shared machine (set OMP_WAIT_POLICY "
               "yourself, or %s=keep)\n",
               argv[0], std::strerror(errno), kMarker);
}

std::string describe() {
  const char* core = openblas_get_corename();
  std::string s = std::string("OpenBLAS ") + (core != nullptr ? core : "?") + " kernels";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) s += " (OPENBLAS_CORETYPE)";
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (wait != nullptr) {
    s += std::string(", OMP_WAIT_POLICY=") + wait + (tuned_by_us() ? " (set by strata)" : "");
  } else if (spin != nullptr) {
    s += std::string(", GOMP_SPINCOUNT=") + spin;
  } else {
    s += ", idle OpenMP threads spin (OMP_WAIT_POLICY unset)";
  }
  return s;
}

}  // namespace strata::ops::cpu_runtime
