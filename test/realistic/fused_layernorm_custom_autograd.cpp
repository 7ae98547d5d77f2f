// Fused LayerNorm for CPU: one Welford pass per row in forward, dx/dgamma/dbeta in
// one sweep in backward. Used by a conv-stem + pre-LN transformer classifier.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <vector>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
namespace F = torch::nn::functional;

struct NormConfig {
  int64_t hidden = 64;
  double eps = 1e-5;
  double max_gamma = 8.0;
};

struct TrainConfig {
  int64_t batch_size = 16;
  int64_t steps_per_epoch = 20;
  int64_t epochs = 3;
  int64_t num_classes = 10;
  int64_t image_size = 32;
  int64_t num_blocks = 2;
  double lr = 3e-4;
};

class FusedLayerNormFunction
    : public torch::autograd::Function<FusedLayerNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor weight, torch::Tensor bias,
                               double eps) {
    TORCH_CHECK(input.device().is_cpu() && input.scalar_type() == torch::kFloat,
                "FusedLayerNorm: CPU float32 only");
    const int64_t hidden = input.size(-1);
    auto x2d = input.reshape({-1, hidden});
    const int64_t rows = x2d.size(0);

    auto mean = torch::empty({rows}, x2d.options()), rstd = torch::empty({rows}, x2d.options());
    auto xa = x2d.accessor<float, 2>();
    auto ma = mean.accessor<float, 1>();
    auto ra = rstd.accessor<float, 1>();
    for (int64_t r = 0; r < rows; ++r) {
      double m = 0.0, m2 = 0.0;
      for (int64_t c = 0; c < hidden; ++c) {
        const double v = xa[r][c];
        const double delta = v - m;
        m += delta / static_cast<double>(c + 1);
        m2 += delta * (v - m);
      }
      ma[r] = static_cast<float>(m);
      ra[r] = static_cast<float>(1.0 / std::sqrt(m2 / hidden + eps));
    }

    // FACT: x = torch.randn(2, 3, 8); assert is_view_of(x.reshape(-1, 8), x)
    torch::Tensor x_hat = x2d;
    x_hat.sub_(mean.unsqueeze(1)).mul_(rstd.unsqueeze(1));  // EXPECT: tensor-alias-then-mutate
    auto out = torch::addcmul(bias, x_hat, weight);
    ctx->save_for_backward({x_hat, rstd, weight});
    return out.view(input.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto x_hat = saved[0], rstd = saved[1], weight = saved[2];
    const int64_t rows = x_hat.size(0), hidden = x_hat.size(1);

    // FACT: g = torch.randn(2, 8, 3).transpose(1, 2); assert raises(lambda: g.view(-1, 8)) and g.contiguous().view(-1, 8).shape == (6, 8)
    auto go = grad_outputs[0].contiguous().view({-1, hidden});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() comes first, so the view always succeeds
    auto grad_input = torch::empty_like(go);
    auto dgamma = torch::zeros({hidden}, go.options().dtype(torch::kDouble));
    auto dbeta = torch::zeros({hidden}, go.options().dtype(torch::kDouble));

    auto ga = go.accessor<float, 2>();
    auto xa = x_hat.accessor<float, 2>();
    auto wa = weight.accessor<float, 1>();
    auto ra = rstd.accessor<float, 1>();
    auto gia = grad_input.accessor<float, 2>();
    auto dga = dgamma.accessor<double, 1>();
    auto dba = dbeta.accessor<double, 1>();
    for (int64_t r = 0; r < rows; ++r) {
      double sum_dyw = 0.0, sum_dyw_xhat = 0.0;
      for (int64_t c = 0; c < hidden; ++c) {
        const double dy = ga[r][c];
        const double dyw = dy * wa[c];
        sum_dyw += dyw;
        sum_dyw_xhat += dyw * xa[r][c];
        dga[c] += dy * xa[r][c];
        dba[c] += dy;
      }
      const double inv_h = 1.0 / static_cast<double>(hidden);
      for (int64_t c = 0; c < hidden; ++c) {
        const double dyw = static_cast<double>(ga[r][c]) * wa[c];
        gia[r][c] = static_cast<float>(
            ra[r] * (dyw - inv_h * sum_dyw - xa[r][c] * inv_h * sum_dyw_xhat));
      }
    }

    auto grad_weight = torch::empty_like(weight);
    auto grad_bias = torch::empty_like(weight);
    grad_weight.copy_(dgamma);  // EXPECT: tensor-copy-narrowing
    grad_bias.copy_(dbeta.to(grad_bias.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double->float conversion is spelled out with to()
    return {grad_input.view(grad_outputs[0].sizes()), grad_weight, grad_bias,
            torch::Tensor()};
  }
};

class FusedLayerNormImpl : public torch::nn::Module {
 public:
  explicit FusedLayerNormImpl(const NormConfig& cfg) : cfg_(cfg) {
    weight = register_parameter("weight", torch::empty({cfg.hidden}));
    bias = register_parameter("bias", torch::empty({cfg.hidden}));
    reset_parameters();
  }

  void reset_parameters() {
    torch::nn::init::ones_(weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init fills under a NoGradGuard
    torch::nn::init::zeros_(bias);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    return FusedLayerNormFunction::apply(x, weight, bias, cfg_.eps);
  }

  // Keeps gamma from blowing up with the high LR warm start.
  void clamp_gamma() { weight.clamp_(-cfg_.max_gamma, cfg_.max_gamma); }  // EXPECT: tensor-inplace-on-leaf

  torch::Tensor weight, bias;

 private:
  NormConfig cfg_;
};
TORCH_MODULE(FusedLayerNorm);

// LayerNorm over the channels of an NCHW feature map.
class ChannelNormImpl : public torch::nn::Module {
 public:
  explicit ChannelNormImpl(const NormConfig& cfg)
      : norm(register_module("norm", FusedLayerNorm(cfg))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
    // FACT: x = torch.randn(2, 4, 3, 3); assert is_copy_of(x.permute(0, 2, 3, 1).reshape(-1, 4), x)
    auto rows = x.permute({0, 2, 3, 1}).reshape({-1, C});  // EXPECT: tensor-reshape-non-contiguous
    return norm(rows).view({B, H, W, C}).permute({0, 3, 1, 2});
  }

  FusedLayerNorm norm{nullptr};
};
TORCH_MODULE(ChannelNorm);

class EncoderBlockImpl : public torch::nn::Module {
 public:
  explicit EncoderBlockImpl(const NormConfig& cfg)
      : scale_(1.0 / std::sqrt(static_cast<double>(cfg.hidden))) {
    const int64_t h = cfg.hidden;
    ln1 = register_module("ln1", FusedLayerNorm(cfg));
    ln2 = register_module("ln2", FusedLayerNorm(cfg));
    qk = register_module("qk", torch::nn::Linear(h, 2 * h));
    v = register_module("v", torch::nn::Linear(h, h));
    proj = register_module("proj", torch::nn::Linear(h, h));
    fc1 = register_module("fc1", torch::nn::Linear(h, 4 * h));
    fc2 = register_module("fc2", torch::nn::Linear(4 * h, h));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& pos,
                        const torch::Tensor& pad_mask) {
    auto h = ln1(x);
    auto qk_out = qk(h + pos).chunk(2, -1);
    auto scores = torch::matmul(qk_out[0], qk_out[1].transpose(-2, -1)) * scale_;
    scores.masked_fill_(pad_mask.unsqueeze(1), -1e4);  // LOOKALIKE: tensor-inplace-on-saved -- matmul and a scalar mul do not save their output; masking happens before softmax
    auto attn = torch::softmax(scores, -1);
    attn.masked_fill_(pad_mask.unsqueeze(2), 0.0);  // EXPECT: tensor-inplace-on-saved
    x = x + proj(torch::matmul(attn, v(h)));
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }

  FusedLayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qk{nullptr}, v{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};

 private:
  double scale_;
};
TORCH_MODULE(EncoderBlock);

class HybridNetImpl : public torch::nn::Module {
 public:
  HybridNetImpl(const NormConfig& cfg, const TrainConfig& tc) {
    const int64_t grid = tc.image_size / 4;
    stem = register_module(
        "stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, cfg.hidden, 4).stride(4)));
    cnorm = register_module("cnorm", ChannelNorm(cfg));
    // Stored channel-major, the layout of the converted checkpoint.
    pos_table = register_parameter("pos_table", torch::empty({cfg.hidden, grid * grid}));
    torch::nn::init::normal_(pos_table, 0.0, 0.02);
    for (int64_t i = 0; i < tc.num_blocks; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), EncoderBlock(cfg)));
    }
    final_ln = register_module("final_ln", FusedLayerNorm(cfg));
    head = register_module("head", torch::nn::Linear(cfg.hidden, tc.num_classes));
    aux_head = register_module("aux_head", torch::nn::Linear(cfg.hidden, tc.num_classes));
  }

  torch::Tensor conv_features(const torch::Tensor& images) { return cnorm(stem(images)); }

  // Pooled token features; the classifier head runs on them.
  torch::Tensor features(const torch::Tensor& images, const torch::Tensor& pad_mask) {
    auto feat = conv_features(images);
    // FACT: x = torch.randn(2, 4, 3, 3); assert is_view_of(x.permute(0, 2, 3, 1).flatten(1, 2), x)
    auto x = feat.permute({0, 2, 3, 1}).flatten(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent after the permute, flatten(1, 2) is a view
    for (auto& blk : blocks) {
      x = blk->forward(x, pos_table.t().contiguous(), pad_mask);  // EXPECT: tensor-clone-in-loop
    }
    return final_ln(x).mean(1);
  }

  torch::Tensor aux_logits(const torch::Tensor& feat) {
    const auto B = feat.size(0), C = feat.size(1);
    // FACT: y = torch.randn(2, 3, 3, 4).permute(0, 3, 1, 2); assert not raises(lambda: y.view(2, 4, -1)) and is_view_of(y.view(2, 4, -1), y)
    return aux_head(feat.view({B, C, -1}).mean(-1));  // LOOKALIKE: tensor-view-non-contiguous -- merging H and W of the permuted map is still expressible with strides
  }

  // Flat conv features for the linear probe run after training.
  torch::Tensor probe_input(const torch::Tensor& images) {
    auto feat = conv_features(images);
    // FACT: y = torch.randn(2, 3, 3, 4).permute(0, 3, 1, 2); assert raises(lambda: y.view(2, -1), "view size is not compatible")
    return feat.view({feat.size(0), -1});  // EXPECT: tensor-view-non-contiguous
  }

  void clamp_gammas() {
    cnorm->norm->clamp_gamma();
    for (auto& blk : blocks) {
      blk->ln1->clamp_gamma();
      blk->ln2->clamp_gamma();
    }
    final_ln->clamp_gamma();
  }

  torch::nn::Conv2d stem{nullptr};
  ChannelNorm cnorm{nullptr};
  std::vector<EncoderBlock> blocks;
  FusedLayerNorm final_ln{nullptr};
  torch::nn::Linear head{nullptr}, aux_head{nullptr};
  torch::Tensor pos_table;
};
TORCH_MODULE(HybridNet);

double activation_rms(const torch::Tensor& y) {
  auto a = y.detach();
  a.pow_(2);  // EXPECT: tensor-inplace-on-detached
  return a.mean().sqrt().item<double>();
}

double mean_entropy(const torch::Tensor& logits) {
  auto p = logits.detach().softmax(-1);
  p.clamp_min_(1e-8);  // LOOKALIKE: tensor-inplace-on-detached -- softmax returned a new tensor; logits is untouched
  return -(p * p.log()).sum(-1).mean().item<double>();
}

// Compares the fused kernel with torch::layer_norm on a random batch.
bool verify_against_reference(const NormConfig& cfg) {
  FusedLayerNorm ln(cfg);
  auto x = torch::randn({4, 7, cfg.hidden});
  auto ref = torch::layer_norm(x, {cfg.hidden}, ln->weight, ln->bias, cfg.eps);
  auto out = ln(x);
  // FACT: a = torch.randn(4, 8); b = torch.randn(4, 8); assert is_copy_of(a - b, a) and is_copy_of(a - b, b)
  auto diff = out - ref;
  diff.abs_();  // LOOKALIKE: tensor-alias-then-mutate -- the subtraction made a new tensor, out and ref are unchanged
  std::printf("fused vs reference: max abs err %.3e\n", diff.max().item<double>());
  return diff.max().item<double>() < 1e-4;
}

int main() {
  torch::manual_seed(0);
  NormConfig cfg;
  TrainConfig tc;
  if (!verify_against_reference(cfg)) std::fprintf(stderr, "warning: fused LN != layer_norm\n");

  HybridNet model(cfg, tc);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(tc.lr).weight_decay(0.05));
  const int64_t tokens = (tc.image_size / 4) * (tc.image_size / 4);
  std::vector<torch::Tensor> history;

  for (int64_t epoch = 0; epoch < tc.epochs; ++epoch) {
    model->train();
    torch::Tensor running_loss = torch::zeros({});
    for (int64_t step = 0; step < tc.steps_per_epoch; ++step) {
      auto images = torch::randn({tc.batch_size, 3, tc.image_size, tc.image_size});
      auto labels = torch::randint(tc.num_classes, {tc.batch_size}, torch::kLong);
      auto pad_mask = torch::zeros({tc.batch_size, tokens}, torch::kBool);
      pad_mask.narrow(1, tokens - 4, 4).fill_(step % 2 == 0);
      opt.zero_grad();
      auto feats = model->features(images, pad_mask);
      auto logits = model->head(feats);
      auto aux = model->aux_logits(model->conv_features(images));
      auto loss = F::cross_entropy(logits, labels) + 0.3 * F::cross_entropy(aux, labels);
      if (step % 10 == 0) {
        std::printf("  step %lld feat rms %.4f entropy %.3f\n", static_cast<long long>(step),
                    activation_rms(feats), mean_entropy(logits));
      }
      loss.backward();
      opt.step();
      model->clamp_gammas();

      running_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      history.push_back(loss.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- only the detached value is kept
    }
    std::printf("epoch %lld mean loss %.4f\n", static_cast<long long>(epoch),
                running_loss.item<double>() / static_cast<double>(tc.steps_per_epoch));
  }

  torch::NoGradGuard no_grad;
  model->eval();
  auto probe = model->probe_input(torch::randn({8, 3, tc.image_size, tc.image_size}));
  std::printf("probe features: %lld\n", static_cast<long long>(probe.size(1)));
  return 0;
}
