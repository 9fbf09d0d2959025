// MPI backend: every operation is one non-blocking MPI call; a Request owns the MPI_Request, the
// references that keep the tensors alive and, for CUDA tensors with a library that is not
// CUDA-aware, the pinned host buffers the call works on.
//
// Waiting. MPI_Test drives MPI's progress engine (Open MPI's non-blocking collectives progress
// only inside MPI calls), so a wait is a loop of MPI_Test and sleeps: 50 us at first, doubling
// up to 1 ms, which keeps latency low for short operations without spinning a core on long ones.
// The deadline is checked between tests; a timeout leaves the operation posted (a receive is
// cancelled when its Request goes away).
//
// Numerics: the reduction order is MPI's own. Open MPI's allreduce algorithms (recursive
// doubling, ring) reduce each element in one order and give every rank the same bits, but a sum
// may differ in the last bits from the rank-order sum of the local backend.
#include "parallel/comm/mpi_comm.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/cuda_runtime.h"
#include "engine/log.h"
#include "parallel/comm/mpi_check.h"

#ifdef STRATA_WITH_CUDA
#include "engine/cuda_check.h"
#endif

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxTag = 32768;

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown MPI thread level";
  }
}

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

MPI_Datatype mpi_type(DType dtype, const std::string& op) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    default:
      STRATA_THROW() << "mpi comm " << op << ": cannot reduce " << dtype_name(dtype)
                     << " tensors (f32, f64, i32, i64)";
  }
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

void check_tensor(const Tensor& t, const std::string& op, const char* name) {
  STRATA_CHECK(t.defined()) << "mpi comm " << op << ": " << name << " is undefined";
  STRATA_CHECK(t.is_contiguous()) << "mpi comm " << op << ": " << name << " " << t.str()
                                  << " must be contiguous";
}

// MPI counts are ints.
int count_of(size_t n, const std::string& op) {
  STRATA_CHECK(n <= static_cast<size_t>(INT_MAX))
      << "mpi comm " << op << ": " << n << " items exceed MPI's int count (" << INT_MAX << ")";
  return static_cast<int>(n);
}

// Page-locked host memory, so that staging copies run at full bus speed.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t nbytes) {
#ifdef STRATA_WITH_CUDA
    STRATA_CUDA_CHECK(cudaMallocHost(&data_, std::max<size_t>(nbytes, 1)));
#else
    STRATA_THROW() << "mpi comm: staging a CUDA tensor of " << nbytes
                   << " bytes needs a build with CUDA";
#endif
  }
  ~PinnedBuffer() {
#ifdef STRATA_WITH_CUDA
    cudaFreeHost(data_);
#endif
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
};

// What one MPI call reads and writes: the tensors' own memory, or pinned host copies of CUDA
// tensors when MPI cannot reach device memory.
class Buffers {
 public:
  explicit Buffers(bool cuda_aware) : cuda_aware_(cuda_aware) {}

  // Memory MPI reads from `t`. A CUDA tensor is read once the stream that orders its memory (its
  // allocator's: the producing context's) has finished the work enqueued so far: memcpy_blocking
  // copies to pinned memory on that stream, and a CUDA-aware library gets the device memory after
  // the same wait.
  void* in(const Tensor& t) {
    keep_.push_back(t);
    if (!needs_staging(t)) {
      device_ready(t);
      return t.raw_data();
    }
    PinnedBuffer& host = stage(t);
    cuda::memcpy_blocking(host.data(), Device::cpu(), nullptr, t.raw_data(), t.device(),
                          t.allocator().stream(), t.nbytes());
    return host.data();
  }
  // Memory MPI writes into `t` (and reads first when `read_too`, for in-place operations). A
  // staged CUDA tensor is written in finish(), ordered after the earlier work of its memory's
  // stream (memcpy_blocking); a CUDA-aware library writes device memory whose earlier users on
  // that stream have finished.
  void* out(const Tensor& t, bool read_too) {
    if (!needs_staging(t)) {
      device_ready(t);
      keep_.push_back(t);
      return t.raw_data();
    }
    void* host = read_too ? in(t) : stage(t).data();
    copy_back_.emplace_back(host, t);
    return host;
  }
  // After MPI completed: the staged results go to the device (before the request reports
  // completion, so that a completed request's CUDA results are ready for any stream).
  void finish() {
    for (auto& [host, t] : copy_back_) {
      cuda::memcpy_blocking(t.raw_data(), t.device(), t.allocator().stream(), host, Device::cpu(),
                            nullptr, t.nbytes());
    }
    copy_back_.clear();
  }

