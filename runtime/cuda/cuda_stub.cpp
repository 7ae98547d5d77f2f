// tt/cuda.h in a build without the CUDA backend: PyTorch's answer when it
// was built without CUDA.
#include "tt/cuda.h"

#include <stdexcept>

namespace tt::cuda {
namespace {
[[noreturn]] void noCuda() {
  throw Error("Torch not compiled with CUDA enabled (this tt runtime was built without the CUDA "
              "backend: configure with nvcc available and -DTT_ENABLE_CUDA=AUTO or ON)");
}
} // namespace

Stream::Stream(void *handle, int device) : handle_(handle), device_(device) {}
void Stream::synchronize() const { noCuda(); }
bool Stream::query() const { noCuda(); }
Stream getCurrentCUDAStream(int) { noCuda(); }
Stream getDefaultCUDAStream(int) { noCuda(); }
Stream getStreamFromPool(int) { noCuda(); }
void setCurrentCUDAStream(Stream) { noCuda(); }
CUDAStreamGuard::CUDAStreamGuard(Stream s) : prev_(s) { noCuda(); }
CUDAStreamGuard::~CUDAStreamGuard() = default;
Event::Event(bool) : handle_(nullptr) { noCuda(); }
Event::~Event() = default;
void Event::record(const Stream &) { noCuda(); }
void Event::record() { noCuda(); }
void Event::block(const Stream &) { noCuda(); }
void Event::synchronize() const { noCuda(); }
bool Event::query() const { noCuda(); }
float Event::elapsed_time(const Event &) const { noCuda(); }
AllocatorStats allocator_stats(int) { noCuda(); }
std::int64_t memory_allocated(int) { noCuda(); }
std::int64_t max_memory_allocated(int) { noCuda(); }
std::int64_t memory_reserved(int) { noCuda(); }
std::int64_t max_memory_reserved(int) { noCuda(); }
void reset_peak_memory_stats(int) { noCuda(); }
void empty_cache() {}
void record_stream(const Tensor &, const Stream &) { noCuda(); }

} // namespace tt::cuda
