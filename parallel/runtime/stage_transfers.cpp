// StageTransfers: receives posted ahead, sends kept alive until they complete, streams on CUDA.
#include "parallel/runtime/stage_transfers.h"

#include <algorithm>
#include <sstream>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "parallel/runtime/micro_batch_source.h"
#include "parallel/trace.h"

namespace strata::parallel {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxBoundaryTensors = 8;

int message_tag(bool gradient, int64_t mb, size_t index) {
  return static_cast<int>(((mb % 2048) * 2 + (gradient ? 1 : 0)) * kMaxBoundaryTensors +
                          static_cast<int64_t>(index));
}

Shape with_rows(int64_t rows, const Shape& sample) {
  Shape s{rows};
  s.insert(s.end(), sample.begin(), sample.end());
  return s;
}

}  // namespace

void StageLinks::attach(StageComms* comms) const {
  comms->act_in = act_in.get();
  comms->act_out = act_out.get();
  comms->grad_in = grad_in.get();
  comms->grad_out = grad_out.get();
}

StageLinks make_stage_links(Communicator& pipe, int stage, int stages) {
  STRATA_CHECK(stages >= 1 && pipe.size() == stages && pipe.rank() == stage)
      << "make_stage_links: stage " << stage << " of " << stages << " over a communicator of "
      << pipe.size() << " ranks (rank " << pipe.rank() << ")";
  StageLinks links;
  for (const bool gradients : {false, true}) {
    for (int parity = 0; parity < 2; ++parity) {
      if (parity > stages - 2) continue;  // no boundary of this parity (every stage agrees)
      // The boundary of this parity that touches this stage: above it (b = stage) or below it.
      const int b = stage % 2 == parity ? stage : stage - 1;
      const bool here = b >= 0 && b <= stages - 2;
      std::unique_ptr<Communicator> link = pipe.split(here ? b : -1, stage);
      if (!here) continue;
      STRATA_CHECK(link != nullptr && link->size() == 2 && link->rank() == (b == stage ? 0 : 1))
          << "make_stage_links: the link between stages " << b << " and " << b + 1 << " on stage "
          << stage << " is not the expected pair";
      std::unique_ptr<Communicator>& slot = b == stage
                                                ? (gradients ? links.grad_in : links.act_out)
                                                : (gradients ? links.grad_out : links.act_in);
      slot = std::move(link);
    }
  }
  return links;
}

struct StageTransfers::PendingRecv {
  TensorList buffers;  // one per boundary tensor; undefined where nothing is received
  std::vector<std::unique_ptr<Request>> requests;
  Instruction instruction;
  Clock::time_point posted;
  bool complete = false;  // every request seen complete (and the transfer recorded)
};

struct StageTransfers::PendingSend {
  TensorList tensors;  // kept alive until the sends complete
  std::vector<std::unique_ptr<Request>> requests;
  std::string what;
  Instruction instruction;
  Clock::time_point posted;
};

StageTransfers::StageTransfers(ExecContext& ctx, const graph::Model& model, StageRange range,
                               const StageComms& comms, std::optional<DType> mixed_dtype,
                               int lookahead, Trace* trace)
    : ctx_(ctx),
      model_(model),
      range_(range),
      comms_(comms),
      mixed_dtype_(mixed_dtype),
      lookahead_(lookahead),
      trace_(trace) {
  STRATA_CHECK(range.stages == 1 || (comms.pipe != nullptr && comms.pipe->size() == range.stages))
      << "executor: a pipeline of " << range.stages << " stages needs a pipeline communicator "
      << "of that size";
  STRATA_CHECK(model.specs_before(range.begin).size() <= kMaxBoundaryTensors &&
               model.specs_before(range.end).size() <= kMaxBoundaryTensors)
      << "executor: at most " << kMaxBoundaryTensors << " tensors may cross a stage boundary";
  // Point-to-point links: all that this stage needs, or none.
  const bool has_links = comms.act_in != nullptr || comms.act_out != nullptr ||
                         comms.grad_in != nullptr || comms.grad_out != nullptr;
  if (has_links) {
    const bool up = range.stage > 0, down = range.stage < range.stages - 1;
    STRATA_CHECK((comms.act_in != nullptr) == up && (comms.grad_out != nullptr) == up &&
                 (comms.act_out != nullptr) == down && (comms.grad_in != nullptr) == down)
        << "executor: stage " << range.stage << " of " << range.stages
        << " needs a link per direction to each neighbouring stage, and no other";
    for (Communicator* link : {comms.act_in, comms.act_out, comms.grad_in, comms.grad_out}) {
      STRATA_CHECK(link == nullptr || link->size() == 2)
          << "executor: a link between stages has " << link->size() << " ranks, not 2";
    }
  }
  const bool ordered =
      range.stages > 1 &&
      (has_links ? (comms.act_in != nullptr ? comms.act_in : comms.act_out)->stream_ordered()
                 : comms.pipe->stream_ordered());
  STRATA_CHECK(!ordered || has_links)
      << "executor: stage " << range.stage << ": the " << comms.pipe->backend()
      << " pipeline communicator runs its transfers one after another, so a pipeline over it "
         "needs a link per direction between neighbouring stages (make_stage_links)";
  late_receives_ = ordered;
  // CUDA: transfers on streams of their own, ordered after the compute stream by events.
  // Their priority is the device's highest, so the swap engine's copies (default priority, vPIPE
  // §4.2) never hold back the pipeline's traffic.
  if (ctx.device().is_cuda() && range.stages > 1) {
    send_stream_ = std::make_unique<cuda::StreamHandle>(ctx.device().index, true);
    recv_stream_ = std::make_unique<cuda::StreamHandle>(ctx.device().index, true);
    auto use_stream = [this](Communicator* c, void* stream) {
      if (c == nullptr) return;
      c->set_caller_stream(stream);
      stream_users_.push_back(c);
    };
    use_stream(comms.act_out, send_stream_->get());
    use_stream(comms.grad_out, send_stream_->get());
    use_stream(comms.act_in, recv_stream_->get());
    use_stream(comms.grad_in, recv_stream_->get());
  }
}

