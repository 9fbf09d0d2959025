// DynPipe's slowdown model and re-partition through the binary: `strata profile --colocation`
// writes the co-location data set of a tiny model, `strata fit-slowdown` trains the forest on it
// and on a synthetic non-linear set (where it beats linear regression), and `strata plan --planner
// dynpipe` re-partitions under --slowdown, --stage-ms (dynpipe-no-rf) and --slowdown-model; bad
// input is named by its flag or file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "testing/cli.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

void expect_all(const std::string& output, const std::vector<std::string>& parts) {
  for (const std::string& s : parts) {
    EXPECT_TRUE(contains(output, s)) << "missing '" << s << "' in\n" << output;
  }
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// cnn-tiny's twelve layers, each 1 ms forward and 2 ms backward per sample, 1 MB of parameters
// and no outputs (free links).
std::string write_profile(const std::string& dir) {
  const char* names[] = {"conv1", "bn1",   "relu1",   "pool1", "conv2", "bn2",
                         "relu2", "pool2", "flatten", "fc1",   "relu3", "fc2"};
  nlohmann::json list = nlohmann::json::array();
  for (const char* name : names) {
    list.push_back({{"name", name},
                    {"forward_ms_per_sample", 1.0},
                    {"backward_ms_per_sample", 2.0},
                    {"output_bytes_per_sample", 0.0},
                    {"activation_bytes_per_sample", 64.0},
                    {"param_bytes", 1e6}});
  }
  const std::string path = dir + "/uniform.json";
  std::ofstream(path) << nlohmann::json{{"layers", list}}.dump(2);
  return path;
}

std::string plan_command(const std::string& profile) {
  // 2 stages, micro-batches of 4 samples: the dp plan is 6 | 6 layers, 72 ms each.
  return "plan --model cnn --size tiny --dataset synthetic-images --stages 2 --micro-batches 4 "
         "--batch-size 16 --bandwidth 10 --planner dynpipe --profile " +
         profile;
}

const char* kColocationHeader =
    "layer,rank,window,layer_solo_ms,layer_param_bytes,layer_output_bytes,layer_activation_bytes,"
    "colocated_threads,load_threads,load_duty,load_memory,load_rank,colocated_ms,layer_slowdown,"
    "slowdown";

// The rows of a co-location CSV: as many solo rows as loaded per rank (a solo window before
// each loaded one and after the last), a layer's ratio colocated / solo, and the target the
// rank's window's sum of colocated over the sum of solo (a stage's slowdown), on each of its
// rows. Returns the ranks seen.
std::set<std::string> check_rows(const std::vector<std::string>& lines, size_t windows) {
  EXPECT_EQ(lines.at(0), kColocationHeader);
  std::set<std::string> ranks, window_ids;
  std::map<std::string, std::vector<double>> sums;  // rank/window: solo, colocated, target
  size_t loaded = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::stringstream row(lines[i]);
    std::vector<std::string> cells;
    std::string cell;
    while (std::getline(row, cell, ',')) cells.push_back(cell);
    EXPECT_EQ(cells.size(), 15u) << lines[i];
    if (cells.size() != 15u) continue;
    ranks.insert(cells[1]);
    window_ids.insert(cells[2]);
    const bool solo = cells[8] == "0";
    if (!solo) ++loaded;
    EXPECT_EQ(cells[11] == "-1", solo) << lines[i];  // load_rank
    EXPECT_GT(std::stod(cells[3]), 0.0) << lines[i];
    EXPECT_NEAR(std::stod(cells[13]), std::stod(cells[12]) / std::stod(cells[3]), 1e-4) << lines[i];
    std::vector<double>& s = sums[cells[1] + "/" + cells[2]];
    s.resize(3, 0.0);
    s[0] += std::stod(cells[3]);
    s[1] += std::stod(cells[12]);
    s[2] = std::stod(cells[14]);
  }
  for (const auto& [key, s] : sums) EXPECT_NEAR(s[2], s[1] / s[0], 1e-4 * s[2]) << key;
  EXPECT_EQ(window_ids.size(), windows);
  // windows = 2 x loaded + 1: the loaded rows are (windows - 1) / 2 of every windows' rows.
  EXPECT_EQ(loaded * windows, (lines.size() - 1) * (windows - 1) / 2);
  return ranks;
}

