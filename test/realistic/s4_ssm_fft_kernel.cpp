// S4D sequence classifier: diagonal state-space kernels evaluated with an FFT
// convolution for training, then unrolled step by step in recurrent mode.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace {

struct S4Config {
  int64_t d_input = 2;
  int64_t d_model = 64;
  int64_t d_state = 64;
  int64_t n_layers = 4;
  int64_t n_classes = 8;
  int64_t seq_len = 512;
  double dt_min = 1e-3;
  double dt_max = 1e-1;
  double dropout = 0.1;
  double lr = 4e-3;
  double ssm_lr = 1e-3;
  double weight_decay = 0.01;
  int64_t epochs = 30;
  int64_t batch_size = 32;
};

class S4DKernelImpl : public torch::nn::Module {
 public:
  S4DKernelImpl(int64_t H, int64_t N, double dt_min, double dt_max)
      : dt_min_(dt_min), dt_max_(dt_max) {
    const double lo = std::log(dt_min), hi = std::log(dt_max);
    log_dt = register_parameter("log_dt", torch::rand({H}) * (hi - lo) + lo);
    C = register_parameter("C", torch::randn({H, N / 2, 2}) * std::sqrt(0.5));
    log_A_real = register_parameter("log_A_real", torch::full({H, N / 2}, std::log(0.5)));
    A_imag = register_parameter("A_imag",
                                M_PI * torch::arange(N / 2, torch::kFloat).repeat({H, 1}));
  }

  // Zero-order hold: returns dt*A and C with the discretised B folded in.
  std::pair<torch::Tensor, torch::Tensor> discretize() const {
    auto dt = torch::exp(log_dt).unsqueeze(-1);
    auto A = torch::complex(-torch::exp(log_A_real), A_imag);
    auto dtA = A * dt;
    auto Cd = torch::view_as_complex(C) * (torch::exp(dtA) - 1.0) / A;
    return {dtA, Cd};
  }

  torch::Tensor forward(int64_t L) {
    auto [dtA, Cd] = discretize();
    auto pos = torch::arange(L, log_dt.options());
    auto vander = torch::exp(dtA.unsqueeze(-1) * pos);
    // FACT: backward_fails(lambda: (lambda v: (v.mul_(2.0), v.sum().backward()))((torch.randn(3, requires_grad=True) * torch.arange(3.)).exp()))
    vander.mul_(2.0);  // EXPECT: tensor-inplace-on-saved
    return torch::real(torch::einsum("hn,hnl->hl", {Cd, vander}));
  }

  void clip_dt() {
    log_dt.clamp_(std::log(dt_min_), std::log(dt_max_));  // EXPECT: tensor-inplace-on-leaf
  }

  void constrain_A() {
    torch::NoGradGuard no_grad;
    log_A_real.clamp_min_(std::log(1e-4));  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
  }

  torch::Tensor log_dt, C, log_A_real, A_imag;

 private:
  double dt_min_, dt_max_;
};
TORCH_MODULE(S4DKernel);

class S4DLayerImpl : public torch::nn::Module {
 public:
  explicit S4DLayerImpl(const S4Config& cfg)
      : H_(cfg.d_model),
        kernel(register_module(
            "kernel", S4DKernel(cfg.d_model, cfg.d_state, cfg.dt_min, cfg.dt_max))),
        out_proj(register_module("out_proj", torch::nn::Linear(cfg.d_model, 2 * cfg.d_model))),
        drop(register_module("drop", torch::nn::Dropout(cfg.dropout))) {
    D = register_parameter("D", torch::randn({cfg.d_model}));
    torch::NoGradGuard no_grad;
    out_proj->weight.detach().normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-detached -- initialising the weight through its detached handle is the intent
    out_proj->bias.detach().zero_();
  }

  // Output mixing shared by the convolutional and the recurrent path.
  torch::Tensor mix(const torch::Tensor& y) {
    return torch::glu(out_proj(drop(torch::gelu(y))), -1);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), L = x.size(1);
    auto u = x.transpose(1, 2);
    auto k_f = torch::fft::rfft(kernel(L), 2 * L);
    auto u_f = torch::fft::rfft(u, 2 * L);
    auto y = torch::fft::irfft(u_f * k_f, 2 * L).narrow(-1, 0, L);
    y = y + u * D.unsqueeze(-1);
    // FACT: u=torch.randn(2,8,4).transpose(1,2); y=torch.fft.irfft(torch.fft.rfft(u,n=16)*torch.fft.rfft(torch.randn(4,8),n=16),n=16)[...,:8]+u*torch.randn(4,1); assert raises(lambda: y.transpose(1,2).view(16,4), "view size is not compatible")
    auto z = mix(y.transpose(1, 2).view({B * L, H_}));  // EXPECT: tensor-view-non-contiguous
    // FACT: z=torch.nn.functional.glu(torch.nn.functional.linear(torch.randn(16,4), torch.randn(8,4)), -1); assert is_view_of(z.view(2,8,4), z)
    return x + z.view({B, L, H_});  // LOOKALIKE: tensor-view-non-contiguous -- glu of the linear output is a fresh contiguous tensor
  }

  int64_t H_;
  S4DKernel kernel;
  torch::nn::Linear out_proj;
  torch::nn::Dropout drop;
  torch::Tensor D;
};
TORCH_MODULE(S4DLayer);

