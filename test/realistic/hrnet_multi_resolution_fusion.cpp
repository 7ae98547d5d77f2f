// HRNet-style top-down pose estimation: parallel multi-resolution branches that exchange
// information at the end of every stage, Gaussian heatmap targets, weighted MSE and decoding.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace nn = torch::nn;
using torch::Tensor;

struct PoseConfig {
  int64_t num_joints = 17, base_width = 32, blocks = 2;
  int64_t input_h = 256, input_w = 192, heatmap_h = 64, heatmap_w = 48;
  int64_t batch_size = 8, epochs = 4, ohkm_topk = 8;
  double sigma = 2.0, lr = 1e-3, pck_thresh = 0.5;
};

// COCO left/right joint pairs, used by the flip test
const std::vector<std::pair<int64_t, int64_t>> kFlipPairs = {{1, 2}, {3, 4}, {5, 6}, {7, 8}, {9, 10}, {11, 12}, {13, 14}, {15, 16}};

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

struct BasicBlockImpl : nn::Module {
  explicit BasicBlockImpl(int64_t ch)
      : conv1(register_module("conv1", conv3x3(ch, ch))), conv2(register_module("conv2", conv3x3(ch, ch))),
        bn1(register_module("bn1", nn::BatchNorm2d(ch))), bn2(register_module("bn2", nn::BatchNorm2d(ch))) {}

  Tensor forward(const Tensor& x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    // FACT: y = torch.nn.BatchNorm2d(3)(torch.randn(2, 3, 4, 4, requires_grad=True)); assert not backward_fails(lambda: (y.add_(1.0), y.sum().backward()))
    out += x; // LOOKALIKE: tensor-inplace-on-saved -- batch norm's backward keeps its input, not its output
    return torch::relu(out);
  }

  nn::Conv2d conv1, conv2;
  nn::BatchNorm2d bn1, bn2;
};
TORCH_MODULE(BasicBlock);

// One high-resolution module: a stack of blocks per branch, then every branch receives
// the sum of all branches brought to its resolution and width.
struct HRModuleImpl : nn::Module {
  HRModuleImpl(const std::vector<int64_t>& widths, int64_t blocks) : n(widths.size()) {
    for (size_t i = 0; i < n; ++i) {
      nn::Sequential branch;
      for (int64_t b = 0; b < blocks; ++b) branch->push_back(BasicBlock(widths[i]));
      branches->push_back(branch);
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        nn::Sequential f;
        if (j > i) {
          const double scale = std::pow(2.0, static_cast<double>(j - i));
          f->push_back(nn::Conv2d(nn::Conv2dOptions(widths[j], widths[i], 1).bias(false)));
          f->push_back(nn::BatchNorm2d(widths[i]));
          f->push_back(nn::Upsample(nn::UpsampleOptions().scale_factor(std::vector<double>{scale, scale}).mode(torch::kNearest)));
        }
        for (size_t k = 0; j < i && k < i - j; ++k) {
          const bool last = k + 1 == i - j;
          f->push_back(conv3x3(widths[j], last ? widths[i] : widths[j], 2));
          f->push_back(nn::BatchNorm2d(last ? widths[i] : widths[j]));
          if (!last) f->push_back(nn::ReLU());
        }
        fuse->push_back(f);
      }
    }
    register_module("branches", branches);
    register_module("fuse", fuse);
  }

  Tensor fuse_from(size_t i, size_t j, const Tensor& x) { return fuse[i * n + j]->as<nn::Sequential>()->forward(x); }

  std::vector<Tensor> forward(std::vector<Tensor> x) {
    for (size_t i = 0; i < n; ++i) x[i] = branches[i]->as<nn::Sequential>()->forward(x[i]);
    std::vector<Tensor> out;
    for (size_t i = 0; i < n; ++i) {
      Tensor y = i == 0 ? x[0] : fuse_from(i, 0, x[0]);
      for (size_t j = 1; j < n; ++j) {
        // FACT: x = [torch.relu(torch.randn(2, 3, requires_grad=True))]; y = x[0]; assert backward_fails(lambda: (y.add_(1.0), x[0].sum().backward())) and shares_storage(y, x[0])
        if (j != i) y += fuse_from(i, j, x[j]); // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
        // FACT: x = torch.randn(4, 3); y = torch.nn.BatchNorm1d(3)(x); assert is_copy_of(y, x)
        else y += x[j]; // LOOKALIKE: tensor-alias-then-mutate -- only reached for i > 0, where y is a fresh fuse output
      }
      out.push_back(torch::relu(y));
    }
    return out;
  }

  size_t n;
  nn::ModuleList branches, fuse;
};
TORCH_MODULE(HRModule);

