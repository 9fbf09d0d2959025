// The co-location side of DynPipe's slowdown model (papers/dynpipe.md Sec. 2.7): a load generator
// of threads that compete for the CPU's cores (and its memory bandwidth), and the counters Linux
// exposes in /proc about the machine and this process while it runs: per-core utilization,
// run-queue length (procs_running of /proc/stat), context switches of the machine (ctxt) and the
// process's threads' voluntary and involuntary switches (/proc/self/task/*/status).
//
// `strata profile --colocation` (tools/profile_colocation.cpp) times a model's layers alone and
// beside these loads with the counters and writes the data set the forest trains on.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::parallel::dynpipe {

// A co-located load: `threads` threads, each busy for `duty` of every 10 ms period (sleeping the
// rest), on arithmetic in registers (compute) or streaming through its own buffer (memory).
struct LoadSpec {
  int threads = 0;
  double duty = 1.0;  // (0, 1]
  bool memory = false;
  size_t memory_bytes = 32u << 20;  // per thread, memory loads
};
std::string describe_load(const LoadSpec& spec);

class LoadGenerator {
 public:
  // Starts the threads (and waits until each has its id). Throws strata::Error for threads < 0 or
  // duty outside (0, 1].
  explicit LoadGenerator(const LoadSpec& spec);
  ~LoadGenerator();  // stops
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;
  void stop();
  // The kernel thread ids of the load's threads (to leave out of the process's counters).
  std::vector<int> thread_ids() const;
  // Busy periods the threads completed (a test's evidence that they ran).
  uint64_t busy_periods() const { return periods_.load(); }

 private:
  void run(size_t index);
  LoadSpec spec_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> periods_{0};
  mutable std::mutex mutex_;
  std::vector<int> tids_;
  std::vector<std::thread> threads_;
};

// Threads whose name (/proc/.../comm) starts with this are a co-located load's, not the
// workload's: the process counters leave them out. LoadGenerator's threads and --inject
// kind=load's (parallel/runtime/injector.h) carry it, so the profile and training count alike.
inline constexpr const char* kLoadThreadName = "strata-load";
// Names the calling thread (at most 15 characters).
void name_this_thread(const char* name);

// One reading of /proc.
struct CpuSnapshot {
  struct Core {
    uint64_t busy = 0;   // user + nice + system + irq + softirq + steal, clock ticks
    uint64_t total = 0;  // busy + idle + iowait
  };
  std::vector<Core> cores;
  uint64_t context_switches = 0;  // ctxt of /proc/stat (the machine)
  uint64_t procs_running = 0;     // of /proc/stat (the run queue, this instant)
  uint64_t voluntary = 0;         // this process's threads, less the excluded ones
  uint64_t involuntary = 0;
  // /proc/self/task/*/schedstat of the same threads: time on a CPU and time runnable but waiting
  // for one (the scheduler's run delay), nanoseconds. Zero where the kernel lacks schedstat.
  uint64_t exec_ns = 0;
  uint64_t run_delay_ns = 0;
  // This process's co-located load's threads (named kLoadThreadName*): time on a CPU and time
  // runnable waiting for one, ns.
  uint64_t load_exec_ns = 0;
  uint64_t load_delay_ns = 0;
  double seconds = 0.0;  // steady clock
};
// Reads /proc/stat and /proc/self/task/*/{status,schedstat}, leaving out the threads `exclude`
// and those named kLoadThreadName* (whose schedstat goes to load_exec_ns and load_delay_ns alone).
// Throws strata::Error naming the file when /proc/stat cannot be read or parsed.
CpuSnapshot read_cpu_snapshot(const std::vector<int>& exclude = {});

// Counters over a window, normalized so that a row means the same on a machine of other size
// and on a busy or quiet one where that is possible (the names are the data set's columns):
//  - the machine's load per core: utilization is a fraction already, the run queue is divided by
//    the cores (the machine's context switches per second are left out: other jobs' switching
//    says nothing of ours);
//  - this process's contention, which is the same whoever else runs: the scheduler's run delay
//    per second of CPU the process got (0: never waited for a core; 1: waited as long as it
//    ran), and involuntary switches (preemptions) per CPU second. Voluntary switches are left
//    out: they count how the code waits (sleeps of an emulated device, a pipeline's receives),
//    not interference;
//  - the co-located load on this process's device: the mean number of the process's threads
//    named kLoadThreadName (training's --inject kind=load, the profile's LoadGenerator) that are
//    on a CPU or runnable waiting for one ((their CPU time + run delay) / wall time). It counts
//    what the load asks for, not what a busy machine's cores give it (its CPU time alone
//    saturates: on 2 busy cores 2 and 4 spinning threads got the same), so it is the load's
//    threads x duty. With an emulated device per process (--inject kind=device) the process is
//    the device, and this is what a GPU's counters show of a co-located task's kernels: the
//    counter that tells the loaded rank from its neighbours, whose machine-wide counters are
//    the same (strata-cpu-2 lacked it: the forest could not tell them apart).
struct CpuCounters {
  double cpu_util_mean = 0.0;        // busy / total over the window, mean over cores, in [0, 1]
  double cpu_util_max = 0.0;         // of the busiest core
  double runq_per_core = 0.0;        // mean run queue (procs_running) over the cores
  double run_delay_per_cpu_s = 0.0;  // this process: run delay / CPU time
  double preempt_per_cpu_s = 0.0;    // this process: involuntary switches / CPU second
  double colocated_threads = 0.0;    // this process's load threads: (CPU + run delay) / wall
  double cpu_per_s = 0.0;            // this process: CPU seconds per wall second (not a feature)
};
// `mean_procs_running`: the run queue over the window (the mean of samples).
CpuCounters counters_between(const CpuSnapshot& a, const CpuSnapshot& b, double mean_procs_running);
// Names of the counters the monitor samples and records, in order, and their values. The
// slowdown model's features are some of them (slowdown_features.h: feature_counter_names).
std::vector<std::string> counter_names();
std::vector<double> counter_values(const CpuCounters& c);
// counter_values' inverse (a monitor's sample off the all-reduce). Throws for another count.
CpuCounters counters_from_values(const std::vector<double>& values);

// Samples the run queue every `period_ms` on a thread between start and finish.
class CounterWindow {
 public:
  explicit CounterWindow(std::vector<int> exclude, int period_ms = 10);
  ~CounterWindow();
  CounterWindow(const CounterWindow&) = delete;
  CounterWindow& operator=(const CounterWindow&) = delete;
  CpuCounters finish();

 private:
  std::vector<int> exclude_;
  CpuSnapshot start_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sum_{0}, samples_{0};
  std::atomic<int> sampler_tid_{0};
  std::thread sampler_;
  bool finished_ = false;
};

}  // namespace strata::parallel::dynpipe
