// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), as used by iSCSI, ext4 and
// many storage formats: checksums of checkpoint tensors.
//
//   uint32_t c = crc32c(data, n);                     // one buffer
//   uint32_t c = crc32c_extend(crc32c(a, na), b, nb); // == crc32c of a followed by b
//
// Uses the SSE 4.2 crc32 instruction when the CPU has it, else slicing-by-8 tables; both give
// the same values (crc32c("123456789") == 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t size);
inline uint32_t crc32c(const void* data, size_t size) { return crc32c_extend(0, data, size); }
// The portable version (for tests of the hardware one).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t size);

}  // namespace strata
