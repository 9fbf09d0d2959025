// STRATA_NCCL_CHECK(expr): on failure, a strata::Error naming the call, file:line, NCCL's error
// string and its last error message. Only for sources built with NCCL.
#pragma once

#include <nccl.h>

#include "engine/check.h"

#define STRATA_NCCL_CHECK(expr)                                                                   \
  do {                                                                                            \
    const ncclResult_t strata_nccl_status_ = (expr);                                              \
    if (strata_nccl_status_ != ncclSuccess) {                                                     \
      ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, #expr)     \
                                        << "NCCL error " << static_cast<int>(strata_nccl_status_) \
                                        << " (" << ncclGetErrorString(strata_nccl_status_)        \
                                        << "): " << ncclGetLastError(nullptr);                    \
    }                                                                                             \
  } while (0)
