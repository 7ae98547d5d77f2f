// Post-training static int8 quantisation of the MLP head of a speech model for CPU
// inference: symmetric per-output-channel int8 weights, affine int8 activations calibrated
// with running min/max observers, an int32-accumulating matmul written with accessors, and a
// comparison of the int8 path against the float model.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace nn = torch::nn;

struct QuantConfig {
  int64_t calib_batches = 32;
  double act_momentum = 0.9;  // EMA over per-batch min/max
  int64_t history = 8;        // recent per-batch maxima kept to catch EMA lag
  double weight_clip = 4.0;   // clip weights at this many std before quantising (0 = off)
  double smooth_alpha = 0.5;  // SmoothQuant migration strength
};

struct QParams {
  float scale = 1.f;
  int32_t zero_point = 0;
};

class MinMaxObserver {
 public:
  MinMaxObserver(int64_t history, double momentum)
      : momentum_(momentum), running_min_(torch::zeros({})), running_max_(torch::zeros({})),
        recent_max_(torch::zeros({history})) {}

  void observe(const torch::Tensor& x) {
    torch::NoGradGuard no_grad;
    auto lo = x.min();
    auto hi = x.max();
    if (!initialised_) {
      running_min_.copy_(lo);
      running_max_.copy_(hi);
      recent_max_.fill_(hi.item<float>());
      initialised_ = true;
      return;
    }
    auto prev_max = running_max_.clone();  // LOOKALIKE: tensor-unnecessary-clone -- snapshot, running_max_ is updated below
    running_min_.mul_(momentum_).add_(lo, 1.0 - momentum_);
    running_max_.mul_(momentum_).add_(hi, 1.0 - momentum_);
    last_drift_ = (running_max_ - prev_max).abs().item<float>();

    const int64_t n = recent_max_.size(0);
    // FACT: r = torch.arange(6.0); assert raises(lambda: r.narrow(0, 0, 5).copy_(r.narrow(0, 1, 5)), "refer to a single memory location")
    recent_max_.narrow(0, 0, n - 1).copy_(recent_max_.narrow(0, 1, n - 1));  // EXPECT: tensor-inplace-overlap
    recent_max_[n - 1] = hi;
  }

  // Affine int8 parameters covering [min, max] (always including 0).
  QParams qparams() const {
    const float lo = std::min(running_min_.item<float>(), 0.f);
    const float hi = std::max({running_max_.item<float>(), recent_max_.max().item<float>(), 0.f});
    QParams qp;
    qp.scale = std::max((hi - lo) / 255.f, 1e-8f);
    qp.zero_point = static_cast<int32_t>(std::lround(-128.f - lo / qp.scale));
    return qp;
  }

  float last_drift() const { return last_drift_; }

 private:
  double momentum_;
  bool initialised_ = false;
  float last_drift_ = 0.f;
  torch::Tensor running_min_, running_max_, recent_max_;
};

torch::Tensor per_channel_scales(const torch::Tensor& w) {
  auto absw = w.clone();  // EXPECT: tensor-unnecessary-clone
  absw.abs_();
  auto amax = std::get<0>(absw.max(1));
  return amax.clamp_min(1e-8) / 127.0;
}

torch::Tensor quantize_activations(const torch::Tensor& x, const QParams& qp) {
  auto q = torch::empty(x.sizes(), x.options().dtype(torch::kChar));
  q.copy_((x / qp.scale + qp.zero_point).clamp(-128, 127));  // EXPECT: tensor-copy-narrowing
  return q;
}

torch::Tensor dequantize(const torch::Tensor& q, const QParams& qp) {
  TORCH_CHECK(q.scalar_type() == torch::kChar, "dequantize expects int8 data");
  // FACT: q = torch.randint(-5, 5, (3, 4), dtype=torch.int8); f = q.to(torch.float32); f.sub_(1); assert is_copy_of(f, q)
  auto f = q.to(torch::kFloat);
  f.sub_(qp.zero_point).mul_(qp.scale);  // LOOKALIKE: tensor-alias-then-mutate -- q is int8 (checked), to(kFloat) copied
  return f;
}

// Quantise-dequantise in float, for the simulated-quantisation reference.
torch::Tensor fake_quant(torch::Tensor x, const QParams& qp) {
  // FACT: x = torch.randn(4, 3); y = x.contiguous(); y.div_(0.1).round_(); assert shares_storage(y, x)
  auto y = x.contiguous();
  y.div_(qp.scale).add_(qp.zero_point).round_().clamp_(-128, 127);  // EXPECT: tensor-alias-then-mutate
  return (y - qp.zero_point) * qp.scale;
}

