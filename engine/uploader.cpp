#include "engine/uploader.h"

namespace strata {
namespace {

constexpr size_t kMaxInFlight = 16;  // staging buffers; the oldest is waited for beyond this

}  // namespace

Uploader::Uploader(ExecContext& ctx) : ctx_(ctx) {
  if (ctx.device().is_cuda()) pinned_ = std::make_unique<cuda::PinnedHostAllocator>();
}

Uploader::~Uploader() {
  for (Staged& s : staged_) s.copied->synchronize();
  staged_.clear();  // back to the cache, then the cache to the system
}

void Uploader::reclaim(bool wait_for_oldest) {
  if (wait_for_oldest && !staged_.empty()) staged_.front().copied->synchronize();
  while (!staged_.empty() && staged_.front().copied->done()) {
    spare_events_.push_back(std::move(staged_.front().copied));
    staged_.pop_front();
  }
}

Tensor Uploader::upload(const Tensor& t) {
  if (!t.defined() || t.device() == ctx_.device()) return t;
  if (!ctx_.device().is_cuda() || !t.device().is_cpu()) return to_allocator(t, ctx_.allocator());
  reclaim(staged_.size() >= kMaxInFlight);
  Staged s;
  s.pinned = Tensor::empty(t.shape(), t.dtype(), pinned_.get());
  s.pinned.copy_from(t);  // host to host: gathers a strided view too
  Tensor out = Tensor::empty(t.shape(), t.dtype(), &ctx_.allocator());
  void* stream = cuda::exec_stream(ctx_.cuda());
  cuda::memcpy_async(out.raw_data(), s.pinned.raw_data(), t.nbytes(), stream);
  if (spare_events_.empty()) {
    s.copied = std::make_unique<cuda::HostEvent>(ctx_.device().index);
  } else {
    s.copied = std::move(spare_events_.back());
    spare_events_.pop_back();
  }
  s.copied->record(stream);
  staged_.push_back(std::move(s));
  return out;
}

}  // namespace strata
