// `strata simulate` end to end: the pipeline closed form through a crafted profile, the JSON
// fields, the Chrome trace in the layout of `strata train --trace` (the same envelope, process and
// thread names, event fields), the SVG plots, a small --search over several GPU counts, and bad
// input (more ranks than GPUs, a stage beyond the device's memory, unknown device or link).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "parallel/trace.h"
#include "testing/cli.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

std::string temp_dir(const std::string& name) {
  return strata::testing::fresh_temp_dir("strata_simulate_" + name);
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// Four linear layers and a profile of 1 ms forward, 2 ms backward per sample each.
std::string four_layers(const std::string& dir) {
  std::ofstream(dir + "/four.prototxt") << R"(name: "four" input { shape: [16] }
layer { name: "fc0" type: "linear" linear { out_features: 16 } }
layer { name: "fc1" type: "linear" linear { out_features: 16 } }
layer { name: "fc2" type: "linear" linear { out_features: 16 } }
layer { name: "fc3" type: "linear" linear { out_features: 4 } }
)";
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < 4; ++l) {
    layers.push_back({{"name", "fc" + std::to_string(l)},
                      {"forward_ms_per_sample", 1.0},
                      {"backward_ms_per_sample", 2.0},
                      {"output_bytes_per_sample", 64.0},
                      {"activation_bytes_per_sample", 128.0},
                      {"param_bytes", 1088.0}});
  }
  std::ofstream(dir + "/profile.json") << nlohmann::json{{"layers", layers}}.dump();
  return "--model-spec " + dir + "/four.prototxt --profile " + dir + "/profile.json";
}

// Links without cost, so that the pipeline's closed form holds.
const char* const kFreeLinks =
    " --intra-latency-us 0 --inter-latency-us 0 --intra-bandwidth 1e12 --inter-bandwidth 1e12";

TEST(SimulateCli, HelpListsItsFlags) {
  const auto r = run_cli("simulate --help");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* flag :
       {"--profile", "--device-model", "--gpus", "--gpus-per-node", "--stages", "--groups",
        "--micro-batches", "--batch-size", "--seq-len", "--schedule", "--memory-policy", "--json",
        "--trace", "--search", "--plot", "--all-reduce", "--intra-link"}) {
    EXPECT_TRUE(contains(r.output, flag)) << flag;
  }
  EXPECT_TRUE(contains(run_cli("--help").output, "simulate"));
}

TEST(SimulateCli, ProfiledStagesGiveTheClosedFormAndTheJsonFields) {
  const std::string dir = temp_dir("closed");
  const std::string model = four_layers(dir);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    const auto r = run_cli("simulate " + model + kFreeLinks +
                           " --stages 4 --micro-batches 4 --batch-size 8 --schedule " + schedule +
                           " --json " + dir + "/out.json");
    ASSERT_EQ(r.status, 0) << r.output;
    const nlohmann::json j = read_json(dir + "/out.json");
    // Micro-batches of 2 samples: f = 2 ms, b = 4 ms per stage; (M + S - 1)(f + b) = 42 ms.
    EXPECT_NEAR(j["step_time_s"].get<double>(), 0.042, 1e-6) << schedule;
    EXPECT_NEAR(j["bubble"].get<double>(), 3.0 / 7.0, 1e-6);
    EXPECT_NEAR(j["throughput"].get<double>(), 8 / 0.042, 1e-2);
    EXPECT_TRUE(j["mfu"].is_null());  // a profile has no peak rate
    ASSERT_EQ(j["stages"].size(), 4u);
    for (const auto& st : j["stages"]) {
      EXPECT_GT(st["peak_memory_bytes"].get<double>(), 0.0);
      EXPECT_EQ(st["param_bytes"].get<double>(),
                4.0 * (16 * 16 + 16) * (st["stage"] == 3 ? 0.25 : 1))
          << st.dump();
    }
    EXPECT_GT(j["peak_memory_bytes"].get<double>(), 0.0);
  }
}

