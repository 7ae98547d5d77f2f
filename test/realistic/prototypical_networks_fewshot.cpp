// Prototypical networks (Snell et al., 2017): a Conv-4 embedding meta-trained on
// N-way K-shot episodes, class prototypes as mean support embeddings, logits from
// negative squared Euclidean distance, and meta-test accuracy with a 95% interval.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <utility>

namespace {

struct ProtoConfig {
  int64_t n_way = 5;
  int64_t k_shot = 5;
  int64_t n_query = 15;
  int64_t train_way = 20;  // higher way during meta-training, as in the paper
  int64_t channels = 3;
  int64_t image = 84;
  int64_t hidden = 64;
  int64_t n_train_classes = 64;
  int64_t n_test_classes = 16;
  int64_t per_class = 30;
  int64_t episodes = 20000;
  int64_t eval_episodes = 600;
  int64_t log_every = 200;
  int64_t lr_step = 2000;
  double lr = 1e-3;
};

struct Episode {
  torch::Tensor support;
  torch::Tensor query;
  torch::Tensor labels;
};

struct ConvBlockImpl : torch::nn::Module {
  ConvBlockImpl(int64_t in, int64_t out)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(out))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return torch::max_pool2d(torch::relu(bn(conv(x))), 2);
  }

  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvBlock);

struct Conv4Impl : torch::nn::Module {
  Conv4Impl(int64_t in, int64_t hid) {
    blocks = register_module("blocks", torch::nn::Sequential(ConvBlock(in, hid), ConvBlock(hid, hid),
                                                             ConvBlock(hid, hid), ConvBlock(hid, hid)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // FACT: y=torch.nn.Sequential(torch.nn.Conv2d(3,4,3,padding=1),torch.nn.BatchNorm2d(4),torch.nn.ReLU(),torch.nn.MaxPool2d(2))(torch.cat([torch.randn(2,3,10,10).contiguous(memory_format=torch.channels_last)]*2)); assert not is_contiguous(y) and is_copy_of(y.flatten(1), y)
    return blocks->forward(x).flatten(1);  // EXPECT: tensor-reshape-non-contiguous
  }

  torch::nn::Sequential blocks{nullptr};
};
TORCH_MODULE(Conv4);

torch::Tensor squared_euclidean(const torch::Tensor& a, const torch::Tensor& b) {
  auto diff = a.unsqueeze(1) - b.unsqueeze(0);
  return diff.pow_(2).sum(-1);  // LOOKALIKE: tensor-inplace-on-saved -- diff is the output of a subtraction, which saves nothing for backward
}

struct ProtoNetImpl : torch::nn::Module {
  explicit ProtoNetImpl(const ProtoConfig& cfg)
      : encoder(register_module("encoder", Conv4(cfg.channels, cfg.hidden))) {
    log_scale = register_parameter("log_scale", torch::zeros({1}));
  }

  torch::Tensor forward(const torch::Tensor& support, const torch::Tensor& query, int64_t n_way) {
    const auto n_support = support.size(0);
    auto z = encoder(torch::cat({support, query}));
    // FACT: z=torch.randn(40,16); assert is_view_of(z.narrow(0,0,10).view(5,2,16), z)
    auto protos = z.narrow(0, 0, n_support).view({n_way, n_support / n_way, -1}).mean(1);  // LOOKALIKE: tensor-view-non-contiguous -- a leading slice of a contiguous batch is contiguous
    auto zq = z.narrow(0, n_support, query.size(0));
    return -squared_euclidean(zq, protos) * torch::exp(log_scale);
  }

  Conv4 encoder;
  torch::Tensor log_scale;
};
TORCH_MODULE(ProtoNet);

// Synthetic stand-in for mini-ImageNet: smooth class templates plus noise and jitter.
torch::Tensor make_classes(int64_t n_classes, const ProtoConfig& cfg, std::mt19937& rng) {
  const auto S = cfg.image;
  auto templates = 3.0 * torch::avg_pool2d(torch::randn({n_classes, cfg.channels, S, S}), {7, 7}, {1, 1}, {3, 3});
  auto data = torch::empty({n_classes, cfg.per_class, cfg.channels, S, S});
  std::uniform_int_distribution<int64_t> jitter(-4, 4);
  for (int64_t c = 0; c < n_classes; ++c) {
    for (int64_t i = 0; i < cfg.per_class; ++i) {
      auto img = templates[c];
      // FACT: t=torch.randn(5,3,8,8); assert is_view_of(t[2], t)
      img.add_(torch::randn_like(img), 0.3);  // EXPECT: tensor-alias-then-mutate
      data[c][i].copy_(torch::roll(img, {jitter(rng), jitter(rng)}, {1, 2}));
    }
  }
  return data;
}

Episode sample_episode(const torch::Tensor& data, int64_t n_way, int64_t k_shot, int64_t n_query) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).device(data.device());
  auto classes = torch::randperm(data.size(0), opts).narrow(0, 0, n_way);
  auto shots = torch::randperm(data.size(1), opts);
  auto picked = data.index_select(0, classes);
  // FACT: d=torch.randn(5,6,3,4,4); p=d.index_select(1, torch.tensor([3,0])); assert is_contiguous(p) and is_view_of(p.flatten(0,1), p)
  auto support = picked.index_select(1, shots.narrow(0, 0, k_shot)).flatten(0, 1);  // LOOKALIKE: tensor-reshape-non-contiguous -- index_select returns a contiguous gather, flatten is a view
  auto query = picked.index_select(1, shots.narrow(0, k_shot, n_query)).flatten(0, 1);
  auto labels = torch::arange(n_way, opts).repeat_interleave(n_query);  // LOOKALIKE: tensor-device-mismatch -- built on the episode's device
  return {support, query, labels};
}

