// A2C critic with value normalisation and temperature-scaled policy logits.
#include <torch/torch.h>

struct ActorCriticImpl : torch::nn::Module {
  ActorCriticImpl(int64_t obs, int64_t acts) {
    body_ = register_module("body", torch::nn::Linear(obs, 128));
    pi_ = register_module("pi", torch::nn::Linear(128, acts));
    v_ = register_module("v", torch::nn::Linear(128, 1));
  }
  torch::nn::Linear body_{nullptr}, pi_{nullptr}, v_{nullptr};
};
TORCH_MODULE(ActorCritic);

torch::Tensor a2c_loss(ActorCritic &net, const torch::Tensor &obs, const torch::Tensor &actions,
                       const torch::Tensor &returns, double ret_mean, double ret_std, double temperature) {
  auto h = torch::tanh(net->body_(obs));
  auto logits = net->pi_(h);
  auto values = net->v_(h).squeeze(-1);

  auto scaled = logits.data();
  // FACT: l = torch.nn.Linear(3, 2)(torch.randn(4, 3)); d = l.data; v0 = l._version; d.div_(2); assert shares_storage(d, l) and l._version == v0
  scaled.div_(temperature); // EXPECT: tensor-inplace-on-detached
  auto logp = torch::log_softmax(logits, -1).gather(1, actions.unsqueeze(1)).squeeze(1);

  auto v_norm = values.detach();
  // FACT: v = torch.nn.Linear(3, 1)(torch.randn(4, 3)).squeeze(-1); d = v.detach(); d.sub_(1); assert shares_storage(d, v)
  v_norm.sub_(ret_mean).div_(ret_std); // EXPECT: tensor-inplace-on-detached
  auto adv = (returns - ret_mean) / ret_std - v_norm;
  auto value_loss = ((returns - ret_mean) / ret_std - values).pow(2).mean();
  return -(logp * adv).mean() + 0.5 * value_loss;
}