 private:
  bool needs_staging(const Tensor& t) const { return t.device().is_cuda() && !cuda_aware_; }
  // A CUDA tensor handed to a CUDA-aware MPI directly: the work of its memory's stream (the whole
  // device for memory without one) is done first.
  void device_ready(const Tensor& t) {
    if (!t.device().is_cuda()) return;
    cuda::synchronize_stream(t.device().index, t.allocator().stream());
  }
  PinnedBuffer& stage(const Tensor& t) {
    pinned_.push_back(std::make_unique<PinnedBuffer>(t.nbytes()));
    return *pinned_.back();
  }

  bool cuda_aware_;
  std::vector<Tensor> keep_;
  std::vector<std::unique_ptr<PinnedBuffer>> pinned_;
  std::vector<std::pair<void*, Tensor>> copy_back_;
};

// Buffers of sends and collectives given up after a timeout or another failure: MPI may still
// read or write them, so they live until the process ends, held here (reachable, so the leak
// checker does not report them as lost).
void abandon(Buffers buffers) {
  static std::mutex* mutex = new std::mutex;
  static auto* abandoned = new std::vector<std::unique_ptr<Buffers>>;
  std::lock_guard<std::mutex> lock(*mutex);
  abandoned->push_back(std::make_unique<Buffers>(std::move(buffers)));
}

class MpiRequest final : public Request {
 public:
  // `expected_bytes` >= 0 for receives: the byte count the message must have.
  MpiRequest(std::string who, std::string op, MPI_Request request, Buffers buffers,
             long long expected_bytes = -1)
      : who_(std::move(who)),
        op_(std::move(op)),
        request_(request),
        buffers_(std::move(buffers)),
        expected_bytes_(expected_bytes) {}

  ~MpiRequest() override {
    if (done_ || request_ == MPI_REQUEST_NULL || !mpi_running()) return;
    if (expected_bytes_ >= 0) {  // a receive: cancel it, then it completes locally
      MPI_Cancel(&request_);
      MPI_Wait(&request_, MPI_STATUS_IGNORE);
      return;
    }
    // A send or a collective cannot be withdrawn and MPI may still read or write its buffers:
    // they are kept to the end of the process (this only happens after a timeout or another
    // failure).
    MPI_Request_free(&request_);
    abandon(std::move(buffers_));
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    STRATA_MPI_CHECK(MPI_Test(&request_, &flag, &status));
    if (!flag) return false;
    if (expected_bytes_ >= 0) {
      int count = 0;
      STRATA_MPI_CHECK(MPI_Get_count(&status, MPI_BYTE, &count));
      STRATA_CHECK_EQ(static_cast<long long>(count), expected_bytes_)
          << "mpi comm: " << who_ << ": " << op_ << " matched a send of a different size (bytes)";
    }
    buffers_.finish();
    done_ = true;
    return true;
  }

  void wait(std::chrono::milliseconds timeout, const std::string& what) override {
    const Clock::time_point start = Clock::now();
    auto pause = std::chrono::microseconds(50);
    while (!test()) {
      const auto elapsed = Clock::now() - start;
      if (timeout.count() > 0 && elapsed >= timeout) {
        throw CommTimeout("mpi comm: " + who_ + " timed out after " +
                          std::to_string(timeout.count()) + " ms waiting for " + what + " (" + op_ +
                          ")");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

 private:
  std::string who_, op_;
  MPI_Request request_;
  Buffers buffers_;
  long long expected_bytes_;
  bool done_ = false;
};

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + "(" + dtype_name(t.dtype()) + ", " + std::to_string(t.numel()) +
         " elements";
}

}  // namespace

// ---- MpiSession ---------------------------------------------------------------------------------

bool mpi_cuda_aware() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  STRATA_MPI_CHECK(MPI_Finalized(&finalized));
  STRATA_CHECK(!finalized) << "MpiSession: MPI was finalized already and cannot be initialized "
                              "again in this process (use one MpiSession for the whole program)";
  STRATA_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    STRATA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &thread_level_));
    owns_ = true;
  } else {
    STRATA_MPI_CHECK(MPI_Query_thread(&thread_level_));
  }
  if (thread_level_ < MPI_THREAD_FUNNELED) {
    if (owns_) MPI_Finalize();
    STRATA_THROW() << "MpiSession: the MPI library provides only "
                   << thread_level_name(thread_level_)
                   << "; Strata needs at least MPI_THREAD_FUNNELED (MPI_THREAD_MULTIPLE to use "
                      "communicators from several threads)";
  }
  STRATA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  STRATA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  cuda_aware_ = mpi_cuda_aware();
  set_log_rank(rank_);
}

MpiSession::~MpiSession() {
  if (owns_ && mpi_running()) MPI_Finalize();
}

