// A stage's transfers with its neighbours: the activations it receives from stage s - 1 and
// sends to stage s + 1, and the gradients going the other way (RecvAct/SendAct/RecvGrad/SendGrad
// of parallel/schedule/schedule.h).
//
// Receives are posted a few instructions ahead (`lookahead`), into buffers shaped by the model's
// per-sample specs at the stage boundary and the micro-batch's rows, so the transfer runs while
// the stage computes; every send is kept alive until it completes. Waits use the communicator's
// timeout and name the instruction waited for. With a trace, every transfer is recorded as a span
// from the moment it is posted to the moment the stage sees it complete (pending requests are
// tested between instructions, so the span's end is an upper bound).
//
// Integer tensors crossing a boundary (BERT's attention mask) travel forward but have no
// gradient: gradients are exchanged for the floating tensors only, in the same order on both
// sides. Tags encode (micro-batch mod 2048, direction, tensor index < 8), unique among the messages
// that can be in flight between two stages. Mixed precision: floating activations and their
// gradients cross stages in the store's 16-bit compute dtype.
//
// CUDA stages. Transfers are ordered on two streams of their own, one for sends and one for
// receives, never on the legacy default stream. A send first makes the send stream wait for an
// event recorded on the compute stream after the tensor's producer; a stream-ordered backend
// (nccl, Communicator::stream_ordered) then orders its own stream after the send stream, so the
// transfer runs while the stage computes; with the others (mpi, local) the host waits for the
// send stream before posting (they copy the bytes on the host's word). A receive buffer comes
// from the compute stream's caching allocator, so before a stream-ordered receive the receive
// stream waits for the compute work enqueued so far (which may still use that memory); the
// others synchronize the device before they write it. Compute reads a received tensor only after
// its request has completed: on a stream-ordered backend the compute stream waits for it on the
// device (Request::wait_on_stream) and drain() checks it on the host; otherwise the host waits for
// it in receive(). With a stream-ordered backend
// (on any device), receives are posted when the interpreter reaches them, not `lookahead`
// instructions ahead: a receive in flight is a device kernel waiting for its peer, and the
// engine's blocking copies (the losses read back at the end of a program, a gradient norm,
// checkpoint and metric reads) synchronize the whole device, so one posted early would hold this
// stage's next copy until the peer sends, while the peer may be waiting for this stage (a
// deadlock). Sends are still posted as soon as the tensor is produced; a send in flight is device
// work too, so this stage's next blocking copy waits until the peer has reached the matching
// receive, which in gpipe, 1f1b and async-1f1b it does without waiting for this stage's later
// work (reasoned from the schedules; not yet run on GPUs).
//
// Links. A stream-ordered backend runs a communicator's transfers one after another, so a
// receive waiting for its peer would hold back the sends queued behind it on the same
// communicator; such a pipeline needs StageComms links: one communicator of two ranks per
// direction between neighbouring stages (make_stage_links), so that sends and receives never
// queue behind each other.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/exec_context.h"
#include "graph/model.h"
#include "parallel/comm/communicator.h"
#include "parallel/schedule/schedule.h"

namespace strata::cuda {
class StreamHandle;  // engine/cuda_runtime.h
}  // namespace strata::cuda

