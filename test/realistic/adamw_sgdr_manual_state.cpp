// Hand-rolled AdamW (decoupled weight decay) with SGDR-style cosine annealing and
// warm restarts. Optimizer state lives in plain structs so it can be inspected,
// reset at restarts and checkpointed without going through torch::optim.
#include <torch/torch.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

namespace sgdr {

struct AdamWConfig {
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.05;
  bool fp64_master = false;   // keep a double-precision copy of every weight
  double grad_scale = 1.0;    // static loss scale, undone before the moments
  double max_grad_norm = 1.0;
};

struct ScheduleConfig {
  double eta_min = 1e-6;
  int64_t warmup_steps = 200;
  int64_t first_cycle = 1000, cycle_mult = 2;
  double shrink = 0.0;        // shrink-and-perturb at each restart, 0 disables
  double perturb_std = 1e-3;
};

struct TrainConfig {
  int64_t in_features = 64;
  int64_t hidden = 256;
  int64_t num_classes = 10;
  double dropout = 0.1;
  int64_t epochs = 20, batch_size = 128;
  int64_t accum_steps = 2, log_every = 100;
};

class CosineWarmRestarts {
 public:
  CosineWarmRestarts(double base_lr, ScheduleConfig cfg) : base_lr_(base_lr), cfg_(cfg) {}

  double lr_at(int64_t step) const {
    if (step < cfg_.warmup_steps) {
      return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(cfg_.warmup_steps);
    }
    int64_t t = step - cfg_.warmup_steps, period = cfg_.first_cycle;
    for (; t >= period; period *= cfg_.cycle_mult) t -= period;
    const double progress = static_cast<double>(t) / static_cast<double>(period);
    return cfg_.eta_min + 0.5 * (base_lr_ - cfg_.eta_min) * (1.0 + std::cos(M_PI * progress));
  }

  bool is_restart(int64_t step) const {
    if (step <= cfg_.warmup_steps) return false;
    int64_t t = step - cfg_.warmup_steps, period = cfg_.first_cycle;
    for (; t > period; period *= cfg_.cycle_mult) t -= period;
    return t == period;
  }

  const ScheduleConfig& config() const { return cfg_; }

 private:
  double base_lr_;
  ScheduleConfig cfg_;
};

struct ParamState {
  torch::Tensor exp_avg, exp_avg_sq, master;
  int64_t step = 0;
};

class HandAdamW {
 public:
  HandAdamW(std::vector<torch::Tensor> params, std::vector<bool> decay_mask, AdamWConfig cfg)
      : params_(std::move(params)), decay_mask_(std::move(decay_mask)), cfg_(cfg) {
    torch::NoGradGuard no_grad;
    for (const auto& p : params_) {
      ParamState st;
      st.exp_avg = torch::zeros_like(p);
      st.exp_avg_sq = torch::zeros_like(p);
      if (cfg_.fp64_master) {
        st.master = torch::empty_like(p, p.options().dtype(torch::kDouble));
        st.master.copy_(p);  // LOOKALIKE: tensor-copy-narrowing -- float into double widens, nothing is lost
      }
      state_.push_back(std::move(st));
    }
  }

  void zero_grad() {
    for (auto& p : params_) {
      if (p.grad().defined()) p.grad().zero_();
    }
  }

  // Clips by global norm after the loss scale has been undone.
  void clip_grads() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> norms;
    for (auto& p : params_) {
      if (p.grad().defined()) norms.push_back(p.grad().norm());
    }
    if (norms.empty()) return;
    auto total = torch::stack(norms).norm();
    auto coef = (cfg_.max_grad_norm / (total + 1e-6)).clamp_max(1.0);
    for (auto& p : params_) {
      if (p.grad().defined()) p.grad().mul_(coef);
    }
  }

