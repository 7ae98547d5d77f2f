// A caching allocator in the style of PyTorch's CUDACachingAllocator, without
// block splitting. Freed blocks go back to a free list keyed by (stream, size
// class) and are handed out again without touching the driver: cudaMalloc and
// cudaFree happen only on a cache miss, on empty_cache(), and on the
// free-everything-and-retry path after an out-of-memory error.
//
// Safety rule (PyTorch's): a block is reused without synchronisation only by
// allocations on the stream it was allocated on, because work on one stream
// runs in order. A block that other streams used (recordStream) goes to a
// pending list with one event per such stream and is reused once they all
// completed. Pinned host memory uses the same class with `alwaysPending`:
// the host writes into a reused block at once, so every recorded use must be
// complete first.
//
// Pure host C++: the driver is reached only through Hooks, so the unit tests
// drive the whole policy with a fake driver and no GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tt::cudaalloc {

struct Hooks {
  virtual ~Hooks() = default;
  virtual void *rawAlloc(std::size_t nbytes) = 0; // nullptr when out of memory
  virtual void rawFree(void *p) = 0;
  virtual void *recordEvent(void *stream) = 0; // an event recorded on stream now
  virtual bool eventDone(void *event) = 0;
  virtual void eventSynchronize(void *event) = 0;
  virtual void releaseEvent(void *event) = 0;
  virtual void memInfo(std::size_t *freeBytes, std::size_t *totalBytes) = 0;
  virtual std::string name() const = 0; // "GPU 0", for messages
};

struct Stats {
  std::uint64_t allocated_bytes = 0;     // in blocks handed out (rounded sizes)
  std::uint64_t max_allocated_bytes = 0; // peak of the above since reset
  std::uint64_t reserved_bytes = 0;      // obtained from the driver and not returned
  std::uint64_t max_reserved_bytes = 0;
  std::uint64_t requested_bytes = 0;     // as asked for, before rounding
  std::uint64_t num_allocs = 0;          // calls to allocate()
  std::uint64_t num_frees = 0;
  std::uint64_t num_cache_hits = 0;
  std::uint64_t num_raw_allocs = 0;      // cudaMalloc / cudaHostAlloc calls
  std::uint64_t num_raw_frees = 0;
  std::uint64_t num_alloc_retries = 0;   // out of memory, cache flushed, retried
  std::uint64_t num_ooms = 0;
  std::uint64_t active_blocks = 0;
  std::uint64_t cached_blocks = 0;       // free or pending
};

// Thrown when the driver is out of memory even after the cache was flushed.
struct OutOfMemoryError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class CachingAllocator {
public:
  // Small requests round to 512 bytes, large ones (> 1 MiB) to 2 MiB; a large
  // cached block serves a request up to 1/4 smaller than itself.
  static constexpr std::size_t kMinBlock = 512;
  static constexpr std::size_t kSmallLimit = 1 << 20;
  static constexpr std::size_t kLargeRound = 2 << 20;
  static std::size_t roundSize(std::size_t nbytes);

  CachingAllocator(Hooks &hooks, bool alwaysPending);
  ~CachingAllocator(); // frees what is cached; blocks still in use leak on purpose
  CachingAllocator(const CachingAllocator &) = delete;
  CachingAllocator &operator=(const CachingAllocator &) = delete;

  // nbytes == 0 returns nullptr and counts nothing, as in PyTorch.
  void *allocate(std::size_t nbytes, void *stream);
  void free(void *p);
  // Marks `p` as used by `stream` (PyTorch's Tensor::record_stream).
  void recordStream(void *p, void *stream);
  bool owns(const void *p) const;
  // The allocation `p` belongs to (its base and block size), for pointers
  // into a block as well as its start; false when not ours.
  bool lookup(const void *p, void **base, std::size_t *size) const;

  // Waits for pending blocks, then returns every cached block to the driver.
  void emptyCache();
  Stats stats() const;
  void resetPeakStats();

private:
  struct Block {
    void *ptr;
    std::size_t size;
    void *stream;           // the allocating stream: its free list
    std::set<void *> uses;  // other streams that used it
    std::vector<void *> events;
  };
  using Key = std::pair<void *, std::size_t>; // (stream, size)

  void *rawAllocOrRetry(std::size_t size, std::size_t requested);
  void processPending(bool wait);
  void releaseCached();
  void bumpAllocated(std::int64_t delta);
  void bumpReserved(std::int64_t delta);
  [[noreturn]] void throwOom(std::size_t requested);

  Hooks &hooks_;
  bool alwaysPending_;
  mutable std::mutex mu_;
  std::unordered_map<void *, Block *> active_;
  std::multimap<Key, Block *> free_;
  std::vector<Block *> pending_;
  std::map<const void *, Block *> all_; // every block, for lookup()
  Stats stats_;
};

// "20.00 MiB", "1.50 GiB": PyTorch's format_size().
std::string formatSize(std::uint64_t bytes);

} // namespace tt::cudaalloc
