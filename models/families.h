// The builders behind models/registry.h, one per family (a file each).
#pragma once

#include "io/proto/strata.pb.h"
#include "models/registry.h"

namespace strata::models {

// cnn.cpp: tiny, small.
proto::ModelSpec cnn_spec(const ModelRequest& request);
// cnn.cpp: tiny, small.
proto::ModelSpec mlp_spec(const ModelRequest& request);
// vgg.cpp: 11, 13, 16, 19, 11-bn, 13-bn, 16-bn, 19-bn, tiny, tiny-bn (torchvision's layout:
// features, adaptive average pool 7 x 7, classifier with dropout).
proto::ModelSpec vgg_spec(const ModelRequest& request);
// resnet.cpp: 18, 34, 50, 101, 152, tiny (ImageNet stem for inputs larger than 64 px, the
// small-image stem (3x3 convolution, no pooling) for 28-32 px inputs).
proto::ModelSpec resnet_spec(const ModelRequest& request);
// gpt2.cpp: 124M, 355M, 774M, 1558M, tiny; ModelDims override any dimension.
proto::ModelSpec gpt2_spec(const ModelRequest& request);
// bert.cpp: base, large, tiny (masked-language-model head); ModelDims override any dimension.
proto::ModelSpec bert_spec(const ModelRequest& request);

// V rounded up to a multiple of `multiple` (ModelDims::vocab_multiple; <= 1: V itself).
inline int64_t padded_vocab_size(int64_t vocab, int64_t multiple) {
  return multiple <= 1 ? vocab : (vocab + multiple - 1) / multiple * multiple;
}

}  // namespace strata::models