// a: [M, K] int8 activations with zero point za; b: [N, K] int8 symmetric weights.
// Returns the int32 accumulators sum_k (a[m, k] - za) * b[n, k].
torch::Tensor int8_matmul(const torch::Tensor& a, const torch::Tensor& b, int32_t za) {
  TORCH_CHECK(a.scalar_type() == torch::kChar && b.scalar_type() == torch::kChar);
  TORCH_CHECK(a.size(1) == b.size(1), "inner dimensions differ");
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  auto out = torch::empty({M, N}, torch::kInt);
  auto A = a.accessor<int8_t, 2>();
  auto W = b.accessor<int8_t, 2>();
  auto O = out.accessor<int32_t, 2>();
  at::parallel_for(0, M, 8, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        int32_t acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += (static_cast<int32_t>(A[m][k]) - za) * static_cast<int32_t>(W[n][k]);
        O[m][n] = acc;
      }
    }
  });
  return out;
}

struct QuantLinear {
  QuantLinear(torch::Tensor wq, torch::Tensor ws, torch::Tensor bq, QParams qp)
      : w_q(std::move(wq)), w_scale(std::move(ws)), bias_q(std::move(bq)), in_qp(qp) {
    TORCH_CHECK(w_q.scalar_type() == torch::kChar, "weights must be int8");
    TORCH_CHECK(bias_q.scalar_type() == torch::kInt, "bias must be int32");
  }

  static QuantLinear from_float(const nn::Linear& fc, const QParams& in_qp, double clip_sigma) {
    auto w = fc->weight.detach();
    if (clip_sigma > 0) {
      const double lim = clip_sigma * w.std().item<double>();
      w.clamp_(-lim, lim);  // EXPECT: tensor-inplace-on-detached
    }
    auto w_scale = per_channel_scales(w);
    auto w_q = torch::empty(w.sizes(), torch::kChar);
    w_q.copy_((w / w_scale.unsqueeze(1)).round().clamp(-127, 127));  // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to whole int8 values
    auto bias_q = torch::empty({w.size(0)}, torch::kInt);
    bias_q.copy_((fc->bias.detach() / (w_scale * in_qp.scale)).round());  // LOOKALIKE: tensor-copy-narrowing -- rounded to whole numbers first
    return QuantLinear(w_q, w_scale, bias_q, in_qp);
  }

  // x: [M, K] float -> [M, N] float
  torch::Tensor forward(const torch::Tensor& x) const {
    auto xq = quantize_activations(x, in_qp);
    auto acc = int8_matmul(xq, w_q, in_qp.zero_point) + bias_q;
    return acc.to(torch::kFloat) * (w_scale * in_qp.scale);
  }

  torch::Tensor w_q, w_scale, bias_q;
  QParams in_qp;
};

struct MLPImpl : nn::Module {
  MLPImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", nn::Linear(in, hidden));
    fc2 = register_module("fc2", nn::Linear(hidden, hidden));
    fc3 = register_module("fc3", nn::Linear(hidden, out));
  }
  // feats: [B, C, T] from the conv front end -> one row per frame
  torch::Tensor tokens(const torch::Tensor& feats) {
    // FACT: f = torch.randn(2, 3, 5); c = f.transpose(1, 2).contiguous(); assert is_copy_of(c, f) and is_view_of(c.view(-1, 3), c)
    return feats.transpose(1, 2).contiguous().view({-1, feats.size(1)});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() first
  }
  torch::Tensor forward(const torch::Tensor& feats) {
    auto h = torch::relu(fc1(tokens(feats)));
    h = torch::relu(fc2(h));
    return fc3(h);
  }
  nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(MLP);

struct QuantMLP {
  std::vector<QuantLinear> layers;

  torch::Tensor forward(const torch::Tensor& feats) const {
    const int64_t C = feats.size(1);
    // FACT: f = torch.randn(2, 3, 5); assert raises(lambda: f.transpose(1, 2).view(-1, 3), "view size is not compatible")
    auto h = feats.transpose(1, 2).view({-1, C});  // EXPECT: tensor-view-non-contiguous
    for (size_t i = 0; i < layers.size(); ++i) {
      h = layers[i].forward(h);
      if (i + 1 < layers.size()) h = torch::relu(h);
    }
    return h;
  }
};

