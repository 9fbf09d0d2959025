// safetensors (io/safetensors.h): the header checks of SafetensorsReader. An accepted file's
// entries tile the data buffer in order (as the header comment promises), and every tensor of a
// dtype Strata loads reads back with its recorded byte size.
#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const std::string path = fuzz::scratch().write("in.safetensors", fuzz::as_text(data, size));
  try {
    io::SafetensorsReader reader(path);
    FUZZ_CHECK(8 + reader.header_bytes() <= size);
    uint64_t next = 0;
    for (const io::SafetensorsInfo& info : reader.tensors()) {
      FUZZ_CHECK(info.begin == next && info.begin <= info.end);
      next = info.end;
      FUZZ_CHECK(reader.find(info.name) == &info);
      if (!io::dtype_from_safetensors(info.dtype)) continue;
      const Tensor t = reader.read(info.name);
      FUZZ_CHECK(t.nbytes() == info.end - info.begin);
    }
    FUZZ_CHECK(8 + reader.header_bytes() + next == size);
  } catch (const Error&) {
  }
  return 0;
}
