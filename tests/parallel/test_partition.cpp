// Pipeline partitions: the balanced DP against brute force (optimum and exact tie-break),
// memory feasibility, the communication term, manual `--partition` parsing and its errors, and
// profiles read from the profiler's JSON.
#include "parallel/partition/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/check.h"
#include "graph/layers.h"
#include "graph/param_store.h"
#include "graph/profiler.h"
#include "graph/train_step.h"
#include "testing/testing.h"

namespace strata::parallel {
namespace {

const std::vector<std::string> kCnnNames = {"conv1", "bn1",   "relu1",   "pool1", "conv2", "bn2",
                                            "relu2", "pool2", "flatten", "fc1",   "relu3", "fc2"};

// The error of `fn`, or "" when it does not throw.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(statement, text)                                               \
  do {                                                                              \
    const std::string error_ = error_of([&] { statement; });                        \
    EXPECT_NE(error_.find(text), std::string::npos) << "error: '" << error_ << "'"; \
  } while (0)

// Every partition of L layers into S non-empty contiguous stages.
void for_each_partition(size_t L, int S, const std::function<void(const Partition&)>& fn) {
  Partition p;
  std::function<void(size_t)> rec = [&](size_t begin) {
    if (p.size() == static_cast<size_t>(S) - 1) {
      p.push_back({begin, L});
      fn(p);
      p.pop_back();
      return;
    }
    const size_t stages_left = static_cast<size_t>(S) - p.size();
    for (size_t end = begin + 1; end + stages_left - 1 <= L; ++end) {
      p.push_back({begin, end});
      rec(end);
      p.pop_back();
    }
  };
  rec(0);
}

// The documented tie-break key: (T_S, b_{S-1}, T_{S-1}, ..., T_2, b_1).
std::vector<double> tie_break_key(const PartitionPlan& plan) {
  const size_t S = plan.stages.size();
  std::vector<double> prefix_max(S);
  for (size_t k = 0; k < S; ++k) {
    prefix_max[k] = std::max(k > 0 ? prefix_max[k - 1] : 0.0, plan.stages[k].time_ms);
  }
  std::vector<double> key;
  for (size_t k = S; k-- > 1;) {
    key.push_back(prefix_max[k]);
    key.push_back(static_cast<double>(plan.partition[k].begin));
  }
  key.push_back(prefix_max[0]);
  return key;
}

std::vector<LayerCost> uniform_costs(size_t L) {
  std::vector<LayerCost> costs(L);
  for (size_t l = 0; l < L; ++l) {
    costs[l].name = "l" + std::to_string(l);
    costs[l].forward_ms = 1.0;
  }
  return costs;
}

TEST(Partition, BalancedMatchesBruteForceIncludingTies) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> small(0, 4);
  std::uniform_int_distribution<int> bytes(0, 3);
  const ScheduleKind kinds[] = {ScheduleKind::kGPipe, ScheduleKind::k1F1B,
                                ScheduleKind::kAsync1F1B};
  int infeasible = 0, ties = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t L = 1 + trial % 10;
    const int S = 1 + (trial / 10) % 4;
    if (static_cast<size_t>(S) > L) continue;
    std::vector<LayerCost> costs(L);
    for (size_t l = 0; l < L; ++l) {
      costs[l].name = "layer" + std::to_string(l);
      costs[l].forward_ms = small(rng);  // integers: many exact ties
      costs[l].backward_ms = small(rng);
      costs[l].output_bytes = 1000.0 * bytes(rng);
      costs[l].activation_bytes = 10.0 * small(rng);
      costs[l].param_bytes = 4.0 * small(rng);
    }
    PartitionOptions o;
    o.schedule = kinds[trial % 3];
    o.micro_batches = 1 + trial % 5;
    o.micro_batch_size = 1 + trial % 3;
    o.bandwidth_bytes_per_second = 1e6;  // 1 ms per 1000 bytes
    o.mem_limit_bytes = trial % 2 == 0 ? 0.0 : 40.0 + 10.0 * (trial % 7);
    // The feasible partitions with their keys; the documented choice is the smallest key.
    std::vector<std::pair<std::vector<double>, Partition>> feasible;
    for_each_partition(L, S, [&](const Partition& p) {
      const PartitionPlan plan = evaluate_partition(costs, p, o);
      if (plan.memory_error.empty()) feasible.push_back({tie_break_key(plan), p});
    });
    if (feasible.empty()) {
      ++infeasible;
      EXPECT_ERROR(balanced_partition(costs, S, o), "fits the memory limit");
      continue;
    }
    // Keys hold every cut, so they differ between partitions: the minimum is unique.
    const auto best =
        *std::min_element(feasible.begin(), feasible.end(),
                          [](const auto& a, const auto& b) { return a.first < b.first; });
    const double best_time = best.first[0];
    ties += std::count_if(feasible.begin(), feasible.end(),
                          [&](const auto& f) { return f.first[0] == best_time; }) > 1;
    const PartitionPlan plan = balanced_partition(costs, S, o);
    EXPECT_EQ(plan.partition, best.second) << "trial " << trial;
    EXPECT_EQ(plan.slowest_ms, best_time) << "trial " << trial;
    EXPECT_TRUE(plan.memory_error.empty()) << plan.memory_error;
  }
  // The random cases exercise both the memory limit and the tie-break.
  EXPECT_GT(infeasible, 5);
  EXPECT_GT(ties, 20);
}

