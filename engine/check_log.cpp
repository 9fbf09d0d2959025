// Check failures and log lines share the rank/stage prefix, so they live together.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "engine/check.h"
#include "engine/log.h"

namespace strata {
namespace {

std::atomic<int> g_rank{-1};
thread_local int t_stage = -1;
constexpr int kNoThreadRank = -2;
thread_local int t_rank = kNoThreadRank;

LogLevel initial_level() {
  const char* env = std::getenv("STRATA_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kInfo;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    std::fprintf(stderr, "warning: ignoring STRATA_LOG_LEVEL='%s' (debug|info|warn|error)\n", env);
    return LogLevel::kInfo;
  }
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

}  // namespace

void set_log_rank(int rank) { g_rank.store(rank); }
int log_rank() { return t_rank != kNoThreadRank ? t_rank : g_rank.load(); }
int set_thread_log_rank(int rank) {
  const int previous = t_rank;
  t_rank = rank;
  return previous;
}
void set_log_stage(int stage) { t_stage = stage; }
int log_stage() { return t_stage; }
void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_storage().load()); }

LogLevel parse_log_level(const std::string& text) {
  if (text == "debug") return LogLevel::kDebug;
  if (text == "info") return LogLevel::kInfo;
  if (text == "warn") return LogLevel::kWarn;
  if (text == "error") return LogLevel::kError;
  STRATA_THROW() << "unknown log level '" << text << "' (valid: debug, info, warn, error)";
}

std::string log_prefix() {
  const int rank = log_rank();
  const int stage = log_stage();
  if (rank < 0 && stage < 0) return "";
  std::string s = "[";
  if (rank >= 0) s += "rank " + std::to_string(rank);
  if (stage >= 0) s += std::string(rank >= 0 ? " " : "") + "stage " + std::to_string(stage);
  return s + "] ";
}

std::string error_message(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->message();
  return e.what();
}

std::string error_where(const std::exception& e) {
  if (const auto* error = dynamic_cast<const Error*>(&e)) return error->where();
  return "";
}

namespace detail {

CheckMessage::CheckMessage(const char* file, int line, const char* expression)
    : file_(file), line_(line), expression_(expression) {}

std::string CheckMessage::where() const {
  std::ostringstream s;
  s << basename_of(file_) << ":" << line_;
  if (expression_ != nullptr) s << ": check failed: " << expression_;
  if (!operands_.empty()) s << " " << operands_;
  return s.str();
}

std::string CheckMessage::message() const {
  const std::string text = stream_.str();
  // A check without a message is an internal one: its expression is all there is to say.
  if (text.empty()) return log_prefix() + "internal error: " + where();
  return log_prefix() + text;
}

void Thrower::operator&(const CheckMessage& message) const {
  throw Error(message.message(), message.where());
}

LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  static const char kLetters[] = {'D', 'I', 'W', 'E'};
  stream_ << log_prefix() << kLetters[static_cast<int>(level)] << " " << basename_of(file) << ":"
          << line << "] ";
}

LogLine::~LogLine() {
  stream_ << '\n';
  static std::mutex mutex;  // one line at a time from the stages' threads
  std::lock_guard<std::mutex> lock(mutex);
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  (void)level_;
}

}  // namespace detail
}  // namespace strata
