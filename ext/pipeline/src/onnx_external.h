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
#include <vector>
#include <cstdint>

namespace leapp::pipeline_detail {

/// Called with (where in the model, location); it throws to stop the walk at a location it refuses.
using LocationVisitor = std::function<void(const std::string& place, const std::string& location)>;

/// Calls `visit` for every `location` entry of every tensor, and with "" for a tensor marked EXTERNAL
/// without one, as the walk finds it (nothing is collected): the graph, then functions (their nodes, then
/// their attributes' default values), then training graphs, in document order; within a graph its
/// initializers, sparse initializers, then its nodes' attributes (tensors, sparse tensors, subgraphs).
/// Throws std::invalid_argument for bytes that are not well-formed protobuf along that walk.
void onnx_external_locations(std::string_view model, const LocationVisitor& visit);

/// One leapp.warp WarpSegment node of a model's top-level graph and the initializer its last input names.
struct WarpSegmentNode {
  std::string name;       ///< the node's name
  std::string signature;  ///< its `signature` attribute (compact JSON with the bundle's digest)
  bool has_bundle = false;  ///< the last input names a uint8 initializer of the graph
  std::string raw;          ///< that initializer's raw_data when stored inline
  bool external = false;    ///< stored as external data: location, offset and length below
  std::string location;
  uint64_t offset = 0;
  int64_t length = -1;  ///< -1: to the end of the file
};

/// The WarpSegment nodes of the model's graph (not of subgraphs or functions: leapp writes them at the top), in
/// graph order. leapp/runtime/segment_check.py walks the same. Throws std::invalid_argument like the walk above.
std::vector<WarpSegmentNode> onnx_warp_segments(std::string_view model);

}  // namespace leapp::pipeline_detail
