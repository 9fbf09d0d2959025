// PLACEHOLDER: replaced by the real implementation.
#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
proto::ModelSpec vgg_spec(const ModelRequest&) {
  STRATA_THROW() << "model vgg not implemented yet";
}
}  // namespace strata::models
