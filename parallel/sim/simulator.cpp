// The discrete-event engine (see simulator.h).
//
// Ranks advance in rounds: each runs its instructions until one must wait for something another
// rank has not done yet (a message not sent, a collective not launched by every participant, a
// barrier not reached), then the next rank runs. Every wait resolves to a time computed from
// what the others did, so the times do not depend on the order of the rounds. Memory is a list
// of (time, bytes) changes per rank, some of them in the future of the rank's clock (a send
// buffer freed when its message arrives, a swapped tape freed when its copy ends); the peak is
// the largest running sum after sorting them (frees first at equal times).
#include "parallel/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel::sim {

const char* sim_op_name(SimOp op) {
  switch (op) {
    case SimOp::kRecvAct:
      return "RecvAct";
    case SimOp::kForward:
      return "Forward";
    case SimOp::kSendAct:
      return "SendAct";
    case SimOp::kRecvGrad:
      return "RecvGrad";
    case SimOp::kBackward:
      return "Backward";
    case SimOp::kSendGrad:
      return "SendGrad";
    case SimOp::kReduceGrads:
      return "ReduceGrads";
    case SimOp::kOptimizerStep:
      return "OptimizerStep";
    case SimOp::kSwapIn:
      return "SwapIn";
    case SimOp::kStepEnd:
      return "StepEnd";
  }
  return "?";
}

SimOp to_sim_op(OpCode op) {
  switch (op) {
    case OpCode::kRecvAct:
      return SimOp::kRecvAct;
    case OpCode::kForward:
      return SimOp::kForward;
    case OpCode::kSendAct:
      return SimOp::kSendAct;
    case OpCode::kRecvGrad:
      return SimOp::kRecvGrad;
    case OpCode::kBackward:
      return SimOp::kBackward;
    case OpCode::kSendGrad:
      return SimOp::kSendGrad;
    case OpCode::kReduceGrads:
      return SimOp::kReduceGrads;
    case OpCode::kOptimizerStep:
      return SimOp::kOptimizerStep;
    case OpCode::kSwapIn:
      return SimOp::kSwapIn;
  }
  STRATA_THROW() << "the simulator has no model of opcode " << static_cast<int>(op);
}

