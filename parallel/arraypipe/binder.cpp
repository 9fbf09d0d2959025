#include "parallel/arraypipe/binder.h"

#include "engine/check.h"

namespace strata::parallel::arraypipe {

Binder::Binder(graph::Model& model, size_t begin, size_t end, Allocator& allocator, DType compute)
    : model_(model), begin_(begin), end_(end), allocator_(allocator), compute_(compute) {
  STRATA_CHECK(begin < end && end <= model.size())
      << "binder: layers [" << begin << ", " << end << ") of a model of " << model.size();
}

int Binder::add_job(uint64_t seed, size_t slots) {
  // The store's constructor binds the layers to it: the new job is bound now.
  auto store =
      std::make_unique<graph::ParamStore>(model_, begin_, end_, allocator_, DType::kF32, compute_);
  store->initialize(seed);
  store->ensure_state(slots);
  stores_.push_back(std::move(store));
  bound_ = static_cast<int>(stores_.size()) - 1;
  return bound_;
}

void Binder::bind(int job) {
  STRATA_CHECK(job >= 0 && job < jobs()) << "binder: job " << job << " of " << jobs();
  if (job == bound_) return;
  stores_[static_cast<size_t>(job)]->bind_layers();
  bound_ = job;
  ++switches_;
}

void Binder::unbind() {
  if (bound_ < 0) return;
  const graph::ParamStore* owner = stores_[static_cast<size_t>(bound_)].get();
  for (size_t i = begin_; i < end_; ++i) model_.layer(i).unbind(owner);
  bound_ = -1;
}

graph::ParamStore& Binder::store(int job) {
  STRATA_CHECK(job >= 0 && job < jobs()) << "binder: job " << job << " of " << jobs();
  return *stores_[static_cast<size_t>(job)];
}

}  // namespace strata::parallel::arraypipe
