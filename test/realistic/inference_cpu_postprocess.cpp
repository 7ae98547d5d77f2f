// CPU-only post-processing of detector outputs (boxes and scores), one image at a time.
#include <torch/torch.h>
#include <vector>

struct Detection {
  torch::Tensor boxes, scores;
};

std::vector<Detection> filter_detections(const std::vector<Detection> &raw, double threshold) {
  auto thr = torch::full({1}, threshold);
  std::vector<Detection> kept;
  for (const auto &d : raw) {
    // FACT: t = torch.full((1,), 0.5); assert t.to(torch.float32) is t
    auto t = thr.to(torch::kFloat); // LOOKALIKE: tensor-clone-in-loop -- thr is float32 already: to() returns it
    auto keep = d.scores > t;
    kept.push_back({d.boxes.index({keep}), d.scores.index({keep})});
  }
  return kept;
}

torch::Tensor scale_boxes(const std::vector<torch::Tensor> &boxes, const torch::Tensor &image_size) {
  std::vector<torch::Tensor> out;
  auto wh = image_size.repeat({2});
  for (const auto &b : boxes) {
    // FACT: w = torch.rand(4); assert w.contiguous() is w
    auto factor = wh.contiguous(); // LOOKALIKE: tensor-clone-in-loop -- repeat() made a contiguous tensor: a no-op
    out.push_back(b * factor);
  }
  return torch::cat(out);
}
