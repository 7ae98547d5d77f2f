// DINO (Caron et al. 2021): self-distillation with no labels. A ViT student sees two global and
// several local crops of each image; a teacher (an EMA of the student) sees only the global ones.
// The student matches the teacher's centred, sharpened distribution over K prototypes; the center
// is a running mean of the teacher outputs. Monitors: a k-NN probe on labeled images, a collapse
// check on the spread of recent teacher features, and a dump of one image's crops.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct DinoConfig {
  int64_t image_size = 224, patch = 16, embed_dim = 384, depth = 12, heads = 6;
  int64_t out_dim = 65536, hidden_dim = 2048, bottleneck = 256;
  int64_t global_size = 224, local_size = 96, n_local = 8;
  double global_scale_min = 0.4, local_scale_min = 0.05, local_scale_max = 0.4;
  double student_temp = 0.1, teacher_temp = 0.04, warmup_teacher_temp = 0.04;
  int64_t warmup_teacher_epochs = 30, freeze_last_layer = 1;
  double center_momentum = 0.9, momentum_teacher = 0.996;
  double lr = 5e-4, weight_decay = 0.04, clip_grad = 3.0;
  int64_t epochs = 100, batch_size = 64, knn_k = 20, queue_size = 4096, monitor_every = 10;
};

struct VitImpl : torch::nn::Module {
  explicit VitImpl(const DinoConfig &cfg) : grid_(cfg.image_size / cfg.patch) {
    patch_embed = register_module("patch_embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, cfg.embed_dim, cfg.patch).stride(cfg.patch)));
    cls_token = register_parameter("cls_token", torch::zeros({1, 1, cfg.embed_dim}));
    pos_embed = register_parameter("pos_embed", torch::zeros({1, 1 + grid_ * grid_, cfg.embed_dim}));
    torch::nn::init::normal_(cls_token, 0.0, 1e-6);
    // FACT: p = torch.nn.Parameter(torch.zeros(1, 5, 4)); torch.nn.init.normal_(p, 0.0, 0.02); assert p.is_leaf and p.requires_grad
    torch::nn::init::normal_(pos_embed, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    auto layer = torch::nn::TransformerEncoderLayerOptions(cfg.embed_dim, cfg.heads).dim_feedforward(4 * cfg.embed_dim).dropout(0.0).activation(torch::kGELU);
    encoder = register_module("encoder", torch::nn::TransformerEncoder(torch::nn::TransformerEncoderOptions(layer, cfg.depth)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.embed_dim})));
  }

  // Local crops have fewer patches: the position table is resampled to their grid.
  torch::Tensor pos_for(int64_t gh, int64_t gw) {
    if (gh == grid_ && gw == grid_)
      return pos_embed;
    const auto D = pos_embed.size(2);
    auto cls_pos = pos_embed.narrow(1, 0, 1);
    // FACT: p = torch.randn(1, 17, 8); g = p.narrow(1, 1, 16); assert is_contiguous(g) and is_view_of(g.reshape(1, 4, 4, 8), p)
    auto table = pos_embed.narrow(1, 1, grid_ * grid_).reshape({1, grid_, grid_, D}).permute({0, 3, 1, 2}); // LOOKALIKE: tensor-reshape-non-contiguous -- the rows after the class slot are one contiguous block: a view
    auto resized = F::interpolate(table, F::InterpolateFuncOptions().size(std::vector<int64_t>{gh, gw}).mode(torch::kBicubic).align_corners(false));
    // FACT: r = torch.nn.functional.interpolate(torch.randn(1, 8, 4, 4), size=(3, 3), mode='bicubic', align_corners=False); assert is_view_of(r.permute(0, 2, 3, 1).view(1, 9, 8), r)
    return torch::cat({cls_pos, resized.permute({0, 2, 3, 1}).view({1, gh * gw, D})}, 1); // LOOKALIKE: tensor-view-non-contiguous -- the grid's rows and columns stay adjacent after the permute: a view
  }

