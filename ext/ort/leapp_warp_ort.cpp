// ext/ort/leapp_warp_ort.cpp: ONNX Runtime custom-op library, domain "leapp.warp".
//
// The domain object is static: ORT keeps a pointer to it in every session
// created with these options, so it must outlive them all.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <mutex>

namespace {
constexpr const char* kDomain = "leapp.warp";
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // The running ORT is older than the headers we were built with.
    return nullptr;  // cannot even create a status without an API table
  }
  Ort::InitApi(api);
  try {
    static Ort::CustomOpDomain domain{kDomain};
    static std::once_flag once;
    std::call_once(once, [] { /* ops are added to `domain` here */ });
    Ort::UnownedSessionOptions session_options(options);
    session_options.Add(domain);
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}