// What a profile's rows say of its loads: the mean label (slowdown) of the solo rows, of the rows
// of the rank whose process ran the window's load, and of the other ranks' rows in loaded
// windows; and whether the co-located load's counter (colocated_threads) is zero exactly on the
// rows of ranks that ran no load.
struct Labels {
  double solo = 0, loaded = 0, beside = 0;
  size_t solo_rows = 0, loaded_rows = 0, beside_rows = 0;
  bool counter_tells_loaded = true;
};
Labels labels_of(const std::vector<std::string>& lines) {
  Labels out;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::stringstream row(lines[i]);
    std::vector<std::string> cells;
    std::string cell;
    while (std::getline(row, cell, ',')) cells.push_back(cell);
    if (cells.size() != 15u) continue;
    const double label = std::stod(cells[14]), colocated = std::stod(cells[7]);
    const bool solo = cells[11] == "-1", here = cells[11] == cells[1];
    if (solo) {
      out.solo += label;
      ++out.solo_rows;
    } else if (here) {
      out.loaded += label;
      ++out.loaded_rows;
    } else {
      out.beside += label;
      ++out.beside_rows;
    }
    if ((colocated > 0) != here) out.counter_tells_loaded = false;
  }
  out.solo /= std::max<size_t>(1, out.solo_rows);
  out.loaded /= std::max<size_t>(1, out.loaded_rows);
  out.beside /= std::max<size_t>(1, out.beside_rows);
  return out;
}

TEST(SlowdownCli, ColocationProfileWritesTheDataSet) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_slowdown_cli_profile");
  const std::string csv = dir + "/colocation.csv";
  const auto r = run_cli(
      "profile --colocation --model cnn --size tiny --dataset synthetic-images --batch-size 8 "
      "--steps 1 --threads 1 --colocation-samples 2 --load-threads 2 --colocation-output " +
      csv);
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"co-location profile of", "steps per window", "wrote " + csv,
                        "feature set strata-cpu-3 (5 windows"});
  const std::vector<std::string> lines = lines_of(csv);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(check_rows(lines, 5), std::set<std::string>{"0"});
  // Under an emulated device, as strata train --inject runs it: a loaded window's load shares
  // the device as training's kind=load does (a factor 1 + threads x duty on the layers' time; the
  // draws of --seed 3 are 2 memory threads at 100%, then at 25%), so the loaded
  // rows' labels are well above the solo rows' (the device no longer absorbs the load), and
  // their counters differ by the load's CPU in the process.
  const std::string emulated = dir + "/emulated.csv";
  const auto e = run_cli(
      "profile --colocation --model cnn --size tiny --dataset synthetic-images --batch-size 8 "
      "--steps 4 --threads 1 --colocation-samples 2 --load-threads 2 --seed 3 --inject "
      "kind=device,factor=8 --colocation-output " +
      emulated);
  ASSERT_EQ(e.status, 0) << e.output;
  expect_all(e.output, {"emulated device kind=device,factor=8", "wrote " + emulated,
                        "2 memory threads at 100%", "2 memory threads at 25%"});
  check_rows(lines_of(emulated), 5);
  const Labels l = labels_of(lines_of(emulated));
  EXPECT_EQ(l.solo_rows, 36u);
  EXPECT_EQ(l.loaded_rows, 24u);
  EXPECT_GT(l.loaded, 1.5 * l.solo) << e.output;
  EXPECT_TRUE(l.counter_tells_loaded) << e.output;
  // Bad input named by its flag.
  const std::string base =
      "profile --colocation --model cnn --size tiny --dataset synthetic-images --steps 1 ";
  EXPECT_TRUE(contains(run_cli(base).output, "--colocation needs --colocation-output"));
  EXPECT_TRUE(contains(run_cli(base + "--colocation-samples 0 --colocation-output x.csv").output,
                       "--colocation-samples must be 1 to 10000, got 0"));
  EXPECT_TRUE(contains(
      run_cli(base + "--colocation-output " + dir + "/x.csv --inject kind=slow,factor=2").output,
      "profile --colocation --inject \"kind=slow,factor=2\": only one "
      "kind=device spec"));
  EXPECT_TRUE(contains(run_cli("profile --model cnn --size tiny --dataset synthetic-images "
                               "--colocation-output x.csv")
                           .output,
                       "are flags of --colocation"));
}

