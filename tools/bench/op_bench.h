// CPU op benchmarks: conv2d and matmul, forward and backward, each beside a plain BLAS sgemm of
// the same matrix shape measured in the same run, so the ratio says how close the op comes to
// the BLAS it is built on.
#pragma once

#include <string>

namespace strata::tools {

struct OpBenchOptions {
  int threads = 0;           // 0: all cores
  double min_seconds = 0.3;  // per measurement
  std::string filter;        // run only cases whose name contains this
  std::string json;          // also write one JSON object per case to this file
};

int run_op_bench(const OpBenchOptions& options);

}  // namespace strata::tools
