// Differentiable rendering of a neural signed distance field (IDR / NeuS-style):
// positional-encoded MLP SDF, batched pinhole rays, sphere tracing with a convergence mask,
// normals through autograd, silhouette + eikonal training with per-camera translation refinement.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct SdfConfig {
  int64_t num_freqs = 6;
  int64_t hidden = 256;
  int64_t depth = 8;
  int64_t skip_layer = 4;
  double sphere_radius = 0.6;  // geometric initialisation
  double beta = 50.0;          // silhouette sharpness
  int64_t eikonal_samples = 4096;
  int64_t jitter_per_point = 4;
  double jitter_sigma = 0.01;
  double eikonal_weight = 0.1;
};

struct TraceConfig {
  int64_t max_steps = 64;
  double near = 0.5;
  double far = 4.0;
  double hit_eps = 1e-4;
  double step_scale = 0.9;
  double pose_lr = 1e-4;
  double max_pose_shift = 0.05;
};

struct TrainBatch {
  torch::Tensor K;        // [3, 3] shared intrinsics
  torch::Tensor c2w;      // [B, 4, 4] camera-to-world
  torch::Tensor cam_ids;  // [B] int64 index into the refined translations
  torch::Tensor mask;     // [B, H, W] foreground silhouettes in {0, 1}
  int64_t height = 0;
  int64_t width = 0;
};

struct Rays {
  torch::Tensor o;  // [R, 3]
  torch::Tensor d;  // [R, 3], unit length
};

struct PositionalEncodingImpl : torch::nn::Module {
  explicit PositionalEncodingImpl(int64_t num_freqs) {
    freqs_ = register_buffer("freqs", torch::pow(2.0, torch::arange(num_freqs).to(torch::kFloat)) * M_PI);
  }

  torch::Tensor forward(const torch::Tensor& x) {  // [N, 3] -> [N, 3 + 6L]
    const auto n = x.size(0);
    auto scaled = x.unsqueeze(-1) * freqs_;  // [N, 3, L]
    auto bands = torch::cat({torch::sin(scaled), torch::cos(scaled)}, -1);  // [N, 3, 2L]
    // frequency-major order, as in the reference NeRF encoding
    // FACT: b = torch.randn(5, 3, 8); e = b.transpose(1, 2).reshape(5, -1); assert is_copy_of(e, b)
    auto enc = bands.transpose(1, 2).reshape({n, -1});  // EXPECT: tensor-reshape-non-contiguous
    return torch::cat({x, enc}, -1);
  }

  torch::Tensor freqs_;
};
TORCH_MODULE(PositionalEncoding);

struct SdfNetImpl : torch::nn::Module {
  explicit SdfNetImpl(const SdfConfig& cfg) : cfg_(cfg), pe(cfg.num_freqs) {
    register_module("pe", pe);
    const int64_t in_dim = 3 + 6 * cfg.num_freqs;
    for (int64_t i = 0; i < cfg.depth; ++i) {
      int64_t d_in = i == 0 ? in_dim : cfg.hidden;
      if (i == cfg.skip_layer) d_in = cfg.hidden + in_dim;
      const int64_t d_out = i + 1 == cfg.depth ? 1 : cfg.hidden;
      lins_.push_back(register_module("lin" + std::to_string(i), torch::nn::Linear(d_in, d_out)));
    }
    geometric_init();
  }

  // Starts from the SDF of a sphere of radius cfg.sphere_radius.
  void geometric_init() {
    torch::NoGradGuard no_grad;
    auto& last = lins_.back();
    torch::nn::init::normal_(last->weight, std::sqrt(M_PI) / std::sqrt(static_cast<double>(cfg_.hidden)), 1e-4);
    last->bias.fill_(-cfg_.sphere_radius);  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& x) {  // [..., 3] -> [..., 1]
    auto lead = x.sizes().vec();
    auto enc = pe->forward(x.reshape({-1, 3}));
    auto h = enc;
    for (size_t i = 0; i < lins_.size(); ++i) {
      if (static_cast<int64_t>(i) == cfg_.skip_layer) {
        h = torch::cat({h, enc}, -1).div_(M_SQRT2);  // LOOKALIKE: tensor-inplace-on-saved -- cat does not save its output
      }
      h = lins_[i]->forward(h);
      if (i + 1 < lins_.size()) h = F::softplus(h, F::SoftplusFuncOptions().beta(100));
    }
    lead.back() = 1;
    // FACT: h = torch.nn.Linear(4, 1)(torch.randn(6, 4)); assert is_view_of(h.view(2, 3, 1), h)
    return h.view(lead);  // LOOKALIKE: tensor-view-non-contiguous -- a Linear output [M, 1] is contiguous
  }

