// ArcFace (additive angular margin) face recognition: a compact CNN backbone with the usual
// BN-Dropout-FC-BN embedding head, an ArcMargin classifier over identities, and LFW-style
// verification (10-fold threshold selection over cosine similarities of image pairs).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct FaceConfig {
  int64_t num_classes = 10572, emb_dim = 512, image_size = 112, batch_size = 128;
  int64_t epochs = 20, steps_per_epoch = 500, log_every = 100, renorm_every = 100;
  int64_t num_pairs = 6000, folds = 10, eval_batch = 256;
  double scale = 64.0, margin = 0.5, smoothing = 0.1;
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  bool adaptive_margin = true;
};

struct FaceNetImpl : torch::nn::Module {
  explicit FaceNetImpl(const FaceConfig& c) {
    int64_t in = 3;
    for (int64_t out : {64, 128, 256, 512}) {
      body->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(2).padding(1).bias(false)));
      body->push_back(torch::nn::BatchNorm2d(out));
      body->push_back(torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(out)));
      body->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
      body->push_back(torch::nn::BatchNorm2d(out));
      body->push_back(torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(out)));
      in = out;
    }
    register_module("body", body);
    const int64_t spatial = c.image_size / 16;
    bn_out = register_module("bn_out", torch::nn::BatchNorm2d(in));
    dropout = register_module("dropout", torch::nn::Dropout(0.4));
    fc = register_module("fc", torch::nn::Linear(in * spatial * spatial, c.emb_dim));
    bn_emb = register_module("bn_emb", torch::nn::BatchNorm1d(c.emb_dim));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto f = bn_out(body->forward(x));
    // FACT: (lambda f: is_view_of(f.flatten(1), f))(torch.nn.BatchNorm2d(8)(torch.randn(2, 8, 7, 7)))
    return bn_emb(fc(dropout(f.flatten(1))));  // LOOKALIKE: tensor-reshape-non-contiguous -- the BN output is contiguous, flatten(1) is a view
  }

  torch::nn::Sequential body;
  torch::nn::BatchNorm2d bn_out{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn_emb{nullptr};
};
TORCH_MODULE(FaceNet);

// cos(theta + m) on the target class; the margin can be scaled per sample by feature-norm quality.
struct ArcMarginImpl : torch::nn::Module {
  explicit ArcMarginImpl(const FaceConfig& c) : scale(c.scale), smoothing(c.smoothing) {
    weight = register_parameter("weight", torch::empty({c.num_classes, c.emb_dim}));
    torch::nn::init::xavier_uniform_(weight);
    margin_base = register_buffer("margin_base", torch::full({1}, c.margin));
    running_norm = register_buffer("running_norm", torch::full({1}, 20.0));
  }

  torch::Tensor quality(const torch::Tensor& emb) {
    torch::NoGradGuard no_grad;
    auto norms = emb.norm(2, 1);
    if (is_training()) running_norm.mul_(0.99).add_(norms.mean(), 0.01);
    return (norms / running_norm).clamp(0.8, 1.2);
  }