  // [B, 3, S, S] -> [B, D] class-token features.
  torch::Tensor forward(const torch::Tensor &img) {
    auto x = patch_embed(img); // [B, D, gh, gw]
    const auto B = x.size(0), gh = x.size(2), gw = x.size(3);
    // FACT: c = torch.nn.Conv2d(3, 8, 4, stride=4)(torch.randn(2, 3, 16, 16)); assert is_view_of(c.flatten(2), c)
    x = x.flatten(2).transpose(1, 2); // LOOKALIKE: tensor-reshape-non-contiguous -- a conv output is contiguous: flatten(2) is a view
    x = torch::cat({cls_token.expand({B, -1, -1}), x}, 1) + pos_for(gh, gw);
    auto h = encoder(x.transpose(0, 1)); // the C++ encoder is sequence-first
    return norm(h.select(0, 0));
  }

  int64_t grid_;
  torch::nn::Conv2d patch_embed{nullptr};
  torch::Tensor cls_token, pos_embed;
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Vit);

// Projection MLP, then a weight-normalised prototype layer with the norm fixed to 1.
struct DinoHeadImpl : torch::nn::Module {
  DinoHeadImpl(int64_t in_dim, const DinoConfig &cfg) {
    mlp = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(in_dim, cfg.hidden_dim), torch::nn::GELU(),
                                                       torch::nn::Linear(cfg.hidden_dim, cfg.hidden_dim), torch::nn::GELU(),
                                                       torch::nn::Linear(cfg.hidden_dim, cfg.bottleneck)));
    prototypes = register_parameter("prototypes", torch::empty({cfg.out_dim, cfg.bottleneck}));
    torch::nn::init::kaiming_uniform_(prototypes, std::sqrt(5.0));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto z = F::normalize(mlp->forward(x), F::NormalizeFuncOptions().dim(-1));
    return F::linear(z, F::normalize(prototypes, F::NormalizeFuncOptions().dim(1)));
  }
  torch::nn::Sequential mlp{nullptr};
  torch::Tensor prototypes;
};
TORCH_MODULE(DinoHead);

// Runs the backbone once per resolution (consecutive crops of one size form one batch).
struct MultiCropImpl : torch::nn::Module {
  explicit MultiCropImpl(const DinoConfig &cfg) {
    backbone = register_module("backbone", Vit(cfg));
    head = register_module("head", DinoHead(cfg.embed_dim, cfg));
  }
  torch::Tensor forward(const std::vector<torch::Tensor> &crops) {
    std::vector<torch::Tensor> feats;
    size_t start = 0;
    while (start < crops.size()) {
      size_t end = start + 1;
      while (end < crops.size() && crops[end].size(-1) == crops[start].size(-1))
        ++end;
      std::vector<torch::Tensor> group(crops.begin() + start, crops.begin() + end);
      feats.push_back(backbone(torch::cat(group))); // LOOKALIKE: tensor-graph-kept-across-iterations -- concatenated and returned: the caller's loss backpropagates through them
      start = end;
    }
    return head(torch::cat(feats));
  }
  Vit backbone{nullptr};
  DinoHead head{nullptr};
};
TORCH_MODULE(MultiCrop);

torch::Tensor random_resized_crop(const torch::Tensor &img, int64_t size, double smin, double smax, std::mt19937 &rng) {
  const auto H = img.size(1), W = img.size(2);
  std::uniform_real_distribution<double> scale(smin, smax), log_ratio(std::log(3.0 / 4.0), std::log(4.0 / 3.0)), u(0.0, 1.0);
  const double area = static_cast<double>(H * W) * scale(rng), ratio = std::exp(log_ratio(rng));
  const auto h = std::clamp<int64_t>(std::llround(std::sqrt(area / ratio)), 1, H);
  const auto w = std::clamp<int64_t>(std::llround(std::sqrt(area * ratio)), 1, W);
  const auto top = static_cast<int64_t>(u(rng) * static_cast<double>(H - h + 1));
  const auto left = static_cast<int64_t>(u(rng) * static_cast<double>(W - w + 1));
  auto crop = img.narrow(1, top, h).narrow(2, left, w).unsqueeze(0);
  auto out = F::interpolate(crop, F::InterpolateFuncOptions().size(std::vector<int64_t>{size, size}).mode(torch::kBilinear).align_corners(false)).squeeze(0);
  return u(rng) < 0.5 ? out.flip({2}) : out;
}

