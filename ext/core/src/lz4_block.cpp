// ext/core/src/lz4_block.cpp: an LZ4 block decoder for compressed bundle binaries (docs/bundle-format.md 1.1).
//
// Written for leapp from the LZ4 block format description (a block is a list of sequences: a token whose
// high nibble is a literal length and low nibble a match length - 4, 15 meaning "add the following bytes
// until one is not 255"; the literals; a 2-byte little-endian offset; the last sequence has literals only).
// Bundles come from users, so this decoder is strict: it applies the end-of-block rules of section 1.1 and
// the exact declared size, the same rules leapp/bundle/lz4_block.py applies, so both readers accept and
// reject the same files. Positions are u64 and every comparison is written so that it cannot overflow.
#include "lz4_block.h"

#include <cstring>

namespace leapp::detail {
namespace {

constexpr uint64_t kMinMatch = 4;
constexpr uint64_t kMatchStartLimit = 12;  // a match starts at least 12 bytes before the end of the output
constexpr uint64_t kLastLiterals = 5;      // and ends at least 5 bytes before it
constexpr uint64_t kMinTail = 8;           // input bytes after the literals of a sequence that is not the last

std::string num(uint64_t v) { return std::to_string(v); }

/// Adds the extension bytes of a length whose nibble was 15; false when they run past the end.
bool extend(const uint8_t* src, uint64_t n, uint64_t& ip, uint64_t& length) {
  for (;;) {
    if (ip >= n) return false;
    const uint8_t b = src[ip++];
    length += b;  // at most 255 per input byte and n <= 2^40 input bytes: no overflow
    if (b != 255) return true;
  }
}

}  // namespace

std::string lz4_block_decode(const uint8_t* src, uint64_t n, uint8_t* dst, uint64_t size) {
  if (n > 0 && src == nullptr) return "null block data";
  if (size > 0 && dst == nullptr) return "null output";
  if (size / kLz4MaxRatio > n || (size / kLz4MaxRatio == n && size % kLz4MaxRatio))
    return "declares " + num(size) + " decoded bytes, more than " + num(kLz4MaxRatio) + " x its " + num(n) +
           " bytes";
  uint64_t ip = 0, op = 0;
  for (;;) {
    if (ip >= n) return "no sequence token at byte " + num(ip) + " (the block is empty or ends after a match)";
    const uint8_t token = src[ip++];
    uint64_t literals = token >> 4;
    if (literals == 15 && !extend(src, n, ip, literals))
      return "the literal length's extension bytes run past the end of the block (at byte " + num(ip) + ")";
    if (literals > n - ip)
      return num(literals) + " literal bytes at byte " + num(ip) + " run past the end of the block (" + num(n) +
             " bytes)";
    if (literals > size - op)
      return num(literals) + " literal bytes at output byte " + num(op) + " exceed the declared size " + num(size);
    if (literals) std::memcpy(dst + op, src + ip, size_t(literals));
    ip += literals;
    op += literals;
    if (ip == n) {  // the last sequence: literals only
      if (token & 15) {
        static const char hex[] = "0123456789abcdef";
        return std::string("the last sequence's token 0x") + hex[token >> 4] + hex[token & 15] +
               " has a match length (it holds only literals)";
      }
      if (op != size) return "decodes to " + num(op) + " bytes, the manifest declares " + num(size);
      return "";
    }
    if (size < kMatchStartLimit || op > size - kMatchStartLimit)
      return "a match starts at output byte " + num(op) + ", within the last " + num(kMatchStartLimit) +
             " bytes of the declared " + num(size);
    if (n - ip < kMinTail)
      return "only " + num(n - ip) + " bytes follow the literals ending at byte " + num(ip) +
             "; a sequence that is not the last is followed by at least " + num(kMinTail);
    const uint64_t offset = uint64_t(src[ip]) | uint64_t(src[ip + 1]) << 8;
    if (offset == 0 || offset > op)
      return "match offset " + num(offset) + " at byte " + num(ip) + " is not in [1, " + num(op) +
             "] (the bytes decoded so far)";
    ip += 2;
    uint64_t match = token & 15;
    if (match == 15 && !extend(src, n, ip, match))
      return "the match length's extension bytes run past the end of the block (at byte " + num(ip) + ")";
    match += kMinMatch;
    // op <= size - 12 here, so size - op - 5 does not underflow
    if (match > size - op - kLastLiterals)
      return "a match of " + num(match) + " bytes at output byte " + num(op) + " ends within the last " +
             num(kLastLiterals) + " bytes of the declared " + num(size);
    uint8_t* out = dst + op;
    const uint8_t* from = out - offset;
    if (offset >= match) {
      std::memcpy(out, from, size_t(match));
    } else {  // overlapping: each byte may be one this match wrote (a repeated pattern)
      for (uint64_t i = 0; i < match; ++i) out[i] = from[i];
    }
    op += match;
  }
}

}  // namespace leapp::detail
