// ext/core/src/sha256.h: SHA-256 for bundle digests and blob hashes (internal).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace leapp::detail {

using Sha256Digest = std::array<uint8_t, 32>;

/// The SHA-256 of `size` bytes at `data` (`data` may be null when size is 0).
Sha256Digest sha256(const void* data, size_t size);

/// Lower-case hex of `size` bytes.
std::string to_hex(const uint8_t* bytes, size_t size);

}  // namespace leapp::detail
