#include "parallel/dynpipe/colocation.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel::dynpipe {

namespace {

constexpr auto kPeriod = std::chrono::milliseconds(10);

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Voluntary and involuntary context switches of one thread's status file.
bool read_task_switches(const std::string& path, uint64_t* voluntary, uint64_t* involuntary) {
  std::ifstream in(path);
  if (!in.good()) return false;  // the thread ended meanwhile
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "voluntary_ctxt_switches: %llu", &v) == 1) *voluntary += v;
    if (std::sscanf(line.c_str(), "nonvoluntary_ctxt_switches: %llu", &v) == 1) *involuntary += v;
  }
  return true;
}

// The thread's name (its comm file), "" when it ended meanwhile.
std::string read_task_name(const std::string& dir) {
  std::ifstream in(dir + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// Time on a CPU and run delay (ns) of one thread's schedstat.
void read_task_schedstat(const std::string& dir, uint64_t* exec_ns, uint64_t* delay_ns) {
  std::ifstream in(dir + "/schedstat");
  unsigned long long on = 0, wait = 0;
  if (in >> on >> wait) {
    *exec_ns += on;
    *delay_ns += wait;
  }
}

}  // namespace

void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

std::string describe_load(const LoadSpec& s) {
  if (s.threads == 0) return "none";
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%d %s thread%s at %.0f%%", s.threads,
                s.memory ? "memory" : "compute", s.threads == 1 ? "" : "s", s.duty * 100.0);
  return buf;
}

LoadGenerator::LoadGenerator(const LoadSpec& spec) : spec_(spec) {
  STRATA_CHECK(spec.threads >= 0) << "load threads must be >= 0, got " << spec.threads;
  STRATA_CHECK(spec.duty > 0 && spec.duty <= 1) << "load duty must be in (0, 1], got " << spec.duty;
  for (int t = 0; t < spec.threads; ++t) {
    threads_.emplace_back([this, t] { run(static_cast<size_t>(t)); });
  }
  // Every thread's id is known once the constructor returns.
  while (thread_ids().size() < static_cast<size_t>(spec.threads)) std::this_thread::yield();
}

LoadGenerator::~LoadGenerator() { stop(); }

void LoadGenerator::stop() {
  stop_ = true;
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

std::vector<int> LoadGenerator::thread_ids() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tids_;
}

void LoadGenerator::run(size_t index) {
  name_this_thread(kLoadThreadName);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tids_.push_back(static_cast<int>(syscall(SYS_gettid)));
  }
  std::vector<double> buffer;
  if (spec_.memory) buffer.assign(spec_.memory_bytes / sizeof(double), 1.0 + index);
  const auto busy = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(spec_.duty * 0.010));
  volatile double sink = 0.0;
  double a = 1.0 + 1e-9 * static_cast<double>(index), b = 0.999999;
  size_t pos = 0;
  while (!stop_) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < busy && !stop_) {
      if (spec_.memory) {
        // Stream 4096 doubles (32 KiB) forward through the buffer: read, scale, write.
        const size_t n = buffer.size();
        for (size_t k = 0; k < 4096; ++k, pos = pos + 1 == n ? 0 : pos + 1) {
          buffer[pos] = buffer[pos] * b + 1e-7;
        }
      } else {
        for (int k = 0; k < 4096; ++k) a = a * b + 1e-9;
      }
    }
    sink = sink + a;
    ++periods_;
    const auto rest = kPeriod - (std::chrono::steady_clock::now() - start);
    if (rest > std::chrono::steady_clock::duration::zero()) std::this_thread::sleep_for(rest);
  }
}

CpuSnapshot read_cpu_snapshot(const std::vector<int>& exclude) {
  CpuSnapshot s;
  s.seconds = now_seconds();
  std::ifstream in("/proc/stat");
  STRATA_CHECK(in.good()) << "cannot read /proc/stat (the CPU counters need Linux's /proc)";
  std::string line;
  bool have_ctxt = false, have_running = false;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string key;
    f >> key;
    if (key.size() > 3 && key.rfind("cpu", 0) == 0) {
      uint64_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // user nice system idle iowait irq softirq steal
      for (uint64_t& x : v) f >> x;
      STRATA_CHECK(!f.fail()) << "/proc/stat: cannot parse '" << line << "'";
      CpuSnapshot::Core c;
      c.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
      c.total = c.busy + v[3] + v[4];
      s.cores.push_back(c);
    } else if (key == "ctxt") {
      f >> s.context_switches;
      have_ctxt = true;
    } else if (key == "procs_running") {
      f >> s.procs_running;
      have_running = true;
    }
  }
  STRATA_CHECK(!s.cores.empty() && have_ctxt && have_running)
      << "/proc/stat lacks per-core lines, ctxt or procs_running";
  if (DIR* dir = opendir("/proc/self/task")) {
    const std::string load_name = kLoadThreadName;
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const int tid = std::atoi(e->d_name);
      const std::string task = std::string("/proc/self/task/") + e->d_name;
      if (read_task_name(task).rfind(load_name, 0) == 0) {
        read_task_schedstat(task, &s.load_exec_ns, &s.load_delay_ns);
        continue;
      }
      if (std::find(exclude.begin(), exclude.end(), tid) != exclude.end()) continue;
      if (!read_task_switches(task + "/status", &s.voluntary, &s.involuntary)) continue;
      read_task_schedstat(task, &s.exec_ns, &s.run_delay_ns);
    }
    closedir(dir);
  }
  return s;
}

