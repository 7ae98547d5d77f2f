// Megatron-style tensor parallelism simulated inside one process: every
// "rank" owns a slice of each weight, collectives are emulated with plain
// tensor ops, and a stack of transformer MLP blocks built from column- and
// row-parallel linears is trained to imitate a dense float64 teacher.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace {

enum class Collective { kDirect, kRing };

struct TpConfig {
  int64_t world_size = 4;
  int64_t d_model = 256;
  int64_t d_ff = 1024;
  int64_t num_blocks = 2;
  int64_t batch = 16;
  int64_t seq_len = 64;
  int64_t steps = 2000;
  int64_t log_every = 100;
  double lr = 3e-4;
  double max_grad_norm = 1.0;
  Collective collective = Collective::kRing;
};

torch::Tensor all_gather_last_dim(const std::vector<torch::Tensor>& parts) {
  auto stacked = torch::stack(parts, 0);
  auto gathered = stacked.permute({1, 2, 0, 3});
  // FACT: s = torch.stack([torch.randn(3, 2, 4) for _ in range(4)]); y = s.permute(1, 2, 0, 3).reshape(3, 2, 16); assert is_copy_of(y, s)
  return gathered.reshape({gathered.size(0), gathered.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
}

// Each rank forwards the chunk it received on the previous hop; returns rank 0's result.
torch::Tensor ring_all_gather(const std::vector<torch::Tensor>& parts) {
  const auto ws = static_cast<int64_t>(parts.size());
  auto inflight = torch::stack(parts, 0);
  std::vector<torch::Tensor> received(parts.size());
  for (int64_t hop = 0; hop < ws; ++hop) {
    received[(ws - hop) % ws] = inflight[0].clone();  // LOOKALIKE: tensor-unnecessary-clone -- inflight is rotated in place on the next lines, so rank 0's chunk must be copied out
    auto wrap = inflight[ws - 1].clone();
    // FACT: b = torch.randn(4, 3, 2, 2); assert raises(lambda: b.narrow(0, 1, 3).copy_(b.narrow(0, 0, 3)), "single memory location")
    inflight.narrow(0, 1, ws - 1).copy_(inflight.narrow(0, 0, ws - 1));  // EXPECT: tensor-inplace-overlap
    inflight[0].copy_(wrap);
  }
  return torch::cat(received, -1);
}

torch::Tensor all_reduce_sum(const std::vector<torch::Tensor>& partials) {
  auto acc = torch::zeros({}, partials.front().options()).expand_as(partials.front());
  for (const auto& p : partials) {
    // FACT: acc = torch.zeros(()).expand(3, 2, 4); assert raises(lambda: acc.add_(torch.ones(3, 2, 4)), "single memory location")
    acc.add_(p);  // EXPECT: tensor-inplace-on-expanded
  }
  return acc;
}

torch::Tensor ring_all_reduce(const std::vector<torch::Tensor>& partials) {
  auto inflight = torch::stack(partials, 0);
  auto acc = inflight.clone();  // LOOKALIKE: tensor-unnecessary-clone -- inflight is rotated in place below, acc needs its own storage
  for (size_t hop = 1; hop < partials.size(); ++hop) {
    // FACT: b = torch.randn(4, 3, 2); r = b.roll(1, 0); assert is_copy_of(r, b); b.copy_(r)
    inflight.copy_(inflight.roll(1, 0));  // LOOKALIKE: tensor-inplace-overlap -- roll() materialises a new tensor, so source and destination never share memory
    acc.add_(inflight);
  }
  return acc[0];
}

struct ColumnParallelLinearImpl : torch::nn::Module {
  ColumnParallelLinearImpl(int64_t in, int64_t out, int64_t world_size)
      : in_features(in), out_per_rank(out / world_size) {
    for (int64_t r = 0; r < world_size; ++r) {
      weights.push_back(register_parameter("weight_" + std::to_string(r), torch::empty({out_per_rank, in})));
      biases.push_back(register_parameter("bias_" + std::to_string(r), torch::empty({out_per_rank})));
    }
    reset_parameters();
  }

  void reset_parameters() {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    for (size_t r = 0; r < weights.size(); ++r) {
      torch::nn::init::kaiming_uniform_(weights[r], std::sqrt(5.0));  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions run under their own NoGradGuard
      biases[r].uniform_(-bound, bound);  // EXPECT: tensor-inplace-on-leaf
    }
  }

  void load_from_dense(const torch::nn::Linear& dense) {
    torch::NoGradGuard no_grad;
    auto w_parts = dense->weight.chunk(static_cast<int64_t>(weights.size()), 0);
    auto b_parts = dense->bias.chunk(static_cast<int64_t>(biases.size()), 0);
    for (size_t r = 0; r < weights.size(); ++r) {
      weights[r].copy_(w_parts[r]);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ is allowed to cross devices
      biases[r].copy_(b_parts[r].to(biases[r].scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the float64->float32 conversion is explicit
    }
  }

  // Per-rank outputs, left split for a following row-parallel layer.
  std::vector<torch::Tensor> forward_shards(const torch::Tensor& x) {
    std::vector<torch::Tensor> outs;
    for (size_t r = 0; r < weights.size(); ++r) {
      auto y = torch::matmul(x, weights[r].t());
      y.add_(biases[r]);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
      outs.push_back(y);
    }
    return outs;
  }

  torch::Tensor forward(const torch::Tensor& x, Collective how) {
    auto outs = forward_shards(x);
    return how == Collective::kRing ? ring_all_gather(outs) : all_gather_last_dim(outs);
  }

  int64_t in_features;
  int64_t out_per_rank;
  std::vector<torch::Tensor> weights;
  std::vector<torch::Tensor> biases;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearImpl : torch::nn::Module {
  RowParallelLinearImpl(int64_t in, int64_t out, int64_t world_size) : out_features(out) {
    torch::NoGradGuard no_grad;
    auto full = torch::empty({out, in});
    torch::nn::init::kaiming_uniform_(full, std::sqrt(5.0));
    auto parts = full.chunk(world_size, 1);
    for (int64_t r = 0; r < world_size; ++r) {
      weights.push_back(register_parameter("weight_" + std::to_string(r), parts[r].contiguous()));
    }
    bias = register_parameter("bias", torch::zeros({out}));
  }

  void load_from_dense(const torch::nn::Linear& dense) {
    torch::NoGradGuard no_grad;
    auto parts = dense->weight.chunk(static_cast<int64_t>(weights.size()), 1);
    for (size_t r = 0; r < weights.size(); ++r) {
      weights[r].copy_(parts[r].to(weights[r].scalar_type()));
    }
    bias.copy_(dense->bias.to(bias.scalar_type()));
  }

  torch::Tensor forward_parallel(const std::vector<torch::Tensor>& shards, Collective how) {
    std::vector<torch::Tensor> partials;
    for (size_t r = 0; r < weights.size(); ++r) {
      partials.push_back(torch::matmul(shards[r], weights[r].t()));
    }
    auto reduced = how == Collective::kRing ? ring_all_reduce(partials) : all_reduce_sum(partials);
    return reduced + bias;
  }

  // Input not yet split: each rank takes its slice of the last dimension.
  torch::Tensor forward(const torch::Tensor& x) {
    auto parts = x.chunk(static_cast<int64_t>(weights.size()), -1);
    std::vector<torch::Tensor> partials;
    for (size_t r = 0; r < weights.size(); ++r) {
      // FACT: x = torch.randn(3, 2, 16); c = x.chunk(4, -1)[1]; assert is_view_of(c.view(-1, 4), x)
      auto local = parts[r].view({-1, parts[r].size(-1)});  // LOOKALIKE: tensor-view-non-contiguous -- a last-dim chunk still has mergeable leading dims, so view() succeeds
      partials.push_back(torch::matmul(local, weights[r].t()));
    }
    auto shape = x.sizes().vec();
    shape.back() = out_features;
    return (all_reduce_sum(partials) + bias).view(shape);
  }

  int64_t out_features;
  std::vector<torch::Tensor> weights;
  torch::Tensor bias;
};
TORCH_MODULE(RowParallelLinear);

struct ParallelMlpBlockImpl : torch::nn::Module {
  explicit ParallelMlpBlockImpl(const TpConfig& cfg)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})))),
        fc_in(register_module("fc_in", ColumnParallelLinear(cfg.d_model, cfg.d_ff, cfg.world_size))),
        fc_out(register_module("fc_out", RowParallelLinear(cfg.d_ff, cfg.d_model, cfg.world_size))),
        collective(cfg.collective) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto shards = fc_in->forward_shards(norm(x));
    for (auto& h : shards) {
      auto a = torch::relu(h);
      // FACT: w = torch.randn(4, 4, requires_grad=True); assert backward_fails(lambda: torch.relu(torch.randn(2, 4) @ w).pow_(2).sum().backward())
      h = a.pow_(2);  // EXPECT: tensor-inplace-on-saved
    }
    return x + fc_out->forward_parallel(shards, collective);
  }

  torch::nn::LayerNorm norm;
  ColumnParallelLinear fc_in;
  RowParallelLinear fc_out;
  Collective collective;
};
TORCH_MODULE(ParallelMlpBlock);

