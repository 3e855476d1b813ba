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

/// SHA-256 over data given in pieces (a file read in chunks, never whole).
class Sha256Stream {
 public:
  Sha256Stream();
  void update(const void* data, size_t size);
  Sha256Digest digest();  ///< once; the stream is then spent

 private:
  uint32_t state_[8];
  uint8_t block_[64];
  size_t used_ = 0;
  uint64_t total_ = 0;
};

/// Lower-case hex of `size` bytes.
std::string to_hex(const uint8_t* bytes, size_t size);

}  // namespace leapp::detail
