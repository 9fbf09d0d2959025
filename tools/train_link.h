// `strata train --link-mbps N`: the emulated link (the device's cost model, not a measured
// network; parallel/comm/shaped_comm.h) around this rank's world, and its report: per link
// between two ranks, the training and bulk (migration) messages, their queueing delays, and the
// steps during which the bulk traffic ran ("link" records of --metrics; DynPipe's Table III
// ablation, tools/bench/dynpipe_table3.py).
#pragma once

#include <memory>
#include <vector>

#include "io/metrics.h"
#include "parallel/comm/shaped_comm.h"
#include "parallel/trainer.h"
#include "tools/train_command.h"

namespace strata::tools {

class LinkSession : public parallel::TrainObserver {
 public:
  // Null without --link-mbps. Refuses runs it cannot shape (one rank, --comm nccl, --array).
  static std::unique_ptr<LinkSession> start(const TrainOptions& o, parallel::Communicator* world);

  // The shaped world the trainer uses.
  parallel::Communicator* world() { return shaped_.get(); }
  // The trainer's observer: forwards to `inner` (may be null) and notes when each step ends.
  parallel::TrainObserver* observe(parallel::TrainObserver* inner);
  // Before the training: the origin of the times reported.
  void mark() { zero_ = link_->now(); }
  // Collective over the world after the training: rank 0 prints every link and writes its
  // record to `metrics` (may be null).
  void report(io::JsonlWriter* metrics);

  void on_step(const parallel::StepRecord& r) override;
  void on_log(const parallel::StepRecord& r) override;
  void on_eval(const parallel::EvalRecord& r) override;
  void on_migration(const parallel::MigrationRecord& r) override;
  void on_repartition(const parallel::RepartitionRecord& r) override;
  void on_monitor(const parallel::dynpipe::MonitorSample& s) override;
  void on_rank_step(const parallel::RankStepRecord& r) override;

 private:
  LinkSession(parallel::Communicator* world, std::shared_ptr<parallel::ShapedLink> link);

  parallel::Communicator* world_;  // unshaped (the report's gather)
  std::shared_ptr<parallel::ShapedLink> link_;
  std::unique_ptr<parallel::ShapedCommunicator> shaped_;
  parallel::TrainObserver* inner_ = nullptr;
  double zero_ = 0.0;             // mark(), in the link's time
  std::vector<double> step_end_;  // seconds since mark(), by step - 1
};

}  // namespace strata::tools