namespace strata::parallel {

class Trace;
class MicroBatchSource;

struct StageRange {
  int stage = 0;
  int stages = 1;
  size_t begin = 0;  // first layer
  size_t end = 0;    // one past the last layer
};

// The communicators a stage uses; null where the layout does not need one.
struct StageComms {
  Communicator* pipe = nullptr;  // the stages of this data-parallel group, rank = stage
  Communicator* dp = nullptr;    // this stage in every group, rank = group
  // The first and last stage when a tied parameter is split between them (rank 0: stage 0).
  Communicator* tied = nullptr;
  // Point-to-point links with the neighbouring stages, one communicator of 2 ranks per direction
  // (rank 0: the lower stage), required by stream-ordered backends (see the header comment); all
  // null: activations and gradients travel over `pipe`.
  Communicator* act_in = nullptr;    // activations from stage - 1
  Communicator* act_out = nullptr;   // activations to stage + 1
  Communicator* grad_in = nullptr;   // gradients from stage + 1
  Communicator* grad_out = nullptr;  // gradients to stage - 1
};

// The links of StageComms for `stage` of `stages`, split from `pipe` (rank = stage). Collective
// over the pipeline: every stage calls it. Boundary b joins stages b and b + 1; boundaries of the
// same parity share no stage, so one split per parity and direction makes them all (at most 4
// splits, whatever the number of stages). The links inherit `pipe`'s timeout.
struct StageLinks {
  std::unique_ptr<Communicator> act_in, act_out, grad_in, grad_out;
  void attach(StageComms* comms) const;
};
StageLinks make_stage_links(Communicator& pipe, int stage, int stages);

class StageTransfers {
 public:
  // `mixed_dtype`: under mixed precision, the dtype floating tensors cross stages in (the
  // store's 16-bit compute dtype); otherwise empty (they cross in the model's dtypes).
  StageTransfers(ExecContext& ctx, const graph::Model& model, StageRange range,
                 const StageComms& comms, std::optional<DType> mixed_dtype, int lookahead,
                 Trace* trace);
  ~StageTransfers();
  StageTransfers(const StageTransfers&) = delete;
  StageTransfers& operator=(const StageTransfers&) = delete;

  // Posts the receives among program[from, from + lookahead] not posted yet (none with a
  // stream-ordered backend, whose receives are posted when reached).
  void post_ahead(const Program& program, size_t from, MicroBatchSource& source);
  // The tensors of RecvAct/RecvGrad `in`, once they have arrived (posted now if they were not).
  TensorList receive(const Instruction& in, MicroBatchSource& source);
  // SendAct/SendGrad of micro-batch `mb` (undefined tensors are skipped: no gradient for an
  // integer input). The tensors are kept alive until the send completes.
  void send(OpCode op, int64_t mb, const TensorList& tensors);
  // Tests the pending receives and sends: frees the buffers of completed sends and records the
  // transfers that completed since the last call (trace).
  void poll();
  // Waits for every send to complete.
  void drain();
  size_t posted_receives() const { return receives_.size(); }
  // A live migration (parallel/runtime/live_stage.h): the layer whose inputs RecvAct(mb) receives
  // (gradient false) or whose inputs' gradients RecvGrad(mb) receives (gradient true), when the
  // stage's layers differ from one micro-batch to the next; unset: the stage's range.
  using Boundaries = std::function<size_t(int64_t mb, bool gradient)>;
  void set_boundaries(Boundaries boundaries) { boundaries_ = std::move(boundaries); }
  // "RecvAct(mb 3) on stage 1 from stage 0"
  std::string describe(const Instruction& in) const;

 private:
  struct PendingRecv;
  struct PendingSend;
  // Where a transfer goes: a link, or the pipeline communicator, and the peer's rank there.
  struct Route {
    Communicator* comm;
    int peer;
  };
  Route route(OpCode op) const;
  void post(const Instruction& in, MicroBatchSource& source);
  void* compute_stream() const;

  ExecContext& ctx_;
  const graph::Model& model_;
  StageRange range_;
  StageComms comms_;
  std::optional<DType> mixed_dtype_;
  int lookahead_;
  Trace* trace_;
  std::map<std::pair<int, int64_t>, std::unique_ptr<PendingRecv>> receives_;  // (op, mb)
  std::vector<std::unique_ptr<PendingSend>> sends_;
  // Stream-ordered receives the compute stream waits for on the device; drain() waits on the host.
  std::vector<std::pair<std::string, std::unique_ptr<Request>>> waited_on_device_;
  // CUDA stages of a pipeline: the streams transfers are ordered on (null on the CPU).
  std::unique_ptr<cuda::StreamHandle> send_stream_, recv_stream_;
  // Receives are posted when reached rather than ahead (a stream-ordered backend).
  bool late_receives_ = false;
  Boundaries boundaries_;
  // The links whose caller stream this object set (reset when it goes).
  std::vector<Communicator*> stream_users_;
};

}  // namespace strata::parallel
