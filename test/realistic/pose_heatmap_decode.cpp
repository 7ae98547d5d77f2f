// Top-down human pose estimation with stacked hourglass-style heatmap heads: Gaussian heatmap
// targets, a per-joint weighted MSE with intermediate supervision, argmax (quarter-pixel shift) or
// integral soft-argmax decoding, flip-test averaging and PCK@0.2 on the validation set.
#include <torch/torch.h>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

struct PoseConfig {
  int64_t num_joints = 17, input_h = 256, input_w = 192, heatmap_h = 64, heatmap_w = 48;
  int64_t channels = 128, n_stacks = 2, log_every = 100;
  double sigma = 2.0, beta = 50.0, pck_thresh = 0.2, lr = 1e-3;
  bool soft_argmax = false;
  // COCO order: the left/right swap for flipped images, and the per-joint loss weights.
  std::vector<int64_t> flip_perm = {0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15};
  std::vector<float> joint_weights = {1., 1., 1., 1., 1., 1., 1., 1.2, 1.2, 1.5, 1.5, 1., 1., 1.2, 1.2, 1.5, 1.5};
};

// One batch: images [B, 3, Hi, Wi], heatmaps [B, J, H, W], joints [B, J, 3] (x, y in input
// pixels, visibility), vis [B, J], bbox_size [B] (the person box's longer side).
struct PoseBatch {
  torch::Tensor images, heatmaps, joints, vis, bbox_size;
};

class PoseLoader {
public:
  virtual ~PoseLoader() = default;
  virtual void reset() = 0;
  virtual bool next(PoseBatch &batch) = 0;
};

// Targets of one person: joints [J, 3] -> heatmaps [J, H, W] and visibility weights [J].
std::pair<torch::Tensor, torch::Tensor> make_targets(const torch::Tensor &joints, const PoseConfig &cfg) {
  const auto J = joints.size(0), H = cfg.heatmap_h, W = cfg.heatmap_w;
  const double feat_stride = double(cfg.input_w) / W;
  // FACT: j = torch.rand(17, 3); m = j.select(1, 0); assert not is_contiguous(m) and is_view_of(m.view(17, 1, 1), j)
  auto mu_x = joints.select(1, 0).view({J, 1, 1}) / feat_stride; // LOOKALIKE: tensor-view-non-contiguous -- a strided column gets only size-1 dims: always a view
  auto mu_y = joints.select(1, 1).view({J, 1, 1}) / feat_stride;
  auto xs = torch::arange(W, torch::kFloat).view({1, 1, W});
  auto ys = torch::arange(H, torch::kFloat).view({1, H, 1});
  auto heatmaps = torch::exp(-((xs - mu_x).pow(2) + (ys - mu_y).pow(2)) / (2 * cfg.sigma * cfg.sigma));
  auto in_map = (mu_x >= 0) & (mu_x < W) & (mu_y >= 0) & (mu_y < H);
  auto keep = (joints.select(1, 2).view({J, 1, 1}) > 0) & in_map;
  // FACT: j = torch.rand(4, 3); h = torch.exp(-j); h.mul_(j > 0.5); assert not h.requires_grad and h.grad_fn is None
  heatmaps.mul_(keep); // LOOKALIKE: tensor-inplace-on-saved -- dataset tensors: exp recorded nothing
  return {heatmaps, keep.view({J}).to(torch::kFloat)};
}

struct HourglassStackImpl : torch::nn::Module {
  HourglassStackImpl(int64_t C, int64_t J) {
    namespace nn = torch::nn;
    down_ = register_module("down", nn::Conv2d(nn::Conv2dOptions(C, C, 3).stride(2).padding(1)));
    up_ = register_module("up", nn::Conv2d(nn::Conv2dOptions(C, C, 3).padding(1)));
    bn_ = register_module("bn", nn::BatchNorm2d(C));
    head_ = register_module("head", nn::Conv2d(nn::Conv2dOptions(C, J, 1)));
    remap_ = register_module("remap", nn::Conv2d(nn::Conv2dOptions(J, C, 1)));
  }
  // x [B, C, H, W] -> (heatmaps [B, J, H, W], features for the next stack).
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    namespace F = torch::nn::functional;
    auto d = torch::relu(down_(x));
    auto u = F::interpolate(d, F::InterpolateFuncOptions()
                                   .size(std::vector<int64_t>{x.size(2), x.size(3)})
                                   .mode(torch::kNearest));
    u = torch::relu(bn_(up_(u))) + x;
    auto hm = head_(u);
    return {hm, u + remap_(hm)};
  }
  torch::nn::Conv2d down_{nullptr}, up_{nullptr}, head_{nullptr}, remap_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(HourglassStack);