TEST(Partition, TiesMoveLayersTowardsLaterStages) {
  std::vector<LayerCost> costs = uniform_costs(3);
  costs[1].forward_ms = 0.0;  // {l0 | l1 l2} and {l0 l1 | l2} both have a slowest stage of 1
  const PartitionPlan plan = balanced_partition(costs, 2, {});
  EXPECT_EQ(plan.partition, (Partition{{0, 1}, {1, 3}}));
  EXPECT_EQ(plan.slowest_ms, 1.0);
}

TEST(Partition, MemoryLimitForcesAnUnbalancedSplitOrFails) {
  // Equal times; 1f1b with S = 2 keeps 2 micro-batches in flight on stage 0 and 1 on stage 1.
  std::vector<LayerCost> costs = uniform_costs(4);
  for (LayerCost& c : costs) c.activation_bytes = 10.0;
  PartitionOptions o;
  o.schedule = ScheduleKind::k1F1B;
  o.micro_batches = 4;
  PartitionPlan plan = balanced_partition(costs, 2, o);
  EXPECT_EQ(plan.partition, (Partition{{0, 2}, {2, 4}}));
  EXPECT_EQ(plan.stages[0].memory_bytes, 40.0);
  EXPECT_EQ(plan.stages[1].memory_bytes, 20.0);

  o.mem_limit_bytes = 30.0;  // stage 0 fits one layer (20 B), stage 1 three (30 B)
  plan = balanced_partition(costs, 2, o);
  EXPECT_EQ(plan.partition, (Partition{{0, 1}, {1, 4}}));
  EXPECT_EQ(plan.slowest_ms, 3.0);
  EXPECT_EQ(plan.slowest_stage, 1u);
  EXPECT_TRUE(plan.memory_error.empty());
  // The uniform split is evaluated, and its stage over the limit named.
  EXPECT_EQ(evaluate_partition(costs, uniform_partition(4, 2), o).memory_error,
            "stage 0 (layers l0-l1) needs 40 B: 0 B for parameters, gradients and optimizer "
            "state, 40 B for the activations of 2 micro-batches of 1 samples in flight, over the "
            "limit of 30 B per stage");

  o.mem_limit_bytes = 15.0;
  EXPECT_ERROR(balanced_partition(costs, 2, o),
               "no partition of the 4 layers into 2 stages fits the memory limit of 15 B per "
               "stage (1f1b, 4 micro-batches): even the partition needing the least memory "
               "(l0,l1-l3) exceeds it: stage 1 (layers l1-l3) needs 30 B");
}

TEST(Partition, MemoryCountsParametersOptimizerStateAndStashes) {
  std::vector<LayerCost> costs = uniform_costs(2);
  costs[0].param_bytes = 100.0;
  costs[0].activation_bytes = 8.0;
  PartitionOptions o;
  o.micro_batches = 6;
  o.micro_batch_size = 2;
  o.optimizer_slots = 2;
  const Partition p = {{0, 1}, {1, 2}};
  o.schedule = ScheduleKind::kGPipe;  // 6 in flight
  StageEstimate e = evaluate_partition(costs, p, o).stages[0];
  EXPECT_EQ(e.in_flight, 6);
  EXPECT_EQ(e.param_memory_bytes, 400.0);  // params, grads, 2 optimizer slots
  EXPECT_EQ(e.activation_memory_bytes, 2 * 8.0 * 6);
  o.schedule = ScheduleKind::k1F1B;  // S - s = 2 in flight
  e = evaluate_partition(costs, p, o).stages[0];
  EXPECT_EQ(e.in_flight, 2);
  EXPECT_EQ(e.memory_bytes, 400.0 + 2 * 8.0 * 2);
  o.schedule = ScheduleKind::kAsync1F1B;  // plus one stashed weight version
  o.optimizer_slots = 1;
  e = evaluate_partition(costs, p, o).stages[0];
  EXPECT_EQ(e.param_memory_bytes, 100.0 * (2 + 1 + 1));
  EXPECT_EQ(stage_in_flight(ScheduleKind::kAsync1F1B, 4, 1, 2), 2);
  EXPECT_EQ(stage_in_flight(ScheduleKind::k1F1B, 4, 1, 8), 3);
}

