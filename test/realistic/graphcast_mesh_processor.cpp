// GraphCast-like medium-range forecaster: grid -> icosahedral mesh encoder, message passing
// processor on the mesh, mesh -> grid decoder, autoregressive rollout training on
// [B, lat, lon, vars] fields.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;

struct GraphCastConfig {
  int64_t n_lat = 181;
  int64_t n_lon = 360;
  int64_t n_vars = 16;
  int64_t n_static = 3;  // orography, land-sea mask, cos(lat)
  int64_t history = 2;
  int64_t latent = 256;
  int64_t processor_layers = 8;
  int64_t rollout_steps = 4;
  double readout_init_scale = 0.1;
  double grad_clip = 32.0;
};

struct MeshGraph {
  torch::Tensor mesh_feat;                    // [Nm, 3]
  torch::Tensor g2m_src, g2m_dst, g2m_feat;  // grid -> mesh
  torch::Tensor m2m_src, m2m_dst, m2m_feat;  // mesh <-> mesh
  torch::Tensor m2g_src, m2g_dst, m2g_feat;  // mesh -> grid
};

struct WeatherSample {
  torch::Tensor inputs, targets;  // [B, T, lat, lon, V] and [B, S, lat, lon, V], physical units
};

static torch::Tensor edge_features(const torch::Tensor& src_pos, const torch::Tensor& dst_pos,
                                   const torch::Tensor& src, const torch::Tensor& dst) {
  auto disp = dst_pos.index_select(0, dst) - src_pos.index_select(0, src);
  return torch::cat({disp, disp.norm(2, -1, true)}, -1);  // [E, 4]
}

// verts: [Nm, 3] unit vectors of a coarse icosahedral mesh, faces: [F, 3] int64.
MeshGraph build_graph(const torch::Tensor& verts, const torch::Tensor& faces, int64_t n_lat, int64_t n_lon) {
  const auto n_mesh = verts.size(0);
  MeshGraph g;
  // mesh edges from the triangle list, made symmetric through a dense adjacency
  auto a = faces.select(1, 0), b = faces.select(1, 1), c = faces.select(1, 2);
  auto adj = torch::zeros({n_mesh, n_mesh});
  adj.index_put_({torch::cat({a, b, c}), torch::cat({b, c, a})}, 1.0);
  // FACT: a = torch.zeros(5, 5); a[0, 1] = 1; assert raises(lambda: a.add_(a.t()), "some elements of the input tensor")
  adj.add_(adj.t());  // EXPECT: tensor-inplace-overlap
  auto pairs = adj.nonzero();  // [E, 2]
  g.m2m_src = pairs.select(1, 0).contiguous();
  g.m2m_dst = pairs.select(1, 1).contiguous();
  g.m2m_feat = edge_features(verts, verts, g.m2m_src, g.m2m_dst);

  auto lat = torch::asin(verts.select(1, 2).clamp(-1.0, 1.0)) * (180.0 / M_PI);
  auto lon = torch::atan2(verts.select(1, 1), verts.select(1, 0)) * (180.0 / M_PI);
  const double deg = M_PI / 180.0;
  g.mesh_feat = torch::stack({torch::cos(lat * deg), torch::sin(lon * deg), torch::cos(lon * deg)}, -1);

  // grid nodes on the unit sphere, row-major over (lat, lon)
  auto glat = torch::linspace(-90.0, 90.0, n_lat) * deg;
  auto glon = torch::arange(n_lon).to(torch::kFloat) * (2.0 * M_PI / static_cast<double>(n_lon)) - M_PI;
  auto ll = torch::meshgrid({glat, glon}, "ij");
  auto grid_xyz = torch::stack({torch::cos(ll[0]) * torch::cos(ll[1]), torch::cos(ll[0]) * torch::sin(ll[1]),
                                torch::sin(ll[0])}, -1).view({-1, 3});

  // grid -> mesh: every mesh vertex reads the grid cell it falls in
  const double lat_res = 180.0 / static_cast<double>(n_lat - 1);
  const double lon_res = 360.0 / static_cast<double>(n_lon);
  auto cell = torch::empty({n_mesh, 2}, torch::kLong);
  // FACT: d = torch.empty(3, dtype=torch.long); d.copy_(torch.tensor([1.7, 2.9, 0.4])); assert d.tolist() == [1, 2, 0]
  cell.select(1, 0).copy_((lat + 90.0) / lat_res);  // EXPECT: tensor-copy-narrowing
  cell.select(1, 1).copy_(((lon + 180.0) / lon_res).round());  // LOOKALIKE: tensor-copy-narrowing -- round() leaves whole numbers, nothing is lost
  cell.select(1, 1).remainder_(n_lon);
  g.g2m_src = cell.select(1, 0) * n_lon + cell.select(1, 1);
  g.g2m_dst = torch::arange(n_mesh);
  g.g2m_feat = edge_features(grid_xyz, verts, g.g2m_src, g.g2m_dst);

  // mesh -> grid: every grid point reads its three nearest mesh vertices
  auto nearest = std::get<1>(torch::cdist(grid_xyz, verts).topk(3, 1, /*largest=*/false));  // [Ng, 3]
  g.m2g_src = nearest.reshape({-1});
  g.m2g_dst = torch::arange(grid_xyz.size(0)).repeat_interleave(3);
  g.m2g_feat = edge_features(verts, grid_xyz, g.m2g_src, g.m2g_dst);
  return g;
}

