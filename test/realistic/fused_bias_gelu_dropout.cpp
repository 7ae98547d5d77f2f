// Fused bias + GELU (tanh approximation) + dropout as a single autograd node.
// Used in the feed-forward block of a small conv-frontend sequence classifier;
// the hand-written backward recomputes the pre-activation instead of storing it.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

struct ModelConfig {
  int64_t in_channels = 40;
  int64_t channels = 256;
  int64_t hidden = 1024;
  int64_t num_classes = 12;
  double dropout = 0.1;
  double gate_scale = 2.0;
};

struct TrainConfig {
  int64_t epochs = 10;
  int64_t batch_size = 32;
  int64_t accum_steps = 2;
  double lr = 3e-4;
  double weight_decay = 0.01;
  double head_clip = 3.0;
  int64_t log_every = 50;
};

torch::Tensor gelu_tanh_inner(const torch::Tensor& x) {
  return torch::tanh(kSqrt2OverPi * (x + kGeluCoeff * x.pow(3)));
}

torch::Tensor gelu_grad(const torch::Tensor& x) {
  auto t = gelu_tanh_inner(x);
  auto dt = kSqrt2OverPi * (1.0 + 3.0 * kGeluCoeff * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dt;
}

class BiasGeluDropout : public torch::autograd::Function<BiasGeluDropout> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               torch::Tensor x, torch::Tensor bias, double p,
                               bool train) {
    // FACT: x = torch.randn(6, 8); pre = x.contiguous(); pre.add_(1.0); assert shares_storage(pre, x) and torch.equal(pre, x)
    auto pre = x.contiguous();
    pre.add_(bias); // EXPECT: tensor-alias-then-mutate
    auto act = 0.5 * pre * (1.0 + gelu_tanh_inner(pre));

    torch::Tensor keep;
    // FACT: act = torch.randn(6, 8) * 2.0; out = act; assert shares_storage(out, act) and act._version == 0
    auto out = act;
    if (train && p > 0.0) {
      keep = torch::rand(act.sizes()) >= p;
      out.mul_(keep); // EXPECT: tensor-device-mismatch // LOOKALIKE: tensor-alias-then-mutate -- act is a local temporary that nothing reads after this point
      out.mul_(1.0 / (1.0 - p));
    } else {
      keep = torch::ones_like(act, torch::kBool);
    }

    ctx->save_for_backward({x, bias, keep});
    ctx->saved_data["p"] = p;
    ctx->saved_data["train"] = train;
    return out;
  }

  static torch::autograd::variable_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& bias = saved[1];
    const auto& keep = saved[2];
    const double p = ctx->saved_data["p"].toDouble();
    const bool train = ctx->saved_data["train"].toBool();

    auto grad_out = grad_outputs[0].contiguous();
    auto grad = grad_out.clone(); // EXPECT: tensor-unnecessary-clone
    if (train && p > 0.0) {
      grad.mul_(keep).mul_(1.0 / (1.0 - p));
    }
    auto grad_pre = grad * gelu_grad(x + bias);
    const int64_t h = bias.size(0);
    // FACT: t = torch.randn(6, 8) * torch.randn(6, 8); assert is_contiguous(t) and is_view_of(t.view(-1, 8), t)
    auto grad_bias = grad_pre.view({-1, h}).sum(0); // LOOKALIKE: tensor-view-non-contiguous -- grad_pre is the fresh product of two contiguous tensors
    return {grad_pre, grad_bias, torch::Tensor(), torch::Tensor()};
  }
};

struct ActivationMonitor {
  std::map<std::string, torch::Tensor> peak;

  void record(const std::string& name, const torch::Tensor& t) {
    auto a = t.detach();
    a.abs_(); // EXPECT: tensor-inplace-on-detached
    auto m = a.amax();
    auto it = peak.find(name);
    if (it == peak.end()) {
      peak.emplace(name, m);
    } else {
      it->second = torch::maximum(it->second, m);
    }
  }
};

