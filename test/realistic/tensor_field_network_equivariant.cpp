// Tensor field network (Thomas et al., 2018): rotation-equivariant point convolutions
// carrying scalar (l = 0) and vector (l = 1) features, trained on the 3D Tetris toy set.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace tfn {

struct Config {
  int64_t channels = 16, num_rbf = 16, radial_hidden = 32, layers = 3, num_classes = 8;
  double rbf_max = 3.5, rbf_width = 0.4, cutoff = 4.0;
  int64_t epochs = 400, steps_per_epoch = 8, batch_size = 32;
  double lr = 3e-3;
  double jitter = 0.02;
  double eps = 1e-9;
};

struct Fields {
  torch::Tensor s;  // scalars per point and channel
  torch::Tensor v;  // vectors per point and channel
};

struct PairGeometry {
  torch::Tensor rhat;
  torch::Tensor dist;
  torch::Tensor transverse;  // I - rhat rhat^T
  torch::Tensor edge;        // 1 for a real pair i != j
};

torch::Tensor cosine_cutoff(const torch::Tensor& d, double rc) {
  return 0.5 * (torch::cos(d * (M_PI / rc)) + 1.0) * (d < rc).to(d.scalar_type());
}

PairGeometry pair_geometry(const torch::Tensor& pos, const torch::Tensor& point_mask, double eps) {
  const auto B = pos.size(0), N = pos.size(1);
  auto rel = pos.unsqueeze(1) - pos.unsqueeze(2);
  auto dist = rel.norm(2, -1, true);
  auto rhat = rel.clone();  // EXPECT: tensor-unnecessary-clone
  rhat.div_(dist.clamp_min(eps));

  auto outer = rhat.unsqueeze(-1) * rhat.unsqueeze(-2);
  // FACT: o=torch.rand(2,4,4,3,3); assert raises(lambda: torch.eye(3).expand_as(o).sub_(o), "more than one element")
  auto transverse = torch::eye(3, outer.options()).expand_as(outer);
  transverse.sub_(outer);  // EXPECT: tensor-inplace-on-expanded

  // FACT: m=torch.ones(2,4,dtype=torch.bool); e=m.unsqueeze(1).expand(2,4,4).to(torch.float32); assert is_contiguous(e) and is_copy_of(e, m)
  auto edge = point_mask.unsqueeze(1).expand({B, N, N}).to(pos.scalar_type());
  edge.mul_(point_mask.unsqueeze(2));  // LOOKALIKE: tensor-inplace-on-expanded -- the dtype conversion already materialised a dense copy
  edge.diagonal(0, 1, 2).zero_();
  return {rhat, dist, transverse, edge};
}

// Gaussian radial basis with a learnable width.
struct RadialBasisImpl : torch::nn::Module {
  RadialBasisImpl(int64_t n, double max_dist, double width, double cutoff) : cutoff_(cutoff) {
    centers_ = register_buffer("centers", torch::linspace(0.0, max_dist, n));
    log_gamma = register_parameter("log_gamma", torch::empty({1}));
    torch::NoGradGuard no_grad;
    log_gamma.fill_(-2.0 * std::log(width));  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& dist) {
    auto d = dist - centers_;
    auto rbf = torch::exp(-log_gamma.exp() * d * d);
    // FACT: g=torch.zeros(1,requires_grad=True); assert backward_fails(lambda: (lambda r: (r.mul_(0.5), r.sum().backward()))(torch.exp(-g.exp()*torch.rand(2,4,4,6))))
    rbf.mul_(cosine_cutoff(dist, cutoff_));  // EXPECT: tensor-inplace-on-saved
    return rbf;
  }

  torch::Tensor centers_, log_gamma;
  double cutoff_;
};
TORCH_MODULE(RadialBasis);

