// ext/pipeline/src/onnx_external.h: the external-data locations an ONNX model names, read from its bytes (internal).
//
// ONNX Runtime reads an external tensor's file relative to the model and keeps it inside the model's
// folder only from 1.24 on; the runner opens models with whatever ORT the system has. This walk, over
// the protobuf wire format of the fields that can hold tensors, lets the runner require every location
// to be one of the node's sha256-checked files first. Python's twin (same walk, order and texts):
// leapp/runtime/artifact_safety.py::external_locations.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace leapp::pipeline_detail {

/// Called with (where in the model, location); it throws to stop the walk at a location it refuses.
using LocationVisitor = std::function<void(const std::string& place, const std::string& location)>;

/// Calls `visit` for every `location` entry of every tensor, and with "" for a tensor marked EXTERNAL
/// without one, as the walk finds it (nothing is collected): the graph, then functions (their nodes, then
/// their attributes' default values), then training graphs, in document order; within a graph its
/// initializers, sparse initializers, then its nodes' attributes (tensors, sparse tensors, subgraphs).
/// Throws std::invalid_argument for bytes that are not well-formed protobuf along that walk.
void onnx_external_locations(std::string_view model, const LocationVisitor& visit);

}  // namespace leapp::pipeline_detail