struct NormalizerImpl : nn::Module {
  explicit NormalizerImpl(int64_t n_vars) {
    mean_ = register_buffer("mean", torch::zeros({n_vars}));
    std_ = register_buffer("std", torch::ones({n_vars}));
    diff_std_ = register_buffer("diff_std", torch::ones({n_vars}));
  }

  // seq: [N, T, lat, lon, V] training archive
  void fit(const torch::Tensor& seq) {
    torch::NoGradGuard no_grad;
    const auto T = seq.size(1);
    const auto V = seq.size(-1);
    // the first step of every sequence is the re-analysis spin-up: leave it out
    // FACT: s = torch.randn(2, 3, 4, 5, 6); assert raises(lambda: s.narrow(1, 1, 2).view(-1, 6), "view size is not compatible")
    auto usable = seq.narrow(1, 1, T - 1).view({-1, V});  // EXPECT: tensor-view-non-contiguous
    mean_.copy_(usable.mean(0));
    std_.copy_(usable.std(0).clamp_min(1e-6));
    // FACT: s = torch.randn(2, 3, 4, 5, 6); d = s.narrow(1, 1, 2) - s.narrow(1, 0, 2); assert is_view_of(d.view(-1, 6), d)
    auto diffs = (seq.narrow(1, 1, T - 1) - seq.narrow(1, 0, T - 1)).view({-1, V});  // LOOKALIKE: tensor-view-non-contiguous -- the difference is a fresh contiguous tensor
    diff_std_.copy_(diffs.std(0).clamp_min(1e-6) / std_);
  }

  torch::Tensor normalize(const torch::Tensor& fields) {
    torch::Tensor x = fields;
    // FACT: f = torch.randn(2, 3, 4); f0 = f.clone(); x = f; x.sub_(torch.ones(4)).div_(2 * torch.ones(4)); assert shares_storage(x, f) and not torch.equal(f, f0)
    x.sub_(mean_).div_(std_);  // EXPECT: tensor-alias-then-mutate
    return x;
  }

  torch::Tensor denormalize(const torch::Tensor& x) { return x * std_ + mean_; }

  torch::Tensor mean_, std_, diff_std_;
};
TORCH_MODULE(Normalizer);

nn::Sequential make_mlp(int64_t in, int64_t hidden, int64_t out) {
  return nn::Sequential(nn::Linear(in, hidden), nn::SiLU(), nn::Linear(hidden, out),
                        nn::LayerNorm(nn::LayerNormOptions({out})));
}

struct InteractionNetworkImpl : nn::Module {
  explicit InteractionNetworkImpl(int64_t latent)
      : edge_mlp(make_mlp(3 * latent, latent, latent)), node_mlp(make_mlp(2 * latent, latent, latent)) {
    register_module("edge_mlp", edge_mlp);
    register_module("node_mlp", node_mlp);
  }

  // senders [B, Ns, H], receivers [B, Nr, H], edges [E, H] (shared over the batch) or [B, E, H]
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& senders, const torch::Tensor& receivers,
                                                  const torch::Tensor& edges, const torch::Tensor& src,
                                                  const torch::Tensor& dst) {
    const auto B = receivers.size(0);
    auto e = edges.dim() == 2 ? edges.unsqueeze(0).expand({B, -1, -1}) : edges;
    auto e_new = edge_mlp->forward(torch::cat({senders.index_select(1, src), receivers.index_select(1, dst), e}, -1));
    // sum the messages arriving at every receiver
    auto idx = dst.view({1, -1, 1}).expand_as(e_new);
    auto agg = torch::zeros({B, receivers.size(1), e_new.size(-1)}, e_new.options());
    // FACT: m = torch.randn(2, 3, 4); i = torch.tensor([0, 1, 1]).view(1, -1, 1).expand_as(m); a = torch.zeros(2, 2, 4); a.scatter_add_(1, i, m); assert torch.allclose(a[:, 1], m[:, 1] + m[:, 2])
    agg.scatter_add_(1, idx, e_new);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded tensor is the index, only read
    auto h = node_mlp->forward(torch::cat({receivers, agg}, -1));
    // FACT: x = torch.randn(3, 4, requires_grad=True); y = torch.nn.LayerNorm(4)(x); a = torch.zeros(2, 4).scatter_add(0, torch.tensor([[0, 1, 0, 1]] * 3), y); y.add_(1); assert not backward_fails(lambda: (a.sum() + y.sum()).backward())
    e_new.add_(e);  // LOOKALIKE: tensor-inplace-on-saved -- LayerNorm does not save its output, scatter_add does not save its source
    return {receivers + h, e_new};
  }

  nn::Sequential edge_mlp, node_mlp;
};
TORCH_MODULE(InteractionNetwork);

