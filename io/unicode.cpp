// Character classes and UTF-8 decoding for the GPT-2 pre-tokenizer.
//
// Classes: the Basic Multilingual Plane (where nearly all text lives) gets a 64 KiB table of one
// class byte per code point, built once from the generated ranges on first use (a function-local
// static, so the build is thread-safe); code points above U+FFFF are found by binary search in
// the ~840 ranges.
//
// UTF-8: the well-formed sequences of Unicode's Table 3-7 (no overlong forms, no surrogates,
// nothing past U+10FFFF). Anything else decodes one byte at a time as kInvalidCodePoint, so that
// arbitrary bytes still tokenize and decode back to themselves.
#include "io/unicode.h"

#include <algorithm>
#include <array>

namespace strata::io::unicode {
namespace {

std::array<CharClass, 0x10000> build_bmp_table() {
  std::array<CharClass, 0x10000> table;
  table.fill(CharClass::kOther);
  for (size_t i = 0; i < kNumClassRanges; ++i) {
    const CodePointRange& r = kClassRanges[i];
    for (uint32_t cp = r.first; cp <= r.last && cp < 0x10000; ++cp) table[cp] = r.cls;
  }
  return table;
}

bool is_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

CharClass char_class(uint32_t code_point) {
  if (code_point < 0x10000) {
    static const std::array<CharClass, 0x10000> kBmp = build_bmp_table();
    return kBmp[code_point];
  }
  if (code_point > 0x10FFFF) return CharClass::kOther;
  const CodePointRange* end = kClassRanges + kNumClassRanges;
  // The last range whose first code point is <= code_point.
  const CodePointRange* it =
      std::upper_bound(kClassRanges, end, code_point,
                       [](uint32_t cp, const CodePointRange& r) { return cp < r.first; });
  if (it == kClassRanges) return CharClass::kOther;
  --it;
  return code_point <= it->last ? it->cls : CharClass::kOther;
}

size_t decode_utf8(const unsigned char* p, size_t size, uint32_t* code_point) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  *code_point = kInvalidCodePoint;
  if (b0 < 0xC2 || b0 > 0xF4) return 1;  // continuation byte, overlong lead, or past U+10FFFF
  const size_t length = b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  if (size < length) return 1;
  for (size_t i = 1; i < length; ++i) {
    if (!is_continuation(p[i])) return 1;
  }
  // The second byte's narrower ranges (Table 3-7): no overlong 3- and 4-byte forms, no
  // surrogates, nothing past U+10FFFF.
  const unsigned char b1 = p[1];
  if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F) || (b0 == 0xF0 && b1 < 0x90) ||
      (b0 == 0xF4 && b1 > 0x8F)) {
    return 1;
  }
  uint32_t cp = b0 & (length == 2 ? 0x1F : length == 3 ? 0x0F : 0x07);
  for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  *code_point = cp;
  return length;
}

}  // namespace strata::io::unicode
