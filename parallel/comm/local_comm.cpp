// Local backend: ranks are threads sharing one address space.
//
// State. A root world and every sub-world split from it form a family that shares one mutex, one
// condition variable and the abort record, so that an abort wakes every waiter of the family at
// once (waits sleep on the condition variable with their deadline; nothing polls). The mutex
// guards bookkeeping only; bytes are copied and reduced outside it.
//
// Point to point. A send copies the tensor's bytes into a u8 tensor from the default CPU
// allocator (so the bytes are accounted and the sender may reuse its tensor at once) and hands
// it to the oldest receive posted for (source, destination, tag), or queues it for the next one.
// The receiver copies the bytes into its tensor in test()/wait(): two copies, and no rank ever
// touches another rank's tensor.
//
// Collectives. The k-th collective call of every rank of a world meets in slot k. The last rank
// to post marks the slot ready; from then on the work is a fixed list of chunks that any rank
// waiting on the slot claims and runs, so a rank never waits for another rank to wait. Chunks
// touch disjoint element ranges of every rank's tensors, so in-place all_reduce is safe: chunk c
// of rank 0's tensor accumulates x0 + x1 + ... + x(N-1) (rank order, left to right), then is
// copied into chunk c of the other ranks' tensors. The formula per element does not depend on
// who runs the chunk, hence results are bitwise identical on all ranks and repeatable. Max
// propagates NaN. reduce_scatter sums rank r's slice in the same order into rank r's output.
#include "parallel/comm/local_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <tuple>

