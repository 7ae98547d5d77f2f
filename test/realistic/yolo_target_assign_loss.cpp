// YOLOv5-style detector training: three output levels (strides 8/16/32) with three anchors each,
// targets assigned to the anchors whose shape ratio is within anchor_t and to the grid cell of the
// box centre; CIoU box loss, objectness regressed to the IoU, BCE class loss with label smoothing.
// Also the inference decode used by the validation pass.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

constexpr double kPi = 3.14159265358979323846;

struct YoloConfig {
  int64_t num_classes = 80, img_size = 640, epochs = 300, log_every = 50;
  std::vector<int64_t> strides{8, 16, 32};
  std::vector<double> anchors{10, 13, 16, 30, 33, 23, 30, 61, 62, 45, 59, 119, 116, 90, 156, 198, 373, 326}; // pixels
  std::vector<double> balance{4.0, 1.0, 0.4}; // objectness weight per level
  double anchor_t = 4.0, box_gain = 0.05, obj_gain = 1.0, cls_gain = 0.5, label_smoothing = 0.0;
  double lr = 0.01, momentum = 0.937, weight_decay = 5e-4;
};

struct ConvBnActImpl : torch::nn::Module {
  ConvBnActImpl(int64_t in, int64_t out, int64_t k, int64_t s) {
    conv_ = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(s).padding(k / 2).bias(false)));
    bn_ = register_module("bn", torch::nn::BatchNorm2d(torch::nn::BatchNormOptions(out).eps(1e-3).momentum(0.03)));
  }
  torch::Tensor forward(const torch::Tensor &x) { return torch::silu(bn_(conv_(x))); }
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::BatchNorm2d bn_{nullptr};
};
TORCH_MODULE(ConvBnAct);

// Raw head outputs [B, A * (5 + C), H, W] per level.
struct DetectImpl : torch::nn::Module {
  DetectImpl(const YoloConfig &cfg, const std::vector<int64_t> &channels)
      : nc_(cfg.num_classes), no_(cfg.num_classes + 5), na_(3), strides_(cfg.strides) {
    const auto nl = static_cast<int64_t>(channels.size());
    anchors_ = register_buffer("anchors", torch::tensor(cfg.anchors).to(torch::kFloat).view({nl, na_, 2}));
    for (int64_t i = 0; i < nl; ++i) {
      // FACT: m = torch.nn.Module(); m.register_buffer('anchors', torch.tensor([10., 13, 16, 30]).view(2, 2)); m.anchors[0].div_(8.0); assert not m.anchors.requires_grad and m.anchors[0].tolist() == [1.25, 1.625]
      anchors_[i].div_(static_cast<double>(strides_[i])); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer: it does not require grad
      m_.push_back(register_module("m" + std::to_string(i), torch::nn::Conv2d(torch::nn::Conv2dOptions(channels[i], na_ * no_, 1))));
    }
    // Priors: ~8 objects per 640x640 image, classes equally likely.
    for (int64_t i = 0; i < nl; ++i) {
      auto b = m_[i]->bias.view({na_, -1}); // [A, 5 + C]
      const double cells = std::pow(640.0 / static_cast<double>(strides_[i]), 2);
      // FACT: l = torch.nn.Conv2d(4, 24, 1); b = l.bias.view(3, -1); assert raises(lambda: b[:, 4].add_(1.0), "a view of a leaf Variable that requires grad")
      b.select(1, 4).add_(std::log(8.0 / cells)); // EXPECT: tensor-inplace-on-leaf -- a view of the conv bias, a parameter, written with grad mode on
      // FACT: l = torch.nn.Conv2d(4, 12, 1); b = l.bias.view(3, -1); torch.nn.init.constant_(b[:, 1:], -4.6); assert l.bias.is_leaf and bool((l.bias.view(3, -1)[:, 1:] == -4.6).all())
      torch::nn::init::constant_(b.narrow(1, 5, nc_), std::log(0.6 / (static_cast<double>(nc_) - 0.99))); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills under NoGradGuard
    }
  }

  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor> &feats) {
    std::vector<torch::Tensor> out;
    for (size_t i = 0; i < feats.size(); ++i)
      out.push_back(m_[i]->forward(feats[i]));
    return out;
  }

  int64_t nc_, no_, na_;
  std::vector<int64_t> strides_;
  torch::Tensor anchors_; // [nl, A, 2], in grid cells of each level
  std::vector<torch::nn::Conv2d> m_;
};
TORCH_MODULE(Detect);

