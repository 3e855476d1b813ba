// ext/pipeline/src/yaml_text.h: the canonical pipeline.yaml text of a description (internal).
//
// The C++ runner reads pipeline.json and has no YAML parser. pipeline.yaml is the
// canonical rendering of the same description (leapp/pipeline_format/yaml_text.py
// defines the rules and writes it), so this reader renders the twin it parsed and
// compares bytes: a folder whose two files say different things is refused here
// as in leapp.load, with one text.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"

namespace leapp::pipeline_detail {

/// One line of the rendering (no newline) and the field path it starts, as reader.field_path shows it
/// ("nodes[0].name"; "" for the empty rest after the final newline).
struct YamlLine {
  std::string text, path;
};

/// The lines of the canonical text of `description` (a JSON object) less its top-level member `skip` (pipeline.json's
/// digest of pipeline.yaml, which pipeline.yaml does not hold), then the empty rest.
std::vector<YamlLine> yaml_lines(const leapp::detail::JsonValue& description, std::string_view skip = {});

/// The first line where `text` differs from the rendering of `description` (1-based number and the
/// rendered line), or nothing when they are equal. Past the last rendered line: the empty line, path "".
struct YamlDifference {
  size_t line = 0;
  YamlLine expected;
};
std::optional<YamlDifference> first_difference(const leapp::detail::JsonValue& description, std::string_view text,
                                              std::string_view skip = {});

}  // namespace leapp::pipeline_detail