struct PoseHRNetImpl : nn::Module {
  explicit PoseHRNetImpl(const PoseConfig& c) {
    stem = register_module("stem", nn::Sequential(conv3x3(3, 64, 2), nn::BatchNorm2d(64), nn::ReLU(),
                                                  conv3x3(64, 64, 2), nn::BatchNorm2d(64), nn::ReLU()));
    std::vector<int64_t> widths;
    for (int64_t i = 0; i < 4; ++i) widths.push_back(c.base_width << i);
    first_branch = register_module("first_branch", nn::Sequential(conv3x3(64, widths[0]), nn::BatchNorm2d(widths[0]), nn::ReLU()));
    for (size_t s = 0; s < 3; ++s) {
      const int64_t in_ch = s == 0 ? 64 : widths[s];
      transitions->push_back(nn::Sequential(conv3x3(in_ch, widths[s + 1], 2), nn::BatchNorm2d(widths[s + 1]), nn::ReLU()));
      stages->push_back(HRModule(std::vector<int64_t>(widths.begin(), widths.begin() + s + 2), c.blocks));
    }
    register_module("transitions", transitions);
    register_module("stages", stages);
    final_layer = register_module("final_layer", nn::Conv2d(nn::Conv2dOptions(widths[0], c.num_joints, 1)));
    init_weights();
  }

  void init_weights() {
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<nn::Conv2d>()) {
        nn::init::normal_(conv->weight, 0.0, 0.001); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills under a NoGradGuard
        // FACT: b = torch.nn.Conv2d(2, 2, 1).bias; assert raises(lambda: b.zero_(), "leaf Variable")
        if (conv->bias.defined()) conv->bias.zero_(); // EXPECT: tensor-inplace-on-leaf
      } else if (auto* bn = m->as<nn::BatchNorm2d>()) {
        nn::init::ones_(bn->weight);
        nn::init::zeros_(bn->bias);
      }
    }
  }

  Tensor forward(const Tensor& img) {
    auto x = stem->forward(img);
    std::vector<Tensor> xs{first_branch->forward(x), transitions[0]->as<nn::Sequential>()->forward(x)};
    for (size_t s = 0; s < stages->size(); ++s) {
      if (s > 0) xs.push_back(transitions[s]->as<nn::Sequential>()->forward(xs.back()));
      xs = stages[s]->as<HRModule>()->forward(xs);
    }
    return final_layer(xs[0]);
  }

  nn::Sequential stem{nullptr}, first_branch{nullptr};
  nn::ModuleList transitions, stages;
  nn::Conv2d final_layer{nullptr};
};
TORCH_MODULE(PoseHRNet);

struct Sample { Tensor image, joints, visible; };  // joints in input pixels

std::pair<Tensor, Tensor> make_target(const Sample& s, const PoseConfig& cfg) {
  const double stride = static_cast<double>(cfg.input_w) / cfg.heatmap_w;
  auto xs = torch::arange(cfg.heatmap_w, torch::kFloat).view({1, -1});
  auto ys = torch::arange(cfg.heatmap_h, torch::kFloat).view({-1, 1});
  auto target = torch::zeros({cfg.num_joints, cfg.heatmap_h, cfg.heatmap_w});
  auto weight = torch::zeros({cfg.num_joints});
  // FACT: w = torch.zeros(3); v = torch.tensor([True, False, True]); w.copy_(v); assert w.dtype == torch.float32 and w.sum().item() == 2
  weight.copy_(s.visible); // LOOKALIKE: tensor-copy-narrowing -- bool flags widen into float weights
  auto j = s.joints.accessor<float, 2>();
  for (int64_t k = 0; k < cfg.num_joints; ++k) {
    const double mx = j[k][0] / stride, my = j[k][1] / stride;
    if (mx < 0 || my < 0 || mx >= cfg.heatmap_w || my >= cfg.heatmap_h) { weight[k] = 0.0; continue; }
    auto g = (xs - mx).pow(2) + (ys - my).pow(2);
    // FACT: xs = torch.arange(4.).view(1, -1); ys = torch.arange(3.).view(-1, 1); g = (xs - 1) ** 2 + (ys - 1) ** 2; assert g.shape == (3, 4) and 0 not in g.stride() and not raises(lambda: g.div_(-8.0).exp_())
    g.div_(-2.0 * cfg.sigma * cfg.sigma).exp_(); // LOOKALIKE: tensor-inplace-on-expanded -- the broadcasting sum allocated a full-size map
    target[k].copy_(g);
  }
  return {target, weight};
}

