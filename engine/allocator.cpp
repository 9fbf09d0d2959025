#include "engine/allocator.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "engine/check.h"

namespace strata {

MemoryStats Allocator::stats() const {
  MemoryStats s;
  s.current = current_.load();
  s.peak = peak_.load();
  s.limit = limit_.load();
  s.allocations = allocations_.load();
  s.cached = cached_bytes();
  return s;
}

void Allocator::set_pressure_handler(PressureHandler handler) {
  std::lock_guard<std::mutex> lock(handler_mutex_);
  pressure_handler_ = handler ? std::make_shared<PressureHandler>(std::move(handler)) : nullptr;
}

void Allocator::reserve(size_t nbytes, const char* what) {
  const size_t limit = limit_.load();
  size_t now = current_.load();
  for (;;) {
    if (limit != 0 && now + nbytes > limit) {
      std::shared_ptr<PressureHandler> handler;
      {
        std::lock_guard<std::mutex> lock(handler_mutex_);
        handler = pressure_handler_;
      }
      if (handler == nullptr || !(*handler)(nbytes)) throw_out_of_memory(nbytes, what, nullptr);
      now = current_.load();
      continue;
    }
    if (current_.compare_exchange_weak(now, now + nbytes)) break;
  }
  const size_t after = now + nbytes;
  for (std::atomic<size_t>* peak : {&peak_, &window_peak_}) {
    size_t seen = peak->load();
    while (after > seen && !peak->compare_exchange_weak(seen, after)) {
    }
  }
  allocations_.fetch_add(1);
}

void Allocator::release(size_t nbytes) { current_.fetch_sub(nbytes); }

void Allocator::throw_out_of_memory(size_t nbytes, const char* what, const char* reason) const {
  std::ostringstream s;
  s << "out of memory on " << device().str() << ": cannot allocate " << format_bytes(nbytes);
  if (what != nullptr && *what != '\0') s << " for " << what;
  const size_t limit = limit_.load();
  s << " (limit " << (limit == 0 ? std::string("none") : format_bytes(limit)) << ", in use "
    << format_bytes(current_.load()) << ", peak " << format_bytes(peak_.load()) << ")";
  if (reason != nullptr) s << ": " << reason;
  if (limit != 0) s << "; raise --mem-limit or make the model, batch or micro-batch smaller";
  throw OutOfMemoryError(s.str());
}

namespace {

size_t round_block(size_t nbytes) {
  if (nbytes == 0) return 64;
  const size_t unit = nbytes > 65536 ? 4096 : 64;
  return (nbytes + unit - 1) / unit * unit;
}

}  // namespace

CpuAllocator::~CpuAllocator() { release_cached(); }

void* CpuAllocator::allocate(size_t nbytes, const char* what) {
  reserve(nbytes, what);
  const size_t block = round_block(nbytes);
  if (caching_) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(block);
    if (it != free_.end() && !it->second.empty()) {
      void* ptr = it->second.back();
      it->second.pop_back();
      cached_ -= block;
      return ptr;
    }
    // Keep in-use plus cached bytes under the limit: give the cache back first.
    const size_t lim = limit();
    if (lim != 0 && in_use() + cached_ > lim) release_cached_locked();
  }
  void* ptr = std::aligned_alloc(64, block);
  if (ptr == nullptr && caching_) {
    release_cached();  // the system may be short of memory: retry without the cache
    ptr = std::aligned_alloc(64, block);
  }
  if (ptr == nullptr) {
    release(nbytes);
    throw_out_of_memory(nbytes, what, "the system refused the allocation");
  }
  return ptr;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  release(nbytes);
  if (!caching_) {
    std::free(ptr);
    return;
  }
  const size_t block = round_block(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  free_[block].push_back(ptr);
  cached_ += block;
}

size_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_;
}

void CpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CpuAllocator::release_cached_locked() {
  for (auto& entry : free_) {
    for (void* ptr : entry.second) std::free(ptr);
  }
  free_.clear();
  cached_ = 0;
}

CpuAllocator& default_cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

size_t parse_bytes(const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  STRATA_CHECK(end != begin && std::isfinite(value) && value >= 0)
      << "bad size '" << text << "': expected a number with an optional unit, e.g. 512MiB or 2GiB";
  std::string unit(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 0;
  const struct {
    const char* name;
    double scale;
  } kUnits[] = {{"", 1.0},
                {"B", 1.0},
                {"KB", 1e3},
                {"MB", 1e6},
                {"GB", 1e9},
                {"TB", 1e12},
                {"KiB", 1024.0},
                {"MiB", 1048576.0},
                {"GiB", 1073741824.0},
                {"TiB", 1099511627776.0},
                {"K", 1024.0},
                {"M", 1048576.0},
                {"G", 1073741824.0},
                {"T", 1099511627776.0}};
  for (const auto& u : kUnits) {
    if (unit == u.name) scale = u.scale;
  }
  STRATA_CHECK(scale > 0) << "bad size '" << text << "': unknown unit '" << unit
                          << "' (valid: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)";
  return static_cast<size_t>(std::llround(value * scale));
}

std::string format_bytes(size_t bytes) {
  const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace strata
