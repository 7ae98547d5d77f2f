// Fused softmax cross-entropy with ignore_index and label smoothing.
// One pass over each row computes the loss and keeps the probabilities for a
// cheap backward (p - q). CPU kernel with accessors; other devices fall back to
// the composite reference.
#include <torch/torch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct XentOptions {
  int64_t ignore_index = 0;  // pad id
  double smoothing = 0.1;
  double logit_scale = 1.0;
};

namespace detail {

// Returns {per-row loss, probabilities}.
std::pair<torch::Tensor, torch::Tensor> xent_forward_cpu(const torch::Tensor& logits,
                                                         const torch::Tensor& target,
                                                         int64_t ignore_index, double smoothing) {
  const int64_t n = logits.size(0), v = logits.size(1);
  auto probs = torch::empty({n, v}, logits.options());
  auto row_loss = torch::zeros({n}, logits.options().dtype(torch::kDouble));
  auto x = logits.accessor<float, 2>();
  auto p = probs.accessor<float, 2>();
  auto t = target.accessor<int64_t, 1>();
  auto l = row_loss.accessor<double, 1>();
  const double off = smoothing / static_cast<double>(v);
  const double on = 1.0 - smoothing + off;

  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (t[i] == ignore_index) {
        for (int64_t j = 0; j < v; ++j) p[i][j] = 0.f;
        continue;
      }
      float mx = x[i][0];
      for (int64_t j = 1; j < v; ++j) mx = std::max(mx, x[i][j]);
      double sum = 0.0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(x[i][j] - mx));
      const double lse = mx + std::log(sum);
      double loss = 0.0;
      for (int64_t j = 0; j < v; ++j) {
        const double logp = x[i][j] - lse;
        p[i][j] = static_cast<float>(std::exp(logp));
        loss -= (j == t[i] ? on : off) * logp;
      }
      l[i] = loss;
    }
  });
  return {row_loss, probs};
}

torch::Tensor xent_backward_cpu(const torch::Tensor& probs, const torch::Tensor& target,
                                int64_t ignore_index, double smoothing) {
  const int64_t n = probs.size(0), v = probs.size(1);
  auto grad = torch::empty_like(probs);
  auto p = probs.accessor<float, 2>();
  auto g = grad.accessor<float, 2>();
  auto t = target.accessor<int64_t, 1>();
  const float off = static_cast<float>(smoothing / static_cast<double>(v));
  const float hit = static_cast<float>(1.0 - smoothing);

  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const bool skip = t[i] == ignore_index;
      for (int64_t j = 0; j < v; ++j) g[i][j] = skip ? 0.f : p[i][j] - off;
      if (!skip) g[i][t[i]] -= hit;
    }
  });
  return grad;
}

}  // namespace detail

struct FusedSoftmaxXent : public torch::autograd::Function<FusedSoftmaxXent> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& target, int64_t ignore_index, double smoothing) {
    TORCH_CHECK(logits.dim() == 2 && target.dim() == 1, "fused xent expects [N, V] logits and [N] targets");
    TORCH_CHECK(logits.scalar_type() == torch::kFloat, "fused xent: float logits only");
    auto [row_loss, probs] = detail::xent_forward_cpu(logits, target, ignore_index, smoothing);
    const int64_t count = std::max<int64_t>(target.ne(ignore_index).sum().item<int64_t>(), 1);

    ctx->save_for_backward({probs, target});
    ctx->saved_data["ignore_index"] = ignore_index;
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["count"] = count;

