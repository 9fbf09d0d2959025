#include "parallel/arraypipe/slot_model.h"

#include <algorithm>
#include <numeric>

#include "engine/check.h"

namespace strata::parallel::arraypipe {

double modelled_slot_peak(const SlotModelStage& stage, int slots, bool keep_grads) {
  const int jobs = static_cast<int>(stage.held_bytes.size());
  STRATA_CHECK(jobs >= 1 && stage.transient_bytes.size() == stage.held_bytes.size())
      << "slot model: " << jobs << " jobs' held bytes, " << stage.transient_bytes.size()
      << " transients";
  STRATA_CHECK(slots >= 1) << "slot model: " << slots << " slots";
  const int k = std::min(slots, jobs);
  const int states = k + (k < jobs ? 1 : 0);
  double peak = static_cast<double>(states) * stage.state_bytes;
  if (keep_grads) peak += static_cast<double>(jobs - states) * stage.grads_bytes;
  peak += std::accumulate(stage.held_bytes.begin(), stage.held_bytes.end(), 0.0);
  peak += *std::max_element(stage.transient_bytes.begin(), stage.transient_bytes.end());
  return peak;
}

SlotChoice choose_slots(const std::vector<SlotModelStage>& stages, double limit, bool keep_grads) {
  STRATA_CHECK(!stages.empty() && limit > 0) << "slot model: no stage or no limit";
  const int jobs = static_cast<int>(stages.front().held_bytes.size());
  auto peaks = [&](int k) {
    std::vector<double> p;
    for (const SlotModelStage& s : stages) p.push_back(modelled_slot_peak(s, k, keep_grads));
    return p;
  };
  SlotChoice choice;
  for (int k = jobs; k >= 1; --k) {
    const std::vector<double> p = peaks(k);
    if (*std::max_element(p.begin(), p.end()) <= limit) {
      choice.slots = k;
      choice.peak_bytes = p;
      break;
    }
  }
  if (choice.slots == 0) choice.peak_bytes = peaks(1);
  choice.worst_stage =
      static_cast<int>(std::max_element(choice.peak_bytes.begin(), choice.peak_bytes.end()) -
                       choice.peak_bytes.begin());
  return choice;
}

int largest_array(const SlotModelStage& stage, int slots, double limit, bool keep_grads) {
  const double jobs = static_cast<double>(stage.held_bytes.size());
  const double held = std::accumulate(stage.held_bytes.begin(), stage.held_bytes.end(), 0.0) / jobs;
  const double transient =
      *std::max_element(stage.transient_bytes.begin(), stage.transient_bytes.end());
  int best = 0;
  for (int n = slots; n <= (1 << 16); ++n) {
    const int states = slots + (slots < n ? 1 : 0);
    const double peak = static_cast<double>(states) * stage.state_bytes +
                        (keep_grads ? static_cast<double>(n - states) * stage.grads_bytes : 0.0) +
                        static_cast<double>(n) * held + transient;
    if (peak > limit) break;
    best = n;
  }
  return best;
}

}  // namespace strata::parallel::arraypipe
