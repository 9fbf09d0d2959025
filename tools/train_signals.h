// `strata train`'s signals, with --checkpoint-dir: SIGTERM (preemption) and SIGINT (Ctrl-C) ask
// for a checkpoint at the end of the current step, then a clean stop (exit status 0); a second one
// stops at once (the default action). SIGHUP asks for a checkpoint and training goes on. Open
// MPI's mpirun ends the job on SIGTERM/SIGINT instead of forwarding them, but forwards SIGUSR1 and
// SIGUSR2 to every rank: SIGUSR1 acts as SIGTERM and SIGUSR2 as SIGHUP. The handler only bumps
// lock-free counters and write(2)s a line, both async-signal-safe; the trainer polls the counters
// at step boundaries and the ranks agree on them.
#pragma once

#include "parallel/trainer.h"

namespace strata::tools {

// Installs the handlers for the lifetime of a run (none when `control` is null) and removes them
// after.
class SignalScope {
 public:
  explicit SignalScope(parallel::RunControl* control);
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  bool active_;
};

}  // namespace strata::tools