namespace strata::parallel {
namespace local_detail {

using Clock = std::chrono::steady_clock;

struct Family {
  std::mutex mutex;
  std::condition_variable changed;
  bool aborted = false;
  int failed_rank = -1;  // in the root world
  std::string failed_message;
};

struct RecvSlot {
  Tensor bytes;  // the matched message (u8), defined once matched
  bool matched = false;
};

struct Channel {
  std::deque<Tensor> messages;                     // sent, no receive posted yet
  std::deque<std::shared_ptr<RecvSlot>> receives;  // posted, no send yet
};

enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kBarrier, kSplit };

struct WorldState;

struct Collective {
  Kind kind = Kind::kBarrier;
  std::string signature;  // of the first rank to post; every rank's must be equal
  int signature_rank = -1;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<Tensor> in, out;  // per rank
  std::vector<int> color, key;  // split
  int arrived = 0;
  bool ready = false;
  std::string error;
  int64_t chunks = 0, claimed = 0, finished = 0;
  std::vector<std::shared_ptr<WorldState>> sub;  // split results per rank (null: no color)
  std::vector<int> sub_rank;
};

// A subgroup() being formed: its members arrive one by one (keyed by members and tag).
struct PendingSubgroup {
  std::shared_ptr<WorldState> sub;
  int arrived = 0;
};

struct WorldState {
  std::shared_ptr<Family> family;
  int size = 0;
  std::vector<int> root_ranks;                            // rank here -> rank in the root world
  std::string name;                                       // "" for the root world
  std::map<std::tuple<int, int, int>, Channel> channels;  // (source, destination, tag)
  std::vector<int64_t> next_collective;                   // per rank
  std::map<int64_t, std::shared_ptr<Collective>> open;    // slots not every rank has posted to
  std::map<std::pair<std::vector<int>, int>, std::shared_ptr<PendingSubgroup>> subgroups;
};

namespace {

constexpr int kMaxTag = 32768;
constexpr int64_t kChunkElements = 16384;

std::shared_ptr<WorldState> make_world(std::shared_ptr<Family> family, std::vector<int> root_ranks,
                                       std::string name) {
  auto w = std::make_shared<WorldState>();
  w->family = std::move(family);
  w->size = static_cast<int>(root_ranks.size());
  w->root_ranks = std::move(root_ranks);
  w->name = std::move(name);
  w->next_collective.assign(static_cast<size_t>(w->size), 0);
  return w;
}

// "rank 1", or "rank 0 (world rank 3) of split(color 1)" in a sub-world.
std::string who(const WorldState& w, int rank) {
  std::ostringstream s;
  s << "rank " << rank;
  if (!w.name.empty()) s << " (world rank " << w.root_ranks[rank] << ") of " << w.name;
  return s.str();
}

// Call with the family's mutex held.
void throw_if_aborted(const WorldState& w, int rank, const std::string& what,
                      const std::string& op) {
  const Family& f = *w.family;
  if (!f.aborted) return;
  throw CommAborted("local comm: " + who(w, rank) + ": " + what + " (" + op + ") aborted: rank " +
                    std::to_string(f.failed_rank) +
                    " of the local world failed: " + f.failed_message);
}

// Sleeps until done() (checked first), an abort (CommAborted) or the deadline (CommTimeout).
template <typename Done>
void block_until(std::unique_lock<std::mutex>& lock, const WorldState& w, int rank,
                 std::chrono::milliseconds timeout, Clock::time_point start,
                 const std::string& what, const std::string& op, Done done) {
  while (!done()) {
    throw_if_aborted(w, rank, what, op);
    if (timeout.count() <= 0) {
      w.family->changed.wait(lock);
    } else if (w.family->changed.wait_until(lock, start + timeout) == std::cv_status::timeout &&
               !done()) {
      throw_if_aborted(w, rank, what, op);
      throw CommTimeout("local comm: " + who(w, rank) + " timed out after " +
                        std::to_string(timeout.count()) + " ms waiting for " + what + " (" + op +
                        ")");
    }
  }
}

void abort_family(const WorldState& w, int rank, const std::string& message) {
  Family& f = *w.family;
  std::lock_guard<std::mutex> lock(f.mutex);
  if (!f.aborted) {
    f.aborted = true;
    f.failed_rank = w.root_ranks[rank];
    f.failed_message = message;
  }
  f.changed.notify_all();
}

void check_tensor(const Tensor& t, const std::string& op, const char* name) {
  STRATA_CHECK(t.defined()) << "local comm " << op << ": " << name << " is undefined";
  STRATA_CHECK(t.is_contiguous()) << "local comm " << op << ": " << name << " " << t.str()
                                  << " must be contiguous";
}

void check_reducible(const Tensor& t, const std::string& op) {
  const DType d = t.dtype();
  STRATA_CHECK(d == DType::kF32 || d == DType::kF64 || d == DType::kI32 || d == DType::kI64)
      << "local comm " << op << ": cannot reduce " << dtype_name(d)
      << " tensors (f32, f64, i32, i64)";
}

const char* op_name(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "max"; }

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.raw_data()); }

// ---- chunk work ---------------------------------------------------------------------------------

template <typename T>
void combine(T* acc, const T* x, int64_t n, ReduceOp op) {
  if (op == ReduceOp::kSum) {
    for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
  } else {
    for (int64_t i = 0; i < n; ++i) {
      // NaN wins: x != x only for NaN; an accumulated NaN is never replaced (NaN > x is false).
      if (x[i] > acc[i] || x[i] != x[i]) acc[i] = x[i];
    }
  }
}

