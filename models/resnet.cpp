// PLACEHOLDER: replaced by the real implementation.
#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
proto::ModelSpec resnet_spec(const ModelRequest&) {
  STRATA_THROW() << "model resnet not implemented yet";
}
}  // namespace strata::models
