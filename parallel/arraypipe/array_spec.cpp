// Parsing of --array: settings are validated per job as the jobs are built, so the first error
// names the job that would have received the bad value as well as the setting.
#include "parallel/arraypipe/array_spec.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel::arraypipe {
namespace {

constexpr const char* kSettings = "lr, weight-decay, momentum, batch-size, seed";
constexpr size_t kMaxJobs = 4096;

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> split(const std::string& s, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, separator)) parts.push_back(trim(part));
  if (!s.empty() && s.back() == separator) parts.push_back("");
  return parts;
}

bool known_setting(const std::string& name) {
  return name == "lr" || name == "weight-decay" || name == "momentum" || name == "batch-size" ||
         name == "seed";
}

void check_known(const std::string& name, const std::string& where) {
  STRATA_CHECK(known_setting(name))
      << where << "unknown setting '" << name << "'; valid: " << kSettings;
}

double parse_real(const std::string& text, const std::string& where) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  STRATA_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && std::isfinite(v))
      << where << "'" << text << "' is not a number";
  return v;
}

uint64_t parse_integer(const std::string& text, const std::string& where) {
  errno = 0;
  char* end = nullptr;
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  STRATA_CHECK(digits && end == text.c_str() + text.size() && errno == 0)
      << where << "'" << text << "' is not a non-negative integer";
  return v;
}

// Sets one setting of `job` from its text; `where` prefixes errors ("job 2: setting 'lr': ").
void apply_setting(ArrayJob* job, const std::string& name, const std::string& text,
                   const std::string& where) {
  if (name == "lr") {
    const double v = parse_real(text, where);
    STRATA_CHECK(v > 0) << where << text << " is not a learning rate (it must be > 0)";
    job->lr = v;
  } else if (name == "weight-decay") {
    const double v = parse_real(text, where);
    STRATA_CHECK(v >= 0) << where << text << " is negative (weight decay must be >= 0)";
    job->weight_decay = v;
  } else if (name == "momentum") {
    const double v = parse_real(text, where);
    STRATA_CHECK(v >= 0 && v < 1) << where << text << " is outside [0, 1)";
    job->momentum = v;
  } else if (name == "batch-size") {
    const uint64_t v = parse_integer(text, where);
    STRATA_CHECK(v > 0 && v <= 1u << 30) << where << text << " is not a positive batch size";
    job->batch_size = static_cast<int>(v);
  } else if (name == "seed") {
    job->seed = parse_integer(text, where);
  } else {
    check_known(name, where);
  }
}

std::string job_where(int job, const std::string& setting) {
  std::ostringstream s;
  s << "--array: job " << job << ": setting '" << setting << "': ";
  return s.str();
}

struct Setting {
  std::string name;
  std::vector<std::string> values;
};

std::vector<Setting> parse_settings(const std::string& spec) {
  STRATA_CHECK(!trim(spec).empty()) << "--array: empty spec (expected NAME=V1,V2;... e.g. "
                                       "lr=1e-3,3e-3;batch-size=8)";
  std::vector<Setting> settings;
  int position = 0;
  for (const std::string& part : split(spec, ';')) {
    ++position;
    STRATA_CHECK(!part.empty()) << "--array: setting " << position
                                << " is empty (two ';' in a row, or a trailing ';')";
    const size_t eq = part.find('=');
    STRATA_CHECK(eq != std::string::npos)
        << "--array: setting '" << part << "' has no '=' (expected NAME=V1,V2,...)";
    Setting s{trim(part.substr(0, eq)), {}};
    check_known(s.name, "--array: ");
    for (const Setting& other : settings) {
      STRATA_CHECK(other.name != s.name) << "--array: setting '" << s.name << "' given twice";
    }
    const std::string values = trim(part.substr(eq + 1));
    STRATA_CHECK(!values.empty()) << "--array: empty grid: setting '" << s.name
                                  << "' has no values";
    s.values = split(values, ',');
    for (size_t i = 0; i < s.values.size(); ++i) {
      STRATA_CHECK(!s.values[i].empty()) << "--array: setting '" << s.name << "': value " << i + 1
                                         << " of " << s.values.size() << " is empty";
    }
    settings.push_back(std::move(s));
  }
  return settings;
}

}  // namespace

ArrayMode parse_array_mode(const std::string& name) {
  if (name == "grid") return ArrayMode::kGrid;
  if (name == "list") return ArrayMode::kList;
  STRATA_THROW() << "--array-mode: unknown mode '" << name << "'; valid: grid, list";
}

const char* array_mode_name(ArrayMode mode) { return mode == ArrayMode::kGrid ? "grid" : "list"; }

