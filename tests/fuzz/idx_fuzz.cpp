// IDX arrays (io/idx.h): parse_idx on the bytes; through read_idx (a file) when they start with
// the gzip magic, which is how the reader tells compressed files apart. Property: an accepted
// array encodes back to exactly the bytes read (the format has one encoding and no trailing
// bytes are allowed).
#include "engine/check.h"
#include "fuzz/fuzz_util.h"
#include "io/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  const bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  try {
    io::IdxArray array =
        gzip ? io::read_idx(fuzz::scratch().write("in.idx.gz", fuzz::as_text(data, size)))
             : io::parse_idx(data, size, "fuzz.idx");
    FUZZ_CHECK(array.data.size() ==
               static_cast<size_t>(array.numel()) * io::idx_type_size(array.type));
    if (!gzip) {
      const std::vector<uint8_t> again = io::encode_idx(array);
      FUZZ_CHECK(again.size() == size && std::equal(again.begin(), again.end(), data));
    }
  } catch (const Error&) {
  }
  return 0;
}
