// SuperPoint-style interest points and descriptors: a shared VGG encoder (stride 8), a detector
// head whose 65-channel logits (64 cell bins + dustbin) go through a depth-to-space into a
// full-resolution heatmap, max-pool NMS, descriptors bilinearly sampled at the keypoints with
// grid_sample, and mutual nearest-neighbour matching between two images.
#include <torch/torch.h>

#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct SuperPointConfig {
  int64_t descriptor_dim = 256;
  int64_t cell = 8;
  int64_t nms_radius = 4;
  double keypoint_threshold = 0.005;
  int64_t max_keypoints = 1024;
  int64_t remove_borders = 4;
  double match_threshold = 0.7;  // minimum cosine similarity of a match
  double desc_weight = 1.0;
  double lr = 1e-4;
  int64_t log_every = 100;
};

struct SuperPointOutput {
  torch::Tensor semi;  // [B, 65, H/8, W/8] detector logits
  torch::Tensor desc;  // [B, D, H/8, W/8] L2-normalised coarse descriptors
};

struct Keypoints {
  torch::Tensor xy;     // [N, 2] float pixel coordinates (x, y)
  torch::Tensor score;  // [N]
  torch::Tensor desc;   // [N, D]
};

struct PairBatch {
  torch::Tensor image0, image1;    // [B, 1, H, W]
  torch::Tensor labels0, labels1;  // [B, H/8, W/8] int64 cell bin, 64 = no keypoint
  torch::Tensor grid0, grid1;      // [B, 1, N, 2] corresponding points in [-1, 1]
};

struct SuperPointImpl : torch::nn::Module {
  explicit SuperPointImpl(const SuperPointConfig& cfg) {
    const int64_t widths[] = {64, 64, 128, 128};
    int64_t in = 1;
    encoder = register_module("encoder", torch::nn::Sequential());
    for (int stage = 0; stage < 4; ++stage) {
      for (int j = 0; j < 2; ++j) {
        encoder->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, widths[stage], 3).padding(1)));
        encoder->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
        in = widths[stage];
      }
      if (stage < 3) encoder->push_back(torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(2)));
    }
    convPa = register_module("convPa", torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).padding(1)));
    convPb = register_module("convPb", torch::nn::Conv2d(torch::nn::Conv2dOptions(256, 65, 1)));
    convDa = register_module("convDa", torch::nn::Conv2d(torch::nn::Conv2dOptions(128, 256, 3).padding(1)));
    convDb = register_module("convDb", torch::nn::Conv2d(torch::nn::Conv2dOptions(256, cfg.descriptor_dim, 1)));
    torch::nn::init::xavier_uniform_(convDb->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad
    temperature = register_parameter("temperature", torch::full({1}, 0.1));
  }

  SuperPointOutput forward(const torch::Tensor& image) {
    auto feat = encoder->forward(image);
    auto semi = convPb(torch::relu(convPa(feat)));
    auto desc = convDb(torch::relu(convDa(feat)));
    return {semi, F::normalize(desc, F::NormalizeFuncOptions().p(2).dim(1))};
  }

  torch::nn::Sequential encoder{nullptr};
  torch::nn::Conv2d convPa{nullptr}, convPb{nullptr}, convDa{nullptr}, convDb{nullptr};
  torch::Tensor temperature;
};
TORCH_MODULE(SuperPoint);

// Depth-to-space of the 64 non-dustbin bins: [B, 65, Hc, Wc] -> [B, Hc * cell, Wc * cell].
torch::Tensor logits_to_heatmap(const torch::Tensor& semi, int64_t cell) {
  const auto B = semi.size(0), Hc = semi.size(2), Wc = semi.size(3);
  auto prob = torch::softmax(semi, 1).narrow(1, 0, cell * cell);
  // FACT: s = torch.randn(2, 65, 3, 4).softmax(1); t = s.narrow(1, 0, 64).permute(0, 2, 3, 1); assert is_view_of(t.view(2, 3, 4, 8, 8), s)
  auto cells = prob.permute({0, 2, 3, 1}).view({B, Hc, Wc, cell, cell});  // LOOKALIKE: tensor-view-non-contiguous -- only splits the last dim, which strides can always express
  // FACT: s = torch.randn(2, 65, 3, 4).softmax(1); c = s.narrow(1, 0, 64).permute(0, 2, 3, 1).view(2, 3, 4, 8, 8); assert is_copy_of(c.permute(0, 1, 3, 2, 4).reshape(2, 24, 32), s)
  return cells.permute({0, 1, 3, 2, 4}).reshape({B, Hc * cell, Wc * cell});  // EXPECT: tensor-reshape-non-contiguous
}

