#include "tools/bench/gropipe_workload.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/check.h"
#include "engine/exec_context.h"
#include "graph/model_spec.h"
#include "graph/profiler.h"
#include "graph/train_step.h"
#include "io/datasets.h"
#include "models/registry.h"
#include "parallel/sim/cost_model.h"
#include "tools/bench/bench_random.h"
#include "tools/bench/timed_layer.h"
#include "tools/bench/timed_linear.h"

namespace strata::bench {
namespace {

proto::ModelSpec mlp_wide(const Options& o) {
  std::string text = "name: \"mlp_wide\" input { shape: [" + std::to_string(o.width) + "] }\n";
  for (int l = 0; l < o.depth; ++l) {
    const int out = l + 1 == o.depth ? 10 : o.width;
    text += "layer { name: \"fc" + std::to_string(l) +
            "\" type: \"linear\" linear { out_features: " + std::to_string(out) + " } }\n";
    if (l + 1 < o.depth)
      text += "layer { name: \"relu" + std::to_string(l) + "\" type: \"relu\" }\n";
  }
  return graph::parse_model_spec(text, "mlp-wide");
}

// NVIDIA T4 (the paper's GPU, Table III): 65 TFLOP/s fp16 tensor cores, 8.1 TFLOP/s fp32,
// 320 GB/s GDDR6, 16 GB, PCIe 3 x16.
parallel::sim::DeviceSpec device_spec(const std::string& name) {
  if (name != "t4") return parallel::sim::builtin_device(name);
  parallel::sim::DeviceSpec t4;
  t4.name = "t4";
  t4.peak_flops = 65e12;
  t4.peak_flops_tf32 = 8.1e12;
  t4.peak_flops_fp32 = 8.1e12;
  t4.memory_bandwidth = 320e9;
  t4.memory_bytes = 16e9;
  t4.nvlink_bandwidth = 0.0;
  t4.host_bandwidth = 12e9;
  t4.launch_seconds = 5e-6;
  return t4;
}

// Per-layer profile of a model on this CPU at `rows` samples per call (the median of three
// profiles of four calls each, after a warm-up call).
std::vector<parallel::LayerCost> profile_costs(const Workload& w, int64_t rows, int threads) {
  std::unique_ptr<graph::Model> model = w.build ? w.build() : graph::build_model(w.spec);
  ExecContext ctx(Device::cpu(), nullptr, threads);
  graph::ParamStore store(*model, 0, model->size(), ctx.allocator());
  store.initialize(1);
  Shape shape{rows};
  for (int64_t d : model->input_shape()) shape.push_back(d);
  const Tensor x = Tensor::full(shape, 0.1);
  const Tensor target = Tensor::zeros({rows}, DType::kI64);
  std::vector<std::vector<double>> forward(model->size()), backward(model->size());
  std::vector<parallel::LayerCost> costs;
  for (int run = 0; run < 3; ++run) {
    graph::LayerProfiler profiler(*model);
    for (int step = 0; step < 5; ++step) {
      graph::ForwardOptions fwd;
      fwd.step = step;
      graph::train_forward_backward(ctx, *model, {x}, target, {}, fwd, &profiler);
      store.zero_grads(ctx);
      if (step == 0) profiler.reset();
    }
    costs = parallel::layer_costs(profiler.layers());
    for (size_t l = 0; l < model->size(); ++l) {
      forward[l].push_back(costs[l].forward_ms);
      backward[l].push_back(costs[l].backward_ms);
    }
  }
  for (size_t l = 0; l < costs.size(); ++l) {
    std::sort(forward[l].begin(), forward[l].end());
    std::sort(backward[l].begin(), backward[l].end());
    costs[l].forward_ms = forward[l][1];
    costs[l].backward_ms = backward[l][1];
  }
  return costs;
}

}  // namespace

Workload workload(const Options& o, bool real_data) {
  Workload w;
  if (o.model == "mlp-wide") {
    STRATA_CHECK(!real_data) << "--mode accuracy needs an image model (--model resnet)";
    w.train = std::make_shared<tools::RandomFeatures>(1 << 16, o.width);
    w.spec = mlp_wide(o);
    if (o.compute_ms > 0) {
      // The same layers with a fixed duration each: the compute leaves the CPU free, as on an
      // accelerator, and the all-reduce (real, of the real gradient buffers) has it to itself.
      const auto forward = std::chrono::microseconds(static_cast<int64_t>(o.compute_ms * 1000));
      const auto per_row =
          std::chrono::microseconds(static_cast<int64_t>(o.compute_ms_per_sample * 1000));
      const Options opts = o;
      w.build = [opts, forward, per_row] {
        auto model = std::make_unique<graph::Model>("mlp_wide_timed", Shape{opts.width});
        for (int l = 0; l < opts.depth; ++l) {
          const int out = l + 1 == opts.depth ? 10 : opts.width;
          model->add(std::make_unique<bench::TimedLinear>("fc" + std::to_string(l), opts.width, out,
                                                          forward, per_row));
          if (l + 1 < opts.depth) {
            model->add(std::make_unique<graph::ReluLayer>("relu" + std::to_string(l)));
          }
        }
        return model;
      };
      // The timed layers' durations (ReLUs: free).
      w.costs = [opts](int64_t rows) {
        std::vector<parallel::LayerCost> costs;
        const double ms = (opts.compute_ms + opts.compute_ms_per_sample * rows) / rows;
        for (int l = 0; l < opts.depth; ++l) {
          costs.push_back({"fc" + std::to_string(l), ms, 2 * ms});
          if (l + 1 < opts.depth) costs.push_back({"relu" + std::to_string(l), 0.0, 0.0});
        }
        return costs;
      };
      w.costs_source = "the timed layers' durations";
    }
  } else {
    io::DatasetOptions d;
    d.image_size = real_data ? 0 : o.image_size;  // Fashion-MNIST keeps its 28x28
    d.augment = false;
    w.train = io::open_dataset(real_data ? "fashion-mnist" : "synthetic-images", "", "train", d);
    if (real_data) w.test = io::open_dataset("fashion-mnist", "", "test", d);
    if (w.test && o.test_samples > 0 && o.test_samples < w.test->size()) {
      w.test = io::make_subset(w.test, 0, o.test_samples);
    }
    w.spec =
        models::model_spec(o.model, o.size, w.train->input_spec().shape, w.train->num_classes());
  }
  if (!o.device_model.empty()) {
    // Every layer timed by the device's cost model (parallel/sim/cost_model.h) of its work.
    STRATA_CHECK(o.model != "mlp-wide") << "--device-model applies to registry models (--model)";
    const std::unique_ptr<graph::Model> base = graph::build_model(w.spec);
    const parallel::sim::DeviceSpec device = device_spec(o.device_model);
    parallel::sim::DeviceCostOptions dc;
    dc.peak_flops = device.peak_flops_fp32;
    dc.causal_attention = false;
    dc.optimizer_slots = 1;
    const parallel::sim::CostModel cost = parallel::sim::device_cost_model(
        parallel::sim::model_work(*base, &w.spec, parallel::sim::WorkOptions{}), device, dc);
    std::vector<proto::ModelSpec> one_layer;  // layer l alone, on the input it receives
    for (size_t l = 0; l < base->size(); ++l) {
      proto::ModelSpec one;
      one.set_name(w.spec.name());
      for (int64_t dim : base->shape_before(l)) one.mutable_input()->add_shape(dim);
      one.mutable_input()->set_dtype(dtype_name(base->specs_before(l).at(0).dtype));
      *one.add_layer() = w.spec.layer(static_cast<int>(l));
      one.mutable_layer(0)->set_name(base->layer(l).name());
      one_layer.push_back(one);
    }
    const double scale = o.time_scale;
    const bool compute = o.device_compute == "on";
    const Shape input = base->input_shape();
    const DType input_dtype = base->input_dtype();
    const std::string name = w.spec.name() + "_" + o.device_model;
    w.build = [one_layer, cost, scale, compute, input, input_dtype, name] {
      auto model = std::make_unique<graph::Model>(name, input, input_dtype);
      for (size_t l = 0; l < one_layer.size(); ++l) {
        model->add(std::make_unique<bench::TimedLayer>(graph::build_model(one_layer[l]), 0,
                                                       cost.layers[l].forward_s,
                                                       cost.layers[l].backward_s, scale, compute));
      }
      return model;
    };
    std::vector<std::string> names;
    for (size_t l = 0; l < base->size(); ++l) names.push_back(base->layer(l).name());
    w.costs = [cost, scale, names](int64_t rows) {
      std::vector<parallel::LayerCost> costs;
      for (size_t l = 0; l < cost.layers.size(); ++l) {
        const parallel::sim::LayerModel& m = cost.layers[l];
        costs.push_back({names[l], 1e3 * scale * m.forward_s.at(rows) / rows,
                         1e3 * scale * m.backward_s.at(rows) / rows, m.work.output_bytes});
      }
      return costs;
    };
    char factor[32];
    std::snprintf(factor, sizeof factor, "%g", scale);
    w.costs_source = device.name + "'s cost model x " + factor;
  }
  if (!w.costs) {
    const int threads = o.threads;
    w.costs = [w, threads](int64_t rows) { return profile_costs(w, rows, threads); };
    w.costs_source = "profiled on this CPU";
  }
  return w;
}

}  // namespace strata::bench
