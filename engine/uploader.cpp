#include "engine/uploader.h"

#include <utility>

#include "engine/check.h"
#include "engine/cuda_runtime.h"

namespace strata {
namespace {

// The context's stream: copies with cudaMemcpyAsync, fences as events recorded on it.
class StreamQueue final : public UploadQueue {
 public:
  explicit StreamQueue(ExecContext& ctx) : ctx_(ctx) {}

  Tensor device_tensor(const Shape& shape, DType dtype) override {
    return Tensor::empty(shape, dtype, &ctx_.allocator());
  }
  Allocator& staging_allocator() override { return ctx_.host_allocator(); }
  void copy(const Tensor& dst, const Tensor& src) override {
    cuda::memcpy_async(dst.raw_data(), src.raw_data(), src.nbytes(), stream());
  }
  std::unique_ptr<Fence> fence(std::unique_ptr<Fence> reuse) override {
    std::unique_ptr<EventFence> f(static_cast<EventFence*>(reuse.release()));
    if (f == nullptr) f = std::make_unique<EventFence>(ctx_.device().index);
    f->event.record(stream());
    return f;
  }

 private:
  struct EventFence final : Fence {
    explicit EventFence(int device) : event(device) {}
    bool done() const override { return event.done(); }
    void wait() const override { event.synchronize(); }
    cuda::HostEvent event;
  };
  void* stream() const { return cuda::exec_stream(ctx_.cuda()); }

  ExecContext& ctx_;
};

}  // namespace

Uploader::Uploader(ExecContext& ctx) : ctx_(&ctx), device_(ctx.device()) {
  if (ctx.device().is_cuda()) queue_ = std::make_unique<StreamQueue>(ctx);
}

Uploader::Uploader(Device device, std::unique_ptr<UploadQueue> queue)
    : device_(device), queue_(std::move(queue)) {
  STRATA_CHECK(queue_ != nullptr) << "Uploader: no upload queue";
}

Uploader::~Uploader() {
  try {
    for (Staged& s : staged_) s.copied->wait();
  } catch (const Error&) {  // the device failed; its copies will not read anything any more
  }
  staged_.clear();  // the host memory goes back to its allocator
}

void Uploader::reclaim(bool wait_for_oldest) {
  if (wait_for_oldest && !staged_.empty()) staged_.front().copied->wait();
  // In upload order: a later fence never lets an earlier upload's memory go first.
  while (!staged_.empty() && staged_.front().copied->done()) {
    spare_fences_.push_back(std::move(staged_.front().copied));
    staged_.pop_front();
  }
}

Tensor Uploader::upload(const Tensor& t) {
  if (!t.defined() || t.device() == device_) return t;
  if (queue_ == nullptr || !t.device().is_cpu()) {
    STRATA_CHECK(ctx_ != nullptr) << "Uploader: cannot move " << t.str() << " to " << device_;
    return to_allocator(t, ctx_->allocator());
  }
  reclaim(staged_.size() >= kMaxInFlight);
  Staged s;
  if (t.is_contiguous() && t.allocator().page_locked()) {
    s.host = t;  // the data loader's page-locked batch: read in place
    ++sent_in_place_;
  } else {
    s.host = Tensor::empty(t.shape(), t.dtype(), &queue_->staging_allocator());
    s.host.copy_from(t);  // host to host: gathers a strided view too
    ++staged_copies_;
  }
  Tensor out = queue_->device_tensor(t.shape(), t.dtype());
  queue_->copy(out, s.host);
  std::unique_ptr<UploadQueue::Fence> reuse;
  if (!spare_fences_.empty()) {
    reuse = std::move(spare_fences_.back());
    spare_fences_.pop_back();
  }
  s.copied = queue_->fence(std::move(reuse));
  staged_.push_back(std::move(s));
  return out;
}

}  // namespace strata
