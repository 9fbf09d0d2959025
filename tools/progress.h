// Console reporting for `strata train`: a live progress line on a terminal, and one greppable
// line per logged step and per evaluation (also when output goes to a file or a pipe).
//
//   step 50/1876 | epoch 1/2 | loss 0.6123 | lr 1.00e-03 | grad_norm 1.234 | 2345 samples/s | ...
//   eval test | step 938 | epoch 1 | loss 0.3012 | accuracy 89.12% | top5 99.80% | ...
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "io/metrics.h"
#include "parallel/trainer.h"

namespace strata::tools {

// The --metrics records of a logged step ({"type":"train",...}, with the loss scale and the
// replicas' sync counters when the run has them) and of an evaluation ({"type":"eval",...}).
nlohmann::json train_record(const parallel::StepRecord& r);
nlohmann::json eval_record(const parallel::EvalRecord& r);

std::string format_duration(double seconds);  // "1:23", "1:02:03"

// {"type":"memory_plan","step":STEP,"stage":S,...} per stage (--memory-policy auto: the plan at
// the start, step 0, and after each move, the step before which the layers moved).
void write_memory_plan(io::JsonlWriter* metrics, int64_t step,
                       const std::vector<parallel::StageMemoryPlanRecord>& stages);

class ConsoleReporter final : public parallel::TrainObserver {
 public:
  // `metrics` may be disabled (no file). `epochs` is for display only (0: by steps).
  ConsoleReporter(std::FILE* out, io::JsonlWriter* metrics, int64_t epochs, bool live);
  void on_step(const parallel::StepRecord& r) override;
  void on_log(const parallel::StepRecord& r) override;
  void on_eval(const parallel::EvalRecord& r) override;
  void on_migration(const parallel::MigrationRecord& r) override;
  void on_repartition(const parallel::RepartitionRecord& r) override;
  void on_monitor(const parallel::dynpipe::MonitorSample& m) override;

 private:
  void clear_live_line();

  std::FILE* out_;
  io::JsonlWriter* metrics_;
  int64_t epochs_;
  bool live_;
  bool live_line_shown_ = false;
  double last_draw_ = -1.0;
};

}  // namespace strata::tools
