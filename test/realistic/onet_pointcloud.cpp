// Occupancy Networks, point-cloud completion setting: a ResNet-PointNet encodes the observed
// cloud into a code c, a conditional ResNet-FC decoder predicts occupancy logits for query
// points. Evaluation reports IoU on held-out points and exports dense occupancy grids with
// the active cells MISE would refine.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;
using torch::Tensor;

struct OnetConfig {
  int64_t c_dim = 256, hidden = 256, n_blocks = 5;
  int64_t n_cloud = 300, n_points = 2048, n_points_iou = 8192;
  int64_t batch = 32, epochs = 100, log_every = 50, eval_every = 5;
  int64_t grid_res = 64, chunk = 65536;
  double lr = 1e-4, noise_std = 0.005, padding = 0.1, threshold = 0.2, iou_weight = 0.1;
};

struct ResnetBlockFCImpl : torch::nn::Module {
  ResnetBlockFCImpl(int64_t in, int64_t out)
      : fc_0(register_module("fc_0", torch::nn::Linear(in, out))),
        fc_1(register_module("fc_1", torch::nn::Linear(out, out))) {
    if (in != out)
      shortcut = register_module("shortcut", torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
    torch::nn::init::zeros_(fc_1->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
  }
  Tensor forward(const Tensor& x) {
    auto net = fc_0(torch::relu(x));
    auto dx = fc_1(torch::relu(net));
    auto xs = shortcut ? shortcut(x) : x;
    // FACT: fc = torch.nn.Linear(4, 4); x = torch.rand(2, 3, 4, requires_grad=True); dx = fc(torch.relu(x)); dx.add_(x); dx.sum().backward(); assert x.grad is not None
    return dx.add_(xs);  // LOOKALIKE: tensor-inplace-on-saved -- a Linear output is not saved by its backward
  }
  torch::nn::Linear fc_0, fc_1, shortcut{nullptr};
};
TORCH_MODULE(ResnetBlockFC);

struct ResnetPointnetImpl : torch::nn::Module {
  explicit ResnetPointnetImpl(const OnetConfig& cfg)
      : fc_pos(register_module("fc_pos", torch::nn::Linear(3, 2 * cfg.hidden))),
        fc_c(register_module("fc_c", torch::nn::Linear(cfg.hidden, cfg.c_dim))) {
    for (int64_t i = 0; i < 5; ++i)
      blocks.push_back(register_module("block_" + std::to_string(i),
                                       ResnetBlockFC(2 * cfg.hidden, cfg.hidden)));
  }
  Tensor forward(const Tensor& cloud) {
    auto net = blocks[0]->forward(fc_pos(cloud));
    for (size_t i = 1; i < blocks.size(); ++i) {
      auto pooled = std::get<0>(net.max(1, true)).expand_as(net);
      net = blocks[i]->forward(torch::cat({net, pooled}, 2));
    }
    auto global = std::get<0>(net.max(1));
    return fc_c(torch::relu(global));
  }
  torch::nn::Linear fc_pos, fc_c;
  std::vector<ResnetBlockFC> blocks;
};
TORCH_MODULE(ResnetPointnet);

struct OccDecoderImpl : torch::nn::Module {
  explicit OccDecoderImpl(const OnetConfig& cfg)
      : fc_p(register_module("fc_p", torch::nn::Linear(3, cfg.hidden))),
        fc_out(register_module("fc_out", torch::nn::Linear(cfg.hidden, 1))) {
    for (int64_t i = 0; i < cfg.n_blocks; ++i) {
      fc_c.push_back(register_module("fc_c" + std::to_string(i), torch::nn::Linear(cfg.c_dim, cfg.hidden)));
      blocks.push_back(register_module("block" + std::to_string(i), ResnetBlockFC(cfg.hidden, cfg.hidden)));
    }
  }
  Tensor forward(const Tensor& p, const Tensor& c) {
    auto net = fc_p(p);
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto cc = fc_c[i]->forward(c).unsqueeze(1).expand_as(net);
      // FACT: n = torch.rand(2, 5, 4); n.add_(torch.rand(2, 1, 4).expand(2, 5, 4)); assert is_contiguous(n)
      net.add_(cc);  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded code is the source; net itself is dense
      net = blocks[i]->forward(net);
    }
    return fc_out(torch::relu(net)).squeeze(-1);
  }
  torch::nn::Linear fc_p, fc_out;
  std::vector<torch::nn::Linear> fc_c;
  std::vector<ResnetBlockFC> blocks;
};
TORCH_MODULE(OccDecoder);

struct ShapeSet {
  Tensor clouds, points, occ;
};

// Synthetic spheres standing in for the ShapeNet split; points are stored in half precision
// on disk, as in the original preprocessing.
ShapeSet make_shapes(int64_t n, int64_t n_cloud, int64_t n_points, double padding) {
  auto center = (torch::rand({n, 1, 3}) - 0.5) * 0.3;
  auto radius = torch::rand({n, 1, 1}) * 0.2 + 0.15;
  auto dirs = F::normalize(torch::randn({n, n_cloud, 3}), F::NormalizeFuncOptions().dim(-1));
  ShapeSet s;
  s.clouds = center + radius * dirs;
  auto stored = ((torch::rand({n, n_points, 3}) - 0.5) * (1.0 + padding)).to(torch::kHalf);
  s.points = torch::empty({n, n_points, 3}, torch::kFloat);
  s.points.copy_(stored);  // LOOKALIKE: tensor-copy-narrowing -- half into float widens
  s.occ = ((s.points - center).norm(2, -1) < radius.squeeze(-1)).to(torch::kFloat);
  return s;
}

// Noisy-observation setting: jitter the observed points.
Tensor jitter_cloud(const Tensor& cloud, double stddev) {
  Tensor x = cloud.reshape({cloud.size(0), -1, 3});
  // FACT: pc = torch.rand(8, 300, 3).narrow(0, 0, 4); assert is_view_of(pc.reshape(4, -1, 3), pc)
  x.add_(torch::randn_like(x) * stddev);  // EXPECT: tensor-alias-then-mutate
  return x;
}

Tensor occupancy_loss(const Tensor& logits, const Tensor& occ) {
  // Up-weight points near the decision boundary.
  auto w = logits.detach();
  // FACT: y = torch.rand(2, 5, requires_grad=True) * 1.0; w = y.detach(); w.sigmoid_(); assert shares_storage(w, y) and y._version == 1
  w.sigmoid_();  // EXPECT: tensor-inplace-on-detached
  w = 1.0 + 4.0 * w * (1.0 - w);
  auto opts = F::BinaryCrossEntropyWithLogitsFuncOptions().weight(w).reduction(torch::kNone);
  return F::binary_cross_entropy_with_logits(logits, occ, opts).sum(-1).mean();
}

Tensor soft_iou_loss(const Tensor& logits, const Tensor& occ, const Tensor& points) {
  auto inside = (points.abs() <= 0.5).all(-1).to(logits.dtype());
  auto p = torch::sigmoid(logits);
  // FACT: z = torch.rand(2, 5, requires_grad=True); p = torch.sigmoid(z); p.mul_(torch.ones(2, 5)); assert backward_fails(lambda: (p * 2).sum().backward())
  p.mul_(inside);  // EXPECT: tensor-inplace-on-saved
  auto inter = (p * occ).sum(-1);
  auto uni = (p + occ - p * occ).sum(-1).clamp_min(1e-6);
  return (1.0 - inter / uni).mean();
}

double eval_iou(ResnetPointnet& enc, OccDecoder& dec, const ShapeSet& val, const OnetConfig& cfg,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  enc->eval();
  dec->eval();
  double iou_sum = 0.0;
  const auto N = val.clouds.size(0);
  for (int64_t i = 0; i < N; i += cfg.batch) {
    const auto B = std::min(cfg.batch, N - i);
    auto c = enc->forward(val.clouds.narrow(0, i, B).to(device));
    auto logits = dec->forward(val.points.narrow(0, i, B).to(device), c);
    auto pred = torch::sigmoid(logits) >= cfg.threshold;
    auto occ = val.occ.narrow(0, i, B) >= 0.5;
    auto inter = (pred & occ).sum(-1).to(torch::kFloat);  // EXPECT: tensor-device-mismatch
    auto uni = (pred | occ).sum(-1).to(torch::kFloat).clamp_min(1.0);
    iou_sum += (inter / uni).sum().item<double>();  // EXPECT: tensor-sync-in-loop
  }
  enc->train();
  dec->train();
  return iou_sum / static_cast<double>(N);
}

Tensor make_grid(int64_t res, double padding) {
  const double half = 0.5 * (1.0 + padding);
  auto lin = torch::linspace(-half, half, res);
  auto g = torch::meshgrid({lin, lin, lin}, "ij");
  return torch::stack({g[0].flatten(), g[1].flatten(), g[2].flatten()}).t();
}

Tensor predict_grid(ResnetPointnet& enc, OccDecoder& dec, const Tensor& cloud, const Tensor& grid,
                    const OnetConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto c = enc->forward(cloud.unsqueeze(0));
  const auto M = grid.size(0);
  auto values = torch::zeros({M}, torch::kByte);
  for (int64_t i = 0; i < M; i += cfg.chunk) {
    const auto n = std::min(cfg.chunk, M - i);
    // FACT: g = torch.stack([torch.rand(64)] * 3).t(); c = g.narrow(0, 16, 16); assert not is_contiguous(c) and is_view_of(c.reshape(1, -1, 3), c)
    auto p = grid.narrow(0, i, n).reshape({1, -1, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- only a leading size-1 dim is added, still a view
    auto probs = torch::sigmoid(dec->forward(p, c)).squeeze(0);
    values.narrow(0, i, n).copy_(probs);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ across devices is allowed
  }
  return values.view({cfg.grid_res, cfg.grid_res, cfg.grid_res});
}

// Grow the active set by one cell along an axis, in both directions.
void dilate_axis_(Tensor& active, int64_t dim) {
  const auto n = active.size(dim);
  // FACT: a = torch.zeros(4, 4, 4, dtype=torch.bool); a[0, 0, 0] = True; a.narrow(2, 1, 3).logical_or_(a.narrow(2, 0, 3)); assert shares_storage(a.narrow(2, 1, 3), a) and a[0, 0].all()
  active.narrow(dim, 1, n - 1).logical_or_(active.narrow(dim, 0, n - 1));  // EXPECT: tensor-inplace-overlap
  // FACT: a = torch.zeros(4, 4, 4, dtype=torch.bool); a[0, 0, 3] = True; a.narrow(2, 0, 3).logical_or_(a.narrow(2, 1, 3).clone()); assert int(a.sum()) == 2
  active.narrow(dim, 0, n - 1).logical_or_(active.narrow(dim, 1, n - 1).clone());  // LOOKALIKE: tensor-inplace-overlap -- the source is cloned first
}

Tensor active_cells(const Tensor& occ) {
  auto active = torch::zeros_like(occ, torch::kBool);
  for (int64_t d = 0; d < 3; ++d) {
    const auto n = occ.size(d);
    auto flips = occ.narrow(d, 1, n - 1) != occ.narrow(d, 0, n - 1);
    active.narrow(d, 1, n - 1).logical_or_(flips);
  }
  for (int64_t d = 0; d < 3; ++d) dilate_axis_(active, d);
  return active;
}

void export_grids(ResnetPointnet& enc, OccDecoder& dec, const ShapeSet& test, const OnetConfig& cfg,
                  torch::Device device) {
  auto grid = make_grid(cfg.grid_res, cfg.padding);
  for (int64_t s = 0; s < test.clouds.size(0); ++s) {
    auto pts = grid.to(device);  // EXPECT: tensor-clone-in-loop
    auto values = predict_grid(enc, dec, test.clouds[s].to(device), pts, cfg);
    auto occ = values.to(torch::kBool);
    auto active = active_cells(occ);
    std::cout << "shape " << s << ": " << active.sum().item<int64_t>() << " cells to refine\n";
    torch::save(values, "occ_grid_" + std::to_string(s) + ".pt");
  }
}

int main() {
  OnetConfig cfg;
  torch::manual_seed(0);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);

  auto train = make_shapes(4096, cfg.n_cloud, cfg.n_points, cfg.padding);
  auto val = make_shapes(256, cfg.n_cloud, cfg.n_points_iou, cfg.padding);

  ResnetPointnet enc(cfg);
  OccDecoder dec(cfg);
  enc->to(device);
  dec->to(device);
  auto params = enc->parameters();
  for (auto& p : dec->parameters()) params.push_back(p);
  torch::optim::Adam opt(params, torch::optim::AdamOptions(cfg.lr));

  const auto N = train.clouds.size(0);
  for (int64_t epoch = 1; epoch <= cfg.epochs; ++epoch) {
    Tensor running = torch::zeros({}, device);
    int64_t steps = 0;
    auto order = torch::randperm(N / cfg.batch);
    for (int64_t k = 0; k < order.size(0); ++k, ++steps) {
      const auto i = order[k].item<int64_t>() * cfg.batch;
      auto cloud = jitter_cloud(train.clouds.narrow(0, i, cfg.batch), cfg.noise_std).to(device);
      auto points = train.points.narrow(0, i, cfg.batch).clone().to(device);  // EXPECT: tensor-unnecessary-clone
      auto occ = train.occ.narrow(0, i, cfg.batch).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice every step

      auto logits = dec->forward(points, enc->forward(cloud));
      auto loss = occupancy_loss(logits, occ) + cfg.iou_weight * soft_iou_loss(logits, occ, points);
      opt.zero_grad();
      loss.backward();
      opt.step();

      running = running + loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (steps % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " it " << steps << " loss " << loss.item<double>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- read every log_every steps
    }
    std::cout << "epoch " << epoch << " mean loss " << running.item<double>() / steps << "\n";
    if (epoch % cfg.eval_every == 0)
      std::cout << "epoch " << epoch << " IoU " << eval_iou(enc, dec, val, cfg, device) << "\n";
  }

  auto test = make_shapes(8, cfg.n_cloud, cfg.n_points, cfg.padding);
  export_grids(enc, dec, test, cfg, device);
  return 0;
}
