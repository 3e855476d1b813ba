// ext/core/src/cuda_driver.cpp: dlopen("libcuda.so.1") + cuGetProcAddress.
//
// Each entry point is requested with the CUDA version its signature belongs
// to (e.g. cuMemAlloc at 3020 is the 64-bit cuMemAlloc_v2), the way Warp's
// cuda_util.cpp does; dlsym on the plain names would give the legacy ABIs.
#include "leapp/cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace leapp {
namespace {

using GetProcAddressFn = CUresult (*)(const char*, void**, int, unsigned long long, int*);

struct Loaded {
  CudaDriver table;
  std::string error;  // non-empty when the driver is unavailable
};

template <typename Fn>
bool resolve(GetProcAddressFn gpa, const char* name, int version, Fn& out, std::string& error) {
  void* p = nullptr;
  CUresult r = gpa(name, &p, version, 0 /* CU_GET_PROC_ADDRESS_DEFAULT */, nullptr);
  if (r != CUDA_SUCCESS || p == nullptr) {
    error = std::string("the CUDA driver has no entry point ") + name + " (version " +
            std::to_string(version) + "), error " + std::to_string(r) + "; the driver is too old";
    return false;
  }
  out = reinterpret_cast<Fn>(p);
  return true;
}

Loaded load() {
  Loaded L;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    L.error = std::string("no CUDA driver: dlopen(\"libcuda.so.1\") failed: ") + (why ? why : "unknown");
    return L;
  }
  auto gpa = reinterpret_cast<GetProcAddressFn>(dlsym(lib, "cuGetProcAddress_v2"));
  if (gpa == nullptr) gpa = reinterpret_cast<GetProcAddressFn>(dlsym(lib, "cuGetProcAddress"));
  if (gpa == nullptr) {
    L.error = "the CUDA driver in libcuda.so.1 has no cuGetProcAddress; CUDA 12.0 or newer is required";
    return L;
  }
  CudaDriver& d = L.table;
  std::string& e = L.error;
  bool ok = resolve(gpa, "cuGetErrorName", 6000, d.cuGetErrorName, e) &&
            resolve(gpa, "cuGetErrorString", 6000, d.cuGetErrorString, e) &&
            resolve(gpa, "cuInit", 2000, d.cuInit, e) &&
            resolve(gpa, "cuDriverGetVersion", 2020, d.cuDriverGetVersion, e) &&
            resolve(gpa, "cuDeviceGetCount", 2000, d.cuDeviceGetCount, e) &&
            resolve(gpa, "cuDeviceGet", 2000, d.cuDeviceGet, e) &&
            resolve(gpa, "cuDeviceGetName", 2000, d.cuDeviceGetName, e) &&
            resolve(gpa, "cuDeviceGetAttribute", 2000, d.cuDeviceGetAttribute, e) &&
            resolve(gpa, "cuDevicePrimaryCtxRetain", 7000, d.cuDevicePrimaryCtxRetain, e) &&
            resolve(gpa, "cuDevicePrimaryCtxRelease", 11000, d.cuDevicePrimaryCtxRelease, e) &&
            resolve(gpa, "cuCtxGetCurrent", 4000, d.cuCtxGetCurrent, e) &&
            resolve(gpa, "cuCtxSetCurrent", 4000, d.cuCtxSetCurrent, e) &&
            resolve(gpa, "cuCtxGetDevice", 2000, d.cuCtxGetDevice, e) &&
            resolve(gpa, "cuCtxSynchronize", 2000, d.cuCtxSynchronize, e) &&
            resolve(gpa, "cuStreamGetCtx", 9020, d.cuStreamGetCtx, e) &&
            resolve(gpa, "cuStreamSynchronize", 2000, d.cuStreamSynchronize, e) &&
            resolve(gpa, "cuStreamIsCapturing", 10000, d.cuStreamIsCapturing, e) &&
            resolve(gpa, "cuModuleLoadDataEx", 2010, d.cuModuleLoadDataEx, e) &&
            resolve(gpa, "cuModuleUnload", 2000, d.cuModuleUnload, e) &&
            resolve(gpa, "cuModuleGetFunction", 2000, d.cuModuleGetFunction, e) &&
            resolve(gpa, "cuFuncSetAttribute", 9000, d.cuFuncSetAttribute, e) &&
            resolve(gpa, "cuLaunchKernel", 4000, d.cuLaunchKernel, e) &&
            resolve(gpa, "cuMemAlloc", 3020, d.cuMemAlloc, e) &&
            resolve(gpa, "cuMemFree", 3020, d.cuMemFree, e) &&
            resolve(gpa, "cuMemAllocHost", 3020, d.cuMemAllocHost, e) &&
            resolve(gpa, "cuMemFreeHost", 2000, d.cuMemFreeHost, e) &&
            resolve(gpa, "cuMemsetD8Async", 3020, d.cuMemsetD8Async, e) &&
            resolve(gpa, "cuMemcpyAsync", 4000, d.cuMemcpyAsync, e) &&
            resolve(gpa, "cuMemcpyDtoDAsync", 3020, d.cuMemcpyDtoDAsync, e) &&
            resolve(gpa, "cuMemcpyHtoDAsync", 3020, d.cuMemcpyHtoDAsync, e) &&
            resolve(gpa, "cuMemcpyDtoHAsync", 3020, d.cuMemcpyDtoHAsync, e) &&
            resolve(gpa, "cuPointerGetAttribute", 4000, d.cuPointerGetAttribute, e) &&
            resolve(gpa, "cuStreamCreate", 2000, d.cuStreamCreate, e) &&
            resolve(gpa, "cuStreamDestroy", 4000, d.cuStreamDestroy, e) &&
            resolve(gpa, "cuThreadExchangeStreamCaptureMode", 10010, d.cuThreadExchangeStreamCaptureMode, e) &&
            resolve(gpa, "cuFuncGetAttribute", 2020, d.cuFuncGetAttribute, e);
  if (!ok) return L;
  // Optional entry points: a driver without them replays op by op.
  std::string optional_error;
  bool graphs = resolve(gpa, "cuStreamBeginCapture", 10010, d.cuStreamBeginCapture, optional_error) &&
                resolve(gpa, "cuStreamEndCapture", 10000, d.cuStreamEndCapture, optional_error) &&
                resolve(gpa, "cuGraphInstantiateWithFlags", 11040, d.cuGraphInstantiateWithFlags, optional_error) &&
                resolve(gpa, "cuGraphExecUpdate", 12000, d.cuGraphExecUpdate, optional_error) &&
                resolve(gpa, "cuGraphLaunch", 10000, d.cuGraphLaunch, optional_error) &&
                resolve(gpa, "cuGraphDestroy", 10000, d.cuGraphDestroy, optional_error) &&
                resolve(gpa, "cuGraphExecDestroy", 10000, d.cuGraphExecDestroy, optional_error);
  if (!graphs) {
    d.cuStreamBeginCapture = nullptr;  // all or none: has_graphs() is false
  }
  if (!(resolve(gpa, "cuGraphGetNodes", 10000, d.cuGraphGetNodes, optional_error) &&
        resolve(gpa, "cuGraphNodeGetType", 10000, d.cuGraphNodeGetType, optional_error)))
    d.cuGraphGetNodes = nullptr;  // both or none
  if (!resolve(gpa, "cuGraphChildGraphNodeGetGraph", 10000, d.cuGraphChildGraphNodeGetGraph, optional_error))
    d.cuGraphChildGraphNodeGetGraph = nullptr;
  bool capture_scratch =
      resolve(gpa, "cuStreamGetCaptureInfo", 11030, d.cuStreamGetCaptureInfo, optional_error) &&
      resolve(gpa, "cuUserObjectCreate", 11030, d.cuUserObjectCreate, optional_error) &&
      resolve(gpa, "cuUserObjectRelease", 11030, d.cuUserObjectRelease, optional_error) &&
      resolve(gpa, "cuGraphRetainUserObject", 11030, d.cuGraphRetainUserObject, optional_error);
  if (!capture_scratch) {
    d.cuStreamGetCaptureInfo = nullptr;  // all or none: has_capture_scratch() is false
  }
  CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    L.error = "cuInit(0) failed: " + cu_error_text(r) + " (no usable GPU, or the driver is not loaded)";
    return L;
  }
  r = d.cuDriverGetVersion(&d.version);
  if (r != CUDA_SUCCESS) {
    L.error = "cuDriverGetVersion failed: " + cu_error_text(r);
    return L;
  }
  return L;
}

