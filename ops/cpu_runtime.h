// The CPU runtime libraries' settings that are read from the environment when the libraries load,
// before main() runs. One matters for speed on a shared machine: libgomp's wait policy, shared by
// Strata's OpenMP loops and the OpenMP build of OpenBLAS.
//
//   OMP_WAIT_POLICY=passive  Idle OpenMP threads sleep instead of spinning for up to ~300k pause
//                            loops after every parallel region. Spinning pays off only when every
//                            core is ours; on a shared machine (another training job, pipeline
//                            ranks of one process sharing the cores, a build) the spinning threads
//                            take the time slices of the threads that have work: a step of a tiny
//                            GPT-2 took 3 s instead of 40 ms on 2 busy cores.
//
// tune_process_environment re-executes the program once with it (never over OMP_WAIT_POLICY or
// GOMP_SPINCOUNT given by the user), so that libgomp loads with it; STRATA_CPU_RUNTIME=keep turns
// that off. Programs linking the library set the variable themselves.
#pragma once

#include <string>

namespace strata::ops::cpu_runtime {

// Sets OMP_WAIT_POLICY=passive when neither it nor GOMP_SPINCOUNT is set and re-executes
// /proc/self/exe with argv; returns when there is nothing to set, when STRATA_CPU_RUNTIME=keep,
// after the re-execution (STRATA_CPU_RUNTIME=tuned marks it), or when exec fails (with a warning
// on stderr).
void tune_process_environment(char** argv);

// What the process runs with, for configuration tables: "OpenBLAS Cooperlake kernels,
// OMP_WAIT_POLICY=passive (set by strata)".
std::string describe();

}  // namespace strata::ops::cpu_runtime
