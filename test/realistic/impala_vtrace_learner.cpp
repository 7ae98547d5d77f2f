// IMPALA learner (Espeholt et al., 2018): consumes unrolls produced by the actor
// pool, recomputes the policy on the learner, corrects the off-policy gap with
// V-trace and takes one RMSProp step per batch.
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <vector>

namespace F = torch::nn::functional;

struct ImpalaConfig {
  int64_t num_actions = 6;
  int64_t frame_channels = 4;
  int64_t hidden = 256;
  double discount = 0.99;
  double clip_rho_threshold = 1.0;
  double clip_pg_rho_threshold = 1.0;
  double baseline_cost = 0.5;
  double entropy_cost = 0.01;
  double reward_clip = 1.0;
  double grad_norm_clip = 40.0;
  double learning_rate = 4.8e-4;
  int64_t log_every = 50;
};

// One batch of unrolls. Frames and rewards are stacked time-major by the
// batcher; actions and behaviour logits come from the inference server, which
// keeps one row per actor.
struct Trajectory {
  torch::Tensor frames;            // [T + 1, B, C, 84, 84] uint8
  torch::Tensor last_rewards;      // [T + 1, B] reward seen before each frame
  torch::Tensor rewards;           // [T, B]
  torch::Tensor done;              // [T, B] bool
  torch::Tensor actions;           // [B, T] int64
  torch::Tensor behaviour_logits;  // [B, T, A]
};

// Filled by the actor threads; the learner only pops.
class ActorQueue {
 public:
  Trajectory pop();
  bool closed() const;
};

struct NetOutput {
  torch::Tensor policy_logits;  // [T + 1, B, A]
  torch::Tensor baseline;       // [T + 1, B]
};

struct ImpalaNetImpl : torch::nn::Module {
  explicit ImpalaNetImpl(const ImpalaConfig& cfg)
      : conv1(torch::nn::Conv2dOptions(cfg.frame_channels, 16, 8).stride(4)),
        conv2(torch::nn::Conv2dOptions(16, 32, 4).stride(2)),
        fc(32 * 9 * 9, cfg.hidden),
        reward_proj(1, cfg.hidden),
        policy(cfg.hidden, cfg.num_actions),
        baseline(cfg.hidden, 1) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("fc", fc);
    register_module("reward_proj", reward_proj);
    register_module("policy", policy);
    register_module("baseline", baseline);
  }

  NetOutput forward(const torch::Tensor& frames, const torch::Tensor& last_rewards) {
    const int64_t T1 = frames.size(0);
    const int64_t B = frames.size(1);
    auto x = frames.flatten(0, 1).to(torch::kFloat) / 255.0;
    x = F::relu(conv1(x));
    x = F::relu(conv2(x));
    auto h = fc(x.flatten(1));
    auto r = last_rewards.reshape({T1 * B, 1}).clamp(-1.0, 1.0);
    h.add_(reward_proj(r));  // LOOKALIKE: tensor-inplace-on-saved -- a Linear output is not saved for its backward
    h = torch::relu(h);
    // FACT: h = torch.randn(12, 6); assert is_view_of(h.view(3, 4, 6), h)
    auto logits = policy(h).view({T1, B, -1});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto values = baseline(h).view({T1, B});
    return {logits, values};
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc, reward_proj, policy, baseline;
};
TORCH_MODULE(ImpalaNet);

struct VTraceReturns {
  torch::Tensor vs_minus_v;     // [T, B]
  torch::Tensor pg_advantages;  // [T, B]
};

