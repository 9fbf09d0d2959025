// The `strata` command line: one binary, subcommands, long flags.
//
// Errors from the library (strata::Error) are printed as "error: <sentence>" with exit status 1
// (the engine's file and line only with --log-level debug); a bad command line prints CLI11's
// message plus the valid flags and exits with status 2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "engine/check.h"
#include "engine/log.h"
#include "ops/cpu_runtime.h"
#include "tools/bench/model_bench.h"
#include "tools/common.h"
#include "tools/convert_command.h"
#include "tools/eval_command.h"
#include "tools/fit_slowdown_command.h"
#include "tools/generate_command.h"
#include "tools/plan_command.h"
#include "tools/plot_command.h"
#include "tools/profile_command.h"
#include "tools/simulate_command.h"
#include "tools/text_commands.h"
#include "tools/train_command.h"

namespace {

// The flags of the subcommand that was being parsed (or of the top level).
void print_valid_flags(const CLI::App& app) {
  const CLI::App* target = &app;
  for (const CLI::App* sub : app.get_subcommands()) target = sub;
  std::string flags;
  for (const CLI::Option* opt : target->get_options()) {
    const std::string name = opt->get_name(false, true);
    if (name.rfind("--", 0) == 0) flags += (flags.empty() ? "" : ", ") + name;
  }
  const std::string cmd = target == &app ? "strata" : "strata " + target->get_name();
  std::fprintf(stderr, "valid flags for %s: %s\n", cmd.c_str(), flags.c_str());
  if (target == &app) {
    std::fprintf(stderr,
                 "commands: train, eval, generate, profile, plan, simulate, bench, prepare-text, "
                 "tokenize, convert, plot, fit-slowdown\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Idle OpenMP threads that sleep instead of spinning: libgomp reads its wait policy when it
  // loads, so this may re-execute the program (ops/cpu_runtime.h).
  strata::ops::cpu_runtime::tune_process_environment(argv);
  CLI::App app{"strata: a pipeline-parallel deep-learning training engine"};
  app.require_subcommand(1);
  // `strata --help` lists every command with every flag and its default.
  app.set_help_flag();
  app.set_help_all_flag("-h,--help", "Print this help (every command and flag) and exit");
  app.footer("Run `strata COMMAND --help` for one command's flags.");
  app.set_version_flag("--version", std::string("strata ") + STRATA_VERSION);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "Log level: debug, info, warn, error")
      ->capture_default_str();

  strata::tools::TrainOptions train;
  CLI::App* train_cmd = strata::tools::add_train_command(app, train);
  strata::tools::ProfileOptions profile;
  CLI::App* profile_cmd = strata::tools::add_profile_command(app, profile);
  strata::tools::PlanOptions plan;
  CLI::App* plan_cmd = strata::tools::add_plan_command(app, plan);
  strata::tools::SimulateOptions simulate;
  CLI::App* simulate_cmd = strata::tools::add_simulate_command(app, simulate);
  strata::tools::BenchOptions bench;
  CLI::App* bench_cmd = strata::tools::add_bench_command(app, bench);
  strata::tools::PrepareTextOptions prepare_text;
  CLI::App* prepare_text_cmd = strata::tools::add_prepare_text_command(app, prepare_text);
  strata::tools::TokenizeOptions tokenize;
  CLI::App* tokenize_cmd = strata::tools::add_tokenize_command(app, tokenize);
  strata::tools::ConvertOptions convert;
  CLI::App* convert_cmd = strata::tools::add_convert_command(app, convert);
  strata::tools::EvalOptions eval;
  CLI::App* eval_cmd = strata::tools::add_eval_command(app, eval);
  strata::tools::GenerateOptions generate;
  CLI::App* generate_cmd = strata::tools::add_generate_command(app, generate);
  strata::tools::PlotOptions plot;
  CLI::App* plot_cmd = strata::tools::add_plot_command(app, plot);
  strata::tools::FitSlowdownOptions fit_slowdown;
  CLI::App* fit_slowdown_cmd = strata::tools::add_fit_slowdown_command(app, fit_slowdown);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    print_valid_flags(app);
    return 2;
  }

  try {
    strata::set_log_level(strata::parse_log_level(log_level));
    if (*train_cmd) return strata::tools::run_train(train);
    if (*profile_cmd) return strata::tools::run_profile(profile);
    if (*plan_cmd) return strata::tools::run_plan(plan);
    if (*simulate_cmd) return strata::tools::run_simulate(simulate);
    if (*bench_cmd) return strata::tools::run_bench(bench);
    if (*prepare_text_cmd) return strata::tools::run_prepare_text(prepare_text);
    if (*tokenize_cmd) return strata::tools::run_tokenize(tokenize);
    if (*convert_cmd) return strata::tools::run_convert(convert);
    if (*eval_cmd) return strata::tools::run_eval(eval);
    if (*generate_cmd) return strata::tools::run_generate(generate);
    if (*plot_cmd) return strata::tools::run_plot(plot);
    if (*fit_slowdown_cmd) return strata::tools::run_fit_slowdown(fit_slowdown);
  } catch (const std::exception& e) {
    strata::tools::print_error(e);
    return 1;
  }
  return 0;
}
