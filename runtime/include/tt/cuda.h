// CUDA streams, events and the caching allocator's statistics: the parts of
// c10::cuda / torch.cuda that code written against LibTorch uses. Declared in
// every build; without the CUDA backend the calls throw "Torch not compiled
// with CUDA enabled" (empty_cache() is then a no-op, as in PyTorch).
// tt::cuda::is_available(), device_count() and synchronize() are in tensor.h.
#pragma once

#include "tt/tensor.h"

#include <cstdint>

namespace tt::cuda {

// A CUDA stream of one device. The default stream is the legacy NULL stream,
// which PyTorch also uses by default.
class Stream {
public:
  Stream(void *handle, int device);
  void *handle() const { return handle_; } // a cudaStream_t
  int device() const { return device_; }
  bool operator==(const Stream &o) const { return handle_ == o.handle_ && device_ == o.device_; }
  bool operator!=(const Stream &o) const { return !(*this == o); }
  void synchronize() const;
  bool query() const; // true when all work queued on it is done

private:
  void *handle_;
  int device_;
};

// device -1 means the current device. Kernels and copies of the runtime are
// queued on the current stream of the calling thread.
Stream getCurrentCUDAStream(int device = -1);
Stream getDefaultCUDAStream(int device = -1);
Stream getStreamFromPool(int device = -1);
void setCurrentCUDAStream(Stream stream);

// Sets the current stream for a scope (c10::cuda::CUDAStreamGuard).
class CUDAStreamGuard {
public:
  explicit CUDAStreamGuard(Stream stream);
  ~CUDAStreamGuard();
  CUDAStreamGuard(const CUDAStreamGuard &) = delete;
  CUDAStreamGuard &operator=(const CUDAStreamGuard &) = delete;

private:
  Stream prev_;
};

// at::cuda::CUDAEvent: record on a stream, make another stream wait for it.
class Event {
public:
  explicit Event(bool enable_timing = false);
  ~Event();
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;
  void record(const Stream &stream);
  void record(); // on the current stream
  void block(const Stream &stream); // stream waits for this event
  void synchronize() const;
  bool query() const;
  float elapsed_time(const Event &end) const; // milliseconds; both need timing

private:
  void *handle_;
};

// torch.cuda.memory_stats' main counters for one device.
struct AllocatorStats {
  std::int64_t allocated_bytes = 0;     // torch.cuda.memory_allocated
  std::int64_t max_allocated_bytes = 0; // torch.cuda.max_memory_allocated
  std::int64_t reserved_bytes = 0;      // torch.cuda.memory_reserved
  std::int64_t max_reserved_bytes = 0;  // torch.cuda.max_memory_reserved
  std::int64_t num_allocs = 0;          // allocation requests
  std::int64_t num_cache_hits = 0;      // served from the cache
  std::int64_t num_device_mallocs = 0;  // cudaMalloc calls
  std::int64_t num_device_frees = 0;    // cudaFree calls
  std::int64_t num_alloc_retries = 0;   // cache flushed after an out-of-memory
  std::int64_t num_ooms = 0;
};
AllocatorStats allocator_stats(int device = -1);
std::int64_t memory_allocated(int device = -1);
std::int64_t max_memory_allocated(int device = -1);
std::int64_t memory_reserved(int device = -1);
std::int64_t max_memory_reserved(int device = -1);
void reset_peak_memory_stats(int device = -1);
// Returns every cached, unused block to the driver.
void empty_cache();
// Marks t's memory as used by `stream`, so that the allocator does not reuse
// it before the work queued there so far is done (Tensor::record_stream).
void record_stream(const Tensor &t, const Stream &stream);

} // namespace tt::cuda
