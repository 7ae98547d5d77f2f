// A custom autograd Function (clipped log with a hand-written backward) inside a gated model and its training loop.
#include <torch/torch.h>
#include <cmath>
#include <iostream>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// log(clamp(x, eps)), with the gradient passed through only where the clamp was inactive.
struct SafeLog : public torch::autograd::Function<SafeLog> {
  static torch::Tensor forward(AutogradContext *ctx, torch::Tensor x, double eps) {
    auto xc = x.contiguous(); // the kernel below wants dense memory
    // FACT: x = torch.rand(4) * 0 + 0.5; xc = x.contiguous(); xc.clamp_(min=0.6); assert shares_storage(xc, x) and x[0] == 0.6
    xc.clamp_min_(eps); // EXPECT: tensor-alias-then-mutate -- contiguous() returned x itself: the caller's tensor is clamped
    auto out = torch::log(xc);
    ctx->save_for_backward({x, out});
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext *ctx, variable_list grad_output) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0];
    double eps = ctx->saved_data["eps"].toDouble();
    auto grad = grad_output[0].clone(); // EXPECT: tensor-unnecessary-clone -- grad_output[0].div(x) makes it in one pass
    grad.div_(x);
    grad.masked_fill_(x < eps, 0);
    return {grad, torch::Tensor()};
  }
};

// Swish with a saved sigmoid; forward runs with grad mode off, so the in-place clamp is not recorded.
struct Swish : public torch::autograd::Function<Swish> {
  static torch::Tensor forward(AutogradContext *ctx, torch::Tensor x) {
    auto s = torch::sigmoid(x);
    // FACT: seen = []; F = type('F', (torch.autograd.Function,), {'forward': staticmethod(lambda ctx, x: (seen.append(torch.is_grad_enabled()), torch.sigmoid(x).clamp_(1e-6, 1 - 1e-6))[1]), 'backward': staticmethod(lambda ctx, g: g)}); x = torch.randn(3, requires_grad=True); F.apply(x).sum().backward(); assert seen == [False]
    s.clamp_(1e-6, 1 - 1e-6); // LOOKALIKE: tensor-inplace-on-saved -- Function::forward runs under no-grad: autograd saved nothing here
    ctx->save_for_backward({x, s});
    return x * s;
  }
  static variable_list backward(AutogradContext *ctx, variable_list grad_output) {
    auto saved = ctx->get_saved_variables();
    auto x = saved[0], s = saved[1];
    return {grad_output[0] * (s + x * s * (1 - s))};
  }
};

struct GatedNetImpl : torch::nn::Module {
  GatedNetImpl(int64_t in, int64_t hidden, int64_t out) {
    fc_ = register_module("fc", torch::nn::Linear(in, hidden));
    gate_ = register_module("gate", torch::nn::Linear(in, hidden));
    head_ = register_module("head", torch::nn::Linear(hidden, out));
    log_temp_ = register_parameter("log_temp", torch::zeros({1}));
  }

  torch::Tensor forward(const torch::Tensor &x) {
    auto h = fc_(x);
    // FACT: m = torch.nn.Linear(3, 3); h = m(torch.randn(2, 3)); h.mul_(2); h.sum().backward(); assert m.weight.grad is not None
    h.mul_(1.0 / std::sqrt(static_cast<double>(h.size(-1)))); // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output
    auto a = Swish::apply(h);
    auto g = torch::sigmoid(gate_(x));
    return head_(a * g) / log_temp_.exp();
  }

  torch::nn::Linear fc_{nullptr}, gate_{nullptr}, head_{nullptr};
  torch::Tensor log_temp_;
};
TORCH_MODULE(GatedNet);

// Positive-valued targets: the loss is on the log scale, through SafeLog.
void train(GatedNet &net, const torch::Tensor &x, const torch::Tensor &y, int epochs, int accum) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3));
  torch::Tensor epoch_loss = torch::zeros({});
  for (int e = 0; e < epochs; ++e) {
    opt.zero_grad();
    torch::Tensor micro_total = torch::zeros({});
    for (int k = 0; k < accum; ++k) {
      auto xb = x.chunk(accum, 0)[k], yb = y.chunk(accum, 0)[k];
      auto pred = torch::softplus(net->forward(xb));
      auto lp = SafeLog::apply(pred, 1e-6);
      // FACT: m = torch.nn.Linear(3, 1); t = sum(m(torch.randn(2, 3)).pow(2).mean() / 3 for _ in range(3)); t.backward(); assert m.weight.grad is not None
      micro_total = micro_total + torch::mse_loss(lp, torch::log(yb)) / accum; // LOOKALIKE: tensor-graph-kept-across-iterations -- differentiated after the micro-batch loop
    }
    micro_total.backward();
    opt.step();
    // FACT: w = torch.zeros(1, requires_grad=True); assert raises(lambda: w.clamp_(-3, 3), "a leaf Variable that requires grad")
    net->log_temp_.clamp_(-3.0, 3.0); // EXPECT: tensor-inplace-on-leaf -- a registered parameter, outside NoGradGuard
    // FACT: m = torch.nn.Linear(3, 1); tot = torch.zeros(()); exec('for _ in range(3):\n l = m(torch.randn(2, 3)).pow(2).mean(); l.backward(); tot += l'); assert kept_nodes(tot) >= 6
    epoch_loss += micro_total; // EXPECT: tensor-graph-kept-across-iterations
  }
  std::cout << "mean loss " << (epoch_loss / epochs).item<double>() << "\n";
}

// Fine-tuning the gate with a hand-scaled score; the log of the score goes through SafeLog.
torch::Tensor gate_step(GatedNet &net, torch::optim::Optimizer &opt, const torch::Tensor &x, const torch::Tensor &y) {
  opt.zero_grad();
  auto score = torch::sigmoid(net->gate_(x));
  // FACT: m = torch.nn.Linear(3, 2); s = torch.sigmoid(m(torch.randn(4, 3))); s.mul_(2); assert backward_fails(lambda: s.sum().backward())
  score.mul_(2.0); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result; the backward below needs it
  auto logs = SafeLog::apply(score, 1e-4);
  // FACT: F = type('F', (torch.autograd.Function,), {'forward': staticmethod(lambda ctx, x: (lambda o: (ctx.save_for_backward(o), o)[1])(x.exp())), 'backward': staticmethod(lambda ctx, g: g * ctx.saved_tensors[0])}); x = torch.randn(3, requires_grad=True); o = F.apply(x); o.sub_(1); assert backward_fails(lambda: o.sum().backward())
  logs.sub_(logs.mean().detach()); // EXPECT: tensor-inplace-on-saved -- SafeLog saved its output (ctx->save_for_backward)
  auto loss = torch::mse_loss(logs, y);
  loss.backward();
  {
    torch::NoGradGuard no_grad;
    // FACT: w = torch.zeros(1, requires_grad=True); exec('with torch.no_grad(): w.clamp_(-3, 3)')
    net->log_temp_.clamp_(-3.0, 3.0); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  opt.step();
  return loss.detach();
}
