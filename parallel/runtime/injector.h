// --inject: slowdowns injected into a run on purpose, to study how a schedule and a
// synchronization behave when some ranks are slow (SDPipe's stragglers, vPIPE's slowed stages).
//
// Syntax. One or more specs separated by ';', each a comma-separated list of key=value holding a
// `kind`:
//   --inject "kind=straggler,p=0.1,delay=0.3"
//   --inject "kind=straggler,p=1,delay=0.5,rank=3,from=4,to=4,op=backward; kind=trace,file=t.txt"
// Keys every kind takes: rank (the only rank it applies to; default every rank), from and to (the
// first and last optimizer step it applies to, counted from 1 as in the log; default all).
// Kinds (a kind is a row of kKinds in injector.cpp with the keys it takes, and a handler):
//   straggler  p (probability in [0, 1]), delay (seconds >= 0), seed (default: --seed), op
//              (forward|backward|both|iteration, default both). Before each Forward and each
//              Backward instruction of the steps and ranks it applies to, the rank sleeps `delay`
//              with probability p, drawn independently per (seed, rank, step, micro-batch,
//              instruction): seeded and reproducible, whatever the timing. op=iteration draws once
//              per step, before the rank's first Forward of it (the paper's text: "with
//              probability 10% at every iteration"); both is its artifact's reading (a draw per
//              forward and per backward: with M micro-batches a step draws 2M times;
//              papers/sdpipe.md Sec. 4 and open question 13).
//   trace      file (required). Replays a per-rank slowdown over time: each line "rank seconds
//              fraction" says that from `seconds` after the start of training on, the rank runs
//              at `fraction` (0 < fraction <= 1) of its speed, e.g. a FLOPS fraction measured on
//              a shared GPU. After each Forward and Backward the rank sleeps (1/fraction - 1) times
//              the instruction's own duration. '#' starts a comment. A line whose rank is outside
//              the world or whose time or fraction is out of range is refused, naming the line.
//   load       threads (default 1), target (cpu|gpu|auto, default auto: the rank's device),
//              streams (default 1). Real co-located load: from step `from` to step `to` the rank
//              runs `threads` extra threads that spin on arithmetic and compete for its cores
//              (started before the rank's first Forward or Backward of step `from`, stopped
//              after step `to` or at the end of the run). Local ranks share one process and its
//              cores: on a machine with fewer cores than ranks, the load slows every local rank,
//              not only the chosen one. On a rank that trains on a GPU (or with target=gpu) the
//              load is another tenant's kernels on that GPU instead: `streams` host threads each
//              launch a stress kernel (engine/gpu_stress.h: a pass of multiply-adds over a 64 MiB
//              buffer) after the last, sharing the SMs and the memory bandwidth with training.
//   slow       factor (>= 1, required). The rank computes `factor` times slower: after each
//              layer's forward and backward of a training micro-batch the rank sleeps
//              (factor - 1) times the layer's measured time (owed per layer and paid once it
//              reaches 1 ms, the overshoot of a sleep credited: the factor holds on average even
//              for layers of microseconds). Deterministic in effect (a sleep proportional to the
//              work), whatever the other ranks do.
//   grow       layers (required: a layer name or FIRST-LAST, as --partition writes ranges),
//              factor (>= 1, default 2). vPIPE's dynamic model (its NAS case, where operations
//              are activated inside layers as training goes): from step `from` those layers'
//              forwards and backwards take `factor` times their measured time (the rank sleeps
//              (factor - 1) times it after each), on whichever stage holds them, so the growth
//              moves with a layer that migrates. The arithmetic is unchanged (runs with and
//              without it train the same weights), the compute grows. Takes no rank= (the
//              layers' stage is the rank).
//   device     factor (>= 1, required). An emulated device: every layer's forward and backward of
//              a training micro-batch on the rank lasts `factor` times its CPU time (this
//              thread's, measured from the instruction's start or the previous layer's end), the
//              rank sleeping the rest. With factor large enough that the layers are a small duty
//              cycle of the cores, ranks sharing few cores behave like ranks on devices of their
//              own: the run is no longer bound by the cores' total compute, and load from other
//              processes is absorbed as long as a layer's wall time stays below its emulated time
//              (a layer that lasts longer owes nothing). Messages and the optimizer run at the
//              CPU's speed. Default every rank; one per rank.
//   fail       how (stall|exit, default stall), at (step|migration, default step); rank= required.
//              A failing rank, to test how the others end: at step `from` (its first Forward or
//              Backward of that step; with at=migration, at the first move between steps, of
//              --migrate-at or --repartition, after a step from `from` on, when the layers are
//              about to leave or arrive: synchronous schedules or --migration restart) it prints
//              what it does and stalls (sleeps, sending nothing, until the job is ended: the
//              other ranks' --comm-timeout) or exits at once with status 3 (no MPI finalization:
//              a dead peer, which mpirun notices). MPI ranks only (a stalled thread of --local
//              would outlive the run).
// Compounding. The factors of slow, grow and device that apply to a layer multiply: the layer
// lasts (device ? device x its CPU time : its wall time) x the product of the slow factors x the
// grow factors that name it, e.g. "kind=device,factor=8; rank=1,kind=slow,factor=3" makes rank
// 1's layers last 24 x their CPU time, and two slow specs x2 and x3 on a rank make it x6. On an
// emulated device (a device spec on the rank), kind=load also acts as a factor: a load of N
// threads shares the device N + 1 ways, the layers last N + 1 times longer (its threads still
// spin for real, so the rank's counters see them). Without device, load acts only through the
// cores. A load someone else runs in the rank's process (strata profile --colocation's
// LoadGenerator: set_colocated_load) acts the same way, by the same factor (device_load_factor).
// trace's sleep, after each instruction, is in proportion to the instruction's time including these
// sleeps, so it compounds too; straggler delays add. Errors name --inject, the spec and the key.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/device.h"
#include "engine/gpu_stress.h"
#include "parallel/schedule/schedule.h"