  void step(double lr) {
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (!p.grad().defined()) continue;
      if (decay_mask_[i] && !cfg_.fp64_master) decay_(p, lr);

      torch::NoGradGuard no_grad;
      auto& st = state_[i];
      st.step += 1;
      auto grad = p.grad().clone().div_(cfg_.grad_scale);  // EXPECT: tensor-unnecessary-clone

      st.exp_avg.mul_(cfg_.beta1).add_(grad, 1.0 - cfg_.beta1);
      st.exp_avg_sq.mul_(cfg_.beta2).addcmul_(grad, grad, 1.0 - cfg_.beta2);
      const double bc1 = 1.0 - std::pow(cfg_.beta1, static_cast<double>(st.step));
      const double bc2 = 1.0 - std::pow(cfg_.beta2, static_cast<double>(st.step));

      // FACT: m = torch.ones(3); h = m; h.div_(0.5); assert shares_storage(h, m) and m[0].item() == 2.0
      auto m_hat = st.exp_avg;
      m_hat.div_(bc1);  // EXPECT: tensor-alias-then-mutate
      // FACT: v = torch.rand(3) + 0.1; d = v.sqrt(); d.div_(2.0).add_(1e-8); assert is_copy_of(d, v)
      auto denom = st.exp_avg_sq.sqrt();
      denom.div_(std::sqrt(bc2)).add_(cfg_.eps);  // LOOKALIKE: tensor-alias-then-mutate -- sqrt() wrote a new tensor

      if (cfg_.fp64_master) {
        if (decay_mask_[i]) st.master.mul_(1.0 - lr * cfg_.weight_decay);
        st.master.addcdiv_(m_hat.to(torch::kDouble), denom.to(torch::kDouble), -lr);
        // FACT: w = torch.zeros(2); w.copy_(torch.tensor([1.0 + 1e-12, 2.0], dtype=torch.float64)); assert w.dtype == torch.float32 and w[0].item() == 1.0
        p.copy_(st.master);  // EXPECT: tensor-copy-narrowing
      } else {
        p.addcdiv_(m_hat, denom, -lr);  // LOOKALIKE: tensor-inplace-on-leaf -- runs under the NoGradGuard above
      }
    }
  }

  // Called by the schedule at every restart.
  void on_restart(const ScheduleConfig& sc) {
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& st = state_[i];
      st.exp_avg.zero_();
      st.exp_avg_sq.zero_();
      st.step = 0;
      if (sc.shrink > 0.0) {
        auto& p = params_[i];
        auto noise = torch::randn_like(p) * sc.perturb_std;
        p.detach().mul_(1.0 - sc.shrink).add_(noise);  // LOOKALIKE: tensor-inplace-on-detached -- shrink-and-perturb writes the weights on purpose, between steps
      }
    }
  }

 private:
  void decay_(torch::Tensor& p, double lr) {
    // FACT: w = torch.nn.Parameter(torch.ones(3)); assert raises(lambda: w.mul_(0.9), "leaf Variable that requires grad")
    p.mul_(1.0 - lr * cfg_.weight_decay);  // EXPECT: tensor-inplace-on-leaf
  }

  std::vector<torch::Tensor> params_;
  std::vector<bool> decay_mask_;
  std::vector<ParamState> state_;
  AdamWConfig cfg_;
};

struct ClassifierImpl : torch::nn::Module {
  ClassifierImpl(int64_t in, int64_t hidden, int64_t classes, double dropout)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        head(register_module("head", torch::nn::Linear(hidden, classes))),
        dropout_(dropout) {}

  torch::Tensor forward(torch::Tensor x) {
    auto h = fc1->forward(x);
    // FACT: l = torch.nn.Linear(3, 4); h = l(torch.randn(2, 3)); h.relu_(); torch.nn.Linear(4, 2)(h).sum().backward()
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- linear does not save its output, relu_ saves its own result
    auto g = torch::tanh(fc2->forward(norm->forward(h)));
    if (is_training() && dropout_ > 0.0) {
      auto keep = torch::bernoulli(torch::full_like(g, 1.0 - dropout_));
      // FACT: x = torch.randn(4, 3, requires_grad=True); g = torch.tanh(x); g.mul_(torch.ones(4, 3)); assert backward_fails(lambda: g.sum().backward())
      g.mul_(keep.div_(1.0 - dropout_));  // EXPECT: tensor-inplace-on-saved
    }
    return head->forward(g);
  }

  torch::nn::Linear fc1, fc2;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
  double dropout_;
};
TORCH_MODULE(Classifier);

struct Batch {
  torch::Tensor x;
  torch::Tensor y;
};

std::vector<Batch> make_batches(const torch::Tensor& x, const torch::Tensor& y, int64_t bs) {
  std::vector<Batch> out;
  auto perm = torch::randperm(x.size(0), torch::kLong);
  for (int64_t s = 0; s < x.size(0); s += bs) {
    auto idx = perm.slice(0, s, std::min(s + bs, x.size(0)));
    out.push_back({x.index_select(0, idx), y.index_select(0, idx)});
  }
  return out;
}