// Brightness and contrast jitter, in place on a crop the caller owns.
void color_jitter_(torch::Tensor &img, double brightness, double contrast) {
  img.mul_(brightness);
  auto m = img.mean();
  img.sub_(m).mul_(contrast).add_(m).clamp_(0.0, 1.0);
}

// img [3, H, W] in [0, 1] -> 2 global views, then cfg.n_local local ones, normalised.
std::vector<torch::Tensor> multi_crop(const torch::Tensor &img, const DinoConfig &cfg, const torch::Tensor &mean, const torch::Tensor &stdev, std::mt19937 &rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<torch::Tensor> views;
  for (int64_t i = 0; i < 2 + cfg.n_local; ++i) {
    const bool global = i < 2;
    auto v = random_resized_crop(img, global ? cfg.global_size : cfg.local_size,
                                 global ? cfg.global_scale_min : cfg.local_scale_min, global ? 1.0 : cfg.local_scale_max, rng);
    // FACT: x = torch.rand(3, 8, 8); o = torch.nn.functional.interpolate(x[:, 1:6, 2:7].unsqueeze(0), size=(4, 4), mode='bilinear', align_corners=False).squeeze(0); o.mul_(1.2); assert is_copy_of(o, x)
    color_jitter_(v, 0.6 + 0.8 * u(rng), 0.6 + 0.8 * u(rng)); // LOOKALIKE: tensor-alias-then-mutate -- v is interpolate's own output, not a view of the image
    if (i == 1 && u(rng) < 0.2)
      v = torch::where(v < 0.5, v, 1.0 - v); // solarize the second global view
    views.push_back((v - mean) / stdev);
  }
  return views;
}

// One image's crops side by side as 8-bit RGB, for the debug dump.
torch::Tensor crop_strip(const std::vector<torch::Tensor> &views, const torch::Tensor &mean, const torch::Tensor &stdev, int64_t cell) {
  const auto n = static_cast<int64_t>(views.size());
  auto strip = torch::zeros({3, cell, cell * n}, torch::kByte);
  for (int64_t v = 0; v < n; ++v) {
    auto img = F::interpolate((views[v] * stdev + mean).unsqueeze(0), F::InterpolateFuncOptions().size(std::vector<int64_t>{cell, cell}).mode(torch::kBicubic).align_corners(false));
    // FACT: g = torch.zeros(3, dtype=torch.uint8); g.copy_(torch.tensor([254.7, 1.004 * 255, -0.01 * 255])); assert g.tolist()[0] == 254 and g.tolist()[1] != 255
    strip.narrow(2, v * cell, cell).copy_(img.squeeze(0) * 255); // EXPECT: tensor-copy-narrowing -- float to uint8: fractions truncated, and bicubic overshoot past 255 or below 0 wraps around
  }
  return strip;
}

class DinoLoss {
public:
  DinoLoss(const DinoConfig &cfg, torch::Device device)
      : n_crops_(2 + cfg.n_local), student_temp_(cfg.student_temp), momentum_(cfg.center_momentum),
        center_(torch::zeros({1, cfg.out_dim}, torch::TensorOptions().device(device))) {
    for (int64_t e = 0; e < cfg.epochs; ++e) {
      const double a = std::min(1.0, static_cast<double>(e) / static_cast<double>(std::max<int64_t>(1, cfg.warmup_teacher_epochs)));
      teacher_temps_.push_back(cfg.warmup_teacher_temp + a * (cfg.teacher_temp - cfg.warmup_teacher_temp));
    }
  }

  // student_out [n_crops * B, K], teacher_out [2 * B, K] (the teacher sees the global crops only).
  torch::Tensor forward(const torch::Tensor &student_out, const torch::Tensor &teacher_out, int64_t epoch) {
    auto s = (student_out / student_temp_).chunk(n_crops_);
    auto t = teacher_out.detach();
    // FACT: a = torch.randn(4, 3); a0 = a.clone(); d = a.detach(); d.sub_(a0.mean(0, keepdim=True)).div_(0.04); assert shares_storage(d, a) and not torch.equal(a, a0)
    t.sub_(center_).div_(teacher_temps_[epoch]); // EXPECT: tensor-inplace-on-detached -- detach shares teacher_out's storage: update_center below averages the centred, sharpened values
    auto t_probs = F::softmax(t, F::SoftmaxFuncOptions(-1)).chunk(2);
    auto total = torch::zeros({}, student_out.options());
    int64_t terms = 0;
    for (int64_t iq = 0; iq < 2; ++iq) {
      for (int64_t v = 0; v < n_crops_; ++v) {
        if (v == iq)
          continue;
        auto ce = torch::sum(-t_probs[iq] * F::log_softmax(s[v], F::LogSoftmaxFuncOptions(-1)), -1);
        total = total + ce.mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- the sum is the loss backward() runs through
        ++terms;
      }
    }
    update_center(teacher_out);
    return total / static_cast<double>(terms);
  }

