// Cost models from a device's rates or from measured profiles (see cost_model.h).
#include "parallel/sim/cost_model.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/check.h"

namespace strata::parallel::sim {

Efficiency parse_efficiency(const std::string& text, Efficiency base) {
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    STRATA_CHECK(eq != std::string::npos)
        << "--efficiency '" << text << "': expected CLASS=VALUE items, got '" << item
        << "' (classes: matmul, attention, memory)";
    const std::string key = item.substr(0, eq);
    double value = 0.0;
    try {
      size_t used = 0;
      value = std::stod(item.substr(eq + 1), &used);
      STRATA_CHECK(used == item.size() - eq - 1) << "";
    } catch (const std::exception&) {
      STRATA_THROW() << "--efficiency '" << text << "': '" << item.substr(eq + 1)
                     << "' is not a number";
    }
    STRATA_CHECK(value > 0.0 && value <= 1.0)
        << "--efficiency " << key << "=" << value << ": must be in (0, 1]";
    if (key == "matmul") {
      base.matmul = value;
    } else if (key == "attention") {
      base.attention = value;
    } else if (key == "memory") {
      base.memory = value;
    } else {
      STRATA_THROW() << "--efficiency: unknown op class '" << key
                     << "' (valid: matmul, attention, memory)";
    }
  }
  return base;
}

CostModel device_cost_model(const std::vector<LayerWork>& work, const DeviceSpec& device,
                            const DeviceCostOptions& o) {
  const double peak = o.peak_flops;
  STRATA_CHECK(peak > 0.0 && device.memory_bandwidth > 0.0)
      << "device " << device.name << " needs a peak rate and a memory bandwidth";
  const Efficiency& e = o.efficiency;
  CostModel model;
  model.source = "device model " + device.name;
  for (const LayerWork& w : work) {
    LayerModel l;
    l.work = w;
    const double attention = w.attention_flops * (o.causal_attention ? 0.5 : 1.0);
    const double matmul_s = w.matmul_flops / (peak * e.matmul);
    const double attention_s = attention / (peak * e.attention);
    const double memory_s = w.memory_bytes / (device.memory_bandwidth * e.memory);
    l.forward_s = {w.kernels * device.launch_seconds, matmul_s + attention_s + memory_s};
    l.backward_s = {2.0 * w.kernels * device.launch_seconds,
                    2.0 * matmul_s + 2.5 * attention_s + 2.0 * memory_s};
    l.flops_per_sample = w.matmul_flops + w.attention_flops;
    model.layers.push_back(std::move(l));
  }
  model.optimizer_s_per_param_byte =
      (3.0 + 2.0 * o.optimizer_slots) / (device.memory_bandwidth * e.memory);
  return model;
}

