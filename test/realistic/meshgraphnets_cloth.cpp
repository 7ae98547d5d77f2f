// MeshGraphNets (Pfaff et al., 2021) cloth model: noise-injected training, autoregressive rollout.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace mgn {

constexpr int64_t kNormal = 0, kHandle = 3, kNumTypes = 9;
constexpr int64_t kEdgeFeatures = 7;  // rel. world pos, its norm, rel. mesh pos, its norm

struct MGNConfig {
  int64_t latent = 128;
  int64_t mp_steps = 15;
  int64_t history = 3;
  double noise_std = 3e-3;
  double lr = 1e-4;
  double ema_decay = 0.999;
  int64_t train_steps = 200000, accumulate_steps = 1000, log_every = 1000;
  int64_t rollout_steps = 398;
};

struct ClothTrajectory {
  torch::Tensor world_pos, mesh_pos, node_type, cells, edge_index;
};

torch::Tensor edges_from_cells(const torch::Tensor& cells) {
  auto a = cells.select(1, 0), b = cells.select(1, 1), c = cells.select(1, 2);
  auto s = torch::cat({a, b, c}), r = torch::cat({b, c, a});
  auto packed = torch::stack({torch::minimum(s, r), torch::maximum(s, r)}, 1);
  auto uniq = std::get<0>(torch::unique_dim(packed, 0));
  auto lo = uniq.select(1, 0), hi = uniq.select(1, 1);
  return torch::stack({torch::cat({lo, hi}), torch::cat({hi, lo})});
}

ClothTrajectory load_trajectory(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  int64_t dims[3];
  in.read(reinterpret_cast<char*>(dims), sizeof(dims));
  const int64_t T = dims[0], N = dims[1], F = dims[2];
  auto read = [&in](std::vector<int64_t> shape, torch::ScalarType dtype) {
    auto t = torch::empty(shape, dtype);
    in.read(reinterpret_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    return t;
  };
  ClothTrajectory tr;
  tr.world_pos = read({T, N, 3}, torch::kFloat64).to(torch::kFloat);
  tr.mesh_pos = read({N, 2}, torch::kFloat64).to(torch::kFloat);
  tr.node_type = read({N}, torch::kInt64);
  tr.cells = read({F, 3}, torch::kInt64);
  tr.edge_index = edges_from_cells(tr.cells);
  return tr;
}

torch::nn::Sequential make_mlp(int64_t in, int64_t latent, int64_t out, bool layer_norm = true) {
  torch::nn::Sequential mlp(torch::nn::Linear(in, latent), torch::nn::ReLU(), torch::nn::Linear(latent, latent),
                            torch::nn::ReLU(), torch::nn::Linear(latent, out));
  if (layer_norm) mlp->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({out})));
  return mlp;
}

// Online mean/std of the features seen during the first training steps.
struct NormalizerImpl : torch::nn::Module {
  explicit NormalizerImpl(int64_t size, double std_eps = 1e-8) : std_eps_(std_eps) {
    count_ = register_buffer("count", torch::zeros({1}));
    sum_ = register_buffer("sum", torch::zeros({size}));
    sum_sq_ = register_buffer("sum_sq", torch::zeros({size}));
  }
  torch::Tensor forward(const torch::Tensor& x, bool accumulate) {
    if (accumulate) {
      torch::NoGradGuard no_grad;
      sum_ += x.sum(0);
      sum_sq_ += x.pow(2).sum(0);
      count_ += x.size(0);
    }
    return (x - mean()) / stddev();
  }
  torch::Tensor mean() const { return sum_ / count_.clamp_min(1.0); }
  torch::Tensor stddev() const {
    return (sum_sq_ / count_.clamp_min(1.0) - mean().pow(2)).clamp_min(0.0).sqrt().clamp_min(std_eps_);
  }

  double std_eps_;
  torch::Tensor count_, sum_, sum_sq_;
};
TORCH_MODULE(Normalizer);

struct GraphNetBlockImpl : torch::nn::Module {
  explicit GraphNetBlockImpl(int64_t latent) {
    edge_mlp_ = register_module("edge_mlp", make_mlp(3 * latent, latent, latent));
    node_mlp_ = register_module("node_mlp", make_mlp(2 * latent, latent, latent));
  }

  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& nodes, const torch::Tensor& edges,
                                                   const torch::Tensor& senders, const torch::Tensor& receivers) {
    auto new_edges = edge_mlp_->forward(
        torch::cat({edges, nodes.index_select(0, senders), nodes.index_select(0, receivers)}, -1));
    auto agg = torch::zeros({nodes.size(0), new_edges.size(1)}, new_edges.options()).index_add_(0, receivers, new_edges);
    auto new_nodes = node_mlp_->forward(torch::cat({nodes, agg}, -1));
    return {nodes + new_nodes, edges + new_edges};
  }

  torch::nn::Sequential edge_mlp_{nullptr}, node_mlp_{nullptr};
};
TORCH_MODULE(GraphNetBlock);

