// Stochastic Weight Averaging (Izmailov et al., 2018) for a long-tailed CIFAR-100 classifier.
// A small ResNet is trained with SGD and a decaying learning rate; from swa_start on, the rate
// follows a saw-tooth cycle and, at the low point of every cycle, the weights are folded into a
// running average kept in a second copy of the network. The averaged weights never saw a forward
// pass, so their BatchNorm statistics are recomputed with one pass over the training data at the
// end. Evaluation compares the SGD model, the SWA model and their ensemble (accuracy, NLL) and
// reports the SWA model's calibration error.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SwaConfig {
  int64_t num_classes = 100, width = 32, epochs = 200, swa_start = 160, cycle_steps = 390, log_every = 100;
  double lr_init = 0.1, lr_final = 0.01, swa_lr_max = 0.05, swa_lr_min = 0.005;
  double momentum = 0.9, weight_decay = 5e-4, label_smoothing = 0.1, temperature = 1.0;
  int64_t ece_bins = 15;
};

struct Batch {
  torch::Tensor images, labels; // [B, 3, 32, 32] float, [B] int64
};

struct BlockImpl : nn::Module {
  BlockImpl(int64_t in, int64_t out, int64_t stride) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)));
    bn1 = register_module("bn1", nn::BatchNorm2d(out));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    bn2 = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out)
      proj = register_module("proj", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                                                    nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto out = torch::relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    // FACT: c = torch.nn.Conv2d(4, 4, 3, padding=1); b = torch.nn.BatchNorm2d(4); x = torch.randn(2, 4, 5, 5); o = b(c(x)); o += x; o.relu().sum().backward(); assert c.weight.grad is not None
    out += proj.is_empty() ? x : proj->forward(x); // LOOKALIKE: tensor-inplace-on-saved -- batch norm does not save its output
    return torch::relu(out);
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  nn::Sequential proj{nullptr};
};
TORCH_MODULE(Block);

struct ResNetImpl : nn::Module {
  explicit ResNetImpl(const SwaConfig &cfg) {
    const auto w = cfg.width;
    stem = register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, w, 3).padding(1).bias(false)));
    stem_bn = register_module("stem_bn", nn::BatchNorm2d(w));
    blocks = register_module("blocks", nn::Sequential(Block(w, w, 1), Block(w, w, 1), Block(w, 2 * w, 2), Block(2 * w, 2 * w, 1),
                                                      Block(2 * w, 4 * w, 2), Block(4 * w, 4 * w, 1)));
    fc = register_module("fc", nn::Linear(4 * w, cfg.num_classes));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = blocks->forward(torch::relu(stem_bn(stem(x))));
    h = F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: h = torch.nn.functional.adaptive_avg_pool2d(torch.randn(4, 16, 8, 8), 1); assert is_view_of(h.flatten(1), h)
    return fc(h.flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled map is contiguous: flatten is a view
  }
  nn::Conv2d stem{nullptr};
  nn::BatchNorm2d stem_bn{nullptr};
  nn::Sequential blocks{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet);

// The averaged weights live in a second network of the same architecture.
class SwaAverager {
public:
  SwaAverager(const SwaConfig &cfg, torch::Device device) : swa_(cfg) { swa_->to(device); }

  // swa <- swa + (w - swa) / (n + 1): the running mean of every snapshot folded in so far.
  void update(ResNet &model) {
    auto src = model->parameters(), dst = swa_->parameters();
    if (n_averaged_ == 0) {
      for (size_t i = 0; i < dst.size(); ++i)
        // FACT: p = torch.nn.Parameter(torch.zeros(3, 4)); assert raises(lambda: p.copy_(torch.randn(3, 4)), "a leaf Variable that requires grad")
        dst[i].copy_(src[i]); // EXPECT: tensor-inplace-on-leaf -- the first snapshot is copied with grad mode on: PyTorch refuses it
    } else {
      torch::NoGradGuard no_grad;
      const double k = 1.0 / static_cast<double>(n_averaged_ + 1);
      for (size_t i = 0; i < dst.size(); ++i)
        // FACT: d = torch.randn(3, 4); s = torch.randn(3, 4); e = d + (s - d) * 0.25; d.add_(s - d, alpha=0.25); assert torch.allclose(d, e)
        dst[i].add_(src[i] - dst[i], k); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-overlap -- under NoGradGuard; the difference is a new tensor
    }
    ++n_averaged_;
  }

