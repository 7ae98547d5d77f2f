// Devices, errors, raw memory, streams, events and transfers: thin wrappers
// over the CUDA runtime that throw PyTorch's messages.
#include "cuda_ops.h"

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace tt::cudaops {

[[noreturn]] void throwCudaError(cudaError_t err, const char *what) {
  // PyTorch: "CUDA error: <string>" plus a hint about asynchronous reports.
  throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(err) +
                           "\nCUDA kernel errors might be asynchronously reported at some other "
                           "API call, so the stacktrace below might be incorrect.\nFor debugging "
                           "consider passing CUDA_LAUNCH_BLOCKING=1. (in " + what + ")");
}

#define CHECK(expr)                                                                                \
  do {                                                                                             \
    cudaError_t e_ = (expr);                                                                       \
    if (e_ != cudaSuccess)                                                                         \
      throwCudaError(e_, #expr);                                                                   \
  } while (0)

namespace {
// PyTorch's lazy-init messages (torch/cuda/__init__.py, c10/cuda).
const char *kNoDriver =
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and "
    "installed a driver from http://www.nvidia.com/Download/index.aspx";
const char *kNoDevice = "No CUDA GPUs are available";

struct Probe {
  int count = 0;
  std::string why;
};

const Probe &probe() {
  static const Probe p = [] {
    Probe r;
    cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err == cudaSuccess && r.count > 0)
      return r;
    cudaGetLastError(); // clear the sticky-free error so later calls start clean
    r.count = 0;
    if (err == cudaErrorInsufficientDriver || err == cudaErrorInitializationError ||
        err == cudaErrorNotSupported || err == cudaErrorSystemDriverMismatch ||
        err == cudaErrorCompatNotSupportedOnDevice)
      r.why = std::string(kNoDriver) + " (CUDA: " + cudaGetErrorString(err) + ")";
    else
      r.why = std::string(kNoDevice) +
              (err == cudaSuccess || err == cudaErrorNoDevice
                   ? std::string()
                   : std::string(" (CUDA: ") + cudaGetErrorString(err) + ")");
    return r;
  }();
  return p;
}
} // namespace

int deviceCountNoThrow(std::string *why) {
  const Probe &p = probe();
  if (why)
    *why = p.why;
  return p.count;
}

int deviceCount() {
  const Probe &p = probe();
  if (p.count == 0)
    throw std::runtime_error(p.why);
  return p.count;
}

int currentDevice() {
  deviceCount();
  int d = 0;
  CHECK(cudaGetDevice(&d));
  return d;
}

void setDevice(int device) {
  const int n = deviceCount();
  if (device < 0 || device >= n)
    throw std::runtime_error("CUDA error: invalid device ordinal (device " +
                             std::to_string(device) + ", " + std::to_string(n) + " available)");
  CHECK(cudaSetDevice(device));
}

void *rawDeviceMalloc(std::size_t nbytes) {
  void *p = nullptr;
  cudaError_t err = cudaMalloc(&p, nbytes);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError(); // not sticky: clear it, the caller retries or reports
    return nullptr;
  }
  CHECK(err);
  return p;
}

void rawDeviceFree(void *p) { CHECK(cudaFree(p)); }

void *rawHostMalloc(std::size_t nbytes) {
  void *p = nullptr;
  cudaError_t err = cudaHostAlloc(&p, nbytes, cudaHostAllocDefault);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return nullptr;
  }
  CHECK(err);
  return p;
}

void rawHostFree(void *p) { CHECK(cudaFreeHost(p)); }

bool isPinnedPointer(const void *p) {
  if (!p || deviceCountNoThrow() == 0)
    return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void memInfo(std::size_t *freeBytes, std::size_t *totalBytes) {
  *freeBytes = *totalBytes = 0;
  if (cudaMemGetInfo(freeBytes, totalBytes) != cudaSuccess)
    cudaGetLastError(); // only for an error message: best effort
}

void *streamCreate() {
  cudaStream_t s = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
void streamDestroy(void *stream) { CHECK(cudaStreamDestroy(static_cast<cudaStream_t>(stream))); }
void streamSynchronize(void *stream) {
  CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}
bool streamQuery(void *stream) {
  cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(stream));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  CHECK(err);
  return true;
}
void deviceSynchronize() { CHECK(cudaDeviceSynchronize()); }

void *eventCreate(bool timing) {
  cudaEvent_t e = nullptr;
  CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}
void eventDestroy(void *event) { CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }
void eventRecord(void *event, void *stream) {
  CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}
void eventSynchronize(void *event) { CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }
bool eventQuery(void *event) {
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  CHECK(err);
  return true;
}
void streamWaitEvent(void *stream, void *event) {
  CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}
float eventElapsedMs(void *start, void *end) {
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void memcpyAsync(void *dst, const void *src, std::size_t nbytes, CopyKind kind, void *stream) {
  if (nbytes == 0)
    return;
  const cudaMemcpyKind k = kind == CopyKind::HostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost
                                                            : cudaMemcpyDeviceToDevice;
  CHECK(cudaMemcpyAsync(dst, src, nbytes, k, static_cast<cudaStream_t>(stream)));
}

} // namespace tt::cudaops
