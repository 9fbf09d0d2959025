// PLACEHOLDER: replaced by the real implementation.
#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
proto::ModelSpec gpt2_spec(const ModelRequest&) {
  STRATA_THROW() << "model gpt2 not implemented yet";
}
}  // namespace strata::models
