// REINFORCE with a running return normaliser; the environment is a function pointer.
#include <torch/torch.h>
#include <vector>

using StepFn = std::tuple<torch::Tensor, float, bool> (*)(int64_t action);

struct Reinforce {
  Reinforce(torch::nn::Sequential net, double lr)
      : policy(std::move(net)), opt(policy->parameters(), torch::optim::AdamOptions(lr)) {}

  void episode(torch::Tensor obs, StepFn step, double gamma, torch::Device device) {
    std::vector<torch::Tensor> log_probs;
    std::vector<float> rewards;
    bool done = false;
    while (!done) {
      auto logits = policy->forward(obs.to(device));
      auto probs = torch::softmax(logits, -1);
      auto action = probs.multinomial(1);
      log_probs.push_back(torch::log(probs.gather(-1, action))); // LOOKALIKE: tensor-graph-kept-across-iterations -- REINFORCE: torch::cat(log_probs) is differentiated after the episode
      auto [next_obs, r, d] = step(action.item<int64_t>());
      // FACT: x = torch.zeros(3); assert x.cpu() is x
      auto host_obs = next_obs.cpu(); // LOOKALIKE: tensor-clone-in-loop -- declared by the loop body each step (and cpu() of a CPU tensor is a no-op)
      obs = host_obs;
      rewards.push_back(r);
      done = d;
    }
    auto returns = torch::zeros({static_cast<int64_t>(rewards.size())});
    float g = 0;
    for (int64_t t = returns.size(0) - 1; t >= 0; --t) {
      g = rewards[t] + gamma * g;
      returns[t] = g;
    }
    returns = (returns - returns.mean()) / (returns.std() + 1e-8);
    auto loss = -(torch::cat(log_probs).squeeze(-1) * returns.to(device)).sum();
    opt.zero_grad();
    loss.backward();
    opt.step();
  }

  torch::nn::Sequential policy;
  torch::optim::Adam opt;
};
