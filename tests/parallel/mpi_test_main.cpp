// GoogleTest main for MPI tests (see mpi_test_main.h).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "mpi_test_main.h"

namespace strata::parallel::testing {
namespace {

MpiSession* g_session = nullptr;

// The output of a rank other than 0: its failed assertions only, with the rank and the test.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr, "[rank %d] %s.%s failed at %s:%d\n%s\n", rank_,
                 test ? test->test_suite_name() : "?", test ? test->name() : "?",
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

}  // namespace

MpiSession& mpi_session() { return *g_session; }

}  // namespace strata::parallel::testing

int main(int argc, char** argv) {
  strata::parallel::MpiSession session(&argc, &argv);
  strata::parallel::testing::g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (session.rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new strata::parallel::testing::FailurePrinter(session.rank()));
  } else {
    std::printf("%s\n", session.describe().c_str());
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int failed_anywhere = failed;
  MPI_Allreduce(&failed, &failed_anywhere, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (session.rank() == 0 && failed_anywhere && !failed) {
    std::printf("FAILED on another rank (see the [rank R] lines)\n");
  }
  return failed_anywhere;
}