struct GraphCastImpl : nn::Module {
  GraphCastImpl(const GraphCastConfig& cfg, const MeshGraph& graph, const torch::Tensor& static_feats) {
    const auto H = cfg.latent;
    grid_embed = register_module("grid_embed", make_mlp(cfg.history * cfg.n_vars + cfg.n_static, H, H));
    mesh_embed = register_module("mesh_embed", make_mlp(graph.mesh_feat.size(1), H, H));
    g2m_embed = register_module("g2m_embed", make_mlp(graph.g2m_feat.size(1), H, H));
    m2m_embed = register_module("m2m_embed", make_mlp(graph.m2m_feat.size(1), H, H));
    m2g_embed = register_module("m2g_embed", make_mlp(graph.m2g_feat.size(1), H, H));
    encoder = register_module("encoder", InteractionNetwork(H));
    for (int64_t i = 0; i < cfg.processor_layers; ++i) processor->push_back(InteractionNetwork(H));
    register_module("processor", processor);
    decoder = register_module("decoder", InteractionNetwork(H));
    readout = register_module("readout", nn::Linear(H, cfg.n_vars));
    // small initial tendencies: the untrained model starts close to persistence
    // FACT: l = torch.nn.Linear(3, 2); assert raises(lambda: l.weight.mul_(0.1), "leaf Variable that requires grad")
    readout->weight.mul_(cfg.readout_init_scale);  // EXPECT: tensor-inplace-on-leaf
    nn::init::zeros_(readout->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    norm = register_module("norm", Normalizer(cfg.n_vars));

    mesh_feat_ = register_buffer("mesh_feat", graph.mesh_feat);
    g2m_src_ = register_buffer("g2m_src", graph.g2m_src);
    g2m_dst_ = register_buffer("g2m_dst", graph.g2m_dst);
    g2m_feat_ = register_buffer("g2m_feat", graph.g2m_feat);
    m2m_src_ = register_buffer("m2m_src", graph.m2m_src);
    m2m_dst_ = register_buffer("m2m_dst", graph.m2m_dst);
    m2m_feat_ = register_buffer("m2m_feat", graph.m2m_feat);
    m2g_src_ = register_buffer("m2g_src", graph.m2g_src);
    m2g_dst_ = register_buffer("m2g_dst", graph.m2g_dst);
    m2g_feat_ = register_buffer("m2g_feat", graph.m2g_feat);
    static_feats_ = register_buffer("static_feats", static_feats);  // [lat, lon, n_static]
  }

  // hist: normalised [B, T, lat, lon, V] -> normalised next state [B, lat, lon, V]
  torch::Tensor forward(const torch::Tensor& hist) {
    const auto B = hist.size(0), T = hist.size(1), n_lat = hist.size(2), n_lon = hist.size(3), V = hist.size(4);
    // FACT: h = torch.randn(2, 3, 4, 5, 6); g = h.permute(0, 2, 3, 1, 4).reshape(2, 20, -1); assert is_copy_of(g, h)
    auto grid_x = hist.permute({0, 2, 3, 1, 4}).reshape({B, n_lat * n_lon, T * V});  // EXPECT: tensor-reshape-non-contiguous
    auto stat = static_feats_.view({1, n_lat * n_lon, -1}).expand({B, -1, -1});
    auto grid_h = grid_embed->forward(torch::cat({grid_x, stat}, -1));               // [B, Ng, H]
    auto mesh_h = mesh_embed->forward(mesh_feat_).unsqueeze(0).expand({B, -1, -1});  // [B, Nm, H]

    mesh_h = encoder->forward(grid_h, mesh_h, g2m_embed->forward(g2m_feat_), g2m_src_, g2m_dst_).first;
    torch::Tensor mesh_e = m2m_embed->forward(m2m_feat_);
    for (const auto& layer : *processor) {
      auto out = layer->as<InteractionNetworkImpl>()->forward(mesh_h, mesh_h, mesh_e, m2m_src_, m2m_dst_);
      mesh_h = out.first;
      mesh_e = out.second;
    }
    auto grid_out = decoder->forward(mesh_h, grid_h, m2g_embed->forward(m2g_feat_), m2g_src_, m2g_dst_).first;
    // FACT: y = torch.nn.Linear(8, 6)(torch.randn(2, 20, 8)); assert is_view_of(y.view(2, 4, 5, 6), y)
    auto delta = readout->forward(grid_out).view({B, n_lat, n_lon, V});  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output is contiguous, the view only splits Ng
    return hist.select(1, T - 1) + delta * norm->diff_std_;
  }

  std::vector<torch::Tensor> rollout(torch::Tensor hist, int64_t steps) {
    std::vector<torch::Tensor> preds;
    for (int64_t s = 0; s < steps; ++s) {
      auto next = forward(hist);
      preds.push_back(next);  // LOOKALIKE: tensor-graph-kept-across-iterations -- returned: the rollout loss backpropagates through every step
      hist = torch::cat({hist.narrow(1, 1, hist.size(1) - 1), next.unsqueeze(1)}, 1);
    }
    return preds;
  }

  nn::Sequential grid_embed{nullptr}, mesh_embed{nullptr}, g2m_embed{nullptr}, m2m_embed{nullptr}, m2g_embed{nullptr};
  InteractionNetwork encoder{nullptr}, decoder{nullptr};
  nn::ModuleList processor;
  nn::Linear readout{nullptr};
  Normalizer norm{nullptr};
  torch::Tensor mesh_feat_, g2m_src_, g2m_dst_, g2m_feat_, m2m_src_, m2m_dst_, m2m_feat_, m2g_src_, m2g_dst_,
      m2g_feat_, static_feats_;
};
TORCH_MODULE(GraphCast);

torch::Tensor lat_weights(int64_t n_lat) {
  auto lat = torch::linspace(-90.0, 90.0, n_lat) * (M_PI / 180.0);
  auto w = torch::cos(lat).clamp_min(1e-3);
  return w / w.mean();
}

// [B, S, lat, lon, V] -> [S, V]
torch::Tensor per_var_rmse(const torch::Tensor& pred, const torch::Tensor& target) {
  return (pred - target).pow(2).mean({0, 2, 3}).sqrt();
}

// [B, lat, lon, V] -> [V]
torch::Tensor per_var_bias(const torch::Tensor& pred, const torch::Tensor& target) {
  const auto V = pred.size(-1);
  // FACT: e = torch.randn(2, 3, 4, 5); assert is_view_of(e.permute(3, 0, 1, 2).reshape(5, -1), e)
  auto err = (pred - target).permute({3, 0, 1, 2}).reshape({V, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- B, lat, lon stay in order: a view
  return err.mean(1);
}

double train_epoch(GraphCast& model, torch::optim::AdamW& opt, const std::vector<WeatherSample>& data,
                   const GraphCastConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  const auto w_lat = lat_weights(cfg.n_lat).view({1, -1, 1, 1});
  auto running = torch::zeros({}, torch::TensorOptions().device(device));
  auto persist_bias = torch::zeros({cfg.n_vars}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (const auto& sample : data) {
    auto inputs = sample.inputs.to(device);
    auto targets = sample.targets.to(device);
    auto hist = model->norm->normalize(inputs);
    auto preds = model->rollout(hist, cfg.rollout_steps);
    std::vector<torch::Tensor> step_losses;
    for (int64_t s = 0; s < cfg.rollout_steps; ++s) {
      auto tgt = (targets.select(1, s) - model->norm->mean_) / model->norm->std_;
      auto err = (preds[s] - tgt).pow(2) * w_lat;  // EXPECT: tensor-device-mismatch
      step_losses.push_back(err.mean());  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked into the loss that is backpropagated below
    }
    auto loss = torch::stack(step_losses).mean();
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
    opt.step();
    running = running + loss.detach();
    persist_bias += per_var_bias(inputs.select(1, -1), targets.select(1, 0)).abs();
    std::cout << "step " << step << " loss " << loss.item<float>() << std::endl;  // EXPECT: tensor-sync-in-loop
    ++step;
  }
  if (step > 0) std::cout << "persistence |bias| " << (persist_bias / step).mean().item<float>() << "\n";
  return step > 0 ? running.item<double>() / static_cast<double>(step) : 0.0;
}

// RMSE per lead time and variable, physical units.
torch::Tensor validate(GraphCast& model, const std::vector<WeatherSample>& val, const GraphCastConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto rmse_sum = torch::zeros({cfg.rollout_steps, cfg.n_vars}, torch::TensorOptions().device(device));
  for (const auto& sample : val) {
    auto hist = model->norm->normalize(sample.inputs.to(device));  // LOOKALIKE: tensor-clone-in-loop -- a different sample every iteration
    auto preds = model->rollout(hist, cfg.rollout_steps);
    auto pred = model->norm->denormalize(torch::stack(preds, 1));
    rmse_sum += per_var_rmse(pred, sample.targets.to(device));  // EXPECT: tensor-graph-kept-across-iterations
  }
  return rmse_sum / static_cast<double>(val.size());
}
