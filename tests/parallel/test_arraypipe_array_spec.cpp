// --array SPEC|FILE and --array-mode grid|list (parallel/arraypipe/array_spec.h), good and bad
// input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>

#include "engine/check.h"
#include "parallel/arraypipe/array_spec.h"

namespace strata::parallel::arraypipe {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

#define EXPECT_ERROR(statement, text)                                   \
  EXPECT_NE(error_of([&] { statement; }).find(text), std::string::npos) \
      << error_of([&] { statement; })

TEST(ArraySpec, ListModeTakesTheIthValuesTogether) {
  const auto jobs =
      parse_array_spec("lr=1e-3,3e-3,2e-3;weight-decay=0,0.1,0;batch-size=8,8,4", ArrayMode::kList);
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[1].index, 1);
  EXPECT_DOUBLE_EQ(*jobs[1].lr, 3e-3);
  EXPECT_DOUBLE_EQ(*jobs[1].weight_decay, 0.1);
  EXPECT_EQ(*jobs[2].batch_size, 4);
  EXPECT_FALSE(jobs[0].momentum.has_value());
  EXPECT_FALSE(jobs[0].seed.has_value());
  EXPECT_EQ(describe_job(jobs[2]), "lr=0.002 weight-decay=0 batch-size=4");
}

TEST(ArraySpec, GridModeTakesEveryCombinationFirstSettingSlowest) {
  const auto jobs =
      parse_array_spec(" lr = 1e-3 , 1e-2 ; momentum=0.9,0.99,0 ; seed=7", ArrayMode::kGrid);
  ASSERT_EQ(jobs.size(), 6u);
  EXPECT_DOUBLE_EQ(*jobs[0].lr, 1e-3);
  EXPECT_DOUBLE_EQ(*jobs[0].momentum, 0.9);
  EXPECT_DOUBLE_EQ(*jobs[1].momentum, 0.99);
  EXPECT_DOUBLE_EQ(*jobs[2].momentum, 0);
  EXPECT_DOUBLE_EQ(*jobs[3].lr, 1e-2);
  EXPECT_DOUBLE_EQ(*jobs[3].momentum, 0.9);
  for (const ArrayJob& j : jobs) EXPECT_EQ(*j.seed, 7u);
  EXPECT_EQ(parse_array_mode("grid"), ArrayMode::kGrid);
  EXPECT_EQ(parse_array_mode("list"), ArrayMode::kList);
}

TEST(ArraySpec, ListModeSpreadsASingleValue) {
  const auto jobs = parse_array_spec("lr=1,2;batch-size=16", ArrayMode::kList);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(*jobs[1].batch_size, 16);
}

TEST(ArraySpec, BadSpecsNameTheJobAndTheSetting) {
  EXPECT_ERROR(parse_array_spec("lr=1e-3;momentun=0.9", ArrayMode::kGrid),
               "unknown setting 'momentun'; valid: lr, weight-decay, momentum, batch-size, seed");
  EXPECT_ERROR(parse_array_spec("lr=;batch-size=8", ArrayMode::kGrid),
               "empty grid: setting 'lr' has no values");
  EXPECT_ERROR(parse_array_spec("", ArrayMode::kGrid), "empty spec");
  EXPECT_ERROR(parse_array_spec("lr=1,,2", ArrayMode::kGrid),
               "setting 'lr': value 2 of 3 is empty");
  EXPECT_ERROR(parse_array_spec("lr=1;;batch-size=2", ArrayMode::kGrid), "setting 2 is empty");
  EXPECT_ERROR(parse_array_spec("lr=1,2,3;weight-decay=0,0.1", ArrayMode::kList),
               "--array-mode list: setting 'weight-decay' has 2 values but 'lr' has 3");
  EXPECT_ERROR(parse_array_spec("lr=1e-3,3e-x", ArrayMode::kList),
               "job 1: setting 'lr': '3e-x' is not a number");
  EXPECT_ERROR(parse_array_spec("batch-size=8;lr=1,2,-1", ArrayMode::kGrid),
               "job 2: setting 'lr': -1 is not a learning rate");
  EXPECT_ERROR(parse_array_spec("batch-size=8,8.5", ArrayMode::kList),
               "job 1: setting 'batch-size': '8.5' is not a non-negative integer");
  EXPECT_ERROR(parse_array_spec("batch-size=0", ArrayMode::kList),
               "job 0: setting 'batch-size': 0 is not a positive batch size");
  EXPECT_ERROR(parse_array_spec("momentum=0.5,1", ArrayMode::kList),
               "job 1: setting 'momentum': 1 is outside [0, 1)");
  EXPECT_ERROR(parse_array_spec("weight-decay=-0.1", ArrayMode::kList),
               "job 0: setting 'weight-decay': -0.1 is negative");
  EXPECT_ERROR(parse_array_spec("seed=-3", ArrayMode::kList),
               "job 0: setting 'seed': '-3' is not a non-negative integer");
  EXPECT_ERROR(parse_array_spec("lr=1;lr=2", ArrayMode::kList), "setting 'lr' given twice");
  EXPECT_ERROR(parse_array_spec("lr", ArrayMode::kList), "setting 'lr' has no '='");
  EXPECT_ERROR(parse_array_mode("zip"), "--array-mode: unknown mode 'zip'; valid: grid, list");
  EXPECT_ERROR(parse_array_spec("lr=1,2,3,4,5,6,7,8;seed=1,2,3,4,5,6,7,8;weight-decay=1,2,3,4,5,6,"
                                "7,8;momentum=0,0.1,0.2,0.3,0.4,0.5,0.6,0.7;batch-size=1,2,3",
                                ArrayMode::kGrid),
               "the grid has more than 4096 jobs");
}