torch::Tensor simple_nms(const torch::Tensor& scores, int64_t radius) {
  auto pool = [radius](const torch::Tensor& x) {
    return F::max_pool2d(x.unsqueeze(1), F::MaxPool2dFuncOptions(2 * radius + 1).stride(1).padding(radius)).squeeze(1);
  };
  auto zeros = torch::zeros_like(scores);
  auto max_mask = scores == pool(scores);
  for (int i = 0; i < 2; ++i) {
    auto supp_mask = pool(max_mask.to(scores.scalar_type())) > 0;  // LOOKALIKE: tensor-clone-in-loop -- max_mask is reassigned every pass
    auto supp_scores = torch::where(supp_mask, zeros, scores);
    auto new_max_mask = supp_scores == pool(supp_scores);
    max_mask = max_mask | (new_max_mask & supp_mask.logical_not());
  }
  return torch::where(max_mask, scores, zeros);
}

// heat: [H, W] NMS'd scores of one image (a temporary of the caller).
Keypoints extract_keypoints(torch::Tensor heat, const SuperPointConfig& cfg) {
  const auto H = heat.size(0), W = heat.size(1), b = cfg.remove_borders;
  // FACT: h = torch.ones(6, 7); h.narrow(0, 0, 2).zero_(); h.narrow(1, 5, 2).zero_(); assert h.sum() == 4 * 5
  heat.narrow(0, 0, b).zero_();  // LOOKALIKE: tensor-alias-then-mutate -- explicit narrow views of a map nobody reads afterwards
  heat.narrow(0, H - b, b).zero_();
  heat.narrow(1, 0, b).zero_();
  heat.narrow(1, W - b, b).zero_();

  auto ij = torch::nonzero(heat > cfg.keypoint_threshold);  // [N, 2] (row, col)
  auto score = heat.index({ij.select(1, 0), ij.select(1, 1)});
  if (score.size(0) > cfg.max_keypoints) {
    auto top = torch::topk(score, cfg.max_keypoints);
    score = std::get<0>(top);
    ij = ij.index_select(0, std::get<1>(top));
  }
  return {ij.flip({1}).to(torch::kFloat), score, torch::Tensor()};
}

// keypoints: [N, 2] pixel (x, y); desc_map: [1, D, Hc, Wc] -> [N, D]
torch::Tensor sample_descriptors(const torch::Tensor& keypoints, const torch::Tensor& desc_map, int64_t s) {
  const auto D = desc_map.size(1), Hc = desc_map.size(2), Wc = desc_map.size(3);
  const double half = s / 2.0 - 0.5;
  auto extent = torch::tensor(std::vector<float>{float(Wc * s - half - 1.0), float(Hc * s - half - 1.0)});
  auto kp = keypoints.to(torch::kFloat);
  // FACT: k = torch.rand(5, 2) * 64; kp = k.to(torch.float32); kp.sub_(3.5).div_(torch.tensor([60.0, 44.0])); assert shares_storage(k, kp) and k.max() < 2
  kp.sub_(half).div_(extent.to(kp.device()));  // EXPECT: tensor-alias-then-mutate
  auto grid = (kp * 2 - 1).view({1, 1, -1, 2});
  auto d = F::grid_sample(desc_map, grid, F::GridSampleFuncOptions().mode(torch::kBilinear).align_corners(true));
  // FACT: m = torch.randn(1, 8, 3, 4); g = torch.rand(1, 1, 5, 2) * 2 - 1; d = torch.nn.functional.grid_sample(m, g, align_corners=True); assert is_contiguous(d) and is_view_of(d.reshape(8, -1), d)
  d = F::normalize(d.reshape({D, -1}), F::NormalizeFuncOptions().p(2).dim(0));  // LOOKALIKE: tensor-reshape-non-contiguous -- grid_sample returns a fresh contiguous [1, D, 1, N]
  return d.t();
}

struct Matches {
  torch::Tensor idx0, idx1, sim;
  torch::Tensor xy0, xy1;
};

Matches mutual_nn_match(const torch::Tensor& d0, const torch::Tensor& d1, double min_sim) {
  auto sim = torch::matmul(d0, d1.t());  // [N0, N1] cosine similarities
  auto best = sim.max(1);
  auto best01 = std::get<0>(best), nn01 = std::get<1>(best);
  auto nn10 = std::get<1>(sim.max(0));
  auto ids0 = torch::arange(d0.size(0));
  auto mutual = nn10.index_select(0, nn01) == ids0;  // EXPECT: tensor-device-mismatch
  auto keep = torch::nonzero(mutual & (best01 > min_sim)).squeeze(1);
  return {keep, nn01.index_select(0, keep), best01.index_select(0, keep), {}, {}};
}

Matches match_pair(SuperPoint& net, const torch::Tensor& img0, const torch::Tensor& img1,
                   const SuperPointConfig& cfg) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  net->eval();
  torch::NoGradGuard no_grad;
  auto detect = [&](const torch::Tensor& img) {
    auto out = net->forward(img.to(device));
    auto heat = simple_nms(logits_to_heatmap(out.semi, cfg.cell), cfg.nms_radius);
    Keypoints k = extract_keypoints(heat[0], cfg);
    k.desc = sample_descriptors(k.xy, out.desc.narrow(0, 0, 1), cfg.cell);
    return k;
  };
  Keypoints k0 = detect(img0);
  Keypoints k1 = detect(img1);
  Matches m = mutual_nn_match(k0.desc, k1.desc, cfg.match_threshold);
  m.xy0 = k0.xy.index_select(0, m.idx0).cpu();
  m.xy1 = k1.xy.index_select(0, m.idx1).cpu();
  return m;
}

