#include "tools/progress.h"

#include <cmath>
#include <cstring>
#include <string>

namespace strata::tools {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

void write_memory_plan(io::JsonlWriter* metrics, int64_t step,
                       const std::vector<parallel::StageMemoryPlanRecord>& stages) {
  if (metrics == nullptr) return;
  for (const parallel::StageMemoryPlanRecord& r : stages) {
    metrics->write({{"type", "memory_plan"},
                    {"step", step},
                    {"stage", r.stage},
                    {"plan", r.plan},
                    {"predicted_peak_bytes", r.predicted_peak_bytes},
                    {"predicted_forward_s", r.predicted_forward_s},
                    {"predicted_backward_s", r.predicted_backward_s},
                    {"predicted_recompute_s", r.predicted_recompute_s},
                    {"predicted_exposed_swap_s", r.predicted_exposed_swap_s}});
  }
}

ConsoleReporter::ConsoleReporter(std::FILE* out, io::JsonlWriter* metrics, int64_t epochs,
                                 bool live)
    : out_(out), metrics_(metrics), epochs_(epochs), live_(live) {}

void ConsoleReporter::clear_live_line() {
  if (!live_line_shown_) return;
  std::fprintf(out_, "\r\033[2K");
  live_line_shown_ = false;
}

nlohmann::json train_record(const parallel::StepRecord& r) {
  nlohmann::json record = {{"type", "train"},
                           {"step", r.step},
                           {"epoch", r.epoch},
                           {"loss", r.loss},
                           {"lr", r.lr},
                           {"grad_norm", r.grad_norm},
                           {"samples_per_s", r.samples_per_s},
                           {"elapsed_s", r.elapsed_s},
                           {"skipped", r.skipped_steps}};
  if (r.loss_scale > 0) record["loss_scale"] = r.loss_scale;
  if (r.sync) {  // the epoch so far
    record["sync_groups"] = r.sync->groups;
    record["sync_mean_group"] = r.sync->mean_group();
    record["sync_enforcement_waits"] = r.sync->enforcement_waits;
    record["sync_skipped_validations"] = r.sync->skipped_validations;
    record["sync_staleness_waits"] = r.sync->staleness_waits;
  }
  return record;
}

nlohmann::json eval_record(const parallel::EvalRecord& r) {
  return {{"type", "eval"}, {"split", r.split},       {"step", r.step}, {"epoch", r.epoch},
          {"loss", r.loss}, {"accuracy", r.accuracy}, {"top5", r.top5}, {"samples", r.samples}};
}

void ConsoleReporter::on_step(const parallel::StepRecord& r) {
  if (!live_) return;
  // Redraw at most ~10 times a second.
  if (r.step != r.total_steps && r.elapsed_s - last_draw_ < 0.1) return;
  last_draw_ = r.elapsed_s;
  const int width = 24;
  const double frac = r.total_steps > 0 ? static_cast<double>(r.step) / r.total_steps : 0.0;
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(width - filled), '.');
  // No loss yet: with --sync other than allreduce the ranks agree on it only at log points.
  char loss[32] = "-";
  if (!std::isnan(r.loss)) std::snprintf(loss, sizeof(loss), "%.4f", r.loss);
  std::fprintf(out_, "\r\033[2K[%s] %3.0f%% step %lld/%lld | loss %s | %.0f samples/s | ETA %s",
               bar.c_str(), 100.0 * frac, static_cast<long long>(r.step),
               static_cast<long long>(r.total_steps), loss, r.samples_per_s,
               format_duration(r.eta_s).c_str());
  std::fflush(out_);
  live_line_shown_ = true;
}

void ConsoleReporter::on_log(const parallel::StepRecord& r) {
  clear_live_line();
  char epoch[48];
  if (epochs_ > 0) {
    std::snprintf(epoch, sizeof(epoch), "%lld/%lld", static_cast<long long>(r.epoch + 1),
                  static_cast<long long>(epochs_));
  } else {
    std::snprintf(epoch, sizeof(epoch), "%lld", static_cast<long long>(r.epoch + 1));
  }
  char extra[96] = "";  // skipped steps, loss scale
  if (r.skipped_steps > 0) {
    std::snprintf(extra, sizeof(extra), " | skipped %lld", static_cast<long long>(r.skipped_steps));
  }
  if (r.loss_scale > 0) {
    const size_t used = std::strlen(extra);
    std::snprintf(extra + used, sizeof(extra) - used, " | loss scale %g", r.loss_scale);
  }
  std::string sync;  // --sync other than allreduce: this epoch's decisions so far
  if (r.sync) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  " | sync: mean group %.2f of %lld, waits %lld, skipped %lld, stale %lld",
                  r.sync->mean_group(), static_cast<long long>(r.sync->groups),
                  static_cast<long long>(r.sync->enforcement_waits),
                  static_cast<long long>(r.sync->skipped_validations),
                  static_cast<long long>(r.sync->staleness_waits));
    sync = text;
  }
  std::fprintf(out_,
               "step %lld/%lld | epoch %s | loss %.4f | lr %.2e | grad_norm %.3f | %.0f samples/s"
               " | elapsed %s | eta %s%s%s\n",
               static_cast<long long>(r.step), static_cast<long long>(r.total_steps), epoch, r.loss,
               r.lr, r.grad_norm, r.samples_per_s, format_duration(r.elapsed_s).c_str(),
               format_duration(r.eta_s).c_str(), extra, sync.c_str());
  std::fflush(out_);
  if (metrics_ != nullptr) metrics_->write(train_record(r));
}