namespace {

constexpr double kUnset = -1.0;

int steps_of(const SimConfig& c) {
  if (!is_synchronous(c.schedule)) return 1;
  if (c.steps > 0) return c.steps;
  return c.grad_sync.delay > 0 && c.groups > 1 ? c.grad_sync.delay + 2 : 1;
}

struct Bucket {
  size_t ready_layer = 0;
  double bytes = 0.0;
};

std::vector<Bucket> make_buckets(const std::vector<LayerModel>& layers, LayerRange r,
                                 double bucket_mb) {
  const double cap =
      bucket_mb > 0 ? bucket_mb * 1024.0 * 1024.0 : std::numeric_limits<double>::infinity();
  std::vector<Bucket> buckets;
  bool open = false;
  for (size_t l = r.end; l-- > r.begin;) {
    const LayerWork& w = layers[l].work;
    const bool alias =
        w.tied_owner >= static_cast<int64_t>(r.begin) && w.tied_owner < static_cast<int64_t>(r.end);
    const double bytes = w.param_bytes - (alias ? w.tied_bytes : 0.0);
    if (bytes <= 0.0) continue;
    if (!open || buckets.back().bytes + bytes > cap) {
      buckets.push_back({l, 0.0});
      open = true;
    }
    buckets.back().bytes += bytes;
    buckets.back().ready_layer = l;
  }
  return buckets;
}

// A collective of several simulated participants.
struct Collective {
  int arrived = 0;
  double latest = 0.0;  // the last arrival (launch)
  double end = kUnset;  // resolved
};

struct Engine {
  const SimConfig& c;
  const CostModel& costs;
  const Cluster& cluster;
  int S = 1, G = 1, steps = 1;
  int64_t M = 1, total_mb = 1;
  std::vector<int> reps;                              // the group each simulated group is
  std::vector<int> weight;                            // how many groups each stands for
  std::vector<std::vector<SimInstruction>> programs;  // per stage
  // Per stage.
  std::vector<double> fwd, bwd, recompute, opt;
  std::vector<MicroBatchMemory> mbm;
  std::vector<StageStatic> statics;
  std::vector<std::vector<Bucket>> buckets;
  std::vector<double> dp_seconds_per_byte_cache;
  std::vector<std::vector<double>> bucket_seconds;  // [s][b]
  // Tied parameters split between stages: owner stage, alias stage, bytes.
  int tied_a = -1, tied_b = -1;
  double tied_bytes = 0.0;
  // Per simulated rank (rep * S + s).
  struct Rank {
    size_t pc = 0;
    double clock = 0.0;
    int step = 0;
    int64_t update = 0;
    size_t next_bucket = 0;      // of the update being launched
    bool arrived = false;        // at the barrier or collective its instruction waits for
    std::vector<double> recent;  // start times of the last instructions (receive lookahead)
    double d2h_free = 0.0, h2d_free = 0.0;
    std::vector<std::pair<double, double>> memory;  // (time, bytes)
    std::vector<double> busy, wait, exposed, dp_exposed, tied_exposed, swap_exposed;  // per step
  };
  std::vector<Rank> ranks;
  // Messages into (rep, stage, mb): when the sender posted them.
  std::vector<double> act_sent, grad_sent;
  std::vector<double> act_link_free, grad_link_free;  // [rep * S + s]: s -> s+1, s+1 -> s
  std::vector<double> swap_out_done, swap_in_done;    // [rank * total_mb + mb]
  // dp collectives [s][update][bucket].
  std::vector<std::vector<std::vector<Collective>>> dp;
  std::vector<double> dp_lane_free;
  std::vector<std::pair<int64_t, size_t>> dp_next;    // per stage: the next (update, bucket)
  std::vector<std::vector<double>> dp_busy_per_step;  // [s][step]
  std::vector<std::vector<int>> update_step;          // [s][update] -> step
  // Tied all-reduce per (rep, update); overlap-off barrier per (rep, update); step barriers.
  std::map<std::pair<int, int64_t>, Collective> tied, group_barrier;
  std::vector<Collective> step_barrier;
  std::vector<double> step_release;
  SimResult result;
  int64_t executed = 0;

  Engine(const SimConfig& config, const CostModel& cm, const Cluster& cl)
      : c(config), costs(cm), cluster(cl) {}

  int world_rank(int r) const { return reps[r / S] * S + r % S; }
  size_t mb_index(int r, int64_t mb) const { return static_cast<size_t>(r) * total_mb + mb; }
  size_t msg(int rep, int s, int64_t mb) const {
    return (static_cast<size_t>(rep) * S + s) * total_mb + mb;
  }

  void event(int r, TimelineEvent::Lane lane, const std::string& name, int64_t mb, double start,
             double end, int peer = -1) {
    if (!c.record_timeline) return;
    result.timeline.push_back({world_rank(r), lane, name, mb, start, end, peer});
  }
  void mem(int r, double t, double bytes) {
    if (bytes != 0.0) ranks[r].memory.push_back({t, bytes});
  }

