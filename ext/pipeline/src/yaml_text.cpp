// ext/pipeline/src/yaml_text.cpp: see yaml_text.h; each rule is leapp/pipeline_format/yaml_text.py's.
#include "yaml_text.h"

#include <cstdio>

#include "pyrepr.h"

namespace leapp::pipeline_detail {
namespace {

using leapp::detail::JsonValue;
using T = JsonValue::Type;

bool plain(std::string_view s) {
  auto letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (s.empty() || !letter(s[0])) return false;
  for (char c : s)
    if (!letter(c) && !(c >= '0' && c <= '9') && c != '.' && c != '/' && c != '-') return false;
  std::string lower(s);
  for (char& c : lower) c = char(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (const char* word : {"yes", "no", "true", "false", "on", "off", "null"})  // YAML 1.1 booleans and null
    if (lower == word) return false;
  return true;
}

bool escaped(uint32_t code) {
  return code < 0x20 || (code >= 0x7f && code < 0xa0) || code == 0x2028 || code == 0x2029 || code == 0xfeff ||
         code == 0xfffe || code == 0xffff;
}

/// `s` is valid UTF-8 (the JSON parser checked it).
std::string string_text(std::string_view s) {
  if (plain(s)) return std::string(s);
  std::string out = "\"";
  for (uint32_t code : decode_utf8(s)) {
    if (code == '"' || code == '\\') {
      out += '\\';
      out += char(code);
    } else if (escaped(code)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(code));
      out += buf;
    } else {
      encode_utf8(code, out);
    }
  }
  return out + "\"";
}

std::string float_text(double v) {
  std::string s = repr_float(v);  // finite: the JSON parser refuses the rest
  const size_t e = s.find('e');
  if (e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
  return s;
}

std::string scalar(const JsonValue& v) {
  switch (v.type) {
    case T::kNull: return "null";
    case T::kBool: return v.boolean ? "true" : "false";
    case T::kInt: return str_number(v);
    case T::kFloat: return float_text(v.number);
    case T::kString: return string_text(v.string);
    default: return "";
  }
}

/// The value's one-line form, or false when it takes a block.
bool inline_text(const JsonValue& v, std::string& out) {
  if (v.type == T::kObject) {
    out = "{}";
    return v.object.empty();
  }
  if (v.type != T::kArray) {
    out = scalar(v);
    return true;
  }
  out = "[";
  for (size_t i = 0; i < v.array.size(); ++i) {
    const T t = v.array[i].type;
    if (t != T::kNull && t != T::kBool && t != T::kInt && t != T::kFloat) return false;
    out += (i ? ", " : "") + scalar(v.array[i]);
  }
  out += "]";
  return true;
}

void block(const JsonValue& v, size_t indent, const std::string& path, std::vector<YamlLine>& out,
           std::string_view skip = {}) {
  const std::string pad(indent, ' ');
  std::string one;
  if (v.type == T::kObject) {
    for (const auto& [key, item] : v.object) {
      if (!skip.empty() && key == skip) continue;
      const std::string at = path.empty() ? key : path + "." + key;
      const std::string head = pad + string_text(key) + ":";
      if (inline_text(item, one)) {
        out.push_back({head + " " + one, at});
      } else {
        out.push_back({head, at});
        block(item, indent + 2, at, out);
      }
    }
    return;
  }
  for (size_t i = 0; i < v.array.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    if (inline_text(v.array[i], one)) {
      out.push_back({pad + "- " + one, at});
      continue;
    }
    const size_t start = out.size();
    block(v.array[i], indent + 2, at, out);
    out[start].text = pad + "- " + out[start].text.substr(indent + 2);
  }
}

}  // namespace

std::vector<YamlLine> yaml_lines(const JsonValue& description, std::string_view skip) {
  std::vector<YamlLine> out;
  block(description, 0, "", out, skip);
  if (out.empty()) out.push_back({"{}", ""});
  out.push_back({"", ""});
  return out;
}

std::optional<YamlDifference> first_difference(const JsonValue& description, std::string_view text,
                                              std::string_view skip) {
  const std::vector<YamlLine> lines = yaml_lines(description, skip);
  size_t start = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t end = text.find('\n', start);
    const bool found = start <= text.size();
    const std::string_view line =
        found ? text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start) : "";
    if (!found || line != lines[i].text) return YamlDifference{i + 1, lines[i]};
    start = end == std::string_view::npos ? text.size() + 1 : end + 1;
  }
  if (start <= text.size()) return YamlDifference{lines.size() + 1, {"", ""}};
  return std::nullopt;
}

}  // namespace leapp::pipeline_detail
