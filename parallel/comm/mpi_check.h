// STRATA_MPI_CHECK(expr): on failure, a strata::Error naming the call, file:line and MPI's error
// string. MPI returns errors (instead of aborting) only on communicators whose error handler is
// MPI_ERRORS_RETURN; MpiSession sets it on MPI_COMM_WORLD, and communicators derived from it
// inherit it. Only for sources built with MPI.
#pragma once

#include <mpi.h>

#include <string>

#include "engine/check.h"

namespace strata::parallel::detail {

// "MPI_ERR_TRUNCATE: message truncated" style text for an MPI error code.
inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "unknown MPI error " + std::to_string(code);
  }
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace strata::parallel::detail

#define STRATA_MPI_CHECK(expr)                                                     \
  do {                                                                             \
    const int strata_mpi_status_ = (expr);                                         \
    if (strata_mpi_status_ != MPI_SUCCESS) {                                       \
      ::strata::detail::Thrower() &                                                \
          ::strata::detail::CheckMessage(__FILE__, __LINE__, #expr)                \
              << "MPI error " << strata_mpi_status_ << ": "                        \
              << ::strata::parallel::detail::mpi_error_string(strata_mpi_status_); \
    }                                                                              \
  } while (0)
