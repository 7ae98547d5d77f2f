// The caching allocator's policy against a fake driver: runs without a GPU.
#include "caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

using tt::cudaalloc::CachingAllocator;
using tt::cudaalloc::Hooks;
using tt::cudaalloc::OutOfMemoryError;

namespace {
// Counts driver calls; events complete when the test says so.
struct FakeDriver : Hooks {
  std::size_t capacity = std::size_t(1) << 40;
  std::size_t inUse = 0;
  int mallocs = 0, frees = 0;
  std::set<void *> live;
  std::set<int *> events, doneEvents;

  void *rawAlloc(std::size_t n) override {
    if (inUse + n > capacity)
      return nullptr;
    ++mallocs;
    inUse += n;
    void *p = std::malloc(n);
    sizes[p] = n;
    live.insert(p);
    return p;
  }
  void rawFree(void *p) override {
    ASSERT_TRUE(live.count(p)) << "freeing memory the driver never gave";
    ++frees;
    inUse -= sizes[p];
    live.erase(p);
    std::free(p);
  }
  void *recordEvent(void *) override {
    int *e = new int(0);
    events.insert(e);
    return e;
  }
  bool eventDone(void *e) override { return doneEvents.count(static_cast<int *>(e)) > 0; }
  void eventSynchronize(void *e) override { doneEvents.insert(static_cast<int *>(e)); }
  void releaseEvent(void *e) override {
    events.erase(static_cast<int *>(e));
    doneEvents.erase(static_cast<int *>(e));
    delete static_cast<int *>(e);
  }
  void completeAll() {
    for (int *e : events)
      doneEvents.insert(e);
  }
  void memInfo(std::size_t *f, std::size_t *t) override {
    *f = capacity - inUse;
    *t = capacity;
  }
  std::string name() const override { return "GPU 0"; }
  std::map<void *, std::size_t> sizes;
};

void *const kStreamA = reinterpret_cast<void *>(0x10);
void *const kStreamB = reinterpret_cast<void *>(0x20);
} // namespace

TEST(CudaCachingAllocator, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::roundSize(1), 512u);
  EXPECT_EQ(CachingAllocator::roundSize(512), 512u);
  EXPECT_EQ(CachingAllocator::roundSize(513), 1024u);
  EXPECT_EQ(CachingAllocator::roundSize(1 << 20), 1u << 20);
  EXPECT_EQ(CachingAllocator::roundSize((1 << 20) + 1), 2u << 20);
  EXPECT_EQ(CachingAllocator::roundSize(64u << 20), 64u << 20);
}

TEST(CudaCachingAllocator, CloneInALoopReusesOneBlock) {
  FakeDriver drv;
  CachingAllocator alloc(drv, false);
  const std::size_t n = 64u << 20;
  void *first = alloc.allocate(n, kStreamA);
  alloc.free(first);
  const int warm = drv.mallocs;
  for (int i = 0; i < 10000; ++i) {
    void *p = alloc.allocate(n, kStreamA);
    EXPECT_EQ(p, first);
    alloc.free(p);
  }
  EXPECT_EQ(drv.mallocs - warm, 0) << "no cudaMalloc after warm-up";
  auto st = alloc.stats();
  EXPECT_EQ(st.num_raw_allocs, 1u);
  EXPECT_EQ(st.num_cache_hits, 10000u);
  EXPECT_EQ(st.allocated_bytes, 0u);
  EXPECT_EQ(st.reserved_bytes, n);
  EXPECT_EQ(st.max_allocated_bytes, n);
}

TEST(CudaCachingAllocator, StatsTrackAllocatedReservedAndPeak) {
  FakeDriver drv;
  CachingAllocator alloc(drv, false);
  void *a = alloc.allocate(1000, kStreamA);   // 1024
  void *b = alloc.allocate(3u << 20, kStreamA); // 4 MiB
  auto st = alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 1024u + (4u << 20));
  EXPECT_EQ(st.requested_bytes, 1000u + (3u << 20));
  EXPECT_EQ(st.active_blocks, 2u);
  alloc.free(b);
  st = alloc.stats();
  EXPECT_EQ(st.allocated_bytes, 1024u);
  EXPECT_EQ(st.reserved_bytes, 1024u + (4u << 20));
  EXPECT_EQ(st.max_allocated_bytes, 1024u + (4u << 20));
  alloc.resetPeakStats();
  EXPECT_EQ(alloc.stats().max_allocated_bytes, 1024u);
  alloc.emptyCache();
  st = alloc.stats();
  EXPECT_EQ(st.reserved_bytes, 1024u); // the live block stays
  EXPECT_EQ(drv.frees, 1);
  alloc.free(a);
  alloc.emptyCache();
  EXPECT_EQ(alloc.stats().reserved_bytes, 0u);
  EXPECT_TRUE(drv.live.empty());
  EXPECT_EQ(alloc.allocate(0, kStreamA), nullptr);
}

