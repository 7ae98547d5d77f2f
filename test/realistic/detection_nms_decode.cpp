// Single-stage detector post-processing: flatten the head outputs, decode deltas against anchors, clip, threshold, NMS per image.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

struct DetHeadImpl : torch::nn::Module {
  DetHeadImpl(int64_t in_ch, int64_t anchors, int64_t classes) : A(anchors), K(classes) {
    cls = register_module("cls", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_ch, A * K, 3).padding(1)));
    box = register_module("box", torch::nn::Conv2d(torch::nn::Conv2dOptions(in_ch, A * 4, 3).padding(1)));
  }
  // [N, C, H, W] -> class logits [N, H*W*A, K] and box deltas [N, H*W*A, 4]
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &feat) {
    auto logits = cls(feat);                      // [N, A*K, H, W]
    auto N = logits.size(0);
    auto per_loc = logits.permute({0, 2, 3, 1}); // [N, H, W, A*K]
    auto deltas = box(feat).permute({0, 2, 3, 1}).contiguous();
    // FACT: d = torch.randn(2, 8, 3, 5).permute(0, 2, 3, 1).contiguous(); assert is_view_of(d.view(2, -1, 4), d)
    auto flat_deltas = deltas.view({N, -1, 4}); // LOOKALIKE: tensor-view-non-contiguous -- made contiguous first
    // FACT: o = torch.randn(2, 6, 3, 4); assert raises(lambda: o.permute(0, 2, 3, 1).view(2, -1, 3), "view size is not compatible")
    return {per_loc.view({N, -1, K}), flat_deltas}; // EXPECT: tensor-view-non-contiguous -- per_loc is the permuted conv output
  }
  int64_t A, K;
  torch::nn::Conv2d cls{nullptr}, box{nullptr};
};
TORCH_MODULE(DetHead);

// Faster R-CNN box coding: deltas (dx, dy, dw, dh) against anchors (x1, y1, x2, y2), both [R, 4].
torch::Tensor decode(const torch::Tensor &deltas, const torch::Tensor &anchors) {
  const double max_dwh = std::log(1000.0 / 16);
  auto wa = anchors.select(1, 2) - anchors.select(1, 0);
  auto ha = anchors.select(1, 3) - anchors.select(1, 1);
  auto cx = deltas.select(1, 0) * wa + anchors.select(1, 0) + 0.5 * wa;
  auto cy = deltas.select(1, 1) * ha + anchors.select(1, 1) + 0.5 * ha;
  auto w = deltas.select(1, 2).clamp_max(max_dwh).exp() * wa;
  auto h = deltas.select(1, 3).clamp_max(max_dwh).exp() * ha;
  return torch::stack({cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h}, 1);
}

// Clips (x1, y1, x2, y2) boxes to the image; takes [R, 4] or [N, R, 4].
torch::Tensor clip_boxes(const torch::Tensor &boxes, int64_t height, int64_t width) {
  auto flat = boxes.reshape({-1, 4});
  // FACT: b = torch.rand(2, 5, 4) * 900; f = b.reshape(-1, 4); f[:, 0::2].clamp_(0, 639); assert shares_storage(f, b) and b[..., 0::2].max() <= 639
  flat.slice(1, 0, 4, 2).clamp_(0, width - 1); // EXPECT: tensor-alias-then-mutate -- reshape of a contiguous tensor is a view: the caller's boxes are clipped too
  flat.slice(1, 1, 4, 2).clamp_(0, height - 1); // EXPECT: tensor-alias-then-mutate
  return flat.view(boxes.sizes());
}

