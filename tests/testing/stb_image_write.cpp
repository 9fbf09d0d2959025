// stb_image_write (libstb-dev), compiled once for the tests that write image files
// (tests/testing/image_files.h). Its JPEG writer shifts negative ints left (bit buffers in
// stbiw__jpg_writeBits), undefined in C++17 and reported by UBSan; the sanitized build compiles
// this file alone without that one check (tests/CMakeLists.txt), so that the rest of the tests
// keep it.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop
