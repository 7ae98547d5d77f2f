// Unconditional handwriting generation (Graves 2013, "Generating Sequences With Recurrent Neural
// Networks", section 4) on IAM-OnDB pen trajectories. Every point is a pen offset (dx, dy) and an
// end-of-stroke bit; a two-layer LSTM predicts, for the next point, a mixture of M bivariate
// Gaussians over the offset and a Bernoulli over the pen lift, all read from one linear output.
// Training minimises the masked negative log-likelihood; sampling draws one point at a time, with
// the sampling bias of section 5.4 sharpening the mixture.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct MdnConfig {
  int64_t hidden = 400, layers = 2, mixtures = 20, epochs = 30, log_every = 100, max_points = 700;
  double lr = 1e-3, grad_clip = 10.0, eos_bias_init = -3.0, forget_bias = 1.0;
  double sample_bias = 0.5, min_sigma = 1e-4, canvas = 60.0;
};

// A padded batch, time-major as pad_sequence returns it: strokes [T, B, 3], lengths [B] int64.
struct StrokeBatch {
  torch::Tensor strokes, lengths;
};

// Offsets are divided by their per-axis std over the training set; the pen bit keeps its scale.
struct StrokeStats {
  torch::Tensor scale; // [3]: std_x, std_y, 1
};

// The mixture for every next point, read from one [.., 1 + 6M] output: eos [.., 1], the rest [.., M].
struct MixtureParams {
  torch::Tensor eos_logit, log_pi, mu1, mu2, log_s1, log_s2, rho;
};

// Teacher forcing: inputs are points 0..T-2, targets points 1..T-1, both batch-major [B, T-1, 3].
struct Shifted {
  torch::Tensor input, target, mask;
};

using LstmState = std::tuple<torch::Tensor, torch::Tensor>;

