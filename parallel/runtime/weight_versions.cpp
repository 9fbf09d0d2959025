// WeightVersions: copies of older parameter versions, put into the store when needed, kept on
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
  STRATA_CHECK(latest_in_store_) << "weight versions: version " << version
                                 << " stashed while the store holds version " << resident_;
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
  if (engine_ == nullptr || (!latest_in_store_ && version == resident_)) return;
  auto it = kept_.find(version);
  if (it == kept_.end() || it->second.on_device != nullptr) return;
  // One version cached at a time. A cached copy still in flight is waited for before it goes:
  // its device storage is allocated when the copy is queued and lives until it is done, so
  // copies abandoned behind a slow copy thread would otherwise pile up on the device (the
  // bound of two versions held on the device failed under load).
  for (auto& [v, k] : kept_) {
    if (k.on_device != nullptr && !k.on_device->done()) engine_->wait(*k.on_device);
    k.on_device.reset();
  }
  it->second.on_device = engine_->to_device(it->second.host->destination(), it->second.host);
}

void WeightVersions::use(int64_t version, int64_t latest, const char* what, int64_t micro_batch) {
  if (version == latest) {
    restore_latest();
    return;
  }
  if (!latest_in_store_ && version == resident_) return;
  auto it = kept_.find(version);
  STRATA_CHECK(it != kept_.end()) << "executor: weight version " << version << " of " << what
                                  << "(mb " << micro_batch << ") was not stashed (latest " << latest
                                  << ")";
  if (latest_in_store_) {  // set the latest aside
    if (engine_ == nullptr) {
      aside_device_ = store_.params().clone();
    } else {
      aside_host_ = engine_->to_host(store_.params().storage());
      engine_->wait(*aside_host_);  // before the store is overwritten
    }
    latest_in_store_ = false;
  }
  if (engine_ == nullptr) {
    store_.params().copy_from(it->second.device);
  } else {
    prefetch(version);  // a miss: copied now
    std::shared_ptr<CopyEngine::Copy> cached = std::move(it->second.on_device);
    engine_->order_before_compute(*cached);
    store_.params().copy_from(like_params(cached->destination()));
  }
  resident_ = version;
  store_.load_working_params(ctx_);
}

void WeightVersions::restore_latest() {
  if (latest_in_store_) return;
  if (engine_ == nullptr) {
    store_.params().copy_from(aside_device_);
    aside_device_ = Tensor();
  } else {
    std::shared_ptr<CopyEngine::Copy> back =
        engine_->to_device(aside_host_->destination(), aside_host_);
    aside_host_.reset();
    engine_->order_before_compute(*back);
    store_.params().copy_from(like_params(back->destination()));
  }
  latest_in_store_ = true;
  resident_ = -1;
  store_.load_working_params(ctx_);
}

void WeightVersions::clear() {
  restore_latest();
  kept_.clear();
}

}  // namespace strata::parallel