struct EncodeProcessDecodeImpl : torch::nn::Module {
  EncodeProcessDecodeImpl(int64_t node_in, int64_t edge_in, int64_t latent, int64_t steps, int64_t out) {
    node_enc_ = register_module("node_enc", make_mlp(node_in, latent, latent));
    edge_enc_ = register_module("edge_enc", make_mlp(edge_in, latent, latent));
    for (int64_t i = 0; i < steps; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), GraphNetBlock(latent)));
    decoder_ = register_module("decoder", make_mlp(latent, latent, out, /*layer_norm=*/false));
  }

  torch::Tensor forward(const torch::Tensor& node_feats, const torch::Tensor& edge_feats,
                        const torch::Tensor& edge_index) {
    auto nodes = node_enc_->forward(node_feats);
    auto edges = edge_enc_->forward(edge_feats);
    for (auto& block : blocks_) {
      // FACT: ei=torch.randint(0,9,(2,12)); s=ei[0]; assert is_contiguous(s) and s.contiguous().data_ptr()==s.data_ptr()
      auto senders = edge_index[0].contiguous();  // LOOKALIKE: tensor-clone-in-loop -- a row of the contiguous edge index is already contiguous, so no copy is made
      std::tie(nodes, edges) = block->forward(nodes, edges, senders, edge_index[1]);
    }
    return decoder_->forward(nodes);
  }

  torch::nn::Sequential node_enc_{nullptr}, edge_enc_{nullptr}, decoder_{nullptr};
  std::vector<GraphNetBlock> blocks_;
};
TORCH_MODULE(EncodeProcessDecode);

torch::Tensor velocity_features(const torch::Tensor& window) {
  auto vel = torch::diff(window, 1, 0);
  // FACT: w=torch.randn(4,6,3); v=torch.diff(w,dim=0).permute(1,0,2); assert raises(lambda: v.view(6,-1), "view size is not compatible")
  return vel.permute({1, 0, 2}).view({vel.size(1), -1});  // EXPECT: tensor-view-non-contiguous
}

torch::Tensor edge_features(const torch::Tensor& pos, const torch::Tensor& mesh_pos, const torch::Tensor& edge_index) {
  auto s = edge_index[0], r = edge_index[1];
  auto rel_world = pos.index_select(0, s) - pos.index_select(0, r);
  auto rel_mesh = mesh_pos.index_select(0, s) - mesh_pos.index_select(0, r);
  return torch::cat({rel_world, rel_world.pow(2).sum(-1, true).sqrt(), rel_mesh, rel_mesh.pow(2).sum(-1, true).sqrt()}, -1);
}

torch::Tensor position_noise(const torch::Tensor& pos, const torch::Tensor& node_type, double std_dev) {
  auto sigma = torch::full({1, pos.size(1)}, std_dev, pos.options()).expand_as(pos);
  // FACT: s=torch.full((1,3),3e-3).expand(5,3); assert raises(lambda: s.mul_(torch.ones(5,1,dtype=torch.bool)), "more than one element of the written-to tensor")
  sigma.mul_((node_type == kNormal).unsqueeze(-1));  // EXPECT: tensor-inplace-on-expanded
  return torch::randn_like(pos) * sigma;
}

struct ClothSimulatorImpl : torch::nn::Module {
  explicit ClothSimulatorImpl(const MGNConfig& c) : history_(c.history) {
    const int64_t node_in = 3 * c.history + kNumTypes;
    model_ = register_module("model", EncodeProcessDecode(node_in, kEdgeFeatures, c.latent, c.mp_steps, 3));
    node_norm_ = register_module("node_norm", Normalizer(node_in));
    edge_norm_ = register_module("edge_norm", Normalizer(kEdgeFeatures));
    out_norm_ = register_module("out_norm", Normalizer(3));
  }

  // Normalised acceleration of the newest frame in `window`.
  torch::Tensor forward(const torch::Tensor& window, const torch::Tensor& mesh_pos, const torch::Tensor& node_type,
                        const torch::Tensor& edge_index, bool accumulate) {
    auto onehot = torch::one_hot(node_type, kNumTypes).to(window.scalar_type());
    auto nodes = node_norm_->forward(torch::cat({velocity_features(window), onehot}, -1), accumulate);
    auto edges = edge_norm_->forward(edge_features(window[history_], mesh_pos, edge_index), accumulate);
    return model_->forward(nodes, edges, edge_index);
  }

