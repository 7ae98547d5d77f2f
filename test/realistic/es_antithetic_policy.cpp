// OpenAI-style evolution strategies (Salimans et al., 2017) on a tanh MLP policy.
// The policy's parameters live in one flat vector theta; every generation draws
// mirrored (antithetic) perturbations, evaluates the whole population in one batched
// rollout, applies centered-rank fitness shaping and an Adam step on theta.
#include <torch/torch.h>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

namespace es {

struct ESConfig {
  int64_t population = 128;  // even: pairs of +eps / -eps
  int64_t generations = 500;
  int64_t horizon = 200;
  int64_t frame_stack = 4;
  int64_t hidden = 32;
  int64_t eval_every = 10;
  double sigma = 0.02;
  double lr = 0.01;
  double l2 = 0.005;
};

using Shapes = std::vector<std::pair<int64_t, int64_t>>;  // (in, out) of each layer

struct PolicyImpl : torch::nn::Module {
  PolicyImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        head(register_module("head", torch::nn::Linear(hidden, out))) {
    // start with near-zero actions, like the ES humanoid policies
    head->weight.mul_(0.01);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(head(torch::tanh(fc2(torch::tanh(fc1(x))))));
  }

  torch::nn::Linear fc1, fc2, head;
};
TORCH_MODULE(Policy);

torch::Tensor flat_params(Policy& policy) {
  std::vector<torch::Tensor> chunks;
  // FACT: w = torch.nn.Linear(3, 4).weight; assert is_view_of(w.detach().reshape(-1), w)
  for (const auto& p : policy->parameters()) chunks.push_back(p.detach().reshape({-1}));  // LOOKALIKE: tensor-reshape-non-contiguous -- parameters are contiguous: a view
  return torch::cat(chunks);
}

void set_flat_params(Policy& policy, const torch::Tensor& flat) {
  torch::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : policy->parameters()) {
    p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    offset += p.numel();
  }
}

// Evaluates every row of thetas as its own policy: one bmm per layer.
torch::Tensor batched_policy(const torch::Tensor& thetas, const torch::Tensor& x, const Shapes& shapes) {
  auto h = x.unsqueeze(2);
  int64_t offset = 0;
  for (const auto& [in, out] : shapes) {
    // FACT: t = torch.randn(4, 30); assert is_view_of(t.narrow(1, 6, 12).view(-1, 3, 4), t)
    auto W = thetas.narrow(1, offset, out * in).view({-1, out, in});  // LOOKALIKE: tensor-view-non-contiguous -- only splits the column range, which the row stride allows
    offset += out * in;
    auto b = thetas.narrow(1, offset, out).unsqueeze(2);
    offset += out;
    h = torch::tanh(torch::baddbmm(b, W, h));
  }
  return h.squeeze(2);
}

// Point mass pushed towards a fixed goal; one copy per population member.
struct PointMass {
  static constexpr int64_t obs_dim = 6;

  void reset(int64_t n, const torch::TensorOptions& opts) {
    pos = torch::tensor({-0.5, -0.5}, opts).unsqueeze(0).expand({n, 2}).contiguous();
    vel = torch::zeros({n, 2}, opts);
    goal = torch::tensor({0.7, -0.3});
  }

  torch::Tensor offset() const { return goal - pos; }  // EXPECT: tensor-device-mismatch
  torch::Tensor observe() const { return torch::cat({pos, vel, offset()}, 1); }
  torch::Tensor distance() const { return offset().norm(2, 1); }

  torch::Tensor step(const torch::Tensor& force) {
    vel.mul_(0.95).add_(force.clamp(-1.0, 1.0), 0.1);
    // FACT: s = torch.zeros(1, 2); p = s.expand(4, 2).contiguous(); p.add_(torch.ones(4, 2), alpha=0.1); assert is_copy_of(p, s)
    pos.add_(vel, 0.1);  // LOOKALIKE: tensor-inplace-on-expanded -- reset() materialised the rows with contiguous()
    return -distance() - 0.01 * force.square().sum(1);
  }

  torch::Tensor pos, vel, goal;
};

