// Adaptive optimizers (Adagrad, RMSprop) with per-parameter state, global-norm
// clipping and a parameter averager for evaluation.
#include <torch/torch.h>

#include <cstdint>
#include <deque>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct AdaptiveOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.1;
  double alpha = 0.99;
  double momentum = 0.0;
  bool centered = false;
  double max_grad_norm = 1.0;
};

struct ParamState {
  torch::Tensor sum;
  torch::Tensor square_avg;
  torch::Tensor grad_avg;
  torch::Tensor momentum_buf;
  int64_t step = 0;
};

class AdaptiveOptimizer {
 public:
  AdaptiveOptimizer(std::vector<torch::Tensor> params, AdaptiveOptions opts)
      : params_(std::move(params)), opts_(opts), state_(params_.size()) {}
  virtual ~AdaptiveOptimizer() = default;

  void zero_grad() {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
  }

  // Rescales all gradients so that their joint L2 norm is at most max_norm.
  torch::Tensor clip_grad_norm(double max_norm) {
    std::vector<torch::Tensor> flat;
    for (auto& p : params_) {
      if (!p.grad().defined()) continue;
      // FACT: l = torch.nn.Linear(3, 4); l(torch.randn(2, 3)).sum().backward(); assert is_view_of(l.weight.grad.reshape(-1), l.weight.grad)
      flat.push_back(p.grad().reshape({-1}));  // LOOKALIKE: tensor-reshape-non-contiguous -- gradients follow the parameter's contiguous layout, so this is a view
    }
    if (flat.empty()) return torch::zeros({});
    auto total = torch::cat(flat).norm();
    auto coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
    return total;
  }

  void step() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (!p.grad().defined()) continue;
      auto grad = p.grad();
      if (opts_.weight_decay != 0) {
        // FACT: p = torch.randn(3); g = torch.randn(3); h = g; h = h.add(p, alpha=0.1); assert is_copy_of(h, g)
        grad = grad.add(p, opts_.weight_decay);  // LOOKALIKE: tensor-alias-then-mutate -- out-of-place add rebinds the local handle, p.grad() is untouched
      }
      auto& st = state_[i];
      if (st.step == 0) init_state(p, st);
      ++st.step;
      update(p, grad, st);
    }
  }

  // AdamW-style decay, applied on its own after the adaptive step.
  void apply_decoupled_decay(double wd) {
    for (auto& p : params_) {
      p.mul_(1.0 - opts_.lr * wd);  // EXPECT: tensor-inplace-on-leaf
    }
  }

  const std::vector<torch::Tensor>& params() const { return params_; }

 protected:
  virtual void init_state(const torch::Tensor& p, ParamState& st) = 0;
  virtual void update(torch::Tensor& p, const torch::Tensor& grad, ParamState& st) = 0;

  std::vector<torch::Tensor> params_;
  AdaptiveOptions opts_;
  std::vector<ParamState> state_;
};

class Adagrad : public AdaptiveOptimizer {
 public:
  using AdaptiveOptimizer::AdaptiveOptimizer;

 protected:
  void init_state(const torch::Tensor& p, ParamState& st) override {
    st.sum = torch::tensor(opts_.initial_accumulator_value, p.options()).expand_as(p);
  }

  void update(torch::Tensor& p, const torch::Tensor& grad, ParamState& st) override {
    const double clr = opts_.lr / (1.0 + static_cast<double>(st.step - 1) * opts_.lr_decay);
    // FACT: s = torch.tensor(0.1).expand(3, 4); g = torch.randn(3, 4); assert raises(lambda: s.addcmul_(g, g), "more than one element")
    st.sum.addcmul_(grad, grad, 1.0);  // EXPECT: tensor-inplace-on-expanded
    auto std_dev = st.sum;
    // FACT: s = torch.rand(3, 4); d = s; d.sqrt_().add_(1e-8); assert shares_storage(d, s)
    std_dev.sqrt_().add_(opts_.eps);  // EXPECT: tensor-alias-then-mutate
    p.addcdiv_(grad, std_dev, -clr);  // LOOKALIKE: tensor-inplace-on-leaf -- step() holds a NoGradGuard
  }
};

