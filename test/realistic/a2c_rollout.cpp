// Advantage actor-critic: an n-step rollout, then one update; entropy tracked for logging.
#include <torch/torch.h>
#include <vector>

struct ActorCriticImpl : torch::nn::Module {
  ActorCriticImpl(int64_t obs, int64_t actions) {
    body = register_module("body", torch::nn::Linear(obs, 64));
    pi = register_module("pi", torch::nn::Linear(64, actions));
    v = register_module("v", torch::nn::Linear(64, 1));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor x) {
    auto h = torch::tanh(body(x));
    return {torch::log_softmax(pi(h), -1), v(h)};
  }
  torch::nn::Linear body{nullptr}, pi{nullptr}, v{nullptr};
};
TORCH_MODULE(ActorCritic);

using EnvStep = std::tuple<torch::Tensor, float, bool> (*)(int64_t);

struct A2C {
  ActorCritic net;
  torch::optim::RMSprop opt;
  std::vector<torch::Tensor> entropy_log_;

  A2C(ActorCritic n, double lr) : net(n), opt(n->parameters(), torch::optim::RMSpropOptions(lr)) {}

  torch::Tensor update(torch::Tensor obs, EnvStep env, int n_steps, double gamma) {
    std::vector<torch::Tensor> log_probs, values;
    std::vector<float> rewards;
    torch::Tensor entropy_sum = torch::zeros({});
    for (int t = 0; t < n_steps; ++t) {
      auto [logp, value] = net->forward(obs);
      auto action = logp.exp().multinomial(1);
      // FACT: m = torch.nn.Linear(4, 2); lps = [torch.log_softmax(m(torch.randn(4)), -1)[0] for _ in range(3)]; torch.stack(lps).sum().backward(); assert m.weight.grad is not None
      log_probs.push_back(logp.gather(-1, action)); // LOOKALIKE: tensor-graph-kept-across-iterations -- REINFORCE: differentiated after the rollout
      values.push_back(value); // LOOKALIKE: tensor-graph-kept-across-iterations -- the critic loss is differentiated after the rollout
      auto entropy = -(logp.exp() * logp).sum();
      entropy_sum = entropy_sum + entropy; // LOOKALIKE: tensor-graph-kept-across-iterations -- the entropy bonus is part of the loss
      // FACT: m = torch.nn.Linear(4, 2); es = []; [es.append(-(torch.log_softmax(m(torch.randn(4)), -1) * 2).sum()) for _ in range(3)]; assert kept_nodes(es) >= 3
      entropy_log_.push_back(entropy); // EXPECT: tensor-graph-kept-across-iterations
      auto [next_obs, r, done] = env(action.item<int64_t>());
      rewards.push_back(r);
      obs = done ? torch::zeros_like(obs) : next_obs;
    }
    float R = 0;
    std::vector<float> returns(rewards.size());
    for (int t = n_steps - 1; t >= 0; --t) {
      R = rewards[t] + gamma * R;
      returns[t] = R;
    }
    auto ret = torch::tensor(returns).unsqueeze(1);
    auto v = torch::stack(values);
    auto adv = ret - v.detach();
    auto policy_loss = -(torch::stack(log_probs) * adv).mean();
    auto value_loss = (ret - v).pow(2).mean();
    auto loss = policy_loss + 0.5 * value_loss - 0.01 * entropy_sum / n_steps;
    opt.zero_grad();
    loss.backward();
    opt.step();
    return loss.detach();
  }

  double mean_entropy() const { return torch::stack(entropy_log_).mean().item<double>(); }
};