// Time-major history of the last k normalised observations.
struct FrameStack {
  FrameStack(int64_t k, int64_t n, int64_t dim, const torch::TensorOptions& opts)
      : k(k), buf(torch::zeros({k, n, dim}, opts)) {}

  void push(const torch::Tensor& frame) {
    // FACT: h = torch.zeros(4, 3, 6); assert raises(lambda: h.narrow(0, 0, 3).copy_(h.narrow(0, 1, 3)), "refer to a single memory location")
    buf.narrow(0, 0, k - 1).copy_(buf.narrow(0, 1, k - 1));  // EXPECT: tensor-inplace-overlap
    buf[k - 1].copy_(frame);
  }

  torch::Tensor input() const {
    // FACT: b = torch.zeros(4, 3, 6); assert is_copy_of(b.permute(1, 0, 2).reshape(3, -1), b)
    return buf.permute({1, 0, 2}).reshape({buf.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t k;
  torch::Tensor buf;
};

struct RunningStat {
  explicit RunningStat(int64_t dim)
      : sum(torch::zeros({dim}, torch::kFloat64)), sumsq(torch::zeros({dim}, torch::kFloat64)) {}

  void push(const torch::Tensor& batch) {
    auto x = batch.to(torch::kCPU, torch::kFloat64);
    sum.add_(x.sum(0));
    // FACT: b = torch.randn(6, 4); x = b.to('cpu', torch.float64); assert is_copy_of(x, b)
    x.square_();  // LOOKALIKE: tensor-alias-then-mutate -- to() changed the dtype, so x is a private copy
    sumsq.add_(x.sum(0));
    count += static_cast<double>(x.size(0));
  }

  torch::Tensor mean() const { return sum / count; }
  torch::Tensor std() const { return (sumsq / count - mean().square()).clamp_min(1e-8).sqrt(); }

  torch::Tensor sum, sumsq;
  double count = 1e-4;
};

struct Normalizer {
  Normalizer(int64_t dim, const torch::TensorOptions& opts)
      : mu(torch::zeros({dim}, opts)), sd(torch::ones({dim}, opts)) {}

  void sync(const RunningStat& stat) {
    mu.copy_(stat.mean());  // EXPECT: tensor-copy-narrowing
    sd = stat.std().clamp_min(1e-2).to(mu.device(), torch::kFloat32);
  }

  torch::Tensor operator()(const torch::Tensor& obs) const {
    // FACT: o = torch.randn(4, 6); log = [o]; out = o; out -= torch.randn(6); assert shares_storage(log[0], out)
    auto out = obs;
    out -= mu;  // EXPECT: tensor-alias-then-mutate
    out /= sd;
    return out.clamp(-5.0, 5.0);
  }

  torch::Tensor mu, sd;
};

struct FlatAdam {
  FlatAdam(const torch::Tensor& theta, double lr)
      : m(torch::zeros_like(theta)), v(torch::zeros_like(theta)), lr(lr) {}

  void step(torch::Tensor& theta, const torch::Tensor& grad) {
    ++t;
    m.mul_(beta1).add_(grad, 1 - beta1);
    v.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    const double a = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    auto update = m.clone();  // EXPECT: tensor-unnecessary-clone
    update.div_(v.sqrt().add_(eps));  // LOOKALIKE: tensor-inplace-on-saved -- no grad anywhere here, sqrt saved nothing
    theta.add_(update, a);
  }

  torch::Tensor m, v;
  double lr, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int64_t t = 0;
};

torch::Tensor centered_ranks(const torch::Tensor& x) {
  auto ranks = torch::empty_like(x);
  ranks.index_put_({x.argsort()}, torch::arange(x.size(0), x.options()));
  return ranks / static_cast<double>(x.size(0) - 1) - 0.5;
}

torch::Tensor rollout_population(const torch::Tensor& thetas, const Shapes& shapes, const Normalizer& norm,
                                 const ESConfig& cfg, std::vector<torch::Tensor>& obs_log, int64_t& unsolved) {
  torch::NoGradGuard no_grad;
  const auto pop = thetas.size(0);
  PointMass env;
  env.reset(pop, thetas.options());
  FrameStack stack(cfg.frame_stack, pop, PointMass::obs_dim, thetas.options());
  auto ret = torch::zeros({pop}, thetas.options());
  for (int64_t t = 0; t < cfg.horizon; ++t) {
    auto obs = env.observe();
    obs_log.push_back(obs);
    stack.push(norm(obs));
    ret += env.step(batched_policy(thetas, stack.input(), shapes));  // LOOKALIKE: tensor-graph-kept-across-iterations -- NoGradGuard: no graph is built
    auto reached = env.distance() < 0.05;
    unsolved += (~reached).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    if (reached.all().item<bool>()) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides the early exit
  }
  return ret;
}

// Greedy score of the current mean policy, on a fresh batch of episodes.
double evaluate(Policy& policy, const Normalizer& norm, const ESConfig& cfg, int64_t episodes = 16) {
  auto opts = torch::TensorOptions().device(policy->head->weight.device());
  PointMass env;
  env.reset(episodes, opts);
  FrameStack stack(cfg.frame_stack, episodes, PointMass::obs_dim, opts);
  auto total = torch::zeros({}, opts);
  for (int64_t t = 0; t < cfg.horizon; ++t) {
    stack.push(norm(env.observe()));
    total += env.step(policy(stack.input())).mean();  // EXPECT: tensor-graph-kept-across-iterations
  }
  return total.item<double>();
}

void train(const ESConfig& cfg, torch::Device device) {
  const int64_t in_dim = PointMass::obs_dim * cfg.frame_stack;
  Policy policy(in_dim, cfg.hidden, 2);
  policy->to(device);
  const Shapes shapes{{in_dim, cfg.hidden}, {cfg.hidden, cfg.hidden}, {cfg.hidden, 2}};

  auto theta = flat_params(policy);
  const int64_t n = theta.numel(), pop = cfg.population, half = pop / 2;
  FlatAdam adam(theta, cfg.lr);
  RunningStat stat(PointMass::obs_dim);
  Normalizer norm(PointMass::obs_dim, theta.options());
  auto best_theta = theta.clone();
  double best = -std::numeric_limits<double>::infinity();

  for (int64_t gen = 0; gen < cfg.generations; ++gen) {
    norm.sync(stat);
    auto noise = torch::empty({pop, n}, theta.options());
    noise.narrow(0, 0, half).normal_();
    // FACT: nz = torch.empty(4, 3); nz[:2].normal_(); nz[2:].copy_(nz[:2]).neg_(); assert torch.equal(nz[2:], -nz[:2])
    noise.narrow(0, half, half).copy_(noise.narrow(0, 0, half)).neg_();  // LOOKALIKE: tensor-inplace-overlap -- the two halves are disjoint rows
    // FACT: assert raises(lambda: torch.randn(5).unsqueeze(0).expand(4, 5).add_(torch.randn(4, 5), alpha=0.02), "more than one element of the written-to tensor")
    auto thetas = theta.unsqueeze(0).expand({pop, n});
    thetas.add_(noise, cfg.sigma);  // EXPECT: tensor-inplace-on-expanded

    std::vector<torch::Tensor> obs_log;
    int64_t unsolved = 0;
    auto returns = rollout_population(thetas, shapes, norm, cfg, obs_log, unsolved);
    stat.push(torch::cat(obs_log));

    auto ranks = centered_ranks(returns);
    auto weights = ranks.narrow(0, 0, half) - ranks.narrow(0, half, half);
    auto grad = weights.matmul(noise.narrow(0, 0, half)) / (pop * cfg.sigma);
    grad.sub_(theta, cfg.l2);
    adam.step(theta, grad);

    if (gen % cfg.eval_every == 0) {
      set_flat_params(policy, theta);
      const double score = evaluate(policy, norm, cfg);
      if (score > best) {
        best = score;
        best_theta = theta.clone();  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- snapshot of a theta that Adam keeps rewriting in place
      }
      std::printf("gen %4lld  score %.3f  best %.3f  unsolved %lld\n", static_cast<long long>(gen), score, best,
                  static_cast<long long>(unsolved));
    }
  }
  set_flat_params(policy, best_theta);
  torch::save(policy, "es_policy.pt");
}

}  // namespace es

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  es::train(es::ESConfig{}, device);
  return 0;
}