TEST(SimulateCli, TraceHasTheLayoutOfTrainTrace) {
  const std::string dir = temp_dir("trace");
  const auto r = run_cli("simulate " + four_layers(dir) +
                         " --stages 2 --groups 2 --micro-batches 2 --batch-size 8 --trace " + dir +
                         "/sim.json --plot " + dir + "/timeline.svg");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json sim = read_json(dir + "/sim.json");
  // A measured trace from parallel::Trace, as strata train writes it.
  strata::parallel::Trace trace(1, 0, 1);
  const auto t = std::chrono::steady_clock::now();
  trace.record({strata::parallel::OpCode::kForward, 0}, t, t + std::chrono::milliseconds(1));
  trace.record({strata::parallel::OpCode::kOptimizerStep, -1}, t, t);
  trace.record_transfer({strata::parallel::OpCode::kSendGrad, 0}, 0, t, t);
  trace.record_span("all-reduce bucket 0", t, t, strata::parallel::Trace::kGradSyncLane);
  strata::parallel::Trace::write_file(dir + "/real.json", {trace.events_json()});
  const nlohmann::json real = read_json(dir + "/real.json");
  EXPECT_EQ(sim["displayTimeUnit"], real["displayTimeUnit"]);
  auto keys = [](const nlohmann::json& e) {
    std::set<std::string> k;
    for (auto it = e.begin(); it != e.end(); ++it) k.insert(it.key());
    return k;
  };
  std::set<std::string> real_threads, sim_threads, sim_names;
  // The fields of an event, by category and whether it belongs to a micro-batch.
  std::map<std::pair<std::string, bool>, std::set<std::string>> real_keys;
  for (const auto& e : real["traceEvents"]) {
    if (e["name"] == "thread_name") real_threads.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] == "X") real_keys[{e["cat"].get<std::string>(), e.contains("args")}] = keys(e);
  }
  int processes = 0;
  for (const auto& e : sim["traceEvents"]) {
    if (e["name"] == "process_name") {
      ++processes;
      EXPECT_TRUE(contains(e["args"]["name"].get<std::string>(), "rank ")) << e.dump();
    }
    if (e["name"] == "thread_name" && e["pid"] == 1) {
      sim_threads.insert(e["args"]["name"].get<std::string>());
    }
    if (e["ph"] != "X") continue;
    sim_names.insert(e["name"].get<std::string>());
    const std::pair<std::string, bool> kind{e["cat"].get<std::string>(), e.contains("args")};
    if (real_keys.count(kind) != 0) {
      EXPECT_EQ(keys(e), real_keys[kind]) << e.dump();
    }
    if (e.contains("args") && e["args"].contains("micro_batch")) {
      EXPECT_EQ(e["args"]["stage"].get<int>(), e["pid"].get<int>() % 2) << e.dump();
    }
  }
  EXPECT_EQ(processes, 4);
  EXPECT_EQ(sim_threads, real_threads);
  for (const char* name : {"Forward 0", "Backward 1", "SendAct 1", "RecvGrad 0", "OptimizerStep",
                           "all-reduce bucket 0"}) {
    EXPECT_EQ(sim_names.count(name), 1u) << name;
  }
  std::ifstream svg(dir + "/timeline.svg");
  std::string head;
  std::getline(svg, head);
  EXPECT_TRUE(contains(head, "<svg")) << head;
}

TEST(SimulateCli, SearchRanksLayoutsAtSeveralScalesAndPlotsThem) {
  const std::string dir = temp_dir("search");
  const auto r = run_cli(
      "simulate --model gpt2 --size tiny --seq-len 64 --device-model a100 "
      "--precision bf16 --search --gpus 2,4 --batch-per-gpu 4 --top 3 "
      "--json " +
      dir + "/search.json --plot " + dir + "/scaling.svg");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "search gpt2-tiny on 4 x a100")) << r.output;
  EXPECT_TRUE(contains(r.output, "(best)")) << r.output;
  EXPECT_TRUE(contains(r.output, "the best layout at each scale")) << r.output;
  const nlohmann::json j = read_json(dir + "/search.json");
  ASSERT_EQ(j["scales"].size(), 2u);
  for (const auto& scale : j.at("scales")) {
    const nlohmann::json& best = scale.at("best");
    ASSERT_FALSE(best.is_null());
    EXPECT_EQ(best.at("groups").get<int64_t>() * best.at("stages").get<int64_t>(),
              scale.at("gpus").get<int64_t>());
    // Ranked: the best is at least as fast as every candidate that fits.
    for (const auto& c : scale.at("candidates")) {
      if (!c.at("fits").get<bool>()) continue;
      EXPECT_LE(c.at("throughput").get<double>(),
                best.at("throughput").get<double>() * (1 + 1e-12));
      if (c != best) {
        EXPECT_FALSE(c.at("reason").get<std::string>().empty()) << c.dump();
      }
    }
  }
  std::ifstream svg(dir + "/scaling.svg");
  std::stringstream text;
  text << svg.rdbuf();
  EXPECT_TRUE(contains(text.str(), "<polyline")) << text.str().substr(0, 200);
}

TEST(SimulateCli, BadInputNamesTheProblem) {
  auto r = run_cli("simulate --model gpt2 --size tiny --stages 2 --groups 4 --gpus 4");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "8 ranks do not fit the cluster's 4 GPUs (--gpus 4)")) << r.output;
  r = run_cli(
      "simulate --model gpt2 --size 1558M --precision bf16 --stages 1 --device-model a100 "
      "--device-memory 8GB");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "stage 0 (layers 0-49) needs")) << r.output;
  EXPECT_TRUE(contains(r.output, "more than the 7.45 GiB of a a100")) << r.output;
  r = run_cli("simulate --model gpt2 --size tiny --device-model v100");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "unknown device model 'v100' (valid: h100, h200, a100"))
      << r.output;
  r = run_cli("simulate --model gpt2 --size tiny --inter-link myrinet");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "unknown link 'myrinet' (valid: same-device, nvlink, pcie"))
      << r.output;
  r = run_cli("simulate --model gpt2 --size tiny --memory-policy offload");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(
      r.output, "--memory-policy: unknown memory policy 'offload' (valid: keep, swap, recompute)"))
      << r.output;
  // Activations past the device: the report, then the error with the numbers.
  r = run_cli(
      "simulate --model gpt2 --size 355M --precision bf16 --stages 2 --micro-batches 64 "
      "--batch-size 512 --schedule gpipe --device-model a100");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "step time")) << r.output;
  EXPECT_TRUE(contains(r.output, "peaks at")) << r.output;
  EXPECT_TRUE(contains(r.output, "--memory-policy recompute or swap")) << r.output;
}

}  // namespace
