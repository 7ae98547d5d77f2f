// Multi-task dense prediction (semantic segmentation, depth, surface normals)
// from one shared encoder. The task losses are balanced either with learned
// homoscedastic uncertainty (Kendall et al. 2018) or with GradNorm (Chen et al. 2018).
#include <torch/torch.h>

#include <cstdio>
#include <vector>

namespace F = torch::nn::functional;

enum class Balancing { kUncertainty, kGradNorm };

struct MTLConfig {
  int64_t num_classes = 8;
  int64_t width = 32;
  int64_t height = 64;
  int64_t image_width = 64;
  int64_t batch = 8;
  int64_t tasks = 3;
  double lr = 1e-3;
  double weight_lr = 2.5e-2;
  double gradnorm_alpha = 1.5;
  double max_depth = 10.0;
  int epochs = 4;
  int steps_per_epoch = 40;
  int log_every = 10;
  Balancing balancing = Balancing::kGradNorm;
};

struct Batch {
  torch::Tensor image;
  torch::Tensor seg;     // class ids, 255 = ignore
  torch::Tensor depth;   // millimetres, 0 = missing
  torch::Tensor normal;
};

struct ConvBNReLUImpl : torch::nn::Module {
  ConvBNReLUImpl(int64_t in, int64_t out, int64_t stride)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(out))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto y = bn(conv(x));
    // FACT: bn = torch.nn.BatchNorm2d(3); y = bn(torch.rand(2, 3, 4, 4, requires_grad=True) * 1); y.relu_(); y.sum().backward()
    return y.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output
  }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBNReLU);

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(int64_t w)
      : stem(register_module("stem", ConvBNReLU(3, w, 2))),
        down(register_module("down", ConvBNReLU(w, 2 * w, 2))),
        mid(register_module("mid", ConvBNReLU(2 * w, 4 * w, 1))),
        shared_out(register_module("shared_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(4 * w, 4 * w, 3).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(shared_out(mid(down(stem(x)))));
  }
  ConvBNReLU stem, down, mid;
  torch::nn::Conv2d shared_out;  // last shared layer, GradNorm measures gradients here
};
TORCH_MODULE(Encoder);

struct HeadImpl : torch::nn::Module {
  HeadImpl(int64_t in, int64_t out)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, in, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)))) {}
  torch::Tensor forward(const torch::Tensor& feat, const std::vector<int64_t>& size) {
    auto y = conv2(torch::relu(conv1(feat)));
    return F::interpolate(y, F::InterpolateFuncOptions().size(size).mode(torch::kBilinear).align_corners(false));
  }
  torch::nn::Conv2d conv1, conv2;
};
TORCH_MODULE(Head);

struct Outputs {
  torch::Tensor seg, depth, normal;
};

struct MTLNetImpl : torch::nn::Module {
  explicit MTLNetImpl(const MTLConfig& cfg)
      : max_depth(cfg.max_depth),
        encoder(register_module("encoder", Encoder(cfg.width))),
        seg_head(register_module("seg_head", Head(4 * cfg.width, cfg.num_classes))),
        depth_head(register_module("depth_head", Head(4 * cfg.width, 1))),
        normal_head(register_module("normal_head", Head(4 * cfg.width, 3))) {}

  Outputs forward(const torch::Tensor& x) {
    auto f = encoder(x);
    const std::vector<int64_t> size{x.size(2), x.size(3)};
    Outputs o;
    o.seg = seg_head(f, size);
    o.depth = torch::sigmoid(depth_head(f, size)) * max_depth;
    auto n = normal_head(f, size);
    auto len = n.norm(2, {1}, /*keepdim=*/true);
    // FACT: assert backward_fails(lambda: (lambda n: (n.div_(n.norm(2, 1, True).clamp_min(1e-6)), n.sum().backward()))(torch.rand(2, 3, 4, 4, requires_grad=True) * 1))
    n.div_(len.clamp_min(1e-6));  // EXPECT: tensor-inplace-on-saved
    o.normal = n;
    return o;
  }

