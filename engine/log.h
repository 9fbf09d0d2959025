// Rank- and stage-prefixed logging to stderr.
//
//   STRATA_LOG(INFO) << "resolved layout: " << layout;
//
// Every line starts with "[rank R stage S]" once a rank is known (set_log_rank) and the calling
// thread has a stage (set_log_stage; stages of the local backend are threads), so interleaved
// output of several ranks can be told apart and grepped. Levels below the threshold
// (STRATA_LOG_LEVEL=debug|info|warn|error, default info) are dropped.
#pragma once

#include <sstream>
#include <string>

namespace strata {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// The rank of this process, or -1 when unknown (single process). Written once at start-up.
void set_log_rank(int rank);
// The rank the calling thread works for, over the process's (ranks of the local backend are
// threads of one process; -1: none). Returns the thread's previous setting, to restore with
// set_thread_log_rank(previous) (-2: none, the process's rank shows).
int set_thread_log_rank(int rank);
// The calling thread's rank if it has one, else the process's.
int log_rank();
// The pipeline stage the calling thread works for, or -1.
void set_log_stage(int stage);
int log_stage();

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses debug|info|warn|error; throws strata::Error naming the valid values otherwise.
LogLevel parse_log_level(const std::string& text);

// "[rank 1 stage 0] " or "" when neither is set.
std::string log_prefix();

namespace detail {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace detail
}  // namespace strata

#define STRATA_LOG_LEVEL_DEBUG ::strata::LogLevel::kDebug
#define STRATA_LOG_LEVEL_INFO ::strata::LogLevel::kInfo
#define STRATA_LOG_LEVEL_WARN ::strata::LogLevel::kWarn
#define STRATA_LOG_LEVEL_ERROR ::strata::LogLevel::kError

#define STRATA_LOG(level)                                 \
  if (STRATA_LOG_LEVEL_##level < ::strata::log_level()) { \
  } else                                                  \
    ::strata::detail::LogLine(STRATA_LOG_LEVEL_##level, __FILE__, __LINE__)