  void setup();
  bool run_one(int r, const SimInstruction& in);
  void launch(int r, int64_t update, size_t bucket, double t);
  void resolve(int s);
  void finish();
};

void Engine::setup() {
  S = c.stages;
  G = c.groups;
  M = c.micro_batches;
  steps = steps_of(c);
  total_mb = M * steps;
  STRATA_CHECK(S >= 1 && G >= 1 && M >= 1)
      << "simulate: stages, groups and micro-batches must be at least 1 (got " << S << ", " << G
      << ", " << M << ")";
  STRATA_CHECK(c.micro_batch_rows > 0) << "simulate: micro-batches need rows";
  check_fits(cluster, G * S);
  STRATA_CHECK_EQ(c.partition.size(), static_cast<size_t>(S))
      << "simulate: the partition has " << c.partition.size() << " ranges for " << S << " stages";
  size_t next = 0;
  for (int s = 0; s < S; ++s) {
    const LayerRange& r = c.partition[s];
    STRATA_CHECK(r.begin == next && r.end > r.begin)
        << "simulate: stage " << s << " has layers [" << r.begin << ", " << r.end
        << "), expected a non-empty range starting at layer " << next;
    next = r.end;
  }
  STRATA_CHECK_EQ(next, costs.layers.size())
      << "simulate: the partition covers " << next << " of the model's " << costs.layers.size()
      << " layers";
  STRATA_CHECK(c.policy.empty() || c.policy.size() == costs.layers.size())
      << "simulate: " << c.policy.size() << " memory policies for " << costs.layers.size()
      << " layers";
  STRATA_CHECK(c.grad_sync.delay == 0 || is_synchronous(c.schedule))
      << "--dp-delay needs a synchronous schedule (gpipe, 1f1b)";

  // Groups: one per class of links (the links between consecutive stages and the tied link).
  const double rows = c.micro_batch_rows;
  for (int s = 0; s < S; ++s) {
    const LayerRange& r = c.partition[s];
    double f = 0, b = 0;
    for (size_t l = r.begin; l < r.end; ++l) {
      f += costs.layers[l].forward_s.at(rows);
      b += costs.layers[l].backward_s.at(rows);
    }
    mbm.push_back(micro_batch_memory(costs.layers, r, c.policy, rows, s == S - 1));
    if (s == 0 && !c.input_on_device && costs.layers[0].work.saves_input) {
      mbm.back().keep -= costs.layers[0].work.input_bytes * rows;  // the data loader's batch
    }
    fwd.push_back(f);
    bwd.push_back(b);
    recompute.push_back(mbm.back().recompute_seconds);
    opt.push_back(stage_param_bytes(costs.layers, r) * costs.optimizer_s_per_param_byte);
    buckets.push_back(G > 1 ? make_buckets(costs.layers, r, c.grad_sync.bucket_mb)
                            : std::vector<Bucket>{});
  }
  for (size_t l = 0; l < costs.layers.size(); ++l) {
    const LayerWork& w = costs.layers[l].work;
    if (w.tied_owner < 0 || w.tied_bytes <= 0) continue;
    int owner_stage = 0, alias_stage = 0;
    for (int s = 0; s < S; ++s) {
      if (static_cast<size_t>(w.tied_owner) >= c.partition[s].begin &&
          static_cast<size_t>(w.tied_owner) < c.partition[s].end)
        owner_stage = s;
      if (l >= c.partition[s].begin && l < c.partition[s].end) alias_stage = s;
    }
    if (owner_stage != alias_stage) {
      STRATA_CHECK(tied_a < 0 || (tied_a == owner_stage && tied_b == alias_stage))
          << "simulate: tied parameters between more than one pair of stages";
      tied_a = owner_stage;
      tied_b = alias_stage;
      tied_bytes += w.tied_bytes;
    }
  }
  std::map<std::vector<int>, int> classes;
  std::vector<int> group_class(G);
  for (int g = 0; g < G; ++g) {
    std::vector<int> signature;
    for (int s = 0; s + 1 < S; ++s) {
      signature.push_back(static_cast<int>(cluster.link(g * S + s, g * S + s + 1).kind));
    }
    if (tied_a >= 0) {
      signature.push_back(static_cast<int>(cluster.link(g * S + tied_a, g * S + tied_b).kind));
    }
    const bool dedupe = c.dedupe_groups && !c.record_timeline;
    if (!dedupe) signature.push_back(g);
    auto it = classes.find(signature);
    if (it == classes.end()) {
      it = classes.emplace(signature, static_cast<int>(reps.size())).first;
      reps.push_back(g);
      weight.push_back(0);
    }
    ++weight[it->second];
  }
  // Collective times.
  const StaticOptions so{c.optimizer_slots, c.mixed_precision, 0, c.grad_sync.delay, G > 1};
  std::vector<ScheduleCheck> checks;
  const Schedule first = make_schedule(c.schedule, S, M, 0);
  const ScheduleCheck check = check_schedule(first);
  STRATA_CHECK(check.ok) << "simulate: invalid " << schedule_name(c.schedule)
                         << " schedule: " << check.error;
  for (int s = 0; s < S; ++s) {
    StaticOptions o = so;
    // Stashed versions and the latest set aside while an instruction runs on one of them.
    const int64_t stashed = stashed_weight_versions(c.schedule, S, s, M);
    if (stashed > 0) o.stashed_versions = stashed + 1;
    statics.push_back(stage_static(costs.layers, c.partition[s], o));
    std::vector<int> members;
    for (int g = 0; g < G; ++g) members.push_back(g * S + s);
    std::vector<double> seconds;
    for (const Bucket& b : buckets[s]) {
      seconds.push_back(all_reduce_seconds(c.all_reduce, cluster, members, b.bytes));
    }
    bucket_seconds.push_back(seconds);
    result.stages.push_back({});
    result.stages.back().max_in_flight = check.max_in_flight[s];
  }
  // Programs.
  for (int s = 0; s < S; ++s) {
    std::vector<SimInstruction> p;
    for (int k = 0; k < steps; ++k) {
      Schedule sc = make_schedule(c.schedule, S, M, k);
      // The SwapIns the runtime puts ahead of each Backward (parallel/schedule/schedule.h).
      if (mbm[s].swap > 0) add_prefetches(&sc.programs[s], c.swap_prefetch);
      for (const Instruction& in : sc.programs[s]) p.push_back({to_sim_op(in.op), in.micro_batch});
      p.push_back({SimOp::kStepEnd, -1});
    }
    programs.push_back(p);
  }
  const int R = static_cast<int>(reps.size()) * S;
  ranks.assign(R, Rank{});
  for (Rank& rk : ranks) {
    for (auto* v :
         {&rk.busy, &rk.wait, &rk.exposed, &rk.dp_exposed, &rk.tied_exposed, &rk.swap_exposed})
      v->assign(steps, 0.0);
  }
  const size_t messages = static_cast<size_t>(R) * total_mb;
  act_sent.assign(messages, kUnset);
  grad_sent.assign(messages, kUnset);
  act_link_free.assign(R, 0.0);
  grad_link_free.assign(R, 0.0);
  if (std::any_of(mbm.begin(), mbm.end(), [](const MicroBatchMemory& m) { return m.swap > 0; })) {
    STRATA_CHECK(cluster.device.host_bandwidth > 0)
        << "--memory-policy swap needs the device's host bandwidth";
    swap_out_done.assign(messages, kUnset);
    swap_in_done.assign(messages, kUnset);
  }
  const int64_t updates = is_synchronous(c.schedule) ? steps : updates_per_step(c.schedule, M);
  dp.assign(S, std::vector<std::vector<Collective>>(updates));
  for (int s = 0; s < S; ++s) {
    for (auto& u : dp[s]) u.assign(buckets[s].size(), Collective{});
  }
  dp_lane_free.assign(S, 0.0);
  dp_next.assign(S, {0, 0});
  dp_busy_per_step.assign(S, std::vector<double>(steps, 0.0));
  update_step.assign(S, std::vector<int>(updates, 0));
  step_barrier.assign(steps, Collective{});
  step_release.assign(steps, kUnset);
  result.simulated_groups = static_cast<int>(reps.size());
  if (c.record_timeline) {
    result.executed.assign(static_cast<size_t>(G) * S, {});
    result.memory.assign(static_cast<size_t>(G) * S, {});
  }
}

void Engine::launch(int r, int64_t update, size_t bucket, double t) {
  const int s = r % S;
  Collective& col = dp[s][update][bucket];
  col.latest = std::max(col.latest, t);
  col.arrived += 1;
  update_step[s][update] = ranks[r].step;
  resolve(s);
}

void Engine::resolve(int s) {
  const int participants = static_cast<int>(reps.size());
  while (dp_next[s].first < static_cast<int64_t>(dp[s].size())) {
    auto& [u, b] = dp_next[s];
    if (b >= dp[s][u].size()) {
      ++u;
      b = 0;
      continue;
    }
    Collective& col = dp[s][u][b];
    if (col.arrived < participants) return;
    const double start = std::max(col.latest, dp_lane_free[s]);
    col.end = start + bucket_seconds[s][b];
    dp_lane_free[s] = col.end;
    dp_busy_per_step[s][update_step[s][u]] += bucket_seconds[s][b];
    if (c.record_timeline) {
      for (int rep = 0; rep < participants; ++rep) {
        event(rep * S + s, TimelineEvent::kGradSync, "all-reduce bucket " + std::to_string(b), -1,
              start, col.end);
      }
    }
    ++b;
  }
}

bool Engine::run_one(int r, const SimInstruction& in) {
  Rank& rk = ranks[r];
  const int s = r % S, rep = r / S;
  const MicroBatchMemory& m = mbm[s];
  const int64_t mb = in.micro_batch;
  const double t0 = rk.clock;
  switch (in.op) {
    case SimOp::kForward: {
      const double end = t0 + fwd[s];
      event(r, TimelineEvent::kCompute, "Forward", mb, t0, end);
      mem(r, t0, m.forward_workspace);
      mem(r, end, -m.forward_workspace - (s > 0 ? m.input : 0.0));  // frees, then allocations
      mem(r, end, m.keep + m.swap + m.loss_grad + (s < S - 1 ? m.send_output : 0.0));
      if (m.swap > 0) {
        const double start = std::max(end, rk.d2h_free);
        const double done = start + m.swap / cluster.device.host_bandwidth;
        rk.d2h_free = done;
        swap_out_done[mb_index(r, mb)] = done;
        mem(r, done, -m.swap);
        event(r, TimelineEvent::kSwap, "SwapOut", mb, start, done);
      }
      rk.busy[rk.step] += fwd[s];
      rk.clock = end;
      break;
    }
    case SimOp::kBackward: {
      double start = t0;
      if (m.swap > 0) {
        const double ready = swap_in_done[mb_index(r, mb)];
        STRATA_CHECK(ready != kUnset) << "simulate: Backward(mb " << mb << ") before its SwapIn";
        start = std::max(start, ready);
        rk.swap_exposed[rk.step] += start - t0;
      }
      const double duration = bwd[s] + recompute[s];
      const double end = start + duration;
      event(r, TimelineEvent::kCompute, "Backward", mb, start, end);
      mem(r, start, m.backward_workspace + m.recompute_peak);
      mem(r, end,
          -(m.backward_workspace + m.recompute_peak + m.keep + m.swap + m.loss_grad) -
              (s < S - 1 ? m.output : 0.0));
      mem(r, end, s > 0 ? m.input : 0.0);  // the input gradient, until its send arrives
      // The backward that ends an update launches its buckets as their layers finish.
      const std::vector<SimInstruction>& p = programs[s];
      size_t k = rk.pc + 1;
      while (k < p.size() && p[k].op == SimOp::kSendGrad) ++k;
      const bool last_of_update = k < p.size() && p[k].op == SimOp::kReduceGrads;
      if (last_of_update && G > 1 && c.grad_sync.overlap && !buckets[s].empty()) {
        const LayerRange& range = c.partition[s];
        double t = start;
        size_t b = rk.next_bucket;
        for (size_t l = range.end; l-- > range.begin;) {
          const double rows = c.micro_batch_rows;
          t += costs.layers[l].backward_s.at(rows);
          if (!c.policy.empty() && c.policy[l] == MemoryPolicy::kRecompute) {
            t += costs.layers[l].forward_s.at(rows);
          }
          while (b < buckets[s].size() && buckets[s][b].ready_layer == l)
            launch(r, rk.update, b++, t);
        }
        rk.next_bucket = b;
      }
      rk.busy[rk.step] += duration;
      rk.clock = end;
      break;
    }
    case SimOp::kSendAct:
    case SimOp::kSendGrad: {
      // The message leaves once the receiver has posted its receive (resolved at the receive).
      const bool act = in.op == SimOp::kSendAct;
      const size_t key = msg(rep, act ? s + 1 : s - 1, mb);
      (act ? act_sent : grad_sent)[key] = t0;
      event(r, TimelineEvent::kComm, sim_op_name(in.op), mb, t0, t0);
      break;
    }
    case SimOp::kRecvAct:
    case SimOp::kRecvGrad: {
      const bool act = in.op == SimOp::kRecvAct;
      const size_t key = msg(rep, s, mb);
      const double sent = (act ? act_sent : grad_sent)[key];
      if (sent == kUnset) return false;
      const int sender = act ? r - 1 : r + 1;
      const size_t n = rk.recent.size();
      const size_t ahead = static_cast<size_t>(c.receive_lookahead);
      const double posted = ahead == 0 || n == 0 ? t0 : rk.recent[n >= ahead ? n - ahead : 0];
      // Messages of one link direction travel in order, one at a time.
      const double bytes = act ? m.input : m.output;
      const LinkSpec& link = cluster.link(world_rank(sender), world_rank(r));
      double& free = act ? act_link_free[sender] : grad_link_free[sender];
      const double depart = std::max({sent, posted, free});
      const double arrival = depart + link.latency_s + bytes / link.bandwidth;
      free = depart + bytes / link.bandwidth;
      mem(sender, arrival, -bytes);  // the send buffer goes when the message has arrived
      mem(r, posted, bytes);         // the receive buffer, from its posting
      const double wait = std::max(0.0, arrival - t0);
      rk.wait[rk.step] += wait;
      rk.exposed[rk.step] += std::min(wait, arrival - depart);
      event(sender, TimelineEvent::kTransfer, sim_op_name(act ? SimOp::kSendAct : SimOp::kSendGrad),
            mb, sent, arrival, s);
      event(r, TimelineEvent::kComm, sim_op_name(in.op), mb, t0, t0 + wait);
      rk.clock = t0 + wait;
      break;
    }
    case SimOp::kReduceGrads: {
      if (G > 1 && !c.grad_sync.overlap) {
        // The executor's barrier over the group's stages, then every bucket at once.
        Collective& bar = group_barrier[{rep, rk.update}];
        if (!rk.arrived) {
          bar.arrived += 1;
          bar.latest = std::max(bar.latest, t0);
          rk.arrived = true;
        }
        if (bar.arrived < S) return false;
        rk.clock = std::max(t0, bar.latest);
      }
      for (size_t b = rk.next_bucket; b < buckets[s].size(); ++b) launch(r, rk.update, b, rk.clock);
      rk.next_bucket = 0;
      event(r, TimelineEvent::kCompute, "ReduceGrads", -1, t0, rk.clock);
      break;
    }
    case SimOp::kOptimizerStep: {
      double ready = t0;
      const int64_t applied = rk.update - c.grad_sync.delay;
      if (G > 1 && applied >= 0) {
        for (const Collective& col : dp[s][applied]) {
          if (col.end == kUnset) return false;
          ready = std::max(ready, col.end);
        }
      }
      const double dp_ready = ready;
      if (tied_a >= 0 && (s == tied_a || s == tied_b)) {
        Collective& col = tied[{rep, rk.update}];
        if (!rk.arrived) {
          col.arrived += 1;
          col.latest = std::max(col.latest, ready);
          rk.arrived = true;
        }
        if (col.arrived < 2) return false;
        if (col.end == kUnset) {
          const std::vector<int> pair{reps[rep] * S + tied_a, reps[rep] * S + tied_b};
          col.end = col.latest + all_reduce_seconds(c.all_reduce, cluster, pair, tied_bytes);
          event(r, TimelineEvent::kGradSync, "tied all-reduce", -1, col.latest, col.end);
          const int other = rep * S + (s == tied_a ? tied_b : tied_a);
          event(other, TimelineEvent::kGradSync, "tied all-reduce", -1, col.latest, col.end);
        }
        // Waiting for the other stage to get there is bubble; the all-reduce itself is exposed.
        rk.tied_exposed[rk.step] += col.end - std::max(ready, col.latest);
        ready = col.end;
      }
      rk.dp_exposed[rk.step] += dp_ready - t0;
      const double duration = applied >= 0 || G == 1 ? opt[s] : 0.0;
      event(r, TimelineEvent::kCompute, "OptimizerStep", -1, ready, ready + duration);
      rk.busy[rk.step] += duration;
      rk.clock = ready + duration;
      ++rk.update;
      break;
    }
    case SimOp::kSwapIn: {
      const double out = swap_out_done[mb_index(r, mb)];
      STRATA_CHECK(out != kUnset) << "simulate: SwapIn(mb " << mb << ") before its forward";
      const double start = std::max({t0, out, rk.h2d_free});
      const double done = start + m.swap / cluster.device.host_bandwidth;
      rk.h2d_free = done;
      swap_in_done[mb_index(r, mb)] = done;
      mem(r, start, m.swap);
      event(r, TimelineEvent::kSwap, "SwapIn", mb, start, done);
      break;
    }
    case SimOp::kStepEnd: {
      Collective& bar = step_barrier[rk.step];
      if (!rk.arrived) {  // after the step's own work outside the instructions
        bar.arrived += 1;
        bar.latest = std::max(bar.latest, t0 + costs.step_overhead_s);
        rk.arrived = true;
      }
      if (bar.arrived < static_cast<int>(ranks.size())) return false;
      if (bar.end == kUnset) {
        // The trainer's sum of the step's metrics over the world: a small tree all-reduce.
        const double levels = G * S > 1 ? std::ceil(std::log2(static_cast<double>(G * S))) : 0.0;
        const LinkSpec& far = cluster.nodes() > 1 ? cluster.inter : cluster.intra;
        bar.end = bar.latest + 2.0 * levels * (G * S > 1 ? far.latency_s : 0.0);
        step_release[rk.step] = bar.end;
      }
      rk.clock = bar.end;
      ++rk.step;
      break;
    }
  }
  rk.arrived = false;
  rk.recent.push_back(t0);
  if (rk.recent.size() > static_cast<size_t>(std::max(1, c.receive_lookahead)) + 1) {
    rk.recent.erase(rk.recent.begin());
  }
  if (c.record_timeline) result.executed[world_rank(r)].push_back(in);
  ++executed;
  return true;
}

void Engine::finish() {
  const int last = steps - 1;
  const double begin = last > 0 ? step_release[last - 1] : 0.0;
  result.makespan_s = step_release[last];
  result.step_time_s = step_release[last] - begin;
  result.instructions = executed;
  double idle_sum = 0.0, weight_sum = 0.0;
  for (int s = 0; s < S; ++s) {
    StageResult& st = result.stages[s];
    st.stage = s;
    st.layers = c.partition[s];
    st.forward_s = fwd[s];
    st.backward_s = bwd[s] + recompute[s];
    st.optimizer_s = opt[s];
    st.static_memory = statics[s];
    st.micro_batch = mbm[s];
    double busy = 0, w = 0;
    for (size_t rep = 0; rep < reps.size(); ++rep) {
      const Rank& rk = ranks[rep * S + s];
      const double n = weight[rep];
      busy += n * rk.busy[last];
      st.p2p_wait_s += n * rk.wait[last];
      st.p2p_exposed_s += n * rk.exposed[last];
      st.dp_exposed_s += n * rk.dp_exposed[last];
      st.tied_exposed_s += n * rk.tied_exposed[last];
      st.swap_exposed_s += n * rk.swap_exposed[last];
      w += n;
      // Peak: the running sum of the rank's changes, frees first at equal times.
      std::vector<std::pair<double, double>> changes = rk.memory;
      std::sort(changes.begin(), changes.end());
      double now = 0.0, peak = 0.0;
      for (const auto& [t, bytes] : changes) {
        now += bytes;
        peak = std::max(peak, now);
        if (c.record_timeline)
          result.memory[world_rank(static_cast<int>(rep) * S + s)].push_back({t, now});
      }
      st.peak_bytes = std::max(st.peak_bytes, statics[s].total() + peak);
    }
    for (double* v : {&busy, &st.p2p_wait_s, &st.p2p_exposed_s, &st.dp_exposed_s,
                      &st.tied_exposed_s, &st.swap_exposed_s})
      *v /= w;
    st.busy_s = busy;
    st.dp_seconds = dp_busy_per_step[s][last];
    if (!is_synchronous(c.schedule)) {
      st.dp_seconds = 0;
      for (double d : dp_busy_per_step[s]) st.dp_seconds += d;
    }
    st.idle_fraction = result.step_time_s > 0 ? 1.0 - busy / result.step_time_s : 0.0;
    idle_sum += st.idle_fraction;
    weight_sum += 1.0;
    result.peak_bytes = std::max(result.peak_bytes, st.peak_bytes);
  }
  result.bubble = weight_sum > 0 ? idle_sum / weight_sum : 0.0;
}

}  // namespace

