// ext/pipeline/src/pyrepr.h: Python's repr() and reprlib's short repr of JSON values (internal).
//
// The C++ reader must refuse a bad pipeline description with the same text as
// leapp.pipeline_format (Python), whose messages show values with repr() and with
// a reprlib.Repr (maxstring=maxother=60, maxlist=maxdict=4, maxlevel=2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"

namespace leapp::pipeline_detail {

using leapp::detail::JsonValue;

/// The code points of valid UTF-8 text (the JSON parser has checked it).
std::vector<uint32_t> decode_utf8(std::string_view s);
/// Appends code point `cp` to `out` as UTF-8.
void encode_utf8(uint32_t cp, std::string& out);
/// repr(s) of a Python str holding the UTF-8 text `s`.
std::string repr_str(std::string_view s);
/// reprlib's short repr of the str `s` (leapp.pipeline_format.short_repr): a hostile name, bounded.
std::string short_repr_str(std::string_view s);
/// repr(value) (full), or reprlib's short form when `short_form`.
std::string repr(const JsonValue& value, bool short_form);
/// repr(list_of_str): ['a', 'b'].
std::string repr_names(const std::vector<std::string>& names);
/// repr(v) of a Python float: the shortest text that reads back to `v`.
std::string repr_float(double v);
/// str(value) for an int or float JSON value (as an f-string shows it).
std::string str_number(const JsonValue& value);
/// leapp.pipeline_format.reader._describe: "a string 'x'", "an integer 5", "null", ...
std::string describe(const JsonValue& value);
/// Number of Unicode code points in UTF-8 text (Python's len()).
size_t code_points(std::string_view s);

}  // namespace leapp::pipeline_detail
