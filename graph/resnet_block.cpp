// PLACEHOLDER: replaced by the real implementation.
#include "graph/resnet_block.h"
#include "engine/check.h"

namespace strata::graph {
std::unique_ptr<Layer> make_resnet_block(const std::string& name, const Shape&,
                                         const proto::ResNetBlockSpec&) {
  STRATA_THROW() << "layer " << name << ": resnet_block not implemented yet";
}
}  // namespace strata::graph