  torch::Tensor predict_acceleration(const torch::Tensor& window, const torch::Tensor& mesh_pos,
                                     const torch::Tensor& node_type, const torch::Tensor& edge_index) {
    auto acc = forward(window, mesh_pos, node_type, edge_index, /*accumulate=*/false);
    // FACT: a=torch.randn(5,3); s=torch.rand(3).expand_as(a); a.mul_(s); assert s.stride(0)==0 and is_contiguous(a)
    acc.mul_(out_norm_->stddev().expand_as(acc)).add_(out_norm_->mean().expand_as(acc));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded statistics are only read; acc itself is dense
    return acc;
  }

  Normalizer& out_norm() { return out_norm_; }

  int64_t history_;
  EncodeProcessDecode model_{nullptr};
  Normalizer node_norm_{nullptr}, edge_norm_{nullptr}, out_norm_{nullptr};
};
TORCH_MODULE(ClothSimulator);

void ema_update(ClothSimulator& ema, const ClothSimulator& online, double decay) {
  torch::NoGradGuard no_grad;
  auto dst = ema->parameters(), src = online->parameters();
  for (size_t i = 0; i < dst.size(); ++i)
    dst[i].detach().mul_(decay).add_(src[i].detach(), 1.0 - decay);  // LOOKALIKE: tensor-inplace-on-detached -- overwriting the EMA weights is the point, under NoGradGuard
  auto dst_buf = ema->buffers(), src_buf = online->buffers();
  for (size_t i = 0; i < dst_buf.size(); ++i) dst_buf[i].copy_(src_buf[i]);
}