void combine_typed(DType dtype, void* acc, const void* x, int64_t n, ReduceOp op) {
  switch (dtype) {
    case DType::kF32:
      return combine(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
    case DType::kF64:
      return combine(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
    case DType::kI32:
      return combine(static_cast<int32_t*>(acc), static_cast<const int32_t*>(x), n, op);
    case DType::kI64:
      return combine(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x), n, op);
    default:
      STRATA_THROW() << "local comm: cannot reduce " << dtype_name(dtype);
  }
}

void run_chunk(const Collective& c, int64_t index) {
  const int n_ranks = static_cast<int>(c.in.size());
  const size_t es = dtype_size(c.dtype);
  switch (c.kind) {
    case Kind::kAllReduce: {
      const int64_t n = c.in[0].numel();
      const int64_t begin = n * index / c.chunks, end = n * (index + 1) / c.chunks;
      const size_t offset = static_cast<size_t>(begin) * es;
      const size_t len = static_cast<size_t>(end - begin) * es;
      char* acc = bytes_of(c.in[0]) + offset;
      for (int q = 1; q < n_ranks; ++q) {
        combine_typed(c.dtype, acc, bytes_of(c.in[q]) + offset, end - begin, c.op);
      }
      for (int q = 1; q < n_ranks; ++q) std::memcpy(bytes_of(c.in[q]) + offset, acc, len);
      return;
    }
    case Kind::kBroadcast: {
      const int64_t n = c.in[0].numel();
      const int64_t begin = n * index / c.chunks, end = n * (index + 1) / c.chunks;
      const size_t offset = static_cast<size_t>(begin) * es;
      const size_t len = static_cast<size_t>(end - begin) * es;
      for (int q = 0; q < n_ranks; ++q) {
        if (q != c.root)
          std::memcpy(bytes_of(c.in[q]) + offset, bytes_of(c.in[c.root]) + offset, len);
      }
      return;
    }
    case Kind::kAllGather: {  // chunk r: rank r's input into slice r of every output
      const int r = static_cast<int>(index);
      const size_t len = c.in[r].nbytes();
      for (int q = 0; q < n_ranks; ++q) {
        std::memcpy(bytes_of(c.out[q]) + static_cast<size_t>(r) * len, bytes_of(c.in[r]), len);
      }
      return;
    }
    case Kind::kReduceScatter: {  // chunk r: rank r's output = sum over q of slice r of in[q]
      const int r = static_cast<int>(index);
      const int64_t m = c.out[r].numel();
      const size_t offset = static_cast<size_t>(r) * static_cast<size_t>(m) * es;
      std::memcpy(bytes_of(c.out[r]), bytes_of(c.in[0]) + offset, static_cast<size_t>(m) * es);
      for (int q = 1; q < n_ranks; ++q) {
        combine_typed(c.dtype, bytes_of(c.out[r]), bytes_of(c.in[q]) + offset, m, c.op);
      }
      return;
    }
    case Kind::kBarrier:
    case Kind::kSplit:
      return;
  }
}

// Called by the last rank to post, with the mutex held.
void make_ready(WorldState& w, Collective& c) {
  c.ready = true;
  if (!c.error.empty()) return;
  const int64_t n_ranks = w.size;
  switch (c.kind) {
    case Kind::kAllReduce:
    case Kind::kBroadcast: {
      const int64_t n = c.in[0].numel();
      c.chunks = n == 0 ? 0 : std::clamp<int64_t>(n / kChunkElements, 1, 4 * n_ranks);
      break;
    }
    case Kind::kAllGather:
    case Kind::kReduceScatter:
      c.chunks =
          (c.kind == Kind::kAllGather ? c.in[0].numel() : c.out[0].numel()) == 0 ? 0 : n_ranks;
      break;
    case Kind::kBarrier:
      break;
    case Kind::kSplit: {
      c.sub.assign(static_cast<size_t>(n_ranks), nullptr);
      c.sub_rank.assign(static_cast<size_t>(n_ranks), -1);
      std::map<int, std::vector<int>> members;  // color -> ranks
      for (int r = 0; r < n_ranks; ++r) {
        if (c.color[r] >= 0) members[c.color[r]].push_back(r);
      }
      for (auto& [color, ranks] : members) {
        std::stable_sort(ranks.begin(), ranks.end(),
                         [&](int a, int b) { return c.key[a] < c.key[b]; });
        std::vector<int> root_ranks;
        for (int r : ranks) root_ranks.push_back(w.root_ranks[r]);
        std::string name = (w.name.empty() ? std::string("the local world") : w.name) +
                           " / split(color " + std::to_string(color) + ")";
        auto sub = make_world(w.family, root_ranks, name);
        for (size_t i = 0; i < ranks.size(); ++i) {
          c.sub[ranks[i]] = sub;
          c.sub_rank[ranks[i]] = static_cast<int>(i);
        }
      }
      break;
    }
  }
}

struct Post {
  Post(Kind k, std::string s) : kind(k), signature(std::move(s)) {}
  Kind kind;
  std::string signature;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  Tensor in, out;
  int color = 0, key = 0;
};

std::shared_ptr<Collective> post(WorldState& w, int rank, Post p) {
  std::lock_guard<std::mutex> lock(w.family->mutex);
  throw_if_aborted(w, rank, "posting", p.signature);
  const int64_t seq = w.next_collective[rank]++;
  std::shared_ptr<Collective>& slot = w.open[seq];
  if (!slot) {
    slot = std::make_shared<Collective>();
    slot->kind = p.kind;
    slot->signature = p.signature;
    slot->signature_rank = rank;
    slot->dtype = p.dtype;
    slot->op = p.op;
    slot->root = p.root;
    slot->in.resize(static_cast<size_t>(w.size));
    slot->out.resize(static_cast<size_t>(w.size));
    slot->color.assign(static_cast<size_t>(w.size), -1);
    slot->key.assign(static_cast<size_t>(w.size), 0);
  } else if (p.signature != slot->signature && slot->error.empty()) {
    slot->error = "local comm: collective call #" + std::to_string(seq) + " differs between " +
                  "ranks: " + who(w, slot->signature_rank) + " called " + slot->signature + ", " +
                  who(w, rank) + " called " + p.signature;
  }
  std::shared_ptr<Collective> c = slot;
  c->in[rank] = std::move(p.in);
  c->out[rank] = std::move(p.out);
  c->color[rank] = p.color;
  c->key[rank] = p.key;
  if (++c->arrived == w.size) {
    make_ready(w, *c);
    w.open.erase(seq);
    w.family->changed.notify_all();
  }
  return c;
}

// ---- requests ---------------------------------------------------------------------------------

class DoneRequest final : public Request {
 public:
  bool test() override { return true; }
  void wait(std::chrono::milliseconds, const std::string&) override {}
};

class RecvRequest final : public Request {
 public:
  RecvRequest(std::shared_ptr<WorldState> w, int rank, Tensor t, std::shared_ptr<RecvSlot> slot,
              std::string op)
      : w_(std::move(w)),
        rank_(rank),
        t_(std::move(t)),
        slot_(std::move(slot)),
        op_(std::move(op)) {}

  bool test() override {
    if (done_) return true;
    {
      std::unique_lock<std::mutex> lock(w_->family->mutex);
      if (!slot_->matched) {
        throw_if_aborted(*w_, rank_, "test", op_);
        return false;
      }
    }
    deliver();
    return true;
  }

  void wait(std::chrono::milliseconds timeout, const std::string& what) override {
    if (done_) return;
    const Clock::time_point start = Clock::now();
    {
      std::unique_lock<std::mutex> lock(w_->family->mutex);
      block_until(lock, *w_, rank_, timeout, start, what, op_, [&] { return slot_->matched; });
    }
    deliver();
  }

 private:
  void deliver() {
    const Tensor& bytes = slot_->bytes;
    STRATA_CHECK_EQ(bytes.nbytes(), t_.nbytes())
        << "local comm: " << who(*w_, rank_) << ": " << op_ << " into " << t_.str()
        << " matched a send of a different size (bytes)";
    if (t_.nbytes() > 0) std::memcpy(t_.raw_data(), bytes.raw_data(), t_.nbytes());
    slot_->bytes = Tensor();
    done_ = true;
  }

  std::shared_ptr<WorldState> w_;
  int rank_;
  Tensor t_;  // host memory (a CUDA tensor's receive goes through a StagedRequest)
  std::shared_ptr<RecvSlot> slot_;
  std::string op_;
  bool done_ = false;
};

class CollectiveRequest final : public Request {
 public:
  CollectiveRequest(std::shared_ptr<WorldState> w, int rank, std::shared_ptr<Collective> c)
      : w_(std::move(w)), rank_(rank), c_(std::move(c)) {}

  bool test() override {
    if (done_) return true;
    std::unique_lock<std::mutex> lock(w_->family->mutex);
    if (c_->ready) {
      if (!c_->error.empty()) throw Error(c_->error);
      work(lock);
      if (c_->finished == c_->chunks) {
        done_ = true;
        return true;
      }
    }
    throw_if_aborted(*w_, rank_, "test", c_->signature);
    return false;
  }

  void wait(std::chrono::milliseconds timeout, const std::string& what) override {
    if (done_) return;
    const Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(w_->family->mutex);
    block_until(lock, *w_, rank_, timeout, start, what, c_->signature, [&] { return c_->ready; });
    if (!c_->error.empty()) throw Error(c_->error);
    work(lock);
    block_until(lock, *w_, rank_, timeout, start, what, c_->signature,
                [&] { return c_->finished == c_->chunks; });
    done_ = true;
  }

 private:
  // Claims and runs chunks until none is left unclaimed (mutex held on entry and exit).
  void work(std::unique_lock<std::mutex>& lock) {
    while (c_->claimed < c_->chunks) {
      const int64_t index = c_->claimed++;
      lock.unlock();
      run_chunk(*c_, index);
      lock.lock();
      if (++c_->finished == c_->chunks) w_->family->changed.notify_all();
    }
  }

  std::shared_ptr<WorldState> w_;
  int rank_;
  std::shared_ptr<Collective> c_;
  bool done_ = false;
};

std::string describe(const char* name, const Tensor& t) {
  std::ostringstream s;
  s << name << "(" << dtype_name(t.dtype()) << ", " << t.numel() << " elements";
  return s.str();
}

}  // namespace
}  // namespace local_detail

