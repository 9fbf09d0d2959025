// SignalScope: the handlers of `strata train`'s signals (tools/train_signals.h).
#include "tools/train_signals.h"

#include <unistd.h>

#include <csignal>

namespace strata::tools {
namespace {

parallel::RunControl* g_control = nullptr;

void write_stderr(const char* text) {
  size_t n = 0;
  while (text[n] != '\0') ++n;
  ssize_t ignored = ::write(STDERR_FILENO, text, n);
  (void)ignored;
}

extern "C" void on_signal(int sig) {
  if (g_control == nullptr) return;
  if (sig == SIGHUP || sig == SIGUSR2) {
    g_control->save.fetch_add(1);
    write_stderr(sig == SIGHUP ? "strata: SIGHUP: a checkpoint at the end of this step\n"
                               : "strata: SIGUSR2: a checkpoint at the end of this step\n");
    return;
  }
  g_control->stop.fetch_add(1);
  std::signal(sig, SIG_DFL);  // a second one stops at once
  write_stderr(sig == SIGTERM ? "strata: SIGTERM: checkpoint at the end of this step, then stop "
                                "(send it again to stop at once)\n"
               : sig == SIGINT
                   ? "strata: SIGINT: checkpoint at the end of this step, then stop "
                     "(press Ctrl-C again to stop at once)\n"
                   : "strata: SIGUSR1: checkpoint at the end of this step, then stop\n");
}

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};

}  // namespace

SignalScope::SignalScope(parallel::RunControl* control) : active_(control != nullptr) {
  if (!active_) return;
  g_control = control;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kSignals) sigaction(sig, &sa, nullptr);
}

SignalScope::~SignalScope() {
  if (!active_) return;
  for (int sig : kSignals) std::signal(sig, SIG_DFL);
  g_control = nullptr;
}

}  // namespace strata::tools