CpuCounters counters_between(const CpuSnapshot& a, const CpuSnapshot& b,
                             double mean_procs_running) {
  CpuCounters c;
  const double dt = std::max(1e-6, b.seconds - a.seconds);
  const size_t cores = std::min(a.cores.size(), b.cores.size());
  double sum = 0.0;
  for (size_t i = 0; i < cores; ++i) {
    const double total = static_cast<double>(b.cores[i].total - a.cores[i].total);
    const double busy = static_cast<double>(b.cores[i].busy - a.cores[i].busy);
    const double u = total > 0 ? std::clamp(busy / total, 0.0, 1.0) : 0.0;
    sum += u;
    c.cpu_util_max = std::max(c.cpu_util_max, u);
  }
  c.cpu_util_mean = cores > 0 ? sum / static_cast<double>(cores) : 0.0;
  c.runq_per_core = cores > 0 ? mean_procs_running / static_cast<double>(cores) : 0.0;
  // Threads that ended between the readings lower the sums: a negative difference counts 0.
  const auto diff = [](uint64_t x, uint64_t y) {
    return y >= x ? static_cast<double>(y - x) : 0.0;
  };
  const double cpu_s = 1e-9 * diff(a.exec_ns, b.exec_ns);
  c.cpu_per_s = cpu_s / dt;
  c.colocated_threads =
      1e-9 * (diff(a.load_exec_ns, b.load_exec_ns) + diff(a.load_delay_ns, b.load_delay_ns)) / dt;
  // Below a millisecond of CPU the ratios are noise: none.
  if (cpu_s >= 1e-3) {
    c.run_delay_per_cpu_s = 1e-9 * diff(a.run_delay_ns, b.run_delay_ns) / cpu_s;
    c.preempt_per_cpu_s = diff(a.involuntary, b.involuntary) / cpu_s;
  }
  return c;
}

std::vector<std::string> counter_names() {
  return {"cpu_util_mean",       "cpu_util_max",      "runq_per_core",
          "run_delay_per_cpu_s", "preempt_per_cpu_s", "colocated_threads"};
}

std::vector<double> counter_values(const CpuCounters& c) {
  return {c.cpu_util_mean,       c.cpu_util_max,      c.runq_per_core,
          c.run_delay_per_cpu_s, c.preempt_per_cpu_s, c.colocated_threads};
}

CpuCounters counters_from_values(const std::vector<double>& v) {
  STRATA_CHECK_EQ(v.size(), counter_names().size()) << "counter values";
  CpuCounters c;
  c.cpu_util_mean = v[0];
  c.cpu_util_max = v[1];
  c.runq_per_core = v[2];
  c.run_delay_per_cpu_s = v[3];
  c.preempt_per_cpu_s = v[4];
  c.colocated_threads = v[5];
  return c;
}

CounterWindow::CounterWindow(std::vector<int> exclude, int period_ms)
    : exclude_(std::move(exclude)) {
  sampler_ = std::thread([this, period_ms] {
    name_this_thread("strata-sampler");
    sampler_tid_ = static_cast<int>(syscall(SYS_gettid));
    while (!stop_) {
      std::ifstream in("/proc/stat");
      std::string line;
      while (std::getline(in, line)) {
        unsigned long long v = 0;
        if (std::sscanf(line.c_str(), "procs_running %llu", &v) == 1) {
          sum_ += v;
          ++samples_;
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
    }
  });
  // The sampler's own switches are not the workload's.
  while (sampler_tid_.load() == 0) std::this_thread::yield();
  exclude_.push_back(sampler_tid_.load());
  start_ = read_cpu_snapshot(exclude_);
}

CounterWindow::~CounterWindow() {
  stop_ = true;
  if (sampler_.joinable()) sampler_.join();
}

CpuCounters CounterWindow::finish() {
  STRATA_CHECK(!finished_) << "a counter window finishes once";
  finished_ = true;
  const CpuSnapshot end = read_cpu_snapshot(exclude_);
  stop_ = true;
  sampler_.join();
  const uint64_t n = samples_.load();
  // The sampler reads procs_running while it runs itself: one fewer.
  const double mean = n > 0 ? static_cast<double>(sum_.load()) / static_cast<double>(n) - 1.0 : 0;
  return counters_between(start_, end, std::max(0.0, mean));
}

}  // namespace strata::parallel::dynpipe