class RMSprop : public AdaptiveOptimizer {
 public:
  using AdaptiveOptimizer::AdaptiveOptimizer;

  std::vector<torch::Tensor> export_state() const {
    std::vector<torch::Tensor> out;
    for (const auto& st : state_) {
      if (!st.square_avg.defined()) continue;
      auto buf = torch::empty(st.square_avg.sizes(),
                              torch::TensorOptions().dtype(torch::kFloat64));
      buf.copy_(st.square_avg);  // LOOKALIKE: tensor-copy-narrowing -- float state into a double buffer widens
      out.push_back(buf);
    }
    return out;
  }

  void import_state(const std::vector<torch::Tensor>& blobs) {
    size_t j = 0;
    for (auto& st : state_) {
      if (!st.square_avg.defined() || j >= blobs.size()) continue;
      st.square_avg.copy_(blobs[j++]);  // EXPECT: tensor-copy-narrowing
    }
  }

 protected:
  void init_state(const torch::Tensor& p, ParamState& st) override {
    st.square_avg = torch::zeros_like(p);
    if (opts_.momentum > 0) st.momentum_buf = torch::zeros_like(p);
    if (opts_.centered) st.grad_avg = torch::zeros(p.sizes());
  }

  void update(torch::Tensor& p, const torch::Tensor& grad, ParamState& st) override {
    st.square_avg.mul_(opts_.alpha).addcmul_(grad, grad, 1.0 - opts_.alpha);  // LOOKALIKE: tensor-device-mismatch -- zeros_like follows the parameter's device
    torch::Tensor avg;
    if (opts_.centered) {
      st.grad_avg.mul_(opts_.alpha).add_(grad, 1.0 - opts_.alpha);  // EXPECT: tensor-device-mismatch
      avg = st.square_avg.addcmul(st.grad_avg, st.grad_avg, -1.0).sqrt_().add_(opts_.eps);
    } else {
      // FACT: s = torch.rand(3, 4); a = s.sqrt(); a.add_(1e-8); assert is_copy_of(a, s)
      avg = st.square_avg.sqrt().add_(opts_.eps);  // LOOKALIKE: tensor-alias-then-mutate -- sqrt() allocates, the in-place add only touches the temporary
    }
    if (opts_.momentum > 0) {
      st.momentum_buf.mul_(opts_.momentum).addcdiv_(grad, avg);
      p.add_(st.momentum_buf, -opts_.lr);
    } else {
      p.addcdiv_(grad, avg, -opts_.lr);
    }
  }
};

// Exponential moving average of the parameters, swapped in for evaluation.
class ParamAverager {
 public:
  ParamAverager(const std::vector<torch::Tensor>& params, double decay) : decay_(decay) {
    torch::NoGradGuard no_grad;
    for (const auto& p : params) {
      params_.push_back(p);
      shadow_.push_back(p.detach().clone());
    }
    backup_.resize(params_.size());
  }

  void update() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      shadow_[i].lerp_(params_[i].detach(), 1.0 - decay_);
    }
  }

  void swap_in() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      backup_[i] = params_[i].detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- the backup must survive the copy_ on the next line
      params_[i].detach().copy_(shadow_[i]);  // LOOKALIKE: tensor-inplace-on-detached -- swapping the averaged weights in is meant to write the parameter
    }
  }

  void swap_out() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].detach().copy_(backup_[i]);
    }
  }

 private:
  double decay_;
  std::vector<torch::Tensor> params_, shadow_, backup_;
};

struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t in, int64_t hidden, int64_t out, double drop)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))),
        drop_(drop) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(fc1(x));
    if (is_training() && drop_ > 0) {
      auto keep = torch::bernoulli(torch::full_like(h, 1.0 - drop_));
      // FACT: x = torch.randn(2, 3, requires_grad=True); h = torch.tanh(x); h.mul_(2.0); assert backward_fails(lambda: h.sum().backward())
      h.mul_(keep / (1.0 - drop_));  // EXPECT: tensor-inplace-on-saved
    }
    auto z = fc2(h);
    // FACT: l = torch.nn.Linear(3, 4); z = l(torch.randn(2, 3, requires_grad=True)); z.relu_(); z.sum().backward(); assert l.weight.grad is not None
    z.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- linear saves its input and weight, not its output
    return fc3(z);
  }

  torch::nn::Linear fc1, fc2, fc3;
  double drop_;
};
TORCH_MODULE(MLP);

