// ext/pipeline/src/pyrepr.cpp: see pyrepr.h. Mirrors CPython 3.10-3.13's str/float repr and reprlib.
#include "pyrepr.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace leapp::pipeline_detail {

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

void encode_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6)), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12)), out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18)), out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F)), out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

constexpr size_t kMaxString = 60, kMaxOther = 60, kMaxLong = 40, kMaxList = 4, kMaxDict = 4;
constexpr int kMaxLevel = 2;

/// Python's str.isprintable() for the code points a description holds in practice: C0/C1
/// controls, DEL, the line/paragraph separators and the BOM are escaped, everything else shown.
bool printable(uint32_t cp) {
  return !(cp < 0x20 || (cp >= 0x7F && cp < 0xA0) || cp == 0xAD || cp == 0x2028 || cp == 0x2029 ||
           cp == 0xFEFF || (cp >= 0xD800 && cp <= 0xDFFF));
}

std::string repr_points(const std::vector<uint32_t>& cps) {
  bool single = std::find(cps.begin(), cps.end(), uint32_t('\'')) != cps.end();
  bool dbl = std::find(cps.begin(), cps.end(), uint32_t('"')) != cps.end();
  char quote = single && !dbl ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (uint32_t cp : cps) {
    if (cp == uint32_t(quote) || cp == '\\') {
      out += '\\', out += char(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (printable(cp)) {
      encode_utf8(cp, out);
    } else {
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    }
  }
  out += quote;
  return out;
}

/// s[:i] + '...' + s[len(s)-j:] as reprlib shortens a repr longer than `limit` (code points).
std::string shorten(const std::string& s, size_t limit) {
  std::vector<uint32_t> cps = decode_utf8(s);
  if (cps.size() <= limit) return s;
  size_t i = (limit - 3) / 2, j = limit - 3 - i;
  std::string out;
  for (size_t k = 0; k < i; ++k) encode_utf8(cps[k], out);
  out += "...";
  for (size_t k = cps.size() - j; k < cps.size(); ++k) encode_utf8(cps[k], out);
  return out;
}


std::string repr_at(const JsonValue& v, bool short_form, int level) {
  using T = JsonValue::Type;
  switch (v.type) {
    case T::kNull: return "None";
    case T::kBool: return v.boolean ? "True" : "False";
    case T::kInt: {
      std::string s = str_number(v);
      return short_form ? shorten(s, kMaxLong) : s;
    }
    case T::kFloat: {
      std::string s = repr_float(v.number);
      return short_form ? shorten(s, kMaxOther) : s;
    }
    case T::kString: {
      if (!short_form) return repr_str(v.string);
      std::vector<uint32_t> cps = decode_utf8(v.string);
      std::vector<uint32_t> head(cps.begin(), cps.begin() + std::min(cps.size(), kMaxString));
      std::string s = repr_points(head);
      if (decode_utf8(s).size() <= kMaxString) return s;
      size_t i = (kMaxString - 3) / 2, j = kMaxString - 3 - i;
      std::vector<uint32_t> cut(cps.begin(), cps.begin() + i);
      cut.insert(cut.end(), cps.end() - j, cps.end());
      std::vector<uint32_t> r = decode_utf8(repr_points(cut));
      std::string out;
      for (size_t k = 0; k < i; ++k) encode_utf8(r[k], out);
      out += "...";
      for (size_t k = r.size() - j; k < r.size(); ++k) encode_utf8(r[k], out);
      return out;
    }
    case T::kArray: {
      if (short_form && level <= 0 && !v.array.empty()) return "[...]";
      std::string out = "[";
      size_t n = short_form ? std::min(v.array.size(), kMaxList) : v.array.size();
      for (size_t i = 0; i < n; ++i) out += (i ? ", " : "") + repr_at(v.array[i], short_form, level - 1);
      if (n < v.array.size()) out += ", ...";
      return out + "]";
    }
    case T::kObject: {
      if (v.object.empty()) return "{}";
      if (short_form && level <= 0) return "{...}";
      std::vector<const std::pair<std::string, JsonValue>*> members;
      for (const auto& kv : v.object) members.push_back(&kv);
      if (short_form)  // reprlib sorts the keys (code point order: UTF-8 byte order is the same)
        std::sort(members.begin(), members.end(), [](auto* a, auto* b) { return a->first < b->first; });
      size_t n = short_form ? std::min(members.size(), kMaxDict) : members.size();
      std::string out = "{";
      for (size_t i = 0; i < n; ++i) {
        JsonValue key;
        key.type = T::kString;
        key.string = members[i]->first;
        out += (i ? ", " : "") + repr_at(key, short_form, level - 1) + ": " +
               repr_at(members[i]->second, short_form, level - 1);
      }
      if (n < members.size()) out += ", ...";
      return out + "}";
    }
  }
  return "?";
}

}  // namespace

std::string repr_float(double v) {
  if (v != v) return "nan";
  if (v == 1.0 / 0.0) return "inf";
  if (v == -1.0 / 0.0) return "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);  // shortest round trip
  std::string sci(buf, r.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp < -4 || exp >= 16) {  // repr uses exponent notation outside [1e-4, 1e16)
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  } else {
    size_t point = size_t(exp) + 1;
    if (digits.size() <= point)
      out = digits + std::string(point - digits.size(), '0') + ".0";
    else
      out = digits.substr(0, point) + "." + digits.substr(point);
  }
  return (neg ? "-" : "") + out;
}

size_t code_points(std::string_view s) { return decode_utf8(s).size(); }

std::string repr_str(std::string_view s) { return repr_points(decode_utf8(s)); }

std::string repr(const JsonValue& value, bool short_form) { return repr_at(value, short_form, kMaxLevel); }

std::string repr_names(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + repr_str(names[i]);
  return out + "]";
}

std::string short_repr_str(std::string_view s) {
  // reprlib reads at most the first and last 60 code points of a longer string: keep only those, so a
  // 1 MB name costs what a short one does
  auto lead = [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; };
  size_t head = 0, tail = s.size();
  for (size_t n = 0; head < s.size() && n <= kMaxString; ++n)
    do ++head; while (head < s.size() && !lead(s[head]));
  for (size_t n = 0; tail > 0 && n <= kMaxString; ++n)
    do --tail; while (tail > 0 && !lead(s[tail]));
  JsonValue v;
  v.type = JsonValue::Type::kString;
  v.string = head < tail ? std::string(s.substr(0, head)) + std::string(s.substr(tail)) : std::string(s);
  return repr(v, true);
}

std::string str_number(const JsonValue& v) {
  if (v.type == JsonValue::Type::kFloat) return repr_float(v.number);
  if (v.int_overflow) return v.string;
  return std::to_string(v.integer);
}

std::string describe(const JsonValue& v) {
  using T = JsonValue::Type;
  const char* kind = "";
  switch (v.type) {
    case T::kNull: return "null";
    case T::kObject: kind = "a mapping"; break;
    case T::kArray: kind = "a list"; break;
    case T::kString: kind = "a string"; break;
    case T::kBool: kind = "a boolean"; break;
    case T::kInt: kind = "an integer"; break;
    case T::kFloat: kind = "a float"; break;
  }
  return std::string(kind) + " " + repr(v, true);
}

}  // namespace leapp::pipeline_detail
