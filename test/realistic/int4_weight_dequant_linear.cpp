// Weight-only int4 linear layer: asymmetric RTN quantization with one scale and
// one zero point per group of input channels, two codes per byte. The forward
// dequantizes to float and runs a dense GEMM; scales stay trainable so they can be
// tuned against the fp16/fp32 MLP on a few calibration batches.
#include <torch/torch.h>

#include <cstdio>
#include <vector>

namespace F = torch::nn::functional;

struct Int4Config {
  int64_t in_features = 256;
  int64_t out_features = 512;
  int64_t group_size = 64;
};

struct QuantizedWeight {
  torch::Tensor packed;
  torch::Tensor scales;
  torch::Tensor zeros;
};

// Two codes per byte, low nibble first.
torch::Tensor pack_int4(const torch::Tensor& codes) {
  auto pairs = codes.to(torch::kUInt8).view({codes.size(0), -1, 2});
  auto shifts = torch::tensor(
      {0, 4}, torch::TensorOptions().dtype(torch::kUInt8).device(codes.device()));  // LOOKALIKE: tensor-device-mismatch -- the shift table is created on the codes' device
  return torch::bitwise_left_shift(pairs, shifts).sum(-1).to(torch::kUInt8);
}

torch::Tensor unpack_int4(const torch::Tensor& packed) {
  static const torch::Tensor shifts = torch::tensor({0, 4}, torch::kUInt8);
  auto codes = torch::bitwise_right_shift(packed.unsqueeze(-1), shifts).bitwise_and(0x0F);  // EXPECT: tensor-device-mismatch
  // FACT: p = torch.randint(0, 255, (4, 8), dtype=torch.uint8); c = torch.bitwise_right_shift(p.unsqueeze(-1), torch.tensor([0, 4], dtype=torch.uint8)).bitwise_and(15); assert is_contiguous(c) and is_view_of(c.view(4, -1), c)
  return codes.view({packed.size(0), -1});  // LOOKALIKE: tensor-view-non-contiguous -- the shift result is a fresh contiguous tensor
}

// Round-to-nearest with per-group min/max.
QuantizedWeight quantize_rtn(const torch::Tensor& weight, int64_t group_size) {
  const int64_t out = weight.size(0), in = weight.size(1);
  // FACT: w = torch.randn(4, 16); assert is_view_of(w.to(torch.float32).reshape(4, 2, 8), w)
  auto w = weight.to(torch::kFloat).reshape({out, in / group_size, group_size});
  auto wmin = w.amin(-1, /*keepdim=*/true).clamp_max(0.0);
  auto wmax = w.amax(-1, /*keepdim=*/true).clamp_min(0.0);
  auto scale = ((wmax - wmin) / 15.0).clamp_min(1e-8);
  auto zero = -wmin / scale;
  w.div_(scale).add_(zero).round_().clamp_(0, 15);  // EXPECT: tensor-alias-then-mutate
  return {pack_int4(w.view({out, in})), scale.squeeze(-1), zero.squeeze(-1)};
}

class Int4LinearImpl : public torch::nn::Module {
 public:
  explicit Int4LinearImpl(const Int4Config& cfg) : cfg_(cfg) {
    TORCH_CHECK(cfg.in_features % cfg.group_size == 0, "in_features % group_size != 0");
    const int64_t ngroups = cfg.in_features / cfg.group_size;
    packed = register_buffer(
        "packed", torch::zeros({cfg.out_features, cfg.in_features / 2}, torch::kUInt8));
    zeros = register_buffer("zeros", torch::zeros({cfg.out_features, ngroups}, torch::kUInt8));
    scales = register_parameter("scales", torch::ones({cfg.out_features, ngroups}));
    bias = register_parameter("bias", torch::zeros({cfg.out_features}));
  }

  void load(const QuantizedWeight& qw, const torch::Tensor& fp_bias) {
    torch::NoGradGuard no_grad;
    packed.copy_(qw.packed);
    scales.copy_(qw.scales);
    zeros.copy_(qw.zeros);  // EXPECT: tensor-copy-narrowing
    if (fp_bias.defined()) bias.copy_(fp_bias);
    cached_ = torch::Tensor();
  }

