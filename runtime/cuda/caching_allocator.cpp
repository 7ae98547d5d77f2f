#include "caching_allocator.h"

#include <algorithm>
#include <cstdio>

namespace tt::cudaalloc {

std::string formatSize(std::uint64_t bytes) {
  char buf[64];
  if (bytes <= 1024)
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  else if (bytes < (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.2f KiB", bytes / 1024.0);
  else if (bytes < (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

std::size_t CachingAllocator::roundSize(std::size_t nbytes) {
  if (nbytes <= kSmallLimit)
    return std::max(kMinBlock, (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock);
  return (nbytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

CachingAllocator::CachingAllocator(Hooks &hooks, bool alwaysPending)
    : hooks_(hooks), alwaysPending_(alwaysPending) {}

CachingAllocator::~CachingAllocator() {
  // At process exit the driver may already be shutting down; returning the
  // cache is best effort and must not throw.
  try {
    emptyCache();
  } catch (...) {
  }
}

void CachingAllocator::bumpAllocated(std::int64_t delta) {
  stats_.allocated_bytes += delta;
  stats_.max_allocated_bytes = std::max(stats_.max_allocated_bytes, stats_.allocated_bytes);
}

void CachingAllocator::bumpReserved(std::int64_t delta) {
  stats_.reserved_bytes += delta;
  stats_.max_reserved_bytes = std::max(stats_.max_reserved_bytes, stats_.reserved_bytes);
}

void *CachingAllocator::allocate(std::size_t nbytes, void *stream) {
  if (nbytes == 0)
    return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t size = roundSize(nbytes);
  const void *key = alwaysPending_ ? nullptr : stream;
  ++stats_.num_allocs;
  if (!pending_.empty())
    processPending(/*wait=*/false);

  Block *block = nullptr;
  auto it = free_.lower_bound(Key(const_cast<void *>(key), size));
  if (it != free_.end() && it->first.first == key &&
      (it->first.second == size || (size > kSmallLimit && it->first.second <= size + size / 4))) {
    block = it->second;
    free_.erase(it);
    --stats_.cached_blocks;
    ++stats_.num_cache_hits;
  } else {
    void *p = rawAllocOrRetry(size, nbytes);
    block = new Block{p, size, const_cast<void *>(key), {}, {}};
    all_.emplace(p, block);
    bumpReserved(static_cast<std::int64_t>(size));
  }
  active_.emplace(block->ptr, block);
  ++stats_.active_blocks;
  stats_.requested_bytes += nbytes;
  bumpAllocated(static_cast<std::int64_t>(block->size));
  return block->ptr;
}

void *CachingAllocator::rawAllocOrRetry(std::size_t size, std::size_t requested) {
  ++stats_.num_raw_allocs;
  if (void *p = hooks_.rawAlloc(size))
    return p;
  // Out of memory: give the cache back to the driver and try once more.
  ++stats_.num_alloc_retries;
  processPending(/*wait=*/true);
  releaseCached();
  ++stats_.num_raw_allocs;
  if (void *p = hooks_.rawAlloc(size))
    return p;
  ++stats_.num_ooms;
  throwOom(requested);
}

void CachingAllocator::throwOom(std::size_t requested) {
  std::size_t freeBytes = 0, totalBytes = 0;
  hooks_.memInfo(&freeBytes, &totalBytes);
  // PyTorch 1.13's message, word for word.
  throw OutOfMemoryError("CUDA out of memory. Tried to allocate " + formatSize(requested) + " (" +
                         hooks_.name() + "; " + formatSize(totalBytes) + " total capacity; " +
                         formatSize(stats_.allocated_bytes) + " already allocated; " +
                         formatSize(freeBytes) + " free; " + formatSize(stats_.reserved_bytes) +
                         " reserved in total by PyTorch) If reserved memory is >> allocated "
                         "memory try setting max_split_size_mb to avoid fragmentation.  See "
                         "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF");
}

void CachingAllocator::free(void *p) {
  if (!p)
    return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_.find(p);
  if (it == active_.end())
    throw std::invalid_argument("tt: invalid device pointer passed to the caching allocator");
  Block *block = it->second;
  active_.erase(it);
  --stats_.active_blocks;
  ++stats_.num_frees;
  ++stats_.cached_blocks;
  bumpAllocated(-static_cast<std::int64_t>(block->size));
  if (block->uses.empty()) {
    free_.emplace(Key(block->stream, block->size), block);
    return;
  }
  for (void *s : block->uses)
    block->events.push_back(hooks_.recordEvent(s));
  block->uses.clear();
  pending_.push_back(block);
}

void CachingAllocator::recordStream(void *p, void *stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = all_.upper_bound(p);
  if (it == all_.begin())
    return;
  Block *block = std::prev(it)->second;
  if (static_cast<const char *>(p) >= static_cast<const char *>(block->ptr) + block->size)
    return;
  if (alwaysPending_ || stream != block->stream)
    block->uses.insert(stream);
}

void CachingAllocator::processPending(bool wait) {
  std::vector<Block *> still;
  for (Block *block : pending_) {
    bool done = true;
    for (void *ev : block->events) {
      if (wait)
        hooks_.eventSynchronize(ev);
      else if (!hooks_.eventDone(ev)) {
        done = false;
        break;
      }
    }
    if (!done) {
      still.push_back(block);
      continue;
    }
    for (void *ev : block->events)
      hooks_.releaseEvent(ev);
    block->events.clear();
    free_.emplace(Key(block->stream, block->size), block);
  }
  pending_.swap(still);
}

void CachingAllocator::releaseCached() {
  for (auto &[key, block] : free_) {
    hooks_.rawFree(block->ptr);
    ++stats_.num_raw_frees;
    bumpReserved(-static_cast<std::int64_t>(block->size));
    all_.erase(block->ptr);
    --stats_.cached_blocks;
    delete block;
  }
  free_.clear();
}

void CachingAllocator::emptyCache() {
  std::lock_guard<std::mutex> lock(mu_);
  processPending(/*wait=*/true);
  releaseCached();
}

bool CachingAllocator::owns(const void *p) const { return lookup(p, nullptr, nullptr); }

bool CachingAllocator::lookup(const void *p, void **base, std::size_t *size) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = all_.upper_bound(p);
  if (it == all_.begin())
    return false;
  const Block *block = std::prev(it)->second;
  if (static_cast<const char *>(p) >= static_cast<const char *>(block->ptr) + block->size)
    return false;
  if (base)
    *base = block->ptr;
  if (size)
    *size = block->size;
  return true;
}

Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::resetPeakStats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.max_allocated_bytes = stats_.allocated_bytes;
  stats_.max_reserved_bytes = stats_.reserved_bytes;
}

} // namespace tt::cudaalloc
