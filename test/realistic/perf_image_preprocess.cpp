// Image preprocessing helpers of a detection data pipeline.
#include <torch/torch.h>
#include <vector>

// Per-channel normalisation of a CHW float image.
torch::Tensor normalize(const torch::Tensor &img, const torch::Tensor &mean, const torch::Tensor &std) {
  auto out = img.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: x = torch.rand(3, 4, 4); m = torch.rand(3, 1, 1); y = x.clone(); y.sub_(m); assert torch.equal(y, x.sub(m))
  out.sub_(mean);
  out.div_(std);
  return out;
}

torch::Tensor to_unit_range(const torch::Tensor &img) {
  torch::Tensor x = img.clone(); // EXPECT: tensor-unnecessary-clone
  // FACT: x = torch.rand(3, 4) * 255; y = x.clone(); y /= 255.0; assert torch.equal(y, x.div(255.0))
  x /= 255.0;
  return x;
}

// Horizontal flip of the boxes [x1, y1, x2, y2] in an image of width w.
torch::Tensor flip_boxes(const torch::Tensor &boxes, int64_t w) {
  auto flipped = boxes.clone(); // LOOKALIKE: tensor-unnecessary-clone -- columns are overwritten through views, the input must stay
  flipped.select(1, 0).copy_(w - boxes.select(1, 2));
  flipped.select(1, 2).copy_(w - boxes.select(1, 0));
  return flipped;
}

// Cutout: a square of the image set to zero.
torch::Tensor cutout(const torch::Tensor &img, int64_t cy, int64_t cx, int64_t size) {
  auto out = img.clone(); // LOOKALIKE: tensor-unnecessary-clone -- written through a view later; the caller's image stays
  auto h = img.size(1), w = img.size(2);
  auto y0 = std::max<int64_t>(0, cy - size / 2), x0 = std::max<int64_t>(0, cx - size / 2);
  auto y1 = std::min(h, y0 + size), x1 = std::min(w, x0 + size);
  out.narrow(1, y0, y1 - y0).narrow(2, x0, x1 - x0).zero_();
  return out;
}

// Mean image of a batch: the input copy is only read.
torch::Tensor batch_stats(const torch::Tensor &batch) {
  auto b = batch.clone(); // EXPECT: tensor-unnecessary-clone
  auto mean = b.mean(0);
  auto var = b.var(0);
  return torch::stack({mean, var});
}

// The clip range is applied to a copy; the original is kept for the residual.
std::vector<torch::Tensor> clip_and_residual(torch::Tensor x, double lo, double hi) {
  auto clipped = x.clone(); // EXPECT: tensor-unnecessary-clone
  clipped.clamp_(lo, hi);
  auto residual = x - clipped;
  return {clipped, residual};
}

// A blank canvas the size of the image: the values of the clone are overwritten.
torch::Tensor canvas_like(const torch::Tensor &img) {
  auto canvas = img.clone(); // LOOKALIKE: tensor-unnecessary-clone -- first use is fill_, zeros_like/full_like would drop autograd; not an out-of-place twin
  canvas.fill_(0.5);
  return canvas;
}

void augment_inplace(torch::Tensor &img); // defined in another file

torch::Tensor augmented_copy(const torch::Tensor &img) {
  auto a = img.clone(); // LOOKALIKE: tensor-unnecessary-clone -- handed by reference to code that writes it
  augment_inplace(a);
  return a;
}

struct RunningNorm {
  torch::Tensor mean = torch::zeros({3}), var = torch::ones({3});
  int64_t n = 0;
  torch::Tensor apply(const torch::Tensor &x) {
    auto m = mean.clone(); // LOOKALIKE: tensor-unnecessary-clone -- the member is updated in place while the snapshot is still read
    update(x);
    return (x - m.view({3, 1, 1})) / var.sqrt().view({3, 1, 1});
  }
  void update(const torch::Tensor &x) {
    ++n;
    mean.add_((x.mean({1, 2}) - mean) / n);
  }
};