  // Differentiable in the scales: used while tuning them.
  torch::Tensor dequantize() const {
    const int64_t ngroups = cfg_.in_features / cfg_.group_size;
    auto q = unpack_int4(packed).to(torch::kFloat).view({cfg_.out_features, ngroups, cfg_.group_size});
    auto w = (q - zeros.to(torch::kFloat).unsqueeze(-1)) * scales.unsqueeze(-1);
    // FACT: q = torch.rand(4, 2, 8); s = torch.rand(4, 2); w = (q - 1) * s.unsqueeze(-1); assert is_view_of(w.reshape(4, 16), w)
    return w.reshape({cfg_.out_features, cfg_.in_features});  // LOOKALIKE: tensor-reshape-non-contiguous -- the elementwise result is contiguous, reshape is a view
  }

  // Dequantize once for inference; the dense weight is reused by forward().
  void freeze() {
    torch::NoGradGuard no_grad;
    const int64_t ngroups = cfg_.in_features / cfg_.group_size;
    auto q = unpack_int4(packed).to(torch::kFloat).view({cfg_.out_features, ngroups, cfg_.group_size});
    // FACT: p = torch.randint(0, 16, (4, 16), dtype=torch.uint8); assert is_copy_of(p.to(torch.float32), p)
    q.sub_(zeros.to(torch::kFloat).unsqueeze(-1));  // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float always allocates, packed is not touched
    // FACT: q = torch.rand(4, 2, 8); s = torch.rand(4, 2); assert not raises(lambda: q.mul_(s.unsqueeze(-1).expand_as(q)))
    q.mul_(scales.unsqueeze(-1).expand_as(q));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded scales are only read; q is dense
    cached_ = q.view({cfg_.out_features, cfg_.in_features});
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto w = cached_.defined() ? cached_ : dequantize();
    return torch::matmul(x, w.t()) + bias;
  }

  // Serving path for 2-D activations once frozen.
  torch::Tensor forward_frozen(const torch::Tensor& x2d) {
    torch::NoGradGuard no_grad;
    TORCH_CHECK(cached_.defined(), "call freeze() first");
    auto out = bias.expand({x2d.size(0), cfg_.out_features});
    // FACT: assert raises(lambda: torch.zeros(4).expand(3, 4).addmm_(torch.randn(3, 5), torch.randn(5, 4)), "more than one element")
    out.addmm_(x2d, cached_.t());  // EXPECT: tensor-inplace-on-expanded // LOOKALIKE: tensor-inplace-on-leaf -- grad mode is off for the whole serving path
    return out;
  }

  const Int4Config& config() const { return cfg_; }

  torch::Tensor packed, zeros, scales, bias;

 private:
  Int4Config cfg_;
  torch::Tensor cached_;
};
TORCH_MODULE(Int4Linear);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t d_model, int64_t d_ff)
      : gate(register_module("gate", torch::nn::Linear(d_model, d_ff))),
        up(register_module("up", torch::nn::Linear(d_model, d_ff))),
        down(register_module("down", torch::nn::Linear(d_ff, d_model))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    return down(torch::silu(gate(x)) * up(x));
  }

  torch::nn::Linear gate, up, down;
};
TORCH_MODULE(Mlp);

class QuantMlpImpl : public torch::nn::Module {
 public:
  QuantMlpImpl(int64_t d_model, int64_t d_ff, int64_t group_size)
      : gate(register_module("gate", Int4Linear(Int4Config{d_model, d_ff, group_size}))),
        up(register_module("up", Int4Linear(Int4Config{d_model, d_ff, group_size}))),
        down(register_module("down", Int4Linear(Int4Config{d_ff, d_model, group_size}))) {}

  void load_from(Mlp& ref) {
    torch::NoGradGuard no_grad;
    const int64_t gs = gate->config().group_size;
    gate->load(quantize_rtn(ref->gate->weight, gs), ref->gate->bias);
    up->load(quantize_rtn(ref->up->weight, gs), ref->up->bias);
    down->load(quantize_rtn(ref->down->weight, gs), ref->down->bias);
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto a = gate(x);
    auto g = torch::sigmoid(a);
    g.mul_(a);  // EXPECT: tensor-inplace-on-saved
    return down(g * up(x));
  }

  std::vector<torch::Tensor> group_scales() { return {gate->scales, up->scales, down->scales}; }

  Int4Linear gate, up, down;
};
TORCH_MODULE(QuantMlp);

// Quantization error of one weight in units of its group's step size.
torch::Tensor error_in_lsb(const torch::Tensor& weight, Int4Linear& layer) {
  torch::NoGradGuard no_grad;
  const auto& cfg = layer->config();
  const int64_t ngroups = cfg.in_features / cfg.group_size;
  // FACT: s = torch.rand(4, 2); assert is_copy_of(s.unsqueeze(-1).expand(4, 2, 8).reshape(4, 16), s)
  auto step = layer->scales.unsqueeze(-1)
                  .expand({cfg.out_features, ngroups, cfg.group_size})
                  .reshape({cfg.out_features, cfg.in_features});  // EXPECT: tensor-reshape-non-contiguous
  return (weight - layer->dequantize()).abs() / step;
}