struct ParallelMlpImpl : torch::nn::Module {
  explicit ParallelMlpImpl(const TpConfig& cfg)
      : final_norm(register_module("final_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})))) {
    for (int64_t i = 0; i < cfg.num_blocks; ++i) {
      blocks.push_back(register_module("block_" + std::to_string(i), ParallelMlpBlock(cfg)));
    }
  }

  // Sequence-first activations, as Megatron lays them out.
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) {
      x = block->forward(x);
    }
    return final_norm(x);
  }

  std::vector<ParallelMlpBlock> blocks;
  torch::nn::LayerNorm final_norm;
};
TORCH_MODULE(ParallelMlp);

torch::Tensor clip_grad_norm_tp(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> squares;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    auto g = p.grad();
    // FACT: p = torch.randn(4, 3, requires_grad=True); (p * 3).sum().backward(); g = p.grad; g.pow_(2); assert shares_storage(g, p.grad) and p.grad[0, 0] == 9
    squares.push_back(g.pow_(2).sum());  // EXPECT: tensor-alias-then-mutate
  }
  auto total = torch::stack(squares).sum().sqrt();
  auto coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (const auto& p : params) {
    if (p.grad().defined()) p.grad().mul_(coef);
  }
  return total;
}

std::vector<double> per_rank_grad_norms(const ColumnParallelLinear& layer) {
  std::vector<torch::Tensor> squares;
  for (const auto& w : layer->weights) {
    auto g = w.grad().to(torch::kDouble);
    // FACT: g = torch.randn(8, 4); g64 = g.to(torch.float64); g64.pow_(2); assert is_copy_of(g64, g)
    g.pow_(2);  // LOOKALIKE: tensor-alias-then-mutate -- gradients are float32, so to(kDouble) returned a fresh tensor
    squares.push_back(g.sum());
  }
  auto norms = torch::stack(squares).sqrt().cpu();
  return {norms.data_ptr<double>(), norms.data_ptr<double>() + norms.numel()};
}