class S4ClassifierImpl : public torch::nn::Module {
 public:
  explicit S4ClassifierImpl(const S4Config& cfg) : d_model(cfg.d_model) {
    encoder = register_module("encoder", torch::nn::Linear(cfg.d_input, cfg.d_model));
    layers = register_module("layers", torch::nn::ModuleList());
    norms = register_module("norms", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.n_layers; ++i) {
      layers->push_back(S4DLayer(cfg));
      norms->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    }
    decoder = register_module("decoder", torch::nn::Linear(cfg.d_model, cfg.n_classes));
  }

  S4DLayerImpl* layer(size_t i) { return layers[i]->as<S4DLayer>(); }
  torch::nn::LayerNormImpl* norm(size_t i) { return norms[i]->as<torch::nn::LayerNorm>(); }

  torch::Tensor forward(torch::Tensor x) {
    x = encoder(x);
    for (size_t i = 0; i < layers->size(); ++i) x = norm(i)->forward(layer(i)->forward(x));
    return decoder(x.mean(1));
  }

  void constrain() {
    for (size_t i = 0; i < layers->size(); ++i) {
      layer(i)->kernel->clip_dt();
      layer(i)->kernel->constrain_A();
    }
  }

  int64_t d_model;
  torch::nn::Linear encoder{nullptr}, decoder{nullptr};
  torch::nn::ModuleList layers{nullptr}, norms{nullptr};
};
TORCH_MODULE(S4Classifier);

struct SeqDataset {
  torch::Tensor x;
  torch::Tensor y;
};

// Noisy multi-channel chirps; the class sets the base frequency.
SeqDataset make_chirps(int64_t n, const S4Config& cfg, uint64_t seed) {
  torch::manual_seed(seed);
  auto x = torch::empty({n, cfg.seq_len, cfg.d_input});
  auto y = torch::randint(cfg.n_classes, {n}, torch::kLong);
  auto t = torch::linspace(0.0, 1.0, cfg.seq_len, torch::kDouble).unsqueeze(-1);
  auto phase = torch::arange(cfg.d_input, torch::kDouble) * (0.25 * M_PI);
  auto env = torch::exp(-2.0 * t).expand({cfg.seq_len, cfg.d_input});
  for (int64_t i = 0; i < n; ++i) {
    const double freq = 2.0 + 3.0 * static_cast<double>(y[i].item<int64_t>());  // LOOKALIKE: tensor-sync-in-loop -- CPU label tensor, there is no device to wait for
    auto clean = torch::sin(2.0 * M_PI * freq * t.pow(1.5) + phase);
    auto noise = 0.3 * torch::randn({cfg.seq_len, cfg.d_input}, torch::kDouble);
    // FACT: e=torch.randn(6,1).expand(6,2); n=torch.randn(6,2); n.addcmul_(torch.randn(6,2), e); assert e.stride(1)==0 and n.stride(1)==1
    noise.addcmul_(clean, env);  // LOOKALIKE: tensor-inplace-on-expanded -- only the source is expanded, noise owns its memory
    x[i].copy_(noise);  // EXPECT: tensor-copy-narrowing
  }
  return {x, y};
}

torch::Tensor class_weights(const torch::Tensor& y, int64_t n_classes) {
  auto counts = torch::bincount(y, {}, n_classes).to(torch::kFloat);
  return counts.sum() / (counts.clamp_min(1.0) * static_cast<double>(n_classes));
}

double evaluate(S4Classifier& model, const SeqDataset& ds, torch::Device device, int64_t bs) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto n = ds.x.size(0);
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  for (int64_t b = 0; b < n; b += bs) {
    const auto m = std::min(bs, n - b);
    auto logits = model->forward(ds.x.narrow(0, b, m).to(device));
    correct += logits.argmax(1).eq(ds.y.narrow(0, b, m).to(device)).sum();
  }
  return static_cast<double>(correct.item<int64_t>()) / static_cast<double>(n);
}

