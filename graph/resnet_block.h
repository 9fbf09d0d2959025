// The ResNet block as one layer (the unit a pipeline stage boundary may fall between).
#pragma once

#include <memory>
#include <string>

#include "engine/tensor.h"
#include "graph/layer.h"
#include "io/proto/strata.pb.h"

namespace strata::graph {

// input_shape: (C, H, W); output (planes [* expansion], H', W') with H' = (H - 1) / stride + 1.
// See ResNetBlockSpec in io/proto/strata.proto. Parameters carry torchvision's names relative to
// the block ("conv1.weight", "bn1.weight", "bn1.bias", ..., "downsample.0.weight",
// "downsample.1.bias"; buffers "bn1.running_mean", "bn1.running_var", ...), so that a layer named
// "layer1.0" holds "layer1.0.conv1.weight". Training mode normalizes with batch statistics and
// updates the running ones; evaluation mode uses the running statistics. Backward accumulates
// (+=) every parameter gradient and skips the input gradient when !tape.needs_input_grad.
std::unique_ptr<Layer> make_resnet_block(const std::string& name, const Shape& input_shape,
                                         const proto::ResNetBlockSpec& spec);

}  // namespace strata::graph