std::vector<ArrayJob> parse_array_spec(const std::string& spec, ArrayMode mode) {
  const std::vector<Setting> settings = parse_settings(spec);
  size_t count = 1;
  if (mode == ArrayMode::kGrid) {
    for (const Setting& s : settings) {
      count *= s.values.size();
      STRATA_CHECK(count <= kMaxJobs) << "--array: the grid has more than " << kMaxJobs
                                      << " jobs (at setting '" << s.name << "')";
    }
  } else {
    const Setting* longest = &settings[0];
    for (const Setting& s : settings) {
      if (s.values.size() > longest->values.size()) longest = &s;
    }
    count = longest->values.size();
    for (const Setting& s : settings) {
      STRATA_CHECK(s.values.size() == count || s.values.size() == 1)
          << "--array-mode list: setting '" << s.name << "' has " << s.values.size()
          << " values but '" << longest->name << "' has " << count
          << " (the i-th values form job i: give every setting " << count << " values or one)";
    }
  }
  std::vector<ArrayJob> jobs(count);
  for (size_t i = 0; i < count; ++i) {
    ArrayJob& job = jobs[i];
    job.index = static_cast<int>(i);
    size_t rest = i;  // grid: mixed-radix digits of i, the last setting fastest
    for (size_t k = settings.size(); k-- > 0;) {
      const Setting& s = settings[k];
      size_t v = 0;
      if (mode == ArrayMode::kGrid) {
        v = rest % s.values.size();
        rest /= s.values.size();
      } else {
        v = s.values.size() == 1 ? 0 : i;
      }
      apply_setting(&job, s.name, s.values[v], job_where(job.index, s.name));
    }
  }
  return jobs;
}

std::vector<ArrayJob> parse_array_lines(const std::string& text, const std::string& source) {
  std::vector<ArrayJob> jobs;
  std::istringstream in(text);
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    ArrayJob job;
    job.index = static_cast<int>(jobs.size());
    std::ostringstream at;
    at << source << ":" << line_number << " (job " << job.index << "): ";
    std::string normalized = t;
    for (char& c : normalized) {
      if (c == ',' || c == '\t') c = ' ';
    }
    std::istringstream tokens(normalized);
    std::string token;
    std::vector<std::string> seen;
    while (tokens >> token) {
      const size_t eq = token.find('=');
      STRATA_CHECK(eq != std::string::npos && eq > 0)
          << at.str() << "'" << token << "' is not NAME=VALUE";
      const std::string name = token.substr(0, eq);
      check_known(name, at.str());
      for (const std::string& n : seen) {
        STRATA_CHECK(n != name) << at.str() << "setting '" << name << "' given twice";
      }
      seen.push_back(name);
      const std::string value = token.substr(eq + 1);
      STRATA_CHECK(!value.empty()) << at.str() << "setting '" << name << "' has no value";
      apply_setting(&job, name, value, at.str() + "setting '" + name + "': ");
    }
    jobs.push_back(job);
    STRATA_CHECK(jobs.size() <= kMaxJobs) << source << ": more than " << kMaxJobs << " jobs";
  }
  STRATA_CHECK(!jobs.empty()) << "--array " << source
                              << ": holds no job (one job per line, e.g. 'lr=1e-3 batch-size=8')";
  return jobs;
}

std::vector<ArrayJob> read_array_file(const std::string& path) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "--array: cannot read job file '" << path << "'";
  std::ostringstream text;
  text << in.rdbuf();
  return parse_array_lines(text.str(), path);
}

std::vector<ArrayJob> parse_array_argument(const std::string& argument, ArrayMode mode) {
  std::error_code error;
  if (std::filesystem::is_regular_file(argument, error)) return read_array_file(argument);
  STRATA_CHECK(argument.find('=') != std::string::npos)
      << "--array '" << argument
      << "': no such file, and not a spec (expected a job file or NAME=V1,V2;... e.g. "
         "lr=1e-3,3e-3;batch-size=8)";
  return parse_array_spec(argument, mode);
}

void check_array_batch_sizes(const std::vector<ArrayJob>& jobs, int default_batch_size, int divisor,
                             const std::string& divisor_name) {
  STRATA_CHECK_GT(divisor, 0) << "--array: " << divisor_name << " must be positive";
  for (const ArrayJob& job : jobs) {
    const int batch = job.batch_size.value_or(default_batch_size);
    STRATA_CHECK(batch % divisor == 0)
        << "--array: job " << job.index << ": setting 'batch-size': " << batch
        << (job.batch_size ? "" : " (the run's --batch-size)") << " does not divide into "
        << divisor << " " << divisor_name;
  }
}

std::string describe_job(const ArrayJob& job) {
  std::ostringstream s;
  auto add = [&s](const char* name, const auto& value) {
    if (s.tellp() > 0) s << " ";
    s << name << "=" << value;
  };
  if (job.lr) add("lr", *job.lr);
  if (job.weight_decay) add("weight-decay", *job.weight_decay);
  if (job.momentum) add("momentum", *job.momentum);
  if (job.batch_size) add("batch-size", *job.batch_size);
  if (job.seed) add("seed", *job.seed);
  return s.str();
}

}  // namespace strata::parallel::arraypipe