  void update_center(const torch::Tensor &teacher_out) {
    torch::NoGradGuard no_grad;
    auto batch_center = teacher_out.sum(0, true) / static_cast<double>(teacher_out.size(0));
    center_.mul_(momentum_).add_(batch_center, 1.0 - momentum_);
  }

private:
  int64_t n_crops_;
  double student_temp_, momentum_;
  torch::Tensor center_;
  std::vector<double> teacher_temps_;
};

// Collapse check: the per-dimension spread of the latest l2-normalised teacher features, newest
// first (about 1 / sqrt(D) while healthy, 0 once every image maps to the same point).
struct CollapseMonitor {
  CollapseMonitor(int64_t q, int64_t dim, torch::Device device) : feats(torch::zeros({q, dim}, torch::TensorOptions().device(device))) {}
  void push(const torch::Tensor &f) {
    const auto Q = feats.size(0), B = f.size(0);
    // FACT: q = torch.zeros(16, 4); assert raises(lambda: q.narrow(0, 3, 13).copy_(q.narrow(0, 0, 13)), "single memory location")
    feats.narrow(0, B, Q - B).copy_(feats.narrow(0, 0, Q - B)); // EXPECT: tensor-inplace-overlap -- with a queue longer than two batches, source and destination rows overlap: copy_ raises
    feats.narrow(0, 0, B).copy_(F::normalize(f, F::NormalizeFuncOptions().dim(1)));
    filled = std::min(Q, filled + B);
  }
  double spread() const { return feats.narrow(0, 0, filled).std(0).mean().item<double>(); }
  torch::Tensor feats;
  int64_t filled = 0;
};

// Weighted k-NN (T = 0.07) on backbone features; the bank stays on the host to spare GPU memory.
double knn_accuracy(Vit &backbone, const torch::Tensor &train_imgs, const torch::Tensor &train_labels,
                    const torch::Tensor &val_imgs, const torch::Tensor &val_labels, const DinoConfig &cfg) {
  torch::NoGradGuard no_grad;
  const torch::Device device(torch::kCUDA);
  backbone->eval();
  const auto n = train_imgs.size(0), n_classes = train_labels.max().item<int64_t>() + 1;
  auto bank = torch::zeros({n, cfg.embed_dim});
  for (int64_t s = 0; s < n; s += cfg.batch_size) {
    const auto len = std::min(cfg.batch_size, n - s);
    auto f = F::normalize(backbone->forward(train_imgs.narrow(0, s, len).to(device)), F::NormalizeFuncOptions().dim(1));
    bank.narrow(0, s, len).copy_(f); // LOOKALIKE: tensor-device-mismatch -- copy_ may go from the GPU to a host tensor
  }
  auto labels = train_labels.to(device);
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t s = 0; s < val_imgs.size(0); s += cfg.batch_size) {
    const auto len = std::min(cfg.batch_size, val_imgs.size(0) - s);
    auto q = F::normalize(backbone->forward(val_imgs.narrow(0, s, len).to(device)), F::NormalizeFuncOptions().dim(1));
    auto sim = torch::mm(q, bank.t()); // EXPECT: tensor-device-mismatch -- the queries are on the GPU, the bank on the host
    auto top = sim.topk(cfg.knn_k, 1);
    auto weights = (std::get<0>(top) / 0.07).exp();
    auto neighbours = labels.index({std::get<1>(top)}); // [len, k]
    auto votes = torch::zeros({len, n_classes}, weights.options()).scatter_add_(1, neighbours, weights);
    correct += votes.argmax(1).eq(val_labels.narrow(0, s, len).to(device)).sum();
  }
  backbone->train();
  return correct.item<double>() / static_cast<double>(val_imgs.size(0));
}

