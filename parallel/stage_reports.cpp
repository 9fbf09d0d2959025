// What the trainers report from every rank (parallel/trainer.h): the summed evaluation, and
// every rank's StageReport as one all-reduce of a rank-by-field table, each rank filling its row.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/trainer.h"

namespace strata::parallel {

EvalRecord summed_eval_record(const std::vector<double>& sums, int64_t step, int64_t epoch,
                              double seconds) {
  STRATA_CHECK_EQ(sums.size(), 4u) << "summed_eval_record: {loss, counted, top-1, top-5}";
  EvalRecord r;
  r.split = "test";
  r.step = step;
  r.epoch = epoch;
  r.samples = static_cast<int64_t>(sums[1]);
  const double n = std::max(sums[1], 1.0);
  r.loss = sums[0] / n;
  r.accuracy = sums[2] / n;
  r.top5 = sums[3] / n;
  r.seconds = seconds;
  return r;
}

std::vector<StageReport> gather_stage_reports(Communicator* world, int rank,
                                              const StageReport& mine) {
  const auto row = [](const StageReport& s) {
    return std::vector<double>{static_cast<double>(s.group),
                               static_cast<double>(s.stage),
                               static_cast<double>(s.first_layer),
                               static_cast<double>(s.end_layer),
                               s.busy_seconds,
                               s.wall_seconds,
                               s.peak_bytes,
                               s.swapped_bytes,
                               s.swap_pool_peak_bytes,
                               s.recompute_seconds,
                               s.swap_wait_seconds,
                               s.max_micro_batches,
                               s.injected_seconds,
                               s.slow_seconds,
                               s.grow_seconds,
                               s.load_seconds};
  };
  const std::vector<double> own = row(mine);
  const size_t fields = own.size();
  const int n = world != nullptr ? world->size() : 1;
  std::vector<double> all(static_cast<size_t>(n) * fields, 0.0);
  std::copy(own.begin(), own.end(), all.begin() + static_cast<std::ptrdiff_t>(rank * fields));
  if (n > 1) {
    Tensor t = Tensor::from_vector(all, {static_cast<int64_t>(all.size())});
    world->all_reduce(t)->wait(world->timeout(), "stage reports");
    all = t.to_vector<double>();
  }
  std::vector<StageReport> reports;
  for (int r = 0; r < n; ++r) {
    const double* f = all.data() + static_cast<size_t>(r) * fields;
    StageReport s;
    s.rank = r;
    s.group = static_cast<int>(f[0]);
    s.stage = static_cast<int>(f[1]);
    s.first_layer = static_cast<size_t>(f[2]);
    s.end_layer = static_cast<size_t>(f[3]);
    s.busy_seconds = f[4];
    s.wall_seconds = f[5];
    s.peak_bytes = f[6];
    s.swapped_bytes = f[7];
    s.swap_pool_peak_bytes = f[8];
    s.recompute_seconds = f[9];
    s.swap_wait_seconds = f[10];
    s.max_micro_batches = f[11];
    s.injected_seconds = f[12];
    s.slow_seconds = f[13];
    s.grow_seconds = f[14];
    s.load_seconds = f[15];
    reports.push_back(s);
  }
  return reports;
}

}  // namespace strata::parallel