    auto loss = torch::empty({}, logits.options());
    loss.copy_(row_loss.sum() / static_cast<double>(count));  // EXPECT: tensor-copy-narrowing
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const int64_t ignore_index = ctx->saved_data["ignore_index"].toInt();
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const int64_t count = ctx->saved_data["count"].toInt();
    auto grad = detail::xent_backward_cpu(saved[0], saved[1], ignore_index, smoothing);
    grad.mul_(grad_outputs[0] / static_cast<double>(count));
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Label-smoothed target distribution, one row per example.
torch::Tensor smoothed_targets(const torch::Tensor& target, int64_t v, double smoothing,
                               const torch::TensorOptions& opts) {
  const double off = smoothing / static_cast<double>(v);
  // FACT: s = torch.full((1, 5), 0.02); assert raises(lambda: s.expand(4, 5).scatter_(1, torch.zeros(4, 1, dtype=torch.long), 0.9), 'more than one element')
  auto q = torch::full({1, v}, off, opts).expand({target.size(0), v});
  q.scatter_(1, target.unsqueeze(1), 1.0 - smoothing + off);  // EXPECT: tensor-inplace-on-expanded
  return q;
}

// Composite version: the ground truth in tests and the path for non-CPU tensors.
torch::Tensor reference_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                      const XentOptions& opt) {
  auto logp = torch::log_softmax(logits, 1);
  // FACT: x = torch.randn(6, 5, requires_grad=True); lp = torch.log_softmax(x * 1, 1); assert backward_fails(lambda: lp.clamp_min_(-1e4).sum().backward())
  logp.clamp_min_(-1e4);  // EXPECT: tensor-inplace-on-saved
  auto valid = target.ne(opt.ignore_index);
  auto safe = target.clone();  // EXPECT: tensor-unnecessary-clone
  safe.masked_fill_(valid.logical_not(), 0);
  auto q = smoothed_targets(safe, logits.size(1), opt.smoothing, logp.options());
  auto row = -(q * logp).sum(1);
  // FACT: a = torch.randn(4, 5, requires_grad=True); lp = torch.log_softmax(a, 1); assert not backward_fails(lambda: (-(torch.rand(4, 5) * lp).sum(1)).mul_(torch.ones(4)).sum().backward())
  row.mul_(valid.to(row.scalar_type()));  // LOOKALIKE: tensor-inplace-on-saved -- the negated sum is not saved by anything
  return row.sum() / valid.sum().clamp_min(1).to(row.scalar_type());
}

torch::Tensor fused_cross_entropy(const torch::Tensor& logits, const torch::Tensor& target,
                                  const XentOptions& opt) {
  // FACT: x = torch.randn(6, 5); assert shares_storage(x.contiguous(), x)
  auto x = logits.contiguous();
  if (opt.logit_scale != 1.0) x.mul_(opt.logit_scale);  // EXPECT: tensor-alias-then-mutate
  if (!x.device().is_cpu()) return reference_cross_entropy(x, target, opt);
  return FusedSoftmaxXent::apply(x, target.contiguous(), opt.ignore_index, opt.smoothing);
}

struct TinyLMImpl : torch::nn::Module {
  TinyLMImpl(int64_t vocab, int64_t dim, int64_t kernel)
      : emb(vocab, dim),
        conv(torch::nn::Conv1dOptions(dim, dim, kernel).padding(kernel - 1)),
        head(dim, vocab) {
    register_module("emb", emb);
    register_module("conv", conv);
    register_module("head", head);
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    auto h = emb(tokens).transpose(1, 2);
    h = torch::gelu(conv(h)).slice(2, 0, tokens.size(1));
    return head(h.transpose(1, 2));
  }

  torch::nn::Embedding emb;
  torch::nn::Conv1d conv;
  torch::nn::Linear head;
};
TORCH_MODULE(TinyLM);

torch::Tensor sample_tokens(int64_t batch, int64_t len, int64_t vocab) {
  auto tokens = torch::randint(1, vocab, {batch, len}, torch::kLong);
  auto lengths = torch::randint(len / 2, len + 1, {batch, 1}, torch::kLong);
  return tokens.masked_fill(torch::arange(len).unsqueeze(0) >= lengths, 0);
}

void check_against_reference(const XentOptions& opt) {
  torch::manual_seed(1);
  const int64_t n = 64, v = 50;
  auto logits = torch::randn({n, v}, torch::requires_grad());
  logits.mul_(3.0);  // EXPECT: tensor-inplace-on-leaf
  auto target = torch::randint(0, v, {n}, torch::kLong);

  auto got = fused_cross_entropy(logits, target, opt);
  got.backward();
  auto ref_in = logits.detach().clone().requires_grad_(true);
  auto want = reference_cross_entropy(ref_in, target, opt);
  want.backward();

  std::cout << "loss diff " << (got - want).abs().item<double>() << ", grad diff "
            << (logits.grad() - ref_in.grad()).abs().max().item<double>() << "\n";
}

