// GRAND: graph neural diffusion (Chamberlain et al., 2021).
//
// Node states evolve under dx/dt = alpha * (A(x) - I) x, where A is a
// row-stochastic attention matrix restricted to the edges of the graph. The
// ODE is integrated with explicit Euler or classic RK4 between an encoder and a
// decoder; the whole thing is trained full-batch for node classification.
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

namespace grand {

struct GrandConfig {
  int64_t in_features = 1433;
  int64_t hidden = 64;
  int64_t num_classes = 7;
  int64_t heads = 4;
  double t_end = 18.0;
  double step_size = 1.0;
  bool use_rk4 = true;
  bool nonlinear = false;  // GRAND-nl: recompute attention from the current state
  double input_dropout = 0.5;
  double dropout = 0.0;
  double kinetic_weight = 1e-3;
  double lr = 0.01;
  double weight_decay = 5e-4;
  int64_t max_epochs = 200;
  int64_t patience = 50;
  int64_t log_every = 10;
};

struct GraphData {
  torch::Tensor x;           // [N, F] bag-of-words features
  torch::Tensor edge_index;  // [2, E] int64; row 0 = source, row 1 = target
  torch::Tensor labels;      // [N] int64
  torch::Tensor train_idx, val_idx, test_idx;
};

// Column-wise standardisation of the raw node features.
torch::Tensor standardize_features(const torch::Tensor& feats) {
  auto x = feats.to(torch::kFloat);
  auto mu = x.mean(0, /*keepdim=*/true);
  auto sigma = x.std(0, /*unbiased=*/true, /*keepdim=*/true).clamp_min(1e-6);
  // FACT: f = torch.randn(6, 4); assert shares_storage(f.to(torch.float32), f)
  x.sub_(mu).div_(sigma);  // EXPECT: tensor-alias-then-mutate
  return x;
}

// Multi-head dot-product attention over the edges, normalised with a softmax
// over the incoming edges of every target node. Returns [E, H].
class EdgeAttentionImpl : public torch::nn::Module {
 public:
  EdgeAttentionImpl(int64_t dim, int64_t heads) : heads_(heads), head_dim_(dim / heads) {
    TORCH_CHECK(dim % heads == 0, "hidden size must be divisible by the number of heads");
    q_proj_ = register_module("q_proj", torch::nn::Linear(dim, dim));
    k_proj_ = register_module("k_proj", torch::nn::Linear(dim, dim));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index) {
    const int64_t n = x.size(0);
    auto src = edge_index.select(0, 0);
    auto dst = edge_index.select(0, 1);
    // FACT: lin = torch.nn.Linear(8, 8); q = lin(torch.randn(5, 8)); assert is_view_of(q.view(5, 2, 4), q)
    auto q = q_proj_(x).view({n, heads_, head_dim_});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous
    auto k = k_proj_(x).view({n, heads_, head_dim_});
    auto scores = (q.index_select(0, dst) * k.index_select(0, src)).sum(-1) /
                  std::sqrt(static_cast<double>(head_dim_));
    // a global shift cancels in the per-node normalisation and keeps exp finite
    auto e = torch::exp(scores - scores.max().detach());
    auto denom = torch::zeros({n, heads_}, e.options());
    denom.index_add_(0, dst, e);  // LOOKALIKE: tensor-inplace-on-saved -- denom is a fresh accumulator nothing saved
    e.div_(denom.index_select(0, dst) + 1e-16);  // EXPECT: tensor-inplace-on-saved
    return e;
  }

 private:
  int64_t heads_, head_dim_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr};
};
TORCH_MODULE(EdgeAttention);

// f(x) = alpha * (A x - x), one diffusion operator per head.
class DiffusionFuncImpl : public torch::nn::Module {
 public:
  DiffusionFuncImpl(int64_t dim, int64_t heads) : heads_(heads) {
    attention_ = register_module("attention", EdgeAttention(dim, heads));
    alpha_train = register_parameter("alpha_train", torch::full({1}, 0.8));
  }

  void set_graph(const torch::Tensor& x0, const torch::Tensor& edge_index) {
    edge_index_ = edge_index;
    att_ = attention_->forward(x0, edge_index);  // GRAND-l: attention frozen at t = 0
    nfe_ = 0;
  }