const Loaded& loaded() {
  static std::once_flag once;
  static Loaded* L = nullptr;  // leaked on purpose: drivers must outlive static destructors
  std::call_once(once, [] { L = new Loaded(load()); });
  return *L;
}

}  // namespace

const CudaDriver& driver() {
  const Loaded& L = loaded();
  if (!L.error.empty()) throw DriverUnavailable(L.error);
  return L.table;
}

bool count_graph_host_nodes(CUgraph graph, size_t& hosts) {
  const CudaDriver& d = driver();
  if (!d.cuGraphGetNodes) return false;
  size_t count = 0;
  if (d.cuGraphGetNodes(graph, nullptr, &count) != CUDA_SUCCESS) return false;
  std::vector<CUgraphNode> nodes(count);  // after a capture, never in a step
  if (count > 0 && d.cuGraphGetNodes(graph, nodes.data(), &count) != CUDA_SUCCESS) return false;
  for (size_t i = 0; i < count; ++i) {
    int type = -1;
    if (d.cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS) return false;
    if (type == CU_GRAPH_NODE_TYPE_HOST) {
      ++hosts;
    } else if (type == CU_GRAPH_NODE_TYPE_GRAPH) {  // a child graph (a replay launched into an outer capture)
      CUgraph child = nullptr;
      if (!d.cuGraphChildGraphNodeGetGraph || d.cuGraphChildGraphNodeGetGraph(nodes[i], &child) != CUDA_SUCCESS ||
          !count_graph_host_nodes(child, hosts))
        return false;
    }
  }
  return true;
}

