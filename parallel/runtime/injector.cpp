// --inject: the parser of the shared syntax, and the kinds this runtime injects itself.
//
// Draws. A straggler's draw must not depend on timing or on the order in which threads run, so it
// is a hash of (seed, rank, step, micro-batch, instruction), splitmix64's finalizer applied to
// each field in turn: the same run draws the same sleeps, and so does a run with other kinds of
// injection added.
#include "parallel/runtime/injector.h"

#include <time.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "engine/check.h"
#include "engine/log.h"
#include "parallel/dynpipe/colocation.h"
#include "parallel/partition/partition.h"

namespace strata::parallel {
namespace {

// The kinds and the keys each takes besides kind, rank, from and to. A new kind is a row here and
// a case in Injector (or in whatever component handles it, which can read InjectSpec::values).
struct KindKeys {
  const char* kind;
  std::vector<std::string> keys;
};
const std::vector<KindKeys>& kinds() {
  static const std::vector<KindKeys> k = {
      {"straggler", {"p", "delay", "seed", "op"}},
      {"trace", {"file"}},
      {"load", {"threads", "target", "streams"}},
      {"slow", {"factor"}},
      {"grow", {"layers", "factor"}},
      {"device", {"factor"}},
      {"fail", {"how", "at"}},
  };
  return k;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

int64_t parse_int(const InjectSpec& spec, const std::string& key) {
  const std::string& v = spec.values.at(key);
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  STRATA_CHECK(used == v.size() && !v.empty())
      << "--inject \"" << spec.text << "\": " << key << "=" << v << " is not an integer";
  return x;
}

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double InjectSpec::number(const std::string& key, double fallback) const {
  auto it = values.find(key);
  if (it == values.end()) return fallback;
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  STRATA_CHECK(used == it->second.size() && !it->second.empty() && std::isfinite(x))
      << "--inject \"" << text << "\": " << key << "=" << it->second << " is not a number";
  return x;
}

std::string InjectSpec::string(const std::string& key, const std::string& fallback) const {
  auto it = values.find(key);
  return it == values.end() ? fallback : it->second;
}

bool InjectSpec::applies(int rank_here, int64_t step) const {
  return (rank < 0 || rank == rank_here) && step >= from && step <= to;
}

std::vector<InjectSpec> parse_inject(const std::string& text) {
  std::vector<InjectSpec> specs;
  for (const std::string& part : split(text, ';')) {
    const std::string spec_text = trim(part);
    if (spec_text.empty()) continue;
    InjectSpec spec;
    spec.text = spec_text;
    for (const std::string& item : split(spec_text, ',')) {
      const std::string kv = trim(item);
      const size_t eq = kv.find('=');
      STRATA_CHECK(eq != std::string::npos && eq > 0)
          << "--inject \"" << spec_text << "\": expected key=value, got \"" << kv << "\"";
      const std::string key = trim(kv.substr(0, eq)), value = trim(kv.substr(eq + 1));
      STRATA_CHECK(spec.values.count(key) == 0)
          << "--inject \"" << spec_text << "\": " << key << " is given twice";
      spec.values[key] = value;
    }
    STRATA_CHECK(spec.has("kind")) << "--inject \"" << spec_text << "\": no kind= (valid: " << [] {
      std::string v;
      for (const KindKeys& k : kinds()) v += (v.empty() ? "" : ", ") + std::string(k.kind);
      return v;
    }() << ")";
    spec.kind = spec.values["kind"];
    auto kind = std::find_if(kinds().begin(), kinds().end(),
                             [&](const KindKeys& k) { return spec.kind == k.kind; });
    STRATA_CHECK(kind != kinds().end()) << "--inject \"" << spec_text << "\": unknown kind "
                                        << spec.kind << " (valid: " <<
        [] {
          std::string v;
          for (const KindKeys& k : kinds()) v += (v.empty() ? "" : ", ") + std::string(k.kind);
          return v;
        }() << ")";
    for (const auto& [key, value] : spec.values) {
      const bool common = key == "kind" || key == "rank" || key == "from" || key == "to";
      STRATA_CHECK(common ||
                   std::find(kind->keys.begin(), kind->keys.end(), key) != kind->keys.end())
          << "--inject \"" << spec_text << "\": kind=" << spec.kind << " takes no key " << key;
    }
    if (spec.has("rank")) {
      const int64_t r = parse_int(spec, "rank");
      STRATA_CHECK(r >= 0) << "--inject \"" << spec_text << "\": rank must be >= 0";
      spec.rank = static_cast<int>(r);
    }
    if (spec.has("from")) spec.from = parse_int(spec, "from");
    if (spec.has("to")) spec.to = parse_int(spec, "to");
    STRATA_CHECK(spec.from >= 1 && spec.to >= spec.from)
        << "--inject \"" << spec_text << "\": from and to are steps counted from 1 with from <= to";
    if (spec.kind == "straggler") {
      STRATA_CHECK(spec.has("p") && spec.has("delay"))
          << "--inject \"" << spec_text << "\": kind=straggler needs p= and delay=";
      const double p = spec.number("p", 0), d = spec.number("delay", 0);
      STRATA_CHECK(p >= 0 && p <= 1) << "--inject \"" << spec_text << "\": p must be in [0, 1]";
      STRATA_CHECK(d >= 0) << "--inject \"" << spec_text << "\": delay must be >= 0 seconds";
      if (spec.has("seed")) parse_int(spec, "seed");
      const std::string op = spec.string("op", "both");
      STRATA_CHECK(op == "forward" || op == "backward" || op == "both" || op == "iteration")
          << "--inject \"" << spec_text << "\": op must be forward, backward, both or iteration";
    } else if (spec.kind == "load") {
      if (spec.has("threads")) {
        const int64_t t = parse_int(spec, "threads");
        STRATA_CHECK(t >= 1 && t <= 256)
            << "--inject \"" << spec_text << "\": threads must be in 1..256, got " << t;
      }
      const std::string target = spec.string("target", "auto");
      STRATA_CHECK(target == "auto" || target == "cpu" || target == "gpu")
          << "--inject \"" << spec_text << "\": target must be cpu, gpu or auto, got " << target;
      STRATA_CHECK(!spec.has("streams") || target != "cpu")
          << "--inject \"" << spec_text << "\": streams= is the GPU load's (target=gpu)";
      STRATA_CHECK(!spec.has("threads") || target != "gpu")
          << "--inject \"" << spec_text << "\": threads= is the CPU load's (target=cpu)";
      if (spec.has("streams")) {
        const int64_t n = parse_int(spec, "streams");
        STRATA_CHECK(n >= 1 && n <= 16)
            << "--inject \"" << spec_text << "\": streams must be in 1..16, got " << n;
      }
    } else if (spec.kind == "slow" || spec.kind == "grow" || spec.kind == "device") {
      STRATA_CHECK(spec.kind == "grow" || spec.has("factor"))
          << "--inject \"" << spec_text << "\": kind=" << spec.kind << " needs factor=";
      const double f = spec.number("factor", 2.0);
      STRATA_CHECK(f >= 1.0 && f <= 1000.0)
          << "--inject \"" << spec_text << "\": factor must be in [1, 1000], got " << f;
      if (spec.kind == "grow") {
        STRATA_CHECK(spec.has("layers") && !spec.values["layers"].empty())
            << "--inject \"" << spec_text << "\": kind=grow needs layers= (a layer or FIRST-LAST)";
        STRATA_CHECK(!spec.has("rank"))
            << "--inject \"" << spec_text << "\": kind=grow takes no rank= (its layers grow on "
            << "whichever stage holds them)";
      }
    } else if (spec.kind == "fail") {
      STRATA_CHECK(spec.has("rank"))
          << "--inject \"" << spec_text << "\": kind=fail needs rank= (the rank that fails)";
      const std::string how = spec.string("how", "stall"), at = spec.string("at", "step");
      STRATA_CHECK(how == "stall" || how == "exit")
          << "--inject \"" << spec_text << "\": how must be stall or exit, got " << how;
      STRATA_CHECK(at == "step" || at == "migration")
          << "--inject \"" << spec_text << "\": at must be step or migration, got " << at;
    } else if (spec.kind == "trace") {
      STRATA_CHECK(spec.has("file") && !spec.values["file"].empty())
          << "--inject \"" << spec_text << "\": kind=trace needs file=";
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

std::pair<size_t, size_t> inject_layer_range(const InjectSpec& spec,
                                             const std::vector<std::string>& names) {
  const auto [first, last] =
      parse_layer_range(spec.string("layers", ""), names, "--inject \"" + spec.text + "\" layers=");
  STRATA_CHECK(first <= last) << "--inject \"" << spec.text
                              << "\": layers=" << spec.string("layers", "")
                              << " is empty (its first layer comes "
                              << "after its last)";
  return {first, last + 1};
}

double SlowdownTrace::fraction(int rank, double seconds) const {
  auto it = ranks.find(rank);
  if (it == ranks.end()) return 1.0;
  double f = 1.0;
  for (const auto& [t, value] : it->second) {
    if (t > seconds) break;
    f = value;
  }
  return f;
}

SlowdownTrace read_slowdown_trace(const std::string& path, int world_size) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "--inject trace file " << path << ": cannot open it";
  SlowdownTrace trace;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    if (trim(line).empty()) continue;
    std::istringstream fields(line);
    long long rank = -1;
    double seconds = 0, fraction = 0;
    std::string extra;
    const bool ok = static_cast<bool>(fields >> rank >> seconds >> fraction) && !(fields >> extra);
    const std::string where = "--inject trace file " + path + " line " + std::to_string(number) +
                              " (\"" + trim(line) + "\")";
    STRATA_CHECK(ok) << where << ": expected \"rank seconds fraction\"";
    STRATA_CHECK(rank >= 0 && rank < world_size)
        << where << ": rank " << rank << " is outside the " << world_size << " ranks of the run";
    STRATA_CHECK(std::isfinite(seconds) && seconds >= 0)
        << where << ": time " << seconds << " s is out of range (>= 0)";
    STRATA_CHECK(std::isfinite(fraction) && fraction > 0 && fraction <= 1)
        << where << ": fraction " << fraction << " is out of range (0 < fraction <= 1)";
    trace.ranks[static_cast<int>(rank)].push_back({seconds, fraction});
  }
  for (auto& [rank, points] : trace.ranks) {
    std::stable_sort(points.begin(), points.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  return trace;
}

Injector::Injector(const std::vector<InjectSpec>& specs, int rank, int world_size, uint64_t seed)
    : rank_(rank), seed_(seed), start_(std::chrono::steady_clock::now()) {
  for (const InjectSpec& s : specs) {
    if (s.kind != "straggler" && s.kind != "trace" && s.kind != "load" && s.kind != "slow" &&
        s.kind != "grow" && s.kind != "device" && s.kind != "fail") {
      continue;  // handled elsewhere
    }
    STRATA_CHECK(s.rank < world_size) << "--inject \"" << s.text << "\": rank " << s.rank
                                      << " is outside the " << world_size << " ranks of the run";
    if (s.rank >= 0 && s.rank != rank) continue;
    STRATA_CHECK(s.kind != "load" || std::none_of(specs_.begin(), specs_.end(),
                                                  [](const auto& o) { return o.kind == "load"; }))
        << "--inject \"" << s.text << "\": rank " << rank << " already has a kind=load spec "
        << "(one per rank; raise threads= instead)";
    STRATA_CHECK(s.kind != "device" ||
                 std::none_of(specs_.begin(), specs_.end(),
                              [](const auto& o) { return o.kind == "device"; }))
        << "--inject \"" << s.text << "\": rank " << rank << " already has a kind=device spec "
        << "(one per rank: the emulated device's speed)";
    specs_.push_back(s);
    traces_.push_back(s.kind == "trace" ? read_slowdown_trace(s.values.at("file"), world_size)
                                        : SlowdownTrace{});
    iteration_drawn_.push_back(-1);
    grow_layers_.push_back({0, 0});
    load_threads_.emplace_back();
    gpu_loads_.emplace_back();
    load_done_.push_back(0);
    has_device_ = has_device_ || s.kind == "device";
    failing_ = failing_ || s.kind == "fail";
  }
}

bool Injector::fails() const {
  return std::any_of(specs_.begin(), specs_.end(),
                     [](const InjectSpec& s) { return s.kind == "fail"; });
}

void Injector::fail_if(const std::string& at, int64_t step, const std::string& where) {
  for (const InjectSpec& s : specs_) {
    if (s.kind != "fail" || s.string("at", "step") != at || !s.applies(rank_, step)) continue;
    const bool exits = s.string("how", "stall") == "exit";
    std::fprintf(
        stderr, "rank %d: --inject \"%s\": %s %s\n", rank_, s.text.c_str(),
        exits ? "exits (status 3) at" : "stalls (sends nothing, until the job is ended) at",
        where.c_str());
    std::fflush(stderr);
    if (exits) std::_Exit(3);  // a dead rank: no MPI_Finalize, no destructors
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // a stuck one
  }
}

void Injector::at_migration(int64_t step) {
  fail_if("migration", step, "the migration after step " + std::to_string(step));
}

Injector::~Injector() {
  // A GPU load's error was the run's to report (stop_load at the end of training); here it
  // must not throw.
  try {
    stop_load();
  } catch (const std::exception& e) {
    STRATA_LOG(WARN) << e.what();
  }
}

void Injector::set_layer_names(const std::vector<std::string>& names) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].kind == "grow") grow_layers_[i] = inject_layer_range(specs_[i], names);
  }
  grow_resolved_ = true;
}

bool Injector::per_layer() const {
  for (const InjectSpec& s : specs_) {
    if (s.kind == "slow" || s.kind == "grow" || s.kind == "device") return true;
  }
  return false;
}

double Injector::thread_cpu_seconds() {
  timespec t{};
  STRATA_CHECK(clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) == 0)
      << "--inject kind=device: cannot read the thread's CPU time";
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double Injector::device_load_factor(double threads, double duty) {
  return 1.0 + std::max(0.0, threads) * std::clamp(duty, 0.0, 1.0);
}

void Injector::set_colocated_load(int threads, double duty) {
  STRATA_CHECK(threads >= 0 && duty > 0 && duty <= 1)
      << "a co-located load needs threads >= 0 and duty in (0, 1], got " << threads << " threads, "
      << "duty " << duty;
  colocated_load_ = device_load_factor(threads, duty);
}

void Injector::after_layer(size_t layer, bool backward, int64_t step, double seconds) {
  // The CPU time of the layer: this thread's since the instruction began (before()) or the last
  // layer ended, at most the layer's wall time (ops run on this thread; --threads > 1 would count
  // the pool's time elsewhere, so the least of the two is the bound that holds).
  double cpu = seconds;
  if (has_device_) {
    const double now = thread_cpu_seconds();
    if (cpu_mark_ >= 0) cpu = std::min(seconds, std::max(0.0, now - cpu_mark_));
  }
  after_layer_cpu(layer, backward, step, seconds, cpu);
  if (has_device_) cpu_mark_ = thread_cpu_seconds();
}

void Injector::after_layer_cpu(size_t layer, bool, int64_t step, double seconds, double cpu) {
  // Every factor that applies to this layer now multiplies (module doc): the layer is to last
  // `target` seconds in all, and the rank sleeps what is left of it.
  double slow = 1.0, grow = 1.0, device = 0.0, load = colocated_load_;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const InjectSpec& s = specs_[i];
    if (!s.applies(rank_, step + 1)) continue;
    if (s.kind == "slow") {
      slow *= s.number("factor", 2.0);
    } else if (s.kind == "grow") {
      STRATA_CHECK(grow_resolved_) << "--inject \"" << s.text << "\": layers not resolved";
      if (layer >= grow_layers_[i].first && layer < grow_layers_[i].second) {
        grow *= s.number("factor", 2.0);
      }
    } else if (s.kind == "device") {
      device = s.number("factor", 1.0);
    } else if (s.kind == "load" && !load_on_gpu(s)) {
      load *= device_load_factor(s.number("threads", 1), 1.0);
    }
  }
  const bool emulated = device > 0.0;
  if (!emulated) load = 1.0;  // a real load acts through the cores, not through a factor
  const double base = emulated ? device * cpu : seconds;
  const double target = base * slow * grow * load;
  // The sleep owed: paid once it reaches a millisecond, and what the sleep overshot is
  // credited, so that the factors hold on average for layers that take microseconds (a sleep
  // of a few microseconds lasts far longer than asked on a busy machine). A layer that already
  // lasted longer than its emulated time owes nothing (and earns no credit).
  double& owed = owed_[layer];
  owed += std::max(0.0, target - seconds);
  if (owed < 1e-3) return;
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(owed));
  const double slept =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  owed -= slept;
  ++stats_.injected;
  stats_.seconds += slept;
  // Each kind's share of the sleep: its factor's logarithm over the product's (the emulated
  // device's factor is the one over the layer's wall time: device x CPU / wall).
  const double dev = emulated ? std::max(1.0, base / std::max(seconds, 1e-12)) : 1.0;
  const double logs = std::log(dev) + std::log(slow) + std::log(grow) + std::log(load);
  if (logs <= 0) return;
  stats_.slow_seconds += slept * (std::log(slow) / logs);
  stats_.grow_seconds += slept * (std::log(grow) / logs);
  stats_.device_seconds += slept * ((std::log(dev) + std::log(load)) / logs);
}