// InfoNCE over corresponding points of a homographic pair.
torch::Tensor sparse_desc_loss(const torch::Tensor& desc0, const torch::Tensor& desc1, const torch::Tensor& grid0,
                               const torch::Tensor& grid1, const torch::Tensor& temperature) {
  const auto D = desc0.size(1);
  auto opts = F::GridSampleFuncOptions().mode(torch::kBilinear).align_corners(true);
  auto s0 = F::grid_sample(desc0, grid0, opts).squeeze(2);  // [B, D, N]
  auto s1 = F::grid_sample(desc1, grid1, opts).squeeze(2);
  // FACT: x = torch.randn(2, 8, 1, 5).squeeze(2); assert raises(lambda: x.transpose(1, 2).view(-1, 8), "view size is not compatible")
  auto f0 = s0.transpose(1, 2).view({-1, D});  // EXPECT: tensor-view-non-contiguous
  // FACT: x = torch.randn(2, 8, 1, 5).squeeze(2); y = x.permute(0, 2, 1).contiguous(); assert is_view_of(y.view(-1, 8), y)
  auto f1 = s1.permute({0, 2, 1}).contiguous().view({-1, D});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
  auto logits = F::normalize(f0, F::NormalizeFuncOptions().dim(1)).matmul(F::normalize(f1, F::NormalizeFuncOptions().dim(1)).t()) / temperature;
  auto labels = torch::arange(f0.size(0), torch::TensorOptions().dtype(torch::kLong).device(f0.device()));
  return F::cross_entropy(logits, labels);
}

// Descriptor history of a tracked set of keypoints over the last L frames.
class DescriptorTrack {
 public:
  DescriptorTrack(int64_t len, int64_t max_kp, int64_t dim)
      : hist_(torch::zeros({len, max_kp, dim})), xy_hist_(torch::zeros({len, max_kp, 2})) {}

  void push(const Keypoints& k) {
    const auto L = hist_.size(0), n = std::min(k.desc.size(0), hist_.size(1));
    // FACT: h = torch.randn(5, 4, 3); assert raises(lambda: h.narrow(0, 0, 4).copy_(h.narrow(0, 1, 4)), "some elements")
    hist_.narrow(0, 0, L - 1).copy_(hist_.narrow(0, 1, L - 1));  // EXPECT: tensor-inplace-overlap
    for (int64_t t = 0; t + 1 < L; ++t) {
      // FACT: h = torch.arange(12.).view(4, 3); [h[t].copy_(h[t + 1]) for t in range(3)]; assert h[0].tolist() == [3.0, 4.0, 5.0]
      xy_hist_[t].copy_(xy_hist_[t + 1]);  // LOOKALIKE: tensor-inplace-overlap -- whole rows by index, source and destination disjoint
    }
    hist_[L - 1].zero_();
    xy_hist_[L - 1].zero_();
    hist_[L - 1].narrow(0, 0, n).copy_(k.desc.narrow(0, 0, n));
    xy_hist_[L - 1].narrow(0, 0, n).copy_(k.xy.narrow(0, 0, n));
  }

  torch::Tensor mean_descriptor() const {
    auto h = hist_.clone();  // EXPECT: tensor-unnecessary-clone
    return F::normalize(h.mean(0), F::NormalizeFuncOptions().dim(1));
  }

 private:
  torch::Tensor hist_, xy_hist_;
};

void train_superpoint(SuperPoint& net, const std::vector<PairBatch>& data, const SuperPointConfig& cfg) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  net->train();
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  int64_t step = 0;
  for (const auto& pb : data) {
    auto img0 = pb.image0.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different pair every step
    auto img1 = pb.image1.to(device);
    auto out0 = net->forward(img0);
    auto out1 = net->forward(img1);
    auto det = F::cross_entropy(out0.semi, pb.labels0.to(device)) + F::cross_entropy(out1.semi, pb.labels1.to(device));
    auto desc = sparse_desc_loss(out0.desc, out1.desc, pb.grid0.to(device), pb.grid1.to(device), net->temperature);
    auto loss = det + cfg.desc_weight * desc;

    opt.zero_grad();
    loss.backward();
    opt.step();
    net->temperature.clamp_(0.01, 1.0);  // EXPECT: tensor-inplace-on-leaf

    std::cout << "step " << step << " det " << det.item<float>() << '\n';  // EXPECT: tensor-sync-in-loop
    if (++step % cfg.log_every == 0)
      std::cout << "  loss " << loss.item<float>() << " temperature " << net->temperature.item<float>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
}