std::string cu_error_text(CUresult code) {
  const Loaded& L = loaded();
  const char* name = nullptr;
  const char* text = nullptr;
  if (L.table.cuGetErrorName) L.table.cuGetErrorName(code, &name);
  if (L.table.cuGetErrorString) L.table.cuGetErrorString(code, &text);
  std::string s = name ? name : ("CUDA error " + std::to_string(code));
  if (text) s += std::string(" (") + text + ")";
  return s;
}

void check_cu(CUresult code, const char* what, const char* file, int line) {
  if (code == CUDA_SUCCESS) return;
  throw CudaError(code, "CUDA driver call failed: " + cu_error_text(code) + " [code " +
                            std::to_string(code) + "] in " + what + " at " + file + ":" +
                            std::to_string(line));
}

int assumed_driver_version(int actual) {
  const char* env = std::getenv("LEAPP_ASSUME_DRIVER");
  if (env == nullptr || *env == '\0') return actual;
  const std::string text(env);
  int major = 0, minor = 0, version = 0;
  size_t dot = text.find('.');
  auto digits = [](const std::string& s) {
    return !s.empty() && s.size() <= 5 && s.find_first_not_of("0123456789") == std::string::npos;
  };
  if (dot != std::string::npos && digits(text.substr(0, dot)) && digits(text.substr(dot + 1))) {
    major = std::stoi(text.substr(0, dot));
    minor = std::stoi(text.substr(dot + 1));
    version = major * 1000 + minor * 10;
  } else if (digits(text)) {
    version = std::stoi(text);
  }
  if (version < 10000 || version >= 100000 || (dot != std::string::npos && minor > 9))
    throw std::invalid_argument("LEAPP_ASSUME_DRIVER='" + text.substr(0, 32) +
                                "' is not a CUDA version such as 12.2 or 12020");
  if (version > actual)
    throw std::invalid_argument("LEAPP_ASSUME_DRIVER=" + text + " names a driver newer than this machine's (CUDA " +
                                std::to_string(actual / 1000) + "." + std::to_string(actual % 1000 / 10) +
                                "): only an older driver's choice can be reproduced here");
  return version;
}

DriverStatus driver_status() {
  DriverStatus s;
  const Loaded& L = loaded();
  if (!L.error.empty()) {
    s.error = L.error;
    return s;
  }
  const CudaDriver& d = L.table;
  s.version = d.version;
  try {
    const int assumed = assumed_driver_version(d.version);
    if (assumed != d.version) s.assumed_version = assumed;
  } catch (const std::invalid_argument& e) {
    s.assumed_error = e.what();
  }
  int count = 0;
  CUresult r = d.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) {
    s.error = "cuDeviceGetCount failed: " + cu_error_text(r);
    return s;
  }
  for (int i = 0; i < count; ++i) {
    DeviceInfo info;
    info.ordinal = i;
    CUdevice dev = 0;
    if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    char name[256] = {0};
    d.cuDeviceGetName(name, sizeof(name) - 1, dev);
    info.name = name;
    d.cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    d.cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    s.devices.push_back(info);
  }
  s.available = count > 0;
  if (count == 0) s.error = "the CUDA driver reports no devices";
  return s;
}

}  // namespace leapp