struct FusedFfnImpl : torch::nn::Module {
  explicit FusedFfnImpl(const ModelConfig& cfg) : cfg_(cfg) {
    fc1 = register_module(
        "fc1", torch::nn::Linear(
                   torch::nn::LinearOptions(cfg.channels, cfg.hidden).bias(false)));
    gate = register_module("gate", torch::nn::Linear(cfg.channels, cfg.hidden));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.hidden, cfg.channels));
    bias1 = register_parameter("bias1", torch::empty({cfg.hidden}));

    const double bound = 1.0 / std::sqrt(static_cast<double>(cfg.channels));
    bias1.uniform_(-bound, bound); // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::zeros_(fc2->bias); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under their own NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // FACT: x = torch.nn.functional.layer_norm(torch.randn(10, 8), (8,)); assert is_view_of(x.reshape(-1, 8), x)
    auto x2d = x.reshape({-1, x.size(-1)}); // LOOKALIKE: tensor-reshape-non-contiguous -- the layer-norm output is contiguous, so this is a view
    auto h = BiasGeluDropout::apply(fc1->forward(x2d), bias1, cfg_.dropout,
                                    is_training());
    auto g = torch::sigmoid(gate->forward(x2d));
    // FACT: x = torch.randn(3, 4, requires_grad=True); assert backward_fails(lambda: (lambda g: (g.mul_(2.0), (x * g).sum().backward()))(torch.sigmoid(x)))
    g.mul_(cfg_.gate_scale); // EXPECT: tensor-inplace-on-saved
    return fc2->forward(h * g);
  }

  ModelConfig cfg_;
  torch::nn::Linear fc1{nullptr}, gate{nullptr}, fc2{nullptr};
  torch::Tensor bias1;
};
TORCH_MODULE(FusedFfn);

struct SeqClassifierImpl : torch::nn::Module {
  explicit SeqClassifierImpl(const ModelConfig& cfg)
      : conv(torch::nn::Conv1dOptions(cfg.in_channels, cfg.channels, 5).padding(2)),
        norm(torch::nn::LayerNormOptions({cfg.channels})),
        ffn(cfg),
        head(cfg.channels, cfg.num_classes) {
    register_module("conv", conv);
    register_module("norm", norm);
    register_module("ffn", ffn);
    register_module("head", head);
  }

  torch::Tensor encode(const torch::Tensor& x) {
    auto feats = torch::relu(conv->forward(x));
    const int64_t b = feats.size(0), c = feats.size(1), t = feats.size(2);
    // FACT: f = torch.randn(2, 6, 5); r = f.transpose(1, 2).reshape(10, 6); assert not is_contiguous(f.transpose(1, 2)) and is_copy_of(r, f)
    auto rows = feats.transpose(1, 2).reshape({b * t, c}); // EXPECT: tensor-reshape-non-contiguous
    auto y = rows + ffn->forward(norm->forward(rows));
    if (monitor != nullptr) {
      monitor->record("ffn_out", y);
    }
    return y.view({b, t, c});
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = encode(x);
    return head->forward(y.mean(1));
  }

  // Per-timestep features laid out like the conv input, for the probe tooling.
  torch::Tensor features(const torch::Tensor& x) { return encode(x).transpose(1, 2); }

  torch::nn::Conv1d conv;
  torch::nn::LayerNorm norm;
  FusedFfn ffn;
  torch::nn::Linear head;
  ActivationMonitor* monitor = nullptr;
};
TORCH_MODULE(SeqClassifier);

torch::Tensor flat_features(SeqClassifier& model, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  auto f = model->features(x);
  // FACT: f = torch.randn(2, 5, 6).transpose(1, 2); assert raises(lambda: f.view(2, -1), "view size is not compatible")
  return f.view({f.size(0), -1}); // EXPECT: tensor-view-non-contiguous
}