torch::Tensor teacher_forward(torch::nn::Linear& fc1, torch::nn::Linear& fc2, const torch::Tensor& x) {
  return fc2(torch::relu(fc1(x)).pow(2));
}

// Sharded layers loaded from the dense ones must reproduce them up to fp32 rounding.
void check_parity(torch::nn::Linear& dense_in, torch::nn::Linear& dense_out, const TpConfig& cfg,
                  torch::Device device) {
  ColumnParallelLinear col(cfg.d_model, cfg.d_ff, cfg.world_size);
  RowParallelLinear row(cfg.d_ff, cfg.d_model, cfg.world_size);
  col->to(device);
  row->to(device);
  col->load_from_dense(dense_in);
  row->load_from_dense(dense_out);

  torch::NoGradGuard no_grad;
  auto x = torch::randn({cfg.seq_len, cfg.batch, cfg.d_model}, torch::kDouble);
  auto ref_h = dense_in->forward(x);
  auto tp_h = col->forward(x.to(device, torch::kFloat), cfg.collective);
  const int64_t c = cfg.d_ff / cfg.world_size;
  for (int64_t r = 0; r < cfg.world_size; ++r) {
    // FACT: h = torch.randn(5, 2, 16); s = h.narrow(-1, 4, 4).reshape(-1, 4); assert is_view_of(s, h)
    auto dense_slice = ref_h.narrow(-1, r * c, c).reshape({-1, c});  // LOOKALIKE: tensor-reshape-non-contiguous -- narrowing the last dim leaves the leading dims mergeable, reshape is a view
    auto tp_slice = tp_h.narrow(-1, r * c, c).to(torch::kCPU, torch::kDouble).reshape({-1, c});
    std::cout << "rank " << r << " column max err "
              << (tp_slice - dense_slice).abs().max().item<double>() << "\n";
  }
  auto tp = row->forward(tp_h).to(torch::kCPU, torch::kDouble);
  auto err = tp.clone();  // EXPECT: tensor-unnecessary-clone
  err.sub_(dense_out->forward(ref_h));
  std::cout << "row-parallel max err " << err.abs().max().item<double>() << "\n";
}

}  // namespace