using local_detail::Kind;
using local_detail::Post;

// ---- LocalCommunicator --------------------------------------------------------------------------

LocalCommunicator::LocalCommunicator(std::shared_ptr<local_detail::WorldState> state, int rank)
    : state_(std::move(state)), rank_(rank) {}

LocalCommunicator::~LocalCommunicator() = default;

int LocalCommunicator::size() const { return state_->size; }

int LocalCommunicator::world_rank() const { return state_->root_ranks[rank_]; }

namespace local_detail {

// CUDA tensors: the local backend moves host memory, so a CUDA tensor goes through a host copy
// (taken after the device finished its work: the copy waits for it) and results are copied back
// when the operation completes. Slow but ordered; NCCL is the fast path between devices.
Tensor on_host(const Tensor& t) {
  return t.device().is_cpu() ? t : to_allocator(t, default_cpu_allocator());
}
Tensor host_like(const Tensor& t) {
  return t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
}

// `inner`'s operation on a host copy of a CUDA tensor: the result goes to the device tensor once
// it completes.
class StagedRequest final : public Request {
 public:
  StagedRequest(std::unique_ptr<Request> inner, Tensor host, Tensor device)
      : inner_(std::move(inner)), host_(std::move(host)), device_(std::move(device)) {}
  bool test() override {
    if (done_) return true;
    if (!inner_->test()) return false;
    finish();
    return true;
  }
  void wait(std::chrono::milliseconds timeout, const std::string& what) override {
    if (done_) return;
    inner_->wait(timeout, what);
    finish();
  }

