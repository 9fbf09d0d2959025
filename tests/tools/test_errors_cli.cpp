// Every CLI error case of tests/tools/error_cases.txt, as a user meets it: a failing exit status,
// an "error: " line that names the flag, file, tensor or rank concerned, and none of the engine's
// file:line locations, which --log-level debug adds below the sentence.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

#include "testing/cli.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

struct Case {
  std::string args, names;
};

std::vector<Case> cases() {
  std::ifstream in(STRATA_ERROR_CASES);
  std::vector<Case> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    if (tab == std::string::npos) continue;
    out.push_back({line.substr(0, tab), line.substr(tab + 1)});
  }
  return out;
}

// "trainer.cpp:167", "check.h:12": where the engine raised an error.
const std::regex kLocation(R"([A-Za-z_0-9]+\.(cpp|h|cu|cuh):[0-9]+)");

TEST(ErrorsCli, ErrorLinesNameTheFlagAndHideTheLocationUnlessDebug) {
  int checked = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE("strata " + c.args);
    const strata::testing::CliResult r = run_cli(c.args + " < /dev/null");
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, c.names)) << "does not name '" << c.names << "':\n" << r.output;
    std::smatch m;
    EXPECT_FALSE(std::regex_search(r.output, m, kLocation))
        << "engine location " << m.str() << " in:\n"
        << r.output;
    ++checked;
  }
  EXPECT_GE(checked, 30);
  // --log-level debug adds the location of a check under the sentence.
  const strata::testing::CliResult debug = run_cli("--log-level debug train --lr -1 --steps 1");
  EXPECT_EQ(debug.status, 1);
  EXPECT_TRUE(contains(debug.output, "error: --lr must be >= 0, got -1")) << debug.output;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(debug.output, m, kLocation)) << debug.output;
  EXPECT_TRUE(contains(debug.output, "  at ")) << debug.output;
}

}  // namespace
