// ext/core/src/json.cpp: the strict, bounded manifest JSON parser (see json.h).
#include "json.h"

#include <algorithm>
#include <charconv>
#include <numeric>
#include <stdexcept>

namespace leapp::detail {

const JsonValue* JsonValue::find(std::string_view key) const {
  if (type != Type::kObject) return nullptr;
  for (const auto& kv : object)
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const char* JsonValue::type_name() const {
  switch (type) {
    case Type::kNull: return "null";
    case Type::kBool: return "boolean";
    case Type::kInt: return "integer";
    case Type::kFloat: return "number";
    case Type::kString: return "string";
    case Type::kArray: return "array";
    case Type::kObject: return "object";
  }
  return "?";
}

bool valid_utf8(std::string_view text, size_t& bad_offset) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  size_t n = text.size(), i = 0;
  while (i < n) {
    unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      bad_offset = i;
      return false;
    }
    if (n - i < len) {
      bad_offset = i;
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      unsigned cc = s[i + k];
      if ((cc & 0xC0) != 0x80) {
        bad_offset = i;
        return false;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      bad_offset = i;
      return false;
    }
    i += len;
  }
  return true;
}

std::string shown(std::string_view text, size_t limit) {
  std::string out;
  size_t i = 0;
  for (; i < text.size() && out.size() < limit; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  if (i == text.size()) return out;
  // Cut at a character boundary (never inside a UTF-8 sequence).
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) {
    --i;
    out.pop_back();
  }
  return out + "...";
}

namespace {

/// The first member (in document order) whose key equals an earlier member's,
/// or `members.size()` when all keys differ. O(k log k) for k members.
size_t first_duplicate_key(const std::vector<std::pair<std::string, JsonValue>>& members) {
  const size_t n = members.size();
  if (n < 2) return n;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return members[a].first < members[b].first; });
  // Equal keys are adjacent, each group in document order: every member after
  // the first of its group repeats a key; the earliest of those is the answer.
  size_t first = n;
  for (size_t i = 1; i < n; ++i)
    if (members[order[i]].first == members[order[i - 1]].first) first = std::min(first, order[i]);
  return first;
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& what, const JsonLimits& limits)
      : s_(text), what_(what), limits_(limits) {}

  JsonValue parse_document() {
    JsonValue v;
    skip_ws();
    parse_value(v, 0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { fail_in(why, path()); }

  /// `where` is a JSON path ("ops[3].relocs[0]"), "a key of <path>", or empty for the top level.
  [[noreturn]] void fail_in(const std::string& why, const std::string& where) const {
    throw std::invalid_argument(what_ + ": invalid JSON: " + why + " at byte " + std::to_string(pos_) +
                                (where.empty() ? std::string() : " in " + where));
  }

  /// The path of the value being parsed, built only for an error message.
  std::string path() const {
    std::string out;
    for (const Step& step : path_) {
      if (step.key != nullptr)
        out += (out.empty() ? "" : ".") + shown(*step.key, 80);
      else
        out += "[" + std::to_string(step.index) + "]";
    }
    return out;
  }

  std::string key_of_path() const {
    const std::string p = path();
    return "a key of " + (p.empty() ? std::string("the top-level object") : p);
  }

  void skip_ws() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r')
        ++pos_;
      else
        break;
    }
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("invalid literal");
    pos_ += lit.size();
  }

  void count_value() {
    if (++values_ > limits_.max_values)
      fail("more than " + std::to_string(limits_.max_values) + " values (the limit of " + limits_.document + ")");
  }

  void parse_value(JsonValue& v, int depth) {
    count_value();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    char c = s_[pos_];
    switch (c) {
      case '{': return parse_object(v, depth + 1);
      case '[': return parse_array(v, depth + 1);
      case '"':
        v.type = JsonValue::Type::kString;
        return parse_string(v.string, false);
      case 't':
        expect_literal("true");
        v.type = JsonValue::Type::kBool;
        v.boolean = true;
        return;
      case 'f':
        expect_literal("false");
        v.type = JsonValue::Type::kBool;
        v.boolean = false;
        return;
      case 'n':
        expect_literal("null");
        v.type = JsonValue::Type::kNull;
        return;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(v);
        fail(std::string("unexpected character '") + (c >= 0x20 && c < 0x7f ? std::string(1, c) : "?") +
             "'");
    }
  }

  void check_depth(int depth) {
    if (depth > limits_.max_depth) fail("nesting deeper than " + std::to_string(limits_.max_depth) + " levels");
  }

  void parse_object(JsonValue& v, int depth) {
    check_depth(depth);
    v.type = JsonValue::Type::kObject;
    ++pos_;  // '{'
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return;
    }
    std::vector<size_t> key_pos;  // for the duplicate-key message
    for (;;) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
      key_pos.push_back(pos_);
      std::string key;
      parse_string(key, true);
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':'");
      ++pos_;
      skip_ws();
      v.object.emplace_back(std::move(key), JsonValue{});
      // v.object is not resized while its member's value is parsed, so the key stays put.
      path_.push_back({&v.object.back().first, 0});
      parse_value(v.object.back().second, depth);
      path_.pop_back();
      skip_ws();
      if (pos_ >= s_.size()) fail("unexpected end of input in an object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        break;
      }
      fail("expected ',' or '}'");
    }
    const size_t dup = first_duplicate_key(v.object);
    if (dup < v.object.size()) {
      pos_ = key_pos[dup];
      fail("duplicate key \"" + shown(v.object[dup].first) + "\"");
    }
  }

  void parse_array(JsonValue& v, int depth) {
    check_depth(depth);
    v.type = JsonValue::Type::kArray;
    ++pos_;  // '['
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      path_.push_back({nullptr, v.array.size()});
      v.array.emplace_back();
      parse_value(v.array.back(), depth);
      path_.pop_back();
      skip_ws();
      if (pos_ >= s_.size()) fail("unexpected end of input in an array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        return;
      }
      fail("expected ',' or ']'");
    }
  }

  unsigned parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      u <<= 4;
      if (c >= '0' && c <= '9')
        u |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f')
        u |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        u |= unsigned(c - 'A' + 10);
      else
        fail("invalid \\u escape");
    }
    return u;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // The whole text was UTF-8-validated before parsing, so raw bytes >= 0x80
  // are copied through as they are. `is_key`: the string is an object key (for messages).
  void parse_string(std::string& out, bool is_key) {
    ++pos_;  // '"'
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return;
      }
      if (c < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += char(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          // A valid surrogate pair combines; a lone surrogate is refused: it is
          // no character, and the string could not be UTF-8 (nor a Python str
          // that encodes) anywhere downstream.
          const size_t escape = pos_ - 2;
          uint32_t cp = parse_hex4();
          bool lone = cp >= 0xDC00 && cp <= 0xDFFF;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            lone = true;
            if (s_.size() - pos_ >= 6 && s_[pos_] == '\\' && s_[pos_ + 1] == 'u') {
              size_t save = pos_;
              pos_ += 2;
              uint32_t lo = parse_hex4();
              if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                lone = false;
              } else {
                pos_ = save;
              }
            }
          }
          if (lone) {
            pos_ = escape;
            fail_in("\\u escape " + std::string(s_.substr(escape, 6)) +
                        " is a lone UTF-16 surrogate (not a character; a pair is \\ud800-\\udbff then "
                        "\\udc00-\\udfff)",
                    is_key ? key_of_path() : path());
          }
          if (cp == 0 && limits_.refuse_nul) {
            pos_ = escape;
            fail_in("\\u0000 is a NUL character, which no string here may hold (a name ends at it in C)",
                    is_key ? key_of_path() : path());
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; fail("invalid escape");
      }
    }
  }

  /// The power of ten of a float literal's leading digit (1.5e3 -> 3, 0.002 -> -3); a literal of zeros -> -1.
  static long long decimal_exponent(const char* first, const char* last) {
    const char* p = first + (*first == '-');
    long long lead = 0;
    bool found = false;
    long long int_digits = 0;
    for (; p < last && *p >= '0' && *p <= '9'; ++p) {
      if (found || *p != '0') {
        found = true;
        ++int_digits;
      }
    }
    if (found) lead = int_digits - 1;
    if (p < last && *p == '.') {
      long long k = 0;
      for (++p; p < last && *p >= '0' && *p <= '9'; ++p, ++k)
        if (!found && *p != '0') {
          found = true;
          lead = -(k + 1);
        }
    }
    if (!found) return -1;
    long long e = 0;
    bool negative = false;
    if (p < last && (*p == 'e' || *p == 'E')) {
      ++p;
      if (p < last && (*p == '+' || *p == '-')) negative = *p++ == '-';
      for (; p < last && *p >= '0' && *p <= '9'; ++p) e = std::min<long long>(e * 10 + (*p - '0'), 1000000000LL);
    }
    return lead + (negative ? -e : e);
  }

  void parse_number(JsonValue& v) {
    size_t start = pos_;
    bool is_float = false;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size()) fail("truncated number");
    if (s_[pos_] == '0') {
      ++pos_;
    } else if (s_[pos_] >= '1' && s_[pos_] <= '9') {
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    } else {
      fail("invalid number");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      is_float = true;
      ++pos_;
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("invalid number fraction");
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      is_float = true;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') fail("invalid number exponent");
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    }
    const char* first = s_.data() + start;
    const char* last = s_.data() + pos_;
    if (is_float) {
      v.type = JsonValue::Type::kFloat;
      auto r = std::from_chars(first, last, v.number);
      if (r.ec == std::errc::result_out_of_range) {
        // from_chars leaves the value unchanged both ways; Python's float() gives inf above the range and
        // (-)0.0 below it. An infinite value is refused (no JSON number is infinite), an underflow is 0.
        if (decimal_exponent(first, last) >= 0)
          fail("number " + std::string(first, last).substr(0, 40) + " is out of range (not a finite double)");
        v.number = *first == '-' ? -0.0 : 0.0;
      } else if (r.ec != std::errc() || r.ptr != last) {
        fail("invalid number");
      }
      return;
    }
    v.type = JsonValue::Type::kInt;
    if (pos_ - start - (*first == '-' ? 1 : 0) > kJsonMaxIntDigits)
      fail("integer literal of more than " + std::to_string(kJsonMaxIntDigits) + " digits");
    auto r = std::from_chars(first, last, v.integer);
    if (r.ec == std::errc::result_out_of_range) {
      v.int_overflow = true;
      v.integer = 0;
      v.string.assign(first, last);  // the literal, for messages that show the value
    } else if (r.ec != std::errc() || r.ptr != last) {
      fail("invalid integer");
    }
  }

  /// One level of the JSON path: an object member (`key`) or an array element (`index`).
  struct Step {
    const std::string* key;
    size_t index;
  };

  std::string_view s_;
  const std::string& what_;
  JsonLimits limits_;
  size_t pos_ = 0;
  size_t values_ = 0;
  std::vector<Step> path_;
};

}  // namespace

JsonValue parse_json(std::string_view text, const std::string& what) {
  return parse_json(text, what, JsonLimits{});
}

JsonValue parse_json(std::string_view text, const std::string& what, const JsonLimits& limits) {
  size_t bad = 0;
  if (!valid_utf8(text, bad))
    throw std::invalid_argument(what + ": not valid UTF-8 at byte " + std::to_string(bad));
  return Parser(text, what, limits).parse_document();
}

}  // namespace leapp::detail
