// pipeline_bench: the bubble of the pipeline schedules, measured against the ideal, and how much
// of the stage-to-stage transfers the executor hides behind compute.
//
//   pipeline_bench                                   # gpipe and 1f1b, S in {2, 4}, M in {4, 8}
//   pipeline_bench --schedules gpipe --stages 2,4,8 --micro-batches 4,8,16 --forward-ms 10
//
// The stages are balanced by construction: each holds one linear layer whose forward lasts
// --forward-ms and whose backward lasts twice that (the layer sleeps for what its small matrix
// product left), the ideal pipeline of parallel/schedule/schedule.h, so the numbers do not depend
// on the machine's cores. Ranks are threads (LocalWorld). For every schedule, S and M the
// trainer runs --steps steps with a Chrome trace, and the table gives
//   measured     TrainSummary::measured_bubble: idle time / (ranks x step makespan)
//   theoretical  (S - 1) / (M + S - 1)
//   overlap      from the trace: the fraction of the time transfers were in flight (posted, not
//                yet seen complete) that overlaps a Forward or Backward on the same rank. A
//                receive is posted a few instructions ahead, so its span also holds the time its
//                sender takes to produce the message: the fraction says how much of that the
//                rank spent computing rather than blocked in a RecvAct/RecvGrad.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "graph/layers.h"
#include "graph/model.h"
#include "io/synthetic.h"
#include "ops/matmul.h"
#include "parallel/comm/local_comm.h"
#include "parallel/trainer.h"
#include "tools/bench/timed_linear.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

using bench::TimedLinear;

constexpr int64_t kSide = 4, kClasses = 4;  // 1 x 4 x 4 synthetic images, 4 classes

struct Row {
  double measured = 0, theoretical = 0, overlap = 0;
};

// Transfer time overlapping Forward/Backward on the same rank over all transfer time.
double overlap_fraction(const std::string& trace_path) {
  std::ifstream in(trace_path);
  STRATA_CHECK(in) << "pipeline_bench: cannot read the trace " << trace_path;
  const nlohmann::json trace = nlohmann::json::parse(in);
  struct Span {
    double begin, end;
  };
  std::map<int, std::vector<Span>> compute, transfers;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const std::string name = e["name"];
    const double ts = e["ts"], dur = e["dur"];
    if (e["cat"] == "transfer") transfers[e["pid"].get<int>()].push_back({ts, ts + dur});
    if (name.rfind("Forward", 0) == 0 || name.rfind("Backward", 0) == 0) {
      compute[e["pid"].get<int>()].push_back({ts, ts + dur});
    }
  }
  double total = 0, hidden = 0;
  for (const auto& [rank, spans] : transfers) {
    for (const Span& t : spans) {
      total += t.end - t.begin;
      // The compute events of a rank do not overlap one another (one thread runs them).
      for (const Span& c : compute[rank]) {
        hidden += std::max(0.0, std::min(t.end, c.end) - std::max(t.begin, c.begin));
      }
    }
  }
  return total > 0 ? hidden / total : 0.0;
}

Row run(parallel::ScheduleKind kind, int S, int64_t M, int64_t steps, double forward_ms,
        const std::string& trace_path) {
  io::SyntheticImageOptions data_options;
  data_options.samples = 4096;
  data_options.channels = 1;
  data_options.height = data_options.width = kSide;
  data_options.num_classes = kClasses;
  auto data = std::make_shared<io::SyntheticImageDataset>(io::Split::kTrain, data_options);
  const auto forward = std::chrono::microseconds(static_cast<int64_t>(forward_ms * 1000.0));
  auto build = [S, forward] {
    auto model = std::make_unique<graph::Model>("timed", Shape{1, kSide, kSide});
    model->add(std::make_unique<graph::FlattenLayer>("flatten"));
    const int64_t features = kSide * kSide;
    for (int s = 0; s < S; ++s) {
      model->add(std::make_unique<TimedLinear>("fc" + std::to_string(s), features,
                                               s == S - 1 ? kClasses : features, forward));
    }
    return model;
  };
  parallel::TrainConfig config;
  config.steps = steps;
  config.batch_size = 4 * M;
  config.num_workers = 0;
  config.optimizer.kind = graph::OptimizerKind::kSgd;
  config.optimizer.schedule.base_lr = 0.01;
  parallel::PipelineConfig pipeline;
  pipeline.stages = S;
  pipeline.micro_batches = M;
  pipeline.schedule = kind;
  pipeline.partition.push_back({0, 2});  // flatten and the first timed layer
  for (int s = 1; s < S; ++s) pipeline.partition.push_back({s + 1, s + 2});
  pipeline.trace_path = trace_path;
  parallel::TrainSummary summary;
  parallel::LocalWorld world(S);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    ExecContext ctx(Device::cpu(), nullptr, 1);
    parallel::Trainer trainer(ctx, build, data, nullptr, config, pipeline, &comm, nullptr);
    const parallel::TrainSummary s = trainer.run();
    if (comm.rank() == 0) summary = s;
  });
  return {summary.measured_bubble, summary.theoretical_bubble, overlap_fraction(trace_path)};
}

int main_impl(int argc, char** argv) {
  CLI::App app{"Pipeline bubble and transfer overlap with balanced stages of a fixed duration"};
  app.option_defaults()->always_capture_default();
  std::vector<std::string> schedules{"gpipe", "1f1b"};
  std::vector<int> stages{2, 4};
  std::vector<int64_t> micro_batches{4, 8};
  int64_t steps = 4;
  double forward_ms = 5.0;
  std::string trace_dir = std::filesystem::temp_directory_path().string();
  app.add_option("--schedules", schedules, "Schedules: gpipe, 1f1b, async-1f1b")->delimiter(',');
  app.add_option("--stages", stages, "Stage counts S")->delimiter(',');
  app.add_option("--micro-batches", micro_batches, "Micro-batch counts M")->delimiter(',');
  app.add_option("--steps", steps, "Training steps per configuration");
  app.add_option("--forward-ms", forward_ms, "Forward time of a stage (backward: twice that)");
  app.add_option("--trace-dir", trace_dir, "Where the Chrome traces go");
  CLI11_PARSE(app, argc, argv);
  STRATA_CHECK(steps > 0 && forward_ms > 0) << "--steps and --forward-ms must be positive";

  std::printf("stage forward %.1f ms, backward %.1f ms; %lld steps per row; ranks are threads\n",
              forward_ms, 2 * forward_ms, static_cast<long long>(steps));
  std::printf("%-10s %3s %4s %10s %12s %11s %9s\n", "schedule", "S", "M", "measured", "theoretical",
              "difference", "overlap");
  for (const std::string& name : schedules) {
    const parallel::ScheduleKind kind = parallel::parse_schedule(name);
    for (const int S : stages) {
      for (const int64_t M : micro_batches) {
        STRATA_CHECK(S >= 2 && M >= 1) << "pipeline_bench: S must be >= 2 and M >= 1";
        const std::string trace = trace_dir + "/pipeline_bench_" + name + "_S" + std::to_string(S) +
                                  "_M" + std::to_string(M) + ".json";
        const Row r = run(kind, S, M, steps, forward_ms, trace);
        std::printf("%-10s %3d %4lld %9.1f%% %11.1f%% %+10.1f %8.1f%%\n", name.c_str(), S,
                    static_cast<long long>(M), 100 * r.measured, 100 * r.theoretical,
                    100 * (r.measured - r.theoretical), 100 * r.overlap);
        std::fflush(stdout);
      }
    }
  }
  std::printf("difference in points; traces in %s\n", trace_dir.c_str());
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 1;
  }
}