  double max_depth;
  Encoder encoder;
  Head seg_head, depth_head, normal_head;
};
TORCH_MODULE(MTLNet);

torch::Tensor seg_loss(const torch::Tensor& logits, const torch::Tensor& target,
                       const torch::Tensor& class_weights) {
  const int64_t K = logits.size(1);
  // FACT: x = torch.rand(2, 8, 4, 4); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 8), x)
  auto flat = logits.permute({0, 2, 3, 1}).reshape({-1, K});  // EXPECT: tensor-reshape-non-contiguous
  auto opts = F::CrossEntropyFuncOptions().ignore_index(255).weight(class_weights);
  return F::cross_entropy(flat, target.reshape({-1}), opts);  // EXPECT: tensor-device-mismatch
}

// scale-invariant log depth error over pixels with a measurement
torch::Tensor depth_loss(const torch::Tensor& pred, const torch::Tensor& gt) {
  auto valid = gt > 0;
  auto d = (torch::log(pred.clamp_min(1e-3)) - torch::log(gt.clamp_min(1e-3))).masked_select(valid);
  return d.pow(2).mean() - 0.5 * d.mean().pow(2);
}

torch::Tensor normal_loss(const torch::Tensor& pred, const torch::Tensor& gt) {
  // FACT: assert raises(lambda: torch.rand(2, 3, 4, 4).permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
  auto p = pred.permute({0, 2, 3, 1}).view({-1, 3});  // EXPECT: tensor-view-non-contiguous
  // FACT: g = torch.rand(2, 3, 4, 4); assert not raises(lambda: g.permute(0, 2, 3, 1).contiguous().view(-1, 3))
  auto g = gt.permute({0, 2, 3, 1}).contiguous().view({-1, 3});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first, the view is valid
  return (1.0 - (p * g).sum(1)).mean();
}

struct UncertaintyWeightsImpl : torch::nn::Module {
  explicit UncertaintyWeightsImpl(int64_t tasks) {
    log_vars = register_parameter("log_vars", torch::zeros({tasks}));
  }
  torch::Tensor forward(const torch::Tensor& task_losses) {
    return (torch::exp(-log_vars) * task_losses + log_vars).sum();  // LOOKALIKE: tensor-device-mismatch -- log_vars is a registered parameter, moved by ->to(device)
  }
  torch::Tensor log_vars;
};
TORCH_MODULE(UncertaintyWeights);

struct GradNorm {
  GradNorm(int64_t tasks, double alpha, double lr, const torch::Device& device)
      : T(tasks), alpha(alpha),
        w(torch::ones({tasks}, torch::TensorOptions().device(device).requires_grad(true))),
        opt(std::vector<torch::Tensor>{w}, torch::optim::AdamOptions(lr)) {}

  // Sets the gradient of the task weights; returns the loss the network trains on.
  torch::Tensor weigh(const torch::Tensor& task_losses, const torch::Tensor& shared_weight) {
    if (!initial.defined()) initial = task_losses;  // EXPECT: tensor-graph-kept-across-iterations
    auto weighted = w * task_losses;
    std::vector<torch::Tensor> norms;
    for (int64_t i = 0; i < T; ++i) {
      auto g = torch::autograd::grad({weighted[i]}, {shared_weight}, {}, /*retain_graph=*/true,
                                     /*create_graph=*/true)[0];
      norms.push_back(g.norm());
    }
    auto G = torch::stack(norms);
    auto ratio = task_losses.detach() / initial.detach();
    ratio = ratio / ratio.mean();
    auto target = G.mean().detach().expand({T});
    // FACT: assert raises(lambda: torch.rand(()).expand(3).mul_(torch.rand(3)), "more than one element")
    target.mul_(ratio.pow(alpha));  // EXPECT: tensor-inplace-on-expanded
    auto gn_loss = (G - target).abs().sum();
    w.mutable_grad() = torch::autograd::grad({gn_loss}, {w}, {}, /*retain_graph=*/true)[0];
    return (w.detach() * task_losses).sum();
  }