// weighted heatmap MSE with online hard keypoint mining; also the per-joint error for logging
std::pair<Tensor, Tensor> joints_mse(const Tensor& pred, const Tensor& target, const Tensor& target_weight,
                                     const Tensor& joint_w, const PoseConfig& cfg) {
  const auto K = pred.size(1);
  auto w = joint_w.expand_as(target_weight);
  // FACT: jw = torch.ones(3); tw = torch.rand(2, 3); assert raises(lambda: jw.expand_as(tw).mul_(tw), "more than one element")
  w.mul_(target_weight); // EXPECT: tensor-inplace-on-expanded
  auto sq = (pred - target).pow(2) * w.unsqueeze(-1).unsqueeze(-1);
  auto per_sample = 0.5 * sq.mean({2, 3});
  auto hard = std::get<0>(per_sample.topk(cfg.ohkm_topk, 1));
  // FACT: s = torch.rand(2, 4, 3, 3).transpose(0, 1); assert not is_contiguous(s) and is_copy_of(s.reshape(4, -1), s)
  auto per_joint = sq.detach().transpose(0, 1).reshape({K, -1}).mean(1); // EXPECT: tensor-reshape-non-contiguous
  return {hard.mean(), per_joint};
}

struct Keypoints { Tensor xy, score; };  // xy goes to the drawing code, score is the peak value

Keypoints decode_heatmaps(const Tensor& heat, const PoseConfig& cfg) {
  const auto B = heat.size(0), K = heat.size(1), H = heat.size(2), W = heat.size(3);
  auto flat = heat.reshape({B, K, -1});
  auto best = flat.max(2);
  auto idx = std::get<1>(best);
  auto x = idx.remainder(W), y = idx.div(W, "floor");
  auto at = [&](const Tensor& yy, const Tensor& xx) { return flat.gather(2, (yy * W + xx).unsqueeze(-1)).squeeze(-1); };
  auto dx = at(y, (x + 1).clamp_max(W - 1)) - at(y, (x - 1).clamp_min(0));
  auto dy = at((y + 1).clamp_max(H - 1), x) - at((y - 1).clamp_min(0), x);
  // quarter-pixel shift towards the higher neighbour, then back to input pixels
  auto coords = (torch::stack({x, y}, -1).to(heat.scalar_type()) + 0.25 * torch::stack({dx.sign(), dy.sign()}, -1)) *
                (static_cast<double>(cfg.input_w) / W);
  auto xy = torch::zeros({B, K, 2}, heat.options().dtype(torch::kInt));
  xy.copy_(coords); // EXPECT: tensor-copy-narrowing
  return {xy, std::get<0>(best)};
}

Tensor flip_test(PoseHRNet& model, const Tensor& images) {
  auto heat = model(images);
  auto input = images.clone(); // EXPECT: tensor-unnecessary-clone
  auto hf = torch::flip(model(torch::flip(input, {3})), {3});
  for (auto [a, b] : kFlipPairs) {
    auto tmp = hf.select(1, a).clone(); // LOOKALIKE: tensor-unnecessary-clone -- channel a is overwritten on the next line
    // FACT: h = torch.randn(1, 4, 2, 2); r = h[:, 1].clone(); h.select(1, 0).copy_(h.select(1, 1)); assert torch.equal(h[:, 0], r)
    hf.select(1, a).copy_(hf.select(1, b)); // LOOKALIKE: tensor-inplace-overlap -- two different joint channels share no element
    hf.select(1, b).copy_(tmp);
  }
  // the flipped map sits one pixel to the left
  // FACT: f = torch.arange(10.).view(1, 1, 2, 5); a, b = f[..., 1:], f[..., :-1]; r = b.clone(); a.copy_(b); assert shares_storage(a, b) and not torch.equal(a, r)
  hf.narrow(3, 1, hf.size(3) - 1).copy_(hf.narrow(3, 0, hf.size(3) - 1)); // EXPECT: tensor-inplace-overlap
  return (heat + hf) * 0.5;
}