double evaluate(Classifier& model, const torch::Tensor& val_x, const torch::Tensor& val_y,
                torch::Device device, int64_t bs) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t s = 0; s < val_x.size(0); s += bs) {
    const int64_t len = std::min(bs, val_x.size(0) - s);
    auto vx = val_x.to(device).narrow(0, s, len);  // EXPECT: tensor-clone-in-loop
    auto vy = val_y.narrow(0, s, len).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different chunk every iteration
    correct += model->forward(vx).argmax(1).eq(vy).sum();
  }
  model->train();
  return correct.item<double>() / static_cast<double>(val_x.size(0));
}

void train(const TrainConfig& tc, const AdamWConfig& ac, const ScheduleConfig& sc) {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto train_x = torch::randn({8192, tc.in_features});
  auto train_y = torch::randint(0, tc.num_classes, {8192}, torch::kLong);
  auto val_x = torch::randn({2048, tc.in_features});
  auto val_y = torch::randint(0, tc.num_classes, {2048}, torch::kLong);

  Classifier model(tc.in_features, tc.hidden, tc.num_classes, tc.dropout);
  model->to(device);

  std::vector<torch::Tensor> params;
  std::vector<bool> decay_mask;
  for (const auto& kv : model->named_parameters()) {
    params.push_back(kv.value());
    const bool is_bias = kv.key().find("bias") != std::string::npos;
    const bool is_norm = kv.key().rfind("norm", 0) == 0;
    decay_mask.push_back(!is_bias && !is_norm);
  }
  HandAdamW opt(params, decay_mask, ac);
  CosineWarmRestarts sched(ac.lr, sc);

  // 0-dim, so it may stay on the host next to device losses.
  auto accum_scale = torch::full({}, ac.grad_scale / static_cast<double>(tc.accum_steps));
  int64_t global_step = 0;
  int64_t micro = 0;
  double ema_loss = 0.0;

  for (int64_t epoch = 0; epoch < tc.epochs; ++epoch) {
    auto batches = make_batches(train_x, train_y, tc.batch_size);
    auto dev_total = torch::zeros({}, torch::TensorOptions().device(device));
    std::vector<torch::Tensor> epoch_losses;
    opt.zero_grad();

    for (auto& b : batches) {
      auto x = b.x.to(device);  // LOOKALIKE: tensor-clone-in-loop -- each batch is new data
      auto logits = model->forward(x);
      auto ce = torch::nn::functional::cross_entropy(logits, b.y);  // EXPECT: tensor-device-mismatch
      auto probs = torch::softmax(logits, 1);
      auto neg_entropy = (probs * probs.clamp_min(1e-8).log()).sum(1).mean();
      auto loss = ce + 0.05 * neg_entropy;

      auto conf = probs.detach();
      // FACT: x = torch.randn(3, 4, requires_grad=True); p = torch.softmax(x, 1); l = (p * p.clamp_min(1e-8).log()).sum(); p.detach().mul_(100.0); assert backward_fails(l.backward)
      conf.mul_(100.0);  // EXPECT: tensor-inplace-on-detached
      const auto mean_conf = std::get<0>(conf.max(1)).mean();

      (loss * accum_scale).backward();  // LOOKALIKE: tensor-device-mismatch -- a 0-dim host tensor may mix with device tensors
      dev_total += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      ema_loss = 0.98 * ema_loss + 0.02 * loss.item<double>();  // EXPECT: tensor-sync-in-loop

      if (++micro % tc.accum_steps != 0) continue;
      opt.clip_grads();
      const double lr = sched.lr_at(global_step);
      opt.step(lr);
      opt.zero_grad();
      ++global_step;
      if (sched.is_restart(global_step)) opt.on_restart(sched.config());

      if (global_step % tc.log_every == 0) {
        std::cout << "step " << global_step << " lr " << std::scientific << lr
                  << " ema " << ema_loss << " conf "
                  << mean_conf.item<float>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
    }

    const double epoch_mean = dev_total.item<double>() / static_cast<double>(batches.size());
    const double stacked_mean = torch::stack(epoch_losses).mean().item<double>();
    const double acc = evaluate(model, val_x, val_y, device, 512);
    std::cout << "epoch " << epoch << " loss " << std::fixed << std::setprecision(4) << epoch_mean
              << " (" << stacked_mean << ") val_acc " << acc << std::endl;
  }
}

}  // namespace sgdr

int main() {
  sgdr::ScheduleConfig sc;
  sc.shrink = 0.1;
  sgdr::train(sgdr::TrainConfig{}, sgdr::AdamWConfig{}, sc);
}