  void step() {
    opt.step();
    auto wd = w.detach();
    wd.clamp_min_(1e-3);  // LOOKALIKE: tensor-inplace-on-detached -- writes the weights on purpose after the step, no graph holds them
    torch::NoGradGuard no_grad;
    w.mul_(static_cast<double>(T) / w.sum());  // LOOKALIKE: tensor-inplace-on-leaf -- renormalised under NoGradGuard
  }

  int64_t T;
  double alpha;
  torch::Tensor w;
  torch::optim::Adam opt;
  torch::Tensor initial;
};

Batch make_batch(const MTLConfig& cfg) {
  const int64_t B = cfg.batch, H = cfg.height, W = cfg.image_width;
  auto coarse = torch::rand({B, 1, H / 8, W / 8});
  auto field = F::interpolate(coarse, F::InterpolateFuncOptions().size(std::vector<int64_t>{H, W}).mode(torch::kBilinear).align_corners(false));
  auto dzdx = F::pad(field.narrow(3, 1, W - 1) - field.narrow(3, 0, W - 1), F::PadFuncOptions({0, 1, 0, 0}));
  auto dzdy = F::pad(field.narrow(2, 1, H - 1) - field.narrow(2, 0, H - 1), F::PadFuncOptions({0, 0, 0, 1}));
  Batch b;
  b.depth = (field * 8.0 + 0.5) * 1000.0;
  b.depth.masked_fill_(torch::rand_like(field) < 0.05, 0.0);
  b.seg = (field.squeeze(1) * cfg.num_classes).to(torch::kLong).clamp_max(cfg.num_classes - 1);
  auto n = torch::cat({-20.0 * dzdx, -20.0 * dzdy, torch::ones_like(field)}, 1);
  b.normal = F::normalize(n, F::NormalizeFuncOptions().dim(1));
  auto rgb = torch::cat({field, 1.0 - field, (20.0 * dzdx).abs()}, 1) + 0.05 * torch::randn({B, 3, H, W});
  b.image = (rgb.clamp(0.0, 1.0) * 255.0).to(torch::kUInt8);
  return b;
}

void evaluate(MTLNet& model, std::vector<Batch>& val, const MTLConfig& cfg,
              const torch::Device& device, const torch::Tensor& mean, const torch::Tensor& stdv) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t K = cfg.num_classes;
  auto conf = torch::zeros({K * K}, torch::TensorOptions().dtype(torch::kLong).device(device));
  auto abs_rel = torch::zeros({}, torch::TensorOptions().device(device));
  for (auto& b : val) {
    auto image = (b.image.to(device).to(torch::kFloat) / 255.0 - mean) / stdv;
    auto out = model(image);
    auto depth_m = b.depth.to(device);
    // FACT: a = torch.rand(2, 1, 4, 4); b = a.to("cpu"); b.div_(1000.0); assert shares_storage(a, b) and torch.equal(a, b)
    depth_m.div_(1000.0);  // EXPECT: tensor-alias-then-mutate
    auto gt = b.seg.to(device);
    auto valid = gt != 255;
    conf += torch::bincount(gt.masked_select(valid) * K + out.seg.argmax(1).masked_select(valid), {}, K * K);
    auto has = depth_m > 0;
    abs_rel += ((out.depth - depth_m).abs() / depth_m.clamp_min(1e-3)).masked_select(has).mean();
  }
  auto cm = conf.view({K, K}).to(torch::kDouble);
  auto inter = cm.diagonal();
  auto iou = inter / (cm.sum(0) + cm.sum(1) - inter).clamp_min(1.0);
  std::printf("val  mIoU %.4f  absrel %.4f\n", iou.mean().item<double>(),
              abs_rel.item<double>() / static_cast<double>(val.size()));
  model->train();
}

