#include "tt/tt.h"

#include <gtest/gtest.h>

TEST(TensorBasics, CreateAndReadBack) {
  tt::Tensor t = tt::full({2, 3}, 2.5);
  EXPECT_EQ(t.dim(), 2);
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.sizes(), (tt::IntArrayRef{2, 3}));
  EXPECT_EQ(t.strides(), (tt::IntArrayRef{3, 1}));
  EXPECT_TRUE(t.is_contiguous());
  const float *p = t.data_ptr<float>();
  for (int i = 0; i < 6; ++i)
    EXPECT_FLOAT_EQ(p[i], 2.5f);
}

TEST(TensorBasics, HandleCopyAliases) {
  tt::Tensor a = tt::zeros({4});
  tt::Tensor b = a; // a handle copy, not a data copy
  EXPECT_TRUE(b.is_alias_of(a));
  b.data_ptr<float>()[0] = 7.0f;
  EXPECT_FLOAT_EQ(a.data_ptr<float>()[0], 7.0f);
  EXPECT_FALSE(tt::zeros({4}).is_alias_of(a));
}

TEST(TensorBasics, ErrorsUsePyTorchWording) {
  tt::Tensor t = tt::ones({2, 2});
  EXPECT_THROW(
      {
        try {
          (void)t.item<float>();
        } catch (const std::exception &e) {
          EXPECT_STREQ(e.what(), "a Tensor with 4 elements cannot be converted to Scalar");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_THROW((void)t.size(2), std::runtime_error);
  EXPECT_THROW((void)t.data_ptr<double>(), std::runtime_error);
  EXPECT_THROW(tt::empty({-1}), std::runtime_error);
}

// allocated_bytes means the bytes currently allocated on the device on every
// device (torch.cuda.memory_allocated on CUDA): on CPU, the live storages.
TEST(TensorBasics, CpuAllocatedBytesCountsLiveStorages) {
  std::int64_t before = tt::memory_stats(tt::Device(tt::kCPU)).allocated_bytes;
  {
    tt::Tensor t = tt::zeros({256}); // 1 KiB of float
    tt::MemoryStats s = tt::memory_stats(tt::Device(tt::kCPU));
    EXPECT_EQ(s.allocated_bytes, before + 256 * 4);
    EXPECT_EQ(s.allocated_bytes, s.current_bytes);
    EXPECT_GE(s.peak_allocated_bytes, s.allocated_bytes);
  }
  EXPECT_EQ(tt::memory_stats(tt::Device(tt::kCPU)).allocated_bytes, before);
}
