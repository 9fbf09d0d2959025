// PLACEHOLDER: replaced by the real implementation.
#include "engine/check.h"
#include "models/families.h"

namespace strata::models {
proto::ModelSpec bert_spec(const ModelRequest&) {
  STRATA_THROW() << "model bert not implemented yet";
}
}  // namespace strata::models