bool Injector::load_on_gpu(const InjectSpec& s) const {
  const std::string target = s.string("target", "auto");
  return target == "gpu" || (target == "auto" && device_.is_cuda());
}

void Injector::set_device(Device device) {
  device_ = device;
  for (const InjectSpec& s : specs_) {
    if (s.kind != "load") continue;
    const bool gpu = load_on_gpu(s);
    STRATA_CHECK(!gpu || device.is_cuda())
        << "--inject \"" << s.text << "\": target=gpu, but rank " << rank_ << " runs on "
        << device.str() << " (a GPU load needs a rank on a GPU)";
    STRATA_CHECK(gpu || !s.has("streams"))
        << "--inject \"" << s.text << "\": streams= is the GPU load's, but rank " << rank_
        << " runs on " << device.str() << " (its load is CPU threads: threads=)";
    STRATA_CHECK(!gpu || !s.has("threads"))
        << "--inject \"" << s.text << "\": threads= is the CPU load's, but rank " << rank_
        << " runs on " << device.str() << " (its load is stress kernels: streams=, or target=cpu)";
  }
}

void Injector::update_load(int64_t step) {
  for (size_t i = 0; i < specs_.size(); ++i) {
    const InjectSpec& s = specs_[i];
    if (s.kind != "load") continue;
    std::vector<std::thread>& threads = load_threads_[i];
    const bool running = !threads.empty() || gpu_loads_[i] != nullptr;
    if (s.applies(rank_, step + 1) && !running && !load_done_[i]) {
      load_stop_ = false;
      load_start_ = std::chrono::steady_clock::now();
      if (load_on_gpu(s)) {
        // Another tenant's kernels on the rank's GPU (engine/gpu_stress.h).
        cuda::GpuStress::Options o;
        o.device = device_.index;
        o.streams = static_cast<int>(s.number("streams", 1));
        try {
          gpu_loads_[i] = std::make_unique<cuda::GpuStress>(o);
        } catch (const Error& e) {
          STRATA_THROW() << "--inject \"" << s.text << "\": " << e.what();
        }
        stats_.load_streams = std::max(stats_.load_streams, o.streams);
        continue;
      }
      const int n = static_cast<int>(s.number("threads", 1));
      for (int t = 0; t < n; ++t) {
        threads.emplace_back([this, t] {
          // A co-located load's thread: the monitor's process counters leave it out, as the
          // profile's (parallel/dynpipe/colocation.h).
          dynpipe::name_this_thread(dynpipe::kLoadThreadName);
          // Arithmetic that the compiler cannot drop, checking the flag now and then.
          volatile double sink = 1.0 + t;
          while (!load_stop_.load(std::memory_order_relaxed)) {
            double x = sink;
            for (int k = 0; k < 100000; ++k) x = x * 1.0000001 + 1e-9;
            sink = x;
            load_rounds_.fetch_add(1, std::memory_order_relaxed);
          }
        });
      }
      stats_.load_threads = std::max(stats_.load_threads, n);
    } else if (running && step + 1 > s.to) {
      stop_load();
    }
  }
}