void ConsoleReporter::on_eval(const parallel::EvalRecord& r) {
  clear_live_line();
  std::fprintf(out_,
               "eval %s | step %lld | epoch %lld | loss %.4f | accuracy %.2f%% | top5 %.2f%% | "
               "%lld samples | %.1fs\n",
               r.split.c_str(), static_cast<long long>(r.step), static_cast<long long>(r.epoch + 1),
               r.loss, 100.0 * r.accuracy, 100.0 * r.top5, static_cast<long long>(r.samples),
               r.seconds);
  std::fflush(out_);
  if (metrics_ != nullptr) metrics_->write(eval_record(r));
}

void ConsoleReporter::on_migration(const parallel::MigrationRecord& r) {
  clear_live_line();
  std::fprintf(out_, "migration | before step %lld | %s | %s | now %s | %.0f bytes | %.3fs\n",
               static_cast<long long>(r.step), parallel::migration_mode_name(r.mode),
               r.moves.c_str(), r.partition.c_str(), r.bytes, r.seconds);
  for (const parallel::StageMemoryPlanRecord& m : r.memory_plan) {
    std::fprintf(out_,
                 "memory plan | before step %lld | stage %d: %s | predicted peak %.0f bytes\n",
                 static_cast<long long>(r.step), m.stage, m.plan.c_str(), m.predicted_peak_bytes);
  }
  std::fflush(out_);
  if (metrics_ != nullptr) {
    metrics_->write({{"type", "migration"},
                     {"step", r.step},
                     {"mode", parallel::migration_mode_name(r.mode)},
                     {"moves", r.moves},
                     {"partition", r.partition},
                     {"bytes", r.bytes},
                     {"seconds", r.seconds},
                     {"pause_at", r.pause_at},
                     {"take_over", r.take_over},
                     {"resume", r.resume}});
    write_memory_plan(metrics_, r.step, r.memory_plan);
  }
}

void ConsoleReporter::on_repartition(const parallel::RepartitionRecord& r) {
  clear_live_line();
  const parallel::RepartitionDecision& d = r.decision;
  const std::string verdict =
      d.apply ? "apply after step " + std::to_string(r.apply_step) + ", " : "keep, ";
  std::fprintf(out_, "repartition | after step %lld | %s | %s -> %s | %s%s\n",
               static_cast<long long>(r.step), r.policy.c_str(), r.current.c_str(),
               r.proposed.c_str(), verdict.c_str(), d.reason.c_str());
  std::fflush(out_);
  if (metrics_ != nullptr) {
    // Candidates no memory plan fits: "PARTITION: why".
    std::vector<std::string> infeasible;
    for (const parallel::DroppedPartition& p : d.infeasible) {
      infeasible.push_back(p.name + ": " + p.why);
    }
    metrics_->write({{"type", "repartition"},
                     {"step", r.step},
                     {"policy", r.policy},
                     {"applied", d.apply},
                     {"apply_step", r.apply_step},
                     {"current", r.current},
                     {"proposed", r.proposed},
                     {"current_slowest_s", d.current_cost},
                     {"predicted_slowest_s", d.predicted_cost},
                     {"measured_slowest_s", d.measured_slowest},
                     {"predicted_gain", d.gain()},
                     {"layer_seconds", r.layer_seconds},
                     {"stage_busy_seconds", r.stage_busy_seconds},
                     {"reason", d.reason},
                     {"memory_plan", d.memory_plan},
                     {"infeasible", infeasible}});
  }
}

void ConsoleReporter::on_monitor(const parallel::dynpipe::MonitorSample& m) {
  if (metrics_ == nullptr) return;  // the monitor's samples go to --metrics only
  metrics_->write({{"type", "monitor"},
                   {"step", m.step},
                   {"rank", m.rank},
                   {"stage", m.stage},
                   {"group", m.group},
                   {"seq", m.seq},
                   {"seconds", m.seconds},
                   {"busy_seconds", m.busy_seconds},
                   {"steps", m.steps},
                   {"cpu_util_mean", m.counters.cpu_util_mean},
                   {"cpu_util_max", m.counters.cpu_util_max},
                   {"runq_per_core", m.counters.runq_per_core},
                   {"run_delay_per_cpu_s", m.counters.run_delay_per_cpu_s},
                   {"preempt_per_cpu_s", m.counters.preempt_per_cpu_s},
                   {"colocated_threads", m.counters.colocated_threads}});
}

}  // namespace strata::tools
