// ext/pipeline/src/schema.h: pipeline.schema.json applied to a parsed pipeline.json (internal).
//
// One schema for both readers: the build embeds leapp/pipeline_format/pipeline.schema.json.
// This interprets the keywords that schema uses ($ref, allOf, type, const, enum, pattern,
// minimum, maximum, minLength, minItems, required, properties, additionalProperties, items)
// in jsonschema's order (the schema's key order), and picks the error jsonschema's
// best_match picks, so the message is leapp.pipeline_format.reader's, word for word. Any
// other keyword in the schema is refused when the schema is loaded, so a schema change that
// this interpreter does not understand fails the build's tests instead of passing silently.
#pragma once

#include <string>

#include "json.h"

namespace leapp::pipeline_detail {

/// Validates `instance` against the embedded schema; returns "" or "<field>: <what>[ (and N more problems)]".
std::string schema_error(const leapp::detail::JsonValue& instance);

}  // namespace leapp::pipeline_detail
