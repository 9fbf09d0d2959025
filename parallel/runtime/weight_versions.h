// Weight stashing: the older versions of a stage's parameters that micro-batches still need.
//
// async-1f1b (PipeDream) runs a micro-batch's backward on the weights its forward saw; 2bw
// (PipeDream-2BW) runs the forwards and backwards of step t on the weights of t - 1 updates
// (parallel/schedule/schedule.h). The optimizer updates the ParamStore, which must then hold the
// latest version; WeightVersions keeps copies of older versions, keyed by the number of updates
// applied to them (the executor's optimizer step count), and puts the one an instruction needs
// into the store (use), setting the latest aside the first time an older version goes in, until
// restore_latest puts it back (before an update, at the end of a program). An older version stays
// in the store for the instructions after that need it too: 2bw's last stage computes a whole step
// on one version and swaps twice per step, not twice per instruction. It counts the versions a
// stage held at once (the latest and the kept ones), so that tests can check the schedules'
// bounds (2bw: two).
//
// Weight cache (DynPipe Sec. IV-C4, --weight-cache on): the kept versions, and the latest while
// it is set aside, live in host memory (the copy engine's host pool,
// parallel/runtime/copy_engine.h) instead of the device. The device caches one kept version:
// prefetch(v) starts copying version v back ahead of the instruction that needs it (the executor
// asks for the next Forward's or Backward's version after every instruction), use waits for that
// copy (or makes it, when nothing was prefetched), copies it into the store and lets the cached
// copy go. So a stage's device holds its weights at most twice (the store's and one cached or
// returning version), whatever the number of stages; without the cache it holds every kept version
// and the latest set aside (up to S + 1 on async-1f1b's first stage, 3 under 2bw). Copies move
// whole storages bit for bit: the results are those without the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "graph/param_store.h"
#include "parallel/runtime/copy_engine.h"

namespace strata::parallel {

class WeightVersions {
 public:
  WeightVersions(ExecContext& ctx, graph::ParamStore& store) : ctx_(ctx), store_(store) {}

  // Keeps the versions in `engine`'s host pool from now on (not owned; before the first stash).
  void use_cache(CopyEngine* engine);
  bool cached_on_host() const { return engine_ != nullptr; }

  // Keeps a copy of the store's parameters, which must be the latest, as `version` (nothing when
  // it is kept already).
  void stash(int64_t version);
  bool kept(int64_t version) const { return kept_.count(version) > 0; }
  // Drops the kept versions for which `unneeded(version)` is true.
  void release_if(const std::function<bool(int64_t)>& unneeded);
  // Weight cache: starts copying kept `version` to the device (nothing when it is not kept, is
  // there or in the store already, or there is no cache); a cached other version goes.
  void prefetch(int64_t version);
  // Puts `version` into the store: the latest (`latest`, the optimizer's step count) or a kept
  // one. Throws strata::Error naming `what` and the micro-batch when an older version is not
  // kept.
  void use(int64_t version, int64_t latest, const char* what, int64_t micro_batch);
  // Puts the latest back into the store (nothing when it is there).
  void restore_latest();
  void clear();

  // Versions held now and at most so far: the latest and the kept ones (on the device or, with
  // the cache, on the host).
  int64_t held() const { return 1 + static_cast<int64_t>(kept_.size()); }
  int64_t peak() const { return peak_; }

 private:
  struct Kept {
    Tensor device;                                // no cache: the copy
    std::shared_ptr<CopyEngine::Copy> host;       // cache: the copy in the host pool
    std::shared_ptr<CopyEngine::Copy> on_device;  // cache: its copy back, while cached
  };
  // A tensor laid out like the store's parameters over `storage`.
  Tensor like_params(const std::shared_ptr<Storage>& storage) const;

  ExecContext& ctx_;
  graph::ParamStore& store_;
  CopyEngine* engine_ = nullptr;
  std::map<int64_t, Kept> kept_;
  // The latest while an older version (`resident_`) is in the store: a device copy, or with the
  // cache a copy in the host pool.
  bool latest_in_store_ = true;
  int64_t resident_ = -1;
  Tensor aside_device_;
  std::shared_ptr<CopyEngine::Copy> aside_host_;
  int64_t peak_ = 1;
};

}  // namespace strata::parallel
