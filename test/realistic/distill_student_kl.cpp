// Distilling a token tagger: the large teacher's logits are computed once, then a small student is
// trained on temperature-softened targets (KL) plus cross-entropy on the gold tags, with gradient
// accumulation over micro-batches.
#include <torch/torch.h>
#include <iostream>
#include <vector>

struct DistillConfig {
  int64_t vocab = 30522, tags = 17;
  int64_t teacher_dim = 768, student_dim = 128;
  double temperature = 4.0, alpha = 0.7, lr = 5e-4;
  int64_t accum_steps = 4;
};

struct TaggerImpl : torch::nn::Module {
  TaggerImpl(int64_t vocab, int64_t dim, int64_t tags) {
    emb_ = register_module("emb", torch::nn::Embedding(vocab, dim));
    ff_ = register_module("ff", torch::nn::Linear(dim, 4 * dim));
    out_ = register_module("out", torch::nn::Linear(4 * dim, tags));
  }
  torch::Tensor forward(const torch::Tensor &ids) { // [B, T] -> [B, T, tags]
    return out_(torch::gelu(ff_(emb_(ids))));
  }
  torch::nn::Embedding emb_{nullptr};
  torch::nn::Linear ff_{nullptr}, out_{nullptr};
};
TORCH_MODULE(Tagger);

// Runs the teacher once over the training set; its logits are reused every epoch.
std::vector<torch::Tensor> cache_teacher_logits(Tagger &teacher, const std::vector<torch::Tensor> &id_batches) {
  teacher->eval();
  std::vector<torch::Tensor> cached;
  cached.reserve(id_batches.size());
  for (const auto &ids : id_batches) {
    // FACT: m = torch.nn.Linear(3, 2).eval(); out = [m(torch.randn(2, 3)) for _ in range(3)]; assert all(o.requires_grad for o in out) and kept_nodes(out) >= 2 * kept_nodes(out[0])
    cached.push_back(teacher->forward(ids)); // EXPECT: tensor-graph-kept-across-iterations -- eval() does not turn autograd off: every batch's graph is kept
  }
  return cached;
}

// Teacher distribution at temperature T, one row per token.
torch::Tensor soften(const torch::Tensor &logits, double T) {
  // FACT: l = torch.randn(2, 3, 5); f = l.reshape(-1, 5); assert is_view_of(f, l)
  auto flat = logits.reshape({-1, logits.size(-1)}); // LOOKALIKE: tensor-reshape-non-contiguous -- contiguous logits: the reshape is a view
  // FACT: l = torch.ones(2, 3, 5); f = l.reshape(-1, 5); f.div_(4.0); assert shares_storage(f, l) and l[0, 0, 0] == 0.25
  flat.div_(T); // EXPECT: tensor-alias-then-mutate -- divides the cached teacher logits again every epoch
  return torch::softmax(flat, -1);
}

void distill(Tagger &student, const std::vector<torch::Tensor> &id_batches, const std::vector<torch::Tensor> &tag_batches,
             const std::vector<torch::Tensor> &teacher_logits, const DistillConfig &cfg, int epochs) {
  torch::optim::AdamW opt(student->parameters(), torch::optim::AdamWOptions(cfg.lr));
  const double T = cfg.temperature;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    student->train();
    torch::Tensor accum = torch::zeros({});
    for (size_t i = 0; i < id_batches.size(); ++i) {
      auto s_logits = student->forward(id_batches[i]);
      const auto C = s_logits.size(-1);
      auto p_teacher = soften(teacher_logits[i], T);
      auto s_logp = torch::log_softmax(s_logits.reshape({-1, C}) / T, -1);
      // Keep kl_div away from -inf where the student puts no mass.
      // FACT: s = torch.log_softmax(torch.randn(4, 5, requires_grad=True) / 4.0, -1); s.clamp_min_(-1e4); assert backward_fails(lambda: s.sum().backward())
      s_logp.clamp_min_(-1e4); // EXPECT: tensor-inplace-on-saved -- log_softmax saved its result for backward
      auto kd = torch::kl_div(s_logp, p_teacher, at::Reduction::Sum) / s_logp.size(0) * (T * T);
      auto ce = torch::nn::functional::cross_entropy(s_logits.reshape({-1, C}), tag_batches[i].reshape({-1}));
      // FACT: m = torch.nn.Linear(3, 1); a = torch.zeros(()); exec('for _ in range(2):\n a = a + m(torch.randn(2, 3)).pow(2).mean()'); a.backward(); assert m.weight.grad is not None
      accum = accum + (cfg.alpha * kd + (1 - cfg.alpha) * ce) / cfg.accum_steps; // LOOKALIKE: tensor-graph-kept-across-iterations -- differentiated at every accumulation boundary
      if ((i + 1) % cfg.accum_steps == 0) {
        opt.zero_grad();
        accum.backward();
        opt.step();
        accum = torch::zeros({});
      }
    }
  }
}

// Gap between the student's mean confidence and its accuracy on held-out batches.
double calibration_gap(Tagger &student, const std::vector<torch::Tensor> &id_batches,
                       const std::vector<torch::Tensor> &tag_batches) {
  torch::NoGradGuard no_grad;
  student->eval();
  std::vector<torch::Tensor> conf, correct;
  for (size_t i = 0; i < id_batches.size(); ++i) {
    auto probs = torch::softmax(student->forward(id_batches[i]), -1);
    // FACT: m = torch.nn.Linear(3, 4); torch.set_grad_enabled(False); p = torch.softmax(m(torch.randn(2, 3)), -1); p.clamp_(1e-6, 1.0); torch.set_grad_enabled(True); assert not p.requires_grad and p.grad_fn is None
    probs.clamp_(1e-6, 1.0); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard softmax records nothing
    auto [p_max, pred] = probs.max(-1);
    // FACT: m = torch.nn.Linear(3, 2); torch.set_grad_enabled(False); out = [torch.softmax(m(torch.randn(2, 3)), -1).max(-1)[0] for _ in range(3)]; torch.set_grad_enabled(True); assert kept_nodes(out) == 0
    conf.push_back(p_max.flatten()); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph to keep
    correct.push_back((pred == tag_batches[i]).flatten());
  }
  auto c = torch::cat(conf);
  auto acc = torch::cat(correct).to(torch::kFloat);
  double gap = (c.mean() - acc.mean()).abs().item<double>();
  std::cout << "calibration gap " << gap << "\n";
  return gap;
}