void train(ClothSimulator& sim, ClothSimulator& ema, const std::vector<ClothTrajectory>& data,
           const MGNConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(sim->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::mt19937 rng(17);
  std::deque<torch::Tensor> recent;
  auto acc_err = torch::zeros({}, torch::TensorOptions().device(device));
  const int64_t H = cfg.history;
  sim->train();
  for (int64_t step = 0; step < cfg.train_steps; ++step) {
    const auto& tr = data[rng() % data.size()];
    const int64_t t = H + static_cast<int64_t>(rng() % static_cast<uint64_t>(tr.world_pos.size(0) - H - 1));
    auto window = tr.world_pos.narrow(0, t - H, H + 1).to(device);
    auto target = tr.world_pos[t + 1].to(device);
    auto mesh_pos = tr.mesh_pos.to(device);
    auto edge_index = tr.edge_index.to(device);
    auto node_type = tr.node_type.to(device);
    const bool accumulate = step < cfg.accumulate_steps;

    // Noise only on the newest frame: the clean target teaches the model to correct it.
    auto noisy = window.clone();  // LOOKALIKE: tensor-unnecessary-clone -- on CPU window is a view into the trajectory; only one frame is written and an out-of-place version would copy the window anyway
    noisy.select(0, H).add_(position_noise(window[H], node_type, cfg.noise_std));
    auto target_acc = target - 2 * noisy[H] + noisy[H - 1];

    auto pred = sim->forward(noisy, mesh_pos, node_type, edge_index, accumulate);
    auto target_norm = sim->out_norm()->forward(target_acc, accumulate);
    auto normal = (tr.node_type == kNormal).to(torch::kFloat);
    auto per_node = torch::mse_loss(pred, target_norm, at::Reduction::None).sum(-1);
    auto loss = (per_node * normal).sum() / normal.sum();  // EXPECT: tensor-device-mismatch
    auto acc_world = pred.detach();
    // FACT: p=torch.nn.Linear(4,3)(torch.randn(5,4)); l=torch.nn.functional.mse_loss(p,torch.zeros(5,3),reduction="none").sum(); d=p.detach(); d.mul_(2.0); assert backward_fails(lambda: l.backward())
    acc_world.mul_(sim->out_norm()->stddev()).add_(sim->out_norm()->mean());  // EXPECT: tensor-inplace-on-detached
    acc_err += (acc_world - target_acc).pow(2).sum(-1).sqrt().mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- both operands are graph-free, so only a number accumulates

    opt.zero_grad();
    loss.backward();
    opt.step();
    ema_update(ema, sim, cfg.ema_decay);

    recent.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (recent.size() > 100) recent.pop_front();
    if ((step + 1) % cfg.log_every == 0) {
      std::vector<torch::Tensor> last(recent.begin(), recent.end());
      auto stats = torch::stack({torch::stack(last).mean(), acc_err / static_cast<double>(cfg.log_every)}).detach().cpu();  // LOOKALIKE: tensor-sync-in-loop -- one transfer every log_every steps
      std::printf("step %ld  loss %.5f  |acc err| %.3e\n", static_cast<long>(step + 1),
                  stats[0].item<double>(), stats[1].item<double>());
      acc_err.zero_();
    }
  }
}

torch::Tensor rollout(ClothSimulator& sim, const ClothTrajectory& tr, const MGNConfig& cfg, torch::Device device,
                      std::vector<double>& step_mse) {
  torch::NoGradGuard no_grad;
  sim->eval();
  const int64_t H = cfg.history;
  const int64_t steps = std::min<int64_t>(cfg.rollout_steps, tr.world_pos.size(0) - H - 1);
  auto window = tr.world_pos.narrow(0, 0, H + 1).to(device, torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
  auto mesh_pos = tr.mesh_pos.to(device);
  auto edge_index = tr.edge_index.to(device);
  std::vector<torch::Tensor> frames;
  for (int64_t t = H; t < H + steps; ++t) {
    auto node_type = tr.node_type.to(device);  // EXPECT: tensor-clone-in-loop
    auto kinematic = (node_type == kHandle).unsqueeze(-1);
    auto acc = sim->predict_acceleration(window, mesh_pos, node_type, edge_index);
    auto gt = tr.world_pos[t + 1].to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different ground-truth frame every step
    auto cur = window[H];
    auto next = cur;
    // FACT: cur=torch.randn(5,3); c0=cur.clone(); nxt=cur; nxt += torch.ones(5,3); assert shares_storage(nxt,cur) and not torch.equal(cur,c0)
    next += (cur - window[H - 1]) + acc;  // EXPECT: tensor-alias-then-mutate
    next = torch::where(kinematic, gt, next);
    step_mse.push_back((next - gt).pow(2).mean().item<double>());  // EXPECT: tensor-sync-in-loop
    frames.push_back(next);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard no graph is recorded
    // FACT: w=torch.randn(4,5,3); c=w.narrow(0,0,4).to("cpu",torch.float32,copy=True); assert is_copy_of(c,w)
    // FACT: w=torch.randn(4,5,3); assert raises(lambda: w.narrow(0,0,3).copy_(w.narrow(0,1,3)), "some elements of the input tensor")
    window.narrow(0, 0, H).copy_(window.narrow(0, 1, H));  // EXPECT: tensor-inplace-overlap // LOOKALIKE: tensor-alias-then-mutate -- window was taken with copy=true, so the trajectory is untouched
    window[H].copy_(next);
  }
  return torch::stack(frames);
}

void export_rollout(const std::string& prefix, const torch::Tensor& positions, const torch::Tensor& cells) {
  auto host = torch::empty(positions.sizes(), torch::kFloat);
  host.copy_(positions);  // LOOKALIKE: tensor-copy-narrowing, tensor-device-mismatch -- float into float, and copy_ may cross devices
  std::ofstream(prefix + "_pos.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(host.data_ptr<float>()), static_cast<std::streamsize>(host.nbytes()));
  auto faces = torch::empty({cells.size(0), 3}, torch::kInt32);
  faces.copy_(cells);  // EXPECT: tensor-copy-narrowing
  std::ofstream(prefix + "_faces.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(faces.data_ptr<int32_t>()), static_cast<std::streamsize>(faces.nbytes()));
}

}  // namespace mgn

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s traj0.bin [traj1.bin ...]\n", argv[0]);
    return 1;
  }
  torch::manual_seed(3);
  mgn::MGNConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::vector<mgn::ClothTrajectory> data;
  for (int i = 1; i < argc; ++i) data.push_back(mgn::load_trajectory(argv[i]));

  mgn::ClothSimulator sim(cfg), ema(cfg);
  sim->to(device);
  ema->to(device);
  mgn::ema_update(ema, sim, /*decay=*/0.0);
  mgn::train(sim, ema, data, cfg, device);
  torch::save(ema, "mgn_cloth_ema.pt");

  std::vector<double> step_mse;
  auto positions = mgn::rollout(ema, data.front(), cfg, device, step_mse);
  const double total = std::accumulate(step_mse.begin(), step_mse.end(), 0.0);
  std::printf("rollout MSE %.4e over %zu steps\n", total / step_mse.size(), step_mse.size());
  mgn::export_rollout("rollout0", positions, data.front().cells);
  return 0;
}
