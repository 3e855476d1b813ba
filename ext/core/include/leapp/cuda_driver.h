// ext/core/include/leapp/cuda_driver.h: the CUDA driver API, loaded at run time.
//
// leapp never links against CUDA: libcuda.so.1 is dlopen'ed on first use and
// every entry point comes from cuGetProcAddress with the ABI version its
// pointer type below was written for. The few driver types we need are
// declared here so the build needs no CUDA headers either. On a machine with
// no driver everything still builds and imports; driver() throws
// leapp::DriverUnavailable with the loader's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// The opaque handle structs are declared at global scope, exactly as cuda.h
// declares them: a translation unit that also sees cuda.h (torch's CUDA
// headers include it) then names the same types, and functions taking a
// CUstream keep one mangled name across leapp's libraries.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
struct CUuserObject_st;

namespace leapp {

// --- driver types (ABI-identical to cuda.h) --------------------------------
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = ::CUctx_st*;
using CUmodule = ::CUmod_st*;
using CUfunction = ::CUfunc_st*;
using CUstream = ::CUstream_st*;
using CUevent = ::CUevent_st*;
using CUgraph = ::CUgraph_st*;
using CUgraphExec = ::CUgraphExec_st*;
using CUgraphNode = ::CUgraphNode_st*;
using CUuserObject = ::CUuserObject_st*;
using CUhostFn = void (*)(void*);

/// cuGraphExecUpdate's report (CUDA 12: CUgraphExecUpdateResultInfo).
struct CUgraphExecUpdateResultInfo {
  int result;  ///< CUgraphExecUpdateResult: 0 success, else why the update was refused
  CUgraphNode errorNode;
  CUgraphNode errorFromNode;
};

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_NO_BINARY_FOR_GPU = 209;
constexpr CUresult CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222;
constexpr int CU_GRAPH_NODE_TYPE_HOST = 3;
constexpr int CU_GRAPH_NODE_TYPE_GRAPH = 4;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr int CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_POINTER_ATTRIBUTE_CONTEXT = 1;
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;
constexpr int CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr int CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr unsigned CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1;
constexpr unsigned CU_GRAPH_USER_OBJECT_MOVE = 1;
constexpr int CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr int CU_JIT_INFO_LOG_BUFFER = 3;
constexpr int CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4;
constexpr int CU_JIT_ERROR_LOG_BUFFER = 5;
constexpr int CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8;
/// Special stream handles (cuda.h: CU_STREAM_LEGACY, CU_STREAM_PER_THREAD).
inline CUstream cu_stream_legacy() { return reinterpret_cast<CUstream>(uintptr_t(0x1)); }
inline CUstream cu_stream_per_thread() { return reinterpret_cast<CUstream>(uintptr_t(0x2)); }

/// The driver entry points leapp uses, resolved once per process.
struct CudaDriver {
  int version = 0;  ///< cuDriverGetVersion, e.g. 13000 for CUDA 13.0

  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuStreamIsCapturing)(CUstream, int*) = nullptr;
  CUresult (*cuModuleLoadDataEx)(CUmodule*, const void*, unsigned, int*, void**) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemAllocHost)(void**, size_t) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuPointerGetAttribute)(void*, int, CUdeviceptr) = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction) = nullptr;

  // CUDA graphs (segment replay as one graph launch). Optional: when the driver lacks
  // one, these stay null and segments replay op by op (has_graphs() is false).
  CUresult (*cuStreamBeginCapture)(CUstream, int) = nullptr;
  CUresult (*cuStreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*cuGraphExecUpdate)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo*) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec) = nullptr;
  // What a captured graph holds (a whole pipeline step refuses host-function nodes). Optional.
  CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode*, size_t*) = nullptr;
  CUresult (*cuGraphNodeGetType)(CUgraphNode, int*) = nullptr;
  CUresult (*cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph*) = nullptr;

  // Scratch of its own for each capture of a caller's stream (torch.cuda.graph), kept alive by
  // the captured graph. Optional (CUDA 11.3): without them a captured call uses its stream's scratch.
  CUresult (*cuStreamGetCaptureInfo)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                     size_t*) = nullptr;  // the _v2 ABI
  CUresult (*cuUserObjectCreate)(CUuserObject*, void*, CUhostFn, unsigned, unsigned) = nullptr;
  CUresult (*cuUserObjectRelease)(CUuserObject, unsigned) = nullptr;
  CUresult (*cuGraphRetainUserObject)(CUgraph, CUuserObject, unsigned, unsigned) = nullptr;

  bool has_capture_scratch() const {
    return cuStreamGetCaptureInfo && cuUserObjectCreate && cuUserObjectRelease && cuGraphRetainUserObject;
  }

  bool has_graphs() const {
    return cuStreamBeginCapture && cuStreamEndCapture && cuGraphInstantiateWithFlags && cuGraphExecUpdate &&
           cuGraphLaunch && cuGraphDestroy && cuGraphExecDestroy;
  }
};

/// The host-function nodes of a captured graph, its child graphs' included, in `hosts`. A host function
/// runs again at every launch on whatever its captured pointers hold by then (ONNX Runtime's CUDA EP
/// frees pinned staging buffers from one), so a graph meant for replay must have none. False when the
/// driver cannot list the nodes (cuGraphGetNodes missing or failing).
bool count_graph_host_nodes(CUgraph graph, size_t& hosts);

/// Thrown when libcuda cannot be loaded or initialised; what() says why.
class DriverUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A failed driver call: code, name, text and the call site.
class CudaError : public std::runtime_error {
 public:
  CudaError(CUresult code, const std::string& msg) : std::runtime_error(msg), code(code) {}
  CUresult code;
};

/// The process-wide driver table; loads libcuda.so.1 and calls cuInit(0) the
/// first time (thread-safe). Throws DriverUnavailable when that fails.
const CudaDriver& driver();

/// "CUDA_ERROR_X (text)" for a driver result code, also without a driver.
std::string cu_error_text(CUresult code);

/// Throws CudaError naming `what` and the call site when `code` is not success.
void check_cu(CUresult code, const char* what, const char* file, int line);
#define LEAPP_CHECK_CU(call) ::leapp::check_cu((call), #call, __FILE__, __LINE__)

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
};

/// What the driver reports; never throws (a missing driver is `available=false`).
struct DriverStatus {
  bool available = false;
  std::string error;       ///< why the driver is unavailable, empty otherwise
  int version = 0;         ///< cuDriverGetVersion
  int assumed_version = 0; ///< $LEAPP_ASSUME_DRIVER when set (see assumed_driver_version), else 0
  std::string assumed_error;  ///< why $LEAPP_ASSUME_DRIVER was refused, empty otherwise
  std::vector<DeviceInfo> devices;
};
DriverStatus driver_status();

/// The driver version binaries are chosen for: `actual`, or the older CUDA
/// version $LEAPP_ASSUME_DRIVER names ("12.2" or "12020"), so that a machine
/// with a new driver loads a bundle the way an older driver (a Jetson on
/// JetPack 6) would: cubins that driver could not load are not tried, PTX is
/// JIT-compiled by this driver. Read at every call (a module load).
/// Throws std::invalid_argument naming the variable when its value is not a
/// CUDA version or names one newer than `actual`.
int assumed_driver_version(int actual);

}  // namespace leapp