// Mean pairwise distance between prototypes, logged as a collapse diagnostic.
double prototype_spread(ProtoNet& model, const Episode& e, int64_t n_way) {
  torch::NoGradGuard no_grad;
  auto z = model->encoder(e.support);
  auto protos = z.view({n_way, -1, z.size(1)}).mean(1);
  auto d = squared_euclidean(protos, protos);
  // FACT: raises(lambda: (lambda x: x.add_(x.t()))(torch.randn(5,5)), "some elements of the input tensor")
  d.add_(d.t()).div_(2.0);  // EXPECT: tensor-inplace-overlap
  return d.sum().item<double>() / static_cast<double>(n_way * (n_way - 1));
}

std::pair<double, double> evaluate(ProtoNet& model, const torch::Tensor& test_set,
                                   const ProtoConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto pool = test_set.to(device);  // LOOKALIKE: tensor-clone-in-loop -- moved once, before the episode loop
  auto accs = torch::empty({cfg.eval_episodes}, torch::TensorOptions().dtype(torch::kFloat).device(device));
  auto labels = torch::arange(cfg.n_way).repeat_interleave(cfg.n_query);
  for (int64_t i = 0; i < cfg.eval_episodes; ++i) {
    auto e = sample_episode(pool, cfg.n_way, cfg.k_shot, cfg.n_query);
    auto logits = model->forward(e.support, e.query, cfg.n_way);
    auto hits = logits.argmax(1).eq(labels);  // EXPECT: tensor-device-mismatch
    accs[i] = hits.to(torch::kDouble).mean();  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-sync-in-loop -- stays on the device, read once after the loop
  }
  auto host = accs.cpu().clone();  // EXPECT: tensor-unnecessary-clone
  const double mean = host.mean().item<double>();
  const double ci95 = 1.96 * host.std().item<double>() / std::sqrt(static_cast<double>(cfg.eval_episodes));
  return {mean, ci95};
}

}  // namespace

int main() {
  torch::manual_seed(1);
  std::mt19937 rng(1);
  if (!torch::cuda::is_available()) {
    std::cerr << "meta-training expects a CUDA device\n";
    return 1;
  }
  torch::Device device(torch::kCUDA);
  ProtoConfig cfg;

  auto pool = make_classes(cfg.n_train_classes + cfg.n_test_classes, cfg, rng);
  auto order = torch::randperm(pool.size(0));
  auto train_set = pool.index_select(0, order.narrow(0, 0, cfg.n_train_classes));
  auto test_set = pool.index_select(0, order.narrow(0, cfg.n_train_classes, cfg.n_test_classes));
  const double mu = train_set.mean().item<double>();
  const double sd = train_set.std().item<double>();
  // FACT: p=torch.randn(6,3,1,4,4); s=p.index_select(0, torch.tensor([4,1])); assert is_copy_of(s, p)
  train_set.sub_(mu).div_(sd);  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathered a copy, pool is untouched
  test_set.sub_(mu).div_(sd);

  ProtoNet model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  torch::optim::StepLR sched(opt, cfg.lr_step, 0.5);

  auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  double acc_sum = 0.0;
  for (int64_t ep = 1; ep <= cfg.episodes; ++ep) {
    model->train();
    auto e = sample_episode(train_set.to(device), cfg.train_way, cfg.k_shot, cfg.n_query);  // EXPECT: tensor-clone-in-loop
    auto s = e.support.contiguous(torch::MemoryFormat::ChannelsLast);
    auto q = e.query.contiguous(torch::MemoryFormat::ChannelsLast);

    auto log_p = torch::log_softmax(model->forward(s, q, cfg.train_way), 1);
    auto loss = torch::nll_loss(log_p, e.labels);
    // FACT: backward_fails(lambda: (lambda lp: (torch.nn.functional.nll_loss(lp, torch.tensor([0,1])), lp.exp_())[0].backward())(torch.randn(2,3,requires_grad=True).log_softmax(1)))
    auto probs = log_p.exp_();  // EXPECT: tensor-inplace-on-saved
    auto acc = probs.argmax(1).eq(e.labels).to(torch::kFloat).mean();

    opt.zero_grad();
    loss.backward();
    opt.step();
    sched.step();
    {
      torch::NoGradGuard no_grad;
      model->log_scale.clamp_(-2.0, 4.0);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }

    loss_sum = loss_sum + loss;  // EXPECT: tensor-graph-kept-across-iterations
    acc_sum += acc.item<double>();  // EXPECT: tensor-sync-in-loop
    if (ep % cfg.log_every == 0) {
      const double spread = prototype_spread(model, e, cfg.train_way);
      std::printf("episode %lld  loss %.4f  acc %.3f  proto spread %.2f\n", static_cast<long long>(ep),
                  loss_sum.item<double>() / cfg.log_every, acc_sum / cfg.log_every, spread);
      loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
      acc_sum = 0.0;
    }
  }

  auto [mean, ci95] = evaluate(model, test_set, cfg, device);
  std::printf("%lld-way %lld-shot accuracy: %.2f%% +- %.2f%%\n", static_cast<long long>(cfg.n_way),
              static_cast<long long>(cfg.k_shot), 100.0 * mean, 100.0 * ci95);
  return 0;
}