int main(int argc, char** argv) {
  torch::manual_seed(0);
  const bool use_adagrad = argc > 1 && std::string(argv[1]) == "adagrad";
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t batch = 128, in_dim = 64, classes = 10;
  const int steps = 2000, log_every = 100, window = 50;
  const double weight_clip = 0.5;

  MLP model(in_dim, 256, classes, 0.1);
  model->to(device);

  AdaptiveOptions opts;
  opts.lr = use_adagrad ? 5e-2 : 1e-3;
  opts.momentum = use_adagrad ? 0.0 : 0.9;
  opts.centered = !use_adagrad;
  std::unique_ptr<AdaptiveOptimizer> opt;
  if (use_adagrad) {
    opt = std::make_unique<Adagrad>(model->parameters(), opts);
  } else {
    opt = std::make_unique<RMSprop>(model->parameters(), opts);
  }
  ParamAverager ema(model->parameters(), 0.999);

  auto class_weights = torch::tensor({1.0, 1.0, 2.0, 1.0, 1.0, 0.5, 1.0, 1.0, 3.0, 1.0},
                                     torch::kFloat);
  const auto& params = opt->params();
  std::vector<double> grad_norm_sum(params.size(), 0.0);
  std::deque<torch::Tensor> recent_losses;
  auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));

  for (int step = 1; step <= steps; ++step) {
    auto x = torch::randn({batch, in_dim}).to(device);
    auto y = torch::randint(0, classes, {batch}, torch::kLong).to(device);

    opt->zero_grad();
    auto logits = model->forward(x);
    auto loss = F::cross_entropy(
        logits, y, F::CrossEntropyFuncOptions().weight(class_weights.to(device)));  // EXPECT: tensor-clone-in-loop

    if (weight_clip > 0) {
      auto w = model->fc3->weight.detach();
      // FACT: l = torch.nn.Linear(3, 4); z = l(torch.randn(2, 3, requires_grad=True)); l.weight.detach().clamp_(-0.1, 0.1); assert backward_fails(lambda: z.sum().backward())
      w.clamp_(-weight_clip, weight_clip);  // EXPECT: tensor-inplace-on-detached
    }
    loss.backward();

    auto total_norm = opt->clip_grad_norm(opts.max_grad_norm);
    for (size_t i = 0; i < params.size(); ++i) {
      grad_norm_sum[i] += params[i].grad().norm().item<double>();  // EXPECT: tensor-sync-in-loop
    }
    opt->step();
    opt->apply_decoupled_decay(1e-4);
    ema.update();

    epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, accumulated on the device
    recent_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (static_cast<int>(recent_losses.size()) >= window) {
      std::vector<torch::Tensor> window_losses(recent_losses.begin(), recent_losses.end());
      std::cout << "window loss " << torch::stack(window_losses).mean().item<double>() << '\n';
      recent_losses.clear();
    }

    if (step % log_every == 0) {
      std::cout << "step " << step << " loss " << (epoch_loss / log_every).item<double>()
                << " grad norm " << total_norm.item<double>() << '\n';
      epoch_loss.zero_();
    }
  }

  model->eval();
  ema.swap_in();
  {
    torch::NoGradGuard no_grad;
    auto x = torch::randn({batch, in_dim}).to(device);
    auto pred = model->forward(x).argmax(1);
    std::cout << "eval class histogram " << torch::bincount(pred.cpu()) << '\n';
  }
  ema.swap_out();

  if (auto* rms = dynamic_cast<RMSprop*>(opt.get())) {
    auto blobs = rms->export_state();
    rms->import_state(blobs);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    std::cout << "param " << i << " mean grad norm " << grad_norm_sum[i] / steps << '\n';
  }
  return 0;
}