  SdfConfig cfg_;
  PositionalEncoding pe;
  std::vector<torch::nn::Linear> lins_;
};
TORCH_MODULE(SdfNet);

struct CameraRefineImpl : torch::nn::Module {
  explicit CameraRefineImpl(int64_t n_cams) {
    delta_t = register_parameter("delta_t", torch::zeros({n_cams, 3}));
  }
  torch::Tensor delta_t;
};
TORCH_MODULE(CameraRefine);

// ---------------------------------------------------------------------------------------------
// Rays and sphere tracing
// ---------------------------------------------------------------------------------------------
Rays generate_rays(const torch::Tensor& K, const torch::Tensor& c2w, int64_t H, int64_t W) {
  auto opts = K.options();
  auto ys = torch::arange(H, opts) + 0.5;
  auto xs = torch::arange(W, opts) + 0.5;
  auto ij = torch::meshgrid({ys, xs}, "ij");
  // FACT: g = torch.meshgrid(torch.arange(3.), torch.arange(4.), indexing="ij"); p = torch.stack([g[1], g[0], torch.ones_like(g[0])], 0); assert is_view_of(p.view(3, -1), p)
  auto pix = torch::stack({ij[1], ij[0], torch::ones_like(ij[0])}, 0).view({3, -1});  // LOOKALIKE: tensor-view-non-contiguous -- stack writes a new contiguous tensor
  auto dirs_cam = torch::inverse(K).matmul(pix);  // [3, N]
  auto R = c2w.narrow(1, 0, 3).narrow(2, 0, 3);   // [B, 3, 3]
  auto dirs = R.matmul(dirs_cam);                 // [B, 3, N]
  // FACT: d = torch.randn(2, 3, 3).matmul(torch.randn(3, 6)); assert raises(lambda: d.transpose(1, 2).view(-1, 3), "view size is not compatible")
  auto rays_d = dirs.transpose(1, 2).view({-1, 3});  // EXPECT: tensor-view-non-contiguous
  rays_d = rays_d / rays_d.norm(2, -1, true);
  auto cam_pos = c2w.narrow(1, 0, 3).select(2, 3);  // [B, 3]
  auto rays_o = cam_pos.repeat_interleave(H * W, 0);
  return {rays_o, rays_d};
}

struct TraceResult {
  torch::Tensor t;    // [R] depth along the ray
  torch::Tensor hit;  // [R] bool
};

TraceResult sphere_trace(SdfNet& net, const torch::Tensor& rays_o, const torch::Tensor& rays_d,
                         const torch::Tensor& t_start, const TraceConfig& tc) {
  torch::NoGradGuard no_grad;
  torch::Tensor t = t_start;
  auto active = torch::ones_like(t, torch::kBool);
  torch::Tensor sdf;
  for (int64_t i = 0; i < tc.max_steps; ++i) {
    auto pts = rays_o + t.unsqueeze(-1) * rays_d;
    sdf = net->forward(pts).squeeze(-1);
    active = active & (sdf.abs() > tc.hit_eps) & (t < tc.far);
    if (!active.any().item<bool>()) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop marching
    // FACT: t0 = torch.full((4,), 0.5); t = t0; t.add_(torch.ones(4)); assert shares_storage(t, t0) and t0[0].item() == 1.5
    t.add_(sdf * active.to(sdf.scalar_type()) * tc.step_scale);  // EXPECT: tensor-alias-then-mutate
  }
  auto hit = (sdf.abs() <= 10 * tc.hit_eps) & (t < tc.far);
  return {t, hit};
}

torch::Tensor sdf_gradient(SdfNet& net, const torch::Tensor& pts, bool create_graph) {
  auto x = pts.detach().requires_grad_(true);  // LOOKALIKE: tensor-inplace-on-detached -- requires_grad_ only sets a flag, no data is written
  auto sdf = net->forward(x);
  auto grads = torch::autograd::grad({sdf}, {x}, {torch::ones_like(sdf)}, /*retain_graph=*/true, create_graph);
  return grads[0];
}

