// VIME (Yoon et al., 2020): self-supervised pretraining of a tabular encoder with
// mask estimation and feature reconstruction, then semi-supervised fine-tuning
// with a consistency loss over corrupted views of unlabeled rows.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <utility>
#include <vector>

namespace {

struct VimeConfig {
  int64_t n_features = 32;
  int64_t n_classes = 4;
  int64_t hidden = 128;
  double p_mask = 0.3;
  double alpha = 2.0;  // weight of feature reconstruction
  double beta = 1.0;   // weight of the consistency term
  int64_t K = 3;       // corrupted views per unlabeled row
  int64_t pre_epochs = 15;
  int64_t semi_steps = 2000;
  int64_t batch = 256;
  double lr = 1e-3;
};

struct Tabular {
  torch::Tensor x;
  torch::Tensor y;
};

// Stand-in for the CSV loader: rows arrive as doubles, features are min-max scaled.
Tabular load_synthetic(int64_t n, const VimeConfig& cfg, std::mt19937& rng) {
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int64_t d = cfg.n_features;
  std::vector<double> raw(n * d);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0.0;
    for (int64_t j = 0; j < d; ++j) {
      const double v = gauss(rng) + (j % 4 == 0 ? 0.5 * s : 0.0);
      raw[i * d + j] = v;
      s += (j % 3 == 0 ? v : -0.5 * v);
    }
    labels[i] = static_cast<int64_t>(std::fabs(s)) % cfg.n_classes;
  }
  auto x64 = torch::from_blob(raw.data(), {n, d}, torch::kDouble);
  // FACT: x=torch.randn(4,3,dtype=torch.float64); assert is_copy_of(x.to(torch.float32), x)
  auto x = x64.to(torch::kFloat);
  auto lo = std::get<0>(x.min(0));
  auto hi = std::get<0>(x.max(0));
  x.sub_(lo).div_((hi - lo).clamp_min(1e-6));  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of the double buffer allocated new storage
  auto y = torch::from_blob(labels.data(), {n}, torch::kLong).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob does not own the vector, which dies on return
  return {x, y};
}

torch::Tensor mask_generator(const torch::Tensor& x, double p_m) {
  return torch::bernoulli(torch::full_like(x, p_m));
}

// Corrupts the masked entries with draws from each feature's empirical marginal
// (every column shuffled independently) and returns the realised mask with x~.
std::pair<torch::Tensor, torch::Tensor> pretext_generator(const torch::Tensor& m,
                                                          const torch::Tensor& x) {
  const auto n = x.size(0);
  auto x_bar = torch::empty_like(x);
  auto idx_opts = torch::TensorOptions().dtype(torch::kLong).device(x.device());
  for (int64_t j = 0; j < x.size(1); ++j) {
    auto shuffled = x.select(1, j).index_select(0, torch::randperm(n, idx_opts));
    // FACT: x=torch.randn(6,3); b=torch.empty_like(x); s=x[:,0].index_select(0, torch.randperm(6)); assert is_copy_of(s, x) and is_copy_of(s, b)
    x_bar.select(1, j).copy_(shuffled);  // LOOKALIKE: tensor-inplace-overlap -- the source is a fresh gather of x, not a slice of x_bar
  }
  // FACT: x=torch.randn(4,3); assert shares_storage(x.to(torch.float32), x) and x.to(torch.float32).data_ptr() == x.data_ptr()
  auto x_tilde = x.to(torch::kFloat);
  x_tilde.mul_(1 - m).add_(x_bar * m);  // EXPECT: tensor-alias-then-mutate
  auto m_new = x.ne(x_tilde).to(torch::kFloat);
  return {m_new, x_tilde};
}

// Cheaper marginal sampling for the consistency views: rotate every column by
// its own random offset instead of drawing a full permutation.
torch::Tensor rotate_columns(torch::Tensor x_bar, std::mt19937& rng) {
  const auto n = x_bar.size(0);
  std::uniform_int_distribution<int64_t> offset(1, n - 1);
  for (int64_t j = 0; j < x_bar.size(1); ++j) {
    auto col = x_bar.select(1, j);
    const auto s = offset(rng);
    auto tail = col.narrow(0, n - s, s).clone();  // LOOKALIKE: tensor-unnecessary-clone -- the wrapped-around tail must survive the shift below
    // FACT: c=torch.arange(12.).view(6,2)[:,0]; r=c.clone(); c[2:].copy_(c[:4]); assert shares_storage(c[2:], c[:4]) and not torch.equal(c[2:], r[:4])
    col.narrow(0, s, n - s).copy_(col.narrow(0, 0, n - s));  // EXPECT: tensor-inplace-overlap
    col.narrow(0, 0, s).copy_(tail);
  }
  return x_bar;
}