// V-trace targets, eq. (1) of the paper, evaluated backwards in time:
//   v_s - V(x_s) = delta_s + gamma_s * c_s * (v_{s+1} - V(x_{s+1}))
VTraceReturns vtrace_from_importance_weights(const torch::Tensor& log_rhos,         // [T, B]
                                             const torch::Tensor& discounts,        // [T, B]
                                             const torch::Tensor& rewards,          // [T, B]
                                             const torch::Tensor& values,           // [T, B]
                                             const torch::Tensor& bootstrap_value,  // [B]
                                             const ImpalaConfig& cfg) {
  torch::NoGradGuard no_grad;
  const int64_t T = log_rhos.size(0);

  // The recursion runs in double precision: unrolls can be long.
  auto rhos = torch::exp(log_rhos.to(torch::kFloat64));
  auto clipped_rhos = rhos.clamp_max(cfg.clip_rho_threshold);
  auto cs = rhos.clamp_max(1.0);
  auto values64 = values.to(torch::kFloat64);
  auto bootstrap64 = bootstrap_value.to(torch::kFloat64);
  auto values_tp1 = torch::cat({values64.narrow(0, 1, T - 1), bootstrap64.unsqueeze(0)}, 0);
  auto deltas = clipped_rhos * (rewards + discounts * values_tp1 - values64);

  auto acc = torch::zeros_like(bootstrap64);
  auto vs_minus_v = torch::empty_like(values64);
  for (int64_t t = T - 1; t >= 0; --t) {
    auto gamma_t = discounts.to(torch::kFloat64).select(0, t);  // EXPECT: tensor-clone-in-loop
    acc = deltas[t] + gamma_t * cs[t] * acc;
    vs_minus_v[t] = acc;  // LOOKALIKE: tensor-copy-narrowing -- acc is float64, like the buffer
  }

  auto vs = vs_minus_v + values64;
  auto vs_tp1 = torch::cat({vs.narrow(0, 1, T - 1), bootstrap64.unsqueeze(0)}, 0);
  auto clipped_pg_rhos = rhos.clamp_max(cfg.clip_pg_rho_threshold);
  auto pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_tp1 - values64);
  return {vs_minus_v.to(torch::kFloat), pg_advantages.to(torch::kFloat)};
}

// Atari setting of the paper: rewards clipped to [-c, c].
void clip_rewards_(torch::Tensor rewards, double c) {
  // FACT: r = torch.randn(3, 4) * 5; (lambda t: t.clamp_(-1.0, 1.0))(r); assert r.abs().max() <= 1.0
  rewards.clamp_(-c, c);  // LOOKALIKE: tensor-alias-then-mutate -- writing its argument is this helper's job
}

