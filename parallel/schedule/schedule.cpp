// Pipeline schedules as instruction lists, and the checker that proves them valid.
//
// Generation. Every stage's program is built from two blocks: a forward block
// `[RecvAct] Forward [SendAct]` and a backward block `[RecvGrad] Backward [SendGrad]`, where the
// bracketed messages exist only when the neighbouring stage does. The kinds differ only in the
// order of the blocks on stage s (w = warm-up forwards):
//   gpipe       F(0) .. F(M-1), B(0) .. B(M-1) (backwards in ascending order, as 1f1b, so both
//               accumulate the parameter gradients in the same order), ReduceGrads, OptimizerStep.
//   1f1b        w = min(S - s - 1, M); F(0) .. F(w-1), then F(w+j) B(j) for j < M - w, then the
//               remaining backwards, ReduceGrads, OptimizerStep.
//   async-1f1b  w = min(S - s, M); F(0) .. F(w-1), then for every j: B(j) ReduceGrads
//               OptimizerStep and, while forwards remain, F(w+j). The update follows the backward
//               block (after SendGrad: the upstream gradient does not depend on the update).
//               PipeDream's asynchronous schedule updates each stage on its own after every
//               backward; ReduceGrads is a no-op there and sums the gradients of the update over
//               data-parallel groups and tied copies when a layout has them. `step` numbers
//               whole runs (e.g. epochs that drain at their end).
//   2bw         async-1f1b's order, with ReduceGrads OptimizerStep only after the backward blocks
//               of micro-batches j with (j + 1) mod update_every = 0 (counted from the run's
//               first): the step's gradients coalesced, one update per step.
// In-flight bound (forwarded, not yet backwarded): 1f1b and async-1f1b run the same
// forward/backward order, so both keep exactly min(S - s, M) in flight on stage s; the checker
// enforces the documented bound S - s for both, and M for gpipe. With weight stashing, async
// stage s therefore holds at most S - s weight versions (the in-flight ones; the newest is also
// the one the next forward uses).
//
// Checking, in this order (the first violation is reported, naming stage, instruction index and
// instruction): (1) every instruction valid for its stage, micro-batch ids in range, nothing
// twice, every micro-batch forwarded and backwarded; (2) sends and receives matched one to one
// between neighbours; (3) per-stage order: backward after forward, receive before the compute
// that consumes it, send after the compute that produces it; (4) a discrete-event simulation
// (forward 1, backward 2, messages free, sends asynchronous, receives block until the matching
// send has executed) that reports a deadlock with every stuck stage; (5) the in-flight bound;
// (6) ReduceGrads/OptimizerStep as the kind requires. The simulation's times are exact: a stage's
// next instruction starts at max(its own clock, the matching send's time), so the order in which
// stages are advanced does not change any time.
#include "parallel/schedule/schedule.h"

#include <algorithm>
#include <sstream>
#include <tuple>

#include "engine/check.h"

