// A convolutional spiking network for event-camera gestures/digits, trained with surrogate
// gradients (Neftci, Mostafa & Zenke 2019): leaky integrate-and-fire neurons unrolled over the T
// time bins of each sample, Heaviside spikes with a fast-sigmoid surrogate derivative, soft reset by
// subtraction, an axonal delay on the hidden-to-output projection, a leaky non-spiking readout, and
// a spike-rate regulariser. Trained weights are exported as int8 for a neuromorphic chip.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

struct SnnConfig {
  int64_t in_channels = 2, height = 34, width = 34, conv_channels = 16, hidden = 256, n_classes = 10;
  int64_t delay = 3, batch = 32, epochs = 30, log_every = 100;
  double beta = 0.9, threshold = 1.0, slope = 25.0, jitter = 0.1, readout_beta = 0.95;
  double rate_target = 0.02, rate_coef = 1e-3, lr = 1e-3, max_beta_logit = 5.0;
};

// Heaviside spike, fast-sigmoid surrogate derivative (Zenke & Ganguli 2018).
struct FastSigmoidSpike : torch::autograd::Function<FastSigmoidSpike> {
  static torch::Tensor forward(torch::autograd::AutogradContext *ctx, const torch::Tensor &v, double threshold,
                               double slope) {
    ctx->save_for_backward({v});
    ctx->saved_data["threshold"] = threshold;
    ctx->saved_data["slope"] = slope;
    return v.gt(threshold).to(v.scalar_type());
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext *ctx,
                                               torch::autograd::tensor_list grads) {
    auto v = ctx->get_saved_variables()[0];
    const auto thr = ctx->saved_data["threshold"].toDouble(), k = ctx->saved_data["slope"].toDouble();
    auto surrogate = 1.0 / (k * (v - thr).abs() + 1.0).pow(2);
    return {grads[0] * surrogate, torch::Tensor(), torch::Tensor()};
  }
};

// Leaky integrate-and-fire population with a learnable decay per neuron.
struct LIFImpl : torch::nn::Module {
  LIFImpl(int64_t n, const SnnConfig &cfg) : n_(n), threshold_(cfg.threshold), slope_(cfg.slope), jitter_(cfg.jitter) {
    beta_logit_ = register_parameter("beta_logit", torch::full({n}, std::log(cfg.beta / (1.0 - cfg.beta))));
    v_rest_ = register_buffer("v_rest", torch::zeros({n}));
  }

  // Membrane at the start of a sample: the resting potential, jittered in training so that the
  // first spikes of a population are not all synchronous.
  torch::Tensor init_state(int64_t batch) {
    auto v = v_rest_.unsqueeze(0).expand({batch, n_});
    // FACT: r = torch.zeros(5); v = r.unsqueeze(0).expand(3, 5); assert raises(lambda: v.add_(torch.rand_like(v) * 0.1), "more than one element of the written-to tensor refers to a single memory location")
    if (is_training() && jitter_ > 0)
      v.add_(torch::rand_like(v) * jitter_); // EXPECT: tensor-inplace-on-expanded -- every row of the batch is the one v_rest buffer
    return v;
  }

  // One time step: leak, integrate, fire, reset by subtracting the threshold.
  torch::Tensor step(const torch::Tensor &cur, torch::Tensor &v) {
    v = torch::sigmoid(beta_logit_) * v + cur;
    auto spk = FastSigmoidSpike::apply(v, threshold_, slope_);
    // FACT: Fn = type("Fn", (torch.autograd.Function,), {"forward": staticmethod(lambda ctx, v: (ctx.save_for_backward(v), (v > 1).float())[1]), "backward": staticmethod(lambda ctx, g: g / (1 + 25 * (ctx.saved_tensors[0] - 1).abs()) ** 2)}); v = torch.randn(4, 5, requires_grad=True) * 2; s = Fn.apply(v); v.sub_(s); assert backward_fails(lambda: s.sum().backward())
    v.sub_(spk * threshold_); // EXPECT: tensor-inplace-on-saved -- the spike function saved v for its surrogate gradient: backward raises
    return spk;
  }

  int64_t n_;
  double threshold_, slope_, jitter_;
  torch::Tensor beta_logit_, v_rest_;
};
TORCH_MODULE(LIF);

// Non-spiking leaky integrator: its mean membrane over time is the class score.
struct LeakyReadoutImpl : torch::nn::Module {
  LeakyReadoutImpl(int64_t n, double beta) : n_(n), beta_(beta) { v_rest_ = register_buffer("v_rest", torch::zeros({n})); }

  torch::Tensor init_state(int64_t batch) { return v_rest_.unsqueeze(0).expand({batch, n_}).clone(); }

