// CUDA benchmarks of the tt runtime, each a ratio against a baseline measured
// in the same run (docs/benchmarks.md, "CUDA backend"):
//   1. clone() of a contiguous float32 tensor vs cudaMemcpyDeviceToDevice
//   2. contiguous() of a transposed 2D float32 tensor vs the same memcpy
//   3. H2D to(kCUDA) from pinned vs from pageable memory
//   4. to(kCUDA, non_blocking=true) overlapping a matmul on another stream
//   5. clone() in a loop of 10,000: cudaMalloc calls after warm-up
// Usage: tt_cuda_bench [output-file]; prints the results and writes them there.
#include "tt/cuda.h"
#include "tt/tt.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::ostringstream g_out;
int g_failed = 0;

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    std::cerr << what << ": " << cudaGetErrorString(e) << "\n";
    std::exit(2);
  }
}

// Median milliseconds per call of fn() over `iters` calls, timed by events on
// the current stream, best of 3 repetitions' medians.
template <typename F> double timeMs(F fn, int iters) {
  fn(); // warm-up: caches, cuBLAS handles, allocator blocks
  tt::cuda::synchronize();
  std::vector<double> reps;
  for (int r = 0; r < 3; ++r) {
    tt::cuda::Event start(true), end(true);
    start.record();
    for (int i = 0; i < iters; ++i)
      fn();
    end.record();
    end.synchronize();
    reps.push_back(start.elapsed_time(end) / iters);
  }
  std::sort(reps.begin(), reps.end());
  return reps[0];
}

double hostMs(const std::chrono::steady_clock::time_point &t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void report(const std::string &name, double value, const std::string &unit, double target,
            bool higherIsBetter, const std::string &detail) {
  const bool ok = higherIsBetter ? value >= target : value <= target;
  if (!ok)
    ++g_failed;
  char line[512];
  std::snprintf(line, sizeof line, "| %-44s | %8.3f %-3s | %s %.2f | %-4s | %s |\n", name.c_str(),
                value, unit.c_str(), higherIsBetter ? ">=" : "<=", target, ok ? "PASS" : "MISS",
                detail.c_str());
  std::cout << line << std::flush;
  g_out << line;
}

double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

} // namespace

