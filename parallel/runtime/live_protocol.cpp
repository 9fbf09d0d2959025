// The live migration protocol replayed over async-1f1b's programs (see the header).
#include "parallel/runtime/live_protocol.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <sstream>

#include "engine/check.h"
#include "parallel/runtime/stage_layout.h"
#include "parallel/schedule/schedule.h"

namespace strata::parallel {

int64_t async_forward_version(int stages, int stage, int64_t j) {
  return std::max<int64_t>(0, j - stages + stage + 1);
}

namespace {

// What a stage holds of one move's layers.
struct Holding {
  bool holds = false;                // the parameters (latest version)
  int64_t latest = 0;                // updates applied to them
  std::set<int64_t> stashed;         // older versions kept (weight stashing)
  std::map<int64_t, int64_t> tapes;  // micro-batch -> the version its forward used
};

// A migration message: a tape (micro_batch >= 0) or the hand-off (micro_batch -1).
struct Message {
  int64_t micro_batch = -1;
  int64_t version = 0;           // tape: its forward's version; hand-off: the latest
  std::vector<int64_t> stashed;  // hand-off: older versions that go with it
  int64_t arrives = -1;          // tick (random-delay transport), -1 while on the link
};

struct MoveState {
  BoundaryMove move;
  std::vector<Holding> stage;                 // per stage
  bool started = false;                       // prepare sent
  int64_t ready_at = -1;                      // tick `ready` is back at src
  std::deque<Message> outbox;                 // posted by src, not sent before ready
  std::deque<std::shared_ptr<Message>> wire;  // sent, in order
  int64_t last_arrival = 0;
  bool handoff_arrived = false;
  std::set<int64_t> tapes_arrived;
  std::set<int64_t> versions_moved;
  bool first_forward_done = false;  // tgt ran Forward(F)
};

// One direction between neighbouring stages in the link model.
struct Link {
  struct Piece {
    bool training = false;
    int64_t bytes = 0;
    std::function<void(int64_t tick)> delivered;  // null for a chunk that is not an item's last
  };
  std::deque<Piece> queue;
  bool busy = false;
  Piece current;
  int64_t left = 0;
  int64_t migration_queued = 0;  // bytes of migration chunks queued (the window)
};

bool has_version(const Holding& h, int64_t version) {
  return (h.holds && h.latest == version) || h.stashed.count(version) > 0;
}

bool covers(const LayerRange& r, const BoundaryMove& m) {
  return r.begin <= m.begin && m.end <= r.end;
}

// Drops the stashed versions of stage s no tape needs (PipeDream's release); tgt of a move up
// keeps the version its first forward of the layers needs until that forward ran.
void prune(MoveState& ms, int s, int stages) {
  Holding& h = ms.stage[static_cast<size_t>(s)];
  for (auto it = h.stashed.begin(); it != h.stashed.end();) {
    bool needed = false;
    for (const auto& [mb, v] : h.tapes) needed = needed || v == *it;
    needed = needed || (s == ms.move.tgt && !ms.first_forward_done &&
                        *it == async_forward_version(stages, s, ms.move.first_forward));
    it = needed ? std::next(it) : h.stashed.erase(it);
  }
}

}  // namespace

LiveReplayResult replay_live_migration(const LiveReplayOptions& o) {
  const int S = static_cast<int>(o.initial.size());
  STRATA_CHECK(S >= 2) << "live replay: needs at least 2 stages";
  STRATA_CHECK(o.max_delay >= 0 && o.forward_ticks >= 1 && o.backward_ticks >= 1 &&
               o.bandwidth >= 0 && o.chunk_bytes >= 0 && o.window_bytes >= 0)
      << "live replay: bad options";
  StageLayout layout(o.initial);
  layout.add_live_migration(o.next, o.first_backward);
  STRATA_CHECK(!layout.migrations()[0].empty()) << "live replay: the partitions are the same";
  const int64_t K = o.first_backward;
  int64_t last_switch = 0;
  for (const BoundaryMove& m : layout.migrations()[0]) {
    last_switch = std::max(last_switch, o.restart ? K : m.first_forward);
  }
  STRATA_CHECK(o.micro_batches > last_switch)
      << "live replay: " << o.micro_batches << " micro-batches end before the migration does "
      << "(micro-batch " << last_switch << ")";
  // The programs: one async-1f1b run, or (restart) one that drains at K and one from K.
  std::vector<Program> programs =
      make_schedule(ScheduleKind::kAsync1F1B, S, o.restart ? K : o.micro_batches, 0, 1).programs;
  if (o.restart) {
    const Schedule after = make_schedule(ScheduleKind::kAsync1F1B, S, o.micro_batches - K, 0, 1);
    for (int s = 0; s < S; ++s) {
      for (Instruction in : after.programs[static_cast<size_t>(s)]) {
        if (in.micro_batch >= 0) in.micro_batch += K;
        programs[static_cast<size_t>(s)].push_back(in);
      }
    }
  }
  // The layers each stage runs for micro-batch j (restart: both switch at K).
  auto forward_range = [&](int s, int64_t j) {
    if (!o.restart) return layout.forward_range(s, j);
    return j < K ? o.initial[static_cast<size_t>(s)] : o.next[static_cast<size_t>(s)];
  };
  auto backward_range = [&](int s, int64_t j) {
    if (!o.restart) return layout.backward_range(s, j);
    return j < K ? o.initial[static_cast<size_t>(s)] : o.next[static_cast<size_t>(s)];
  };
  std::mt19937_64 rng(o.seed);
  auto delay = [&]() -> int64_t {
    if (o.bandwidth > 0) return 0;
    return static_cast<int64_t>(rng() % static_cast<uint64_t>(o.max_delay + 1));
  };

  LiveReplayResult result;
  result.done_at.assign(static_cast<size_t>(o.micro_batches), -1);
  std::vector<MoveState> moves;
  for (const BoundaryMove& m : layout.migrations()[0]) {
    MoveState ms;
    ms.move = m;
    if (o.restart) ms.move.first_forward = K;
    ms.stage.resize(static_cast<size_t>(S));
    ms.stage[static_cast<size_t>(m.src)].holds = true;
    LiveReplayResult::Move r;
    r.src = m.src;
    r.tgt = m.tgt;
    r.first_backward = m.first_backward;
    r.first_forward = ms.move.first_forward;
    moves.push_back(std::move(ms));
    result.moves.push_back(r);
  }
  auto violate = [&](const std::string& what) { result.violations.push_back(what); };

  int64_t tick = 0;
  // The link model: one Link per direction (from, to).
  std::map<std::pair<int, int>, Link> links;
  auto enqueue = [&](int from, int to, bool training, int64_t bytes,
                     std::function<void(int64_t)> delivered) {
    Link& l = links[{from, to}];
    l.queue.push_back({training, bytes, std::move(delivered)});
    if (!training) l.migration_queued += bytes;
  };
  // Training messages: activations and gradients, by (receiving stage, micro-batch).
  std::map<std::pair<int, int64_t>, int64_t> act_arrives, grad_arrives;
  auto send_training = [&](std::map<std::pair<int, int64_t>, int64_t>& arrives, int from, int to,
                           int64_t j) {
    if (o.bandwidth == 0) {
      arrives[{to, j}] = tick + delay();
      return;
    }
    enqueue(from, to, true, o.activation_bytes, [&arrives, to, j](int64_t at) {
      arrives[{to, j}] = at;
    });
  };
  auto arrived = [&](const std::map<std::pair<int, int64_t>, int64_t>& arrives, int s, int64_t j) {
    auto it = arrives.find({s, j});
    return it != arrives.end() && it->second <= tick;
  };
  int64_t in_flight = 0;  // micro-batches forwarded on stage 0, not yet backwarded there
  auto start_move = [&](MoveState& ms, LiveReplayResult::Move& r) {
    r.min_in_flight = r.min_in_flight < 0 ? in_flight : std::min(r.min_in_flight, in_flight);
    ms.started = true;
    ms.ready_at = tick + delay() + delay();  // prepare there, ready back (control: no bytes)
    if (result.migration_start < 0) result.migration_start = tick;
  };

  std::vector<size_t> pc(static_cast<size_t>(S), 0);
  std::vector<int64_t> updates(static_cast<size_t>(S), 0);
  std::vector<int64_t> last_backward(static_cast<size_t>(S), -1);
  std::vector<int64_t> busy_until(static_cast<size_t>(S), 0);

  auto step_stage = [&](int s) -> bool {
    const size_t si = static_cast<size_t>(s);
    const Program& p = programs[si];
    if (pc[si] >= p.size() || busy_until[si] > tick) return false;
    const Instruction in = p[pc[si]];
    const int64_t j = in.micro_batch;
    switch (in.op) {
      case OpCode::kRecvAct:
        if (!arrived(act_arrives, s, j)) return false;
        break;
      case OpCode::kRecvGrad:
        if (!arrived(grad_arrives, s, j)) return false;
        break;
      case OpCode::kSendAct:
        send_training(act_arrives, s, s + 1, j);
        break;
      case OpCode::kSendGrad:
        send_training(grad_arrives, s, s - 1, j);
        break;
      case OpCode::kForward: {
        const LayerRange range = forward_range(s, j);
        // Step 3's gate: tgt runs the layers' first forward once the hand-off is here.
        for (const MoveState& ms : moves) {
          if (covers(range, ms.move) && s == ms.move.tgt && !ms.handoff_arrived) return false;
        }
        for (size_t k = 0; k < moves.size(); ++k) {
          MoveState& ms = moves[k];
          LiveReplayResult::Move& r = result.moves[k];
          if (!covers(range, ms.move)) continue;
          Holding& h = ms.stage[si];
          const int64_t version = updates[si];  // the stage's own update count
          if (!has_version(h, version)) {
            violate("Forward(" + std::to_string(j) + ") on stage " + std::to_string(s) +
                    " needs version " + std::to_string(version) +
                    " of the moved layers, which it does not hold");
          }
          r.forward_stage[j] = s;
          r.forward_version[j] = version;
          if (s == ms.move.tgt) ms.first_forward_done = true;
          // Step 0 starts at src's Forward(K); step 1 posts the tapes of [K, F) as they exist.
          if (s == ms.move.src && j == ms.move.first_backward && !ms.started) start_move(ms, r);
          if (s == ms.move.src && j >= ms.move.first_backward && j < ms.move.first_forward) {
            ms.outbox.push_back({j, version, {}, -1});  // the tape and its weights leave src
            r.tapes_moved.push_back(j);
          } else {
            h.tapes[j] = version;
          }
          prune(ms, s, S);
        }
        if (s == 0) ++in_flight;
        busy_until[si] = tick + o.forward_ticks;
        break;
      }
      case OpCode::kBackward: {
        const LayerRange range = backward_range(s, j);
        for (const MoveState& ms : moves) {
          if (!covers(range, ms.move) || s != ms.move.tgt) continue;
          if (!ms.handoff_arrived) return false;
          if (j < ms.move.first_forward && ms.tapes_arrived.count(j) == 0) return false;
        }
        for (size_t k = 0; k < moves.size(); ++k) {
          MoveState& ms = moves[k];
          LiveReplayResult::Move& r = result.moves[k];
          if (!covers(range, ms.move)) continue;
          Holding& h = ms.stage[si];
          auto tape = h.tapes.find(j);
          if (tape == h.tapes.end()) {
            violate("Backward(" + std::to_string(j) + ") on stage " + std::to_string(s) +
                    " has no tape of the moved layers");
          } else {
            if (!has_version(h, tape->second)) {
              violate("Backward(" + std::to_string(j) + ") on stage " + std::to_string(s) +
                      " needs version " + std::to_string(tape->second) + ", not held");
            }
            r.backward_version[j] = tape->second;
            h.tapes.erase(tape);
          }
          r.backward_stage[j] = s;
          ++r.backward_runs[j];
        }
        last_backward[si] = j;
        busy_until[si] = tick + o.backward_ticks;
        if (s == 0) {
          --in_flight;
          result.done_at[static_cast<size_t>(j)] = busy_until[si];
        }
        break;
      }
      case OpCode::kOptimizerStep: {
        const int64_t b = last_backward[si];
        for (size_t k = 0; k < moves.size(); ++k) {
          MoveState& ms = moves[k];
          LiveReplayResult::Move& r = result.moves[k];
          if (b < 0 || !covers(backward_range(s, b), ms.move)) continue;
          Holding& h = ms.stage[si];
          if (!h.holds || h.latest != b) {
            violate("stage " + std::to_string(s) + " applies the update of Backward(" +
                    std::to_string(b) + ") to the moved layers at version " +
                    std::to_string(h.latest) + (h.holds ? "" : " it does not hold"));
          }
          const bool handoff = s == ms.move.src && b == ms.move.first_backward - 1;
          const bool up = ms.move.tgt < ms.move.src && !o.restart;
          // Stashing: the latest is kept when a tape needs it, or for the hand-off of a live
          // move up (tgt's first forward of the layers uses the version before this update).
          bool needed = handoff && up;
          for (const auto& [mb, v] : h.tapes) needed = needed || v == h.latest;
          if (needed) h.stashed.insert(h.latest);
          h.latest = b + 1;
          r.update_order.push_back(b);
          if (handoff) {  // step 2: the parameters go, and src drops the layers
            Message m{-1, h.latest, {}, -1};
            if (up) m.stashed.push_back(h.latest - 1);
            ms.outbox.push_back(m);
            r.source_tapes_after = static_cast<int64_t>(h.tapes.size());
            h = Holding();
            r.source_versions_after = 0;
            r.handed_off = true;
            if (!ms.started) start_move(ms, r);  // no tape moves: step 0 now
          }
          prune(ms, s, S);
        }
        ++updates[si];
        break;
      }
      case OpCode::kReduceGrads:
      case OpCode::kSwapIn:
        break;
    }
    ++pc[si];
    return true;
  };

  // A migration message arrives at tgt.
  auto receive = [&](MoveState& ms, LiveReplayResult::Move& r, const Message& m) {
    Holding& h = ms.stage[static_cast<size_t>(ms.move.tgt)];
    if (m.micro_batch >= 0) {
      h.tapes[m.micro_batch] = m.version;
      h.stashed.insert(m.version);
      ms.versions_moved.insert(m.version);
      ms.tapes_arrived.insert(m.micro_batch);
    } else {
      h.holds = true;
      h.latest = m.version;
      for (int64_t v : m.stashed) {
        h.stashed.insert(v);
        ms.versions_moved.insert(v);
      }
      ms.handoff_arrived = true;
    }
    prune(ms, ms.move.tgt, S);
    r.stash_versions_moved = static_cast<int64_t>(ms.versions_moved.size());
  };

  auto transport = [&] {
    for (size_t k = 0; k < moves.size(); ++k) {
      MoveState& ms = moves[k];
      LiveReplayResult::Move& r = result.moves[k];
      if (ms.started && ms.ready_at <= tick) {
        while (!ms.outbox.empty()) {  // in order, after ready
          auto m = std::make_shared<Message>(ms.outbox.front());
          if (o.bandwidth > 0) {
            // Flow control: no more than the window of migration chunks queued on the link.
            if (o.priority && o.window_bytes > 0 &&
                links[{ms.move.src, ms.move.tgt}].migration_queued >= o.window_bytes) {
              break;
            }
            const int64_t bytes = m->micro_batch >= 0 ? o.tape_bytes : o.param_bytes;
            const int64_t chunk = o.chunk_bytes > 0 ? o.chunk_bytes : std::max<int64_t>(bytes, 1);
            for (int64_t sent = 0; sent < std::max<int64_t>(bytes, 1); sent += chunk) {
              const bool last = sent + chunk >= bytes;
              enqueue(ms.move.src, ms.move.tgt, false, std::min(chunk, bytes - sent),
                      last ? std::function<void(int64_t)>([m](int64_t at) { m->arrives = at; })
                           : nullptr);
            }
          } else {
            m->arrives = std::max(ms.last_arrival, tick + delay());
            ms.last_arrival = m->arrives;
          }
          ms.outbox.pop_front();
          ms.wire.push_back(m);
        }
      }
      while (!ms.wire.empty() && ms.wire.front()->arrives >= 0 &&
             ms.wire.front()->arrives <= tick) {
        receive(ms, r, *ms.wire.front());
        ms.wire.pop_front();
      }
      const bool running = ms.started && !(ms.handoff_arrived && ms.wire.empty());
      if (running) {
        r.min_in_flight = r.min_in_flight < 0 ? in_flight : std::min(r.min_in_flight, in_flight);
      }
    }
    bool all_there = true;
    for (const MoveState& ms : moves) {
      all_there = all_there && ms.handoff_arrived && ms.wire.empty() && ms.outbox.empty();
    }
    if (all_there && result.migration_end < 0) result.migration_end = tick;
    // The links move their bytes of this tick.
    for (auto& [ends, l] : links) {
      int64_t budget = o.bandwidth;
      while (budget > 0) {
        if (!l.busy) {
          if (l.queue.empty()) break;
          auto next = l.queue.begin();
          if (o.priority) {
            for (auto it = l.queue.begin(); it != l.queue.end(); ++it) {
              if (it->training) {
                next = it;
                break;
              }
            }
          }
          l.current = std::move(*next);
          l.queue.erase(next);
          if (!l.current.training) l.migration_queued -= l.current.bytes;
          l.left = l.current.bytes;
          l.busy = true;
        }
        const int64_t moved = std::min(budget, l.left);
        budget -= moved;
        l.left -= moved;
        if (l.left == 0) {
          l.busy = false;
          if (l.current.delivered) l.current.delivered(tick + 1);
        }
      }
    }
  };

  std::vector<int> order(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) order[static_cast<size_t>(s)] = s;
  int64_t stalled = 0;
  const int64_t patience =
      4 * (o.max_delay + 2) + 8 + o.forward_ticks + o.backward_ticks +
      (o.bandwidth > 0 ? (o.param_bytes + o.tape_bytes + o.activation_bytes) / o.bandwidth + 4 : 0);
  while (true) {
    bool done = true;
    for (int s = 0; s < S; ++s) {
      done = done && pc[static_cast<size_t>(s)] >= programs[static_cast<size_t>(s)].size();
    }
    if (done) break;
    std::shuffle(order.begin(), order.end(), rng);
    bool progress = false;
    for (int s : order) {
      // Instructions that take no time run on in the same tick; Forward and Backward end it.
      while (step_stage(s)) {
        progress = true;
        if (busy_until[static_cast<size_t>(s)] > tick) break;
      }
    }
    transport();
    bool moving = false;
    for (const auto& [ends, l] : links) moving = moving || l.busy || !l.queue.empty();
    for (int s = 0; s < S; ++s) moving = moving || busy_until[static_cast<size_t>(s)] > tick;
    for (const MoveState& ms : moves) moving = moving || !ms.wire.empty() || !ms.outbox.empty();
    ++tick;
    stalled = progress || moving ? 0 : stalled + 1;
    if (stalled > patience) {
      std::string where;
      for (int s = 0; s < S; ++s) {
        const Program& p = programs[static_cast<size_t>(s)];
        const size_t i = pc[static_cast<size_t>(s)];
        where += " stage " + std::to_string(s) + ": " +
                 (i < p.size() ? std::string(opcode_name(p[i].op)) + "(" +
                                     std::to_string(p[i].micro_batch) + ")"
                               : std::string("done"));
      }
      violate("deadlock at tick " + std::to_string(tick) + ":" + where);
      break;
    }
  }
  result.ticks = tick;
  for (size_t k = 0; k < moves.size(); ++k) {
    const MoveState& ms = moves[k];
    const Holding& src = ms.stage[static_cast<size_t>(ms.move.src)];
    const Holding& tgt = ms.stage[static_cast<size_t>(ms.move.tgt)];
    if (src.holds || !src.tapes.empty() || !src.stashed.empty()) {
      violate("stage " + std::to_string(ms.move.src) + " still holds moved layers at the end");
    }
    if (!tgt.holds || tgt.latest != o.micro_batches) {
      violate("stage " + std::to_string(ms.move.tgt) + " ends with the moved layers at version " +
              std::to_string(tgt.latest) + " of " + std::to_string(o.micro_batches));
    }
  }
  return result;
}

}  // namespace strata::parallel