struct PoseNetImpl : torch::nn::Module {
  explicit PoseNetImpl(const PoseConfig &cfg) {
    namespace nn = torch::nn;
    stem_ = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, cfg.channels, 7).stride(2).padding(3)),
                                                   nn::BatchNorm2d(cfg.channels), nn::ReLU(),
                                                   nn::Conv2d(nn::Conv2dOptions(cfg.channels, cfg.channels, 3).stride(2).padding(1)),
                                                   nn::BatchNorm2d(cfg.channels), nn::ReLU()));
    stacks_ = register_module("stacks", nn::ModuleList());
    for (int64_t s = 0; s < cfg.n_stacks; ++s)
      stacks_->push_back(HourglassStack(cfg.channels, cfg.num_joints));
  }
  // One heatmap tensor per stack; the last is the prediction.
  std::vector<torch::Tensor> forward(const torch::Tensor &images) {
    auto x = stem_->forward(images);
    std::vector<torch::Tensor> outs;
    for (const auto &m : *stacks_) {
      auto [hm, next] = m->as<HourglassStack>()->forward(x);
      outs.push_back(hm); // LOOKALIKE: tensor-graph-kept-across-iterations -- per-stack outputs returned for the supervised loss
      x = next;
    }
    return outs;
  }
  torch::nn::Sequential stem_{nullptr};
  torch::nn::ModuleList stacks_{nullptr};
};
TORCH_MODULE(PoseNet);

// Weighted MSE of one stack's heatmaps; weight [B, J, 1].
torch::Tensor joints_mse(const torch::Tensor &pred, const torch::Tensor &target, const torch::Tensor &weight) {
  auto gt = target.flatten(2);
  // FACT: t = torch.rand(2, 3, 4, 4); g = t.flatten(2); g.mul_(torch.full((2, 3, 1), 1.5)); assert is_view_of(g, t) and torch.allclose(t.flatten(2), g)
  gt.mul_(weight); // EXPECT: tensor-alias-then-mutate -- flatten of the caller's target is a view: every stack's loss scales the same target again
  return 0.5 * (pred.flatten(2) * weight - gt).pow(2).mean();
}

struct Keypoints {
  torch::Tensor coords, conf; // [B, J, 2] in heatmap pixels, [B, J]
};

Keypoints decode_argmax(const torch::Tensor &heatmaps) {
  const auto B = heatmaps.size(0), J = heatmaps.size(1), H = heatmaps.size(2), W = heatmaps.size(3);
  auto flat = heatmaps.flatten(2);
  auto [maxvals, idx] = flat.max(2); // [B, J]
  auto px = idx.remainder(W), py = idx.div(W, "floor");
  auto coords = torch::empty({B, J, 2}, heatmaps.options());
  // FACT: i = torch.tensor([[47, 3071]]); c = torch.empty(1, 2); c.copy_(i); assert c.tolist() == [[47.0, 3071.0]]
  coords.select(2, 0).copy_(px); // LOOKALIKE: tensor-copy-narrowing -- int64 pixel indices into float32: exact
  coords.select(2, 1).copy_(py);
  // Quarter-pixel shift towards the higher neighbour.
  auto at = [&](const torch::Tensor &y, const torch::Tensor &x) { return flat.gather(2, (y * W + x).unsqueeze(-1)).squeeze(-1); };
  auto cx = px.clamp(1, W - 2), cy = py.clamp(1, H - 2);
  auto dx = at(cy, cx + 1) - at(cy, cx - 1);
  auto dy = at(cy + 1, cx) - at(cy - 1, cx);
  coords.add_(torch::stack({dx.sign(), dy.sign()}, -1) * 0.25);
  return {coords, maxvals};
}

