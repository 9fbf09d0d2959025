// Chrome trace of a simulated run (see sim_trace.h); the file is written by parallel::Trace's
// writer, so the envelope is the measured trace's byte for byte.
#include "parallel/sim/sim_trace.h"

#include <nlohmann/json.hpp>

#include "engine/check.h"
#include "parallel/trace.h"

namespace strata::parallel::sim {

std::vector<std::string> timeline_events_json(const SimResult& result, int groups, int stages) {
  const int world = groups * stages;
  std::vector<std::string> out(world);
  auto append = [&out](int rank, const nlohmann::json& j) {
    if (!out[rank].empty()) out[rank] += ",\n";
    out[rank] += j.dump();
  };
  static const char* const kThreads[] = {"compute", "comm", "transfers", "dp all-reduce", "swap"};
  static const char* const kCategory[] = {"compute", "comm", "transfer", "dp", "swap"};
  for (int rank = 0; rank < world; ++rank) {
    const std::string process = "rank " + std::to_string(rank) + " (group " +
                                std::to_string(rank / stages) + ", stage " +
                                std::to_string(rank % stages) + ")";
    append(rank,
           {{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", process}}}});
    append(rank, {{"ph", "M"},
                  {"name", "process_sort_index"},
                  {"pid", rank},
                  {"args", {{"sort_index", rank}}}});
    for (int tid = 0; tid < 5; ++tid) {
      append(rank, {{"ph", "M"},
                    {"name", "thread_name"},
                    {"pid", rank},
                    {"tid", tid},
                    {"args", {{"name", kThreads[tid]}}}});
    }
  }
  for (const TimelineEvent& e : result.timeline) {
    STRATA_CHECK(e.rank >= 0 && e.rank < world) << "timeline event of rank " << e.rank;
    std::string name = e.name;
    if (e.micro_batch >= 0) name += " " + std::to_string(e.micro_batch);
    nlohmann::json j{{"ph", "X"},
                     {"name", name},
                     {"pid", e.rank},
                     {"tid", static_cast<int>(e.lane)},
                     {"ts", e.start * 1e6},
                     {"dur", (e.end - e.start) * 1e6},
                     {"cat", kCategory[e.lane]}};
    if (e.micro_batch >= 0)
      j["args"] = {{"micro_batch", e.micro_batch}, {"stage", e.rank % stages}};
    if (e.peer >= 0) j["args"]["peer"] = e.peer;
    append(e.rank, j);
  }
  return out;
}

void write_timeline_trace(const std::string& path, const SimResult& result, int groups,
                          int stages) {
  STRATA_CHECK(!result.timeline.empty() || groups * stages == 0)
      << "write_timeline_trace: the simulation recorded no timeline (record_timeline)";
  Trace::write_file(path, timeline_events_json(result, groups, stages));
}

}  // namespace strata::parallel::sim