struct RadialMLPImpl : torch::nn::Module {
  RadialMLPImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(const torch::Tensor& rbf) {
    auto h = fc1(rbf);
    torch::relu_(h);  // LOOKALIKE: tensor-inplace-on-saved -- the linear layer saved its input and weight, not h
    return fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(RadialMLP);

// One TFN convolution (paths 0->0, 1->0, 0->1, 1->1 through l = 0, 1, 2 filters)
// followed by self-interaction and a gated nonlinearity.
struct TFNLayerImpl : torch::nn::Module {
  TFNLayerImpl(int64_t channels, int64_t num_rbf, int64_t hidden) : C_(channels) {
    radial_ = register_module("radial", RadialMLP(num_rbf, hidden, 6 * channels));
    self_s_ = register_module("self_s", torch::nn::Linear(2 * channels, channels));
    self_v_ = register_module("self_v", torch::nn::Linear(torch::nn::LinearOptions(2 * channels, channels).bias(false)));
    gate_ = register_module("gate", torch::nn::Linear(2 * channels, channels));
  }

  Fields forward(const Fields& in, const PairGeometry& g, const torch::Tensor& rbf) {
    const auto B = in.v.size(0), N = in.v.size(1);
    auto w = (radial_(rbf) * g.edge.unsqueeze(-1)).chunk(6, -1);
    auto s_j = in.s.unsqueeze(1);
    auto v_j = in.v.unsqueeze(1);
    auto rhat = g.rhat.unsqueeze(3);

    auto s00 = (w[0] * s_j).sum(2);
    auto s10 = (w[1] * (rhat * v_j).sum(-1)).sum(2);
    auto v01 = (w[2].unsqueeze(-1) * rhat * s_j.unsqueeze(-1)).sum(2);
    auto v11 = (w[3].unsqueeze(-1) * v_j).sum(2);
    auto v11t = (w[4].unsqueeze(-1) *
                 torch::matmul(g.transverse.unsqueeze(3), v_j.unsqueeze(-1)).squeeze(-1)).sum(2);
    auto v11x = (w[5].unsqueeze(-1) * torch::linalg_cross(rhat, v_j, -1)).sum(2);

    auto s = self_s_(torch::cat({in.s, s00 + s10}, -1));
    auto v_all = torch::cat({in.v, v01 + v11 + v11t + v11x}, 2);
    // Channel mixing must treat x, y and z alike and never mix components.
    // FACT: v=torch.randn(2,4,6,3); assert is_copy_of(v.transpose(2,3).reshape(-1,6), v)
    auto mixed = self_v_(v_all.transpose(2, 3).reshape({-1, 2 * C_}));  // EXPECT: tensor-reshape-non-contiguous
    auto v = mixed.view({B, N, 3, C_}).transpose(2, 3);

    auto norm = torch::sqrt(v.pow(2).sum(-1) + 1e-9);
    auto gate = torch::sigmoid(gate_(torch::cat({s, norm}, -1)));
    return {torch::silu(s), v * gate.unsqueeze(-1)};
  }

  int64_t C_;
  RadialMLP radial_{nullptr};
  torch::nn::Linear self_s_{nullptr}, self_v_{nullptr}, gate_{nullptr};
};
TORCH_MODULE(TFNLayer);

struct TetrisNetImpl : torch::nn::Module {
  explicit TetrisNetImpl(const Config& cfg) : cfg_(cfg) {
    rbf = register_module("rbf", RadialBasis(cfg.num_rbf, cfg.rbf_max, cfg.rbf_width, cfg.cutoff));
    embed_ = register_parameter("embed", torch::randn({cfg.channels}));
    for (int64_t i = 0; i < cfg.layers; ++i)
      layers_.push_back(register_module("layer" + std::to_string(i),
                                        TFNLayer(cfg.channels, cfg.num_rbf, cfg.radial_hidden)));
    head_ = register_module("head", torch::nn::Linear(cfg.channels, cfg.num_classes));
  }

  Fields features(const torch::Tensor& pos, const torch::Tensor& point_mask) {
    const auto B = pos.size(0), N = pos.size(1);
    auto geo = pair_geometry(pos, point_mask, cfg_.eps);
    auto basis = rbf(geo.dist);
    Fields h{embed_.expand({B, N, cfg_.channels}), torch::zeros({B, N, cfg_.channels, 3}, pos.options())};
    for (auto& layer : layers_) {
      auto out = layer->forward(h, geo, basis);
      h = {h.s + out.s, h.v + out.v};
    }
    return h;
  }

  torch::Tensor forward(const torch::Tensor& pos, const torch::Tensor& point_mask) {
    auto h = features(pos, point_mask);
    auto m = point_mask.unsqueeze(-1).to(h.s.scalar_type());
    return head_((h.s * m).sum(1) / m.sum(1).clamp_min(1.0));
  }

  Config cfg_;
  RadialBasis rbf{nullptr};
  torch::Tensor embed_;
  std::vector<TFNLayer> layers_;
  torch::nn::Linear head_{nullptr};
};
TORCH_MODULE(TetrisNet);

std::vector<torch::Tensor> tetris_shapes() {
  const std::vector<std::vector<float>> raw = {
      {0, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0},   // chiral_shape_1
      {0, 0, 0, 0, 0, 1, 1, 0, 0, 1, -1, 0},  // chiral_shape_2
      {0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 1, 0},   // square
      {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 0, 3},   // line
      {0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0},   // corner
      {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 0},   // L
      {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 1},   // T
      {0, 0, 0, 1, 0, 0, 1, 1, 0, 2, 1, 0}};  // zigzag
  std::vector<torch::Tensor> shapes;
  for (const auto& r : raw) shapes.push_back(torch::tensor(r));
  return shapes;
}

// Haar-random rotations; QR runs in double so the factors stay orthonormal.
torch::Tensor random_rotations(int64_t n) {
  auto rots = torch::empty({n, 3, 3});
  for (int64_t b = 0; b < n; ++b) {
    auto [q, r] = torch::linalg_qr(torch::randn({3, 3}, torch::kFloat64));
    q = q * torch::sign(r.diagonal()).unsqueeze(0);
    if (torch::det(q).item<double>() < 0.0) q.select(1, 0).mul_(-1.0);
    rots[b].copy_(q);  // EXPECT: tensor-copy-narrowing
  }
  return rots;
}

struct Batch {
  torch::Tensor pos, mask, label;
};

Batch sample_batch(const std::vector<torch::Tensor>& shapes, const Config& cfg) {
  const int64_t B = cfg.batch_size;
  auto labels = torch::randint(cfg.num_classes, {B}, torch::kLong);
  auto rots = random_rotations(B);
  std::vector<torch::Tensor> clouds;
  for (int64_t b = 0; b < B; ++b) {
    const auto& tmpl = shapes[labels[b].item<int64_t>()];  // LOOKALIKE: tensor-sync-in-loop -- labels were drawn on the CPU, item() is a plain read
    // FACT: s=torch.randn(12); assert is_view_of(s.view(-1,3), s)
    auto pts = tmpl.view({-1, 3});
    pts.add_(torch::randn_like(pts) * cfg.jitter);  // EXPECT: tensor-alias-then-mutate
    // FACT: s=torch.randn(12); p=s.view(-1,3); p=p@torch.eye(3); assert is_copy_of(p, s)
    // FACT: p=torch.randn(4,3); assert is_copy_of(p.mean(0,keepdim=True), p)
    pts = torch::matmul(pts, rots[b].t());
    pts.sub_(pts.mean(0, true));  // LOOKALIKE: tensor-alias-then-mutate -- pts now names the rotated copy, the template is untouched // LOOKALIKE: tensor-inplace-overlap -- mean() returns a new tensor
    clouds.push_back(pts);
  }
  return {torch::stack(clouds), torch::ones({B, clouds.front().size(0)}, torch::kBool), labels};
}

void train(TetrisNet& model, const std::vector<torch::Tensor>& shapes, const Config& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> epoch_logits, epoch_labels;
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      auto batch = sample_batch(shapes, cfg);
      auto pos = batch.pos.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a freshly sampled batch every step
      auto y = batch.label.to(device);
      auto logits = model->forward(pos, batch.mask.to(device));
      auto loss = torch::nn::functional::cross_entropy(logits, y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      model->rbf->log_gamma.clamp_(-6.0, 6.0);  // EXPECT: tensor-inplace-on-leaf
      epoch_logits.push_back(logits);  // EXPECT: tensor-graph-kept-across-iterations
      epoch_labels.push_back(y);
    }
    if (epoch % 20 == 0) {
      auto acc = torch::cat(epoch_logits).argmax(1).eq(torch::cat(epoch_labels)).to(torch::kFloat32).mean();
      std::cout << "epoch " << epoch << " train acc " << acc.item<float>() << '\n';
    }
  }
}

double evaluate(TetrisNet& model, const std::vector<torch::Tensor>& shapes, const Config& cfg,
                torch::Device device, int64_t rounds) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0, total = 0;
  std::vector<torch::Tensor> all_logits;
  for (int64_t r = 0; r < rounds; ++r) {
    auto batch = sample_batch(shapes, cfg);
    auto logits = model->forward(batch.pos.to(device), batch.mask.to(device));
    all_logits.push_back(logits);  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard no graph is recorded
    correct += logits.argmax(1).eq(batch.label.to(device)).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    total += batch.label.size(0);
  }
  auto confidence = torch::cat(all_logits).softmax(1).amax(1).mean();
  std::cout << "mean confidence " << confidence.item<float>() << '\n';
  return static_cast<double>(correct) / static_cast<double>(total);
}