 private:
  void finish() {
    device_.copy_from(host_);
    done_ = true;
  }
  std::unique_ptr<Request> inner_;
  Tensor host_, device_;
  bool done_ = false;
};

// `inner`, or (a CUDA tensor) `inner` with `device` receiving `host` when it completes.
std::unique_ptr<Request> staged(std::unique_ptr<Request> inner, const Tensor& host,
                                const Tensor& device) {
  if (device.device().is_cpu()) return inner;
  return std::make_unique<StagedRequest>(std::move(inner), host, device);
}

}  // namespace local_detail

void LocalCommunicator::abort(const std::string& message) {
  local_detail::abort_family(*state_, rank_, message);
}

std::unique_ptr<Request> LocalCommunicator::isend(const Tensor& t, int peer, int tag) {
  const std::string op = "isend to rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
  local_detail::check_tensor(t, op, "tensor");
  STRATA_CHECK(peer >= 0 && peer < size())
      << "local comm " << op << ": no such rank (size " << size() << ")";
  STRATA_CHECK(tag >= 0 && tag < local_detail::kMaxTag)
      << "local comm " << op << ": tag must be in [0, " << local_detail::kMaxTag << ")";
  const Tensor src = local_detail::on_host(t);
  Tensor bytes = Tensor::empty({static_cast<int64_t>(t.nbytes())}, DType::kU8);
  if (t.nbytes() > 0) std::memcpy(bytes.raw_data(), src.raw_data(), t.nbytes());
  auto& family = *state_->family;
  std::lock_guard<std::mutex> lock(family.mutex);
  local_detail::throw_if_aborted(*state_, rank_, "posting", op);
  local_detail::Channel& channel = state_->channels[{rank_, peer, tag}];
  if (!channel.receives.empty()) {
    channel.receives.front()->bytes = std::move(bytes);
    channel.receives.front()->matched = true;
    channel.receives.pop_front();
    family.changed.notify_all();
  } else {
    channel.messages.push_back(std::move(bytes));
  }
  return std::make_unique<local_detail::DoneRequest>();
}