  // One pass over the training data in train mode with a cumulative average (momentum None), so
  // the running statistics are those of the averaged weights.
  void update_bn(const std::vector<Batch> &loader, torch::Device device) {
    std::vector<std::pair<nn::BatchNorm2dImpl *, c10::optional<double>>> momenta;
    for (auto &m : swa_->modules(/*include_self=*/false)) {
      if (auto *bn = m->as<nn::BatchNorm2d>()) {
        // FACT: b = torch.nn.BatchNorm2d(4); b.running_mean.zero_(); assert not b.running_mean.requires_grad
        bn->running_mean.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- a buffer, not a parameter
        bn->running_var.fill_(1.0);
        bn->num_batches_tracked.zero_();
        momenta.emplace_back(bn, bn->options.momentum());
        bn->options.momentum(c10::nullopt);
      }
    }
    swa_->train();
    torch::NoGradGuard no_grad;
    for (const auto &batch : loader)
      swa_->forward(batch.images.to(device)); // LOOKALIKE: tensor-clone-in-loop -- each batch is moved once
    for (auto &[bn, momentum] : momenta)
      bn->options.momentum(momentum);
  }

  ResNet &model() { return swa_; }
  int64_t count() const { return n_averaged_; }

private:
  ResNet swa_;
  int64_t n_averaged_ = 0;
};

// L2 distance between the current SGD weights and the running average.
double weight_distance(ResNet &model, ResNet &swa) {
  auto cur = model->parameters(), avg = swa->parameters();
  auto sq = torch::zeros({}, cur.front().options());
  for (size_t i = 0; i < cur.size(); ++i) {
    auto d = cur[i].detach();
    // FACT: p = torch.nn.Parameter(torch.randn(3, 4)); p0 = p.detach().clone(); d = p.detach(); d.sub_(torch.randn(3, 4)); assert shares_storage(d, p) and not torch.equal(p.detach(), p0)
    d.sub_(avg[i].detach()); // EXPECT: tensor-inplace-on-detached -- d is the live weight: the SGD model loses the average at every report
    sq += d.pow(2).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- computed from detached weights: no graph
  }
  return sq.sqrt().item<double>();
}

struct EvalResult {
  double sgd_acc = 0, swa_acc = 0, ens_acc = 0, swa_nll = 0;
};

