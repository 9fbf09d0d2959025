// AdpsgdSync: seeded random matchings.
#include "parallel/sdpipe/adpsgd_sync.h"

#include <algorithm>
#include <numeric>

#include "engine/check.h"
#include "parallel/sdpipe/sdpipe_sync.h"

namespace strata::parallel::sdpipe {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int adpsgd_partner(uint64_t seed, int64_t update, int replicas, int replica) {
  std::vector<int> order(static_cast<size_t>(replicas));
  std::iota(order.begin(), order.end(), 0);
  uint64_t state = mix(mix(seed) ^ static_cast<uint64_t>(update));
  for (int i = replicas - 1; i > 0; --i) {
    state = mix(state);
    std::swap(order[i], order[state % static_cast<uint64_t>(i + 1)]);
  }
  const int at = static_cast<int>(std::find(order.begin(), order.end(), replica) - order.begin());
  const int mate = at ^ 1;
  return mate < replicas ? order[mate] : -1;
}

AdpsgdSync::AdpsgdSync(const UpdateSyncContext& c)
    : ctx_(*c.ctx),
      store_(*c.store),
      stage_(c.stage),
      replica_(c.group),
      replicas_(c.groups),
      seed_(c.seed) {
  STRATA_CHECK(c.dp != nullptr) << "--sync adpsgd needs the stage's data-parallel communicator";
  averager_ = std::make_unique<GroupAverager>(c.dp->split(0, c.group));
}

void AdpsgdSync::after_update(int64_t update) {
  const int partner = adpsgd_partner(seed_, update, replicas_, replica_);
  ++stats_.groups;
  if (partner < 0) {
    ++stats_.members;
    return;
  }
  stats_.members += 2;
  const int a = std::min(replica_, partner), b = std::max(replica_, partner);
  averager_->average(ctx_, {a, b}, static_cast<int64_t>(a) * replicas_ + b, replica_tensors(store_),
                     "AD-PSGD averaging of update " + std::to_string(update + 1) + " of stage " +
                         std::to_string(stage_));
  store_.load_working(ctx_);
}

void AdpsgdSync::finish() {
  if (finished_) return;
  finished_ = true;
  averager_->average_all(ctx_, replica_tensors(store_),
                         "the final average of stage " + std::to_string(stage_));
  store_.load_working(ctx_);
}

}  // namespace strata::parallel::sdpipe