// Recurrent-mode inference on channel-first recordings, one time step at a time.
torch::Tensor recurrent_predict(S4Classifier& model, const torch::Tensor& signal,
                                const torch::Tensor& mean, const torch::Tensor& stdv,
                                torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto B = signal.size(0), d_in = signal.size(1), L = signal.size(2);
  // FACT: s=torch.randn(2,3,8); f=s.transpose(1,2); assert not is_contiguous(f) and is_copy_of(f.reshape(16,3), s)
  auto frames = signal.transpose(1, 2).reshape({B * L, d_in});  // EXPECT: tensor-reshape-non-contiguous
  auto h_all = model->encoder(((frames - mean) / stdv).to(device)).view({B, L, model->d_model});

  std::vector<torch::Tensor> dA, Cd, state;
  for (size_t l = 0; l < model->layers->size(); ++l) {
    auto [dtA, C] = model->layer(l)->kernel->discretize();
    dA.push_back(torch::exp(dtA));
    Cd.push_back(C);
    state.push_back(torch::zeros({1, dtA.size(0), dtA.size(1)}, dtA.options()).expand({B, -1, -1}));
  }

  auto pooled = torch::zeros({B, model->d_model});
  for (int64_t t = 0; t < L; ++t) {
    auto h = h_all.select(1, t);
    for (size_t l = 0; l < state.size(); ++l) {
      auto* layer = model->layer(l);
      // FACT: raises(lambda: torch.zeros(1,4,3,dtype=torch.cfloat).expand(2,-1,-1).mul_(torch.randn(4,3,dtype=torch.cfloat)), "more than one element")
      state[l].mul_(dA[l]).add_(h.unsqueeze(-1));  // EXPECT: tensor-inplace-on-expanded
      auto y = 2.0 * torch::real((Cd[l] * state[l]).sum(-1)) + h * layer->D;
      h = model->norm(l)->forward(h + layer->mix(y));
    }
    pooled += h;  // EXPECT: tensor-device-mismatch
  }
  return model->decoder(pooled / static_cast<double>(L));
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::cerr << "S4D training needs a CUDA device\n";
    return 1;
  }
  torch::Device device(torch::kCUDA);
  S4Config cfg;
  auto train = make_chirps(4096, cfg, 0);
  auto test = make_chirps(512, cfg, 1);

  auto flat = train.x.reshape({-1, cfg.d_input});
  auto mean = flat.mean(0);
  auto stdv = (flat - mean).pow(2).mean(0).sqrt().clamp_min(1e-5);
  // FACT: x=torch.randn(4,8,2); assert is_copy_of(x.clone(), x)
  auto train_x = train.x.clone().sub_(mean).div_(stdv);  // EXPECT: tensor-unnecessary-clone // LOOKALIKE: tensor-alias-then-mutate -- the clone owns new storage, train.x stays raw
  // FACT: x=torch.randn(4,8,2); assert shares_storage(x.contiguous(), x) and x.contiguous().data_ptr() == x.data_ptr()
  auto test_x = test.x.contiguous();
  test_x.sub_(mean).div_(stdv);  // EXPECT: tensor-alias-then-mutate

  S4Classifier model(cfg);
  model->to(device);
  std::vector<torch::Tensor> ssm_params, other_params;
  for (auto& kv : model->named_parameters()) {
    if (kv.key().find("kernel.") != std::string::npos)
      ssm_params.push_back(kv.value());
    else
      other_params.push_back(kv.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(other_params, std::make_unique<torch::optim::AdamWOptions>(
                                        torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay)));
  groups.emplace_back(ssm_params, std::make_unique<torch::optim::AdamWOptions>(
                                      torch::optim::AdamWOptions(cfg.ssm_lr).weight_decay(0.0)));
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(cfg.lr));

  const auto weights = class_weights(train.y, cfg.n_classes).to(device);
  const int64_t n_train = train_x.size(0);
  const int64_t steps_per_epoch = n_train / cfg.batch_size;
  std::vector<torch::Tensor> recent;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n_train, torch::kLong);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (int64_t b = 0; b + cfg.batch_size <= n_train; b += cfg.batch_size) {
      auto idx = perm.narrow(0, b, cfg.batch_size);
      auto xb = train_x.index_select(0, idx).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto yb = train.y.index_select(0, idx).to(device);
      auto loss = torch::nn::functional::cross_entropy(
          model->forward(xb), yb, torch::nn::functional::CrossEntropyFuncOptions().weight(weights));
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      model->constrain();

      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, only the value is summed
      recent.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (recent.size() > 50) recent.erase(recent.begin());
      if (++step % 100 == 0)
        std::printf("step %lld  smoothed loss %.4f\n", static_cast<long long>(step),
                    torch::stack(recent).mean().item<double>());  // LOOKALIKE: tensor-sync-in-loop -- one read per 100 steps for the log line
    }
    const double train_loss = epoch_loss.item<double>() / steps_per_epoch;  // LOOKALIKE: tensor-sync-in-loop -- one read per epoch, after the batch loop
    const double acc = evaluate(model, SeqDataset{test_x, test.y}, device, 128);
    std::printf("epoch %lld  loss %.4f  test acc %.3f\n", static_cast<long long>(epoch), train_loss, acc);
  }

  auto logits = recurrent_predict(model, test.x.transpose(1, 2).contiguous(), mean, stdv, device);
  const double rec_acc =
      logits.argmax(1).cpu().eq(test.y).to(torch::kFloat).mean().item<double>();
  std::printf("recurrent-mode accuracy %.3f\n", rec_acc);
  return 0;
}