  void step(const torch::Tensor &cur, torch::Tensor &v) {
    // FACT: r = torch.zeros(5); v = r.unsqueeze(0).expand(3, 5).clone(); v.mul_(0.9).add_(torch.randn(3, 5)); assert is_copy_of(v, r) and is_contiguous(v)
    v.mul_(beta_).add_(cur); // LOOKALIKE: tensor-inplace-on-expanded, tensor-inplace-on-saved -- init_state cloned the expanded rest potential; scaling by a number saves nothing
  }

  int64_t n_;
  double beta_;
  torch::Tensor v_rest_;
};
TORCH_MODULE(LeakyReadout);

struct SnnOutput {
  torch::Tensor logits;       // [B, n_classes]
  torch::Tensor rate1, rate2; // [B, n]: spikes per time bin of each hidden population
};

struct SpikingConvNetImpl : torch::nn::Module {
  explicit SpikingConvNetImpl(const SnnConfig &cfg) : cfg_(cfg) {
    namespace nn = torch::nn;
    conv_ = register_module("conv", nn::Conv2d(nn::Conv2dOptions(cfg.in_channels, cfg.conv_channels, 5).stride(2).padding(2)));
    pool_ = register_module("pool", nn::AvgPool2d(2));
    const auto feat = cfg.conv_channels * ((cfg.height + 1) / 2 / 2) * ((cfg.width + 1) / 2 / 2);
    lif1_ = register_module("lif1", LIF(feat, cfg));
    fc1_ = register_module("fc1", nn::Linear(feat, cfg.hidden));
    lif2_ = register_module("lif2", LIF(cfg.hidden, cfg));
    fc2_ = register_module("fc2", nn::Linear(cfg.hidden, cfg.n_classes));
    readout_ = register_module("readout", LeakyReadout(cfg.n_classes, cfg.readout_beta));
  }

  // events: [B, T, C, H, W] frames of event counts, batch-major as the dataset stores them.
  SnnOutput forward(const torch::Tensor &events) {
    const auto B = events.size(0), T = events.size(1), D = cfg_.delay;
    // the convolution keeps no state: run it once over all T * B frames, time-major
    auto frames = events.transpose(0, 1);
    // FACT: e = torch.rand(2, 3, 2, 8, 8); assert raises(lambda: e.transpose(0, 1).view(6, 2, 8, 8), "view size is not compatible")
    auto feat = pool_(conv_(frames.view({T * B, events.size(2), events.size(3), events.size(4)}))); // EXPECT: tensor-view-non-contiguous -- T and B are swapped: they cannot be merged by a view
    // FACT: f = torch.nn.AvgPool2d(2)(torch.nn.Conv2d(2, 4, 5, stride=2, padding=2)(torch.rand(6, 2, 16, 16))); assert is_view_of(f.view(3, 2, -1), f)
    auto cur1 = feat.view({T, B, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the pooled convolution output is contiguous
    auto v1 = lif1_->init_state(B), v2 = lif2_->init_state(B), v3 = readout_->init_state(B);
    auto opts = events.options();
    auto delay = torch::zeros({D, B, cfg_.hidden}, opts);
    auto count1 = torch::zeros({B, lif1_->n_}, opts), count2 = torch::zeros({B, cfg_.hidden}, opts);
    auto score = torch::zeros({B, cfg_.n_classes}, opts);
    for (int64_t t = 0; t < T; ++t) {
      auto s1 = lif1_->step(cur1[t], v1);
      auto s2 = lif2_->step(fc1_(s1), v2);
      // axonal delay: the readout sees the hidden spikes D steps late
      // FACT: d = torch.randn(3, 2, 4); o = d[0].clone(); d[0].copy_(d[1]); assert is_copy_of(o, d) and not torch.equal(o, d[0])
      auto delayed = delay[0].clone(); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- the line changes every step, and row 0 is overwritten by the shift below while the copy is in use
      // FACT: d = torch.randn(3, 2, 4); assert raises(lambda: d.narrow(0, 0, 2).copy_(d.narrow(0, 1, 2)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
      delay.narrow(0, 0, D - 1).copy_(delay.narrow(0, 1, D - 1)); // EXPECT: tensor-inplace-overlap -- rows 0..D-2 and 1..D-1 of one buffer overlap
      delay[D - 1] = s2;
      readout_->step(fc2_(delayed), v3);
      count1 = count1 + s1; // LOOKALIKE: tensor-graph-kept-across-iterations -- the spike counts feed the rate regulariser: returned and differentiated
      count2 = count2 + s2;
      score = score + v3;
    }
    return {score / T, count1 / T, count2 / T};
  }

  SnnConfig cfg_;
  torch::nn::Conv2d conv_{nullptr};
  torch::nn::AvgPool2d pool_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  LIF lif1_{nullptr}, lif2_{nullptr};
  LeakyReadout readout_{nullptr};
};
TORCH_MODULE(SpikingConvNet);

struct EventDataset : torch::data::datasets::Dataset<EventDataset> {
  EventDataset(torch::Tensor frames, torch::Tensor labels) : frames_(std::move(frames)), labels_(std::move(labels)) {}
  torch::data::Example<> get(size_t i) override { return {frames_[i], labels_[i]}; }
  torch::optional<size_t> size() const override { return frames_.size(0); }
  torch::Tensor frames_, labels_;
};

void train(SpikingConvNet &net, const EventDataset &data, const SnnConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  net->to(device);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      EventDataset(data).map(torch::data::transforms::Stack<>()), cfg.batch);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    net->train();
    std::vector<torch::Tensor> hidden_rates;
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    int64_t seen = 0;
    for (auto &batch : *loader) {
      auto x = batch.data.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto y = batch.target.to(device);
      auto out = net->forward(x);
      auto ce = torch::nn::functional::cross_entropy(out.logits, y);
      // keep the mean rate of every neuron near the target: no silent and no saturated units
      auto reg = (out.rate1.mean(0) - cfg.rate_target).pow(2).sum() + (out.rate2.mean(0) - cfg.rate_target).pow(2).sum();
      auto loss = ce + cfg.rate_coef * reg;
      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        for (auto *lif : {&net->lif1_, &net->lif2_})
          (*lif)->beta_logit_.clamp_max_(cfg.max_beta_logit); // LOOKALIKE: tensor-inplace-on-leaf -- the decay constraint runs under NoGradGuard
      }
      // FACT: l = torch.nn.Linear(3, 2); c = [(l(torch.randn(4, 3)).sigmoid() / 5).mean(0) for _ in range(3)]; assert kept_nodes(c) >= 3 * 4
      hidden_rates.push_back(out.rate2.mean(0)); // EXPECT: tensor-graph-kept-across-iterations -- each step's rates hold its whole unrolled graph until the epoch ends
      correct = correct + out.logits.argmax(1).eq(y).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a count of comparisons: nothing requires grad
      seen += x.size(0);
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps
    }
    auto rates = torch::stack(hidden_rates).mean(0);
    std::cout << "epoch " << epoch << " acc " << correct.item<double>() / seen << " silent units "
              << rates.eq(0).sum().item<int64_t>() << "/" << rates.size(0) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- once per epoch, after the step loop
  }
}

