// ext/pipeline/src/json_text.cpp: see json_text.h.
#include "json_text.h"

#include <cstdio>

#include "pyrepr.h"

namespace leapp::pipeline_detail {
namespace {

using T = leapp::detail::JsonValue::Type;

/// Python json's string escapes with ensure_ascii=False: quote, backslash and C0 controls only.
void write_string(const std::string& s, std::string& out) {
  out += '"';
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void write(const leapp::detail::JsonValue& v, std::string& out) {
  switch (v.type) {
    case T::kNull: out += "null"; break;
    case T::kBool: out += v.boolean ? "true" : "false"; break;
    case T::kInt:
    case T::kFloat: out += str_number(v); break;
    case T::kString: write_string(v.string, out); break;
    case T::kArray:
      out += '[';
      for (size_t i = 0; i < v.array.size(); ++i) {
        if (i) out += ',';
        write(v.array[i], out);
      }
      out += ']';
      break;
    case T::kObject:
      out += '{';
      for (size_t i = 0; i < v.object.size(); ++i) {
        if (i) out += ',';
        write_string(v.object[i].first, out);
        out += ':';
        write(v.object[i].second, out);
      }
      out += '}';
      break;
  }
}

}  // namespace

std::string json_text(const leapp::detail::JsonValue& value) {
  std::string out;
  write(value, out);
  return out;
}

}  // namespace leapp::pipeline_detail