std::unique_ptr<Request> LocalCommunicator::irecv(const Tensor& t, int peer, int tag) {
  const std::string op = "irecv from rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
  local_detail::check_tensor(t, op, "tensor");
  STRATA_CHECK(peer >= 0 && peer < size())
      << "local comm " << op << ": no such rank (size " << size() << ")";
  STRATA_CHECK(tag >= 0 && tag < local_detail::kMaxTag)
      << "local comm " << op << ": tag must be in [0, " << local_detail::kMaxTag << ")";
  auto slot = std::make_shared<local_detail::RecvSlot>();
  {
    std::lock_guard<std::mutex> lock(state_->family->mutex);
    local_detail::throw_if_aborted(*state_, rank_, "posting", op);
    local_detail::Channel& channel = state_->channels[{peer, rank_, tag}];
    if (!channel.messages.empty()) {
      slot->bytes = std::move(channel.messages.front());
      slot->matched = true;
      channel.messages.pop_front();
    } else {
      channel.receives.push_back(slot);
    }
  }
  const Tensor host = local_detail::host_like(t);
  return local_detail::staged(
      std::make_unique<local_detail::RecvRequest>(state_, rank_, host, std::move(slot), op), host,
      t);
}

std::unique_ptr<Request> LocalCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  Post p{Kind::kAllReduce,
         local_detail::describe("all_reduce", t) + ", " + local_detail::op_name(op) + ")"};
  local_detail::check_tensor(t, p.signature, "tensor");
  local_detail::check_reducible(t, p.signature);
  p.dtype = t.dtype();
  p.op = op;
  p.in = local_detail::on_host(t);
  const Tensor host = p.in;
  auto c = local_detail::post(*state_, rank_, std::move(p));
  return local_detail::staged(
      std::make_unique<local_detail::CollectiveRequest>(state_, rank_, std::move(c)), host, t);
}