TEST(ArraySpec, FileHoldsOneJobPerLine) {
  const auto jobs = parse_array_lines(
      "# sweep\nlr=1e-3 weight-decay=0.1 batch-size=8\n\nlr=2e-3, momentum=0.9\tseed=3\n",
      "jobs.txt");
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(*jobs[0].batch_size, 8);
  EXPECT_DOUBLE_EQ(*jobs[1].momentum, 0.9);
  EXPECT_EQ(*jobs[1].seed, 3u);
  EXPECT_FALSE(jobs[1].batch_size.has_value());
  EXPECT_ERROR(parse_array_lines("lr=1\n\nlr=2 batch=4\n", "jobs.txt"),
               "jobs.txt:3 (job 1): unknown setting 'batch'");
  EXPECT_ERROR(parse_array_lines("lr=1\nlr=abc\n", "jobs.txt"),
               "jobs.txt:2 (job 1): setting 'lr': 'abc' is not a number");
  EXPECT_ERROR(parse_array_lines("lr=1 lr=2\n", "jobs.txt"),
               "jobs.txt:1 (job 0): setting 'lr' given twice");
  EXPECT_ERROR(parse_array_lines("lr\n", "jobs.txt"), "jobs.txt:1 (job 0): 'lr' is not NAME=VALUE");
  EXPECT_ERROR(parse_array_lines("# nothing\n\n", "jobs.txt"), "jobs.txt: holds no job");
}

TEST(ArraySpec, ArgumentIsAFileWhenOneExists) {
  const std::string path =
      ::testing::TempDir() + "/arraypipe_jobs_" + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream out(path);
    out << "lr=0.1 batch-size=4\nlr=0.2 batch-size=6\n";
  }
  const auto jobs = parse_array_argument(path, ArrayMode::kGrid);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_DOUBLE_EQ(*jobs[1].lr, 0.2);
  EXPECT_ERROR(check_array_batch_sizes(jobs, 8, 4, "data-parallel groups"),
               "job 1: setting 'batch-size': 6 does not divide into 4 data-parallel groups");
  check_array_batch_sizes(jobs, 8, 2, "data-parallel groups");
  EXPECT_ERROR(check_array_batch_sizes({ArrayJob{}}, 6, 4, "groups"),
               "job 0: setting 'batch-size': 6 (the run's --batch-size) does not divide");
  std::remove(path.c_str());
  EXPECT_ERROR(parse_array_argument(path, ArrayMode::kGrid), "no such file, and not a spec");
  EXPECT_EQ(parse_array_argument("lr=1,2", ArrayMode::kGrid).size(), 2u);
  EXPECT_ERROR(read_array_file(path), "cannot read job file");
}

}  // namespace
}  // namespace strata::parallel::arraypipe