TEST(CudaCachingAllocator, BlocksStayWithTheirStream) {
  FakeDriver drv;
  CachingAllocator alloc(drv, false);
  void *a = alloc.allocate(4096, kStreamA);
  alloc.free(a);
  void *b = alloc.allocate(4096, kStreamB); // must not reuse A's block
  EXPECT_NE(a, b);
  void *c = alloc.allocate(4096, kStreamA);
  EXPECT_EQ(a, c);
  alloc.free(b);
  alloc.free(c);
}

TEST(CudaCachingAllocator, RecordStreamDefersReuseUntilTheEventCompletes) {
  FakeDriver drv;
  CachingAllocator alloc(drv, false);
  void *a = alloc.allocate(4096, kStreamA);
  alloc.recordStream(static_cast<char *>(a) + 100, kStreamB); // a pointer into the block
  alloc.free(a);
  EXPECT_EQ(drv.events.size(), 1u);
  void *b = alloc.allocate(4096, kStreamA);
  EXPECT_NE(a, b) << "reused while stream B may still read it";
  drv.completeAll();
  void *c = alloc.allocate(4096, kStreamA);
  EXPECT_EQ(a, c);
  EXPECT_TRUE(drv.events.empty());
  alloc.free(b);
  alloc.free(c);
}

TEST(CudaCachingAllocator, PinnedBlocksWaitForEveryRecordedUse) {
  FakeDriver drv;
  CachingAllocator pinned(drv, /*alwaysPending=*/true);
  void *a = pinned.allocate(1 << 16, nullptr);
  pinned.recordStream(a, nullptr); // a non_blocking copy on the default stream
  pinned.free(a);
  void *b = pinned.allocate(1 << 16, nullptr);
  EXPECT_NE(a, b);
  drv.completeAll();
  pinned.free(b); // no recorded use: straight back to the cache
  void *c = pinned.allocate(1 << 16, nullptr);
  void *d = pinned.allocate(1 << 16, nullptr);
  EXPECT_TRUE((c == a && d == b) || (c == b && d == a));
  pinned.free(c);
  pinned.free(d);
}

TEST(CudaCachingAllocator, LargeBlocksServeSlightlySmallerRequests) {
  FakeDriver drv;
  CachingAllocator alloc(drv, false);
  void *a = alloc.allocate(10u << 20, kStreamA);
  alloc.free(a);
  EXPECT_EQ(alloc.allocate(9u << 20, kStreamA), a); // within 1/4
  void *b = alloc.allocate(4u << 20, kStreamA);     // far smaller: its own block
  EXPECT_NE(a, b);
  alloc.free(a);
  alloc.free(b);
}

TEST(CudaCachingAllocator, OutOfMemoryFlushesTheCacheThenThrowsPyTorchMessage) {
  FakeDriver drv;
  drv.capacity = 8u << 20;
  CachingAllocator alloc(drv, false);
  void *a = alloc.allocate(4u << 20, kStreamA);
  alloc.free(a); // cached: 4 MiB reserved, 0 allocated
  void *b = alloc.allocate(6u << 20, kStreamA); // fits only once the cache is flushed
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(alloc.stats().num_alloc_retries, 1u);
  EXPECT_EQ(alloc.stats().reserved_bytes, 6u << 20);
  try {
    alloc.allocate(4u << 20, kStreamA);
    FAIL() << "expected out of memory";
  } catch (const OutOfMemoryError &e) {
    EXPECT_EQ(std::string(e.what()).rfind("CUDA out of memory. Tried to allocate 4.00 MiB (GPU 0; "
                                          "8.00 MiB total capacity; 6.00 MiB already allocated; "
                                          "2.00 MiB free; 6.00 MiB reserved in total by PyTorch)",
                                          0),
              0u)
        << e.what();
  }
  EXPECT_EQ(alloc.stats().num_ooms, 1u);
  alloc.free(b);
}

TEST(CudaCachingAllocator, FreeingAForeignPointerThrows) {
  FakeDriver drv;
  CachingAllocator alloc(drv, false);
  int x;
  EXPECT_THROW(alloc.free(&x), std::invalid_argument);
  void *a = alloc.allocate(100, kStreamA);
  void *base = nullptr;
  std::size_t size = 0;
  EXPECT_TRUE(alloc.lookup(static_cast<char *>(a) + 50, &base, &size));
  EXPECT_EQ(base, a);
  EXPECT_EQ(size, 512u);
  EXPECT_FALSE(alloc.owns(&x));
  alloc.free(a);
}