void train(ActorQueue& queue, const ImpalaConfig& cfg, int64_t num_updates) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ImpalaNet net(cfg);
  net->to(device);
  torch::optim::RMSprop opt(net->parameters(),
                            torch::optim::RMSpropOptions(cfg.learning_rate).alpha(0.99).eps(0.01));

  torch::Tensor running_loss = torch::zeros({}, torch::TensorOptions().device(device));
  double entropy_sum = 0.0;
  double raw_return_sum = 0.0;

  for (int64_t update = 0; update < num_updates && !queue.closed(); ++update) {
    Trajectory batch = queue.pop();
    const int64_t T = batch.rewards.size(0);
    const int64_t B = batch.rewards.size(1);
    const int64_t A = cfg.num_actions;

    auto rewards = batch.rewards;
    if (cfg.reward_clip > 0) {
      // FACT: b = torch.randn(3, 4) * 5; r = b; r.clamp_(-1.0, 1.0); assert shares_storage(r, b) and b.abs().max() <= 1.0
      clip_rewards_(rewards, cfg.reward_clip);  // EXPECT: tensor-alias-then-mutate
    }
    rewards = rewards.to(device);
    auto frames = batch.frames.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every update
    auto last_rewards = batch.last_rewards.to(device);
    // FACT: d = torch.tensor([[True, False], [False, False]]); n = (~d).to(torch.float); n.mul_(0.99); assert d.tolist() == [[True, False], [False, False]]
    auto discounts = (~batch.done.to(device)).to(torch::kFloat);
    discounts.mul_(cfg.discount);  // LOOKALIKE: tensor-alias-then-mutate -- '~done' is a fresh tensor; its float copy is owned

    NetOutput out = net->forward(frames, last_rewards);
    auto learner_logits = out.policy_logits.narrow(0, 0, T);  // [T, B, A]
    auto values = out.baseline.narrow(0, 0, T);               // [T, B]
    auto bootstrap_value = out.baseline[T];                   // [B]

    // Actor-side tensors: one row per actor, bring them to [T, B].
    auto actions = batch.actions.to(device).t();
    // FACT: a = torch.zeros(3, 4, dtype=torch.long); assert raises(lambda: a.t().view(12), "view size is not compatible")
    auto flat_actions = actions.view({T * B});  // EXPECT: tensor-view-non-contiguous
    // FACT: x = torch.randn(3, 4, 5); assert is_copy_of(x.transpose(0, 1).reshape(12, 5), x)
    auto behaviour_flat = batch.behaviour_logits.to(device).transpose(0, 1).reshape({T * B, A});  // EXPECT: tensor-reshape-non-contiguous

    auto ce = F::CrossEntropyFuncOptions().reduction(torch::kNone);
    // FACT: x = torch.randn(5, 3, 4); n = x.narrow(0, 0, 4); assert is_view_of(n.flatten(0, 1), x)
    auto target_logp = -F::cross_entropy(learner_logits.flatten(0, 1), flat_actions, ce).view({T, B});  // LOOKALIKE: tensor-reshape-non-contiguous -- a narrow along the outer dim is still contiguous: flatten is a view
    // FACT: x = torch.randn(3, 4, 5); y = x.transpose(0, 1).reshape(12, 5); c = torch.nn.functional.cross_entropy(y, torch.zeros(12, dtype=torch.long), reduction="none"); assert is_contiguous(c) and is_view_of(c.view(4, 3), c)
    auto behaviour_logp = -F::cross_entropy(behaviour_flat, flat_actions, ce).view({T, B});  // LOOKALIKE: tensor-view-non-contiguous -- cross_entropy's per-sample output is a fresh contiguous [T * B]

    auto vt = vtrace_from_importance_weights((target_logp - behaviour_logp).detach(), discounts, rewards,
                                             values.detach(), bootstrap_value.detach(), cfg);

    auto pg_loss = -(target_logp * vt.pg_advantages).sum();

    // FACT: lin = torch.nn.Linear(4, 1); v = lin(torch.randn(6, 4)).view(3, 2); vs = v.detach(); vs += 1.0; assert float(((vs - v) ** 2).sum()) == 0.0
    auto vs = values.detach();
    vs += vt.vs_minus_v;  // EXPECT: tensor-inplace-on-detached
    auto baseline_loss = 0.5 * (vs - values).pow(2).sum();

    // FACT: l = torch.randn(3, 4, requires_grad=True); p = torch.softmax(l, -1); p.clamp_(1e-6, 1.0); assert backward_fails(lambda: (p * p.log()).sum().backward())
    auto probs = torch::softmax(learner_logits, -1);
    probs.clamp_(1e-6, 1.0);  // EXPECT: tensor-inplace-on-saved
    auto neg_entropy = (probs * torch::log(probs)).sum();

    auto total_loss = pg_loss + cfg.baseline_cost * baseline_loss + cfg.entropy_cost * neg_entropy;

    opt.zero_grad();
    total_loss.backward();
    torch::nn::utils::clip_grad_norm_(net->parameters(), cfg.grad_norm_clip);
    auto w_before = net->policy->weight.detach().clone();  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a snapshot: opt.step() rewrites the weights before it is read
    opt.step();
    auto update_ratio = (net->policy->weight.detach() - w_before).norm() / (w_before.norm() + 1e-12);

    running_loss = 0.99 * running_loss + 0.01 * total_loss;  // EXPECT: tensor-graph-kept-across-iterations
    entropy_sum += -neg_entropy.item<double>() / static_cast<double>(T * B);  // EXPECT: tensor-sync-in-loop
    raw_return_sum += batch.rewards.sum().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- batch.rewards is the actor queue's host tensor

    if (update % cfg.log_every == 0) {
      std::cout << "update " << update << " loss " << running_loss.item<double>()  // LOOKALIKE: tensor-sync-in-loop -- only on logging steps
                << " entropy " << entropy_sum / static_cast<double>(update + 1)
                << " return " << raw_return_sum / static_cast<double>(update + 1)
                << " |dW|/|W| " << update_ratio.item<double>() << std::endl;
    }
  }
}