  // Returns the scaled logits and the label-smoothed targets.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& emb, const torch::Tensor& labels,
                                                  const torch::Tensor& q = {}) {
    const auto B = emb.size(0), C = weight.size(0);
    auto cosine = F::linear(F::normalize(emb, F::NormalizeFuncOptions().dim(1)),
                            F::normalize(weight, F::NormalizeFuncOptions().dim(1)));
    // FACT: (lambda e, w: not backward_fails(lambda: (lambda c: (c.clamp_(-1 + 1e-7, 1 - 1e-7), (1.0 - c * c).sqrt().sum().backward()))(torch.nn.functional.linear(e, w))))(torch.randn(4, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True))
    cosine.clamp_(-1.0 + 1e-7, 1.0 - 1e-7);  // LOOKALIKE: tensor-inplace-on-saved -- linear does not save its output; the clamp precedes every use
    auto sine = torch::sqrt(1.0 - cosine * cosine);

    auto m = margin_base.expand({B});
    // FACT: raises(lambda: torch.full((1,), 0.5).expand(4).mul_(torch.rand(4)), "more than one element")
    if (q.defined()) m.mul_(q);  // EXPECT: tensor-inplace-on-expanded
    auto phi = cosine * torch::cos(m).unsqueeze(1) - sine * torch::sin(m).unsqueeze(1);
    // past theta = pi - m the angle would wrap: fall back to a CosFace-style penalty
    phi = torch::where(cosine > torch::cos(M_PI - m).unsqueeze(1), phi,
                       cosine - (torch::sin(M_PI - m) * m).unsqueeze(1));

    auto one_hot = torch::zeros({B, C});
    // FACT: (lambda y: is_view_of(y.view(-1, 1), y))(torch.randint(0, 5, (4,)))
    one_hot.scatter_(1, labels.view({-1, 1}), 1.0);  // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-view-non-contiguous -- labels is a contiguous 1-d tensor
    one_hot = one_hot.to(cosine.device());
    auto logits = one_hot * phi + (1.0 - one_hot) * cosine;
    // FACT: (lambda a, b: not backward_fails(lambda: (lambda o: (o.mul_(64.0), o.sum().backward()))(a * 2 + b * 3)))(torch.randn(2, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True))
    logits.mul_(scale);  // LOOKALIKE: tensor-inplace-on-saved -- the sum is not saved by anything
    // FACT: backward_fails(lambda: (lambda oh, phi: (lambda out: (oh.mul_(0.9).add_(0.01), out.sum().backward()))(oh * phi))(torch.zeros(2, 3).scatter_(1, torch.tensor([[0], [2]]), 1.0), torch.randn(2, 3, requires_grad=True)))
    one_hot.mul_(1.0 - smoothing).add_(smoothing / static_cast<double>(C));  // EXPECT: tensor-inplace-on-saved
    return {logits, one_hot};
  }

  // Keep class centres on the unit sphere between steps.
  void renormalize() {
    // FACT: (lambda w: raises(lambda: w.div_(w.norm(2, 1, True)), "a leaf Variable that requires grad"))(torch.randn(5, 3, requires_grad=True))
    weight.div_(weight.norm(2, 1, true));  // EXPECT: tensor-inplace-on-leaf
  }

  // Warm start from the class means of a previous run.
  void load_centers(const torch::Tensor& centers) {
    torch::NoGradGuard no_grad;
    weight.copy_(F::normalize(centers, F::NormalizeFuncOptions().dim(1)));  // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
  }

  double scale, smoothing;
  torch::Tensor weight, margin_base, running_norm;
};
TORCH_MODULE(ArcMargin);

torch::Tensor l2_normalize(const torch::Tensor& x) {
  auto y = x.clone();  // EXPECT: tensor-unnecessary-clone
  return y / y.norm(2, 1, true).clamp_min(1e-12);
}

// Embedding without and with horizontal-flip test-time augmentation.
std::pair<torch::Tensor, torch::Tensor> embed_tta(FaceNet& net, const torch::Tensor& x) {
  auto emb = net->forward(x);
  auto fused = emb;
  // FACT: (lambda e: (lambda f: (f.add_(torch.ones(2, 4)), shares_storage(f, e) and bool((e == 1).all()))[1])(e))(torch.zeros(2, 4))
  fused += net->forward(x.flip({3}));  // EXPECT: tensor-alias-then-mutate
  return {l2_normalize(emb), l2_normalize(fused)};
}

struct PairSet {
  torch::Tensor left, right, issame;
};

struct VerifyResult {
  double acc_plain, acc_flip, threshold;
};

VerifyResult verify(FaceNet& net, const PairSet& pairs, const FaceConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  const auto P = pairs.left.size(0), S = cfg.image_size;
  // interleave so that each pair sits in consecutive rows: l0, r0, l1, r1, ...
  // FACT: (lambda s: is_copy_of(s.transpose(0, 1).reshape(8, 3, 4, 4), s) and not is_contiguous(s.transpose(0, 1)))(torch.stack([torch.rand(4, 3, 4, 4), torch.rand(4, 3, 4, 4)]))
  auto images = torch::stack({pairs.left, pairs.right}).transpose(0, 1).reshape({2 * P, 3, S, S});  // EXPECT: tensor-reshape-non-contiguous
  auto opts = torch::TensorOptions().device(device);
  auto plain = torch::empty({2 * P, cfg.emb_dim}, opts), flipped = torch::empty({2 * P, cfg.emb_dim}, opts);
  for (int64_t s = 0; s < 2 * P; s += cfg.eval_batch) {
    const auto n = std::min<int64_t>(cfg.eval_batch, 2 * P - s);
    auto x = images.narrow(0, s, n).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice every iteration
    auto e = embed_tta(net, x);
    plain.narrow(0, s, n).copy_(e.first);
    flipped.narrow(0, s, n).copy_(e.second);
  }
  // fp16 dump for the offline evaluator
  auto dump = torch::empty({2 * P, cfg.emb_dim}, torch::kHalf);
  dump.copy_(flipped);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ between devices is allowed
  torch::save(dump, "lfw_embeddings_fp16.pt");

  auto pair_cosine = [P](const torch::Tensor& bank) {
    // FACT: (lambda b: is_view_of(b.view(4, 2, -1), b))(torch.empty(8, 16))
    auto v = bank.view({P, 2, -1});  // LOOKALIKE: tensor-view-non-contiguous -- the bank was allocated contiguous and filled row-wise
    return (v.select(1, 0) * v.select(1, 1)).sum(1);
  };
  auto sims_plain = pair_cosine(plain), sims_flip = pair_cosine(flipped);
  auto same = pairs.issame.to(device);
  const auto thresholds = torch::arange(-1.0, 1.0, 0.005);
  auto fold_of = torch::arange(P, opts.dtype(torch::kLong)).remainder(cfg.folds);
  std::vector<torch::Tensor> acc_plain, acc_flip, best_thr;
  for (int64_t k = 0; k < cfg.folds; ++k) {
    auto thr = thresholds.to(device);  // EXPECT: tensor-clone-in-loop
    auto train = fold_of.ne(k), test = fold_of.eq(k);
    auto train_acc = sims_flip.masked_select(train).unsqueeze(1).gt(thr)
                         .eq(same.masked_select(train).unsqueeze(1)).to(torch::kFloat).mean(0);
    auto best = thr.index({train_acc.argmax()});
    auto test_same = same.masked_select(test);
    acc_flip.push_back(sims_flip.masked_select(test).gt(best).eq(test_same).to(torch::kFloat).mean());
    acc_plain.push_back(sims_plain.masked_select(test).gt(best).eq(test_same).to(torch::kFloat).mean());
    best_thr.push_back(best);
  }
  net->train();
  return {torch::stack(acc_plain).mean().item<double>(), torch::stack(acc_flip).mean().item<double>(),
          torch::stack(best_thr).mean().item<double>()};
}