MeasuredProfile read_profile(const std::string& spec) {
  MeasuredProfile p;
  std::string path = spec;
  const size_t at = spec.rfind('@');
  if (at != std::string::npos) {
    path = spec.substr(0, at);
    const std::string batch = spec.substr(at + 1);
    size_t used = 0;
    try {
      p.batch = std::stoll(batch, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    STRATA_CHECK(used == batch.size() && p.batch > 0)
        << "--profile '" << spec << "': expected FILE or FILE@BATCH with BATCH the --batch-size "
        << "it was measured at (a positive integer)";
  }
  p.source = path;
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "cannot read profile '" << path
                          << "' (write one with `strata profile --output " << path << "`)";
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    STRATA_THROW() << "profile '" << path << "' is not valid JSON: " << e.what()
                   << " (write one with `strata profile --output FILE`)";
  }
  STRATA_CHECK(doc.is_object() && doc.contains("layers") && doc["layers"].is_array())
      << "profile '" << path << "': expected an object with a \"layers\" array, as "
      << "`strata profile --output` writes";
  for (size_t i = 0; i < doc["layers"].size(); ++i) {
    const nlohmann::json& l = doc["layers"][i];
    auto number = [&](const char* key) {
      STRATA_CHECK(l.is_object() && l.contains(key) && l[key].is_number())
          << "profile '" << path << "': layers[" << i << "] lacks the number \"" << key << "\"";
      const double v = l[key].get<double>();
      STRATA_CHECK(v >= 0.0) << "profile '" << path << "': layers[" << i << "]." << key
                             << " is negative (" << v << ")";
      return v;
    };
    STRATA_CHECK(l.is_object() && l.contains("name") && l["name"].is_string())
        << "profile '" << path << "': layers[" << i << "] lacks the string \"name\"";
    p.names.push_back(l["name"].get<std::string>());
    p.forward_ms.push_back(number("forward_ms_per_sample"));
    p.backward_ms.push_back(number("backward_ms_per_sample"));
  }
  return p;
}

namespace {

// Least squares of t = a + b x over (x, t); a < 0 is clamped to 0 (b refitted through 0).
Linear fit(const std::vector<double>& x, const std::vector<double>& t) {
  const double n = static_cast<double>(x.size());
  double sx = 0, st = 0, sxx = 0, sxt = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    st += t[i];
    sxx += x[i] * x[i];
    sxt += x[i] * t[i];
  }
  const double denominator = n * sxx - sx * sx;
  Linear l;
  l.per_sample = (n * sxt - sx * st) / denominator;
  l.fixed = (st - l.per_sample * sx) / n;
  if (l.fixed < 0.0) {  // through the origin
    l.fixed = 0.0;
    l.per_sample = sxt / sxx;
  } else if (l.per_sample < 0.0) {  // flat: the mean
    l.per_sample = 0.0;
    l.fixed = st / n;
  }
  return l;
}

}  // namespace

CostModel profile_cost_model(const std::vector<LayerWork>& work,
                             const std::vector<MeasuredProfile>& profiles) {
  STRATA_CHECK(!profiles.empty()) << "profile_cost_model: no profile";
  for (const MeasuredProfile& p : profiles) {
    const size_t n = std::min(p.names.size(), work.size());
    for (size_t i = 0; i < n; ++i) {
      STRATA_CHECK(p.names[i] == work[i].name)
          << "profile '" << p.source << "' does not match the model: layer " << i << " is '"
          << p.names[i] << "' in the profile but '" << work[i].name << "' in the model";
    }
    STRATA_CHECK_EQ(p.names.size(), work.size())
        << "profile '" << p.source << "' does not match the model: the profile has "
        << p.names.size() << " layers, the model " << work.size();
  }
  if (profiles.size() > 1) {
    for (size_t a = 0; a < profiles.size(); ++a) {
      STRATA_CHECK(profiles[a].batch > 0)
          << "--profile '" << profiles[a].source << "': with several profiles each needs its "
          << "batch size, FILE@BATCH";
      for (size_t b = 0; b < a; ++b) {
        STRATA_CHECK(profiles[a].batch != profiles[b].batch)
            << "--profile: two profiles at batch " << profiles[a].batch
            << "; a fit needs distinct batch sizes";
      }
    }
  }
  CostModel model;
  model.source = "profile";
  for (const MeasuredProfile& p : profiles) {
    model.source += " " + p.source + (p.batch > 0 ? "@" + std::to_string(p.batch) : "");
  }
  for (size_t i = 0; i < work.size(); ++i) {
    LayerModel l;
    l.work = work[i];
    l.flops_per_sample = work[i].matmul_flops + work[i].attention_flops;
    if (profiles.size() == 1) {
      l.forward_s = {0.0, profiles[0].forward_ms[i] / 1e3};
      l.backward_s = {0.0, profiles[0].backward_ms[i] / 1e3};
    } else {
      std::vector<double> x, f, b;
      for (const MeasuredProfile& p : profiles) {
        const double rows = static_cast<double>(p.batch);
        x.push_back(rows);
        f.push_back(p.forward_ms[i] / 1e3 * rows);  // per call
        b.push_back(p.backward_ms[i] / 1e3 * rows);
      }
      l.forward_s = fit(x, f);
      l.backward_s = fit(x, b);
    }
    model.layers.push_back(std::move(l));
  }
  return model;
}

}  // namespace strata::parallel::sim
