#include <gtest/gtest.h>

#include <thread>

#include "engine/check.h"
#include "engine/log.h"

namespace strata {
namespace {

TEST(Check, MessageNamesFileLineExpressionAndReason) {
  try {
    const int layers = 3;
    STRATA_CHECK(layers > 4) << "need more layers than stages";
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("test_check_log.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("check failed: layers > 4"), std::string::npos) << m;
    EXPECT_NE(m.find("need more layers than stages"), std::string::npos) << m;
  }
}

TEST(Check, ComparisonChecksPrintOperands) {
  try {
    STRATA_CHECK_EQ(2 + 2, 5) << "arithmetic";
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(4 == 5)"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(STRATA_CHECK_LT(1, 2));
}

TEST(Check, ThrowAndDanglingElse) {
  EXPECT_THROW(STRATA_THROW() << "boom", Error);
  // The macro must not capture a following else.
  bool reached = false;
  if (true)
    STRATA_CHECK(true) << "fine";
  else
    reached = true;
  EXPECT_FALSE(reached);
}

TEST(Log, PrefixCarriesRankAndStage) {
  EXPECT_EQ(log_prefix(), "");
  set_log_rank(3);
  EXPECT_EQ(log_prefix(), "[rank 3] ");
  set_log_stage(1);
  EXPECT_EQ(log_prefix(), "[rank 3 stage 1] ");
  try {
    STRATA_CHECK(false) << "x";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[rank 3 stage 1] ", 0), 0u) << e.what();
  }
  // Ranks of the local backend are threads: each names its own, over the process's.
  std::string prefixes[2];
  std::thread threads[2];
  for (int r = 0; r < 2; ++r) {
    threads[r] = std::thread([r, &prefixes] {
      const int previous = set_thread_log_rank(r);
      prefixes[r] = log_prefix();
      set_thread_log_rank(previous);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(prefixes[0], "[rank 0] ");
  EXPECT_EQ(prefixes[1], "[rank 1] ");
  EXPECT_EQ(log_prefix(), "[rank 3 stage 1] ");  // this thread: the process's rank
  const int previous = set_thread_log_rank(-1);
  EXPECT_EQ(log_prefix(), "[stage 1] ");
  set_thread_log_rank(previous);
  set_log_rank(-1);
  set_log_stage(-1);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarn);
  EXPECT_THROW(parse_log_level("loud"), Error);
}

}  // namespace
}  // namespace strata
