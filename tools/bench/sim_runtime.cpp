// How long the simulator takes: one step of 4,096 ranks (and other sizes), every group simulated
// (--dedupe off, the full event model over every rank) and with groups of identical links
// simulated once (the default of strata simulate). GPT-2 1558M and a GPT-style 20B model on an
// H100 device model; wall time of parallel::sim::simulate, median of --repeats.
//
//   sim_runtime [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/check.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "models/registry.h"
#include "parallel/sim/search.h"
#include "parallel/sim/simulator.h"

namespace strata {
namespace {

namespace sim = parallel::sim;

struct Model {
  std::string name;
  sim::CostModel costs;
};

Model gpt(const std::string& label, const std::string& size, int64_t layers, int64_t width,
          int64_t heads) {
  models::ModelRequest r;
  r.name = "gpt2";
  r.size = size;
  r.dims.layers = layers;
  r.dims.width = width;
  r.dims.heads = heads;
  r.input_shape = {1024};
  const proto::ModelSpec spec = models::model_spec(r);
  std::unique_ptr<graph::Model> model = graph::build_model(spec);
  sim::WorkOptions wo;
  wo.compute = DType::kBF16;
  wo.attention_probs = false;
  const sim::DeviceSpec h100 = sim::builtin_device("h100");
  sim::DeviceCostOptions dco;
  dco.peak_flops = h100.peak_flops;
  return {label, sim::device_cost_model(sim::model_work(*model, &spec, wo), h100, dco)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int bench_main(int argc, char** argv) {
  int repeats = 3;
  CLI::App app("Simulator runtime: one step of thousands of ranks");
  app.add_option("--repeats", repeats, "Runs per configuration (median)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::vector<Model> models{gpt("gpt2-1558M", "1558M", 0, 0, 0),
                                  gpt("gpt-20B (44 x 6144)", "1558M", 44, 6144, 48)};
  struct Layout {
    int groups, stages;
    int64_t micro_batches;
    parallel::ScheduleKind kind;
  };
  const std::vector<Layout> layouts{{128, 32, 64, parallel::ScheduleKind::k1F1B},
                                    {128, 32, 64, parallel::ScheduleKind::kGPipe},
                                    {512, 8, 16, parallel::ScheduleKind::k1F1B},
                                    {4096, 1, 4, parallel::ScheduleKind::k1F1B},
                                    {16, 32, 64, parallel::ScheduleKind::k1F1B}};
  std::printf("%-22s %-26s %7s %9s %12s %12s %10s %12s\n", "model", "layout", "ranks", "dedupe",
              "groups run", "instructions", "wall s", "step (sim) s");
  for (const Model& m : models) {
    for (const Layout& l : layouts) {
      for (bool dedupe : {false, true}) {
        sim::SimConfig c;
        c.groups = l.groups;
        c.stages = l.stages;
        c.micro_batches = l.micro_batches;
        c.micro_batch_rows = 1;
        c.schedule = l.kind;
        c.partition =
            sim::choose_partition(m.costs, l.stages, 1, "dp", l.kind, l.micro_batches, 450e9);
        c.mixed_precision = true;
        c.dedupe_groups = dedupe;
        const sim::Cluster cluster =
            sim::make_cluster(sim::builtin_device("h100"), l.groups * l.stages, 8);
        std::vector<double> wall;
        sim::SimResult r;
        for (int i = 0; i < repeats; ++i) {
          const auto start = std::chrono::steady_clock::now();
          r = sim::simulate(c, m.costs, cluster);
          wall.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        }
        const std::string layout = std::to_string(l.groups) + "x" + std::to_string(l.stages) +
                                   " M=" + std::to_string(l.micro_batches) + " " +
                                   parallel::schedule_name(l.kind);
        std::printf("%-22s %-26s %7d %9s %12d %12lld %10.3f %12.4f\n", m.name.c_str(),
                    layout.c_str(), l.groups * l.stages, dedupe ? "on" : "off", r.simulated_groups,
                    static_cast<long long>(r.instructions), median(wall), r.step_time_s);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  try {
    return strata::bench_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sim_runtime: %s\n", e.what());
    return 1;
  }
}