namespace strata::parallel {

// One spec of --inject, checked against its kind's keys.
struct InjectSpec {
  std::string kind;
  std::map<std::string, std::string> values;  // every key given, kind included
  std::string text;                           // as written, for messages
  int rank = -1;                              // -1: every rank
  int64_t from = 1;                           // steps counted from 1, inclusive
  int64_t to = INT64_MAX;

  bool has(const std::string& key) const { return values.count(key) > 0; }
  // The value of `key` as a number (its default when absent); errors name the spec and key.
  double number(const std::string& key, double fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  bool applies(int rank_here, int64_t step) const;  // step: counted from 1
};

// Parses --inject (empty: no spec). Unknown kinds or keys, malformed values: strata::Error.
std::vector<InjectSpec> parse_inject(const std::string& text);

// kind=grow: the [first, end) layer range its layers= names in `names` (the model's layer names,
// in order); errors name the spec and the unknown layer.
std::pair<size_t, size_t> inject_layer_range(const InjectSpec& spec,
                                             const std::vector<std::string>& names);

// A trace file of kind=trace: per rank, (seconds, fraction) in time order.
struct SlowdownTrace {
  std::map<int, std::vector<std::pair<double, double>>> ranks;
  // The fraction of `rank` at `seconds` (1 before its first line, and for ranks not listed).
  double fraction(int rank, double seconds) const;
};
// Reads and checks a trace file for a world of `world_size` ranks (errors name the file and
// line).
SlowdownTrace read_slowdown_trace(const std::string& path, int world_size);

// The injections of one rank, called by the executor around Forward and Backward.
class Injector {
 public:
  struct Stats {
    int64_t draws = 0;          // straggler draws made
    int64_t injected = 0;       // sleeps made (straggler or trace)
    double seconds = 0.0;       // time slept (every kind that sleeps)
    double slow_seconds = 0.0;  // of which kind=slow (slow, grow: as slept, not as owed)
    double grow_seconds = 0.0;  // of which kind=grow
    // of which kind=device (the emulated device's time, with a load's share on it); slow, grow
    // and device share a layer's sleep in proportion to the logarithms of their factors
    double device_seconds = 0.0;
    int load_threads = 0;       // kind=load: the most load threads running at once
    int load_streams = 0;       // kind=load on a GPU: the most stress streams running at once
    int64_t load_kernels = 0;   // kind=load on a GPU: stress kernels run
    double load_seconds = 0.0;  // kind=load: how long load threads ran
  };
  // `specs` from parse_inject; `seed`: the run's seed (for specs without their own). Trace files
  // are read here (every rank reads them).
  Injector(const std::vector<InjectSpec>& specs, int rank, int world_size, uint64_t seed);
  ~Injector();  // stops the load threads
  Injector(const Injector&) = delete;
  Injector& operator=(const Injector&) = delete;
  bool empty() const { return specs_.empty(); }
  // kind=grow names layers: resolved against the model's layer names (needed before training
  // when a grow spec is given).
  void set_layer_names(const std::vector<std::string>& names);
  // The rank's device (before training): kind=load on a GPU rank loads the GPU (target=auto).
  // A target=gpu load on a rank that runs on the CPU is refused, naming the spec.
  void set_device(Device device);
  // Whether a kind acts per layer (slow, grow): the executor then calls after_layer.
  bool per_layer() const;
  // After layer `layer`'s training forward or backward of a micro-batch of step `step` (from 0),
  // which lasted `seconds`.
  void after_layer(size_t layer, bool backward, int64_t step, double seconds);
  // The same with the layer's CPU time given (after_layer measures it when a device spec
  // applies): the rank sleeps until the layer has lasted its compounded time (module doc).
  void after_layer_cpu(size_t layer, bool backward, int64_t step, double seconds,
                       double cpu_seconds);
  // This thread's CPU time (seconds).
  static double thread_cpu_seconds();
  // How many ways a load of `threads` threads, each busy `duty` of the time, shares an emulated
  // device: 1 + threads x duty (kind=load: duty 1, N + 1).
  static double device_load_factor(double threads, double duty);
  // A load that another component runs in this rank's process (`threads` threads busy `duty` of
  // the time; 0 threads: none), from now on. On an emulated device it multiplies the layers'
  // time as kind=load does (device_load_factor, in after_layer_cpu beside kind=load's factor);
  // without one it acts only through the cores. Throws strata::Error for threads < 0 or duty
  // outside (0, 1].
  void set_colocated_load(int threads, double duty);
  // Stops the load threads (the end of training); stats() then holds their time.
  void stop_load();
  // kind=load: rounds of arithmetic the load threads have done so far (a round: 1e5 steps).
  int64_t load_rounds() const { return load_rounds_.load(); }
  // Whether a kind=fail spec applies to this rank.
  bool fails() const;
  // Before the --migrate-at move after step `step` (from 1): kind=fail,at=migration.
  void at_migration(int64_t step);
  // Training starts now (trace times count from here).
  void start();
  // Before a Forward or Backward of micro-batch `micro_batch` in step `step` (from 0).
  void before(OpCode op, int64_t step, int64_t micro_batch);
  // After it, which lasted `seconds`.
  void after(OpCode op, int64_t step, int64_t micro_batch, double seconds);
  const Stats& stats() const { return stats_; }

