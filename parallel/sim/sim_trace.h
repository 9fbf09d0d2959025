// The simulated timeline as a Chrome/Perfetto trace in the layout of `strata train --trace`
// (parallel/trace.h): one process per rank named "rank R (group G, stage S)", the threads
// "compute", "comm", "transfers" and "dp all-reduce", one complete ("X") event per instruction
// or transfer named by its instruction and micro-batch ("Forward 3"), with args micro_batch,
// stage (and peer for transfers), timestamps in microseconds from the start of the simulated
// run. A simulated and a measured run open side by side. Swaps appear on the transfers thread
// ("SwapOut 3", "SwapIn 3").
#pragma once

#include <string>
#include <vector>

#include "parallel/sim/simulator.h"

namespace strata::parallel::sim {

// Every rank's events as parallel::Trace::events_json() gives them (one string per rank).
std::vector<std::string> timeline_events_json(const SimResult& result, int groups, int stages);
// Writes the trace file (errors name the path). The result needs record_timeline.
void write_timeline_trace(const std::string& path, const SimResult& result, int groups, int stages);

}  // namespace strata::parallel::sim
