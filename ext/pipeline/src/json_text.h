// ext/pipeline/src/json_text.h: a parsed JSON value written back as text (internal).
//
// TensorInfo::metadata hands the user's metadata to C++ callers as JSON text, so that
// leapp's parser types stay private. The text is what Python's
// json.dumps(value, ensure_ascii=False, separators=(",", ":")) writes for the same value.
#pragma once

#include <string>

#include "json.h"

namespace leapp::pipeline_detail {

/// Compact JSON text of `value`: keys in document order, numbers as Python writes them, UTF-8 kept.
std::string json_text(const leapp::detail::JsonValue& value);

}  // namespace leapp::pipeline_detail