int main() {
  MTLConfig cfg;
  torch::manual_seed(3);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  MTLNet model(cfg);
  model->to(device);
  UncertaintyWeights uw(cfg.tasks);
  uw->to(device);
  GradNorm gradnorm(cfg.tasks, cfg.gradnorm_alpha, cfg.weight_lr, device);

  auto params = model->parameters();
  if (cfg.balancing == Balancing::kUncertainty)
    for (auto& p : uw->parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(cfg.lr));

  // inverse log frequency of the classes in the training split
  auto class_weights = torch::tensor({0.8f, 1.0f, 1.1f, 1.2f, 1.2f, 1.3f, 1.5f, 2.0f});
  auto mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({1, 3, 1, 1}).to(device);
  auto stdv = torch::tensor({0.229f, 0.224f, 0.225f}).view({1, 3, 1, 1}).to(device);

  std::vector<Batch> val;
  for (int i = 0; i < 4; ++i) {
    auto b = make_batch(cfg);
    val.push_back({b.image.to(device), b.seg.to(device), b.depth.to(device), b.normal.to(device)});
  }

  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    auto metric_abs_rel = torch::zeros({}, torch::TensorOptions().device(device));
    for (int step = 0; step < cfg.steps_per_epoch; ++step) {
      Batch b = make_batch(cfg);
      // FACT: a = torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8); assert is_copy_of(a.to(torch.float32), a)
      auto image = b.image.to(device).to(torch::kFloat);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      image.div_(255.0).sub_(mean).div_(stdv);  // LOOKALIKE: tensor-alias-then-mutate -- the uint8 -> float conversion allocated a new tensor
      auto out = model(image);

      auto seg_target = b.seg.to(device).clone();  // EXPECT: tensor-unnecessary-clone
      auto depth_gt = b.depth.to(device) / 1000.0;
      auto task_losses = torch::stack({seg_loss(out.seg, seg_target, class_weights),
                                       depth_loss(out.depth, depth_gt),
                                       normal_loss(out.normal, b.normal.to(device))});

      auto depth_pred = out.depth.detach();
      // FACT: assert backward_fails(lambda: (lambda p: (lambda l: (p.detach().clamp_min_(0.5), l.backward()))(torch.log(p.clamp_min(1e-3)).sum()))(torch.sigmoid(torch.randn(2, 1, 4, 4, requires_grad=True)) * 10))
      depth_pred.clamp_min_(1e-3);  // EXPECT: tensor-inplace-on-detached
      auto valid = depth_gt > 0;
      metric_abs_rel += ((depth_pred - depth_gt).abs() / depth_gt.clamp_min(1e-3)).masked_select(valid).mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- built from detached values, no graph

      torch::Tensor total;
      if (cfg.balancing == Balancing::kUncertainty)
        total = uw(task_losses);
      else
        total = gradnorm.weigh(task_losses, model->encoder->shared_out->weight);
      opt.zero_grad();
      total.backward();
      opt.step();
      if (cfg.balancing == Balancing::kUncertainty)
        uw->log_vars.clamp_(-6.0, 6.0);  // EXPECT: tensor-inplace-on-leaf
      else
        gradnorm.step();

      if (step % cfg.log_every == 0) {
        auto l = task_losses.detach().cpu();  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
        std::printf("epoch %d step %3d  seg %.4f  depth %.4f  normal %.4f\n", epoch, step,
                    l[0].item<double>(), l[1].item<double>(), l[2].item<double>());
      }
    }
    std::printf("epoch %d  train absrel %.4f\n", epoch,
                metric_abs_rel.item<double>() / cfg.steps_per_epoch);
    evaluate(model, val, cfg, device, mean, stdv);
  }
  return 0;
}