#ifdef STRATA_MPIEXEC
// Under mpirun every rank profiles at once, a loaded window's load in one rank's process, and
// rank 0 writes every rank's rows.
TEST(SlowdownCli, ColocationProfileOnMpiRanks) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_slowdown_cli_mpi");
  const std::string csv = dir + "/colocation.csv";
  const std::string cmd =
      strata::testing::mpirun(2) + " " + STRATA_CLI_PATH +
      " profile --colocation --model cnn --size tiny --dataset synthetic-images --batch-size 8 "
      "--steps 4 --threads 1 --colocation-samples 2 --load-threads 2 --seed 3 --inject "
      "kind=device,factor=8 --colocation-output " +
      csv + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << output;
  expect_all(output, {"2 ranks", "x 2 ranks", "wrote " + csv});
  EXPECT_EQ(check_rows(lines_of(csv), 5), (std::set<std::string>{"0", "1"}));
  // The rank whose process ran the load (--seed 3: rank 1, then rank 0) is slowed on its
  // emulated device, the other only through the shared cores; the co-located load's counter
  // tells them apart.
  expect_all(output, {"2 memory threads at 100% in rank 1", "2 memory threads at 25% in rank 0"});
  const Labels l = labels_of(lines_of(csv));
  EXPECT_EQ(l.loaded_rows, l.beside_rows);
  EXPECT_GT(l.loaded, 1.5 * l.solo) << output;
  EXPECT_GT(l.loaded, l.beside) << output;
  EXPECT_TRUE(l.counter_tells_loaded) << output;
}
#endif

TEST(SlowdownCli, FitSlowdownBeatsLinearOnANonLinearSetAndRefusesBadFiles) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_slowdown_cli_fit");
  const std::string csv = dir + "/synthetic.csv";
  {
    std::ofstream out(csv);
    out << "layer,layer_solo_ms,layer_param_bytes,layer_output_bytes,layer_activation_bytes,"
           "cpu_util_mean,cpu_util_max,runq_per_core,run_delay_per_cpu_s,preempt_per_cpu_s,"
           "colocated_threads,slowdown\n";
    std::mt19937 rng(1);
    std::uniform_real_distribution<double> u(0, 1);
    for (int i = 0; i < 800; ++i) {
      const double util = u(rng), load = 4 * u(rng), solo = u(rng);
      // Slow only past 2 co-located load threads, more for short layers.
      const double y = 1 + (load > 2 ? (load - 2) * (1.5 - solo) : 0.0);
      out << "l" << i << "," << solo << "," << 1e5 * u(rng) << "," << 1e3 * u(rng) << ","
          << 1e3 * u(rng) << "," << util << "," << u(rng) << "," << 4 * u(rng) << "," << u(rng)
          << "," << 10 * u(rng) << "," << load << "," << y << "\n";
    }
  }
  const std::string model = dir + "/forest.json";
  const auto r =
      run_cli("fit-slowdown --data " + csv + " --out " + model + " --seed 3 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"800 rows, 5 features (strata-cpu-3: layer_solo_ms,layer_param_bytes,",
                        "held out 160 rows", "forest: 128 trees", "wrote " + model,
                        "weighted by layer_solo_ms (as a stage's slowdown): MAE forest ",
                        "random forest (XGBoost)", "linear regression (least squares)"});
  const size_t at = r.output.find("forest MAE / linear MAE = ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const double ratio = std::stod(r.output.substr(at + 26));
  EXPECT_LT(ratio, 0.6) << r.output;
  EXPECT_GT(ratio, 0.0) << r.output;

  // A plan with the forest: rank 1's counters say a load of 4 threads shares its device.
  const std::string counters = dir + "/counters.json";
  std::ofstream(counters) << R"([{"cpu_util_mean": 0.3, "cpu_util_max": 0.5, "runq_per_core": 1.0,)"
                          << R"( "run_delay_per_cpu_s": 0.1, "preempt_per_cpu_s": 1.0,)"
                          << R"( "colocated_threads": 0.0},)"
                          << R"( {"cpu_util_mean": 1.0, "cpu_util_max": 0.5, "runq_per_core": 4.0,)"
                          << R"( "run_delay_per_cpu_s": 0.1, "preempt_per_cpu_s": 1.0,)"
                          << R"( "colocated_threads": 4.0}])";
  const auto p = run_cli(plan_command(write_profile(dir)) + " --slowdown-model " + model +
                         " --rank-counters " + counters);
  ASSERT_EQ(p.status, 0) << p.output;
  expect_all(p.output, {"dynpipe re-partition (Algorithm 2; slowdowns: random forest " + model,
                        "the dp plan on 2 ranks", "proposed: --partition conv1-"});

  // Refusals: missing, truncated, another feature set (a forest of other columns), bad flags.
  const auto missing = run_cli(plan_command(dir + "/uniform.json") + " --slowdown-model " + dir +
                               "/none.json --rank-counters " + counters);
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(contains(missing.output, "slowdown model '" + dir + "/none.json' is missing"))
      << missing.output;
  std::ifstream in(model);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir + "/cut.json") << bytes.substr(0, bytes.size() - 100);
  const auto cut = run_cli(plan_command(dir + "/uniform.json") + " --slowdown-model " + dir +
                           "/cut.json --rank-counters " + counters);
  EXPECT_TRUE(contains(cut.output, "slowdown model '" + dir + "/cut.json' is truncated"))
      << cut.output;
  const auto lacks = run_cli(plan_command(dir + "/uniform.json") + " --slowdown-model " + model +
                             " --rank-counters " + dir + "/few.json");
  EXPECT_TRUE(contains(lacks.output, "cannot read --rank-counters")) << lacks.output;
  std::ofstream(dir + "/partial.json") << R"([{"cpu_util_mean": 0.3}, {"cpu_util_mean": 1.0}])";
  const auto partial = run_cli(plan_command(dir + "/uniform.json") + " --slowdown-model " + model +
                               " --rank-counters " + dir + "/partial.json");
  EXPECT_TRUE(
      contains(partial.output,
               "the counter 'colocated_threads' of feature set strata-cpu-3 is not among rank "
               "0's counters"))
      << partial.output;
  // A forest of other columns (--features) is for study: plan refuses it by what differs.
  const auto custom = run_cli("fit-slowdown --data " + csv + " --out " + dir +
                              "/custom.json --threads 1 --trees 4 --features "
                              "layer_solo_ms,runq_per_core");
  ASSERT_EQ(custom.status, 0) << custom.output;
  EXPECT_TRUE(contains(custom.output, "2 features (custom: layer_solo_ms,runq_per_core)"))
      << custom.output;
  const auto foreign = run_cli(plan_command(dir + "/uniform.json") + " --slowdown-model " + dir +
                               "/custom.json --rank-counters " + counters);
  EXPECT_EQ(foreign.status, 1);
  EXPECT_TRUE(contains(foreign.output, "was trained on another feature set: 'custom', 2 features"))
      << foreign.output;
  const auto other = run_cli("fit-slowdown --data " + csv + " --out " + dir +
                             "/other.json --features cpu_util_mean,missing_column");
  EXPECT_TRUE(contains(other.output, "has no column 'missing_column'")) << other.output;
  const auto none = run_cli("fit-slowdown --data " + dir + "/none.csv --out " + dir + "/x.json");
  EXPECT_TRUE(contains(none.output, "cannot read the data set '" + dir + "/none.csv'"))
      << none.output;
  EXPECT_TRUE(contains(run_cli("fit-slowdown --help").output, "--holdout"));
}