TEST(Partition, CommunicationChangesTheOptimum) {
  std::vector<LayerCost> costs = uniform_costs(4);
  for (LayerCost& c : costs) c.output_bytes = 1e6;
  costs[1].output_bytes = 1e9;  // cutting after l1 sends a large tensor
  PartitionOptions o;
  o.bandwidth_bytes_per_second = 1e15;  // sends are free: the even split
  PartitionPlan plan = balanced_partition(costs, 2, o);
  EXPECT_EQ(plan.partition, (Partition{{0, 2}, {2, 4}}));
  o.bandwidth_bytes_per_second = 1e9;  // 1 ms per MB: the cut moves to the small tensor
  plan = balanced_partition(costs, 2, o);
  EXPECT_EQ(plan.partition, (Partition{{0, 1}, {1, 4}}));
  EXPECT_DOUBLE_EQ(plan.stages[0].send_ms, 1.0);
  EXPECT_DOUBLE_EQ(plan.stages[0].time_ms, 2.0);
  EXPECT_EQ(plan.stages[1].send_ms, 0.0);  // the last stage sends nothing
  EXPECT_EQ(plan.slowest_ms, 3.0);
  o.micro_batch_size = 4;  // times and bytes scale with the micro-batch
  plan = balanced_partition(costs, 2, o);
  EXPECT_DOUBLE_EQ(plan.stages[0].send_ms, 4.0);
  EXPECT_EQ(plan.slowest_ms, 12.0);
}