std::unique_ptr<Request> LocalCommunicator::broadcast(const Tensor& t, int root) {
  Post p{Kind::kBroadcast,
         local_detail::describe("broadcast", t) + ", root " + std::to_string(root) + ")"};
  local_detail::check_tensor(t, p.signature, "tensor");
  STRATA_CHECK(root >= 0 && root < size())
      << "local comm " << p.signature << ": no such rank (size " << size() << ")";
  p.dtype = t.dtype();
  p.root = root;
  p.in = local_detail::on_host(t);
  const Tensor host = p.in;
  auto c = local_detail::post(*state_, rank_, std::move(p));
  return local_detail::staged(
      std::make_unique<local_detail::CollectiveRequest>(state_, rank_, std::move(c)), host, t);
}

std::unique_ptr<Request> LocalCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  Post p{Kind::kAllGather, local_detail::describe("all_gather", in) + ")"};
  local_detail::check_tensor(in, p.signature, "input");
  local_detail::check_tensor(out, p.signature, "output");
  STRATA_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size())
      << "local comm " << p.signature << ": output " << out.str() << " must be "
      << dtype_name(in.dtype()) << " with " << size() << " x " << in.numel() << " elements";
  p.dtype = in.dtype();
  p.in = local_detail::on_host(in);
  p.out = local_detail::host_like(out);
  const Tensor host = p.out;
  auto c = local_detail::post(*state_, rank_, std::move(p));
  return local_detail::staged(
      std::make_unique<local_detail::CollectiveRequest>(state_, rank_, std::move(c)), host, out);
}

std::unique_ptr<Request> LocalCommunicator::reduce_scatter(const Tensor& in, const Tensor& out) {
  Post p{Kind::kReduceScatter, local_detail::describe("reduce_scatter", in) + ")"};
  local_detail::check_tensor(in, p.signature, "input");
  local_detail::check_tensor(out, p.signature, "output");
  local_detail::check_reducible(in, p.signature);
  STRATA_CHECK(out.dtype() == in.dtype() && out.numel() * size() == in.numel())
      << "local comm " << p.signature << ": output " << out.str() << " must be "
      << dtype_name(in.dtype()) << " with " << in.numel() << " / " << size() << " elements";
  p.dtype = in.dtype();
  p.in = local_detail::on_host(in);
  p.out = local_detail::host_like(out);
  const Tensor host = p.out;
  auto c = local_detail::post(*state_, rank_, std::move(p));
  return local_detail::staged(
      std::make_unique<local_detail::CollectiveRequest>(state_, rank_, std::move(c)), host, out);
}

void LocalCommunicator::barrier(const std::string& what) {
  auto c = local_detail::post(*state_, rank_, Post{Kind::kBarrier, "barrier"});
  local_detail::CollectiveRequest(state_, rank_, std::move(c)).wait(timeout(), what);
}

std::unique_ptr<Communicator> LocalCommunicator::split(int color, int key) {
  Post p{Kind::kSplit, "split"};
  p.color = color < 0 ? -1 : color;
  p.key = key;
  auto c = local_detail::post(*state_, rank_, std::move(p));
  const std::string what =
      "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
  {
    std::unique_lock<std::mutex> lock(state_->family->mutex);
    local_detail::block_until(lock, *state_, rank_, timeout(), local_detail::Clock::now(), what,
                              "split", [&] { return c->ready; });
    if (!c->error.empty()) throw Error(c->error);
  }
  if (color < 0) return nullptr;
  std::unique_ptr<LocalCommunicator> sub(new LocalCommunicator(c->sub[rank_], c->sub_rank[rank_]));
  sub->set_timeout(timeout());
  return sub;
}

