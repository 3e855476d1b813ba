// ext/pipeline/src/schema.cpp: see schema.h.
#include "schema.h"

#include <regex>
#include <stdexcept>
#include <variant>
#include <vector>

#include "pipeline_schema_text.h"  // generated: kPipelineSchemaJson, the bytes of pipeline.schema.json
#include "pyrepr.h"

namespace leapp::pipeline_detail {
namespace {

using leapp::detail::JsonValue;
using T = JsonValue::Type;
using PathPart = std::variant<std::string, size_t>;

struct Error {
  std::vector<PathPart> path;
  std::string keyword;
  const JsonValue* schema;    ///< the (sub)schema holding the keyword
  const JsonValue* instance;  ///< the value that failed
};

const JsonValue& root_schema() {
  static const JsonValue schema = [] {
    JsonValue s = leapp::detail::parse_json(kPipelineSchemaJson, "pipeline.schema.json");
    return s;
  }();
  return schema;
}

bool is_type(const JsonValue& v, const std::string& type) {
  if (type == "object") return v.type == T::kObject;
  if (type == "array") return v.type == T::kArray;
  if (type == "string") return v.type == T::kString;
  if (type == "integer") return v.type == T::kInt;  // leapp's checker: a YAML integer, not 4.0, not true
  if (type == "number") return v.type == T::kInt || v.type == T::kFloat;
  if (type == "boolean") return v.type == T::kBool;
  if (type == "null") return v.type == T::kNull;
  throw std::logic_error("pipeline.schema.json: unknown type " + type);
}

/// The "type" keyword: one type name, or a list of them (any may match).
bool has_type(const JsonValue& v, const JsonValue& type) {
  if (type.type != T::kArray) return is_type(v, type.string);
  for (const JsonValue& option : type.array)
    if (is_type(v, option.string)) return true;
  return false;
}

/// jsonschema's equal(): bools are not numbers, containers compare member-wise.
bool equal(const JsonValue& a, const JsonValue& b) {
  if (a.type != b.type) {
    bool numbers = (a.type == T::kInt || a.type == T::kFloat) && (b.type == T::kInt || b.type == T::kFloat);
    if (!numbers) return false;
    double x = a.type == T::kInt ? double(a.integer) : a.number, y = b.type == T::kInt ? double(b.integer) : b.number;
    return !a.int_overflow && !b.int_overflow && x == y;
  }
  switch (a.type) {
    case T::kNull: return true;
    case T::kBool: return a.boolean == b.boolean;
    case T::kInt: return a.int_overflow == b.int_overflow && a.integer == b.integer && a.string == b.string;
    case T::kFloat: return a.number == b.number;
    case T::kString: return a.string == b.string;
    case T::kArray:
      if (a.array.size() != b.array.size()) return false;
      for (size_t i = 0; i < a.array.size(); ++i)
        if (!equal(a.array[i], b.array[i])) return false;
      return true;
    case T::kObject:
      if (a.object.size() != b.object.size()) return false;
      for (const auto& kv : a.object) {
        const JsonValue* other = b.find(kv.first);
        if (!other || !equal(kv.second, *other)) return false;
      }
      return true;
  }
  return false;
}

/// Python's re.search(pattern, s) for the anchored patterns of the schema: '$' also matches
/// before one final newline, as in Python.
bool pattern_matches(const std::string& pattern, const std::string& s) {
  std::regex re(pattern, std::regex::ECMAScript);
  if (std::regex_search(s, re)) return true;
  return !s.empty() && s.back() == '\n' && !pattern.empty() && pattern.back() == '$' &&
         std::regex_search(s.substr(0, s.size() - 1), re);
}

/// Compares an int or float JSON value with a bound; int_overflow values are beyond int64 in their sign's direction.
int compare_number(const JsonValue& v, const JsonValue& bound) {
  long double b = bound.type == T::kInt ? (long double)bound.integer : (long double)bound.number;
  long double x;
  if (v.type == T::kInt && v.int_overflow)
    x = v.string[0] == '-' ? -1e30L : 1e30L;
  else
    x = v.type == T::kInt ? (long double)v.integer : (long double)v.number;
  return x < b ? -1 : x > b ? 1 : 0;
}

const JsonValue& resolve_ref(const std::string& ref) {
  const std::string prefix = "#/$defs/";
  const JsonValue* defs = root_schema().find("$defs");
  const JsonValue* target = ref.rfind(prefix, 0) == 0 && defs ? defs->find(ref.substr(prefix.size())) : nullptr;
  if (!target) throw std::logic_error("pipeline.schema.json: unresolvable $ref " + ref);
  return *target;
}

void collect(const JsonValue& instance, const JsonValue& schema, std::vector<PathPart>& path, std::vector<Error>& out) {
  for (const auto& [keyword, value] : schema.object) {
    auto fail = [&] { out.push_back(Error{path, keyword, &schema, &instance}); };
    if (keyword == "$ref") {
      collect(instance, resolve_ref(value.string), path, out);
    } else if (keyword == "allOf") {
      for (const JsonValue& sub : value.array) collect(instance, sub, path, out);
    } else if (keyword == "type") {
      if (!has_type(instance, value)) fail();
    } else if (keyword == "const") {
      if (!equal(instance, value)) fail();
    } else if (keyword == "enum") {
      bool found = false;
      for (const JsonValue& option : value.array) found = found || equal(instance, option);
      if (!found) fail();
    } else if (keyword == "pattern") {
      if (instance.type == T::kString && !pattern_matches(value.string, instance.string)) fail();
    } else if (keyword == "minimum" || keyword == "maximum") {
      if (instance.type == T::kInt || instance.type == T::kFloat) {
        int c = compare_number(instance, value);
        if (keyword == "minimum" ? c < 0 : c > 0) fail();
      }
    } else if (keyword == "minLength") {
      if (instance.type == T::kString && code_points(instance.string) < size_t(value.integer)) fail();
    } else if (keyword == "minItems") {
      if (instance.type == T::kArray && instance.array.size() < size_t(value.integer)) fail();
    } else if (keyword == "required") {
      if (instance.type == T::kObject)
        for (const JsonValue& key : value.array)
          if (!instance.find(key.string)) fail();
    } else if (keyword == "properties") {
      if (instance.type != T::kObject) continue;
      for (const auto& [name, sub] : value.object) {
        const JsonValue* member = instance.find(name);
        if (!member) continue;
        path.emplace_back(name);
        collect(*member, sub, path, out);
        path.pop_back();
      }
    } else if (keyword == "additionalProperties") {
      if (instance.type != T::kObject) continue;
      const JsonValue* props = schema.find("properties");
      for (const auto& [name, member] : instance.object) {
        if (props && props->find(name)) continue;
        path.emplace_back(name);
        collect(member, value, path, out);
        path.pop_back();
      }
    } else if (keyword == "items") {
      if (instance.type != T::kArray) continue;
      for (size_t i = 0; i < instance.array.size(); ++i) {
        path.emplace_back(i);
        collect(instance.array[i], value, path, out);
        path.pop_back();
      }
    } else if (keyword == "$schema" || keyword == "$id" || keyword == "title" || keyword == "description" ||
               keyword == "$defs") {
      continue;
    } else {
      throw std::logic_error("pipeline.schema.json: keyword '" + keyword + "' is not understood by the C++ reader");
    }
  }
}

bool matches_type(const Error& e) {
  const JsonValue* type = e.schema->find("type");
  return type && has_type(*e.instance, *type);
}

/// jsonschema.exceptions.relevance: (-len(path), path, not weak, strong, not matches_type); true when a < b.
bool less_relevant(const Error& a, const Error& b) {
  if (a.path.size() != b.path.size()) return a.path.size() > b.path.size();
  if (a.path != b.path) return a.path < b.path;
  return matches_type(a) && !matches_type(b);
}

std::string field_path(const std::vector<PathPart>& parts) {
  std::string out;
  for (const PathPart& part : parts) {
    if (const size_t* index = std::get_if<size_t>(&part))
      out += "[" + std::to_string(*index) + "]";
    else
      out += (out.empty() ? "" : ".") + std::get<std::string>(part);
  }
  return out.empty() ? "(top level)" : out;
}

std::string type_words(const std::string& type) {
  if (type == "object") return "a mapping";
  if (type == "array") return "a list";
  if (type == "string") return "a string";
  if (type == "integer") return "an integer";
  if (type == "boolean") return "true or false";
  if (type == "number") return "a number";
  return type;
}

/// leapp.pipeline_format.reader._error_text.
std::string error_text(const Error& e) {
  const JsonValue& expected = *e.schema->find(e.keyword);
  const JsonValue& value = *e.instance;
  if (e.keyword == "required") {
    for (const JsonValue& key : expected.array)
      if (!value.find(key.string)) {
        std::vector<PathPart> path = e.path;
        path.emplace_back(key.string);
        return field_path(path) + ": missing";
      }
  }
  std::string field = field_path(e.path) + ": ";
  if (e.keyword == "type") {
    std::string words;  // reader._error_text: "a string or a number", for a list of types
    if (expected.type != T::kArray) words = type_words(expected.string);
    for (size_t i = 0; expected.type == T::kArray && i < expected.array.size(); ++i)
      words += (i ? " or " : "") + type_words(expected.array[i].string);
    return field + "expected " + words + ", got " + describe(value);
  }
  if (e.keyword == "const") return field + "must be " + repr(expected, false) + ", got " + describe(value);
  if (e.keyword == "enum") {
    std::string options;
    for (size_t i = 0; i < expected.array.size(); ++i)
      options += (i ? ", " : "") + (expected.array[i].type == T::kString ? expected.array[i].string
                                                                        : repr(expected.array[i], false));
    return field + repr(value, true) + " is not one of " + options;
  }
  if (e.keyword == "pattern") {
    const JsonValue* description = e.schema->find("description");
    std::string what = description && description->type == T::kString && !description->string.empty()
                           ? description->string
                           : "matching " + expected.string;
    return field + repr(value, true) + " is not " + what;
  }
  if (e.keyword == "minimum") return field + str_number(value) + " is below " + str_number(expected);
  if (e.keyword == "maximum") return field + str_number(value) + " is above " + str_number(expected);
  if (e.keyword == "minLength" || e.keyword == "minItems") return field + "must not be empty";
  return field + e.keyword + " failed";
}

}  // namespace

std::string schema_error(const JsonValue& instance) {
  std::vector<Error> errors;
  std::vector<PathPart> path;
  collect(instance, root_schema(), path, errors);
  if (errors.empty()) return "";
  const Error* best = &errors[0];
  for (const Error& e : errors)
    if (less_relevant(*best, e)) best = &e;
  std::string text = error_text(*best);
  if (errors.size() > 1)
    text += " (and " + std::to_string(errors.size() - 1) + " more problem" + (errors.size() > 2 ? "s" : "") + ")";
  return text;
}

}  // namespace leapp::pipeline_detail