void Injector::stop_load() {
  bool any = false;
  for (size_t i = 0; i < load_threads_.size(); ++i) {
    any = any || !load_threads_[i].empty() || gpu_loads_[i] != nullptr;
  }
  if (!any) return;
  load_stop_ = true;
  std::string error;  // a GPU load's first error, reported once every load has stopped
  for (size_t i = 0; i < load_threads_.size(); ++i) {
    if (gpu_loads_[i] != nullptr) {
      gpu_loads_[i]->stop();
      stats_.load_kernels += gpu_loads_[i]->kernels();
      if (error.empty() && gpu_loads_[i]->error()[0] != '\0') {
        error = "--inject \"" + specs_[i].text + "\": " + gpu_loads_[i]->error();
      }
      gpu_loads_[i].reset();
      load_done_[i] = 1;
    }
    if (load_threads_[i].empty()) continue;
    for (std::thread& t : load_threads_[i]) t.join();
    load_threads_[i].clear();
    load_done_[i] = 1;
  }
  stats_.load_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start_).count();
  STRATA_CHECK(error.empty()) << error;
}

void Injector::start() { start_ = std::chrono::steady_clock::now(); }

double Injector::uniform(uint64_t seed, int rank, int64_t step, int64_t micro_batch, OpCode op) {
  uint64_t h = mix(seed);
  h = mix(h ^ static_cast<uint64_t>(rank));
  h = mix(h ^ static_cast<uint64_t>(step));
  h = mix(h ^ static_cast<uint64_t>(micro_batch));
  h = mix(h ^ static_cast<uint64_t>(op));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

void Injector::sleep(double seconds) {
  if (seconds <= 0) return;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  ++stats_.injected;
  stats_.seconds += seconds;
}

void Injector::before(OpCode op, int64_t step, int64_t micro_batch) {
  if (op != OpCode::kForward && op != OpCode::kBackward) return;
  if (has_device_) cpu_mark_ = thread_cpu_seconds();
  if (!load_threads_.empty()) update_load(step);
  if (failing_) {
    fail_if("step", step + 1, "its first Forward or Backward of step " + std::to_string(step + 1));
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const InjectSpec& s = specs_[i];
    if (s.kind != "straggler" || !s.applies(rank_, step + 1)) continue;
    const std::string which = s.string("op", "both");
    if ((which == "forward" && op != OpCode::kForward) ||
        (which == "backward" && op != OpCode::kBackward)) {
      continue;
    }
    int64_t draw_mb = micro_batch;
    if (which == "iteration") {
      // One draw per step, before the rank's first Forward of it.
      if (op != OpCode::kForward || iteration_drawn_[i] == step) continue;
      iteration_drawn_[i] = step;
      draw_mb = -1;
    }
    const uint64_t seed =
        s.has("seed") ? static_cast<uint64_t>(std::stoll(s.values.at("seed"))) : seed_;
    ++stats_.draws;
    if (uniform(seed, rank_, step, draw_mb, op) < s.number("p", 0)) {
      sleep(s.number("delay", 0));
    }
  }
}

void Injector::after(OpCode op, int64_t step, int64_t, double seconds) {
  if (op != OpCode::kForward && op != OpCode::kBackward) return;
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  for (size_t i = 0; i < specs_.size(); ++i) {
    const InjectSpec& s = specs_[i];
    if (s.kind != "trace" || !s.applies(rank_, step + 1)) continue;
    const double f = traces_[i].fraction(rank_, now);
    if (f < 1.0) sleep((1.0 / f - 1.0) * seconds);
  }
}

}  // namespace strata::parallel
