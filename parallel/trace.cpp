// Events are kept in memory per rank and merged by the trainer at the end of a run. Timestamps
// are wall-clock microseconds (system_clock at the trace's creation plus steady_clock since),
// so the ranks of one machine line up; ranks on different machines are aligned as well as their
// clocks are.
#include "parallel/trace.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "engine/check.h"

namespace strata::parallel {

Trace::Trace(int rank, int group, int stage)
    : rank_(rank),
      group_(group),
      stage_(stage),
      origin_(std::chrono::steady_clock::now()),
      origin_system_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()) {}

double Trace::micros(std::chrono::steady_clock::time_point t) const {
  return static_cast<double>(origin_system_us_) +
         std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Trace::record(const Instruction& instruction, std::chrono::steady_clock::time_point start,
                   std::chrono::steady_clock::time_point end) {
  const bool comm = instruction.op == OpCode::kRecvAct || instruction.op == OpCode::kSendAct ||
                    instruction.op == OpCode::kRecvGrad || instruction.op == OpCode::kSendGrad;
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({opcode_name(instruction.op), instruction.micro_batch, comm ? 1 : 0,
                     micros(start), micros(end) - micros(start)});
}

void Trace::record_transfer(const Instruction& instruction, int peer,
                            std::chrono::steady_clock::time_point posted,
                            std::chrono::steady_clock::time_point completed) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({opcode_name(instruction.op), instruction.micro_batch, kTransferLane,
                     micros(posted), micros(completed) - micros(posted), peer});
}

void Trace::record_span(const std::string& name, std::chrono::steady_clock::time_point start,
                        std::chrono::steady_clock::time_point end, int lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back({name, -1, lane, micros(start), micros(end) - micros(start)});
}

size_t Trace::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

std::string Trace::events_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  const std::string process = "rank " + std::to_string(rank_) + " (group " +
                              std::to_string(group_) + ", stage " + std::to_string(stage_) + ")";
  auto append = [&out](const nlohmann::json& j) {
    if (!out.empty()) out += ",\n";
    out += j.dump();
  };
  append({{"ph", "M"}, {"name", "process_name"}, {"pid", rank_}, {"args", {{"name", process}}}});
  append({{"ph", "M"},
          {"name", "process_sort_index"},
          {"pid", rank_},
          {"args", {{"sort_index", rank_}}}});
  append({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", rank_},
          {"tid", 0},
          {"args", {{"name", "compute"}}}});
  append({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", rank_},
          {"tid", 1},
          {"args", {{"name", "comm"}}}});
  append({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", rank_},
          {"tid", kTransferLane},
          {"args", {{"name", "transfers"}}}});
  append({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", rank_},
          {"tid", kGradSyncLane},
          {"args", {{"name", "dp all-reduce"}}}});
  append({{"ph", "M"},
          {"name", "thread_name"},
          {"pid", rank_},
          {"tid", kSwapLane},
          {"args", {{"name", "swap"}}}});
  for (const Event& e : events_) {
    std::string name = e.name;
    if (e.micro_batch >= 0) name += " " + std::to_string(e.micro_batch);
    static const char* const kCategory[] = {"compute", "comm", "transfer", "dp", "swap"};
    nlohmann::json j{{"ph", "X"},
                     {"name", name},
                     {"pid", rank_},
                     {"tid", e.lane},
                     {"ts", e.start_us},
                     {"dur", e.duration_us},
                     {"cat", kCategory[e.lane]}};
    if (e.micro_batch >= 0) j["args"] = {{"micro_batch", e.micro_batch}, {"stage", stage_}};
    if (e.peer >= 0) j["args"]["peer"] = e.peer;
    append(j);
  }
  return out;
}

void Trace::write_file(const std::string& path, const std::vector<std::string>& rank_events) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  STRATA_CHECK(f != nullptr) << "cannot write trace file '" << path
                             << "': " << std::strerror(errno);
  std::fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
  bool first = true;
  for (const std::string& events : rank_events) {
    if (events.empty()) continue;
    if (!first) std::fputs(",\n", f);
    std::fputs(events.c_str(), f);
    first = false;
  }
  std::fputs("\n]}\n", f);
  const bool ok = std::ferror(f) == 0;
  std::fclose(f);
  STRATA_CHECK(ok) << "short write to trace file '" << path << "'";
}

}  // namespace strata::parallel
