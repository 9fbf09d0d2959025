// ModelSpec text (graph/model_spec.h): protobuf's text parser plus our checks. An accepted spec
// prints and parses back to the same message; building the model from it either succeeds or
// throws strata::Error (unknown types, bad shapes or sizes).
#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "graph/model.h"
#include "graph/model_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  if (size > 16384) return 0;  // specs are small; longer inputs only slow the search down
  const std::string text(fuzz::as_text(data, size));
  proto::ModelSpec spec;
  try {
    spec = graph::parse_model_spec(text, "fuzz.prototxt");
  } catch (const Error&) {
    return 0;
  }
  const proto::ModelSpec again = graph::parse_model_spec(graph::model_spec_to_text(spec), "again");
  FUZZ_CHECK(again.SerializeAsString() == spec.SerializeAsString());
  try {
    std::unique_ptr<graph::Model> model = graph::build_model(spec);
    FUZZ_CHECK(model != nullptr);
  } catch (const Error&) {
  }
  return 0;
}
