// ext/pipeline/src/initial_values.h: the export's initial_values.safetensors read and checked (internal).
//
// A pipeline with state (edges with `state: true`, docs/pipeline-format.md "State") names one safetensors file
// holding each state's initial value. The file is as untrusted as the folder, so it is parsed here, strictly and
// bounded, never by trusting a length before checking it: the sha256 pipeline.yaml records, an 8-byte header
// length at most 16 MiB and inside the file, a strict JSON header, exactly one entry per state edge (keyed
// "node/input"), each entry's dtype and shape the node input's, the data offsets in order, without gaps or
// overlap, ending at the end of the file. Python's leapp.load checks the same, with the same texts.
#pragma once

#include <string>
#include <vector>

#include "description.h"

namespace leapp::pipeline_detail {

/// One state: its edge, the node input it feeds (dtype, shape, metadata), and its initial value.
struct StateValue {
  std::string key;     ///< "node/input": the safetensors key and the name callers use
  size_t node = 0;     ///< index in Description::nodes
  std::string input;   ///< the node input the state feeds
  std::string output;  ///< the node output that updates it
  Spec spec;           ///< the node input's entry
  std::string bytes;   ///< the initial value, C order, spec's dtype and shape (sized before it is read)
};

/// initial_values.check_initial_values: `data` (the file's bytes, `file` naming it) checked against `states`
/// (their `bytes` sized to the node input's byte count), same order and texts; fills each state's `bytes`.
void check_initial_values(const std::string& data, const std::string& file, std::vector<StateValue>& states,
                          const std::vector<std::string>& node_names);

/// The states of `d` in state-edge order (none without state edges), each with its checked initial value;
/// throws leapp::PipelineError naming the file and the key.
std::vector<StateValue> read_initial_values(const Description& d);

}  // namespace leapp::pipeline_detail