std::string MpiSession::describe() const {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  std::string library = "unknown MPI library";
  if (MPI_Get_library_version(version, &length) == MPI_SUCCESS) {
    library.assign(version, static_cast<size_t>(length));
    library = library.substr(0, library.find_first_of(",\n"));
  }
  return "MPI rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ", " +
         thread_level_name(thread_level_) + ", " + library + ", " +
         (cuda_aware_ ? "CUDA-aware" : "not CUDA-aware");
}

std::unique_ptr<MpiCommunicator> MpiSession::world() const {
  MPI_Comm comm;
  STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::make_unique<MpiCommunicator>(comm, true);
}

[[noreturn]] void abort_world(int code) {
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

// ---- MpiCommunicator ----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  STRATA_CHECK(mpi_running()) << "MpiCommunicator: MPI is not initialized (create an MpiSession)";
  STRATA_CHECK(comm != MPI_COMM_NULL) << "MpiCommunicator: MPI_COMM_NULL given";
  STRATA_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  STRATA_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  STRATA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_));
  STRATA_MPI_CHECK(MPI_Query_thread(&thread_level_));
  cuda_aware_ = mpi_cuda_aware();
}

MpiCommunicator::~MpiCommunicator() {
  if (owned_ && mpi_running()) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::who() const {
  std::string s = "rank " + std::to_string(rank_);
  if (world_rank_ != rank_) s += " (world rank " + std::to_string(world_rank_) + ")";
  return s;
}

void MpiCommunicator::check_thread(const std::string& op) const {
  if (thread_level_ >= MPI_THREAD_MULTIPLE) return;
  int is_main = 0;
  STRATA_MPI_CHECK(MPI_Is_thread_main(&is_main));
  STRATA_CHECK(is_main) << "mpi comm " << op << ": MPI provides only "
                        << thread_level_name(thread_level_)
                        << ", so communicators work only on the thread that initialized MPI";
}

std::unique_ptr<Request> MpiCommunicator::isend(const Tensor& t, int peer, int tag) {
  const std::string op = "isend to rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
  check_thread(op);
  check_tensor(t, op, "tensor");
  STRATA_CHECK(peer >= 0 && peer < size_)
      << "mpi comm " << op << ": no such rank (size " << size_ << ")";
  STRATA_CHECK(tag >= 0 && tag < kMaxTag)
      << "mpi comm " << op << ": tag must be in [0, " << kMaxTag << ")";
  const int count = count_of(t.nbytes(), op);
  Buffers buffers(cuda_aware_);
  void* data = buffers.in(t);
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Isend(data, count, MPI_BYTE, peer, tag, comm_, &request));
  return std::make_unique<MpiRequest>(who(), op, request, std::move(buffers));
}

std::unique_ptr<Request> MpiCommunicator::irecv(const Tensor& t, int peer, int tag) {
  const std::string op = "irecv from rank " + std::to_string(peer) + ", tag " + std::to_string(tag);
  check_thread(op);
  check_tensor(t, op, "tensor");
  STRATA_CHECK(peer >= 0 && peer < size_)
      << "mpi comm " << op << ": no such rank (size " << size_ << ")";
  STRATA_CHECK(tag >= 0 && tag < kMaxTag)
      << "mpi comm " << op << ": tag must be in [0, " << kMaxTag << ")";
  const int count = count_of(t.nbytes(), op);
  Buffers buffers(cuda_aware_);
  void* data = buffers.out(t, /*read_too=*/false);
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Irecv(data, count, MPI_BYTE, peer, tag, comm_, &request));
  return std::make_unique<MpiRequest>(who(), op, request, std::move(buffers), count);
}

std::unique_ptr<Request> MpiCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  const std::string name = describe("all_reduce", t) + (op == ReduceOp::kSum ? ", sum)" : ", max)");
  check_thread(name);
  check_tensor(t, name, "tensor");
  const MPI_Datatype type = mpi_type(t.dtype(), name);
  const int count = count_of(static_cast<size_t>(t.numel()), name);
  Buffers buffers(cuda_aware_);
  void* data = buffers.out(t, /*read_too=*/true);
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op(op), comm_, &request));
  return std::make_unique<MpiRequest>(who(), name, request, std::move(buffers));
}

std::unique_ptr<Request> MpiCommunicator::broadcast(const Tensor& t, int root) {
  const std::string name = describe("broadcast", t) + ", root " + std::to_string(root) + ")";
  check_thread(name);
  check_tensor(t, name, "tensor");
  STRATA_CHECK(root >= 0 && root < size_)
      << "mpi comm " << name << ": no such rank (size " << size_ << ")";
  const int count = count_of(t.nbytes(), name);
  Buffers buffers(cuda_aware_);
  void* data = rank_ == root ? buffers.in(t) : buffers.out(t, /*read_too=*/false);
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ibcast(data, count, MPI_BYTE, root, comm_, &request));
  return std::make_unique<MpiRequest>(who(), name, request, std::move(buffers));
}