struct TinyYoloImpl : torch::nn::Module {
  explicit TinyYoloImpl(const YoloConfig &cfg) {
    stem_ = register_module("stem", torch::nn::Sequential(ConvBnAct(3, 32, 3, 2), ConvBnAct(32, 64, 3, 2), ConvBnAct(64, 64, 3, 2)));
    c4_ = register_module("c4", ConvBnAct(64, 128, 3, 2));
    c5_ = register_module("c5", ConvBnAct(128, 256, 3, 2));
    detect_ = register_module("detect", Detect(cfg, std::vector<int64_t>{64, 128, 256}));
  }
  std::vector<torch::Tensor> forward(const torch::Tensor &imgs) {
    auto p3 = stem_->forward(imgs);
    auto p4 = c4_(p3);
    auto p5 = c5_(p4);
    return detect_->forward({p3, p4, p5});
  }
  torch::nn::Sequential stem_{nullptr};
  ConvBnAct c4_{nullptr}, c5_{nullptr};
  Detect detect_{nullptr};
};
TORCH_MODULE(TinyYolo);

// Complete IoU of boxes given as (cx, cy, w, h) rows [n, 4].
torch::Tensor bbox_ciou(const torch::Tensor &a, const torch::Tensor &b, double eps = 1e-7) {
  auto a1 = a.narrow(1, 0, 2) - a.narrow(1, 2, 2) / 2, a2 = a.narrow(1, 0, 2) + a.narrow(1, 2, 2) / 2;
  auto b1 = b.narrow(1, 0, 2) - b.narrow(1, 2, 2) / 2, b2 = b.narrow(1, 0, 2) + b.narrow(1, 2, 2) / 2;
  auto inter = (torch::min(a2, b2) - torch::max(a1, b1)).clamp_min(0).prod(1);
  auto wa = a.select(1, 2), ha = a.select(1, 3) + eps, wb = b.select(1, 2), hb = b.select(1, 3) + eps;
  auto uni = wa * ha + wb * hb - inter + eps;
  auto iou = inter / uni;
  auto cwh = torch::max(a2, b2) - torch::min(a1, b1);
  auto c2 = cwh.pow(2).sum(1) + eps;
  auto rho2 = (b.narrow(1, 0, 2) - a.narrow(1, 0, 2)).pow(2).sum(1);
  auto v = (4 / (kPi * kPi)) * (torch::atan(wb / hb) - torch::atan(wa / ha)).pow(2);
  torch::Tensor alpha;
  {
    torch::NoGradGuard no_grad;
    alpha = v / (v - iou + (1 + eps));
  }
  return iou - (rho2 / c2 + v * alpha);
}

struct LossParts {
  torch::Tensor total, box, obj, cls;
};

class YoloLoss {
public:
  YoloLoss(Detect head, const YoloConfig &cfg) : head_(std::move(head)), cfg_(cfg) {}

