// ext/pipeline/src/ort_runtime.h: ONNX Runtime loaded at run time, and where leapp's files are (internal).
//
// libonnxruntime is never linked: the pip wheel's library (or the one named) is dlopen'ed and its
// API table handed to ORT's C++ wrapper (ORT_API_MANUAL_INIT), so the runner builds without ORT's
// library and uses the ORT release the user's environment has (API >= ORT_API_VERSION of the headers).
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <string>

namespace leapp::pipeline_detail {

/// Loads ONNX Runtime once per process (`requested` or the search of docs/deploy.md); returns its path.
const std::string& load_onnxruntime(const std::string& requested);
/// The folder of leapp's package (the folder of libleapp_pipeline.so), "" when unknown.
std::string package_dir();
/// The file `name` in leapp's package folder, "" when the folder is unknown or has no such file.
std::string package_file(const std::string& name);
/// libleapp_warp_ort.so: `requested`, $LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY or the package's; "" when none exists.
std::string ort_op_library(const std::string& requested);
/// Python's text for an Ort::Exception: "Fail: [ONNXRuntimeError] : 1 : FAIL : ...".
std::string ort_error_text(const Ort::Exception& e);

}  // namespace leapp::pipeline_detail