TEST(Partition, UniformAndStrings) {
  EXPECT_EQ(uniform_partition(12, 5), (Partition{{0, 3}, {3, 6}, {6, 8}, {8, 10}, {10, 12}}));
  EXPECT_EQ(uniform_partition(3, 3), (Partition{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_ERROR(uniform_partition(12, 13), "cannot cut 12 layers into 13 stages");
  EXPECT_ERROR(balanced_partition(uniform_costs(3), 4, {}), "cannot cut 3 layers into 4 stages");
  const Partition p = parse_partition("0-3,4-10,fc2", kCnnNames, 3);
  EXPECT_EQ(partition_string(p, kCnnNames), "conv1-pool1,conv2-relu3,fc2");
  EXPECT_EQ(parse_partition(partition_string(p, kCnnNames), kCnnNames, 3), p);
}

TEST(Partition, ParsesIndicesNamesAndMixes) {
  const Partition expected = {{0, 4}, {4, 12}};
  EXPECT_EQ(parse_partition("0-3,4-11", kCnnNames, 2), expected);
  EXPECT_EQ(parse_partition("conv1-pool1, conv2-fc2", kCnnNames, 2), expected);
  EXPECT_EQ(parse_partition("0-pool1,conv2-11", kCnnNames, 2), expected);
  EXPECT_EQ(parse_partition("0-10,11", kCnnNames, 2), (Partition{{0, 11}, {11, 12}}));
  // Names holding dashes.
  const std::vector<std::string> dashed = {"a-b", "c", "d-e"};
  EXPECT_EQ(parse_partition("a-b,c-d-e", dashed, 2), (Partition{{0, 1}, {1, 3}}));
  EXPECT_EQ(parse_partition("a-b-c,d-e", dashed, 2), (Partition{{0, 2}, {2, 3}}));
}

TEST(Partition, ManualErrorsNameTheRange) {
  EXPECT_ERROR(parse_partition("0-3,4-11", kCnnNames, 3),
               "--partition '0-3,4-11' has 2 ranges for 3 stages");
  EXPECT_ERROR(parse_partition("0-3,5-11", kCnnNames, 2),
               "--partition range '5-11' leaves a gap: layers 4 (conv2) to 4 (conv2) belong to "
               "no stage");
  EXPECT_ERROR(parse_partition("2-11", kCnnNames, 1),
               "--partition range '2-11' leaves a gap: layers 0 (conv1) to 1 (bn1) belong to no "
               "stage");
  EXPECT_ERROR(parse_partition("0-4,4-11", kCnnNames, 2),
               "--partition range '4-11' overlaps the previous range: layer 4 (conv2) is already "
               "in stage 0");
  EXPECT_ERROR(parse_partition("0-3,7-4,8-11", kCnnNames, 3),
               "--partition range '7-4' is empty: it ends at layer 4 (conv2) before it begins at "
               "layer 7 (pool2)");
  EXPECT_ERROR(parse_partition("0-3,4-10", kCnnNames, 2),
               "--partition range '4-10' ends at layer 10 (relu3) but the model has 12 layers: "
               "layers 11 (fc2) to 11 (fc2) belong to no stage");
  EXPECT_ERROR(parse_partition("0-3,conv9-fc2", kCnnNames, 2),
               "--partition range 'conv9-fc2': no layer is named 'conv9'");
  EXPECT_ERROR(parse_partition("0-3,4-12", kCnnNames, 2),
               "--partition range '4-12': layer index 12 is out of range (the model has 12 "
               "layers, 0-11)");
  EXPECT_ERROR(parse_partition("0-11,", kCnnNames, 2),
               "--partition '0-11,': stage 1 has an empty range");
  EXPECT_ERROR(parse_partition("fc3", kCnnNames, 1),
               "--partition range 'fc3': no layer is named 'fc3'");
  EXPECT_ERROR(parse_partition("0-11", kCnnNames, 13), "cannot cut 12 layers into 13 stages");
}

TEST(Partition, EvaluateRejectsPartitionsThatDoNotCover) {
  EXPECT_ERROR(evaluate_partition(uniform_costs(4), {{0, 2}, {3, 4}}, {}),
               "stage 1 holds layers [3, 4), expected a non-empty range starting at layer 2");
  EXPECT_ERROR(evaluate_partition(uniform_costs(4), {{0, 2}, {2, 3}}, {}),
               "the stages end at layer 3 of 4");
}

// A small model, profiled for real: the JSON round trip gives the live profile's costs.
TEST(Partition, ProfileJsonRoundTripAndModelMatch) {
  graph::Model m("m", {1, 6, 6});
  m.add(std::make_unique<graph::Conv2dLayer>("conv", Shape{1, 6, 6}, 2, 3, 3, ops::Conv2dParams{},
                                             true));
  m.add(std::make_unique<graph::ReluLayer>("relu"));
  m.add(std::make_unique<graph::FlattenLayer>("flat"));
  m.add(std::make_unique<graph::LinearLayer>("fc", 32, 3, true));
  graph::ParamStore store(m, 0, m.size(), default_cpu_allocator());
  store.initialize(1);
  graph::LayerProfiler profiler(m);
  ExecContext ctx;
  const Tensor x = testing::random_tensor({4, 1, 6, 6}, 1, -1, 1, DType::kF32);
  const Tensor y = Tensor::from_vector<int64_t>({0, 1, 2, 0}, {4});
  for (int i = 0; i < 2; ++i) graph::train_forward_backward(ctx, m, x, y, {}, {}, &profiler);

  const std::vector<LayerCost> live = layer_costs(profiler.layers());
  const std::vector<LayerCost> read = parse_profile_json(profiler.to_json(), "test");
  ASSERT_EQ(read.size(), 4u);
  for (size_t l = 0; l < 4; ++l) {
    EXPECT_EQ(read[l].name, m.layer(l).name());
    EXPECT_DOUBLE_EQ(read[l].forward_ms, live[l].forward_ms);
    EXPECT_DOUBLE_EQ(read[l].backward_ms, live[l].backward_ms);
    EXPECT_DOUBLE_EQ(read[l].output_bytes, live[l].output_bytes);
    EXPECT_DOUBLE_EQ(read[l].activation_bytes, live[l].activation_bytes);
    EXPECT_EQ(read[l].param_bytes, live[l].param_bytes);
  }
  EXPECT_EQ(read[0].output_bytes, 2.0 * 4 * 4 * 4);  // (2, 4, 4) f32 per sample
  EXPECT_EQ(read[3].param_bytes, (32.0 * 3 + 3) * 4);
  EXPECT_GT(read[0].forward_ms, 0.0);
  check_profile_matches(read, m, "test");

  std::vector<LayerCost> renamed = read;
  renamed[2].name = "flatten";
  EXPECT_ERROR(check_profile_matches(renamed, m, "'p.json'"),
               "profile 'p.json' does not match model m: layer 2 is 'flatten' in the profile but "
               "'flat' in the model");
  std::vector<LayerCost> shorter(read.begin(), read.begin() + 3);
  EXPECT_ERROR(check_profile_matches(shorter, m, "'p.json'"),
               "the profile has 3 layers, the model 4; the first without a match is layer 3 'fc'");

  EXPECT_ERROR(parse_profile_json("{\"layers\": [", "'p.json'"), "profile 'p.json' is not valid");
  EXPECT_ERROR(parse_profile_json("{\"layers\": [{\"name\": \"a\"}]}", "'p.json'"),
               "profile 'p.json': layers[0] lacks the number \"forward_ms_per_sample\"");
  EXPECT_ERROR(parse_profile_json("[]", "'p.json'"), "expected an object with a \"layers\" array");
  EXPECT_ERROR(read_profile_file("/nonexistent/p.json"),
               "cannot read profile '/nonexistent/p.json'");
}

}  // namespace
}  // namespace strata::parallel
