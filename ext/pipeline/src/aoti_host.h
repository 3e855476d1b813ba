// ext/pipeline/src/aoti_host.h: PT2 nodes run from their AOTInductor packages through the plugin (internal).
//
// The plugin libleapp_pipeline_aoti.so (ext/pipeline/aoti) links libtorch; this side only dlopen's it,
// so libleapp_pipeline.so builds and runs without libtorch (docs/deploy.md).
#pragma once

#include <memory>
#include <string>

#include "aoti_plugin.h"
#include "description.h"
#include "step_graph.h"

namespace leapp::pipeline_detail {

/// A loaded package: the plugin's model, closed when the last copy goes.
struct AotiModel {
  const LeappAotiPlugin* plugin = nullptr;
  std::shared_ptr<void> model;
  std::string package;  ///< the checked package's path in the export folder
};

/// The plugin: `requested`, $LEAPP_PIPELINE_AOTI_PLUGIN or libleapp_pipeline_aoti.so in leapp's package; "" when none exists.
std::string aoti_plugin_path(const std::string& requested);
/// libleapp_warp_torch.so: `requested`, $LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY or the package's; "" when none exists.
std::string torch_op_library(const std::string& requested);

/// Opens node `index` (a PT2 node with an `aoti` entry) of `d`: the package's containment and sha256 are checked
/// and exactly the checked bytes are loaded (from a private copy), through the plugin. device_index < 0: host
/// buffers. Throws PipelineError naming the node, the file and the field.
AotiModel open_aoti_node(const Description& d, size_t index, const std::string& plugin_path,
                         const std::string& op_library, int device_index);

/// Whether the torch op library `op_library` (already loaded by open_aoti_node) replays Warp segments on the CPU:
/// leapp's does not (only the tests' fake-driver build does). True when it cannot tell (the op was registered from
/// another copy): the run then reports what torch says.
bool op_library_replays_on_cpu(const std::string& op_library);

/// Torch's private pool for the PT2 nodes' allocations while a step is captured (aoti_plugin.h), on device
/// `device_index`; null when the plugin's torch has no CUDA.
std::unique_ptr<CaptureResources> aoti_graph_pool(const LeappAotiPlugin* plugin, int device_index);

/// The checks of open_aoti_node that need no plugin (leapp-run --check): containment and sha256.
void verify_aoti_package(const Description& d, size_t index);

}  // namespace leapp::pipeline_detail