std::vector<std::vector<SimInstruction>> stage_programs(const SimConfig& config,
                                                        const CostModel& costs, int steps) {
  SimConfig c = config;
  c.steps = steps;
  Cluster cluster = make_cluster(builtin_device("h100"), c.groups * c.stages, 8);
  Engine e(c, costs, cluster);
  e.setup();
  return e.programs;
}

SimResult simulate(const SimConfig& config, const CostModel& costs, const Cluster& cluster) {
  Engine e(config, costs, cluster);
  e.setup();
  const int R = static_cast<int>(e.ranks.size());
  int done = 0;
  while (done < R) {
    bool progress = false;
    done = 0;
    for (int r = 0; r < R; ++r) {
      const std::vector<SimInstruction>& p = e.programs[r % e.S];
      Engine::Rank& rk = e.ranks[r];
      while (rk.pc < p.size() && e.run_one(r, p[rk.pc])) {
        ++rk.pc;
        progress = true;
      }
      if (rk.pc == p.size()) ++done;
    }
    if (!progress && done < R) {
      std::ostringstream o;
      o << "simulate: no rank can proceed (a bug of the simulator or an invalid schedule);";
      for (int r = 0; r < R && r < 8; ++r) {
        const std::vector<SimInstruction>& p = e.programs[r % e.S];
        if (e.ranks[r].pc < p.size()) {
          o << " rank " << e.world_rank(r) << " at " << sim_op_name(p[e.ranks[r].pc].op) << "("
            << p[e.ranks[r].pc].micro_batch << ")";
        }
      }
      STRATA_THROW() << o.str();
    }
  }
  e.finish();
  return std::move(e.result);
}

}  // namespace strata::parallel::sim
