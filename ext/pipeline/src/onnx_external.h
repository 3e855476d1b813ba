// ext/pipeline/src/onnx_external.h: the external-data locations an ONNX model names, read from its bytes (internal).
//
// ONNX Runtime reads an external tensor's file relative to the model and keeps it inside the model's
// folder only from 1.24 on; the runner opens models with whatever ORT the system has. This walk, over
// the protobuf wire format of the fields that can hold tensors, lets the runner require every location
// to be one of the node's sha256-checked files first. Python's twin (same walk, order and texts):
// leapp/runtime/artifact_safety.py::external_locations.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace leapp::pipeline_detail {

/// (where in the model, location) for every `location` entry of every tensor, and "" for a tensor marked
/// EXTERNAL without one: the graph, then functions, then training graphs, in document order; within a
/// graph its initializers, sparse initializers, then its nodes' attributes (tensors, sparse tensors,
/// subgraphs). Throws std::invalid_argument for bytes that are not well-formed protobuf along that walk.
std::vector<std::pair<std::string, std::string>> onnx_external_locations(std::string_view model);

}  // namespace leapp::pipeline_detail
