// Validation metrics of a segmentation model: IoU and loss per batch.
#include <torch/torch.h>
#include <iostream>
#include <vector>

struct SegNet : torch::nn::Module {
  SegNet() { conv = register_module("conv", torch::nn::Conv2d(3, 4, 1)); }
  torch::Tensor forward(torch::Tensor x) { return conv->forward(x); }
  torch::nn::Conv2d conv{nullptr};
};

struct Sample {
  torch::Tensor image, mask;
};

void validate(SegNet &net, const std::vector<Sample> &val, int64_t classes) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA, 0);
  net.to(device);
  double loss_total = 0, iou_total = 0;
  for (const auto &s : val) {
    auto x = s.image.to(device).unsqueeze(0);
    auto y = s.mask.to(device).unsqueeze(0);
    auto logits = net.forward(x);
    auto loss = torch::cross_entropy_loss(logits, y);
    loss_total += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    auto pred = logits.argmax(1);
    auto inter = (pred == y).logical_and(y > 0).sum();
    auto uni = ((pred > 0).logical_or(y > 0)).sum().clamp_min(1);
    iou_total += (inter.to(torch::kFloat) / uni).item<double>(); // EXPECT: tensor-sync-in-loop
  }
  std::cout << "val loss " << loss_total / val.size() << " iou " << iou_total / val.size() << "\n";
}

// Confusion matrix accumulated on the host from CPU tensors.
torch::Tensor confusion(const std::vector<Sample> &val, SegNet &net, int64_t classes) {
  torch::NoGradGuard no_grad;
  auto cm = torch::zeros({classes, classes}, torch::kLong);
  for (const auto &s : val) {
    auto pred = net.forward(s.image.unsqueeze(0)).argmax(1).flatten();
    auto gt = s.mask.flatten();
    auto idx = gt * classes + pred;
    auto counts = torch::bincount(idx, {}, classes * classes).view({classes, classes});
    cm += counts;
    std::cout << "pixels " << counts.sum().item<int64_t>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- CPU tensors (inputs not moved)
  }
  return cm;
}

// Per-class IoU of the final matrix: a short host loop over a host tensor.
std::vector<double> per_class_iou(const torch::Tensor &cm) {
  auto m = cm.cpu();
  std::vector<double> out;
  for (int64_t c = 0; c < m.size(0); ++c) {
    double tp = m[c][c].item<double>(); // LOOKALIKE: tensor-sync-in-loop -- a CPU tensor
    double denom = (m[c].sum() + m.select(1, c).sum() - m[c][c]).item<double>(); // LOOKALIKE: tensor-sync-in-loop -- a CPU tensor
    out.push_back(denom > 0 ? tp / denom : 0.0);
  }
  return out;
}

// Threshold sweep: the mask copy is only read per threshold.
std::vector<int64_t> sweep(const torch::Tensor &probs, const std::vector<double> &thresholds) {
  std::vector<int64_t> counts;
  auto p = probs.clone(); // EXPECT: tensor-unnecessary-clone
  for (double t : thresholds)
    counts.push_back((p > t).sum().item<int64_t>());
  return counts;
}

// A per-batch copy of the target mask that is only read.
double mean_foreground(const std::vector<Sample> &val) {
  double total = 0;
  for (const auto &s : val) {
    auto m = s.mask.clone(); // EXPECT: tensor-unnecessary-clone
    total += (m > 0).to(torch::kFloat).mean().item<double>();
  }
  return total / val.size();
}

// Loop-invariant copy in the loop: tensor-clone-in-loop reports it.
double overlap_all(const torch::Tensor &ref, const std::vector<Sample> &val) {
  double total = 0;
  for (const auto &s : val) {
    auto r = ref.clone(); // EXPECT: tensor-clone-in-loop
    total += (r == s.mask).sum().item<double>();
  }
  return total;
}
