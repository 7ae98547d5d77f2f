// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-leaf %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-leaf %t.plugin -- --fix-errors -- %torch_pch
#include <torch/torch.h>

#include <map>
#include <string>

using torch::Tensor;

struct Net : torch::nn::Module {
  Net() {
    fc = register_module("fc", torch::nn::Linear(8, 4));
    bn = register_module("bn", torch::nn::BatchNorm1d(4));
    emb = register_module("emb", torch::nn::Embedding(10, 8));
    scale = register_parameter("scale", torch::ones({4}));
  }
  Tensor forward(const Tensor &x) { return bn(fc(x)) * scale; }
  void decay() {
    scale.mul_(0.99);
    // CHECK-MESSAGES: :[[@LINE-1]]:11: error: in-place 'mul_' on 'scale', a leaf tensor that requires grad, while grad mode is on: PyTorch raises "a leaf Variable that requires grad is being used in an in-place operation." [tensor-inplace-on-leaf]
    // CHECK-FIXES: {{^}}    { torch::NoGradGuard no_grad; scale.mul_(0.99); }{{$}}
  }
  void decayGuarded() {
    torch::NoGradGuard no_grad;
    scale.mul_(0.99);
  }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Embedding emb{nullptr};
  Tensor scale;
  Tensor counter; // not a parameter
};

// ===== positives ============================================================

void sgdStep(Net &net, double lr) {
  for (auto &p : net.parameters())
    p -= lr * p.grad();
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place '-=' on 'p', a leaf tensor that requires grad
  // CHECK-FIXES: {{^}}    { torch::NoGradGuard no_grad; p -= lr * p.grad(); }{{$}}
}

void sgdSub(std::shared_ptr<Net> net, double lr) {
  for (auto &p : net->parameters()) {
    p.sub_(p.grad() * lr);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'sub_' on 'p', a leaf tensor
    // CHECK-FIXES: {{^}}    { torch::NoGradGuard no_grad; p.sub_(p.grad() * lr); }{{$}}
  }
}

void shrinkLinear(torch::nn::Linear &lin) {
  lin->weight.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:15: error: in-place 'mul_' on 'lin->weight', a leaf tensor
  lin->bias.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:13: error: in-place 'zero_' on 'lin->bias', a leaf tensor
}

void loadConv(torch::nn::Conv2d &conv, const Tensor &w) {
  conv->weight.copy_(w);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: in-place 'copy_' on 'conv->weight', a leaf tensor
  // CHECK-FIXES: {{^}}  { torch::NoGradGuard no_grad; conv->weight.copy_(w); }{{$}}
}

void loadState(Net &net, std::map<std::string, Tensor> &state) {
  for (auto &kv : net.named_parameters())
    kv.value().copy_(state[kv.key()]);
  // CHECK-MESSAGES: :[[@LINE-1]]:16: error: in-place 'copy_' on 'kv.value()', a leaf tensor
}