// GPTQ-style export: eight codes per int32 along K, scales stored fp16.
std::vector<torch::Tensor> export_gptq(Int4Linear& layer) {
  torch::NoGradGuard no_grad;
  auto codes = unpack_int4(layer->packed.cpu()).to(torch::kInt32);
  const int64_t out = codes.size(0), in = codes.size(1);
  auto shifts = torch::arange(0, 32, 4, codes.options()).view({1, 8, 1});
  // FACT: c = torch.randint(0, 16, (6, 16), dtype=torch.int32); assert is_view_of(c.t().view(2, 8, 6), c)
  auto grouped = codes.t().view({in / 8, 8, out});  // LOOKALIKE: tensor-view-non-contiguous -- only splits dim 0 of the transposed matrix, always a view
  auto qweight = torch::bitwise_left_shift(grouped, shifts).sum(1).to(torch::kInt32);
  auto scales_fp16 = torch::empty({layer->scales.size(1), out}, torch::kHalf);
  scales_fp16.copy_(layer->scales.t().to(torch::kHalf));  // LOOKALIKE: tensor-copy-narrowing -- the fp16 conversion is explicit
  return {qweight, scales_fp16, layer->zeros.t().contiguous().cpu()};
}

double layer_error(Int4Linear& q, torch::nn::Linear& fp, const std::vector<torch::Tensor>& batches,
                   torch::Device device) {
  torch::NoGradGuard no_grad;
  auto w_deq = q->dequantize();
  auto err_sum = torch::zeros({}, w_deq.options());
  for (const auto& xb : batches) {
    auto x = xb.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    auto wt = w_deq.t().contiguous();  // EXPECT: tensor-clone-in-loop
    auto y = torch::mm(x, wt) + q->bias;
    auto err = fp(x).clone().sub_(y);  // EXPECT: tensor-unnecessary-clone
    err_sum += err.pow(2).mean();  // LOOKALIKE: tensor-sync-in-loop -- accumulated on the device and read once after the loop
  }
  return err_sum.item<double>() / static_cast<double>(batches.size());
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const int64_t d_model = 256, d_ff = 512, group_size = 64, tune_steps = 200;

  Mlp ref(d_model, d_ff);
  ref->to(device);
  ref->eval();
  std::vector<torch::Tensor> calib;
  for (int i = 0; i < 16; ++i) calib.push_back(torch::randn({32, d_model}));

  QuantMlp qmlp(d_model, d_ff, group_size);
  qmlp->to(device);
  qmlp->load_from(ref);
  std::printf("gate rmse before tuning: %.5f\n", layer_error(qmlp->gate, ref->gate, calib, device));

  // Tune the group scales to match the reference MLP output.
  torch::optim::Adam opt(qmlp->group_scales(), torch::optim::AdamOptions(1e-4));
  double total_loss = 0.0;
  for (int64_t step = 0; step < tune_steps; ++step) {
    auto x = calib[static_cast<size_t>(step) % calib.size()].to(device);
    torch::Tensor target;
    {
      torch::NoGradGuard no_grad;
      target = ref(x);
    }
    auto loss = F::mse_loss(qmlp(x), target);
    opt.zero_grad();
    loss.backward();
    opt.step();
    for (auto& s : qmlp->group_scales()) {
      s.clamp_min_(1e-6);  // EXPECT: tensor-inplace-on-leaf
    }
    total_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
  }
  std::printf("mean tuning loss %.6f\n", total_loss / static_cast<double>(tune_steps));

  for (auto* layer : {&qmlp->gate, &qmlp->up, &qmlp->down}) (*layer)->freeze();
  auto lsb = error_in_lsb(ref->gate->weight, qmlp->gate);
  std::printf("gate max error %.3f LSB\n", lsb.max().item<double>());
  auto y = qmlp->down->forward_frozen(torch::randn({8, d_ff}, device));
  auto exported = export_gptq(qmlp->gate);
  std::printf("frozen out %lld, qweight %lld x %lld\n", static_cast<long long>(y.size(1)),
              static_cast<long long>(exported[0].size(0)), static_cast<long long>(exported[0].size(1)));
  return 0;
}
