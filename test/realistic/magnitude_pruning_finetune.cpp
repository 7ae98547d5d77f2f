// Global magnitude pruning of a small CNN classifier (Han et al. 2015, with the cubic sparsity
// schedule of Zhu & Gupta 2017): one threshold over the scores of every prunable weight, binary
// masks kept per tensor, fine-tuning with the masks re-applied after each optimizer step, a
// per-layer sparsity report and an fp16 export for the sparse inference kernels.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

struct PruneConfig {
  double target_sparsity = 0.9;
  int rounds = 4, finetune_epochs = 2;
  double lr = 1e-2, momentum = 0.9, weight_decay = 5e-4;
  bool channel_prior = true;         // favour input channels that carry much total magnitude
  double min_channel_density = 0.05; // drop conv output channels left almost empty
};

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t n_classes) {
    namespace nn = torch::nn;
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(3, 64, 3).padding(1)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(64, 128, 3).padding(1)));
    conv3 = register_module("conv3", nn::Conv2d(nn::Conv2dOptions(128, 256, 3).padding(1)));
    bn3 = register_module("bn3", nn::BatchNorm2d(256));
    fc = register_module("fc", nn::Linear(256, n_classes));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(bn3(conv3(x)));
    // FACT: p = torch.nn.functional.adaptive_avg_pool2d(torch.randn(2, 8, 5, 5), 1); assert is_view_of(p.flatten(1), p)
    return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1)); // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled [B, C, 1, 1] map is contiguous: a view
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn3{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

// The dense checkpoint the pruning starts from (name -> tensor, written by the trainer).
void load_dense(Net &net, const std::map<std::string, torch::Tensor> &ckpt) {
  auto named = net->named_parameters();
  for (const auto &kv : ckpt) {
    TORCH_CHECK(named.contains(kv.first), "unexpected key ", kv.first);
    // FACT: w = torch.nn.Conv2d(3, 4, 3).weight; assert raises(lambda: w.copy_(torch.zeros(4, 3, 3, 3)), "a leaf Variable that requires grad")
    named[kv.first].copy_(kv.second); // EXPECT: tensor-inplace-on-leaf -- weights loaded with grad mode on
  }
}

class Pruner {
public:
  Pruner(Net net, const PruneConfig &cfg) : net_(std::move(net)), cfg_(cfg) {
    for (auto &kv : net_->named_parameters())
      if (kv.value().dim() > 1) { // biases and norms stay dense
        names_.push_back(kv.key());
        masks_.push_back(torch::ones_like(kv.value()));
      }
  }

  torch::Tensor weight(size_t i) { return net_->named_parameters()[names_[i]]; }

  // |w|, optionally scaled by how much magnitude the weight's input channel carries overall.
  torch::Tensor score(size_t i) {
    auto mag = weight(i).detach();
    // FACT: p = torch.nn.Conv2d(4, 8, 3).weight; m = p.detach(); m.abs_(); assert shares_storage(m, p) and bool((p >= 0).all())
    mag.abs_(); // EXPECT: tensor-inplace-on-detached -- detach() shares the weight's storage: every weight becomes |w|
    if (cfg_.channel_prior && mag.dim() == 4) {
      // FACT: w = torch.randn(8, 4, 3, 3); assert is_copy_of(w.transpose(0, 1).flatten(1), w)
      auto per_in = mag.transpose(0, 1).flatten(1).sum(1); // EXPECT: tensor-reshape-non-contiguous -- [I, O*k*k] cannot be a view of the transposed weight: the whole kernel is copied
      // FACT: s = torch.randn(4, 8, 9).abs().sum(2).sum(1); r = s / s.mean(); assert is_view_of(r.view(1, -1, 1, 1), r)
      mag = mag * (per_in / per_in.mean()).view({1, -1, 1, 1}); // LOOKALIKE: tensor-view-non-contiguous -- a reduction result is contiguous
    }
    return mag * masks_[i]; // what is pruned stays pruned
  }

  // One global threshold: the k-th smallest score over every prunable weight.
  void prune_to(double sparsity) {
    std::vector<torch::Tensor> flat;
    for (size_t i = 0; i < names_.size(); ++i)
      flat.push_back(score(i).flatten()); // LOOKALIKE: tensor-reshape-non-contiguous -- the score is a fresh product, contiguous
    auto all = torch::cat(flat);
    const auto k = static_cast<int64_t>(sparsity * static_cast<double>(all.numel()));
    if (k < 1)
      return;
    auto thr = std::get<0>(all.kthvalue(k));
    for (size_t i = 0; i < names_.size(); ++i)
      masks_[i] = (score(i) > thr).to(masks_[i].dtype());
    if (cfg_.min_channel_density > 0)
      drop_sparse_channels(cfg_.min_channel_density);
    apply();
  }

  // Conv output channels whose mask kept almost nothing are removed as a whole.
  void drop_sparse_channels(double min_density) {
    for (size_t i = 0; i < masks_.size(); ++i) {
      if (masks_[i].dim() != 4)
        continue;
      // FACT: m = (torch.rand(8, 4, 3, 3) > 0.5).float(); assert is_view_of(m.flatten(1), m)
      auto alive = masks_[i].flatten(1).mean(1) >= min_density; // LOOKALIKE: tensor-reshape-non-contiguous -- masks are made by to(), contiguous
      auto ch = alive.to(masks_[i].dtype()).view({-1, 1, 1, 1}).expand_as(masks_[i]);
      // FACT: m = (torch.rand(8, 4, 3, 3) > 0.5).float(); c = (m.flatten(1).mean(1) > 0.3).float().view(-1, 1, 1, 1).expand_as(m); assert raises(lambda: c.mul_(m), "more than one element of the written-to tensor refers to a single memory location")
      ch.mul_(masks_[i]); // EXPECT: tensor-inplace-on-expanded -- ch is the channel mask broadcast over [O, I, k, k] with stride 0
      masks_[i] = ch;
    }
  }

  void apply() {
    torch::NoGradGuard no_grad;
    auto named = net_->named_parameters();
    for (size_t i = 0; i < names_.size(); ++i)
      named[names_[i]].mul_(masks_[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  // Pruned weights get no gradient, so weight decay and momentum do not move them.
  void mask_grads() {
    auto named = net_->named_parameters();
    for (size_t i = 0; i < names_.size(); ++i) {
      auto g = named[names_[i]].grad();
      // FACT: w = torch.nn.Linear(3, 2).weight; w.sum().backward(); g = w.grad; g.mul_(torch.zeros(2, 3)); assert bool((w.grad == 0).all())
      if (g.defined())
        g.mul_(masks_[i]); // LOOKALIKE: tensor-inplace-on-leaf, tensor-alias-then-mutate -- the gradient, which is meant to be masked in place
    }
  }

  void report(std::ostream &os) {
    auto named = net_->named_parameters();
    std::vector<torch::Tensor> zeros;
    for (size_t i = 0; i < names_.size(); ++i)
      zeros.push_back((named[names_[i]] == 0).sum());
    auto z = torch::stack(zeros).cpu(); // one transfer for the whole table
    auto za = z.accessor<int64_t, 1>();
    int64_t all_zero = 0, total = 0;
    for (size_t i = 0; i < names_.size(); ++i) {
      os << "  " << names_[i] << ": " << 100.0 * za[i] / masks_[i].numel() << "% zero\n";
      all_zero += za[i];
      total += masks_[i].numel();
    }
    os << "  global: " << 100.0 * all_zero / std::max<int64_t>(total, 1) << "% zero\n";
  }

  // fp16 weights with exact zeros for the sparse kernels.
  std::map<std::string, torch::Tensor> export_half() {
    std::map<std::string, torch::Tensor> out;
    auto named = net_->named_parameters();
    for (size_t i = 0; i < names_.size(); ++i) {
      auto w = named[names_[i]].detach().to(torch::kHalf);
      // FACT: p = torch.nn.Linear(3, 2).weight; h = p.detach().to(torch.half); h.mul_(0); assert is_copy_of(h, p) and bool((p != 0).any())
      w.mul_(masks_[i].to(torch::kHalf)); // LOOKALIKE: tensor-inplace-on-detached, tensor-alias-then-mutate -- to(kHalf) of a float32 weight is a copy
      out[names_[i]] = w;
    }
    return out;
  }

private:
  Net net_;
  PruneConfig cfg_;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> masks_;
};

void finetune(Net &net, Pruner &pr, const std::vector<torch::data::Example<>> &train, const PruneConfig &cfg) {
  torch::Device device(torch::kCUDA);
  torch::optim::SGD opt(net->parameters(),
                        torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum).weight_decay(cfg.weight_decay));
  for (int epoch = 0; epoch < cfg.finetune_epochs; ++epoch) {
    net->train();
    std::vector<torch::Tensor> losses;
    for (const auto &b : train) {
      auto x = b.data.to(device), y = b.target.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
      auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      opt.zero_grad();
      loss.backward();
      pr.mask_grads();
      opt.step();
      pr.apply(); // momentum can still move pruned weights
      // FACT: m = torch.nn.Linear(3, 2); ls = [torch.nn.functional.cross_entropy(m(torch.randn(4, 3)), torch.tensor([0, 1, 1, 0])) for _ in range(3)]; [l.backward() for l in ls]; assert all(l.grad_fn is not None for l in ls) and kept_nodes(ls) > kept_nodes(ls[0])
      losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations -- every step's graph stays alive until the epoch's log line
    }
    std::cout << "  epoch " << epoch << " loss " << torch::stack(losses).mean().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the loop of steps
  }
}

double accuracy(Net &net, const std::vector<torch::data::Example<>> &val) {
  torch::NoGradGuard no_grad;
  net->eval();
  torch::Device device(torch::kCUDA);
  int64_t correct = 0, seen = 0;
  for (const auto &b : val) {
    auto pred = net->forward(b.data.to(device)).argmax(1);
    correct += pred.eq(b.target.to(device)).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU after every batch only to add up a count
    seen += b.target.size(0);
  }
  return static_cast<double>(correct) / static_cast<double>(std::max<int64_t>(seen, 1));
}

std::map<std::string, torch::Tensor> prune_and_finetune(const std::map<std::string, torch::Tensor> &ckpt,
                                                        const std::vector<torch::data::Example<>> &train,
                                                        const std::vector<torch::data::Example<>> &val,
                                                        const PruneConfig &cfg) {
  Net net(10);
  load_dense(net, ckpt);
  net->to(torch::Device(torch::kCUDA));
  Pruner pr(net, cfg);
  std::cout << "dense accuracy " << accuracy(net, val) << "\n";
  for (int r = 1; r <= cfg.rounds; ++r) {
    const double s = cfg.target_sparsity * (1 - std::pow(1 - static_cast<double>(r) / cfg.rounds, 3));
    pr.prune_to(s);
    finetune(net, pr, train, cfg);
    std::cout << "round " << r << " target sparsity " << s << " accuracy " << accuracy(net, val) << "\n";
    pr.report(std::cout);
  }
  return pr.export_half();
}