namespace strata::parallel {

const char* opcode_name(OpCode op) {
  switch (op) {
    case OpCode::kRecvAct:
      return "RecvAct";
    case OpCode::kForward:
      return "Forward";
    case OpCode::kSendAct:
      return "SendAct";
    case OpCode::kRecvGrad:
      return "RecvGrad";
    case OpCode::kBackward:
      return "Backward";
    case OpCode::kSendGrad:
      return "SendGrad";
    case OpCode::kReduceGrads:
      return "ReduceGrads";
    case OpCode::kOptimizerStep:
      return "OptimizerStep";
    case OpCode::kSwapIn:
      return "SwapIn";
  }
  return "?";
}

std::string to_string(const Instruction& instruction) {
  if (instruction.op == OpCode::kReduceGrads || instruction.op == OpCode::kOptimizerStep) {
    return opcode_name(instruction.op);
  }
  return std::string(opcode_name(instruction.op)) + "(mb " +
         std::to_string(instruction.micro_batch) + ")";
}

void add_prefetches(Program* program, int lead) {
  STRATA_CHECK_GE(lead, 1) << "add_prefetches: lead " << lead;
  auto is_compute = [](OpCode op) { return op == OpCode::kForward || op == OpCode::kBackward; };
  Program& p = *program;
  for (size_t k = 0; k < p.size(); ++k) {
    if (p[k].op != OpCode::kBackward) continue;
    const int64_t mb = p[k].micro_batch;
    bool have = false;
    size_t forward = p.size();
    for (size_t j = 0; j < k; ++j) {
      have = have || (p[j].op == OpCode::kSwapIn && p[j].micro_batch == mb);
      if (p[j].op == OpCode::kForward && p[j].micro_batch == mb) forward = j;
    }
    if (have) continue;
    STRATA_CHECK(forward < k) << "add_prefetches: " << to_string(p[k])
                              << " has no Forward before it";
    // After Forward(mb) and its SendAct at the earliest.
    size_t earliest = forward + 1;
    if (earliest < k && p[earliest].op == OpCode::kSendAct && p[earliest].micro_batch == mb) {
      ++earliest;
    }
    // The lead-th forward or backward before Backward(mb), with the receives just before it.
    size_t at = k;
    for (int seen = 0; seen < lead && at > earliest;) {
      --at;
      if (is_compute(p[at].op)) ++seen;
    }
    while (at > earliest &&
           (p[at - 1].op == OpCode::kRecvAct || p[at - 1].op == OpCode::kRecvGrad)) {
      --at;
    }
    at = std::max(at, earliest);
    p.insert(p.begin() + static_cast<std::ptrdiff_t>(at), Instruction{OpCode::kSwapIn, mb});
    ++k;  // Backward(mb) moved one place on
  }
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::k1F1B;
  if (name == "async-1f1b") return ScheduleKind::kAsync1F1B;
  if (name == "2bw") return ScheduleKind::k2BW;
  STRATA_THROW() << "unknown schedule '" << name << "' (valid: gpipe, 1f1b, async-1f1b, 2bw)";
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kAsync1F1B:
      return "async-1f1b";
    case ScheduleKind::k2BW:
      return "2bw";
  }
  return "?";
}

bool is_synchronous(ScheduleKind kind) {
  return kind != ScheduleKind::kAsync1F1B && kind != ScheduleKind::k2BW;
}

int64_t updates_per_step(ScheduleKind kind, int64_t micro_batches) {
  return kind == ScheduleKind::kAsync1F1B ? micro_batches : 1;
}

int64_t stashed_weight_versions(ScheduleKind kind, int stages, int stage, int64_t micro_batches) {
  if (kind == ScheduleKind::k2BW) return 1;
  if (kind != ScheduleKind::kAsync1F1B) return 0;
  return std::max<int64_t>(std::min<int64_t>(stages - stage, micro_batches) - 1, 0);
}

int64_t two_bw_version(int64_t step, int64_t first_step) {
  return std::max<int64_t>(step - first_step - 1, 0);
}