EvalResult evaluate(ResNet &model, ResNet &swa, const std::vector<Batch> &test, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  swa->eval();
  auto opts = torch::TensorOptions().device(device);
  auto hit_sgd = torch::zeros({}, opts.dtype(torch::kLong)), hit_swa = torch::zeros({}, opts.dtype(torch::kLong));
  auto hit_ens = torch::zeros({}, opts.dtype(torch::kLong));
  auto nll = torch::zeros({}, opts);
  int64_t n = 0;
  for (const auto &batch : test) {
    auto x = batch.images.to(device), y = batch.labels.to(device);
    auto p_sgd = torch::softmax(model->forward(x), 1);
    auto p_swa = torch::softmax(swa->forward(x), 1);
    auto p_ens = p_swa;
    // FACT: a = torch.rand(4, 5).softmax(1); b = torch.rand(4, 5).softmax(1); e = a; e.add_(b).mul_(0.5); assert shares_storage(e, a) and torch.allclose(a, e)
    p_ens.add_(p_sgd).mul_(0.5); // EXPECT: tensor-alias-then-mutate -- p_ens is p_swa: the "SWA" accuracy and NLL below are the ensemble's
    hit_sgd += (p_sgd.argmax(1) == y).sum();
    hit_swa += (p_swa.argmax(1) == y).sum();
    hit_ens += (p_ens.argmax(1) == y).sum();
    nll += F::nll_loss(p_swa.clamp_min(1e-12).log(), y, F::NLLLossFuncOptions().reduction(torch::kSum)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    n += y.size(0);
  }
  const auto N = static_cast<double>(n);
  return {hit_sgd.item<double>() / N, hit_swa.item<double>() / N, hit_ens.item<double>() / N, nll.item<double>() / N};
}

// Expected calibration error of the (temperature-scaled) confidence over equal-width bins.
double expected_calibration_error(ResNet &net, const std::vector<Batch> &data, const SwaConfig &cfg, torch::Device device) {
  net->eval();
  auto temperature = torch::tensor(cfg.temperature);
  std::vector<torch::Tensor> confs, hits;
  for (const auto &batch : data) {
    auto probs = torch::softmax(net->forward(batch.images.to(device)) / temperature, 1); // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor is accepted next to CUDA tensors
    auto [conf, pred] = probs.max(1);
    confs.push_back(conf); // EXPECT: tensor-graph-kept-across-iterations -- no NoGradGuard here: every batch's forward graph and activations are kept to the end
    hits.push_back((pred == batch.labels.to(device)).to(torch::kFloat)); // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison has no gradient
  }
  auto c = torch::cat(confs).cpu();
  // FACT: x = torch.rand(5); c = torch.cat([x, x]).cpu(); c.clamp_max_(1.0); assert is_copy_of(c, x)
  c.clamp_max_(1.0); // LOOKALIKE: tensor-alias-then-mutate -- cat made a new tensor; no other handle sees it
  auto h = torch::cat(hits).cpu();
  auto edges = torch::linspace(0.0, 1.0, cfg.ece_bins + 1);
  double ece = 0;
  for (int64_t b = 0; b < cfg.ece_bins; ++b) {
    auto in_bin = (c > edges[b]) & (c <= edges[b + 1]);
    const auto count = in_bin.sum().item<double>(); // LOOKALIKE: tensor-sync-in-loop -- host tensors, and the count is compared
    if (count == 0)
      continue;
    ece += count / static_cast<double>(c.size(0)) *
           std::abs(c.masked_select(in_bin).mean().item<double>() - h.masked_select(in_bin).mean().item<double>()); // LOOKALIKE: tensor-sync-in-loop -- host tensors: there is no device to wait for
  }
  return ece;
}

// Saw-tooth schedule of the SWA phase: from swa_lr_max down to swa_lr_min over each cycle.
double cyclic_lr(int64_t swa_step, const SwaConfig &cfg) {
  const double t = static_cast<double>(swa_step % cfg.cycle_steps) / static_cast<double>(cfg.cycle_steps - 1);
  return (1.0 - t) * cfg.swa_lr_max + t * cfg.swa_lr_min;
}

void train_swa(ResNet &model, const std::vector<Batch> &train, const std::vector<Batch> &test, const torch::Tensor &class_weights,
               const SwaConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  SwaAverager swa(cfg, device);
  torch::optim::SGD opt(model->parameters(),
                        torch::optim::SGDOptions(cfg.lr_init).momentum(cfg.momentum).weight_decay(cfg.weight_decay).nesterov(true));
  int64_t swa_step = 0, step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    const bool swa_phase = epoch >= cfg.swa_start;
    const double frac = std::min(1.0, static_cast<double>(epoch) / static_cast<double>(cfg.swa_start));
    double epoch_loss = 0;
    for (const auto &batch : train) {
      const double lr = swa_phase ? cyclic_lr(swa_step, cfg) : cfg.lr_init + (cfg.lr_final - cfg.lr_init) * frac;
      for (auto &group : opt.param_groups())
        static_cast<torch::optim::SGDOptions &>(group.options()).lr(lr);
      auto x = batch.images.to(device), y = batch.labels.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto logits = model->forward(x);
      auto loss = F::cross_entropy(logits, y,
                                   F::CrossEntropyFuncOptions().weight(class_weights.to(device)).label_smoothing(cfg.label_smoothing)); // EXPECT: tensor-clone-in-loop -- the same class weights are copied to the device at every step
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU every step waits here only to sum the loss
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " lr " << lr << " loss " << loss.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      if (swa_phase && ++swa_step % cfg.cycle_steps == 0)
        swa.update(model); // at the low point of the cycle
    }
    std::cout << "epoch " << epoch << " mean loss " << epoch_loss / static_cast<double>(train.size());
    if (swa.count() > 0)
      std::cout << " snapshots " << swa.count() << " distance to average " << weight_distance(model, swa.model());
    std::cout << "\n";
  }
  swa.update_bn(train, device);
  const auto res = evaluate(model, swa.model(), test, device);
  std::cout << "test acc: sgd " << res.sgd_acc << " swa " << res.swa_acc << " ensemble " << res.ens_acc << ", swa nll "
            << res.swa_nll << ", swa ece " << expected_calibration_error(swa.model(), test, cfg, device) << "\n";
}
