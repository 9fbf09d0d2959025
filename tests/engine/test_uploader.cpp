// The Uploader's ordering, on the CPU, with a fake device queue that runs its copies only when
// told to (a device lagging behind the host): page-locked batches are sent in place and held until
// their copy has run, pageable ones are staged, fences are reclaimed in upload order, and no host
// memory a copy still has to read is ever freed or reused. The same on a real GPU:
// Uploader.CpuTensorsStayAndCudaCopiesArriveIntact (test_cuda_engine).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/uploader.h"
#include "io/data_loader.h"
#include "io/synthetic.h"

namespace strata {
namespace {

// Page-locked host memory as far as the Uploader can tell, with a LIFO cache (a freed block is the
// next one handed out, so memory released too early would be overwritten at once), and a record
// of every block freed while a copy still had to read it.
class FakePinned final : public Allocator {
 public:
  ~FakePinned() override {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
  }
  void* allocate(size_t nbytes, const char* what) override {
    reserve(nbytes, what);
    std::vector<void*>& cached = free_[nbytes];
    void* p = nullptr;
    if (!cached.empty()) {
      p = cached.back();
      cached.pop_back();
    } else {
      p = std::malloc(nbytes == 0 ? 1 : nbytes);
    }
    live_.insert(p);
    return p;
  }
  void deallocate(void* p, size_t nbytes) override {
    if (pending_reads != nullptr) {  // a copy still to run reads somewhere in [p, p + nbytes)
      auto first = pending_reads->lower_bound(p);
      if (first != pending_reads->end() && *first < static_cast<const char*>(p) + nbytes) {
        ++freed_while_read;
      }
    }
    live_.erase(p);
    free_[nbytes].push_back(p);
    release(nbytes);
  }
  Device device() const override { return Device::cpu(); }
  bool page_locked() const override { return true; }
  bool live(const void* p) const { return live_.count(const_cast<void*>(p)) > 0; }

  const std::multiset<const void*>* pending_reads = nullptr;  // the queue's unfinished copies
  int freed_while_read = 0;

 private:
  std::map<size_t, std::vector<void*>> free_;
  std::set<void*> live_;
};

// A device that runs its copies in order when run_until() says so; fences are sequence numbers.
class FakeQueue final : public UploadQueue {
 public:
  struct Copy {
    Tensor dst;
    const void* src;
    size_t nbytes;
  };
  struct Log {
    std::deque<Copy> pending;
    std::multiset<const void*> reading;  // sources of pending copies
    size_t enqueued = 0, ran = 0;
    std::vector<const void*> order;  // sources, in the order the copies ran
    void run_until(size_t n) {
      while (ran < n) {
        Copy c = pending.front();
        pending.pop_front();
        std::memcpy(c.dst.raw_data(), c.src, c.nbytes);
        reading.erase(reading.find(c.src));
        order.push_back(c.src);
        ++ran;
      }
    }
  };

  FakeQueue(std::shared_ptr<Log> log, FakePinned* staging)
      : log_(std::move(log)), staging_(staging) {
    staging_->pending_reads = &log_->reading;
  }
  Tensor device_tensor(const Shape& shape, DType dtype) override {
    return Tensor::empty(shape, dtype);
  }
  Allocator& staging_allocator() override { return *staging_; }
  void copy(const Tensor& dst, const Tensor& src) override {
    log_->pending.push_back({dst, src.raw_data(), src.nbytes()});
    log_->reading.insert(src.raw_data());
    ++log_->enqueued;
  }
  std::unique_ptr<Fence> fence(std::unique_ptr<Fence> reuse) override {
    return std::make_unique<SeqFence>(log_, log_->enqueued);
  }