// Integral regression: the expectation of the pixel grid under softmax(beta * heatmap).
Keypoints soft_argmax(const torch::Tensor &heatmaps, double beta) {
  const auto B = heatmaps.size(0), J = heatmaps.size(1), H = heatmaps.size(2), W = heatmaps.size(3);
  // FACT: p = torch.softmax(torch.randn(2, 3, 20), -1); assert is_view_of(p.view(2, 3, 4, 5), p)
  auto probs = torch::softmax(heatmaps.flatten(2) * beta, -1).view({B, J, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- softmax returns a fresh contiguous tensor
  auto x = (probs.sum(2) * torch::arange(W, heatmaps.options())).sum(-1);
  auto y = (probs.sum(3) * torch::arange(H, heatmaps.options())).sum(-1);
  auto coords = torch::stack({x, y}, -1);
  // Confidence: the heatmap value at the nearest pixel.
  auto peak = torch::empty({B, J, 2}, heatmaps.options().dtype(torch::kLong));
  // FACT: c = torch.tensor([[12.8, 3.6]]); p = torch.empty(1, 2, dtype=torch.long); p.copy_(c); assert p.tolist() == [[12, 3]]
  peak.copy_(coords); // EXPECT: tensor-copy-narrowing -- truncates 12.8 to 12: the confidence is read one pixel off
  auto flat_idx = peak.select(2, 1) * W + peak.select(2, 0);
  auto conf = heatmaps.flatten(2).gather(2, flat_idx.unsqueeze(-1)).squeeze(-1);
  return {coords, conf};
}

// Heatmaps of horizontally flipped images back to the original frame, one pixel to the right.
torch::Tensor flip_back(const torch::Tensor &hm_flipped, const torch::Tensor &flip_perm) {
  auto hm = hm_flipped.flip({3}).index_select(1, flip_perm);
  const auto W = hm.size(3);
  // FACT: h = torch.randn(2, 3, 4, 5); ref = h.clone(); ref[..., 1:] = h[..., :-1].clone(); h.narrow(3, 1, 4).copy_(h.narrow(3, 0, 4).clone()); assert torch.equal(h, ref)
  hm.narrow(3, 1, W - 1).copy_(hm.narrow(3, 0, W - 1).clone()); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is cloned first
  return hm;
}

// PCK: share of visible joints within thr * bbox size of the ground truth.
torch::Tensor pck(const torch::Tensor &pred, const torch::Tensor &gt, const torch::Tensor &vis, const torch::Tensor &bbox_size,
                  double thr) {
  auto dist = (pred - gt).norm(2, -1) / bbox_size.unsqueeze(1); // [B, J]
  auto visible = vis > 0;
  auto hits = (dist < thr) & visible;
  return hits.sum().to(torch::kFloat) / visible.sum().clamp_min(1).to(torch::kFloat);
}

void train_epoch(PoseNet &model, PoseLoader &loader, torch::optim::Optimizer &opt, const PoseConfig &cfg, int64_t epoch) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  auto importance = torch::tensor(cfg.joint_weights).to(device); // [J]
  PoseBatch batch;
  int64_t step = 0;
  loader.reset();
  while (loader.next(batch)) {
    auto images = batch.images.to(device);
    auto target = batch.heatmaps.to(device);
    auto vis = batch.vis.to(device);
    auto weight = importance.expand_as(vis);
    // FACT: jw = torch.rand(17); w = jw.expand(4, 17); assert raises(lambda: w.mul_(torch.rand(4, 17)), "more than one element of the written-to tensor")
    weight.mul_(vis); // EXPECT: tensor-inplace-on-expanded -- the joint weights are one row broadcast over the batch
    auto outputs = model->forward(images);
    auto loss = torch::zeros({}, images.options());
    for (const auto &hm : outputs)
      loss = loss + joints_mse(hm, target, weight.unsqueeze(-1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- intermediate supervision: backward() runs on the sum
    opt.zero_grad();
    loss.backward();
    opt.step();
    if (++step % cfg.log_every == 0)
      std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
}

// Flip-test PCK on the validation set; keeps the predictions in input pixels.
double evaluate(PoseNet &model, PoseLoader &loader, const PoseConfig &cfg, const std::string &pred_path) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto flip_perm = torch::tensor(cfg.flip_perm).to(device);
  const double feat_stride = double(cfg.input_w) / cfg.heatmap_w;
  auto to_input = torch::tensor({float(feat_stride), float(cfg.input_h) / cfg.heatmap_h});
  std::vector<torch::Tensor> all_preds;
  double pck_sum = 0;
  int64_t n_batches = 0;
  PoseBatch batch;
  loader.reset();
  while (loader.next(batch)) {
    auto images = batch.images.to(device);
    auto hm = model->forward(images).back();
    auto hm_flip = flip_back(model->forward(images.flip({3})).back(), flip_perm);
    // FACT: m = torch.nn.Conv2d(3, 2, 1); x = torch.randn(1, 3, 4, 4); h = torch.no_grad()(m)(x); h.add_(h.flip(3)).mul_(0.5); assert h.grad_fn is None
    hm.add_(hm_flip).mul_(0.5); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is saved
    auto kp = cfg.soft_argmax ? soft_argmax(hm, cfg.beta) : decode_argmax(hm);
    auto gt = batch.joints.to(device).narrow(2, 0, 2) / feat_stride;
    auto acc = pck(kp.coords, gt, batch.vis.to(device), batch.bbox_size.to(device) / feat_stride, cfg.pck_thresh);
    pck_sum += acc.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every batch for a number that is only summed
    ++n_batches;
    auto pred_input = kp.coords * to_input; // EXPECT: tensor-device-mismatch -- the scale factors were made on the CPU, the keypoints are on CUDA
    all_preds.push_back(pred_input.cpu()); // LOOKALIKE: tensor-sync-in-loop, tensor-graph-kept-across-iterations -- the host copies are the result; no graph under NoGradGuard
  }
  torch::save(torch::cat(all_preds), pred_path);
  return n_batches > 0 ? pck_sum / n_batches : 0.0;
}