std::unique_ptr<Communicator> LocalCommunicator::subgroup(const std::vector<int>& members,
                                                          int tag) {
  check_subgroup(members, tag, rank_, size(), "local");
  // The first member to arrive makes the sub-world; the last one takes the entry away, so that
  // the same members and tag may meet again later for a new one. Every member waits for all.
  std::shared_ptr<local_detail::PendingSubgroup> pending;
  std::ostringstream name;
  name << (state_->name.empty() ? std::string("the local world") : state_->name) << " / subgroup(";
  for (size_t i = 0; i < members.size(); ++i) name << (i ? "," : "") << members[i];
  name << ", tag " << tag << ")";
  const std::string what = name.str();
  std::unique_lock<std::mutex> lock(state_->family->mutex);
  local_detail::throw_if_aborted(*state_, rank_, "posting", what);
  auto& slot = state_->subgroups[{members, tag}];
  if (!slot) {
    slot = std::make_shared<local_detail::PendingSubgroup>();
    std::vector<int> root_ranks;
    for (int m : members) root_ranks.push_back(state_->root_ranks[m]);
    slot->sub = local_detail::make_world(state_->family, root_ranks, what);
  }
  pending = slot;
  if (++pending->arrived == static_cast<int>(members.size())) {
    state_->subgroups.erase({members, tag});
    state_->family->changed.notify_all();
  }
  local_detail::block_until(lock, *state_, rank_, timeout(), local_detail::Clock::now(),
                            "the other members of " + what, "subgroup",
                            [&] { return pending->arrived == static_cast<int>(members.size()); });
  lock.unlock();
  const int sub_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::unique_ptr<LocalCommunicator> sub(new LocalCommunicator(pending->sub, sub_rank));
  sub->set_timeout(timeout());
  return sub;
}

// ---- LocalWorld ---------------------------------------------------------------------------------

LocalWorld::LocalWorld(int size) {
  STRATA_CHECK(size >= 1) << "LocalWorld: size must be at least 1, got " << size;
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[r] = r;
  state_ = local_detail::make_world(std::make_shared<local_detail::Family>(), ranks, "");
}

int LocalWorld::size() const { return state_->size; }

std::unique_ptr<LocalCommunicator> LocalWorld::communicator(int rank) const {
  STRATA_CHECK(rank >= 0 && rank < size())
      << "LocalWorld::communicator: rank " << rank << " outside a world of " << size();
  return std::unique_ptr<LocalCommunicator>(new LocalCommunicator(state_, rank));
}

std::vector<std::unique_ptr<LocalCommunicator>> LocalWorld::communicators() const {
  std::vector<std::unique_ptr<LocalCommunicator>> comms;
  for (int r = 0; r < size(); ++r) comms.push_back(communicator(r));
  return comms;
}

void LocalWorld::abort(int rank, const std::string& message) const {
  STRATA_CHECK(rank >= 0 && rank < size())
      << "LocalWorld::abort: rank " << rank << " outside a world of " << size();
  local_detail::abort_family(*state_, rank, message);
}

bool LocalWorld::aborted() const {
  std::lock_guard<std::mutex> lock(state_->family->mutex);
  return state_->family->aborted;
}

int LocalWorld::failed_rank() const {
  std::lock_guard<std::mutex> lock(state_->family->mutex);
  return state_->family->failed_rank;
}

std::string LocalWorld::abort_message() const {
  std::lock_guard<std::mutex> lock(state_->family->mutex);
  return state_->family->failed_message;
}

void run_local_ranks(const LocalWorld& world, const std::function<void(LocalCommunicator&)>& fn) {
  const int n = world.size();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&world, &fn, &errors, r] {
      try {
        std::unique_ptr<LocalCommunicator> comm = world.communicator(r);
        fn(*comm);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        world.abort(r, error_message(e));
      } catch (...) {
        errors[r] = std::current_exception();
        world.abort(r, "unknown exception");
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const int first = world.failed_rank();
  if (first >= 0 && errors[first]) std::rethrow_exception(errors[first]);
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  if (first >= 0) {
    throw CommAborted("local comm: rank " + std::to_string(first) +
                      " aborted the world: " + world.abort_message());
  }
}

}  // namespace strata::parallel