  // GRAND-l right-hand side.
  torch::Tensor forward(const torch::Tensor& x) {
    ++nfe_;
    const int64_t n = x.size(0);
    const int64_t d = x.size(1) / heads_;
    auto src = edge_index_.select(0, 0);
    auto dst = edge_index_.select(0, 1);
    auto xh = x.view({n, heads_, d}).transpose(0, 1);                    // [H, N, d]
    auto msg = xh.index_select(1, src) * att_.t().unsqueeze(-1);         // [H, E, d]
    auto agg = torch::zeros({heads_, n, d}, x.options());
    agg.index_add_(1, dst, msg);
    // FACT: agg = torch.zeros(4, 7, 3); assert is_copy_of(agg.transpose(0, 1).reshape(7, 12), agg)
    auto ax = agg.transpose(0, 1).reshape({n, heads_ * d});  // EXPECT: tensor-reshape-non-contiguous
    return alpha_train * (ax - x);
  }

  // GRAND-nl right-hand side: attention follows the state.
  torch::Tensor forward_nonlinear(const torch::Tensor& x) {
    ++nfe_;
    const int64_t n = x.size(0);
    const int64_t d = x.size(1) / heads_;
    auto att = attention_->forward(x, edge_index_);
    auto xh = x.view({n, heads_, d}).transpose(0, 1);
    auto msg = xh.index_select(1, edge_index_.select(0, 0)) * att.t().unsqueeze(-1);
    auto agg = torch::zeros_like(xh);  // keeps xh's strides: [N, H, d] in memory
    agg.index_add_(1, edge_index_.select(0, 1), msg);
    // FACT: x = torch.randn(7, 12); xh = x.view(7, 4, 3).transpose(0, 1); a = torch.zeros_like(xh); assert is_view_of(a.transpose(0, 1).reshape(7, 12), a)
    auto ax = agg.transpose(0, 1).reshape({n, heads_ * d});  // LOOKALIKE: tensor-reshape-non-contiguous -- zeros_like kept xh's strides, so the transpose back is contiguous
    return alpha_train * (ax - x);
  }

  int64_t nfe() const { return nfe_; }

  torch::Tensor alpha_train;

 private:
  int64_t heads_;
  int64_t nfe_ = 0;
  EdgeAttention attention_{nullptr};
  torch::Tensor edge_index_, att_;
};
TORCH_MODULE(DiffusionFunc);

using OdeFn = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor integrate_euler(const OdeFn& f, const torch::Tensor& x0, double t_end, double dt) {
  torch::Tensor x = x0;
  const auto steps = static_cast<int64_t>(std::ceil(t_end / dt));
  for (int64_t i = 0; i < steps; ++i) {
    // FACT: x0 = torch.randn(5, 4); x = x0; x = x + 0.5 * torch.tanh(x); assert is_copy_of(x, x0)
    x = x + dt * f(x);  // LOOKALIKE: tensor-alias-then-mutate -- rebinds x to a new tensor, x0 is never written
  }
  return x;
}

torch::Tensor integrate_rk4(const OdeFn& f, const torch::Tensor& x0, double t_end, double dt,
                            torch::Tensor* kinetic) {
  auto x = x0;
  auto energy = torch::zeros({}, x0.options());
  const auto steps = static_cast<int64_t>(std::ceil(t_end / dt));
  for (int64_t i = 0; i < steps; ++i) {
    auto k1 = f(x);
    auto k2 = f(x + 0.5 * dt * k1);
    auto k3 = f(x + 0.5 * dt * k2);
    auto k4 = f(x + dt * k3);
    auto dx = (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4);
    x = x + dx;
    energy = energy + dx.pow(2).sum() / dt;  // LOOKALIKE: tensor-graph-kept-across-iterations -- kinetic regulariser, added to the loss and differentiated
  }
  if (kinetic != nullptr) *kinetic = energy;
  return x;
}

class GrandNetImpl : public torch::nn::Module {
 public:
  explicit GrandNetImpl(const GrandConfig& cfg) : cfg_(cfg) {
    encoder_ = register_module("encoder", torch::nn::Linear(cfg.in_features, cfg.hidden));
    odefunc = register_module("odefunc", DiffusionFunc(cfg.hidden, cfg.heads));
    decoder_ = register_module("decoder", torch::nn::Linear(cfg.hidden, cfg.num_classes));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& edge_index) {
    auto h = F::dropout(x, F::DropoutFuncOptions().p(cfg_.input_dropout).training(is_training()));
    h = encoder_(h);
    odefunc->set_graph(h, edge_index);
    OdeFn f;
    if (cfg_.nonlinear)
      f = [this](const torch::Tensor& s) { return odefunc->forward_nonlinear(s); };
    else
      f = [this](const torch::Tensor& s) { return odefunc->forward(s); };
    torch::Tensor kinetic;
    auto z = cfg_.use_rk4 ? integrate_rk4(f, h, cfg_.t_end, cfg_.step_size, &kinetic)
                          : integrate_euler(f, h, cfg_.t_end, cfg_.step_size);
    last_kinetic = kinetic.defined() ? kinetic : torch::zeros({}, h.options());
    z = F::dropout(F::relu(z), F::DropoutFuncOptions().p(cfg_.dropout).training(is_training()));
    return decoder_(z);
  }

