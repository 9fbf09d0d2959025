// Small image classifiers for 28 x 28 (MNIST-like) and 32 x 32 inputs: a two-block CNN
// (conv-BN-ReLU-pool x 2, then two linear layers) and a two-layer perceptron.
#pragma once

#include <cstdint>
#include <string>

#include "engine/tensor.h"
#include "io/proto/strata.pb.h"

namespace strata::models {

// sizes: tiny (8/16 channels, 32 hidden; for tests), small (32/64 channels, 128 hidden; the
// default job's model).
proto::ModelSpec cnn_spec(const std::string& size, const Shape& input_shape, int64_t num_classes);
// sizes: tiny (32 hidden), small (256 hidden).
proto::ModelSpec mlp_spec(const std::string& size, const Shape& input_shape, int64_t num_classes);

}  // namespace strata::models