int main(int argc, char **argv) {
  try {
    (void)tt::empty({1}, tt::TensorOptions().device(tt::kCUDA));
  } catch (const std::exception &e) {
    std::cerr << "tt_cuda_bench: no CUDA device: " << e.what() << "\n";
    return 2;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  g_out << "device: " << prop.name << ", " << prop.totalGlobalMem / (1 << 20) << " MiB\n\n";
  g_out << "| benchmark | value | target | result | detail |\n|---|---|---|---|---|\n";
  std::cout << g_out.str();

  const tt::TensorOptions cuda = tt::TensorOptions().device(tt::kCUDA);
  const std::int64_t n = 64ll << 20; // 64 Mi floats = 256 MiB
  const double bytes = static_cast<double>(n) * 4;

  // 1. clone vs cudaMemcpyDeviceToDevice (both read + write `bytes`).
  tt::Tensor x = tt::ones({n}, cuda);
  void *raw = nullptr;
  check(cudaMalloc(&raw, n * 4), "cudaMalloc");
  const void *src = x.data_ptr();
  cudaStream_t stream = static_cast<cudaStream_t>(tt::cuda::getCurrentCUDAStream().handle());
  const double memcpyMs = timeMs(
      [&] { check(cudaMemcpyAsync(raw, src, n * 4, cudaMemcpyDeviceToDevice, stream), "memcpy"); },
      20);
  const double cloneMs = timeMs([&] { tt::Tensor y = x.clone(); }, 20);
  report("clone, contiguous float32 256 MiB / memcpy D2D", memcpyMs / cloneMs, "x", 0.9, true,
         "clone " + std::to_string(gbps(2 * bytes, cloneMs)).substr(0, 6) + " GB/s, memcpy " +
             std::to_string(gbps(2 * bytes, memcpyMs)).substr(0, 6) + " GB/s");

  // 2. contiguous() of a transposed [8192, 8192] float32.
  tt::Tensor m = tt::ones({8192, 8192}, cuda);
  tt::Tensor mt = m.t();
  const double transMs = timeMs([&] { tt::Tensor y = mt.contiguous(); }, 20);
  report("contiguous() of t(), float32 8192x8192 / memcpy", memcpyMs / transMs, "x", 0.7, true,
         std::to_string(gbps(2 * bytes, transMs)).substr(0, 6) + " GB/s");
  check(cudaFree(raw), "cudaFree");

  // 3. H2D from pinned vs pageable host memory, 256 MiB.
  tt::Tensor hostPageable = tt::ones({n});
  tt::Tensor hostPinned = hostPageable.pin_memory();
  if (!hostPinned.is_pinned() || hostPageable.is_pinned()) {
    std::cerr << "pin_memory()/is_pinned() disagree\n";
    ++g_failed;
  }
  const double pageableMs = timeMs([&] { tt::Tensor y = hostPageable.to(tt::kCUDA); }, 5);
  const double pinnedMs = timeMs(
      [&] {
        tt::Tensor y = hostPinned.to(tt::kCUDA, /*non_blocking=*/true);
      },
      5);
  report("H2D pinned / pageable bandwidth", pageableMs / pinnedMs, "x", 1.5, true,
         "pinned " + std::to_string(gbps(bytes, pinnedMs)).substr(0, 6) + " GB/s, pageable " +
             std::to_string(gbps(bytes, pageableMs)).substr(0, 6) + " GB/s");

  // 4. non_blocking overlap: a matmul on one stream, the copy on another.
  {
    tt::Tensor a = tt::ones({6144, 6144}, cuda), b = tt::ones({6144, 6144}, cuda);
    tt::cuda::synchronize(); // pool streams do not wait for the default stream
    tt::cuda::Stream computeStream = tt::cuda::getStreamFromPool();
    tt::cuda::Stream copyStream = tt::cuda::getStreamFromPool();
    auto compute = [&] {
      tt::cuda::CUDAStreamGuard g(computeStream);
      tt::Tensor c = tt::matmul(a, b);
    };
    auto copyIn = [&] {
      tt::cuda::CUDAStreamGuard g(copyStream);
      tt::Tensor y = hostPinned.to(tt::kCUDA, true);
      tt::cuda::record_stream(y, copyStream);
    };
    auto wall = [&](auto fn) {
      fn();
      tt::cuda::synchronize();
      double best = 1e30;
      for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        fn();
        tt::cuda::synchronize();
        best = std::min(best, hostMs(t0));
      }
      return best;
    };
    const double tc = wall(compute), tx = wall(copyIn);
    const double both = wall([&] {
      compute();
      copyIn();
    });
    // Host time of the non_blocking call itself: it must return before the copy is done.
    auto t0 = std::chrono::steady_clock::now();
    copyIn();
    const double enqueueMs = hostMs(t0);
    tt::cuda::synchronize();
    const double overlap = (tc + tx) / both; // 1.0: serial, up to 2.0: full overlap
    report("non_blocking H2D overlapping a matmul", overlap, "x", 1.2, true,
           "matmul " + std::to_string(tc).substr(0, 6) + " ms, copy " +
               std::to_string(tx).substr(0, 6) + " ms, both " + std::to_string(both).substr(0, 6) +
               " ms, enqueue " + std::to_string(enqueueMs).substr(0, 6) + " ms");
  }

  // 5. Allocator: clone in a loop, cudaMalloc calls after warm-up.
  {
    tt::Tensor s = tt::ones({1 << 20}, cuda);
    { tt::Tensor warm = s.clone(); }
    tt::cuda::synchronize();
    const std::int64_t before = tt::cuda::allocator_stats().num_device_mallocs;
    for (int i = 0; i < 10000; ++i) {
      tt::Tensor y = s.clone();
    }
    tt::cuda::synchronize();
    const auto st = tt::cuda::allocator_stats();
    report("cudaMalloc calls in 10,000 clones after warm-up",
           static_cast<double>(st.num_device_mallocs - before), "", 1, false,
           "reserved " + std::to_string(st.reserved_bytes >> 20) + " MiB, cache hits " +
               std::to_string(st.num_cache_hits));
  }

  const std::string path = argc > 1 ? argv[1] : "cuda_bench.txt";
  std::ofstream(path) << g_out.str();
  std::cout << "\nwritten to " << path << "; " << g_failed << " target(s) missed\n";
  return g_failed ? 1 : 0;
}