int main() {
  TORCH_CHECK(torch::cuda::is_available(), "the TP simulation runs on one GPU");
  const torch::Device device(torch::kCUDA);
  torch::manual_seed(0);
  TpConfig cfg;
  // Dense float64 reference, kept on the host: parity check and teacher.
  torch::nn::Linear teacher_in(cfg.d_model, cfg.d_ff);
  torch::nn::Linear teacher_out(cfg.d_ff, cfg.d_model);
  teacher_in->to(torch::kDouble);
  teacher_out->to(torch::kDouble);
  check_parity(teacher_in, teacher_out, cfg, device);

  ParallelMlp model(cfg);
  model->to(device);
  auto params = model->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.01));

  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto x_cpu = torch::randn({cfg.batch, cfg.seq_len, cfg.d_model});
    auto target = [&] {
      torch::NoGradGuard no_grad;
      return teacher_forward(teacher_in, teacher_out, x_cpu.to(torch::kDouble)).to(torch::kFloat);
    }();
    auto x = x_cpu.to(device).transpose(0, 1);
    auto pred = model->forward(x).transpose(0, 1);
    // FACT: h = torch.nn.functional.layer_norm(torch.randn(2, 3, 4).transpose(0, 1), (4,)); p = h.transpose(0, 1); assert raises(lambda: p.view(-1, 4), "view size is not compatible")
    auto flat_pred = pred.view({-1, cfg.d_model});  // EXPECT: tensor-view-non-contiguous
    auto loss = torch::mse_loss(flat_pred, target.view({-1, cfg.d_model}));  // EXPECT: tensor-device-mismatch
    opt.zero_grad();
    loss.backward();
    auto norm = clip_grad_norm_tp(params, cfg.max_grad_norm);
    opt.step();
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " loss " << loss.item<double>() << " grad norm "
                << norm.item<double>() << " rank norms";
      for (double n : per_rank_grad_norms(model->blocks.front()->fc_in)) std::cout << " " << n;
      std::cout << "\n";
    }
  }
  return 0;
}
