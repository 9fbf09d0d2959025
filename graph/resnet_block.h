// The ResNet block as one layer (the unit a pipeline stage boundary may fall between).
#pragma once

#include <memory>
#include <string>

#include "engine/tensor.h"
#include "graph/layer.h"
#include "io/proto/strata.pb.h"

namespace strata::graph {

// input_shape: (C, H, W). See ResNetBlockSpec in io/proto/strata.proto.
std::unique_ptr<Layer> make_resnet_block(const std::string& name, const Shape& input_shape,
                                         const proto::ResNetBlockSpec& spec);

}  // namespace strata::graph
