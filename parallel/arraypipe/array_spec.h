// The job-array specification of `strata train --array SPEC|FILE --array-mode grid|list`
// (issue 17): which sibling jobs an array holds and each job's own settings.
//
// SPEC: settings separated by ';', each a name and a ','-separated list of values:
//   lr=1e-3,3e-3,2e-3;weight-decay=0,0.1,0;batch-size=8,8,4
//   grid (the default): every combination, the first setting varying slowest (3 x 3 x 3 = 27 jobs
//         here, job 0 = the first value of each); a setting with one value applies to all jobs.
//   list: the i-th values together (3 jobs here); every list has the same length, or length 1
//         (the value of every job).
// FILE: one job per line, `name=value` pairs separated by spaces or commas
//   (`lr=1e-3 weight-decay=0.1 batch-size=8`); blank lines and lines starting with '#' are
//   skipped. --array-mode does not apply to a file.
// Settings: lr (> 0), weight-decay (>= 0), momentum (0 <= m < 1), batch-size (a positive
// integer), seed (a non-negative integer). A setting a job does not give is the run's own flag.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace strata::parallel::arraypipe {

struct ArrayJob {
  int index = 0;  // the job's index in the array's order ("job": i of its metrics)
  std::optional<double> lr;
  std::optional<double> weight_decay;
  std::optional<double> momentum;
  std::optional<int> batch_size;
  std::optional<uint64_t> seed;
};

enum class ArrayMode { kGrid, kList };

// "grid" | "list"; anything else throws strata::Error naming --array-mode.
ArrayMode parse_array_mode(const std::string& name);
const char* array_mode_name(ArrayMode mode);

// Parses SPEC (see above). Errors (strata::Error) name the setting, and the job where there is
// one: an unknown or repeated setting, a setting without values (an empty grid), lists of unequal
// length in list mode, a value that is not a number or out of range.
std::vector<ArrayJob> parse_array_spec(const std::string& spec, ArrayMode mode);

// Parses FILE's text (see above); `source` names it in errors ("jobs.txt:3 (job 2): ...").
std::vector<ArrayJob> parse_array_lines(const std::string& text, const std::string& source);
// Reads and parses FILE; throws naming the file when it cannot be read or holds no job.
std::vector<ArrayJob> read_array_file(const std::string& path);

// --array's argument: a file when a regular file of that name exists, else a spec; an argument
// without '=' that is not a file is refused as neither.
std::vector<ArrayJob> parse_array_argument(const std::string& argument, ArrayMode mode);

// Every job's batch size (or the run's `default_batch_size` where the job gives none) must be a
// multiple of `divisor` (the layout's data-parallel groups); throws naming the job otherwise.
void check_array_batch_sizes(const std::vector<ArrayJob>& jobs, int default_batch_size, int divisor,
                             const std::string& divisor_name);

// "lr=0.001 weight-decay=0.1 batch-size=8" (the settings the job gives, in SPEC order).
std::string describe_job(const ArrayJob& job);

}  // namespace strata::parallel::arraypipe
