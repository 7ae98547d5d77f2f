// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-detached %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-detached %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;

// ===== positives ============================================================

Tensor noisyLoss(torch::nn::Linear &fc, const Tensor &x) {
  Tensor out = fc->forward(x);
  auto target = out.detach();
  // CHECK-FIXES: {{^}}  auto target = out.detach().clone();{{$}}
  target.add_(torch::randn_like(target) * 0.1);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'add_' on 'target' changes 'out' behind autograd's back: 'detach()' shares storage and the version counter with its source [tensor-inplace-on-detached]
  return torch::mse_loss(out, target);
}

// A parameter's handle: the write means to change the weights, so no
// fix-it (an owned copy would silently drop the change).
void scaleWeights(torch::nn::Linear &fc) {
  Tensor w = fc->weight.data();
  // CHECK-FIXES: {{^}}  Tensor w = fc->weight.data();{{$}}
  w.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'w' changes 'weight' behind autograd's back: 'data()' shares storage but not even the version counter
  // CHECK-MESSAGES: :[[@LINE-4]]:14: note: 'weight' is detached here; use 'detach().clone()' for a copy the code can own, or write the parameter itself under a 'NoGradGuard' to change it
}

void mutateParameters(torch::nn::Linear &net, double rate) {
  for (auto &p : net->parameters()) {
    auto data = p.data();
    // CHECK-FIXES: {{^}}    auto data = p.data();{{$}}
    data.add_(torch::randn_like(data) * rate);
    // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'add_' on 'data' changes 'p' behind autograd's back
  }
}

Tensor clippedCopy(const Tensor &grad) {
  auto g = grad.detach();
  // CHECK-FIXES: {{^}}  auto g = grad.detach().clone();{{$}}
  g.clamp_(-1, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'clamp_' on 'g' changes 'grad'
  return g;
}

// The source is not read again, but logsigmoid saved it for backward: the
// detached write bumps the shared version counter and backward() raises.
void marginLog(torch::nn::Linear &scorer, const Tensor &x) {
  auto diff = scorer(x);
  auto loss = -torch::nn::functional::logsigmoid(diff).mean();
  auto margin = diff.detach();
  margin.clamp_(-10.0, 10.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'clamp_' on 'margin' changes 'diff' behind autograd's back: 'detach()' shares storage and the version counter with its source [tensor-inplace-on-detached]
  // CHECK-FIXES: {{^}}  auto margin = diff.detach().clone();{{$}}
  loss.backward();
  // CHECK-MESSAGES: :[[@LINE-1]]:3: note: 'diff' was saved for backward by an earlier op: backward() here raises
}

// A module call saves its input too: the critic's Linear keeps 'fake' for
// the weight's gradient.
void criticPreview(torch::nn::Linear &critic, torch::nn::Linear &gen, const Tensor &z) {
  auto fake = gen(z);
  auto score = critic(fake).mean();
  auto preview = fake.detach();
  preview.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: in-place 'mul_' on 'preview' changes 'fake' behind autograd's back: 'detach()' shares storage and the version counter with its source [tensor-inplace-on-detached]
  // CHECK-FIXES: {{^}}  auto preview = fake.detach().clone();{{$}}
  score.backward();
  // CHECK-MESSAGES: :[[@LINE-1]]:3: note: 'fake' was saved for backward by an earlier op: backward() here raises
}

// ... and a user module whose forward's first layer saves its parameter.
struct CriticImpl : torch::nn::Module {
  CriticImpl() : fc(register_module("fc", torch::nn::Linear(8, 1))) {}
  Tensor forward(const Tensor &x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Critic);

void criticShown(Critic &critic, torch::nn::Linear &gen, const Tensor &z) {
  auto fake = gen(z);
  auto loss = critic->forward(fake).mean();
  auto shown = fake.detach();
  shown.add_(1.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'add_' on 'shown' changes 'fake' behind autograd's back
  // CHECK-FIXES: {{^}}  auto shown = fake.detach().clone();{{$}}
  loss.backward();
  // CHECK-MESSAGES: :[[@LINE-1]]:3: note: 'fake' was saved for backward by an earlier op: backward() here raises
}

// ... and a function of the TU whose body saves its parameter.
Tensor maskedBce(const Tensor &logits, const Tensor &y) {
  return torch::binary_cross_entropy_with_logits(logits, y);
}
void probsShown(torch::nn::Linear &fc, const Tensor &x, const Tensor &y) {
  auto logits = fc(x);
  auto loss = maskedBce(logits, y);
  auto probs = logits.detach();
  probs.sigmoid_();
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'sigmoid_' on 'probs' changes 'logits' behind autograd's back
  // CHECK-FIXES: {{^}}  auto probs = logits.detach().clone();{{$}}
  loss.backward();
  // CHECK-MESSAGES: :[[@LINE-1]]:3: note: 'logits' was saved for backward by an earlier op: backward() here raises
}

// ===== negatives (the idioms) ================================================

// The forward saves 'x + 1', a new tensor, never its parameter: the write
// through detach() is invisible to backward.
struct ShiftedCriticImpl : torch::nn::Module {
  ShiftedCriticImpl() : fc(register_module("fc", torch::nn::Linear(8, 1))) {}
  Tensor forward(const Tensor &x) { return fc(x + 1.0); }
  torch::nn::Linear fc;
};
TORCH_MODULE(ShiftedCritic);

void shiftedShown(ShiftedCritic &critic, torch::nn::Linear &gen, const Tensor &z) {
  auto fake = gen(z);
  auto loss = critic(fake).mean();
  auto shown = fake.detach();
  shown.add_(1.0);
  loss.backward();
}

// Dropout saves its mask, not its input.
void droppedShown(torch::nn::Dropout &drop, torch::nn::Linear &gen, const Tensor &z) {
  auto fake = gen(z);
  auto loss = drop(fake).sum();
  auto shown = fake.detach();
  shown.add_(1.0);
  loss.backward();
}

void loadWeights(torch::nn::Linear &fc, const Tensor &loaded) {
  fc->weight.data().copy_(loaded);
  fc->bias.detach().zero_();
}

void softUpdate(torch::nn::Module &target, torch::nn::Module &online, double tau) {
  torch::NoGradGuard no_grad;
  auto tp = target.parameters();
  auto op = online.parameters();
  for (size_t i = 0; i < tp.size(); ++i) {
    auto t = tp[i].data();
    t.mul_(1 - tau).add_(op[i], tau);
  }
}

void zeroGrads(torch::nn::Module &m) {
  for (auto &p : m.parameters())
    if (p.grad().defined())
      p.grad().zero_();
}

Tensor independent(const Tensor &x) {
  auto d = x.detach().clone();
  d.mul_(2);
  return d;
}

// sigmoid saves its result, not its input: writing the input's detached copy
// is invisible to backward, and 'diff' is not read again.
void marginSigmoid(torch::nn::Linear &scorer, const Tensor &x) {
  auto diff = scorer(x);
  auto loss = torch::sigmoid(diff).mean();
  auto margin = diff.detach();
  margin.clamp_(-10.0, 10.0);
  loss.backward();
}

// The saved tensor is written through detach() only after backward() ran.
void marginAfterBackward(torch::nn::Linear &scorer, const Tensor &x) {
  auto p = torch::sigmoid(scorer(x));
  p.mean().backward();
  auto margin = p.detach();
  margin.clamp_(0.1, 0.9);
}
