// Small helpers shared by the `strata` subcommands.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/check.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "graph/model.h"
#include "io/dataset.h"

namespace strata::tools {

// "auto" -> cuda:0 when a GPU is present and this build has CUDA kernels, else cpu (and says
// which and why on stdout); anything else is parsed and checked to exist.
Device resolve_device(const std::string& text);
// "2 threads" / "all 16 cores"
std::string describe_threads(const ExecContext& ctx);
// Shortest round-trip form: 0.001 -> "0.001", 2e-05 -> "2e-05".
std::string format_number(double value);
// The model of --model/--size or --model-spec for samples of `data`, checked against it.
std::unique_ptr<graph::Model> build_cli_model(const std::string& model, const std::string& size,
                                              const std::string& model_spec,
                                              const io::Dataset& data);
// "error: <the sentence>" on stderr, after flushing stdout; with --log-level debug, also the
// engine's location of a strata::Error ("  at trainer.cpp:167: check failed: ...").
void print_error(const std::exception& e);
// True when `text` names `flag` itself ("--model ", "--model:"), not a longer one ("--model-spec").
bool names_flag(const std::string& text, const std::string& flag);
// Runs `f`; a strata::Error from it that does not name `flag` is rethrown with "FLAG: " before
// its sentence, so that a value the library refuses ("unknown optimizer 'adam'") names the flag
// the user gave it with.
template <typename F>
auto for_flag(const std::string& flag, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const Error& e) {
    if (names_flag(e.message(), flag)) throw;
    throw Error(flag + ": " + e.message(), e.where());
  }
}
// Two aligned columns.
void print_table(const std::vector<std::pair<std::string, std::string>>& rows);

}  // namespace strata::tools
