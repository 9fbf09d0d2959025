// STRATA_CUDA_CHECK(expr): on failure, a strata::Error naming the call, file:line and the CUDA
// runtime's message. Only for sources compiled with the CUDA toolkit.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/check.h"

#define STRATA_CUDA_CHECK(expr)                                                                   \
  do {                                                                                            \
    const cudaError_t strata_cuda_status_ = (expr);                                               \
    if (strata_cuda_status_ != cudaSuccess) {                                                     \
      ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, #expr)     \
                                        << "CUDA error " << static_cast<int>(strata_cuda_status_) \
                                        << " (" << cudaGetErrorName(strata_cuda_status_)          \
                                        << "): " << cudaGetErrorString(strata_cuda_status_);      \
    }                                                                                             \
  } while (0)