void resetNorm(Net &net) {
  net.bn->weight.fill_(1.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:18: error: in-place 'fill_' on 'net.bn->weight', a leaf tensor
}

Tensor makeWeight() {
  auto w = torch::randn({16, 8}, torch::requires_grad());
  w.mul_(0.01);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'w', a leaf tensor
  // CHECK-FIXES: {{^}}  { torch::NoGradGuard no_grad; w.mul_(0.01); }{{$}}
  return w;
}

Tensor makeBias() {
  auto b = torch::zeros({8}, torch::TensorOptions().dtype(torch::kFloat).requires_grad(true));
  b.fill_(0.1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'fill_' on 'b', a leaf tensor
  return b;
}

Tensor makeWithOptions() {
  auto opts = torch::TensorOptions().requires_grad(true);
  Tensor t = torch::ones({4}, opts);
  t.div_(4);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'div_' on 't', a leaf tensor
  return t;
}

Tensor lateFlag() {
  auto w = torch::randn({4});
  w.requires_grad_();
  w.clamp_(-1, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'clamp_' on 'w', a leaf tensor
  return w;
}

Tensor firstRow() {
  auto w = torch::randn({4, 4}, torch::requires_grad());
  w[0] = 1.0;
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place '=' on 'w[0]', a view of a leaf tensor that requires grad, while grad mode is on: PyTorch raises "a view of a leaf Variable that requires grad is being used in an in-place operation."
  return w;
}

void zeroPadRow(Net &net) {
  net.emb->weight.select(0, 0).zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:32: error: in-place 'zero_' on 'net.emb->weight.select(0, 0)', a view of a leaf tensor
}

void clampAll(Net &net) {
  auto params = net.parameters();
  for (auto &p : params)
    p.clamp_(-0.1, 0.1);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'clamp_' on 'p', a leaf tensor
  params[0].add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:13: error: in-place 'add_' on 'params[0]', a leaf tensor
}

void halveByRef(torch::nn::Linear &lin) {
  Tensor &w = lin->weight;
  w.div_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'div_' on 'w', a leaf tensor
}

void addNoise(Net &net) {
  for (const auto &p : net.parameters())
    p.add_(torch::randn_like(p) * 0.01);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' on 'p', a leaf tensor
}

// ===== negatives (the idioms) ================================================

void sgdGuarded(Net &net, double lr) {
  torch::NoGradGuard no_grad;
  for (auto &p : net.parameters())
    p -= lr * p.grad();
}

void sgdGuardInLoop(Net &net, double lr) {
  for (auto &p : net.parameters()) {
    torch::NoGradGuard guard;
    p.sub_(lr * p.grad());
  }
}

void zeroGrads(Net &net) {
  for (auto &p : net.parameters())
    if (p.grad().defined())
      p.grad().zero_();
}

void clipGrads(Net &net) {
  for (auto &p : net.parameters())
    p.grad().clamp_(-1.0, 1.0);
}

void initWeights(torch::nn::Linear &lin) {
  torch::nn::init::xavier_uniform_(lin->weight);
  torch::nn::init::zeros_(lin->bias);
  torch::nn::init::normal_(lin->weight, 0.0, 0.02);
}

void scaleThroughData(torch::nn::Linear &lin) {
  lin->weight.data().mul_(0.5);
  lin->bias.detach().zero_();
}

void loadGuarded(torch::nn::Conv2d &conv, const Tensor &w) {
  {
    torch::NoGradGuard no_grad;
    conv->weight.copy_(w);
  }
}

void loadAutoGradOff(Net &net, const Tensor &s) {
  torch::AutoGradMode enable(false);
  net.scale.copy_(s);
}

void loadInference(Net &net, const Tensor &s) {
  c10::InferenceMode guard;
  net.scale.copy_(s);
}

Tensor plainFactory() {
  auto t = torch::zeros({4});
  t.add_(1);
  t[0] = 5;
  return t;
}

Tensor scaleThenFlag() {
  auto w = torch::randn({4});
  w.mul_(0.01);
  w.requires_grad_();
  return w;
}

Tensor explicitNoGrad() {
  auto w = torch::randn({4}, torch::requires_grad(false));
  w.add_(1);
  return w;
}

void unknownInput(Tensor x) { x.add_(1); }

Tensor nonLeafOutput(torch::nn::Linear &lin, const Tensor &x) {
  auto h = lin->forward(x);
  h.add_(1);
  auto y = lin->weight * 2;
  y.add_(1);
  auto c = lin->weight.clone();
  c.zero_();
  return h + y + c;
}

void buffers(Net &net) {
  net.bn->running_mean.mul_(0.9);
  net.counter.add_(1);
}

void guardedLambda(Net &net) {
  auto update = [&](double lr) {
    torch::NoGradGuard ng;
    for (auto &p : net.parameters())
      p -= lr * p.grad();
  };
  update(0.1);
}

// A target network: its parameters are frozen (detach_() ends requires_grad,
// and is legal on a leaf), so the Polyak update writes plain tensors.
struct QNetImpl : torch::nn::Module {
  QNetImpl() {
    q = register_module("q", torch::nn::Linear(4, 4));
    pi = register_module("pi", torch::nn::Linear(4, 2));
  }
  torch::nn::Linear q{nullptr}, pi{nullptr};
};
TORCH_MODULE(QNet);

struct Agent {
  QNet net, target;
  double polyak = 0.995;
  Agent() {
    for (auto &p : target->parameters())
      p.detach_();
    for (auto &kv : net->pi->named_parameters())
      kv.value().set_requires_grad(false);
  }
  void softUpdate() {
    auto src = net->q->parameters();
    auto dst = target->q->parameters();
    for (size_t i = 0; i < src.size(); ++i) {
      dst[i].mul_(polyak);
      dst[i].add_((1 - polyak) * src[i]);
    }
    target->pi->weight.zero_();
    net->pi->bias.fill_(0);
    // Not frozen: net's q layer.
    net->q->weight.mul_(0.5);
    // CHECK-MESSAGES: :[[@LINE-1]]:20: error: in-place 'mul_' on 'net->q->weight', a leaf tensor
  }
};

void detachThenWrite(torch::nn::Linear &lin) {
  auto w = lin->weight;
  w.detach_();
  w.mul_(2);
}

// Freezing one module says nothing of another's parameters, nor does a loop
// that turns requires_grad back on.
void otherModules(QNet &a, QNet &b) {
  for (auto &p : a->parameters())
    p.requires_grad_(true);
  for (auto &p : b->parameters())
    p.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' on 'p', a leaf tensor
}

// `bias.options()` carries dtype, device and layout, not requires_grad: a
// tensor made with it is no leaf that requires grad.
void growBias(torch::nn::Linear &head, int64_t n) {
  auto b = torch::zeros({n}, head->bias.options());
  b.narrow(0, 0, head->bias.size(0)).copy_(head->bias.detach());
  auto w = torch::zeros({n}, head->bias.options().requires_grad(true));
  w.narrow(0, 0, 2).fill_(1.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:21: error: in-place 'fill_' on 'w.narrow(0, 0, 2)', a view of a leaf tensor that requires grad
}

// A parameter registered with requires_grad=false is a frozen table: writing it
// needs no guard. One registered with requires_grad=true (said or by default) does.
struct PosEmbed : torch::nn::Module {
  PosEmbed(int64_t len, int64_t dim) {
    table = register_parameter("table", torch::zeros({len, dim}), /*requires_grad=*/false);
    token = register_parameter("token", torch::zeros({1, dim}), /*requires_grad=*/true);
    table.copy_(torch::randn({len, dim}));
    token.normal_(0.0, 0.02);
    // CHECK-MESSAGES: :[[@LINE-1]]:11: error: in-place 'normal_' on 'token', a leaf tensor that requires grad
  }
  Tensor table, token;
};

// A member the class only ever sets to a leaf that requires grad is one,
// as a parameter is.
class CommandPlan {
public:
  explicit CommandPlan(int64_t horizon) {
    plan_ = torch::zeros({horizon, 4}, torch::TensorOptions().requires_grad(true));
  }
  void step(double lr) {
    {
      torch::NoGradGuard no_grad;
      plan_.sub_(plan_.grad(), lr);
    }
    plan_.clamp_(-1.0, 1.0);
    // CHECK-MESSAGES: :[[@LINE-1]]:11: error: in-place 'clamp_' on 'plan_', a leaf tensor that requires grad
  }
  void reset(const Tensor &init) { snapshot_ = init; snapshot_.zero_(); }
  Tensor plan_, snapshot_;
};

// A vector's operator[] gives an lvalue: `= fresh` rebinds the optimizer's
// handle (the usual parameter swap), it writes no tensor data.
torch::Tensor swapParameter(torch::optim::Adam &opt) {
  auto fresh = torch::zeros({3}).requires_grad_();
  opt.param_groups()[0].params()[0] = fresh;
  return fresh;
}
