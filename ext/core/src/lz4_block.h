// ext/core/src/lz4_block.h: the decoder of LZ4-compressed bundle binaries (docs/bundle-format.md section 1.1).
#pragma once

#include <cstdint>
#include <string>

namespace leapp::detail {

/// Decodes the LZ4 block of `src_size` bytes at `src` into exactly `dst_size` bytes at `dst` (which has room
/// for `dst_size` bytes). Returns "" when the block follows every rule of section 1.1, else why it does not
/// (e.g. "match offset 0 at byte 17 is not in [1, 12] (the bytes decoded so far)"); the caller names the
/// bundle and the blob. Every length and offset is checked before it is used: no read outside `src`, no
/// write outside `dst`, whatever the bytes.
std::string lz4_block_decode(const uint8_t* src, uint64_t src_size, uint8_t* dst, uint64_t dst_size);

/// The rule of section 1.1 that bounds the allocation: `decoded_bytes <= 255 * blob length`.
constexpr uint64_t kLz4MaxRatio = 255;

}  // namespace leapp::detail