StageTransfers::~StageTransfers() {
  // The caller streams set here may not outlive this object (its send and receive streams).
  for (Communicator* c : stream_users_) c->set_caller_stream(nullptr);
}

void* StageTransfers::compute_stream() const { return cuda::exec_stream(ctx_.cuda()); }

StageTransfers::Route StageTransfers::route(OpCode op) const {
  const int stage = range_.stage;
  switch (op) {
    case OpCode::kSendAct:
      return comms_.act_out != nullptr ? Route{comms_.act_out, 1} : Route{comms_.pipe, stage + 1};
    case OpCode::kRecvAct:
      return comms_.act_in != nullptr ? Route{comms_.act_in, 0} : Route{comms_.pipe, stage - 1};
    case OpCode::kSendGrad:
      return comms_.grad_out != nullptr ? Route{comms_.grad_out, 0} : Route{comms_.pipe, stage - 1};
    case OpCode::kRecvGrad:
      return comms_.grad_in != nullptr ? Route{comms_.grad_in, 1} : Route{comms_.pipe, stage + 1};
    default:
      STRATA_THROW() << "executor: " << to_string(Instruction{op, -1}) << " is not a transfer";
  }
}

std::string StageTransfers::describe(const Instruction& in) const {
  std::ostringstream s;
  s << to_string(in) << " on stage " << range_.stage;
  if (in.op == OpCode::kRecvAct) s << " from stage " << range_.stage - 1;
  if (in.op == OpCode::kRecvGrad) s << " from stage " << range_.stage + 1;
  return s.str();
}

void StageTransfers::post_ahead(const Program& program, size_t from, MicroBatchSource& source) {
  if (late_receives_) return;  // posted by receive() (see the header)
  const size_t to = std::min(program.size(), from + static_cast<size_t>(lookahead_) + 1);
  for (size_t i = from; i < to; ++i) {
    const Instruction& in = program[i];
    if (in.op != OpCode::kRecvAct && in.op != OpCode::kRecvGrad) continue;
    if (receives_.count({static_cast<int>(in.op), in.micro_batch}) > 0) continue;
    try {
      post(in, source);
    } catch (const OutOfMemoryError& e) {
      const MicroBatchSource::Info info = source.info(in.micro_batch);
      throw OutOfMemoryError(describe(in) + " (step " + std::to_string(info.step + 1) + ", " +
                                 std::to_string(info.rows) +
                                 " rows), receive buffer: " + e.message(),
                             e.where());
    }
  }
}

void StageTransfers::post(const Instruction& in, MicroBatchSource& source) {
  const bool gradient = in.op == OpCode::kRecvGrad;
  const int64_t rows = source.info(in.micro_batch).rows;
  size_t boundary = gradient ? range_.end : range_.begin;
  if (boundaries_) boundary = boundaries_(in.micro_batch, gradient);
  const graph::TensorSpecs& specs = model_.specs_before(boundary);
  const Route from = route(in.op);
  auto pending = std::make_unique<PendingRecv>();
  pending->instruction = in;
  pending->posted = Clock::now();
  if (recv_stream_ != nullptr && from.comm->stream_ordered()) {
    // The buffers come from the compute stream's caching allocator and may be memory that compute
    // work still queued uses: the backend's stream follows the receive stream, which waits for
    // that work.
    recv_stream_->wait_for(compute_stream());
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (gradient && !is_floating(specs[i].dtype)) {
      pending->buffers.emplace_back();  // an integer tensor has no gradient
      continue;
    }
    const DType dtype =
        mixed_dtype_ && is_floating(specs[i].dtype) ? *mixed_dtype_ : specs[i].dtype;
    Tensor buffer = Tensor::empty(with_rows(rows, specs[i].shape), dtype, &ctx_.allocator());
    pending->requests.push_back(
        from.comm->irecv(buffer, from.peer, message_tag(gradient, in.micro_batch, i)));
    pending->buffers.push_back(std::move(buffer));
  }
  receives_[{static_cast<int>(in.op), in.micro_batch}] = std::move(pending);
}