int main(int argc, char** argv) {
  FaceConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  torch::manual_seed(0);

  FaceNet net(cfg);
  ArcMargin head(cfg);
  net->to(device);
  head->to(device);
  if (argc > 1) {
    torch::Tensor centers;
    torch::load(centers, argv[1]);
    head->load_centers(centers.to(device));
  }
  auto params = net->parameters();
  for (auto& p : head->parameters()) params.push_back(p);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));

  // stand-in for the LFW pairs (bin file decoded to normalised floats, as insightface does)
  const auto S = cfg.image_size;
  PairSet pairs{torch::rand({cfg.num_pairs, 3, S, S}) * 2 - 1, torch::rand({cfg.num_pairs, 3, S, S}) * 2 - 1,
                torch::rand({cfg.num_pairs}) < 0.5};

  std::deque<torch::Tensor> loss_window;
  double best_acc = 0.0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    head->train();
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      // decoded JPEG crops and identity labels from the sharded loader
      auto batch_u8 = torch::randint(0, 256, {cfg.batch_size, 3, S, S}, torch::kUInt8);
      auto labels = torch::randint(0, cfg.num_classes, {cfg.batch_size}, torch::kLong).to(device);
      // FACT: (lambda u: is_copy_of(u.to(torch.float), u))(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))
      auto x = batch_u8.to(device).to(torch::kFloat).sub_(127.5).div_(128.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float builds a new tensor, the batch is untouched

      auto emb = net->forward(x);
      auto out = head->forward(emb, labels, cfg.adaptive_margin ? head->quality(emb) : torch::Tensor());
      auto loss = -(out.second * torch::log_softmax(out.first, 1)).sum(1).mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      if (step % cfg.renorm_every == 0) head->renormalize();

      // FACT: kept_nodes((torch.randn(4, 5, requires_grad=True) * 2).argmax(1).eq(torch.zeros(4, dtype=torch.long)).sum()) == 0
      correct += out.first.argmax(1).eq(labels).sum();  // LOOKALIKE: tensor-graph-kept-across-iterations -- argmax/eq results carry no graph
      loss_window.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (loss_window.size() > 100) loss_window.pop_front();
      if (step % cfg.log_every == 0) {
        auto smoothed = torch::stack(std::vector<torch::Tensor>(loss_window.begin(), loss_window.end())).mean();
        std::cout << "epoch " << epoch << " step " << step << " loss(avg100) " << smoothed.item<double>() << '\n';
      }
    }
    const double train_acc = correct.item<double>() / static_cast<double>(cfg.steps_per_epoch * cfg.batch_size);
    auto r = verify(net, pairs, cfg, device);
    std::cout << "epoch " << epoch << " train-acc " << train_acc << " LFW " << r.acc_plain << " / flip "
              << r.acc_flip << " @thr " << r.threshold << '\n';
    if (r.acc_flip > best_acc) {
      best_acc = r.acc_flip;
      torch::save(net, "arcface_backbone_best.pt");
    }
  }
  return 0;
}
