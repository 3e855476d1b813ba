// ext/core/src/json.h: a strict, bounded JSON parser for bundle manifests (internal).
//
// Strict RFC 8259: no NaN/Infinity, no comments, no trailing commas, no
// duplicate object keys, no control characters in strings, and the input must
// be valid UTF-8. It accepts what leapp.bundle's reader (Python's json with
// duplicate keys and constants refused) accepts, up to the bounds below. Bounded: nesting depth and the
// number of values are capped so a hostile manifest cannot exhaust the stack
// or memory. Integers (no fraction, no exponent) keep their exact value when
// it fits int64; larger ones are marked `int_overflow` so field checks can
// report them as out of range instead of silently wrapping.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace leapp::detail {

constexpr int kJsonMaxDepth = 512;
constexpr size_t kJsonMaxValues = size_t(1) << 20;
constexpr size_t kJsonMaxIntDigits = 4300;  ///< Python's int() limit, so both readers reject the same literals

struct JsonValue {
  enum class Type : uint8_t { kNull, kBool, kInt, kFloat, kString, kArray, kObject };

  Type type = Type::kNull;
  bool boolean = false;
  bool int_overflow = false;  ///< kInt whose value does not fit int64
  int64_t integer = 0;
  double number = 0.0;
  std::string string;
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  ///< in document order, keys unique

  /// The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* find(std::string_view key) const;
  /// "object", "array", "string", "integer", "number", "boolean" or "null".
  const char* type_name() const;
};

/// Parses `text`; throws std::invalid_argument("<what>: <reason> at byte N").
JsonValue parse_json(std::string_view text, const std::string& what);

/// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF);
/// otherwise false and `bad_offset` is the first offending byte.
bool valid_utf8(std::string_view text, size_t& bad_offset);

}  // namespace leapp::detail