 private:
  struct SeqFence final : Fence {
    SeqFence(std::shared_ptr<Log> l, size_t s) : log(std::move(l)), seq(s) {}
    bool done() const override { return log->ran >= seq; }
    void wait() const override { log->run_until(seq); }
    std::shared_ptr<Log> log;
    size_t seq;
  };
  std::shared_ptr<Log> log_;
  FakePinned* staging_;
};

struct Rig {
  FakePinned pinned;
  std::shared_ptr<FakeQueue::Log> log = std::make_shared<FakeQueue::Log>();
  std::unique_ptr<Uploader> up;
  Rig() {
    up = std::make_unique<Uploader>(Device::cuda(0), std::make_unique<FakeQueue>(log, &pinned));
  }
};

TEST(UploaderOrder, PageLockedBatchesAreSentInPlaceAndHeldUntilCopied) {
  Rig r;
  Tensor batch = Tensor::full({4, 8}, 3.0, DType::kF32, &r.pinned);
  const void* bytes = batch.raw_data();
  const Tensor out = r.up->upload(batch.narrow(0, 1, 2));  // a micro-batch: contiguous rows
  EXPECT_EQ(r.up->sent_in_place(), 1u);
  EXPECT_EQ(r.up->staged(), 0u);
  ASSERT_EQ(r.log->pending.size(), 1u);
  EXPECT_EQ(r.log->pending.front().src, static_cast<const char*>(bytes) + 8 * sizeof(float));
  batch = Tensor();  // the data loader lets go of the batch
  EXPECT_TRUE(r.pinned.live(bytes)) << "freed before the device read it";
  r.log->run_until(1);
  EXPECT_EQ(out.to_vector<float>(), std::vector<float>(16, 3.0f));
  r.up->upload(Tensor::full({2}, 1.0, DType::kF32, &r.pinned));  // reclaims the first upload
  EXPECT_FALSE(r.pinned.live(bytes));
  EXPECT_EQ(r.up->in_flight(), 1u);
  EXPECT_EQ(r.pinned.freed_while_read, 0);
}

TEST(UploaderOrder, PageableAndStridedTensorsAreStagedAndMayChangeAtOnce) {
  Rig r;
  Tensor batch = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});  // pageable
  const Tensor a = r.up->upload(batch);
  const Tensor b = r.up->upload(batch.transpose(0, 1));
  EXPECT_EQ(r.up->staged(), 2u);
  EXPECT_EQ(r.up->sent_in_place(), 0u);
  EXPECT_NE(r.log->pending.front().src, batch.raw_data());
  batch.fill_(-1.0);  // the copies read the staging buffers, not the batch
  r.log->run_until(2);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
}

// The device never runs on its own: the uploader must wait for the oldest copy once
// kMaxInFlight are in flight, copies run in upload order, and every host block (page-locked
// batches dropped at once, staging buffers) stays untouched until its copy has run, although the
// allocator hands a freed block out again at once.
TEST(UploaderOrder, HostMemoryIsNeverFreedOrReusedBeforeItsCopyRuns) {
  Rig r;
  std::vector<Tensor> outs;
  std::vector<const void*> sources;
  for (int i = 0; i < 40; ++i) {
    const Tensor out = i % 3 == 0
                           ? r.up->upload(Tensor::full({64}, i, DType::kF32))  // pageable: staged
                           : r.up->upload(Tensor::full({64}, i, DType::kF32, &r.pinned));
    outs.push_back(out);
    sources.push_back(r.log->pending.back().src);
    EXPECT_LE(r.up->in_flight(), Uploader::kMaxInFlight);
    EXPECT_LE(r.log->enqueued - r.log->ran, Uploader::kMaxInFlight + 1);
  }
  EXPECT_GT(r.log->ran, 0u) << "never waited for the device";
  r.log->run_until(r.log->enqueued);
  EXPECT_EQ(r.log->order, sources) << "copies ran out of upload order";
  for (int i = 0; i < 40; ++i) {
    EXPECT_EQ(outs[static_cast<size_t>(i)].to_vector<float>(),
              std::vector<float>(64, static_cast<float>(i)))
        << "upload " << i;
  }
  EXPECT_EQ(r.pinned.freed_while_read, 0);
  r.up.reset();  // waits for what is left, then lets go of it
  EXPECT_EQ(r.pinned.stats().current, 0u);
}

// The data loader writes batches into the allocator it is given: with page-locked memory, every
// micro-batch of a step goes up in place.
TEST(UploaderOrder, DataLoaderBatchesInPageLockedMemoryGoUpInPlace) {
  Rig r;
  io::SyntheticImageOptions so;
  so.samples = 12;
  so.channels = 1;
  so.height = 4;
  so.width = 4;
  auto data = std::make_shared<io::SyntheticImageDataset>(io::Split::kTrain, so);
  io::DataLoaderOptions lo;
  lo.batch_size = 6;
  lo.num_workers = 1;
  lo.allocator = &r.pinned;
  io::DataLoader loader(data, lo);
  loader.start_epoch(0);
  io::Batch batch;
  int micro_batches = 0;
  while (loader.next(&batch)) {
    EXPECT_TRUE(batch.input.allocator().page_locked());
    for (int64_t begin = 0; begin < 6; begin += 3) {
      r.up->upload(batch.input.narrow(0, begin, 3));
      r.up->upload(batch.target.narrow(0, begin, 3));
      micro_batches += 2;
    }
  }
  EXPECT_EQ(r.up->sent_in_place(), static_cast<size_t>(micro_batches));
  EXPECT_EQ(r.up->staged(), 0u);
  r.up.reset();
  EXPECT_EQ(r.pinned.freed_while_read, 0);
}

}  // namespace
}  // namespace strata