struct EncoderImpl : torch::nn::Module {
  EncoderImpl(int64_t d, int64_t h) : fc(register_module("fc", torch::nn::Linear(d, h))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::relu(fc(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Encoder);

struct VimeSelfImpl : torch::nn::Module {
  explicit VimeSelfImpl(const VimeConfig& c)
      : encoder(register_module("encoder", Encoder(c.n_features, c.hidden))),
        mask_head(register_module("mask_head", torch::nn::Linear(c.hidden, c.n_features))),
        feat_head(register_module("feat_head", torch::nn::Linear(c.hidden, c.n_features))) {}

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x_tilde) {
    auto h = encoder(x_tilde);
    return {mask_head(h), feat_head(h)};
  }

  Encoder encoder;
  torch::nn::Linear mask_head, feat_head;
};
TORCH_MODULE(VimeSelf);

struct VimeSemiImpl : torch::nn::Module {
  explicit VimeSemiImpl(const VimeConfig& c)
      : encoder(register_module("encoder", Encoder(c.n_features, c.hidden))),
        predictor(register_module(
            "predictor",
            torch::nn::Sequential(torch::nn::Linear(c.hidden, c.hidden), torch::nn::ReLU(),
                                  torch::nn::Linear(c.hidden, c.hidden), torch::nn::ReLU(),
                                  torch::nn::Linear(c.hidden, c.n_classes)))) {}

  torch::Tensor forward(const torch::Tensor& x) { return predictor->forward(encoder(x)); }

  Encoder encoder;
  torch::nn::Sequential predictor;
};
TORCH_MODULE(VimeSemi);

void pretrain(VimeSelf& model, const torch::Tensor& x_all, const VimeConfig& cfg,
              torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  const auto n = x_all.size(0);
  for (int64_t epoch = 0; epoch < cfg.pre_epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    double mask_acc = 0.0;
    int64_t batches = 0;
    for (int64_t b = 0; b + cfg.batch <= n; b += cfg.batch, ++batches) {
      auto xb = x_all.index_select(0, perm.narrow(0, b, cfg.batch));
      auto [m_label, x_tilde] = pretext_generator(mask_generator(xb, cfg.p_mask), xb);
      auto [m_logit, x_logit] = model->forward(x_tilde);

      auto m_prob = torch::sigmoid(m_logit);
      auto loss_m = torch::binary_cross_entropy(m_prob, m_label);
      auto loss_r = torch::mse_loss(torch::sigmoid(x_logit), xb);
      auto loss = loss_m + cfg.alpha * loss_r;

      auto m_pred = m_prob.detach();
      // FACT: backward_fails(lambda: (lambda s: (s.detach().round_(), torch.nn.functional.binary_cross_entropy(s, torch.ones(3)).backward()))(torch.randn(3, requires_grad=True).sigmoid()))
      m_pred.round_();  // EXPECT: tensor-inplace-on-detached
      mask_acc += m_pred.eq(m_label).to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-sync-in-loop

      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before it is summed
    }
    std::printf("pretrain epoch %lld  loss %.4f  mask acc %.3f\n", static_cast<long long>(epoch),
                epoch_loss.item<double>() / batches, mask_acc / batches);  // LOOKALIKE: tensor-sync-in-loop -- one read per epoch
  }
}

void semi_supervised(VimeSemi& model, const Tabular& labeled, const torch::Tensor& unl_x,
                     const VimeConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::mt19937 rng(7);
  const auto n_l = labeled.x.size(0), n_u = unl_x.size(0), d = unl_x.size(1);
  auto idx_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto running = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 1; step <= cfg.semi_steps; ++step) {
    model->train();
    auto lidx = torch::randint(n_l, {cfg.batch}, torch::kLong);
    auto xl = labeled.x.to(device).index_select(0, lidx.to(device));  // EXPECT: tensor-clone-in-loop
    auto yl = labeled.y.index_select(0, lidx);
    auto sup = torch::nn::functional::cross_entropy(model->forward(xl), yl);  // EXPECT: tensor-device-mismatch

    auto uidx = torch::randint(n_u, {cfg.batch}, idx_opts);
    auto xu = unl_x.index_select(0, uidx);
    // FACT: x=torch.randn(4,3); r=x.repeat(2,1); assert is_copy_of(r, x) and r.stride(0)==3
    auto x_bar = rotate_columns(xu.repeat({cfg.K, 1}), rng).view({cfg.K, cfg.batch, d});  // LOOKALIKE: tensor-inplace-on-expanded -- repeat() materialises the copies that rotate_columns writes
    auto mk = torch::bernoulli(torch::full({cfg.K, cfg.batch, d}, cfg.p_mask, xu.options()));
    auto views = xu.unsqueeze(0).expand({cfg.K, cfg.batch, d});
    // FACT: raises(lambda: torch.randn(4,3).unsqueeze(0).expand(2,4,3).mul_(torch.rand(2,4,3)), "more than one element")
    views.mul_(1 - mk).add_(mk * x_bar);  // EXPECT: tensor-inplace-on-expanded
    auto probs_u = torch::softmax(model->forward(views), -1);
    auto unsup = (probs_u - probs_u.mean(0, true)).pow(2).mean(0).sum(-1).mean();

    auto loss = sup + cfg.beta * unsup;
    opt.zero_grad();
    loss.backward();
    opt.step();

    running += unsup;  // EXPECT: tensor-graph-kept-across-iterations
    if (step % 100 == 0) {
      std::printf("step %lld  sup %.4f  consistency %.5f\n", static_cast<long long>(step),
                  sup.item<double>(), running.item<double>() / 100.0);  // LOOKALIKE: tensor-sync-in-loop -- read once per 100 steps for the log
      running.zero_();
    }
  }
}

torch::Tensor predict(VimeSemi& model, const torch::Tensor& x, torch::Device device,
                      int64_t bs) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto n = x.size(0);
  auto preds = torch::empty({n}, torch::TensorOptions().dtype(torch::kInt).device(device));
  auto conf = torch::empty({n}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  for (int64_t b = 0; b < n; b += bs) {
    const auto m = std::min(bs, n - b);
    auto probs = torch::softmax(model->forward(x.narrow(0, b, m)), 1);
    auto [p_max, arg] = probs.max(1);
    preds.narrow(0, b, m).copy_(arg);  // EXPECT: tensor-copy-narrowing
    conf.narrow(0, b, m).copy_(p_max);  // LOOKALIKE: tensor-copy-narrowing -- float into double widens
  }
  std::printf("mean confidence %.3f\n", conf.mean().item<double>());
  return preds;
}

}  // namespace