// ---------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------
double train_step(SdfNet& net, CameraRefine& refine, torch::optim::Adam& opt, const TrainBatch& batch,
                  const SdfConfig& cfg, const TraceConfig& tc) {
  net->train();
  auto rays = generate_rays(batch.K, batch.c2w, batch.height, batch.width);
  const auto n_pix = batch.height * batch.width;
  rays.o = rays.o + refine->delta_t.index_select(0, batch.cam_ids).repeat_interleave(n_pix, 0);

  auto t0 = torch::full({rays.o.size(0)}, tc.near);
  auto tr = sphere_trace(net, rays.o.detach(), rays.d, t0, tc);
  // misses keep the near-plane depth; the march itself is not differentiated
  auto depth = torch::where(tr.hit, tr.t, t0);
  auto x_hit = rays.o + depth.unsqueeze(-1) * rays.d;

  auto sdf_hit = net->forward(x_hit).squeeze(-1);
  auto occupancy = torch::sigmoid(-cfg.beta * sdf_hit);
  // FACT: s = torch.randn(6, requires_grad=True); o = torch.sigmoid(s * 2); o.mul_(torch.ones(6)); assert backward_fails(lambda: torch.nn.functional.binary_cross_entropy(o, torch.ones(6)).backward())
  occupancy.mul_(tr.hit.to(occupancy.scalar_type()));  // EXPECT: tensor-inplace-on-saved
  auto sil_loss = F::binary_cross_entropy(occupancy, batch.mask.reshape({-1}));

  // eikonal term: uniform samples in the bounding cube plus jittered samples around the surface
  auto uniform = torch::rand({cfg.eikonal_samples, 3}) * 2.0 - 1.0;
  auto g_uniform = sdf_gradient(net, uniform, /*create_graph=*/true);
  auto surf = x_hit.detach().index({tr.hit});  // [M, 3]
  auto near_pts = surf.unsqueeze(1).expand({surf.size(0), cfg.jitter_per_point, 3});
  // FACT: s = torch.randn(4, 3); e = s.unsqueeze(1).expand(4, 5, 3); assert raises(lambda: e.add_(torch.randn(4, 5, 3)), "more than one element")
  near_pts.add_(torch::randn({surf.size(0), cfg.jitter_per_point, 3}) * cfg.jitter_sigma);  // EXPECT: tensor-inplace-on-expanded
  auto g_near = sdf_gradient(net, near_pts, /*create_graph=*/true);
  auto eik = (g_uniform.norm(2, -1) - 1).pow(2).mean() + (g_near.norm(2, -1) - 1).pow(2).mean();

  auto loss = sil_loss + cfg.eikonal_weight * eik;
  opt.zero_grad();
  loss.backward();
  opt.step();

  // camera translations: plain SGD with their own step size
  // FACT: p = torch.nn.Parameter(torch.zeros(3)); p.grad = torch.ones(3); assert raises(lambda: p.sub_(1e-4 * p.grad), "leaf Variable")
  refine->delta_t -= tc.pose_lr * refine->delta_t.grad();  // EXPECT: tensor-inplace-on-leaf
  refine->delta_t.grad().zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- writes the gradient, not the parameter
  {
    torch::NoGradGuard no_grad;
    refine->delta_t.clamp_(-tc.max_pose_shift, tc.max_pose_shift);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }
  return loss.item<double>();
}

// ---------------------------------------------------------------------------------------------
// Rendering
// ---------------------------------------------------------------------------------------------
std::pair<torch::Tensor, torch::Tensor> render_view(SdfNet& net, const torch::Tensor& K, const torch::Tensor& c2w,
                                                    int64_t H, int64_t W, const TraceConfig& tc) {
  torch::Device device(torch::kCUDA);
  net->to(device);
  net->eval();
  auto rays = generate_rays(K.to(device), c2w.to(device).unsqueeze(0), H, W);
  const auto n = rays.o.size(0);
  auto t0 = torch::full({n}, tc.near, rays.o.options());
  auto tr = sphere_trace(net, rays.o, rays.d, t0, tc);
  auto depth = torch::where(tr.hit, tr.t, torch::full({n}, tc.far));  // EXPECT: tensor-device-mismatch
  auto pts = rays.o + depth.unsqueeze(-1) * rays.d;
  auto normals = sdf_gradient(net, pts, /*create_graph=*/false);

  torch::NoGradGuard no_grad;
  normals = normals / normals.norm(2, -1, true).clamp_min(1e-8);
  auto shaded = (normals * 0.5 + 0.5).masked_fill(tr.hit.logical_not().unsqueeze(-1), 1.0);  // [n, 3]
  // planar RGB for the image writer
  // FACT: s = torch.randn(12, 3); assert is_view_of(s.view(3, 4, 3).permute(2, 0, 1).reshape(3, -1), s)
  auto img = shaded.view({H, W, 3}).permute({2, 0, 1}).reshape({3, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- H and W stay adjacent and in order: a view
  auto depth_vis = (depth / torch::tensor(tc.far)).view({H, W});  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may join CUDA operands
  return {img.cpu(), depth_vis.cpu()};
}

void fit(SdfNet& net, CameraRefine& refine, const std::vector<TrainBatch>& batches, const SdfConfig& cfg,
         const TraceConfig& tc, int64_t epochs) {
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(5e-4));
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    double total = 0.0;
    for (const auto& b : batches) total += train_step(net, refine, opt, b, cfg, tc);
    std::cout << "epoch " << epoch << " loss " << total / static_cast<double>(batches.size()) << "\n";
  }
}
