// REINFORCE with an entropy bonus on a discrete policy.
#include <torch/torch.h>
#include <vector>

struct Policy : torch::nn::Module {
  Policy(int obs, int actions) {
    body = register_module("body", torch::nn::Linear(obs, 64));
    head = register_module("head", torch::nn::Linear(64, actions));
  }
  torch::Tensor forward(torch::Tensor s) { return head(torch::tanh(body(s))); }
  torch::nn::Linear body{nullptr}, head{nullptr};
};

void update(Policy &policy, torch::optim::Optimizer &opt, const torch::Tensor &states,
            const torch::Tensor &actions, torch::Tensor returns) {
  auto logits = policy.forward(states);
  auto probs = torch::softmax(logits, -1);
  // FACT: l = torch.randn(4, 3, requires_grad=True) * 1; assert backward_fails(lambda: (lambda p: (p.clamp_(1e-8, 1.0), p.log().sum().backward()))(torch.softmax(l, -1)))
  probs.clamp_(1e-8, 1.0); // EXPECT: tensor-inplace-on-saved
  auto log_probs = probs.log();
  auto chosen = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1);
  returns = (returns - returns.mean()) / (returns.std() + 1e-8);
  auto entropy = -(probs * log_probs).sum(-1).mean();
  auto loss = -(chosen * returns).mean() - 0.01 * entropy;
  opt.zero_grad();
  loss.backward();
  opt.step();
}

void update_stable(Policy &policy, torch::optim::Optimizer &opt, const torch::Tensor &states,
                   const torch::Tensor &actions, const torch::Tensor &returns) {
  auto logits = policy.forward(states);
  auto log_probs = torch::log_softmax(logits, -1);
  // FACT: fc = torch.nn.Linear(3, 3); q = fc(torch.randn(2, 3)); ls = torch.log_softmax(q, -1); q.add_(1); ls.sum().backward()
  logits.sub_(logits.max()); // LOOKALIKE: tensor-inplace-on-saved -- log_softmax saves its result, not its input
  auto chosen = log_probs.gather(1, actions.unsqueeze(1)).squeeze(1);
  auto adv = returns.clone(); // EXPECT: tensor-unnecessary-clone -- centred in place at once: returns - returns.mean() is one pass
  adv.sub_(adv.mean()); // LOOKALIKE: tensor-inplace-on-saved -- returns do not require grad
  auto loss = -(chosen * adv).mean();
  opt.zero_grad();
  loss.backward();
  opt.step();
}

int main() {
  Policy policy(4, 2);
  torch::optim::Adam opt(policy.parameters(), 1e-3);
  auto states = torch::randn({16, 4});
  auto actions = torch::randint(0, 2, {16});
  auto returns = torch::randn({16});
  update(policy, opt, states, actions, returns);
  update_stable(policy, opt, states, actions, returns);
}
