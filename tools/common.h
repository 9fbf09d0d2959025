// Small helpers shared by the `strata` subcommands.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

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
// Two aligned columns.
void print_table(const std::vector<std::pair<std::string, std::string>>& rows);

}  // namespace strata::tools
