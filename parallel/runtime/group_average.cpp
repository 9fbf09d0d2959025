// GroupAverager: sum over the group's communicator, then a multiplication by 1/|S| on every
// member. The all-reduce gives every member the same sum (parallel/comm/communicator.h), and the
// scaling is one rounding of the same product on each, so the members end bitwise identical. The
// mean over all replicas is kept to rounding: the members' new values add up to their old sum
// times |S| x (1/|S|) (exact when |S| is a power of two, one rounding per element otherwise).
#include "parallel/runtime/group_average.h"

#include <algorithm>
#include <chrono>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "ops/optimizer.h"

namespace strata::parallel {
namespace {

std::string members_str(const std::vector<int>& members) {
  std::string s = "{";
  for (size_t i = 0; i < members.size(); ++i) s += (i ? "," : "") + std::to_string(members[i]);
  return s + "}";
}

}  // namespace

GroupAverager::GroupAverager(std::unique_ptr<Communicator> peers) : peers_(std::move(peers)) {
  STRATA_CHECK(peers_ != nullptr) << "GroupAverager: no communicator of the stage's replicas";
}

void GroupAverager::average(ExecContext& ctx, const std::vector<int>& members, int64_t key,
                            const std::vector<Tensor>& tensors, const std::string& what) {
  STRATA_CHECK(std::is_sorted(members.begin(), members.end()) &&
               std::binary_search(members.begin(), members.end(), rank()))
      << "GroupAverager: replica " << rank() << " was asked to average with "
      << members_str(members) << " (ascending ranks including its own)";
  if (members.size() < 2) return;
  STRATA_CHECK(key >= 0) << "GroupAverager: negative communicator key " << key;
  const auto start = std::chrono::steady_clock::now();
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    Entry e;
    e.members = members;
    e.comm = peers_->subgroup(members, static_cast<int>(key % 32768));
    it = cache_.emplace(key, std::move(e)).first;
    ++stats_.created;
    stats_.live = static_cast<int64_t>(cache_.size());
  } else {
    STRATA_CHECK(it->second.members == members)
        << "GroupAverager: communicator key " << key << " is cached for the replicas "
        << members_str(it->second.members) << ", not " << members_str(members);
    ++stats_.reused;
  }
  reduce(ctx, *it->second.comm, static_cast<int>(members.size()), tensors,
         what + " (replicas " + members_str(members) + ")");
  ++stats_.averages;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GroupAverager::average_all(ExecContext& ctx, const std::vector<Tensor>& tensors,
                                const std::string& what) {
  if (size() < 2) return;
  reduce(ctx, *peers_, size(), tensors, what + " (every replica)");
}

void GroupAverager::release(int64_t key) {
  if (cache_.erase(key) > 0) {
    ++stats_.released;
    stats_.live = static_cast<int64_t>(cache_.size());
  }
}

void GroupAverager::reduce(ExecContext& ctx, Communicator& comm, int members,
                           const std::vector<Tensor>& tensors, const std::string& what) {
  // A stream-ordered backend (nccl) starts after the work queued so far on the compute stream
  // (the local update); the others synchronize the device themselves.
  if (comm.stream_ordered()) comm.set_caller_stream(cuda::exec_stream(ctx.cuda()));
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    STRATA_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64)
        << "GroupAverager: " << what << ": cannot average a " << dtype_name(t.dtype()) << " tensor";
    comm.all_reduce(t)->wait(comm.timeout(), what);
    ops::scale_gradients(ctx, {t}, 1.0 / static_cast<double>(members));
  }
}

}  // namespace strata::parallel
