// Adam written by hand over a module's named parameters: bias correction, L2 or decoupled decay, warmup, weight averaging.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

struct AdamState {
  torch::Tensor exp_avg, exp_avg_sq;
  int64_t step = 0;
};

class HandAdam {
public:
  HandAdam(torch::nn::Module &model, double beta1, double beta2, double eps, double wd, bool decoupled)
      : model_(model), beta1_(beta1), beta2_(beta2), eps_(eps), wd_(wd), decoupled_(decoupled) {
    for (auto &item : model_.named_parameters()) {
      state_[item.key()] = {torch::zeros_like(item.value()), torch::zeros_like(item.value())};
      // FACT: ps = [torch.nn.Parameter(torch.randn(3)) for _ in range(2)]; avg = [p.detach().clone() for p in ps]; ps[0].data.add_(1); assert not torch.equal(avg[0], ps[0].detach())
      average_.push_back(item.value().detach().clone()); // LOOKALIKE: tensor-clone-in-loop -- one copy per parameter, each kept
    }
  }

  // Written the pre-1.0 way: parameters change through data(), no guard needed for them.
  void step(double lr) {
    for (auto &item : model_.named_parameters()) {
      auto p = item.value();
      if (!p.grad().defined())
        continue;
      auto &s = state_.at(item.key());
      s.step += 1;
      auto g = p.grad().clone(); // EXPECT: tensor-unnecessary-clone -- p.grad().add(p.detach(), wd_) makes it in one pass
      g.add_(p.detach(), decoupled_ ? 0.0 : wd_);
      auto g2 = g.detach();
      // FACT: g = torch.randn(4); g0 = g.clone(); g2 = g.detach(); g2.mul_(g); assert torch.equal(g, g0 * g0)
      g2.mul_(g); // EXPECT: tensor-inplace-on-detached -- squares 'g' itself: the first moment below averages g*g
      s.exp_avg_sq.mul_(beta2_).add_(g2, 1 - beta2_);
      s.exp_avg.mul_(beta1_).add_(g, 1 - beta1_);
      double bc1 = 1 - std::pow(beta1_, s.step), bc2 = 1 - std::pow(beta2_, s.step);
      // FACT: v = torch.rand(3); d = (v / 0.5).sqrt().add_(1e-8); assert not d.requires_grad and d.grad_fn is None
      auto denom = (s.exp_avg_sq / bc2).sqrt().add_(eps_); // LOOKALIKE: tensor-inplace-on-saved -- optimizer state needs no grad: sqrt recorded nothing
      if (decoupled_)
        p.data().mul_(1 - lr * wd_);
      // FACT: p = torch.nn.Parameter(torch.ones(3)); p.data.addcdiv_(torch.ones(3), torch.full((3,), 2.0), value=-0.5); assert p[0] == 0.75 and p.is_leaf
      p.data().addcdiv_(s.exp_avg, denom, -lr / bc1); // LOOKALIKE: tensor-inplace-on-leaf -- data() is not the leaf autograd tracks
    }
  }

  // Norm of all gradients together, for the log.
  double grad_norm() {
    std::vector<torch::Tensor> norms;
    for (auto &p : model_.parameters())
      if (p.grad().defined())
        // FACT: m = torch.nn.Linear(3, 2); m(torch.randn(4, 3)).sum().backward(); ns = [p.grad.norm() for p in m.parameters()]; assert kept_nodes(ns) == 0
        norms.push_back(p.grad().norm()); // LOOKALIKE: tensor-graph-kept-across-iterations -- gradients carry no graph
    return norms.empty() ? 0.0 : torch::stack(norms).norm().item<double>();
  }

  // Polyak averaging of the weights; swap_average() loads the average for evaluation.
  void update_average(double decay) {
    torch::NoGradGuard no_grad;
    auto params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i)
      average_[i].mul_(decay).add_(params[i], 1 - decay);
  }
  void swap_average() {
    torch::NoGradGuard no_grad;
    auto params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto live = params[i].detach().clone();
      // FACT: p = torch.nn.Parameter(torch.zeros(3)); exec('with torch.no_grad(): p.copy_(torch.ones(3))'); assert p.sum() == 3
      params[i].copy_(average_[i]); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      average_[i] = live;
    }
  }

private:
  torch::nn::Module &model_;
  double beta1_, beta2_, eps_, wd_;
  bool decoupled_;
  std::map<std::string, AdamState> state_;
  std::vector<torch::Tensor> average_;
};

// Linear warmup, then inverse square root decay.
double lr_at(int64_t step, double base, int64_t warmup) {
  return base * std::min((step + 1.0) / warmup, std::sqrt(static_cast<double>(warmup) / (step + 1.0)));
}

void train(torch::nn::Sequential &model, const std::vector<std::pair<torch::Tensor, torch::Tensor>> &data, int epochs,
           double base_lr, double max_norm) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  model->to(device);
  HandAdam opt(*model, 0.9, 0.999, 1e-8, 0.01, /*decoupled=*/true);
  int64_t step = 0;
  torch::Tensor smoothed = torch::zeros({}, device);
  for (int e = 0; e < epochs; ++e) {
    for (const auto &[x, y] : data) {
      auto out = model->forward(x.to(device));
      auto loss = torch::cross_entropy_loss(out, y.to(device));
      model->zero_grad();
      loss.backward();
      double gn = opt.grad_norm();
      opt.step(lr_at(step++, base_lr, 1000));
      opt.update_average(0.999);
      // Max-norm constraint on the rows of every weight matrix.
      for (auto &p : model->parameters())
        if (p.dim() > 1)
          // FACT: m = torch.nn.Linear(3, 2); assert raises(lambda: m.weight.renorm_(2, 0, 1.0), "a leaf Variable that requires grad")
          p.renorm_(2, 0, max_norm); // EXPECT: tensor-inplace-on-leaf -- outside any NoGradGuard
      // FACT: m = torch.nn.Linear(4, 2); s = torch.zeros(()); exec('for _ in range(3): s = 0.98 * s + 0.02 * m(torch.randn(3, 4)).pow(2).mean()'); assert kept_nodes(s) >= 6
      smoothed = 0.98 * smoothed + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- a display value keeping every step's graph
      std::cout << "step " << step << " loss " << loss.item<float>() << " |g| " << gn << "\n"; // EXPECT: tensor-sync-in-loop -- only printed, every step
    }
    std::cout << "epoch " << e << " smoothed loss " << smoothed.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after a full pass over the data
  }
  opt.swap_average();
}