TEST(SlowdownCli, PlanRepartitionsUnderGivenAndMeasuredSlowdowns) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_slowdown_cli_plan");
  const std::string profile = write_profile(dir);
  // Rank 1 three times slower: 6 | 6 costs max(72, 216) = 216 ms; 9 | 3 costs max(108, 108).
  const auto r = run_cli(plan_command(profile) + " --slowdown 1:3");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"dynpipe re-partition (Algorithm 2; slowdowns: --slowdown factors): the "
                        "dp plan on 2 ranks, one per stage, 12 blocks",
                        "predicted cycle time: current 216.000 ms, proposed 108.000 ms (50.0% "
                        "lower)",
                        "proposed: --partition conv1-flatten,fc1-fc2"});
  // dynpipe-no-rf: measured stage times 72 and 216 ms are slowdowns 1 and 3: the same plan.
  const auto m = run_cli(plan_command(profile) + " --stage-ms 72,216");
  ASSERT_EQ(m.status, 0) << m.output;
  expect_all(m.output, {"dynpipe-no-rf: measured stage times over solo",
                        "proposed: --partition conv1-flatten,fc1-fc2"});
  // No interference: the dp plan is kept. A given partition is the current plan.
  expect_all(run_cli(plan_command(profile) + " --slowdown 0:1").output,
             {"the current plan is kept"});
  expect_all(
      run_cli(plan_command(profile) + " --partition conv1-relu2,pool2-fc2 --slowdown 0:2").output,
      {"the given plan on 2 ranks", "proposed: --partition conv1-pool1,conv2-fc2"});
  // Bad input by flag.
  expect_all(run_cli(plan_command(profile) + " --slowdown 2:3").output,
             {"--slowdown: rank '2' is not one of the plan's ranks 0-1"});
  expect_all(run_cli(plan_command(profile) + " --slowdown 1:-3").output,
             {"--slowdown: '-3' is not a positive number"});
  expect_all(run_cli(plan_command(profile) + " --stage-ms 72").output,
             {"--stage-ms has 1 times for the 2 stages of the current plan (dp)"});
  expect_all(run_cli(plan_command(profile) + " --slowdown 1:3 --stage-ms 72,216").output,
             {"give one of --slowdown, --stage-ms and --slowdown-model"});
  expect_all(run_cli("plan --model cnn --size tiny --dataset synthetic-images --profile " +
                     profile + " --slowdown 1:3")
                 .output,
             {"are flags of --planner dynpipe"});
}

}  // namespace
