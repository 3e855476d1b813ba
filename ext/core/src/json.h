// ext/core/src/json.h: a strict, bounded JSON parser for bundle manifests (internal).
//
// Strict RFC 8259: no NaN/Infinity, no comments, no trailing commas, no
// duplicate object keys, no control characters in strings, the input must be
// valid UTF-8 and no \u escape may be a lone UTF-16 surrogate (a string is
// Unicode text). It accepts what leapp.bundle's reader (Python's json with
// these rules added) accepts, up to the bounds of leapp/bundle_format.h, so a
// hostile manifest cannot exhaust the stack or memory. Every step is
// O(n log n) or better in the input size (duplicate keys: one sort per
// object). Errors name the byte offset and the JSON path of the value
// ("ops[3].relocs[0]"). Integers (no fraction, no exponent) keep their exact
// value when it fits int64; larger ones are marked `int_overflow` so field
// checks can report them as out of range instead of silently wrapping.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leapp/bundle_format.h"

namespace leapp::detail {

constexpr int kJsonMaxDepth = kBundleMaxJsonDepth;
constexpr size_t kJsonMaxValues = size_t(kBundleMaxJsonValues);
constexpr size_t kJsonMaxIntDigits = 4300;  ///< Python's int() limit, so both readers reject the same literals

struct JsonValue {
  enum class Type : uint8_t { kNull, kBool, kInt, kFloat, kString, kArray, kObject };

  Type type = Type::kNull;
  bool boolean = false;
  bool int_overflow = false;  ///< kInt whose value does not fit int64
  int64_t integer = 0;
  double number = 0.0;
  std::string string;  ///< kString's text; for an int_overflow kInt, its decimal literal
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  ///< in document order, keys unique

  /// The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* find(std::string_view key) const;
  /// "object", "array", "string", "integer", "number", "boolean" or "null".
  const char* type_name() const;
};

/// Bounds of one document; the defaults are the bundle manifest's (docs/bundle-format.md).
struct JsonLimits {
  int max_depth = kJsonMaxDepth;        ///< nesting of arrays/objects, the top level being 1
  size_t max_values = kJsonMaxValues;   ///< values in the document, keys not counted
  const char* document = "docs/bundle-format.md";  ///< named in the error when a bound is exceeded
  bool refuse_nul = false;  ///< refuse \u0000 in strings and keys (a bundle's manifest and signature: names reach C APIs)
};

/// Parses `text` within `limits`; throws as below.
JsonValue parse_json(std::string_view text, const std::string& what, const JsonLimits& limits);

/// Parses `text`; throws std::invalid_argument("<what>: invalid JSON: <reason> at byte N[ in <path>]").
JsonValue parse_json(std::string_view text, const std::string& what);

/// True when `text` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF);
/// otherwise false and `bad_offset` is the first offending byte.
bool valid_utf8(std::string_view text, size_t& bad_offset);

/// `text` for an error message: control characters as \uXXXX, at most `limit`
/// bytes (cut at a character boundary, then "..."). Keeps messages printable
/// and whole (a NUL would end the text a C API sees).
std::string shown(std::string_view text, size_t limit = 120);

}  // namespace leapp::detail
