// Errors and checks.
//
// Every failure in Strata becomes a strata::Error whose message carries the rank, file:line, the
// failing expression and a human explanation. STRATA_CHECK is never compiled out.
//
//   STRATA_CHECK(x.dim() == 2) << "linear: input must be (N, K), got " << x.shape_str();
//   STRATA_CHECK_EQ(a.size(1), b.size(0)) << "matmul: inner dimensions differ";
//   STRATA_THROW() << "unknown dataset '" << name << "'";
//
// Checks throw rather than abort so that a caller (the CLI, a test, a user's program linking the
// static library) decides what a failure means; the CLI prints the message and, when the world
// has more than one rank, aborts all of them (see tools/). Code that runs on a thread the caller
// does not own (data-loader workers, communication threads) catches and forwards the Error to the
// thread that waits on it, so no exception ever crosses a thread.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace strata {

// The one exception type of the library. `what()` is the full message, ready to print.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An allocation past a device's limit (or one the system refused).
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& message) : Error(message) {}
};

namespace detail {

// Collects the message of a failed check; `Thrower & message` throws it.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* expression);
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  std::string str() const;

 private:
  const char* file_;
  int line_;
  const char* expression_;
  std::ostringstream stream_;
};

struct Thrower {
  // Lower precedence than <<, so the whole message is built first.
  [[noreturn]] void operator&(const CheckMessage& message) const;
};

template <typename A, typename B>
std::string format_operands(const char* op, const A& a, const B& b) {
  std::ostringstream s;
  s << "(" << a << " " << op << " " << b << ") ";
  return s.str();
}

}  // namespace detail
}  // namespace strata

#define STRATA_CHECK(cond) \
  if (cond) {              \
  } else                   \
    ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, #cond)

#define STRATA_CHECK_OP_(a, b, op)                                            \
  if ((a)op(b)) {                                                             \
  } else                                                                      \
    ::strata::detail::Thrower() &                                             \
        ::strata::detail::CheckMessage(__FILE__, __LINE__, #a " " #op " " #b) \
            << ::strata::detail::format_operands(#op, (a), (b))

#define STRATA_CHECK_EQ(a, b) STRATA_CHECK_OP_(a, b, ==)
#define STRATA_CHECK_NE(a, b) STRATA_CHECK_OP_(a, b, !=)
#define STRATA_CHECK_LT(a, b) STRATA_CHECK_OP_(a, b, <)
#define STRATA_CHECK_LE(a, b) STRATA_CHECK_OP_(a, b, <=)
#define STRATA_CHECK_GT(a, b) STRATA_CHECK_OP_(a, b, >)
#define STRATA_CHECK_GE(a, b) STRATA_CHECK_OP_(a, b, >=)

// Unconditional failure with a message: STRATA_THROW() << "why";
#define STRATA_THROW() \
  ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, nullptr)