TensorList StageTransfers::receive(const Instruction& in, MicroBatchSource& source) {
  auto it = receives_.find({static_cast<int>(in.op), in.micro_batch});
  if (it == receives_.end() && late_receives_) {
    post(in, source);
    it = receives_.find({static_cast<int>(in.op), in.micro_batch});
  }
  STRATA_CHECK(it != receives_.end()) << "executor: " << describe(in) << " was never posted";
  const std::string what = describe(in);
  PendingRecv& pending = *it->second;
  if (recv_stream_ != nullptr && route(in.op).comm->stream_ordered()) {
    // The compute stream waits for the receive on the device (cudaStreamWaitEvent), the host
    // goes on; drain() checks that it completed, where a dead peer shows as CommTimeout. No
    // trace span: the host does not see when it completes.
    for (auto& r : pending.requests) {
      r->wait_on_stream(compute_stream(), comms_.pipe->timeout(), what);
      waited_on_device_.push_back({what, std::move(r)});
    }
    pending.requests.clear();
    pending.complete = true;
  }
  for (auto& r : pending.requests) r->wait(comms_.pipe->timeout(), what);
  if (trace_ != nullptr && !pending.complete) {
    trace_->record_transfer(in, range_.stage + (in.op == OpCode::kRecvGrad ? 1 : -1),
                            pending.posted, Clock::now());
  }
  TensorList buffers = std::move(it->second->buffers);
  receives_.erase(it);
  return buffers;
}

void StageTransfers::send(OpCode op, int64_t mb, const TensorList& tensors) {
  const bool gradient = op == OpCode::kSendGrad;
  const Route to = route(op);
  auto pending = std::make_unique<PendingSend>();
  pending->what = describe(Instruction{op, mb});
  pending->instruction = Instruction{op, mb};
  pending->posted = Clock::now();
  std::vector<size_t> index;  // of each tensor sent, among the boundary tensors
  bool on_device = false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;  // no gradient for an integer input
    pending->tensors.push_back(tensors[i].contiguous());
    index.push_back(i);
    on_device = on_device || pending->tensors.back().device().is_cuda();
  }
  if (send_stream_ != nullptr && on_device) {
    // The transfer must not start before the compute stream has produced the tensors: the send
    // stream waits for them, and a stream-ordered backend's stream follows the send stream; the
    // others get tensors that are ready.
    send_stream_->wait_for(compute_stream());
    if (!to.comm->stream_ordered()) send_stream_->synchronize();
  }
  for (size_t k = 0; k < pending->tensors.size(); ++k) {
    pending->requests.push_back(
        to.comm->isend(pending->tensors[k], to.peer, message_tag(gradient, mb, index[k])));
  }
  sends_.push_back(std::move(pending));
}

void StageTransfers::poll() {
  const int down = range_.stage + 1, up = range_.stage - 1;
  for (auto& [key, pending] : receives_) {
    if (pending->complete) continue;
    bool done = true;
    for (auto& r : pending->requests) done = r->test() && done;
    if (!done) continue;
    pending->complete = true;
    if (trace_ != nullptr) {
      const bool gradient = pending->instruction.op == OpCode::kRecvGrad;
      trace_->record_transfer(pending->instruction, gradient ? down : up, pending->posted,
                              Clock::now());
    }
  }
  // Free the buffers of sends that have completed.
  sends_.erase(std::remove_if(sends_.begin(), sends_.end(),
                              [&](const std::unique_ptr<PendingSend>& s) {
                                for (auto& r : s->requests) {
                                  if (!r->test()) return false;
                                }
                                if (trace_ != nullptr) {
                                  const bool gradient = s->instruction.op == OpCode::kSendGrad;
                                  trace_->record_transfer(s->instruction, gradient ? up : down,
                                                          s->posted, Clock::now());
                                }
                                return true;
                              }),
               sends_.end());
}

void StageTransfers::drain() {
  for (auto& [what, r] : waited_on_device_) r->wait(comms_.pipe->timeout(), what);
  waited_on_device_.clear();
  for (const std::unique_ptr<PendingSend>& s : sends_) {
    for (auto& r : s->requests) r->wait(comms_.pipe->timeout(), s->what + " (send completion)");
    if (trace_ != nullptr) {
      const int peer = s->instruction.op == OpCode::kSendGrad ? range_.stage - 1 : range_.stage + 1;
      trace_->record_transfer(s->instruction, peer, s->posted, Clock::now());
    }
  }
  sends_.clear();
}

}  // namespace strata::parallel