double evaluate(TinyLM& model, const XentOptions& opt, int64_t batches, int64_t vocab) {
  torch::NoGradGuard no_grad;
  model->eval();
  double nll_sum = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; b < batches; ++b) {
    auto tokens = sample_tokens(16, 65, vocab);
    auto logits = model(tokens.slice(1, 0, -1));
    // FACT: x = torch.randn(4, 3, 5); assert is_view_of(x.reshape(-1, 5), x)
    auto flat = logits.reshape({-1, logits.size(-1)});  // LOOKALIKE: tensor-reshape-non-contiguous -- the linear head's output is contiguous, so this is a view
    // FACT: t = torch.randint(0, 9, (2, 5)); c = t[:, 1:].contiguous(); assert is_view_of(c.view(-1), c)
    auto t = tokens.slice(1, 1).contiguous().view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first, the view is valid
    auto valid = t.ne(opt.ignore_index);
    // FACT: lp = torch.log_softmax(torch.randn(4, 5), 1); n = lp.gather(1, torch.zeros(4, 1, dtype=torch.long)).squeeze(1); assert is_copy_of(n, lp)
    auto nll = torch::log_softmax(flat, -1).gather(1, t.unsqueeze(1)).squeeze(1);
    nll.neg_();  // LOOKALIKE: tensor-alias-then-mutate -- squeeze views gather's fresh output; nobody else holds it
    nll_sum += nll.masked_select(valid).sum().item<double>();
    count += valid.sum().item<int64_t>();
  }
  model->train();
  return std::exp(nll_sum / static_cast<double>(std::max<int64_t>(count, 1)));
}

void train(TinyLM& model, const XentOptions& opt, int64_t steps, int64_t vocab) {
  const double lr = 0.05, calib_temp = 1.5, z_weight = 1e-4;
  std::vector<torch::Tensor> losses;
  double running = 0.0;
  auto snapshot = model->head->weight.detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- the weights are updated in place below; the copy is the reference point
  for (int64_t step = 0; step < steps; ++step) {
    auto tokens = sample_tokens(32, 65, vocab);
    auto inputs = tokens.slice(1, 0, -1);
    auto targets = tokens.slice(1, 1);
    auto logits = model(inputs);

    // FACT: lin = torch.nn.Linear(4, 6); y = lin(torch.randn(2, 4, 3).transpose(1, 2)); assert is_view_of(y.view(-1, 6), y)
    auto flat_logits = logits.view({-1, vocab});  // LOOKALIKE: tensor-view-non-contiguous -- the linear head returns a contiguous tensor
    // FACT: t = torch.randint(0, 9, (2, 5)); assert raises(lambda: t[:, 1:].view(-1), 'view size is not compatible')
    auto flat_targets = targets.view({-1});  // EXPECT: tensor-view-non-contiguous

    auto scores = flat_logits.detach();
    scores.div_(calib_temp);  // EXPECT: tensor-inplace-on-detached
    const double confidence = torch::softmax(scores, -1).amax(-1).mean().item<double>();

    auto xent = fused_cross_entropy(flat_logits, flat_targets, opt);
    auto z_loss = torch::logsumexp(flat_logits, -1).pow(2).mean();
    auto loss = xent + z_weight * z_loss;

    model->zero_grad();
    loss.backward();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) {
        p.sub_(lr * p.grad());  // LOOKALIKE: tensor-inplace-on-leaf -- manual SGD update under NoGradGuard
      }
    }
    losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    running += xent.item<double>();  // LOOKALIKE: tensor-sync-in-loop -- CPU training; item() waits on no device
    if (step % 100 == 99) {
      std::cout << "step " << step + 1 << " xent " << running / 100.0 << " conf " << confidence << "\n";
      running = 0.0;
    }
  }
  std::cout << "head moved by " << (model->head->weight.detach() - snapshot).norm().item<double>()
            << " over " << losses.size() << " steps\n";
}

int main() {
  torch::manual_seed(0);
  XentOptions opt;
  check_against_reference(opt);

  const int64_t vocab = 512;
  TinyLM model(vocab, 128, 5);
  XentOptions train_opt = opt;
  train_opt.logit_scale = 0.5;
  train(model, train_opt, 1000, vocab);
  std::cout << "eval ppl " << evaluate(model, train_opt, 20, vocab) << "\n";
  return 0;
}
