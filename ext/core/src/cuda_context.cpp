// ext/core/src/cuda_context.cpp: contexts, capture modes and devices for replay (replay_internal.h).
#include <map>
#include <mutex>
#include <stdexcept>

#include "replay_internal.h"

namespace leapp {
namespace detail {

ContextGuard::ContextGuard(const CudaDriver& d, CUcontext ctx) : d_(d) {
  LEAPP_CHECK_CU(d.cuCtxGetCurrent(&saved_));
  if (saved_ != ctx) {
    LEAPP_CHECK_CU(d.cuCtxSetCurrent(ctx));
    switched_ = true;
  }
}

ContextGuard::ContextGuard(const CudaDriver& d, CUcontext ctx, CUcontext current) : d_(d), saved_(current) {
  if (saved_ != ctx) {
    LEAPP_CHECK_CU(d.cuCtxSetCurrent(ctx));
    switched_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (switched_) d_.cuCtxSetCurrent(saved_);
}

RelaxedCaptureMode::RelaxedCaptureMode(const CudaDriver& d) : d_(d) {
  saved_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  ok_ = d.cuThreadExchangeStreamCaptureMode(&saved_) == CUDA_SUCCESS;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (ok_) d_.cuThreadExchangeStreamCaptureMode(&saved_);
}

const DeviceAttrs& device_attrs(const CudaDriver& d, int ordinal) {
  static std::mutex* mutex = new std::mutex();
  static auto* cache = new std::map<int, DeviceAttrs>();
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = cache->find(ordinal);
  if (it != cache->end()) return it->second;
  int count = 0;
  LEAPP_CHECK_CU(d.cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    throw std::invalid_argument("leapp: CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                std::to_string(count) + " devices)");
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuDeviceGet(&dev, ordinal));
  DeviceAttrs a;
  a.ordinal = ordinal;
  char name[256] = {0};
  d.cuDeviceGetName(name, sizeof(name) - 1, dev);
  a.name = name;
  LEAPP_CHECK_CU(d.cuDeviceGetAttribute(&a.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  LEAPP_CHECK_CU(d.cuDeviceGetAttribute(&a.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  d.cuDeviceGetAttribute(&a.max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  return cache->emplace(ordinal, a).first->second;
}

CUcontext primary_context(const CudaDriver& d, int ordinal) {
  static std::mutex* mutex = new std::mutex();
  static auto* cache = new std::map<int, CUcontext>();
  device_attrs(d, ordinal);  // validates the ordinal
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = cache->find(ordinal);
  if (it != cache->end()) return it->second;
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  LEAPP_CHECK_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
  cache->emplace(ordinal, ctx);
  return ctx;
}

int current_device(const CudaDriver& d) {
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuCtxGetDevice(&dev));
  return int(dev);  // CUdevice is the ordinal
}

}  // namespace detail

bool stream_is_capturing(CUstream stream) {
  try {
    const CudaDriver& d = driver();
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d.cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return false;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  } catch (const DriverUnavailable&) {
    return false;
  }
}

}  // namespace leapp