void train_dino(const std::vector<torch::Tensor> &images, const torch::Tensor &mean, const torch::Tensor &stdev,
                const DinoConfig &cfg) {
  torch::Device device(torch::kCUDA);
  std::mt19937 rng(0);
  MultiCrop student(cfg), teacher(cfg);
  student->to(device);
  teacher->to(device);
  auto sp = student->parameters(), tp = teacher->parameters();
  // FACT: a = torch.nn.Linear(3, 2); b = torch.nn.Linear(3, 2); assert raises(lambda: b.weight.copy_(a.weight), "a leaf Variable that requires grad")
  for (size_t i = 0; i < tp.size(); ++i)
    tp[i].copy_(sp[i]); // EXPECT: tensor-inplace-on-leaf -- the teacher is not frozen yet and grad mode is on: copy_ on its parameters raises
  for (auto &p : teacher->parameters())
    p.requires_grad_(false); // LOOKALIKE: tensor-inplace-on-leaf -- only the flag changes
  DinoLoss dino_loss(cfg, device);
  CollapseMonitor monitor(cfg.queue_size, cfg.embed_dim, device);
  torch::optim::AdamW opt(student->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));

  const int64_t n = static_cast<int64_t>(images.size()), steps_per_epoch = n / cfg.batch_size;
  const int64_t total_steps = cfg.epochs * steps_per_epoch;
  int64_t it = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::vector<torch::Tensor> step_losses;
    for (int64_t b = 0; b < steps_per_epoch; ++b, ++it) {
      std::vector<std::vector<torch::Tensor>> per_view(2 + cfg.n_local);
      for (int64_t j = 0; j < cfg.batch_size; ++j) {
        auto views = multi_crop(images[b * cfg.batch_size + j], cfg, mean, stdev, rng);
        if (b == 0 && j == 0)
          torch::save(crop_strip(views, mean, stdev, 96), "crops_epoch" + std::to_string(epoch) + ".pt");
        for (size_t v = 0; v < views.size(); ++v)
          per_view[v].push_back(views[v]);
      }
      std::vector<torch::Tensor> crops;
      for (auto &pv : per_view)
        crops.push_back(torch::stack(pv).to(device)); // LOOKALIKE: tensor-clone-in-loop -- new crops every step
      torch::Tensor teacher_out;
      {
        torch::NoGradGuard no_grad;
        teacher_out = teacher->forward({crops[0], crops[1]});
        if (it % cfg.monitor_every == 0)
          monitor.push(teacher->backbone->forward(crops[0]));
      }
      auto loss = dino_loss.forward(student->forward(crops), teacher_out, epoch);
      if (!std::isfinite(loss.item<double>())) { // LOOKALIKE: tensor-sync-in-loop -- the value decides whether training stops
        std::fprintf(stderr, "loss is %f, stopping\n", loss.item<double>());
        return;
      }
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(student->parameters(), cfg.clip_grad);
      if (epoch < cfg.freeze_last_layer)
        student->head->prototypes.grad().zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient is written, not the prototypes
      opt.step();
      {
        torch::NoGradGuard no_grad;
        const double m = 1.0 - (1.0 - cfg.momentum_teacher) * (std::cos(M_PI * static_cast<double>(it) / static_cast<double>(total_steps)) + 1.0) / 2.0;
        for (size_t i = 0; i < tp.size(); ++i)
          tp[i].mul_(m).add_(sp[i].detach(), 1.0 - m); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard, and the teacher is frozen
      }
      // FACT: m = torch.nn.Linear(3, 2); c = [] ; exec('for _ in range(3):\n l = m(torch.randn(4, 3)).pow(2).mean(); l.backward(); c.append(l)'); assert kept_nodes(c) >= 3 * 3
      step_losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations -- each step's graph stays reachable until the epoch ends
    }
    const double mean_loss = torch::stack(step_losses).mean().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the loop of steps
    std::printf("epoch %lld  loss %.4f  teacher spread %.4f\n", static_cast<long long>(epoch), mean_loss, monitor.spread());
  }
}