// Rotating the input must rotate the vector features and leave the scalars alone.
void check_equivariance(TetrisNet& model, const std::vector<torch::Tensor>& shapes, const Config& cfg,
                        torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto batch = sample_batch(shapes, cfg);
  auto pos = batch.pos.to(device);
  auto mask = batch.mask.to(device);
  auto rot = random_rotations(1)[0].to(device);
  auto ref = model->features(pos, mask);
  auto turned = model->features(torch::matmul(pos, rot.t()), mask);
  const auto rows = pos.size(0) * pos.size(1);
  // FACT: v=torch.randn(2,4,6,3); assert is_view_of(v.permute(0,1,3,2).reshape(8,3,6), v)
  auto as_columns = [&](const torch::Tensor& v) {
    return v.permute({0, 1, 3, 2}).reshape({rows, 3, cfg.channels});  // LOOKALIKE: tensor-reshape-non-contiguous -- only the two outer dims merge, which strides allow
  };
  const double ds = (turned.s - ref.s).abs().max().item<double>();
  const double dv = (as_columns(turned.v) - torch::matmul(rot, as_columns(ref.v))).abs().max().item<double>();
  std::cout << "equivariance error: scalars " << ds << ", vectors " << dv << '\n';
}

// Recorded clouds arrive with arbitrary offsets; anchor each one at its first point.
std::vector<int64_t> classify(TetrisNet& model, torch::Tensor clouds, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto raw = clouds.clone();  // LOOKALIKE: tensor-unnecessary-clone -- clouds is shifted in place below; the offsets are reported from this snapshot
  // FACT: p=torch.randn(2,4,3); q=p-p[:,:1]; p.sub_(p.narrow(1,0,1)); assert not torch.allclose(p, q)
  clouds.sub_(clouds.narrow(1, 0, 1));  // EXPECT: tensor-inplace-overlap
  auto mask = torch::ones({clouds.size(0), clouds.size(1)}, torch::kBool);
  auto pred = model->forward(clouds.to(device), mask.to(device)).argmax(1).cpu();
  std::cout << "mean offset " << raw.select(1, 0).norm(2, -1).mean().item<float>() << '\n';
  return std::vector<int64_t>(pred.data_ptr<int64_t>(), pred.data_ptr<int64_t>() + pred.numel());
}

}  // namespace tfn

int main() {
  using namespace tfn;
  torch::manual_seed(0);
  Config cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto shapes = tetris_shapes();
  TetrisNet model(cfg);
  model->to(device);

  train(model, shapes, cfg, device);
  std::cout << "test accuracy " << evaluate(model, shapes, cfg, device, 20) << '\n';
  check_equivariance(model, shapes, cfg, device);

  auto recorded = sample_batch(shapes, cfg).pos + torch::randn({1, 1, 3}) * 5.0;
  auto labels = classify(model, recorded, device);
  std::cout << "first prediction " << labels.front() << '\n';
  return 0;
}