  // preds: raw [B, A * no, H, W] per level; targets [nt, 6] = (image, class, cx, cy, w, h), normalised.
  LossParts operator()(const std::vector<torch::Tensor> &preds, const torch::Tensor &targets) {
    namespace F = torch::nn::functional;
    const int64_t na = head_->na_, no = head_->no_, nc = head_->nc_, nt = targets.size(0);
    const double cp = 1.0 - 0.5 * cfg_.label_smoothing, cn = 0.5 * cfg_.label_smoothing;
    auto opts = preds[0].options();
    auto lbox = torch::zeros({}, opts), lobj = torch::zeros({}, opts), lcls = torch::zeros({}, opts);

    // Every target once per anchor, with the anchor index as a 7th column.
    auto ai = torch::arange(na, targets.options()).view({na, 1}).expand({na, nt});
    auto targets_a = torch::cat({targets.unsqueeze(0).expand({na, nt, 6}), ai.unsqueeze(2)}, 2); // [na, nt, 7]

    for (size_t i = 0; i < preds.size(); ++i) {
      const auto B = preds[i].size(0), H = preds[i].size(2), W = preds[i].size(3);
      // FACT: p = torch.randn(2, 24, 4, 5); assert is_view_of(p.view(2, 3, 8, 4, 5), p)
      auto pi = preds[i].view({B, na, no, H, W}).permute({0, 1, 3, 4, 2}); // LOOKALIKE: tensor-view-non-contiguous -- a conv output is contiguous; the permute comes after the view
      auto anchors = head_->anchors_[i];                                   // [na, 2], grid units

      // Scale (cx, cy, w, h) to this level's grid.
      auto gain = torch::ones({7}, targets.options());
      // FACT: g = torch.ones(7); g[2:6].copy_(torch.tensor([80, 80, 80, 80])); assert g.dtype == torch.float32 and g.tolist() == [1, 1, 80, 80, 80, 80, 1]
      gain.narrow(0, 2, 4).copy_(torch::tensor({W, H, W, H})); // LOOKALIKE: tensor-copy-narrowing, tensor-device-mismatch -- grid sizes into float is exact; copy_ moves across devices
      // FACT: ta = torch.rand(3, 5, 7); t0 = ta.clone(); g = torch.tensor([1., 1, 8, 8, 8, 8, 1]); exec('for i in range(2):\n t = ta\n t.mul_(g)'); assert torch.allclose(ta, t0 * g * g)
      auto t = targets_a;
      t.mul_(gain); // EXPECT: tensor-alias-then-mutate -- t is targets_a itself: the next level scales the already scaled targets again

      // Keep the (target, anchor) pairs whose w/h ratio is within anchor_t.
      auto r = t.narrow(2, 4, 2) / anchors.view({na, 1, 2});
      auto keep = torch::max(r, 1.0 / r).amax(2) < cfg_.anchor_t; // [na, nt]
      t = t.index({keep});                                        // [n, 7]
      const int64_t n = t.size(0);

      auto tobj = torch::zeros({B, na, H, W}, opts);
      if (n > 0) {
        auto b = t.select(1, 0).to(torch::kLong), cls = t.select(1, 1).to(torch::kLong), a = t.select(1, 6).to(torch::kLong);
        auto gxy = t.narrow(1, 2, 2), gwh = t.narrow(1, 4, 2);
        auto gij = gxy.to(torch::kLong);
        auto gi = gij.select(1, 0).clamp(0, W - 1), gj = gij.select(1, 1).clamp(0, H - 1);
        auto tbox = torch::cat({gxy - gij, gwh}, 1);

        auto ps = pi.index({b, a, gj, gi}); // [n, no]
        // FACT: x = torch.randn(4, 6, requires_grad=True); s = x[:, :2].sigmoid(); s.mul_(2).sub_(0.5); assert backward_fails(lambda: s.sum().backward())
        auto pxy = ps.narrow(1, 0, 2).sigmoid();
        pxy.mul_(2).sub_(0.5); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward: loss.backward() fails
        auto pwh = (ps.narrow(1, 2, 2).sigmoid() * 2).pow(2) * anchors.index({a});
        auto iou = bbox_ciou(torch::cat({pxy, pwh}, 1), tbox);
        lbox = lbox + (1.0 - iou).mean();

        tobj.index_put_({b, a, gj, gi}, iou.detach().clamp(0).to(tobj.scalar_type()));
        if (nc > 1) {
          auto tc = torch::full({n, nc}, cn, opts);
          tc.index_put_({torch::arange(n, b.options()), cls}, cp);
          lcls = lcls + F::binary_cross_entropy_with_logits(ps.narrow(1, 5, nc), tc);
        }
      }
      lobj = lobj + F::binary_cross_entropy_with_logits(pi.select(4, 4), tobj) * cfg_.balance[i];
    }
    const auto bs = static_cast<double>(preds[0].size(0));
    lbox = lbox * cfg_.box_gain;
    lobj = lobj * cfg_.obj_gain;
    lcls = lcls * cfg_.cls_gain;
    return {(lbox + lobj + lcls) * bs, lbox, lobj, lcls};
  }

private:
  Detect head_;
  YoloConfig cfg_;
};

