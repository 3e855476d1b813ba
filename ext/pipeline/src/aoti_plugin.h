// ext/pipeline/src/aoti_plugin.h: the C interface between libleapp_pipeline.so and its AOTInductor plugin
// libleapp_pipeline_aoti.so (ext/pipeline/aoti), internal.
//
// libleapp_pipeline.so needs no libtorch: it dlopen's the plugin when an export has a PT2 node with a
// recorded AOTInductor package (docs/deploy.md). The plugin links libtorch and runs the package through
// torch::inductor::AOTIModelPackageLoader. A C interface (no C++ types cross it) keeps the two free of
// each other's ABI choices (libtorch's _GLIBCXX_USE_CXX11_ABI, exceptions): errors come back as text.
#pragma once

#include <stddef.h>
#include <stdint.h>

#define LEAPP_AOTI_PLUGIN_ABI 2u
#define LEAPP_AOTI_PLUGIN_SYMBOL "leapp_pipeline_aoti_plugin"

extern "C" {

/// One node input or output as the wiring declares it.
struct LeappAotiTensor {
  const char* dtype;     ///< torch's dtype name ("float32")
  const int64_t* shape;  ///< `rank` static dimensions
  size_t rank;
  void* data;  ///< inputs: the caller's or pipeline's buffer (wrapped, not copied). outputs: set by run: the
               ///< model's own contiguous output buffer of that dtype and shape, valid until the next run or close
};

struct LeappAotiPlugin {
  uint32_t abi;               ///< LEAPP_AOTI_PLUGIN_ABI
  const char* torch_version;  ///< the libtorch the plugin was built against ("2.13.0")
  /// Registers leapp::warp_segment (dlopen of `op_library` unless the op is registered already; "" loads
  /// nothing), then loads `package`. device_index < 0: a CPU package on host buffers, else a CUDA package on
  /// device `device_index`. Returns the model, or null with the reason in `error`.
  void* (*open)(const char* package, const char* op_library, int device_index, char* error, size_t error_size);
  /// The package's device ("cpu", "cuda"), from its metadata.
  const char* (*device)(void* model);
  /// Runs the model on `stream` (a CUstream; null: the legacy default stream; ignored on the CPU). The outputs'
  /// dtype and shape are checked against `outputs`. Returns 0, or nonzero with the reason in `error`.
  int (*run)(void* model, const LeappAotiTensor* inputs, size_t n_inputs, LeappAotiTensor* outputs, size_t n_outputs,
             void* stream, char* error, size_t error_size);
  void (*close)(void* model);
  /// A step captured as one CUDA graph (docs/deploy.md, "A step as one CUDA graph"): while it is captured,
  /// torch's allocations on `stream` go to a private pool of their own (torch.cuda.graph's), so the memory the
  /// packages use inside the graph stays the graph's. begin_graph_pool: before the capture begins; returns the
  /// pool, or null with the reason in `error`. end_graph_pool: the capture ended (or failed). release_graph_pool:
  /// the graph is gone, its memory returns to torch. All three null when the plugin's torch has no CUDA.
  void* (*begin_graph_pool)(int device_index, void* stream, char* error, size_t error_size);
  void (*end_graph_pool)(void* pool);
  void (*release_graph_pool)(void* pool);
};

typedef const LeappAotiPlugin* (*LeappAotiPluginEntry)(void);

}  // extern "C"