std::unique_ptr<Request> MpiCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  const std::string name = describe("all_gather", in) + ")";
  check_thread(name);
  check_tensor(in, name, "input");
  check_tensor(out, name, "output");
  STRATA_CHECK(out.dtype() == in.dtype() && out.numel() == in.numel() * size_)
      << "mpi comm " << name << ": output " << out.str() << " must be " << dtype_name(in.dtype())
      << " with " << size_ << " x " << in.numel() << " elements";
  const int count = count_of(in.nbytes(), name);
  count_of(out.nbytes(), name);
  Buffers buffers(cuda_aware_);
  void* send = buffers.in(in);
  void* recv = buffers.out(out, /*read_too=*/false);
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Iallgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_, &request));
  return std::make_unique<MpiRequest>(who(), name, request, std::move(buffers));
}

std::unique_ptr<Request> MpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out) {
  const std::string name = describe("reduce_scatter", in) + ")";
  check_thread(name);
  check_tensor(in, name, "input");
  check_tensor(out, name, "output");
  const MPI_Datatype type = mpi_type(in.dtype(), name);
  STRATA_CHECK(out.dtype() == in.dtype() && out.numel() * size_ == in.numel())
      << "mpi comm " << name << ": output " << out.str() << " must be " << dtype_name(in.dtype())
      << " with " << in.numel() << " / " << size_ << " elements";
  const int count = count_of(static_cast<size_t>(out.numel()), name);
  count_of(static_cast<size_t>(in.numel()), name);
  Buffers buffers(cuda_aware_);
  void* send = buffers.in(in);
  void* recv = buffers.out(out, /*read_too=*/false);
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count, type, MPI_SUM, comm_, &request));
  return std::make_unique<MpiRequest>(who(), name, request, std::move(buffers));
}

void MpiCommunicator::barrier(const std::string& what) {
  check_thread("barrier");
  MPI_Request request;
  STRATA_MPI_CHECK(MPI_Ibarrier(comm_, &request));
  MpiRequest(who(), "barrier", request, Buffers(cuda_aware_)).wait(timeout(), what);
}

NodeRanks MpiCommunicator::node_ranks() {
  barrier("the ranks on this node (MPI_Comm_split_type)");
  MPI_Comm node;
  STRATA_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  NodeRanks result;
  const int rank_status = MPI_Comm_rank(node, &result.rank);
  const int size_status = MPI_Comm_size(node, &result.size);
  MPI_Comm_free(&node);
  STRATA_MPI_CHECK(rank_status);
  STRATA_MPI_CHECK(size_status);
  return result;
}

std::unique_ptr<Communicator> MpiCommunicator::subgroup(const std::vector<int>& members, int tag) {
  check_subgroup(members, tag, rank_, size_, "mpi");
  std::string list;
  for (int m : members) list += (list.empty() ? "" : ",") + std::to_string(m);
  const std::string what = "subgroup({" + list + "}, tag " + std::to_string(tag) + ")";
  check_thread(what);
  // MPI_Comm_create_group blocks without a deadline: the members first exchange a byte with
  // every other member (tag `tag`), so a member that is gone gives CommTimeout instead.
  std::vector<Tensor> in;
  std::vector<std::unique_ptr<Request>> requests;
  const Tensor out = Tensor::zeros({1}, DType::kU8);
  for (int m : members) {
    if (m == rank_) continue;
    in.push_back(Tensor::zeros({1}, DType::kU8));
    requests.push_back(irecv(in.back(), m, tag));
    requests.push_back(isend(out, m, tag));
  }
  for (auto& r : requests) r->wait(timeout(), "the other members of " + what);
  MPI_Group parent, group;
  STRATA_MPI_CHECK(MPI_Comm_group(comm_, &parent));
  const int status =
      MPI_Group_incl(parent, static_cast<int>(members.size()), members.data(), &group);
  MPI_Group_free(&parent);
  STRATA_MPI_CHECK(status);
  MPI_Comm sub = MPI_COMM_NULL;
  const int created = MPI_Comm_create_group(comm_, group, tag, &sub);
  MPI_Group_free(&group);
  STRATA_MPI_CHECK(created);
  STRATA_CHECK(sub != MPI_COMM_NULL)
      << "mpi comm " << who() << ": " << what << " gave no communicator";
  auto result = std::make_unique<MpiCommunicator>(sub, true);
  result->set_timeout(timeout());
  return result;
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  const std::string what =
      "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
  barrier(what);
  MPI_Comm sub;
  STRATA_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  auto result = std::make_unique<MpiCommunicator>(sub, true);
  result->set_timeout(timeout());
  return result;
}

}  // namespace strata::parallel