torch::Tensor nms(const torch::Tensor &boxes, const torch::Tensor &scores, double iou_thr) {
  auto x1 = boxes.select(1, 0), y1 = boxes.select(1, 1), x2 = boxes.select(1, 2), y2 = boxes.select(1, 3);
  auto areas = (x2 - x1) * (y2 - y1);
  auto order = std::get<1>(scores.sort(0, /*descending=*/true));
  std::vector<int64_t> keep;
  while (order.numel() > 0) {
    int64_t i = order[0].item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the index steers the loop: it is data, not a sum or a log line
    keep.push_back(i);
    auto rest = order.slice(0, 1);
    auto w = (torch::min(x2.index_select(0, rest), x2[i]) - torch::max(x1.index_select(0, rest), x1[i])).clamp_min(0);
    auto h = (torch::min(y2.index_select(0, rest), y2[i]) - torch::max(y1.index_select(0, rest), y1[i])).clamp_min(0);
    auto inter = w * h;
    auto iou = inter / (areas[i] + areas.index_select(0, rest) - inter);
    order = rest.index_select(0, (iou <= iou_thr).nonzero().squeeze(1));
  }
  return torch::tensor(keep, torch::kLong);
}

struct Detections {
  torch::Tensor boxes, scores, labels;
};

std::vector<Detections> postprocess(DetHead &head, const torch::Tensor &feat, const torch::Tensor &anchors,
                                    int64_t height, int64_t width, double score_thr, double iou_thr) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  head->to(device);
  auto out = head->forward(feat.to(device));
  auto probs = torch::sigmoid(out.first); // [N, R, K]
  // FACT: with torch.no_grad(): p = torch.sigmoid(torch.nn.Linear(3, 2)(torch.randn(4, 3))); p.masked_fill_(p < 0.5, 0); assert p.grad_fn is None
  probs.masked_fill_(probs < score_thr, 0); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is recorded
  std::vector<Detections> results;
  for (int64_t b = 0; b < probs.size(0); ++b) {
    auto a = anchors.to(device); // EXPECT: tensor-clone-in-loop -- the same anchors are copied to the GPU for every image
    auto best = probs[b].max(1);
    auto keep_mask = std::get<0>(best) > score_thr;
    auto scores = std::get<0>(best).index({keep_mask});
    auto labels = std::get<1>(best).index({keep_mask});
    auto boxes = clip_boxes(decode(out.second[b].index({keep_mask}), a.index({keep_mask})), height, width);
    if (scores.numel() == 0) {
      results.push_back({});
      continue;
    }
    auto k = nms(boxes, scores, iou_thr);
    std::cout << "image " << b << ": " << k.size(0) << " boxes, top " << scores.max().item<float>() << "\n"; // EXPECT: tensor-sync-in-loop
    results.push_back({boxes.index_select(0, k).cpu(), // LOOKALIKE: tensor-sync-in-loop, tensor-clone-in-loop -- the per-image result is kept
                       scores.index_select(0, k).cpu(), labels.index_select(0, k).cpu()});
  }
  return results;
}

// Fixed-size int32 pixel boxes and int64 labels for the export side: [max_det, 4], [max_det].
std::pair<torch::Tensor, torch::Tensor> pack(const Detections &d, int64_t max_det) {
  auto pix = torch::full({max_det, 4}, -1, torch::kInt);
  auto cls = torch::full({max_det}, -1, torch::kLong);
  auto n = std::min<int64_t>(d.boxes.size(0), max_det);
  // FACT: out = torch.full((2, 4), -1, dtype=torch.int32); out.narrow(0, 0, 1).copy_(torch.tensor([[10.9, 3.7, 99.99, 40.5]])); assert out[0].tolist() == [10, 3, 99, 40]
  pix.narrow(0, 0, n).copy_(d.boxes.narrow(0, 0, n)); // EXPECT: tensor-copy-narrowing -- float coordinates truncated toward zero
  // FACT: out = torch.full((3,), -1); out.narrow(0, 0, 2).copy_(torch.tensor([7, 2**40])); assert out.tolist() == [7, 2**40, -1]
  cls.narrow(0, 0, n).copy_(d.labels.narrow(0, 0, n)); // LOOKALIKE: tensor-copy-narrowing -- int64 class ids into an int64 buffer
  return {pix, cls};
}
