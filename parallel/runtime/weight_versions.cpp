// WeightVersions: copies of older parameter versions, swapped into the store when needed, kept on
// the host with the weight cache.
#include "parallel/runtime/weight_versions.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::parallel {

void WeightVersions::use_cache(CopyEngine* engine) {
  STRATA_CHECK(kept_.empty()) << "weight cache: enabled after a version was kept";
  engine_ = engine;
}

Tensor WeightVersions::like_params(const std::shared_ptr<Storage>& storage) const {
  const Tensor& p = store_.params();
  return Tensor(storage, p.offset(), p.shape(), p.strides(), p.dtype());
}

void WeightVersions::stash(int64_t version) {
  if (kept(version)) return;
  Kept& k = kept_[version];
  if (engine_ == nullptr) {
    k.device = store_.params().clone();
  } else {
    // Straight from the store, which the next update overwrites: wait for the copy (no device
    // memory is spent on a copy of it).
    k.host = engine_->to_host(store_.params().storage());
    engine_->wait(*k.host);
  }
  peak_ = std::max(peak_, held());
}

void WeightVersions::release_if(const std::function<bool(int64_t)>& unneeded) {
  for (auto it = kept_.begin(); it != kept_.end();) {
    it = unneeded(it->first) ? kept_.erase(it) : std::next(it);
  }
}

void WeightVersions::prefetch(int64_t version) {
  if (engine_ == nullptr) return;
  auto it = kept_.find(version);
  if (it == kept_.end() || it->second.on_device != nullptr) return;
  for (auto& [v, k] : kept_) k.on_device.reset();  // one version cached at a time
  it->second.on_device = engine_->to_device(it->second.host->destination(), it->second.host);
}

WeightVersions::SetAside WeightVersions::swap_in(int64_t version, int64_t latest, const char* what,
                                                 int64_t micro_batch) {
  SetAside aside;
  if (version == latest) return aside;
  auto it = kept_.find(version);
  STRATA_CHECK(it != kept_.end()) << "executor: weight version " << version << " of " << what
                                  << "(mb " << micro_batch << ") was not stashed (latest " << latest
                                  << ")";
  if (engine_ == nullptr) {
    aside.device = store_.params().clone();
    store_.params().copy_from(it->second.device);
  } else {
    prefetch(version);  // a miss: copied now
    std::shared_ptr<CopyEngine::Copy> cached = std::move(it->second.on_device);
    aside.host = engine_->to_host(store_.params().storage());
    engine_->wait(*aside.host);  // before the store is overwritten
    engine_->order_before_compute(*cached);
    store_.params().copy_from(like_params(cached->destination()));
  }
  store_.load_working_params(ctx_);
  return aside;
}

void WeightVersions::swap_back(SetAside set_aside) {
  if (set_aside.device.defined()) {
    store_.params().copy_from(set_aside.device);
  } else if (set_aside.host != nullptr) {
    std::shared_ptr<CopyEngine::Copy> back =
        engine_->to_device(set_aside.host->destination(), set_aside.host);
    engine_->order_before_compute(*back);
    store_.params().copy_from(like_params(back->destination()));
  } else {
    return;
  }
  store_.load_working_params(ctx_);
}

}  // namespace strata::parallel