  DiffusionFunc odefunc{nullptr};
  torch::Tensor last_kinetic;

 private:
  GrandConfig cfg_;
  torch::nn::Linear encoder_{nullptr}, decoder_{nullptr};
};
TORCH_MODULE(GrandNet);

struct TrainResult {
  double best_val_acc = 0.0;
  double test_acc = 0.0;
  int64_t best_epoch = 0;
  double mean_train_loss = 0.0;
};

static double masked_accuracy(const torch::Tensor& logits, const torch::Tensor& labels,
                              const torch::Tensor& idx) {
  auto pred = logits.index_select(0, idx).argmax(1);
  return pred.eq(labels.index_select(0, idx)).to(torch::kFloat).mean().item<double>();
}

TrainResult train_grand(GrandNet& model, const GraphData& data, const GrandConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  auto x = standardize_features(data.x).to(device);
  auto labels = data.labels.to(device);
  auto train_idx = data.train_idx.to(device);
  auto val_idx = data.val_idx.to(device);

  torch::optim::Adam opt(model->parameters(),
                         torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));

  std::map<std::string, torch::Tensor> best_state;
  TrainResult result;
  double best_val = -1.0;
  int64_t bad_epochs = 0, epochs_run = 0;
  double loss_sum = 0.0;
  torch::Tensor smoothed_loss = torch::zeros({}, x.options());
  std::vector<torch::Tensor> loss_trace;

  for (int64_t epoch = 1; epoch <= cfg.max_epochs; ++epoch) {
    model->train();
    auto edge_index = data.edge_index.to(device);  // EXPECT: tensor-clone-in-loop
    opt.zero_grad();
    auto logits = model->forward(x, edge_index);
    auto ce = F::cross_entropy(logits.index_select(0, train_idx), labels.index_select(0, train_idx));
    auto loss = ce + cfg.kinetic_weight * model->last_kinetic;
    loss.backward();
    opt.step();
    model->odefunc->alpha_train.clamp_(0.0, 1.0);  // EXPECT: tensor-inplace-on-leaf
    ++epochs_run;

    loss_sum += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    smoothed_loss = 0.9 * smoothed_loss + 0.1 * loss;  // EXPECT: tensor-graph-kept-across-iterations
    loss_trace.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no history kept

    double val_acc = 0.0;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      auto eval_logits = model->forward(x, edge_index);
      auto pred = eval_logits.index_select(0, val_idx).argmax(1);
      val_acc = pred.eq(labels.index_select(0, val_idx)).to(torch::kFloat).mean().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the value drives early stopping
    }
    if (epoch % cfg.log_every == 0)
      std::cout << "epoch " << epoch << " loss " << ce.item<float>() << " val " << val_acc  // LOOKALIKE: tensor-sync-in-loop -- only every log_every epochs
                << " nfe " << model->odefunc->nfe() << '\n';

    if (val_acc > best_val) {
      best_val = val_acc;
      result.best_epoch = epoch;
      bad_epochs = 0;
      for (const auto& kv : model->named_parameters()) {
        auto snapshot = kv.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- stored as the best-epoch weights; opt.step() keeps changing the source
        best_state[kv.key()] = snapshot;
      }
    } else if (++bad_epochs >= cfg.patience) {
      std::cout << "early stop at epoch " << epoch << " (best " << result.best_epoch << ")\n";
      break;
    }
  }

  {
    torch::NoGradGuard no_grad;
    for (auto& kv : model->named_parameters())
      kv.value().copy_(best_state.at(kv.key()));  // LOOKALIKE: tensor-inplace-on-leaf -- weights restored under NoGradGuard
    model->eval();
    auto logits = model->forward(x, data.edge_index.to(device));
    result.test_acc = masked_accuracy(logits, labels, data.test_idx.to(device));
  }
  result.best_val_acc = best_val;
  result.mean_train_loss = epochs_run > 0 ? loss_sum / epochs_run : 0.0;
  std::cout << "smoothed train loss " << smoothed_loss.item<double>() << ", last "
            << (loss_trace.empty() ? 0.0 : loss_trace.back().item<double>()) << '\n';
  return result;
}

}  // namespace grand