struct HandwritingMdnImpl : nn::Module {
  explicit HandwritingMdnImpl(const MdnConfig &cfg) : M(cfg.mixtures), hidden(cfg.hidden) {
    lstm = register_module("lstm", nn::LSTM(nn::LSTMOptions(3, cfg.hidden).num_layers(cfg.layers).batch_first(true)));
    head = register_module("head", nn::Linear(cfg.hidden, 1 + 6 * cfg.mixtures));
    {
      torch::NoGradGuard no_grad;
      // Gate order i, f, g, o: open the forget gate at the start of training.
      for (auto &p : lstm->named_parameters())
        if (p.key().find("bias_ih") != std::string::npos)
          p.value().narrow(0, cfg.hidden, cfg.hidden).fill_(cfg.forget_bias); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    reset_eos_bias(cfg.eos_bias_init);
  }

  // Pen lifts are rare (about one point in 25): start the end-of-stroke logit low.
  void reset_eos_bias(double value) {
    // FACT: fc = torch.nn.Linear(8, 13); assert raises(lambda: fc.bias.narrow(0, 0, 1).fill_(-3.0), "a view of a leaf Variable that requires grad")
    head->bias.narrow(0, 0, 1).fill_(value); // EXPECT: tensor-inplace-on-leaf -- called from the constructor with grad mode on: a view of the bias, which requires grad
  }

  MixtureParams split(const torch::Tensor &y) const {
    auto parts = y.split_with_sizes({1, M, M, M, M, M, M}, -1);
    MixtureParams p;
    p.eos_logit = parts[0];
    p.log_pi = torch::log_softmax(parts[1], -1);
    p.mu1 = parts[2];
    p.mu2 = parts[3];
    p.log_s1 = parts[4];
    p.log_s2 = parts[5];
    p.rho = torch::tanh(parts[6]);
    return p;
  }

  // x: [B, T, 3] normalised offsets.
  MixtureParams forward(const torch::Tensor &x) {
    const auto B = x.size(0), T = x.size(1);
    auto out = std::get<0>(lstm->forward(x));
    // FACT: l = torch.nn.LSTM(3, 8, batch_first=True); o, _ = l(torch.randn(4, 5, 3)); assert not is_contiguous(o) and is_copy_of(o.reshape(-1, 8), o)
    auto y = head(out.reshape({B * T, hidden})); // EXPECT: tensor-reshape-non-contiguous -- the batch-first LSTM output is [T, B, H] transposed: all hidden states are copied every step
    // FACT: y = torch.nn.Linear(8, 13)(torch.randn(20, 8)); assert is_contiguous(y) and is_view_of(y.view(4, 5, -1), y)
    return split(y.view({B, T, -1})); // LOOKALIKE: tensor-view-non-contiguous -- Linear's [B*T, K] output is contiguous
  }

  // One point at a time for sampling: x [1, 1, 3]; the state is carried by the caller.
  MixtureParams step(const torch::Tensor &x, c10::optional<LstmState> &state) {
    auto res = lstm->forward(x, state);
    state = std::get<1>(res);
    return split(head(std::get<0>(res)));
  }

  int64_t M, hidden;
  nn::LSTM lstm{nullptr};
  nn::Linear head{nullptr};
};
TORCH_MODULE(HandwritingMdn);

StrokeStats fit_stats(const std::vector<torch::Tensor> &train_seqs) {
  auto all = torch::cat(train_seqs); // [P, 3]
  auto scale = torch::ones({3});
  scale.narrow(0, 0, 2).copy_(all.narrow(1, 0, 2).std(0)); // LOOKALIKE: tensor-copy-narrowing -- float32 standard deviations into a float32 tensor
  return {scale};
}

StrokeBatch collate(const std::vector<torch::Tensor> &seqs, const StrokeStats &stats) {
  std::vector<int64_t> lens;
  for (const auto &s : seqs)
    lens.push_back(s.size(0));
  auto strokes = nn::utils::rnn::pad_sequence(seqs); // [T, B, 3]
  // FACT: a = torch.randn(5, 3); b = torch.randn(4, 3); p = torch.nn.utils.rnn.pad_sequence([a, b]); p.div_(torch.tensor([2.0, 2.0, 1.0])); assert is_copy_of(p, a) and is_copy_of(p, b)
  strokes.div_(stats.scale); // LOOKALIKE: tensor-alias-then-mutate -- pad_sequence wrote a new tensor: the raw sequences are untouched
  return {strokes, torch::tensor(lens)};
}

Shifted shift_batch(const torch::Tensor &strokes, const torch::Tensor &lengths) {
  const auto T = strokes.size(0);
  auto steps = torch::arange(T - 1, lengths.options());
  auto valid = steps.unsqueeze(1) < (lengths - 1).unsqueeze(0); // [T-1, B]
  return {strokes.narrow(0, 0, T - 1).transpose(0, 1), strokes.narrow(0, 1, T - 1).transpose(0, 1), valid.t().to(torch::kFloat)};
}

// Per-point negative log-likelihood of the targets [B, T, 3] under the mixture: [B, T].
torch::Tensor mixture_nll(const MixtureParams &p, const torch::Tensor &target, double min_sigma) {
  auto dx = target.select(-1, 0).unsqueeze(-1), dy = target.select(-1, 1).unsqueeze(-1);
  auto sigma = torch::exp(torch::stack({p.log_s1, p.log_s2}));
  // FACT: a = torch.randn(2, 3, requires_grad=True); s = torch.exp(a); s.clamp_min_(1e-4); assert backward_fails(lambda: (1 / s).sum().backward())
  sigma.clamp_min_(min_sigma); // EXPECT: tensor-inplace-on-saved -- exp saved its result for backward: the training step's backward() raises
  auto z1 = (dx - p.mu1) / sigma[0], z2 = (dy - p.mu2) / sigma[1];
  auto one_m_rho2 = 1 - p.rho.pow(2);
  auto z = z1.pow(2) + z2.pow(2) - 2 * p.rho * z1 * z2;
  // FACT: a = torch.randn(4, requires_grad=True); r = torch.tanh(torch.randn(4, requires_grad=True)); z = a.pow(2) - 2 * r * a; z.div_(1 - r.pow(2)); z.sum().backward(); assert a.grad is not None
  z.div_(one_m_rho2); // LOOKALIKE: tensor-inplace-on-saved -- z is a sum: add and sub save nothing for backward
  auto log_gauss = -0.5 * z - std::log(2 * M_PI) - sigma.log().sum(0) - 0.5 * torch::log(one_m_rho2);
  auto log_mix = torch::logsumexp(p.log_pi + log_gauss, -1);
  // FACT: y = torch.randn(4, 5, 13); assert is_view_of(y.narrow(-1, 0, 1).view(-1), y)
  auto eos = p.eos_logit.view({-1}); // LOOKALIKE: tensor-view-non-contiguous -- a column of the contiguous head output: batch and time still merge
  // FACT: s = torch.randn(6, 4, 3); t = s[1:].transpose(0, 1); assert raises(lambda: t.select(-1, 2).view(-1), "view size is not compatible")
  auto pen = target.select(-1, 2).view({-1}); // EXPECT: tensor-view-non-contiguous -- the targets are time-major strokes transposed by shift_batch: batch and time cannot merge
  auto pen_nll = F::binary_cross_entropy_with_logits(eos, pen, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  return pen_nll.view_as(log_mix) - log_mix;
}

// Back to pen units, for plotting and the stroke statistics.
torch::Tensor denormalize(const torch::Tensor &points, const StrokeStats &stats) {
  auto out = points.contiguous();
  // FACT: p = torch.stack([torch.randn(3) for _ in range(5)]); o = p.contiguous(); o.mul_(torch.tensor([2.0, 3.0, 1.0])); assert shares_storage(o, p)
  out.mul_(stats.scale.to(out.device())); // EXPECT: tensor-alias-then-mutate -- the stacked sample is contiguous, so this scales the caller's normalised sample too
  return out;
}

torch::Tensor generate(HandwritingMdn &model, const MdnConfig &cfg, const StrokeStats &stats, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto x = torch::zeros({1, 1, 3}, torch::TensorOptions().device(device));
  x[0][0][2] = 1.0; // start with the pen up
  auto pos = torch::zeros({2}, x.options());
  c10::optional<LstmState> state;
  std::vector<torch::Tensor> points;
  const double b = cfg.sample_bias;
  for (int64_t t = 0; t < cfg.max_points; ++t) {
    auto p = model->step(x, state);
    auto biased = p.log_pi.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten at once by mul_: log_pi * (1 + b) is the same tensor in one pass
    biased.mul_(1.0 + b);
    // FACT: y = torch.randn(1, 1, 13); b = y.narrow(-1, 1, 4).log_softmax(-1).clone(); assert is_view_of(b.view(-1), b)
    auto k = torch::multinomial(torch::softmax(biased.view({-1}), 0), 1); // LOOKALIKE: tensor-view-non-contiguous -- one step of one sequence: the clone of [1, 1, M] is contiguous
    const auto i = k.item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the component index steers the rest of the step
    auto s1 = torch::exp(p.log_s1[0][0][i] - b), s2 = torch::exp(p.log_s2[0][0][i] - b);
    auto r = p.rho[0][0][i];
    auto n = torch::randn({2}, x.options()); // LOOKALIKE: tensor-device-mismatch -- made with x's options: on the model's device
    auto dx = p.mu1[0][0][i] + s1 * n[0];
    auto dy = p.mu2[0][0][i] + s2 * (r * n[0] + torch::sqrt(1 - r * r) * n[1]);
    auto pen = torch::bernoulli(torch::sigmoid(p.eos_logit.view({1})));
    auto point = torch::stack({dx, dy, pen.squeeze(0)});
    points.push_back(point); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: nothing is recorded
    pos += point.narrow(0, 0, 2) * stats.scale.narrow(0, 0, 2).to(device); // EXPECT: tensor-clone-in-loop -- the same scale is copied to the device for every sampled point
    if ((pos.abs() > cfg.canvas).any().item<bool>()) // LOOKALIKE: tensor-sync-in-loop -- the value decides whether sampling stops
      break; // the pen left the canvas
    x = point.view({1, 1, 3});
  }
  return torch::stack(points);
}

class MdnTrainer {
public:
  MdnTrainer(const MdnConfig &cfg)
      : cfg_(cfg), model_(cfg), opt_(model_->parameters(), torch::optim::AdamOptions(cfg.lr)),
        device_(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU) {
    model_->to(device_);
    smoothed_nll_ = torch::zeros({}, torch::TensorOptions().device(device_));
  }

  double train_epoch(const std::vector<StrokeBatch> &loader) {
    model_->train();
    double total = 0;
    int64_t n = 0;
    for (const auto &batch : loader) {
      auto strokes = batch.strokes.to(device_); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto ex = shift_batch(strokes, batch.lengths.to(device_));
      auto nll = mixture_nll(model_->forward(ex.input), ex.target, cfg_.min_sigma);
      auto loss = (nll * ex.mask).sum() / ex.mask.sum();
      opt_.zero_grad();
      loss.backward();
      nn::utils::clip_grad_value_(model_->parameters(), cfg_.grad_clip); // LOOKALIKE: tensor-inplace-on-leaf -- clips the gradients, not the weights
      opt_.step();
      smoothed_nll_ = 0.98 * smoothed_nll_ + 0.02 * loss; // EXPECT: tensor-graph-kept-across-iterations -- the member chains every step's loss graph into the next
      total += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU every step waits here only to sum the loss
      ++n;
      if (++step_ % cfg_.log_every == 0)
        std::cout << "step " << step_ << " nll/point " << smoothed_nll_.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
    }
    return total / static_cast<double>(std::max<int64_t>(n, 1));
  }

  double validate(const std::vector<StrokeBatch> &loader) {
    torch::NoGradGuard no_grad;
    model_->eval();
    auto sum = torch::zeros({}, torch::TensorOptions().device(device_)), count = torch::zeros_like(sum);
    for (const auto &batch : loader) {
      auto ex = shift_batch(batch.strokes.to(device_), batch.lengths.to(device_));
      auto nll = mixture_nll(model_->forward(ex.input), ex.target, cfg_.min_sigma);
      sum += (nll * ex.mask).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
      count += ex.mask.sum();
    }
    return (sum / count).item<double>();
  }

  HandwritingMdn &model() { return model_; }
  torch::Device device() const { return device_; }

private:
  MdnConfig cfg_;
  HandwritingMdn model_;
  torch::optim::Adam opt_;
  torch::Device device_;
  torch::Tensor smoothed_nll_;
  int64_t step_ = 0;
};

void run(const std::vector<torch::Tensor> &train_seqs, const std::vector<std::vector<torch::Tensor>> &train_batches,
         const std::vector<std::vector<torch::Tensor>> &val_batches, const MdnConfig &cfg) {
  const auto stats = fit_stats(train_seqs);
  std::vector<StrokeBatch> train, val;
  for (const auto &b : train_batches)
    train.push_back(collate(b, stats));
  for (const auto &b : val_batches)
    val.push_back(collate(b, stats));
  MdnTrainer trainer(cfg);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double tr = trainer.train_epoch(train), va = trainer.validate(val);
    std::cout << "epoch " << epoch << " train " << tr << " val " << va << "\n";
  }
  auto sample = generate(trainer.model(), cfg, stats, trainer.device());
  auto pen_units = denormalize(sample, stats);
  // Mean step in normalised units: about 1 when the model matches the data's scale.
  const double mean_step = sample.narrow(1, 0, 2).norm(2, 1).mean().item<double>();
  const double lifts = pen_units.select(1, 2).sum().item<double>();
  std::cout << "sampled " << sample.size(0) << " points, " << lifts << " pen lifts, mean step " << mean_step << "\n";
}