namespace {

void add_forward(Program& p, int stage, int stages, int64_t mb) {
  if (stage > 0) p.push_back({OpCode::kRecvAct, mb});
  p.push_back({OpCode::kForward, mb});
  if (stage < stages - 1) p.push_back({OpCode::kSendAct, mb});
}

void add_backward(Program& p, int stage, int stages, int64_t mb) {
  if (stage < stages - 1) p.push_back({OpCode::kRecvGrad, mb});
  p.push_back({OpCode::kBackward, mb});
  if (stage > 0) p.push_back({OpCode::kSendGrad, mb});
}

void add_flush(Program& p) {
  p.push_back({OpCode::kReduceGrads, -1});
  p.push_back({OpCode::kOptimizerStep, -1});
}

Program make_program(ScheduleKind kind, int s, int S, int64_t M, int64_t first,
                     int64_t update_every) {
  Program p;
  switch (kind) {
    case ScheduleKind::kGPipe:
      for (int64_t i = 0; i < M; ++i) add_forward(p, s, S, first + i);
      for (int64_t i = 0; i < M; ++i) add_backward(p, s, S, first + i);
      add_flush(p);
      break;
    case ScheduleKind::k1F1B: {
      const int64_t warmup = std::min<int64_t>(S - s - 1, M);
      for (int64_t i = 0; i < warmup; ++i) add_forward(p, s, S, first + i);
      for (int64_t j = 0; j < M - warmup; ++j) {
        add_forward(p, s, S, first + warmup + j);
        add_backward(p, s, S, first + j);
      }
      for (int64_t j = M - warmup; j < M; ++j) add_backward(p, s, S, first + j);
      add_flush(p);
      break;
    }
    case ScheduleKind::kAsync1F1B:
    case ScheduleKind::k2BW: {
      const int64_t warmup = std::min<int64_t>(S - s, M);
      for (int64_t i = 0; i < warmup; ++i) add_forward(p, s, S, first + i);
      for (int64_t j = 0; j < M; ++j) {
        add_backward(p, s, S, first + j);
        if ((j + 1) % update_every == 0) add_flush(p);
        if (warmup + j < M) add_forward(p, s, S, first + warmup + j);
      }
      break;
    }
  }
  return p;
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int stages, int64_t micro_batches, int64_t step,
                       int64_t update_every) {
  STRATA_CHECK_GE(stages, 1) << "make_schedule(" << schedule_name(kind) << "): stages";
  STRATA_CHECK_GE(micro_batches, 1)
      << "make_schedule(" << schedule_name(kind) << "): micro-batches";
  STRATA_CHECK_GE(step, 0) << "make_schedule(" << schedule_name(kind) << "): step";
  Schedule schedule;
  schedule.kind = kind;
  schedule.stages = stages;
  schedule.micro_batches = micro_batches;
  schedule.first_micro_batch = step * micro_batches;
  schedule.update_every = kind == ScheduleKind::kAsync1F1B ? 1 : micro_batches;
  if (kind == ScheduleKind::k2BW) {
    if (update_every > 0) schedule.update_every = update_every;
    STRATA_CHECK(micro_batches % schedule.update_every == 0)
        << "make_schedule(2bw): a run of " << micro_batches
        << " micro-batches is not a whole number of updates of " << schedule.update_every;
    STRATA_CHECK_GE(schedule.update_every, stages - 1)
        << "2bw needs at least S - 1 micro-batches per update (--micro-batches >= --stages - 1): "
           "with fewer, a forward would need a weight version that is not generated yet ("
        << stages << " stages)";
  }
  for (int s = 0; s < stages; ++s) {
    schedule.programs.push_back(make_program(kind, s, stages, micro_batches,
                                             schedule.first_micro_batch, schedule.update_every));
  }
  return schedule;
}

namespace {

constexpr int kNumOps = 9;
constexpr int64_t kAbsent = -1;

int64_t in_flight_bound(const Schedule& sc, int s) {
  return sc.kind == ScheduleKind::kGPipe ? sc.micro_batches : sc.stages - s;
}

std::string at(int s, size_t k, const Instruction& in) {
  std::ostringstream o;
  o << "stage " << s << ", instruction " << k << " (" << to_string(in) << ")";
  return o.str();
}

std::string ins(OpCode op, int64_t mb) { return to_string(Instruction{op, mb}); }

// Where each (opcode, micro-batch) sits in one stage's program: pos[op][mb - first].
struct Positions {
  std::vector<std::vector<int64_t>> pos;
  int64_t of(OpCode op, int64_t index) const { return pos[static_cast<int>(op)][index]; }
};

// Step (1): instruction validity, ranges, duplicates, completeness. Fills `positions`.
std::string check_structure(const Schedule& sc, std::vector<Positions>* positions) {
  const int S = sc.stages;
  const int64_t M = sc.micro_batches, first = sc.first_micro_batch;
  for (int s = 0; s < S; ++s) {
    Positions& P = (*positions)[s];
    P.pos.assign(kNumOps, std::vector<int64_t>(M, kAbsent));
    const Program& program = sc.programs[s];
    for (size_t k = 0; k < program.size(); ++k) {
      const Instruction& in = program[k];
      if (static_cast<int>(in.op) >= kNumOps) {
        return "stage " + std::to_string(s) + ", instruction " + std::to_string(k) +
               ": unknown opcode " + std::to_string(static_cast<int>(in.op));
      }
      const bool global = in.op == OpCode::kReduceGrads || in.op == OpCode::kOptimizerStep;
      if ((in.op == OpCode::kRecvAct || in.op == OpCode::kSendGrad) && s == 0) {
        return at(s, k, in) + ": the first stage has no previous stage to talk to";
      }
      if ((in.op == OpCode::kSendAct || in.op == OpCode::kRecvGrad) && s == S - 1) {
        return at(s, k, in) + ": the last stage has no next stage to talk to";
      }
      if (global) {
        if (in.micro_batch != -1) return at(s, k, in) + ": takes micro-batch -1, not a number";
        continue;
      }
      if (in.micro_batch < first || in.micro_batch >= first + M) {
        std::ostringstream o;
        o << at(s, k, in) << ": micro-batch outside this schedule's range [" << first << ", "
          << first + M << ")";
        return o.str();
      }
      int64_t& slot = P.pos[static_cast<int>(in.op)][in.micro_batch - first];
      if (slot != kAbsent) {
        return "stage " + std::to_string(s) + ": " + to_string(in) +
               " appears twice (instructions " + std::to_string(slot) + " and " +
               std::to_string(k) + ")";
      }
      slot = static_cast<int64_t>(k);
    }
    for (int64_t i = 0; i < M; ++i) {
      for (OpCode op : {OpCode::kForward, OpCode::kBackward}) {
        if (P.of(op, i) == kAbsent) {
          return "stage " + std::to_string(s) + " never runs " + ins(op, first + i);
        }
      }
    }
  }
  return "";
}

// Step (2): one-to-one matching of `send` on stage `from` with `recv` on stage `to`.
std::string check_channel(const Schedule& sc, const std::vector<Positions>& P, OpCode send,
                          OpCode recv, int from, int to) {
  const int64_t first = sc.first_micro_batch;
  // Report in program order of the sender, then of the receiver.
  for (const auto& [stage, op, other_stage, other_op] :
       {std::make_tuple(from, send, to, recv), std::make_tuple(to, recv, from, send)}) {
    const Program& program = sc.programs[stage];
    for (size_t k = 0; k < program.size(); ++k) {
      if (program[k].op != op) continue;
      const int64_t mb = program[k].micro_batch;
      if (P[other_stage].of(other_op, mb - first) == kAbsent) {
        return at(stage, k, program[k]) + " has no matching " + ins(other_op, mb) + " on stage " +
               std::to_string(other_stage);
      }
    }
  }
  return "";
}

// Step (3): order inside one stage.
std::string check_order(const Schedule& sc, const std::vector<Positions>& positions) {
  const int S = sc.stages;
  const int64_t first = sc.first_micro_batch;
  for (int s = 0; s < S; ++s) {
    const Positions& P = positions[s];
    const std::string stage = "stage " + std::to_string(s) + ": ";
    // `earlier` must exist and come before `later` wherever `later` exists (on the stages where
    // the rule applies).
    // `optional`: the rule holds where both exist (a SwapIn is not required before a Backward).
    struct Rule {
      OpCode earlier, later;
      bool applies;
      bool optional = false;
    };
    const Rule rules[] = {
        {OpCode::kForward, OpCode::kBackward, true},
        {OpCode::kRecvAct, OpCode::kForward, s > 0},
        {OpCode::kForward, OpCode::kSendAct, s < S - 1},
        {OpCode::kRecvGrad, OpCode::kBackward, s < S - 1},
        {OpCode::kBackward, OpCode::kSendGrad, s > 0},
        {OpCode::kForward, OpCode::kSwapIn, true},
        {OpCode::kSwapIn, OpCode::kBackward, true, true},
    };
    for (int64_t i = 0; i < sc.micro_batches; ++i) {
      for (const Rule& r : rules) {
        if (!r.applies) continue;
        const int64_t e = P.of(r.earlier, i), l = P.of(r.later, i);
        if (l == kAbsent) continue;  // a missing send is a matching error (step 2)
        if (e == kAbsent && r.optional) continue;
        if (e == kAbsent) {
          return stage + ins(r.later, first + i) + " at instruction " + std::to_string(l) +
                 " has no " + ins(r.earlier, first + i) + " before it";
        }
        if (e > l) {
          return stage + ins(r.later, first + i) + " at instruction " + std::to_string(l) +
                 " comes before its " + ins(r.earlier, first + i) + " at instruction " +
                 std::to_string(e);
        }
      }
    }
  }
  return "";
}

// Step (4): the discrete-event simulation. Costs per stage; fills makespan and busy time.
std::string simulate(const Schedule& sc, const std::vector<double>& forward_cost,
                     const std::vector<double>& backward_cost, double* makespan,
                     std::vector<double>* busy) {
  const int S = sc.stages;
  const int64_t M = sc.micro_batches, first = sc.first_micro_batch;
  const double kNotSent = -1.0;
  // act_sent[s][i]: time micro-batch i's activations were sent into stage s (by s - 1);
  // grad_sent[s][i]: time its gradients were sent into stage s (by s + 1).
  std::vector<std::vector<double>> act_sent(S, std::vector<double>(M, kNotSent));
  std::vector<std::vector<double>> grad_sent = act_sent;
  std::vector<size_t> pc(S, 0);
  std::vector<double> clock(S, 0.0);
  busy->assign(S, 0.0);
  size_t done = 0;
  while (done < static_cast<size_t>(S)) {
    bool progress = false;
    done = 0;
    for (int s = 0; s < S; ++s) {
      const Program& program = sc.programs[s];
      while (pc[s] < program.size()) {
        const Instruction& in = program[pc[s]];
        const int64_t i = in.micro_batch - first;
        if (in.op == OpCode::kRecvAct || in.op == OpCode::kRecvGrad) {
          const double sent = in.op == OpCode::kRecvAct ? act_sent[s][i] : grad_sent[s][i];
          if (sent == kNotSent) break;  // blocked
          clock[s] = std::max(clock[s], sent);
        } else if (in.op == OpCode::kSendAct) {
          act_sent[s + 1][i] = clock[s];
        } else if (in.op == OpCode::kSendGrad) {
          grad_sent[s - 1][i] = clock[s];
        } else if (in.op == OpCode::kForward || in.op == OpCode::kBackward) {
          const double cost = in.op == OpCode::kForward ? forward_cost[s] : backward_cost[s];
          clock[s] += cost;
          (*busy)[s] += cost;
        }
        ++pc[s];
        progress = true;
      }
      if (pc[s] == program.size()) ++done;
    }
    if (!progress && done < static_cast<size_t>(S)) {
      std::ostringstream o;
      o << "deadlock: no stage can proceed;";
      const char* sep = " ";
      for (int s = 0; s < S; ++s) {
        if (pc[s] == sc.programs[s].size()) continue;
        const Instruction& in = sc.programs[s][pc[s]];
        const int from = in.op == OpCode::kRecvAct ? s - 1 : s + 1;
        o << sep << at(s, pc[s], in) << " waits for stage " << from;
        sep = ", ";
      }
      return o.str();
    }
  }
  *makespan = S > 0 ? *std::max_element(clock.begin(), clock.end()) : 0.0;
  return "";
}

// Step (5): in-flight micro-batches per stage, against the kind's bound.
std::string check_in_flight(const Schedule& sc, std::vector<int64_t>* max_in_flight) {
  std::string error;
  max_in_flight->assign(sc.stages, 0);
  for (int s = 0; s < sc.stages; ++s) {
    int64_t now = 0;
    const Program& program = sc.programs[s];
    for (size_t k = 0; k < program.size(); ++k) {
      if (program[k].op == OpCode::kForward) ++now;
      if (program[k].op == OpCode::kBackward) --now;
      if (now > (*max_in_flight)[s]) {
        (*max_in_flight)[s] = now;
        const int64_t bound = in_flight_bound(sc, s);
        if (now > bound && error.empty()) {
          std::ostringstream o;
          o << "stage " << s << " has " << now << " micro-batches in flight after instruction " << k
            << " (" << to_string(program[k]) << "); " << schedule_name(sc.kind)
            << " allows at most " << (sc.kind == ScheduleKind::kGPipe ? "M = " : "S - s = ")
            << bound;
          error = o.str();
        }
      }
    }
  }
  return error;
}

// Step (6): ReduceGrads and OptimizerStep as the kind requires.
std::string check_updates(const Schedule& sc) {
  for (int s = 0; s < sc.stages; ++s) {
    const Program& p = sc.programs[s];
    const std::string stage = "stage " + std::to_string(s) + ": ";
    if (is_synchronous(sc.kind)) {
      const size_t n = p.size();
      const bool ends_right =
          n >= 2 && p[n - 2].op == OpCode::kReduceGrads && p[n - 1].op == OpCode::kOptimizerStep;
      if (!ends_right) {
        return stage + schedule_name(sc.kind) +
               " must end the step with ReduceGrads then OptimizerStep (the flush), but the "
               "program ends with " +
               (n > 0 ? to_string(p[n - 1]) : std::string("nothing"));
      }
      for (size_t k = 0; k + 2 < n; ++k) {
        if (p[k].op == OpCode::kReduceGrads || p[k].op == OpCode::kOptimizerStep) {
          return at(s, k, p[k]) + ": " + schedule_name(sc.kind) +
                 " updates once, with ReduceGrads then OptimizerStep as the last two "
                 "instructions of the step";
        }
      }
      continue;
    }
    // async-1f1b updates after every backward, 2bw after every update_every-th.
    const int64_t every = sc.kind == ScheduleKind::k2BW ? std::max<int64_t>(sc.update_every, 1) : 1;
    int64_t pending = -1;   // the backward waiting for its update
    bool reduced = false;   // its ReduceGrads has been seen
    int64_t backwards = 0;  // seen so far
    for (size_t k = 0; k < p.size(); ++k) {
      const Instruction& in = p[k];
      if (in.op == OpCode::kReduceGrads) {
        if (pending < 0 || reduced) {
          return at(s, k, in) + (every == 1 ? ": follows no Backward (one ReduceGrads per backward)"
                                            : ": follows no Backward that ends an update (one "
                                              "ReduceGrads per " +
                                                  std::to_string(every) + " backwards)");
        }
        reduced = true;
      } else if (in.op == OpCode::kOptimizerStep) {
        if (pending < 0) {
          return at(s, k, in) + (every == 1 ? ": follows no Backward (one update per backward)"
                                            : ": follows no Backward that ends an update (one "
                                              "update per " +
                                                  std::to_string(every) + " backwards)");
        }
        if (!reduced) return at(s, k, in) + ": needs a ReduceGrads right before it";
        pending = -1;
        reduced = false;
      } else if (in.op == OpCode::kSendGrad && in.micro_batch == pending && !reduced) {
        continue;
      } else if (pending >= 0) {
        return at(s, k, in) + ": " + schedule_name(sc.kind) +
               " needs ReduceGrads and OptimizerStep right after " +
               ins(OpCode::kBackward, pending);
      } else if (in.op == OpCode::kBackward && ++backwards % every == 0) {
        pending = in.micro_batch;
      }
    }
    if (pending >= 0) {
      return stage + "the program ends without the OptimizerStep after " +
             ins(OpCode::kBackward, pending);
    }
    if (backwards % every != 0) {
      return stage + "the program ends with the gradients of " + std::to_string(backwards % every) +
             " backward(s) never applied (2bw updates after every " + std::to_string(every) + ")";
    }
  }
  return "";
}

// Steps (1)-(3): the schedule's shape, then everything that does not need the simulation.
std::string check_static(const Schedule& sc) {
  if (sc.stages < 1) return "a schedule needs at least one stage, got " + std::to_string(sc.stages);
  if (sc.micro_batches < 1) {
    return "a schedule needs at least one micro-batch, got " + std::to_string(sc.micro_batches);
  }
  if (sc.programs.size() != static_cast<size_t>(sc.stages)) {
    return "schedule has " + std::to_string(sc.programs.size()) + " programs for " +
           std::to_string(sc.stages) + " stages";
  }
  std::vector<Positions> positions(sc.stages);
  std::string error = check_structure(sc, &positions);
  for (int s = 0; s + 1 < sc.stages && error.empty(); ++s) {
    error = check_channel(sc, positions, OpCode::kSendAct, OpCode::kRecvAct, s, s + 1);
    if (error.empty()) {
      error = check_channel(sc, positions, OpCode::kSendGrad, OpCode::kRecvGrad, s + 1, s);
    }
  }
  if (error.empty()) error = check_order(sc, positions);
  return error;
}

}  // namespace

ScheduleCheck check_schedule(const Schedule& schedule) {
  ScheduleCheck result;
  result.error = check_static(schedule);
  if (!result.error.empty()) return result;
  std::vector<double> busy;
  result.error = simulate(schedule, std::vector<double>(schedule.stages, 1.0),
                          std::vector<double>(schedule.stages, 2.0), &result.makespan, &busy);
  if (!result.error.empty()) return result;
  double idle = 0.0;
  for (double b : busy) idle += result.makespan - b;
  result.bubble_fraction = result.makespan > 0 ? idle / (schedule.stages * result.makespan) : 0.0;
  result.error = check_in_flight(schedule, &result.max_in_flight);
  if (result.error.empty()) result.error = check_updates(schedule);
  result.ok = result.error.empty();
  return result;
}

Simulation simulate_schedule(const Schedule& schedule, const std::vector<double>& forward_cost,
                             const std::vector<double>& backward_cost) {
  const ScheduleCheck check = check_schedule(schedule);
  STRATA_CHECK(check.ok) << "simulate_schedule: invalid " << schedule_name(schedule.kind)
                         << " schedule: " << check.error;
  const size_t S = static_cast<size_t>(schedule.stages);
  STRATA_CHECK(forward_cost.size() == S && backward_cost.size() == S)
      << "simulate_schedule: " << forward_cost.size() << " forward and " << backward_cost.size()
      << " backward costs for " << S << " stages";
  for (size_t s = 0; s < S; ++s) {
    STRATA_CHECK(forward_cost[s] >= 0.0 && backward_cost[s] >= 0.0)
        << "simulate_schedule: negative cost on stage " << s;
  }
  Simulation sim;
  const std::string error =
      simulate(schedule, forward_cost, backward_cost, &sim.makespan, &sim.busy);
  STRATA_CHECK(error.empty()) << "simulate_schedule: " << error;
  double idle = 0.0;
  for (double b : sim.busy) idle += sim.makespan - b;
  sim.bubble_fraction = sim.makespan > 0 ? idle / (static_cast<double>(S) * sim.makespan) : 0.0;
  return sim;
}

double theoretical_bubble_fraction(ScheduleKind kind, int stages, int64_t micro_batches) {
  STRATA_CHECK_GE(stages, 1) << "theoretical_bubble_fraction(" << schedule_name(kind) << ")";
  STRATA_CHECK_GE(micro_batches, 1) << "theoretical_bubble_fraction(" << schedule_name(kind) << ")";
  // Equal stages, forward f and backward b = 2f: gpipe and 1f1b finish after (M + S - 1)(f + b)
  // (GroPipe Sec. 2.2 closed form, applied to the forward and the backward wave); each stage is
  // busy M(f + b) of it. async-1f1b runs the same forward/backward order over its M micro-batches
  // (updates cost nothing here), so its warm-up and drain idle the same share.
  const double S = stages, M = static_cast<double>(micro_batches);
  return (S - 1.0) / (M + S - 1.0);
}

}  // namespace strata::parallel
