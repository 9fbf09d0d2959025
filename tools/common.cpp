#include "tools/common.h"

#include <cctype>
#include <cstdio>
#include <sstream>
#include <thread>

#include "engine/check.h"
#include "engine/cuda_runtime.h"
#include "engine/log.h"
#include "graph/model_spec.h"
#include "models/registry.h"
#include "ops/dispatch.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace strata::tools {

Device resolve_device(const std::string& text) {
  if (text != "auto") {
    return for_flag("--device", [&] {
      const Device d = parse_device(text);
      check_device_available(d);
      return d;
    });
  }
  const int gpus = cuda_device_count();
  if (gpus > 0 && ops::has_kernels_for(DeviceType::kCUDA)) return Device::cuda(0);
  if (gpus > 0) {
    std::fprintf(stderr,
                 "device auto: %d GPU(s) present, but this build has no CUDA kernels; using cpu\n",
                 gpus);
  } else if (cuda::built_with_cuda()) {
    std::fprintf(stderr, "device auto: no usable GPU here; using cpu\n");
  }
  return Device::cpu();
}

std::string describe_threads(const ExecContext& ctx) {
  if (ctx.threads() > 0) {
    return std::to_string(ctx.threads()) + " thread" + (ctx.threads() == 1 ? "" : "s");
  }
  int n = static_cast<int>(std::thread::hardware_concurrency());
#ifdef _OPENMP
  n = omp_get_max_threads();
#endif
  return std::to_string(n) + " threads (all cores)";
}

std::string format_number(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

std::unique_ptr<graph::Model> build_cli_model(const std::string& model, const std::string& size,
                                              const std::string& model_spec,
                                              const io::Dataset& data) {
  const proto::ModelSpec spec =
      model_spec.empty()
          ? models::model_spec(model, size, data.input_spec().shape, data.num_classes())
          : graph::load_model_spec(model_spec);
  std::unique_ptr<graph::Model> m = graph::build_model(spec);
  STRATA_CHECK(m->input_shape() == data.input_spec().shape)
      << "model '" << m->name() << "' takes samples of shape " << shape_str(m->input_shape())
      << " but dataset " << data.name() << " has " << shape_str(data.input_spec().shape);
  return m;
}

bool names_flag(const std::string& text, const std::string& flag) {
  for (size_t at = text.find(flag); at != std::string::npos; at = text.find(flag, at + 1)) {
    const size_t end = at + flag.size();
    if (end == text.size() || !(std::isalnum(static_cast<unsigned char>(text[end])) ||
                                text[end] == '-' || text[end] == '_')) {
      return true;
    }
  }
  return false;
}

void print_error(const std::exception& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "\nerror: %s\n", error_message(e).c_str());
  const std::string where = error_where(e);
  if (!where.empty() && log_level() == LogLevel::kDebug) {
    std::fprintf(stderr, "  at %s\n", where.c_str());
  }
  std::fflush(stderr);
}

void print_table(const std::vector<std::pair<std::string, std::string>>& rows) {
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.first.size());
  for (const auto& r : rows) {
    std::printf("  %-*s  %s\n", static_cast<int>(width), r.first.c_str(), r.second.c_str());
  }
}

}  // namespace strata::tools