  // The straggler draw for (seed, rank, step, micro_batch, op): a uniform value in [0, 1).
  static double uniform(uint64_t seed, int rank, int64_t step, int64_t micro_batch, OpCode op);

 private:
  void sleep(double seconds);
  // kind=fail specs with this `at` that apply at `step` (from 1): the rank stalls or exits.
  void fail_if(const std::string& at, int64_t step, const std::string& where);

  std::vector<InjectSpec> specs_;         // those that apply to this rank
  std::vector<SlowdownTrace> traces_;     // per spec (empty for other kinds)
  std::vector<int64_t> iteration_drawn_;  // per spec: the last step drawn for op=iteration
  std::vector<std::pair<size_t, size_t>> grow_layers_;  // per spec: kind=grow's layers
  std::map<size_t, double> owed_;                       // slow, grow, device: per layer
  bool has_device_ = false;                             // a kind=device spec applies to this rank
  bool failing_ = false;                                // a kind=fail spec applies to this rank
  double cpu_mark_ = -1.0;       // this thread's CPU time at the instruction's or layer's end
  double colocated_load_ = 1.0;  // set_colocated_load's device_load_factor
  bool grow_resolved_ = false;
  // kind=load: the running threads, per spec (empty when not running), and when they started.
  void update_load(int64_t step);
  bool load_on_gpu(const InjectSpec& s) const;  // a kind=load spec's target is the rank's GPU
  std::vector<std::vector<std::thread>> load_threads_;
  std::vector<std::unique_ptr<cuda::GpuStress>> gpu_loads_;  // per spec: target=gpu, running
  Device device_;
  std::vector<char> load_done_;  // per spec: started and stopped for good
  std::atomic<bool> load_stop_{false};
  std::atomic<int64_t> load_rounds_{0};
  std::chrono::steady_clock::time_point load_start_;
  int rank_;
  uint64_t seed_;
  std::chrono::steady_clock::time_point start_;
  Stats stats_;
};

}  // namespace strata::parallel