struct AverageMeter {
  double sum = 0.0;
  int64_t count = 0;
  void update(double v, int64_t n) { sum += v * n; count += n; }
  double avg() const { return count ? sum / count : 0.0; }
};

double pck(const Keypoints& kp, const Tensor& joints, const Tensor& visible, double thresh_px) {
  auto dist = (kp.xy.to(torch::kFloat) - joints).norm(2, -1);
  auto hit = (dist < thresh_px).logical_and(visible);
  return hit.sum().item<double>() / std::max(1.0, visible.sum().item<double>());
}

std::pair<Tensor, std::vector<Tensor>> collate(const std::vector<Sample>& data, size_t start, const PoseConfig& cfg) {
  std::vector<Tensor> imgs, targets, weights, joints, vis;
  for (size_t i = start; i < start + cfg.batch_size; ++i) {
    auto [t, w] = make_target(data[i], cfg);
    imgs.push_back(data[i].image), targets.push_back(t), weights.push_back(w);
    joints.push_back(data[i].joints), vis.push_back(data[i].visible);
  }
  return {torch::stack(imgs), {torch::stack(targets), torch::stack(weights), torch::stack(joints), torch::stack(vis)}};
}

void train(PoseHRNet& model, const std::vector<Sample>& data, const std::vector<Sample>& val, const PoseConfig& cfg,
           torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto joint_w = torch::ones({cfg.num_joints});
  joint_w.narrow(0, 11, 6).fill_(1.5);  // hips, knees, ankles
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    AverageMeter loss_meter;
    std::vector<Tensor> train_heat;
    auto joint_err = torch::zeros({cfg.num_joints}, device);
    for (size_t start = 0; start + cfg.batch_size <= data.size(); start += cfg.batch_size) {
      auto [images, rest] = collate(data, start, cfg);
      images = images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
      auto heat = model(images);
      auto [loss, per_joint] = joints_mse(heat, rest[0].to(device), rest[1].to(device), joint_w.to(device), cfg); // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      opt.step();
      loss_meter.update(loss.item<double>(), images.size(0)); // EXPECT: tensor-sync-in-loop
      train_heat.push_back(heat); // EXPECT: tensor-graph-kept-across-iterations
      joint_err += per_joint; // LOOKALIKE: tensor-graph-kept-across-iterations -- per_joint was computed from detached errors, no graph rides along
    }
    model->eval();
    torch::NoGradGuard no_grad;
    std::vector<Tensor> val_heat, val_joints, val_vis;
    for (size_t start = 0; start + cfg.batch_size <= val.size(); start += cfg.batch_size) {
      auto [images, rest] = collate(val, start, cfg);
      val_heat.push_back(flip_test(model, images.to(device))); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard no graph is recorded
      val_joints.push_back(rest[2]), val_vis.push_back(rest[3]);
    }
    auto kp = decode_heatmaps(torch::cat(val_heat), cfg);
    const double acc = pck(kp, torch::cat(val_joints).to(device), torch::cat(val_vis).to(device), cfg.pck_thresh * cfg.input_w / 10.0);
    std::printf("epoch %lld loss %.6f worst joint %lld val PCK %.3f (%zu maps)\n", static_cast<long long>(epoch), loss_meter.avg(),
                static_cast<long long>(joint_err.argmax().item<int64_t>()), acc, train_heat.size());
  }
}

std::vector<Sample> synthetic(const PoseConfig& cfg, int n) {
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    auto joints = torch::rand({cfg.num_joints, 2}) * torch::tensor({static_cast<float>(cfg.input_w), static_cast<float>(cfg.input_h)});
    out.push_back({torch::rand({3, cfg.input_h, cfg.input_w}), joints, torch::rand({cfg.num_joints}) > 0.2});
  }
  return out;
}

int main() {
  PoseConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  PoseHRNet model(cfg);
  model->to(device);
  train(model, synthetic(cfg, 64), synthetic(cfg, 16), cfg, device);
  return 0;
}
