// Errors and checks.
//
// Every failure in Strata becomes a strata::Error in two parts: message(), a sentence about what
// the caller gave (naming the flag, file, tensor or rank, prefixed by the rank in a world of
// several), and where(), the engine's file:line, the failing expression and its operands. what()
// holds both. The CLI prints message() and shows where() only with --log-level debug: a user
// reads about their input, a bug report still gets the location. STRATA_CHECK is never compiled
// out.
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

// The one exception type of the library. `what()` is message() followed by " [at " where() "]"
// when there is a location, ready to print.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, const std::string& where = "")
      : std::runtime_error(where.empty() ? message : message + " [at " + where + "]"),
        message_(message),
        where_(where) {}
  // The sentence for whoever gave the input ("[rank 1] --lr must be >= 0, got -1").
  const std::string& message() const { return message_; }
  // Where the engine raised it ("trainer.cpp:167: check failed: lr >= 0 (-1 >= 0)"); empty for
  // errors made from a message alone.
  const std::string& where() const { return where_; }

 private:
  std::string message_, where_;
};

// An allocation past a device's limit (or one the system refused).
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& message, const std::string& where = "")
      : Error(message, where) {}
};

// The sentence of any exception: message() of a strata::Error, else what(). Code that wraps an
// error in context uses it (and error_where) so that the location does not end up in the
// sentence.
std::string error_message(const std::exception& e);
std::string error_where(const std::exception& e);

namespace detail {

// Collects the message of a failed check; `Thrower & message` throws it.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* expression);
  // The operands of a comparison check, "(3 >= 4)": part of where(), not of the sentence.
  CheckMessage& operands(const std::string& text) {
    operands_ = text;
    return *this;
  }
  template <typename T>
  CheckMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  std::string message() const;  // the rank prefix and the text streamed in
  std::string where() const;    // file:line: check failed: expression (operands)

 private:
  const char* file_;
  int line_;
  const char* expression_;
  std::string operands_;
  std::ostringstream stream_;
};

struct Thrower {
  // Lower precedence than <<, so the whole message is built first.
  [[noreturn]] void operator&(const CheckMessage& message) const;
};

template <typename A, typename B>
std::string format_operands(const char* op, const A& a, const B& b) {
  std::ostringstream s;
  s << "(" << a << " " << op << " " << b << ")";
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
            .operands(::strata::detail::format_operands(#op, (a), (b)))

#define STRATA_CHECK_EQ(a, b) STRATA_CHECK_OP_(a, b, ==)
#define STRATA_CHECK_NE(a, b) STRATA_CHECK_OP_(a, b, !=)
#define STRATA_CHECK_LT(a, b) STRATA_CHECK_OP_(a, b, <)
#define STRATA_CHECK_LE(a, b) STRATA_CHECK_OP_(a, b, <=)
#define STRATA_CHECK_GT(a, b) STRATA_CHECK_OP_(a, b, >)
#define STRATA_CHECK_GE(a, b) STRATA_CHECK_OP_(a, b, >=)

// Unconditional failure with a message: STRATA_THROW() << "why";
#define STRATA_THROW() \
  ::strata::detail::Thrower() & ::strata::detail::CheckMessage(__FILE__, __LINE__, nullptr)