// SmoothQuant between two layers separated by a ReLU: divide fc1's output channels by s and
// multiply fc2's input columns by s (relu(x / s) == relu(x) / s for s > 0).
void smooth_pair(MLP& model, const std::vector<torch::Tensor>& batches, double alpha) {
  torch::NoGradGuard no_grad;
  auto act_max = torch::zeros({model->fc1->weight.size(0)});
  for (const auto& feats : batches)
    act_max = torch::maximum(act_max, std::get<0>(torch::relu(model->fc1(model->tokens(feats))).max(0)));
  auto w_max = std::get<0>(model->fc2->weight.abs().max(0));
  auto s = (act_max.pow(alpha) / w_max.pow(1.0 - alpha)).clamp_min(1e-5);

  auto w1 = model->fc1->weight.data();
  w1.div_(s.unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-detached -- rewriting the weights on purpose, under NoGradGuard
  model->fc1->bias.data().div_(s);
  auto w2 = model->fc2->weight.data();
  w2.mul_(s.unsqueeze(0));
}

QuantMLP calibrate_and_convert(MLP& model, const std::vector<torch::Tensor>& batches,
                               const QuantConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<MinMaxObserver> obs;
  for (int i = 0; i < 3; ++i) obs.emplace_back(cfg.history, cfg.act_momentum);

  const auto n = std::min<int64_t>(cfg.calib_batches, static_cast<int64_t>(batches.size()));
  for (int64_t b = 0; b < n; ++b) {
    auto x = model->tokens(batches[b]);
    obs[0].observe(x);
    auto h1 = torch::relu(model->fc1(x));
    obs[1].observe(h1);
    obs[2].observe(torch::relu(model->fc2(h1)));
  }

  QuantMLP q;
  q.layers.push_back(QuantLinear::from_float(model->fc1, obs[0].qparams(), cfg.weight_clip));
  q.layers.push_back(QuantLinear::from_float(model->fc2, obs[1].qparams(), cfg.weight_clip));
  q.layers.push_back(QuantLinear::from_float(model->fc3, obs[2].qparams(), cfg.weight_clip));
  std::cout << "calibrated on " << n << " batches, last drift " << obs[0].last_drift() << "\n";
  return q;
}

// Simulated quantisation of the first layer in float, to separate kernel bugs from
// quantisation error. token_batches: [M, K] inputs of the first layer.
std::vector<torch::Tensor> fake_quant_reference(const QuantLinear& ql,
                                                const std::vector<torch::Tensor>& token_batches) {
  std::vector<torch::Tensor> outs;
  auto b_deq = ql.bias_q.to(torch::kFloat) * (ql.w_scale * ql.in_qp.scale);
  for (const auto& x : token_batches) {
    auto w_deq = ql.w_q.to(torch::kFloat).mul(ql.w_scale.unsqueeze(1));  // EXPECT: tensor-clone-in-loop
    auto xq = fake_quant(x, ql.in_qp);
    std::cout << "input rounding error " << (xq - x).abs().mean().item<float>() << "\n";
    outs.push_back(torch::addmm(b_deq, xq, w_deq.t()));
  }
  return outs;
}

void compare_paths(MLP& float_model, const QuantMLP& qmodel,
                   const std::vector<torch::Tensor>& eval_batches) {
  torch::NoGradGuard no_grad;
  float_model->eval();
  float_model->to(torch::kCUDA);  // the float reference runs on the GPU, the int8 kernel on the CPU
  std::vector<float> max_errs, cosines;
  for (const auto& feats : eval_batches) {
    auto ref = float_model->forward(feats.to(torch::kCUDA));  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    auto q_out = qmodel.forward(feats);
    auto max_abs = (ref - q_out).abs().max();  // EXPECT: tensor-device-mismatch
    max_errs.push_back(max_abs.item<float>());
    auto ref_cpu = ref.cpu();
    auto e = ref_cpu - q_out;  // LOOKALIKE: tensor-device-mismatch -- ref copied back to the CPU first
    // FACT: e = torch.randn(3, 4); e.mul_(e); assert bool((e >= 0).all())
    e.mul_(e);  // LOOKALIKE: tensor-inplace-overlap -- the same elements in the same order, allowed
    cosines.push_back(torch::nn::functional::cosine_similarity(ref_cpu.flatten(), q_out.flatten(),
                                                               torch::nn::functional::CosineSimilarityFuncOptions().dim(0))
                          .item<float>());
    std::cout << "rmse " << std::sqrt(e.mean().item<float>()) << "\n";
  }
  std::cout << "worst max-abs error " << *std::max_element(max_errs.begin(), max_errs.end())
            << ", worst cosine " << *std::min_element(cosines.begin(), cosines.end()) << "\n";
  const auto& first = qmodel.layers.front();
  auto noise = (dequantize(quantize_activations(float_model->tokens(eval_batches.front()).cpu(), first.in_qp), first.in_qp) -
                float_model->tokens(eval_batches.front()).cpu()).abs().mean();
  std::cout << "input quantisation noise " << noise.item<float>() << "\n";
}

int main() {
  QuantConfig cfg;
  const int64_t feat_dim = 80, hidden = 512, classes = 40, frames = 200, batch = 16;
  MLP model(feat_dim, hidden, classes);
  std::vector<torch::Tensor> calib, eval;
  for (int64_t i = 0; i < cfg.calib_batches; ++i) calib.push_back(torch::randn({batch, feat_dim, frames}));
  for (int i = 0; i < 8; ++i) eval.push_back(torch::randn({batch, feat_dim, frames}));

  smooth_pair(model, calib, cfg.smooth_alpha);
  auto qmodel = calibrate_and_convert(model, calib, cfg);
  std::vector<torch::Tensor> eval_tokens;
  for (const auto& feats : eval) eval_tokens.push_back(model->tokens(feats));
  auto sim = fake_quant_reference(qmodel.layers.front(), eval_tokens);
  std::cout << "simulated first-layer output " << sim.front().sizes() << "\n";
  compare_paths(model, qmodel, eval);
  return 0;
}
