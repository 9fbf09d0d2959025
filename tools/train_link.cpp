// `strata train --link-mbps N`: the emulated link and its report (see the header).
#include "tools/train_link.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "parallel/checkpointing.h"

namespace strata::tools {
namespace {

// The step (counted from 1) during which time `t` fell: the first whose end is at or after it
// (-1: after the last step ended).
int64_t step_at(const std::vector<double>& ends, double t) {
  const auto it = std::lower_bound(ends.begin(), ends.end(), t);
  return it == ends.end() ? -1 : static_cast<int64_t>(it - ends.begin()) + 1;
}

}  // namespace

std::unique_ptr<LinkSession> LinkSession::start(const TrainOptions& o,
                                                parallel::Communicator* world) {
  if (o.link_mbps <= 0) return nullptr;
  STRATA_CHECK(world != nullptr && world->size() > 1)
      << "--link-mbps emulates the links between ranks; this run has one rank (launch with "
      << "mpirun -np N, or add --local with --stages 2 or more)";
  STRATA_CHECK(!world->stream_ordered())
      << "--link-mbps shapes host-side messages; --comm nccl moves them on the device (use "
      << "--comm mpi)";
  STRATA_CHECK(o.array.empty()) << "--link-mbps with --array is not available";
  auto link = std::make_shared<parallel::ShapedLink>(world->rank(), o.link_mbps * 1e6 / 8.0,
                                                     o.link_flow_control == "on");
  return std::unique_ptr<LinkSession>(new LinkSession(world, std::move(link)));
}

LinkSession::LinkSession(parallel::Communicator* world, std::shared_ptr<parallel::ShapedLink> link)
    : world_(world),
      link_(std::move(link)),
      shaped_(parallel::ShapedCommunicator::wrap_world(*world, link_)) {}

parallel::TrainObserver* LinkSession::observe(parallel::TrainObserver* inner) {
  inner_ = inner;
  return this;
}

void LinkSession::on_step(const parallel::StepRecord& r) {
  if (inner_ != nullptr) inner_->on_step(r);
}
void LinkSession::on_log(const parallel::StepRecord& r) {
  if (inner_ != nullptr) inner_->on_log(r);
}
void LinkSession::on_eval(const parallel::EvalRecord& r) {
  if (inner_ != nullptr) inner_->on_eval(r);
}
void LinkSession::on_migration(const parallel::MigrationRecord& r) {
  if (inner_ != nullptr) inner_->on_migration(r);
}
void LinkSession::on_repartition(const parallel::RepartitionRecord& r) {
  if (inner_ != nullptr) inner_->on_repartition(r);
}
void LinkSession::on_monitor(const parallel::dynpipe::MonitorSample& s) {
  if (inner_ != nullptr) inner_->on_monitor(s);
}
void LinkSession::on_rank_step(const parallel::RankStepRecord& r) {
  const double now = link_->now() - zero_;
  if (r.step >= 1) {
    step_end_.resize(static_cast<size_t>(r.step), now);
    step_end_[static_cast<size_t>(r.step) - 1] = now;
  }
  if (inner_ != nullptr) inner_->on_rank_step(r);
}

void LinkSession::report(io::JsonlWriter* metrics) {
  nlohmann::json mine = nlohmann::json::array();
  for (const parallel::LinkLaneReport& lane : link_->report()) {
    nlohmann::json r;
    r["type"] = "link";
    r["model"] = "emulated link (cost model, not a measured network)";
    r["from"] = lane.from;
    r["to"] = lane.to;
    r["mbps"] = link_->bytes_per_second() * 8.0 / 1e6;
    r["flow_control"] = link_->priority();
    r["training_messages"] = lane.training.messages;
    r["training_bytes"] = lane.training.bytes;
    r["training_wait_mean_ms"] =
        lane.training.messages > 0
            ? 1e3 * lane.training.wait_seconds / static_cast<double>(lane.training.messages)
            : 0.0;
    r["training_wait_max_ms"] = 1e3 * lane.training.max_wait_seconds;
    r["bulk_messages"] = lane.bulk.messages;
    r["bulk_bytes"] = lane.bulk.bytes;
    if (lane.bulk.messages > 0) {
      // The bulk traffic's span in steps: from the step its first byte left in to the step its
      // last byte arrived in (the target then holds the moved state), both counted from 1.
      const double start = lane.bulk.first_start - zero_, end = lane.bulk.last_finish - zero_;
      r["bulk_start_s"] = start;
      r["bulk_end_s"] = end;
      const int64_t first = step_at(step_end_, start);
      const int64_t last = step_at(step_end_, end);
      r["bulk_first_step"] = first;
      r["bulk_last_step"] = last;
      r["bulk_iterations"] = first > 0 && last > 0 ? last - first + 1 : -1;
    }
    r["step_end_s"] = step_end_;
    mine.push_back(r);
  }
  const std::vector<std::string> all = parallel::all_gather_strings(world_, mine.dump());
  if (world_->rank() != 0) return;
  for (const std::string& text : all) {
    for (const nlohmann::json& r : nlohmann::json::parse(text)) {
      std::printf(
          "emulated link %d->%d (%.1f Mbit/s, flow control %s; a cost model): training "
          "%lld messages, waits mean %.2f ms max %.2f ms",
          r["from"].get<int>(), r["to"].get<int>(), r["mbps"].get<double>(),
          r["flow_control"].get<bool>() ? "on" : "off",
          static_cast<long long>(r["training_messages"].get<int64_t>()),
          r["training_wait_mean_ms"].get<double>(), r["training_wait_max_ms"].get<double>());
      if (r.contains("bulk_iterations")) {
        std::printf("; bulk %.2f MiB from %.2f s to %.2f s, steps %lld-%lld (%lld iterations)",
                    r["bulk_bytes"].get<double>() / (1 << 20), r["bulk_start_s"].get<double>(),
                    r["bulk_end_s"].get<double>(),
                    static_cast<long long>(r["bulk_first_step"].get<int64_t>()),
                    static_cast<long long>(r["bulk_last_step"].get<int64_t>()),
                    static_cast<long long>(r["bulk_iterations"].get<int64_t>()));
      }
      std::printf("\n");
      if (metrics != nullptr) metrics->write(r);
    }
  }
  std::fflush(stdout);
}

}  // namespace strata::tools