int main() {
  torch::manual_seed(0);
  if (!torch::cuda::is_available()) {
    std::cerr << "this run expects a CUDA device\n";
    return 1;
  }
  torch::Device device(torch::kCUDA);
  VimeConfig cfg;
  std::mt19937 rng(0);
  auto all = load_synthetic(20000, cfg, rng);

  const int64_t n_lab = 1000, n_test = 2000;
  const int64_t n_unl = all.x.size(0) - n_lab - n_test;
  Tabular labeled{all.x.narrow(0, 0, n_lab), all.y.narrow(0, 0, n_lab)};
  Tabular test{all.x.narrow(0, n_lab, n_test).clone().to(device),  // EXPECT: tensor-unnecessary-clone
               all.y.narrow(0, n_lab, n_test)};
  auto unl_x = all.x.narrow(0, n_lab + n_test, n_unl).to(device);

  VimeSelf pre(cfg);
  pre->to(device);
  pretrain(pre, unl_x, cfg, device);

  VimeSemi semi(cfg);
  semi->to(device);
  {
    torch::NoGradGuard no_grad;
    auto src = pre->encoder->named_parameters();
    for (auto& kv : semi->encoder->named_parameters())
      kv.value().copy_(src[kv.key()]);  // LOOKALIKE: tensor-inplace-on-leaf -- copied under NoGradGuard
  }
  semi_supervised(semi, labeled, unl_x, cfg, device);

  auto preds = predict(semi, test.x, device, 512);
  const double acc = preds.cpu().to(torch::kLong).eq(test.y).to(torch::kFloat).mean().item<double>();
  std::printf("VIME semi-supervised test accuracy %.3f\n", acc);
  return 0;
}