// Validation decode: all levels as [B, N, 5 + C] with boxes in input pixels.
torch::Tensor decode(const std::vector<torch::Tensor> &preds, const Detect &head) {
  torch::NoGradGuard no_grad;
  const int64_t na = head->na_, no = head->no_;
  std::vector<torch::Tensor> z;
  for (size_t i = 0; i < preds.size(); ++i) {
    const auto B = preds[i].size(0), H = preds[i].size(2), W = preds[i].size(3);
    const auto stride = static_cast<double>(head->strides_[i]);
    auto grids = torch::meshgrid({torch::arange(H, preds[i].options()), torch::arange(W, preds[i].options())}, "ij");
    // FACT: ys, xs = torch.meshgrid(torch.arange(4.), torch.arange(5.), indexing="ij"); gr = torch.stack((xs, ys), 2); assert is_view_of(gr.view(1, 1, 4, 5, 2), gr)
    auto grid = torch::stack({grids[1], grids[0]}, 2).view({1, 1, H, W, 2}); // LOOKALIKE: tensor-view-non-contiguous -- stack copies the expanded meshgrid outputs into new memory
    // FACT: a = torch.rand(3, 2); ag = a.view(1, 3, 1, 1, 2).expand(1, 3, 4, 5, 2); assert raises(lambda: ag.mul_(8), "more than one element of the written-to tensor refers to a single memory location")
    auto anchor_grid = head->anchors_[i].view({1, na, 1, 1, 2}).expand({1, na, H, W, 2});
    anchor_grid *= stride; // EXPECT: tensor-inplace-on-expanded -- every cell of the expanded grid is the same anchor in memory
    auto y = preds[i].view({B, na, no, H, W}).permute({0, 1, 3, 4, 2}).sigmoid();
    y.narrow(4, 0, 2).mul_(2).sub_(0.5).add_(grid).mul_(stride); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is saved
    y.narrow(4, 2, 2).mul_(2).pow_(2).mul_(anchor_grid);
    // FACT: r = torch.randn(2, 24, 4, 5); y = r.view(2, 3, 8, 4, 5).permute(0, 1, 3, 4, 2).sigmoid(); assert not is_contiguous(y) and raises(lambda: y.view(2, -1, 8), "view size is not compatible")
    z.push_back(y.view({B, -1, no})); // EXPECT: tensor-view-non-contiguous -- sigmoid keeps the permuted strides: y is not contiguous and view throws
  }
  return torch::cat(z, 1);
}

// Ground truth for the mAP matcher: labels [n, 6] normalised (cx, cy, w, h) -> pixel boxes [n, 4].
torch::Tensor labels_to_pixels(const torch::Tensor &labels, int64_t img_size) {
  // FACT: l = torch.rand(5, 6); b = l[:, 2:6].contiguous(); b.mul_(640); assert is_copy_of(b, l)
  auto boxes = labels.narrow(1, 2, 4).contiguous();
  boxes.mul_(static_cast<double>(img_size)); // LOOKALIKE: tensor-alias-then-mutate -- four of six columns are not contiguous: contiguous() copied them
  return boxes;
}

struct DetBatch {
  torch::Tensor images;  // [B, 3, S, S] float in [0, 1]
  torch::Tensor targets; // [nt, 6]
};

void train(TinyYolo &model, const std::vector<DetBatch> &train_set, const YoloConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  YoloLoss criterion(model->detect_, cfg);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).nesterov(true).weight_decay(cfg.weight_decay));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto box_sum = torch::zeros({}, device), obj_sum = torch::zeros({}, device), cls_sum = torch::zeros({}, device);
    int64_t step = 0;
    for (const auto &batch : train_set) {
      auto imgs = batch.images.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto targets = batch.targets.to(device);
      auto loss = criterion(model->forward(imgs), targets);
      opt.zero_grad();
      loss.total.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 10.0);
      opt.step();
      // FACT: m = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n l = m(torch.randn(4, 3)).pow(2).mean(); l.backward(); s += l'); assert s.requires_grad and kept_nodes(s) >= 3
      box_sum += loss.box; // EXPECT: tensor-graph-kept-across-iterations -- the box loss carries its graph: every step's stays reachable until the epoch ends
      obj_sum += loss.obj.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
      cls_sum += loss.cls.detach();
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.total.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    const auto n = static_cast<double>(std::max<int64_t>(step, 1));
    std::cout << "epoch " << epoch << " box " << box_sum.item<double>() / n << " obj " << obj_sum.item<double>() / n
              << " cls " << cls_sum.item<double>() / n << "\n";
  }
}
