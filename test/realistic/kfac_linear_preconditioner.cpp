// K-FAC for the linear layers of a small per-frame sensor classifier.
//
// Every KfacLinear keeps the input it saw in forward and, through a tensor
// hook, the gradient that reached its output. The preconditioner folds them
// into running Kronecker factors A = E[a a^T] and G = E[g g^T], refreshes the
// damped inverses every few steps, and replaces each weight gradient by
// (G + sqrt(l) I)^-1 dW (A + sqrt(l) I)^-1 before a momentum step scaled by a
// KL clip.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

struct KfacOptions {
  double lr = 0.05;
  double momentum = 0.9;
  double damping = 1e-3;
  double stat_decay = 0.95;
  double kl_clip = 1e-3;
  int64_t stats_every = 1;
  int64_t inverse_every = 20;
};

class KfacLinearImpl : public torch::nn::Module {
 public:
  KfacLinearImpl(int64_t in, int64_t out, bool bias = true)
      : fc(register_module("fc", torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)))) {
    torch::nn::init::kaiming_uniform_(fc->weight, std::sqrt(5.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills the parameter under its own NoGradGuard
    // FACT: b=torch.empty(3,requires_grad=True); assert raises(lambda: b.zero_(), 'leaf Variable')
    if (bias) fc->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = fc(x);
    if (capture && is_training()) {
      // Scale by 1/sqrt(n) here so that a^T a is already the batch mean.
      // FACT: x=torch.randn(4,3,requires_grad=True); w=torch.randn(2,3,requires_grad=True); y=torch.nn.functional.linear(x,w); x.detach().mul_(0.5); assert backward_fails(lambda: y.sum().backward())
      auto a = x.detach();
      a.mul_(1.0 / std::sqrt(static_cast<double>(a.size(0))));  // EXPECT: tensor-inplace-on-detached
      acts = a;
      y.register_hook([this](torch::Tensor g) { grads = g; });
    }
    return y;
  }

  bool has_bias() const { return fc->options.bias(); }
  int64_t in_features() const { return fc->options.in_features(); }

  torch::nn::Linear fc;
  bool capture = true;
  torch::Tensor acts;
  torch::Tensor grads;
};
TORCH_MODULE(KfacLinear);

// Windows arrive channels-first, as the recorder writes them; every time step
// is classified by the same MLP and the frame logits are averaged.
class FrameClassifierImpl : public torch::nn::Module {
 public:
  FrameClassifierImpl(int64_t channels, int64_t hidden, int64_t classes)
      : l1(register_module("l1", KfacLinear(channels, hidden))),
        l2(register_module("l2", KfacLinear(hidden, hidden))),
        head(register_module("head", KfacLinear(hidden, classes))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const auto batch = x.size(0);
    const auto steps = x.size(2);
    // FACT: x=torch.randn(2,6,8); r=x.transpose(1,2).reshape(-1,6); assert is_copy_of(r,x)
    auto frames = x.transpose(1, 2).reshape({batch * steps, x.size(1)});  // EXPECT: tensor-reshape-non-contiguous
    auto h = torch::relu(l1(frames));
    // FACT: h=torch.relu(torch.randn(4,3,requires_grad=True)); h.clamp_max_(6.0); assert backward_fails(lambda: h.sum().backward())
    h.clamp_max_(6.0);  // EXPECT: tensor-inplace-on-saved
    h = torch::relu(l2(h));
    auto logits = head(h);
    // FACT: y=torch.nn.functional.linear(torch.randn(16,5), torch.randn(3,5)); assert is_contiguous(y) and is_view_of(y.view(2,8,3), y)
    return logits.view({batch, steps, -1}).mean(1);  // LOOKALIKE: tensor-view-non-contiguous -- the head's output is freshly allocated and contiguous
  }

  std::vector<KfacLinear> kfac_layers() const { return {l1, l2, head}; }

  KfacLinear l1, l2, head;
};
TORCH_MODULE(FrameClassifier);

struct FactorState {
  torch::Tensor A, G;
  torch::Tensor A_inv, G_inv;
  torch::Tensor momentum;
};

class KfacPreconditioner {
 public:
  KfacPreconditioner(std::vector<KfacLinear> layers, KfacOptions opt)
      : layers_(std::move(layers)), opt_(opt) {
    for (const auto& l : layers_) {
      const auto& w = l->fc->weight;
      const auto in = l->in_features() + (l->has_bias() ? 1 : 0);
      const auto out = w.size(0);
      FactorState st;
      st.A = torch::eye(in, w.options());
      st.G = torch::eye(out, w.options());
      st.A_inv = torch::eye(in, w.options());
      st.G_inv = torch::eye(out, w.options());
      st.momentum = torch::zeros({out, in}, w.options());
      states_.push_back(st);
    }
  }

  void step(int64_t iteration) {
    if (iteration % opt_.stats_every == 0) update_stats();
    if (iteration % opt_.inverse_every == 0) update_inverses();
    apply_updates();
  }

 private:
  void update_stats() {
    torch::NoGradGuard no_grad;
    const double decay = opt_.stat_decay;
    for (size_t i = 0; i < layers_.size(); ++i) {
      auto& l = layers_[i];
      auto& st = states_[i];
      if (!l->acts.defined() || !l->grads.defined()) continue;
      auto a = l->acts;
      if (l->has_bias()) {
        const double s = 1.0 / std::sqrt(static_cast<double>(a.size(0)));
        a = torch::cat({a, torch::full({a.size(0), 1}, s, a.options())}, 1);
      }
      // The loss is a batch mean, so the hook saw gradients scaled by 1/n.
      auto g = l->grads.clone();  // EXPECT: tensor-unnecessary-clone
      g.mul_(static_cast<double>(g.size(0)));
      st.A.mul_(decay).add_(a.t().mm(a), 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-leaf -- the running factor is a plain tensor that never required grad
      st.G.mul_(decay).add_(g.t().mm(g) / static_cast<double>(g.size(0)), 1.0 - decay);
    }
  }

  void update_inverses() {
    torch::NoGradGuard no_grad;
    const double d = std::sqrt(opt_.damping);
    for (auto& st : states_) {
      // FACT: A=torch.zeros(3,3); B=A; B.diagonal().add_(1.0); assert A.trace()==3 and shares_storage(A,B)
      auto A = st.A;
      A.diagonal().add_(d);  // EXPECT: tensor-alias-then-mutate
      // Invert in double: the activation factor is badly conditioned early on.
      // FACT: G=torch.eye(3); G64=G.to(torch.float64); G64.diagonal().add_(1.0); assert is_copy_of(G64,G) and G.trace()==3
      auto G64 = st.G.to(torch::kFloat64);
      G64.diagonal().add_(d);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat64) of a float factor allocates; st.G is untouched
      // FACT: a=torch.zeros(2); a.copy_(torch.tensor([1/3, 2/3], dtype=torch.float64)); assert a.dtype==torch.float32
      st.A_inv.copy_(torch::inverse(A.to(torch::kFloat64)));  // EXPECT: tensor-copy-narrowing
      st.G_inv.copy_(torch::inverse(G64).to(st.G_inv.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the conversion back to float is spelled out
    }
  }

  void apply_updates() {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> nat_grads;
    auto vg_sum = torch::zeros({}, states_.front().A.options());
    for (size_t i = 0; i < layers_.size(); ++i) {
      auto& l = layers_[i];
      auto& st = states_[i];
      auto grad = l->fc->weight.grad();
      if (l->has_bias()) grad = torch::cat({grad, l->fc->bias.grad().unsqueeze(1)}, 1);
      // (A^-1 (x) G^-1) vec(dW), evaluated as (A^-1 dW^T G^-1)^T.
      auto v = st.A_inv.mm(grad.t()).mm(st.G_inv).t();
      // FACT: v=torch.randn(6,4).t(); assert raises(lambda: v.view(-1), 'view size is not compatible')
      vg_sum += torch::dot(v.view({-1}), grad.view({-1}));  // EXPECT: tensor-view-non-contiguous
      nat_grads.push_back(v);
    }

    const double lr = opt_.lr;
    auto nu = (opt_.kl_clip / (vg_sum * (lr * lr)).clamp_min(1e-12)).sqrt().clamp_max(1.0);

    for (size_t i = 0; i < layers_.size(); ++i) {
      auto& l = layers_[i];
      auto& st = states_[i];
      st.momentum.mul_(opt_.momentum).add_(nat_grads[i] * nu);
      const auto in = l->in_features();
      // FACT: m=torch.randn(4,6); n=m.narrow(1,0,5); r=n.reshape(4,5); assert not is_contiguous(n) and is_view_of(r,m)
      auto dw = st.momentum.narrow(1, 0, in).reshape_as(l->fc->weight);  // LOOKALIKE: tensor-reshape-non-contiguous -- same shape as the narrowed block, so reshape returns it as a view
      l->fc->weight.data().add_(dw, -lr);  // LOOKALIKE: tensor-inplace-on-detached -- .data() writes the parameter on purpose, after backward, under NoGradGuard
      if (l->has_bias()) l->fc->bias.data().add_(st.momentum.select(1, in), -lr);
    }
  }

  std::vector<KfacLinear> layers_;
  std::vector<FactorState> states_;
  KfacOptions opt_;
};

struct SyntheticFrames {
  torch::Tensor inputs;
  torch::Tensor labels;
};

SyntheticFrames make_dataset(int64_t n, int64_t channels, int64_t steps, int64_t classes) {
  auto labels = torch::randint(0, classes, {n}, torch::kLong);
  auto prototypes = torch::randn({classes, channels, 1});
  auto phase = torch::linspace(0, 6.28318, steps).view({1, 1, steps});
  auto inputs = torch::sin(phase * (1 + prototypes.index_select(0, labels))) +
                0.3 * torch::randn({n, channels, steps});
  return {inputs, labels};
}

int main() {
  torch::manual_seed(7);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t channels = 6, steps = 32, classes = 5, n = 8192, batch = 128;

  auto train = make_dataset(n, channels, steps, classes);
  auto val = make_dataset(1024, channels, steps, classes);

  FrameClassifier model(channels, 64, classes);
  model->to(device);
  KfacPreconditioner kfac(model->kfac_layers(), KfacOptions{});

  auto running_loss = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t iteration = 0;
  for (int epoch = 0; epoch < 8; ++epoch) {
    model->train();
    double epoch_loss = 0.0;
    int64_t batches = 0;
    auto perm = torch::randperm(n, torch::kLong);
    for (int64_t start = 0; start + batch <= n; start += batch) {
      auto idx = perm.narrow(0, start, batch);
      auto x = train.inputs.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto y = train.labels.index_select(0, idx).to(device);

      model->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      kfac.step(iteration);

      running_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      epoch_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop // LOOKALIKE: tensor-graph-kept-across-iterations -- item() copies out a double, no graph is kept
      ++batches;
      if (++iteration % 50 == 0) {
        std::cout << "iter " << iteration << " loss(50) "
                  << (running_loss / 50).item<double>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- read once per 50 steps for the log line
        running_loss.zero_();
      }
    }

    model->eval();
    torch::NoGradGuard no_grad;
    auto logits = model->forward(val.inputs.to(device));
    auto acc = logits.argmax(1).eq(val.labels.to(device)).to(torch::kFloat).mean().item<double>();
    std::cout << "epoch " << epoch << " train " << epoch_loss / std::max<int64_t>(batches, 1)
              << " val acc " << acc << std::endl;
  }
  return 0;
}