// int8 weights with one scale per layer, and the firing threshold in the same units.
struct ChipLayer {
  torch::Tensor weight_q;
  double scale;
  int64_t threshold_q;
};

ChipLayer export_linear(const torch::nn::Linear &fc, double threshold) {
  torch::NoGradGuard no_grad;
  auto w = fc->weight.detach().cpu();
  const double scale = w.abs().max().item<double>() / 127.0;
  auto q = torch::empty(w.sizes(), torch::kChar);
  // FACT: q = torch.empty(3, dtype=torch.int8); q.copy_(torch.tensor([1.7, -2.9, 0.4])); assert q.tolist() == [1, -2, 0]
  q.copy_(w / scale); // EXPECT: tensor-copy-narrowing -- float32 to int8 truncates toward zero instead of rounding
  return {q, scale, std::lround(threshold / scale)};
}

ChipLayer export_conv(const torch::nn::Conv2d &conv, double threshold) {
  torch::NoGradGuard no_grad;
  auto w = conv->weight.detach().cpu();
  const double scale = w.abs().max().item<double>() / 127.0;
  auto q = torch::empty(w.sizes(), torch::kChar);
  // FACT: q = torch.empty(3, dtype=torch.int8); q.copy_((torch.tensor([1.7, -2.9, 0.4]) / 0.5).round().clamp(-127, 127).to(torch.int8)); assert q.tolist() == [3, -6, 1]
  q.copy_((w / scale).round().clamp(-127, 127).to(torch::kChar)); // LOOKALIKE: tensor-copy-narrowing -- rounded, clamped and converted explicitly: int8 into int8
  return {q, scale, std::lround(threshold / scale)};
}

void export_chip(SpikingConvNet &net, const SnnConfig &cfg, const std::string &path) {
  net->to(torch::kCPU);
  std::vector<ChipLayer> layers{export_conv(net->conv_, cfg.threshold), export_linear(net->fc1_, cfg.threshold),
                                export_linear(net->fc2_, cfg.threshold)};
  torch::serialize::OutputArchive archive;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto name = "layer" + std::to_string(i);
    archive.write(name + ".weight", layers[i].weight_q);
    archive.write(name + ".scale", torch::tensor(layers[i].scale));
    archive.write(name + ".threshold", torch::tensor(layers[i].threshold_q));
    // the chip has no per-neuron decay registers: export the mean decay of each population
  }
  auto decay = [](const LIF &lif) { return torch::sigmoid(lif->beta_logit_).mean().detach(); };
  archive.write("lif1.beta", decay(net->lif1_));
  archive.write("lif2.beta", decay(net->lif2_));
  archive.save_to(path);
}
