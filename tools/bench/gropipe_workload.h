// The workloads of gropipe_bench (tools/bench/gropipe_bench.cpp): its options, and the model,
// data and per-layer costs each run trains on: the wide MLP (timed or not), a registry image
// model on synthetic images or Fashion-MNIST, or a registry model whose layers last what a
// device's cost model gives (timed_layer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/proto/strata.pb.h"
#include "parallel/partition/partition.h"
#include "parallel/trainer.h"

namespace strata::bench {

struct Options {
  std::string mode = "overlap";
  std::string system = "gropipe";  // gropipe (the paper's configuration) or custom
  std::string model = "mlp-wide";  // or a registry model (resnet, vgg, cnn, ...)
  std::string size = "tiny";
  int width = 1024;  // mlp-wide: hidden units
  int depth = 8;     // mlp-wide: linear layers
  int groups = 2, stages = 2, ranks = 4;
  int64_t micro_batches = 4;
  int64_t batch_size = 32;
  int64_t steps = 12, warmup = 3;
  int repeats = 5;
  double bucket_mb = 25.0;
  int delay = 0;
  std::string delays = "0,1";           // delay mode
  std::string buffer_channels = "own";  // delay mode: own and/or shared, for batch-norm models
  std::string micro_list = "1,2,4,8";
  double target = 0.80;      // accuracy mode
  int64_t max_epochs = 3;    // accuracy mode
  int64_t test_samples = 0;  // accuracy mode: the first this many test samples (0: all)
  int64_t micro_size =
      0;            // accuracy mode: samples per micro-batch (M per layout); 0: --micro-batches
  int threads = 0;  // per process; 0 = all cores
  double compute_ms = 0;             // mlp-wide: > 0: each linear layer lasts this (backward twice)
  double compute_ms_per_sample = 0;  // ... plus this per sample of its micro-batch
  std::string device_model;          // registry models: layers timed by this device's model
  double time_scale = 1.0;           // ... times this
  std::string device_compute = "on";  // ... and the layers run (on) or not (off)
  int64_t image_size = 32;            // synthetic images (throughput modes)
};

struct Workload {
  proto::ModelSpec spec;
  parallel::ModelBuilder build;  // set: the model is built by this (its spec only names layers)
  std::shared_ptr<const io::Dataset> train, test;
  // Per-layer costs (ms per sample) at micro-batches of `rows`, for AMPA (--system gropipe).
  std::function<std::vector<parallel::LayerCost>(int64_t rows)> costs;
  std::string costs_source;
};

// The model, data and costs of a run; `real_data`: Fashion-MNIST (train and test) instead of
// synthetic inputs.
Workload workload(const Options& o, bool real_data);

}  // namespace strata::bench
