// ext/pipeline/src/ort_runtime.cpp: see ort_runtime.h.
#include "ort_runtime.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

#include "description.h"
#include "leapp/pipeline.h"

namespace fs = std::filesystem;

namespace leapp::pipeline_detail {
namespace {

/// The candidates, in order: the requested path, $LEAPP_ONNXRUNTIME_LIBRARY, the onnxruntime wheel next to
/// leapp's package (site-packages/onnxruntime/capi/libonnxruntime.so.*), then the loader's own search.
std::vector<std::string> candidates(const std::string& requested) {
  if (!requested.empty()) return {requested};
  if (const char* env = std::getenv("LEAPP_ONNXRUNTIME_LIBRARY"); env && *env) return {env};
  std::vector<std::string> out;
  std::string package = package_dir();
  if (!package.empty()) {
    fs::path capi = fs::path(package).parent_path() / "onnxruntime" / "capi";
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(capi, ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("libonnxruntime.so", 0) == 0) out.push_back(entry.path().string());
    }
  }
  out.push_back("libonnxruntime.so.1");
  out.push_back("libonnxruntime.so");
  return out;
}

}  // namespace

std::string package_dir() {
  if (const char* env = std::getenv("LEAPP_PACKAGE_DIR"); env && *env) return env;
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&package_dir), &info) || !info.dli_fname) return "";
  std::error_code ec;
  fs::path self = fs::canonical(info.dli_fname, ec);
  return ec ? "" : self.parent_path().string();
}

const std::string& load_onnxruntime(const std::string& requested) {
  static std::mutex mutex;
  static std::string loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (!loaded.empty()) return loaded;
  std::string tried;
  for (const std::string& path : candidates(requested)) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      tried += "\n  " + path + ": " + dlerror();
      continue;
    }
    using GetApiBase = const OrtApiBase* (*)();
    auto get_base = reinterpret_cast<GetApiBase>(dlsym(handle, "OrtGetApiBase"));
    const OrtApi* api = get_base ? get_base()->GetApi(ORT_API_VERSION) : nullptr;
    if (!api) {
      tried += "\n  " + path + ": " +
               (get_base ? "ONNX Runtime " + std::string(get_base()->GetVersionString()) + " does not offer API " +
                               std::to_string(ORT_API_VERSION)
                         : std::string("no OrtGetApiBase"));
      continue;  // the handle stays open: unloading a half-initialised ORT is not worth the risk
    }
    Ort::InitApi(api);
    loaded = path;
    return loaded;
  }
  throw PipelineError("cannot load ONNX Runtime (pip install onnxruntime next to leapp, or set "
                      "LEAPP_ONNXRUNTIME_LIBRARY to a libonnxruntime.so offering API " +
                      std::to_string(ORT_API_VERSION) + "); tried:" + tried);
}

std::string ort_op_library(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (const char* env = std::getenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY"); env && *env) return env;
  return package_file("libleapp_warp_ort.so");
}

std::string package_file(const std::string& name) {
  std::string package = package_dir();
  if (package.empty()) return "";
  std::string path = (fs::path(package) / name).string();
  return is_regular_file(path) ? path : "";
}

std::string ort_error_text(const Ort::Exception& e) {
  static const char* kinds[][2] = {{"OK", "OK"},
                                   {"Fail", "FAIL"},
                                   {"InvalidArgument", "INVALID_ARGUMENT"},
                                   {"NoSuchFile", "NO_SUCHFILE"},
                                   {"NoModel", "NO_MODEL"},
                                   {"EngineError", "ENGINE_ERROR"},
                                   {"RuntimeException", "RUNTIME_EXCEPTION"},
                                   {"InvalidProtobuf", "INVALID_PROTOBUF"},
                                   {"ModelLoaded", "MODEL_LOADED"},
                                   {"NotImplemented", "NOT_IMPLEMENTED"},
                                   {"InvalidGraph", "INVALID_GRAPH"},
                                   {"EPFail", "EP_FAIL"}};
  int code = int(e.GetOrtErrorCode());
  if (code < 0 || code > 11) code = 1;
  return std::string(kinds[code][0]) + ": [ONNXRuntimeError] : " + std::to_string(code) + " : " + kinds[code][1] +
         " : " + e.what();
}

}  // namespace leapp::pipeline_detail
