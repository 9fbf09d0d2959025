// DynPipe's paused-update migration inside async-1f1b's executor on MPI ranks (ctest runs it with
// 2 ranks), each rank against the replay of live_pause_checks.h; P, K and R are shared first.
#include <gtest/gtest.h>

#include "live_pause_checks.h"
#include "mpi_test_main.h"

namespace strata::parallel {
namespace {

using testing::mpi_world;

TEST(LivePauseMpi, MovesDownAndUpAsTheReplaySays) {
  auto world = mpi_world();
  for (const live_pause_checks::Case& c : live_pause_checks::cases(world->size())) {
    SCOPED_TRACE(c.name);
    const live_pause_checks::RankResult r = live_pause_checks::run_rank(*world, c);
    // Every rank's counters, gathered: the counts need both ends of the move.
    const std::vector<double> mine{
        static_cast<double>(r.stats.pause_at),      static_cast<double>(r.stats.take_over),
        static_cast<double>(r.stats.resume),        static_cast<double>(r.stats.buffered_grads),
        static_cast<double>(r.stats.flushed_grads), static_cast<double>(r.stats.moved_updates),
        static_cast<double>(r.stats.inputs_sent),   static_cast<double>(r.stats.replayed_backwards),
        static_cast<double>(r.stats.handoffs_sent), static_cast<double>(r.stats.handoffs_received)};
    const int64_t n = static_cast<int64_t>(mine.size());
    Tensor all = Tensor::zeros({world->size() * n}, DType::kF64);
    Tensor own = Tensor::from_vector(mine, {n});
    world->all_gather(own, all)->wait(world->timeout(), "live pause test: the counters");
    const std::vector<double> v = all.to_vector<double>();
    std::vector<LiveStageStats> stats(static_cast<size_t>(world->size()));
    for (size_t s = 0; s < stats.size(); ++s) {
      const double* x = v.data() + s * static_cast<size_t>(n);
      LiveStageStats& t = stats[s];
      t.pause_at = static_cast<int64_t>(x[0]);
      t.take_over = static_cast<int64_t>(x[1]);
      t.resume = static_cast<int64_t>(x[2]);
      t.buffered_grads = static_cast<int64_t>(x[3]);
      t.flushed_grads = static_cast<int64_t>(x[4]);
      t.moved_updates = static_cast<int64_t>(x[5]);
      t.inputs_sent = static_cast<int64_t>(x[6]);
      t.replayed_backwards = static_cast<int64_t>(x[7]);
      t.handoffs_sent = static_cast<int64_t>(x[8]);
      t.handoffs_received = static_cast<int64_t>(x[9]);
    }
    live_pause_checks::check_counts(c, stats);
    const live_pause_checks::Replay expected =
        live_pause_checks::replay(c, live_pause_checks::points(c, stats));
    live_pause_checks::check_rank(c, world->rank(), r, expected);
    world->barrier("live pause test");
  }
}

}  // namespace
}  // namespace strata::parallel
