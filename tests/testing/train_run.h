// `strata train` as the CLI tests of the paper systems run it: with --metrics and --save-weights,
// so that a run can be compared with another by its per-step losses (as written) and its final
// weights' bytes. Include after defining STRATA_CLI_PATH (the target's compile definition).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace strata::testing {

struct TrainRun {
  int status = -1;
  std::string output;                                          // stdout and stderr together
  std::vector<std::string> losses;                             // the train records' losses
  std::map<std::string, std::vector<nlohmann::json>> records;  // every metrics record, by type
  std::string weights;                                         // the --save-weights file's bytes

  const std::vector<nlohmann::json>& of(const std::string& type) const {
    static const std::vector<nlohmann::json> kNone;
    const auto it = records.find(type);
    return it == records.end() ? kNone : it->second;
  }
};

// `strata train ARGS --metrics DIR/NAME.jsonl --save-weights DIR/NAME.st --log-every 1`, under
// `launcher` (e.g. mpirun ... ) when given.
inline TrainRun train_run(const std::string& dir, const std::string& name, const std::string& args,
                          const std::string& launcher = "") {
  const std::string metrics = dir + "/" + name + ".jsonl", weights = dir + "/" + name + ".st";
  std::filesystem::remove(metrics);
  std::filesystem::remove(weights);
  const std::string cmd = (launcher.empty() ? "" : launcher + " ") + STRATA_CLI_PATH + " train " +
                          args + " --metrics " + metrics + " --save-weights " + weights +
                          " --log-every 1 --progress off 2>&1";
  TrainRun r;
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (pipe != nullptr && (n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int raw = pipe != nullptr ? pclose(pipe) : -1;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const std::string type = j.value("type", "");
    if (type == "train") r.losses.push_back(j["loss"].dump());
    r.records[type].push_back(j);
  }
  std::ifstream w(weights, std::ios::binary);
  r.weights.assign(std::istreambuf_iterator<char>(w), std::istreambuf_iterator<char>());
  return r;
}

}  // namespace strata::testing