double evaluate(SeqClassifier& model, const torch::Tensor& inputs,
                const torch::Tensor& labels, int64_t batch_size,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0;
  torch::Tensor total_loss = torch::zeros({}, device);
  const int64_t n = inputs.size(0);
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t len = std::min(batch_size, n - start);
    auto x = inputs.narrow(0, start, len).to(device);
    auto y = labels.narrow(0, start, len).to(device);
    auto logits = model->forward(x);
    total_loss += torch::nn::functional::cross_entropy(logits, y) * len; // LOOKALIKE: tensor-graph-kept-across-iterations -- evaluation runs under NoGradGuard, no graph is recorded
    correct += logits.argmax(1).eq(y).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
  }
  std::cout << "eval loss " << total_loss.item<double>() / n << "\n";
  return static_cast<double>(correct) / static_cast<double>(n);
}

void train(SeqClassifier& model, const torch::Tensor& inputs,
           const torch::Tensor& labels, const TrainConfig& cfg,
           torch::Device device) {
  model->to(device);
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto class_weights = torch::ones({model->head->options.out_features()});
  class_weights[0] = 0.5;
  class_weights = class_weights.to(device);
  const auto loss_scale = torch::tensor(1.0f / static_cast<float>(cfg.accum_steps));

  // FACT: w = torch.randn(4, requires_grad=True); s = w.detach().clone(); assert is_copy_of(s, w)
  auto bias_at_start = model->ffn->bias1.detach().clone(); // LOOKALIKE: tensor-unnecessary-clone -- the optimizer rewrites bias1 in place, the snapshot must own its storage

  torch::Tensor running = torch::zeros({}, device);
  int64_t step = 0;
  const int64_t n = inputs.size(0);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n);
    for (int64_t start = 0; start + cfg.batch_size <= n; start += cfg.batch_size) {
      auto idx = perm.narrow(0, start, cfg.batch_size);
      auto x = inputs.index_select(0, idx).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch is moved every step
      auto y = labels.index_select(0, idx).to(device);

      auto logits = model->forward(x);
      auto loss = torch::nn::functional::cross_entropy(
          logits, y, torch::nn::functional::CrossEntropyFuncOptions().weight(class_weights));
      auto scaled = loss * loss_scale; // LOOKALIKE: tensor-device-mismatch -- loss_scale is a 0-dim CPU tensor, allowed with CUDA operands
      scaled.backward();
      running += loss; // EXPECT: tensor-graph-kept-across-iterations

      if ((step + 1) % cfg.accum_steps == 0) {
        torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
        opt.step();
        opt.zero_grad();
        model->head->weight.detach().clamp_(-cfg.head_clip, cfg.head_clip); // LOOKALIKE: tensor-inplace-on-detached -- a deliberate weight constraint after the update, no graph holds the head weight now
      }
      if (step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss "
                  << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- read only on logging steps
      }
      ++step;
    }
    std::cout << "epoch " << epoch << " mean loss "
              << running.item<double>() / static_cast<double>(step) << "\n";
  }
  auto drift = (model->ffn->bias1.detach() - bias_at_start).norm();
  std::cout << "bias1 drift " << drift.item<double>() << "\n";
}

}  // namespace

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ModelConfig mcfg;
  TrainConfig tcfg;

  auto inputs = torch::randn({2048, mcfg.in_channels, 100});
  auto labels = torch::randint(0, mcfg.num_classes, {2048}, torch::kLong);

  SeqClassifier model(mcfg);
  ActivationMonitor monitor;
  model->monitor = &monitor;

  train(model, inputs, labels, tcfg, device);
  const double acc = evaluate(model, inputs.narrow(0, 0, 512), labels.narrow(0, 0, 512),
                              tcfg.batch_size, device);
  std::cout << "accuracy " << acc << "\n";

  auto probe = flat_features(model, inputs.narrow(0, 0, 8).to(device));
  std::cout << "probe features " << probe.sizes() << "\n";
  std::cout << "ffn_out peak |act| " << monitor.peak.at("ffn_out").item<float>() << "\n";
  return 0;
}
