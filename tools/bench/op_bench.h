// CPU op benchmarks: conv2d and matmul, forward and backward. Each linear case runs beside a plain
// BLAS sgemm of the same matrix shape measured in the same run, so the ratio says how close the op
// comes to the BLAS it is built on; each convolution runs beside conv2d's im2col path (the path
// conv2d takes by shape may be Winograd, ops/conv2d_winograd_cpu.h).
#pragma once

#include <string>

#include "engine/device.h"

namespace strata::tools {

struct OpBenchOptions {
  int threads = 0;           // 0: all cores
  double min_seconds = 0.3;  // per measurement
  std::string filter;        // run only cases whose name contains this
  std::string json;          // also write one JSON object per case to this file
};

int run_op_bench(const OpBenchOptions& options);

// The hot ops of GPT-2 124M (B=8, T=1024, C=768, H=12, V=50257) and ResNet-50 (batch 64, 224 px)
// on `device` (cuda:N), timed with CUDA events on the context's stream, each against the roofline
// of the GPU (tools/bench/roofline.h); precision fp32, tf32, or bf16/fp16 (16-bit tensors, the
// mixed-precision cast and gradient moves; tools/bench/cuda_op_bench.cpp).
// Throws in a build without CUDA.
int run_cuda_op_bench(const OpBenchOptions& options, const Device& device,
                      const std::string& precision);

}  // namespace strata::tools
