// Fit a deformable sphere to the silhouettes of a target shape seen from a ring
// of cameras, using a soft (differentiable) rasteriser in the spirit of SoftRas.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace softfit {

struct RasterConfig {
  int64_t image_size = 64;
  double sigma = 0.01;   // softness of the triangle edges, in NDC units
  double focal = 1.8;
  double znear = 0.1;
};

struct FitConfig {
  int64_t n_views = 6;
  int64_t iterations = 400;
  double lr = 5e-3;
  double w_laplacian = 0.5;
  double w_edge = 0.1;
  double max_offset = 0.35;
  int64_t log_every = 50;
  int64_t snapshot_every = 100;
};

struct Mesh {
  torch::Tensor verts;
  torch::Tensor faces;
};

Mesh make_uv_sphere(int rings, int segments, float radius) {
  std::vector<float> v{0.f, radius, 0.f};
  for (int r = 1; r < rings; ++r) {
    const float phi = static_cast<float>(M_PI) * r / rings;
    for (int s = 0; s < segments; ++s) {
      const float th = 2.f * static_cast<float>(M_PI) * s / segments;
      v.insert(v.end(), {radius * std::sin(phi) * std::cos(th), radius * std::cos(phi),
                         radius * std::sin(phi) * std::sin(th)});
    }
  }
  v.insert(v.end(), {0.f, -radius, 0.f});
  const int64_t n_verts = static_cast<int64_t>(v.size()) / 3;
  auto ring = [&](int r, int s) { return int64_t{1} + (r - 1) * segments + (s % segments); };

  std::vector<int64_t> f;
  for (int s = 0; s < segments; ++s) f.insert(f.end(), {0, ring(1, s + 1), ring(1, s)});
  for (int r = 1; r < rings - 1; ++r) {
    for (int s = 0; s < segments; ++s) {
      f.insert(f.end(), {ring(r, s), ring(r, s + 1), ring(r + 1, s)});
      f.insert(f.end(), {ring(r, s + 1), ring(r + 1, s + 1), ring(r + 1, s)});
    }
  }
  for (int s = 0; s < segments; ++s) f.insert(f.end(), {n_verts - 1, ring(rings - 1, s), ring(rings - 1, s + 1)});

  Mesh m;
  m.verts = torch::from_blob(v.data(), {n_verts, 3}, torch::kFloat).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob borrows the vector, which dies on return
  m.faces = torch::from_blob(f.data(), {static_cast<int64_t>(f.size()) / 3, 3}, torch::kLong).clone();
  return m;
}

// Radial bumps so that the target is not trivially a sphere.
torch::Tensor bumpy(const torch::Tensor& verts) {
  auto x = verts.select(1, 0), y = verts.select(1, 1), z = verts.select(1, 2);
  auto r = 1.0 + 0.25 * torch::sin(3.0 * x) * torch::cos(2.0 * y) + 0.15 * z.pow(2);
  return verts * r.unsqueeze(1);
}

// Centre the shape and scale it into the unit ball.
torch::Tensor to_unit_sphere(torch::Tensor verts) {
  // FACT: a = torch.randn(10, 3); b = a; b -= b.mean(0); assert shares_storage(a, b) and abs(a.mean(0)).max() < 1e-5
  verts -= verts.mean(0);  // EXPECT: tensor-alias-then-mutate
  verts /= verts.norm(2, 1).max();
  return verts;
}

// Same thing, but for shapes we must not touch (the template sphere).
torch::Tensor centred_copy(const torch::Tensor& verts) {
  // FACT: a = torch.randn(10, 3); c = a - a.mean(0); assert is_copy_of(c, a)
  auto centred = verts - verts.mean(0);
  centred /= centred.norm(2, 1).max();  // LOOKALIKE: tensor-alias-then-mutate -- verts - mean is a fresh tensor
  return centred;
}

struct CameraRig {
  torch::Tensor R;    // rows are the camera axes in world coordinates
  torch::Tensor eye;
  CameraRig to(torch::Device d) const { return {R.to(d), eye.to(d)}; }
};

CameraRig make_ring(int64_t n_views, double dist, double elev_deg) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto az = torch::arange(n_views, opts) * (2.0 * M_PI / n_views);
  const double el = elev_deg * M_PI / 180.0;
  auto eye64 = torch::stack({dist * std::cos(el) * torch::sin(az), torch::full_like(az, dist * std::sin(el)),
                             dist * std::cos(el) * torch::cos(az)}, 1);
  auto z = -eye64 / eye64.norm(2, 1, true);
  auto up = torch::tensor({0.0, 1.0, 0.0}, opts).expand_as(z);
  auto x = torch::cross(up, z, 1);
  x = x / x.norm(2, 1, true);
  auto y = torch::cross(z, x, 1);

  CameraRig rig;
  rig.R = torch::stack({x, y, z}, 1).to(torch::kFloat);
  rig.eye = torch::empty({n_views, 3});
  rig.eye.copy_(eye64);  // EXPECT: tensor-copy-narrowing
  return rig;
}

inline torch::Tensor cross2(const torch::Tensor& u, const torch::Tensor& v) {
  return u.select(-1, 0) * v.select(-1, 1) - u.select(-1, 1) * v.select(-1, 0);
}

// Signed distance of every pixel to the line through a and b.
torch::Tensor edge_distance(const torch::Tensor& q, const torch::Tensor& a, const torch::Tensor& b) {
  auto e = b - a;
  auto len = e.norm(2, -1).clamp_min(1e-8);
  return cross2(e, q - a) / len;
}

class SoftSilhouetteRendererImpl : public torch::nn::Module {
 public:
  explicit SoftSilhouetteRendererImpl(RasterConfig cfg) : cfg_(cfg) {
    const int64_t S = cfg_.image_size;
    const double half = 1.0 / S;
    auto xs = torch::linspace(-1.0 + half, 1.0 - half, S);
    auto ys = torch::linspace(1.0 - half, -1.0 + half, S);
    auto grid = torch::meshgrid({ys, xs}, "ij");
    // FACT: g = torch.meshgrid(torch.arange(4.), torch.arange(5.), indexing='ij'); assert not is_contiguous(g[1]) and is_copy_of(g[1].flatten(), g[1])
    pixels_ = register_buffer("pixels", torch::stack({grid[1].flatten(), grid[0].flatten()}, 1));  // EXPECT: tensor-reshape-non-contiguous
    inv_sigma_ = torch::scalar_tensor(1.0 / cfg_.sigma);
  }

  torch::Tensor project(const torch::Tensor& verts, const torch::Tensor& R, const torch::Tensor& eye) const {
    auto cam = torch::matmul(verts - eye, R.t());
    auto z = cam.select(1, 2).clamp_min(cfg_.znear).unsqueeze(1);
    return cfg_.focal * cam.slice(1, 0, 2) / z;
  }

  torch::Tensor forward(const torch::Tensor& verts, const torch::Tensor& faces, const torch::Tensor& R,
                        const torch::Tensor& eye) {
    auto xy = project(verts, R, eye);
    // FACT: p = torch.randn(6, 2); f = torch.tensor([[0, 1, 2], [2, 3, 4]]); t = p.index_select(0, f.view(-1)); assert is_contiguous(t) and not raises(lambda: t.view(-1, 3, 2))
    auto tri = xy.index_select(0, faces.view(-1)).view({-1, 3, 2});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
    auto a = tri.select(1, 0), b = tri.select(1, 1), c = tri.select(1, 2);
    auto orient = torch::sign(cross2(b - a, c - a));

    auto q = pixels_.unsqueeze(1);
    auto d = torch::min(torch::min(edge_distance(q, a, b), edge_distance(q, b, c)), edge_distance(q, c, a));
    auto prob = torch::sigmoid(d * orient * inv_sigma_);  // LOOKALIKE: tensor-device-mismatch -- inv_sigma_ is a 0-dim CPU tensor, allowed with CUDA operands
    // FACT: x = torch.randn(4, 3, requires_grad=True); p = torch.sigmoid(x); p.clamp_max_(1 - 1e-6); assert backward_fails(lambda: torch.log1p(-p).sum().backward())
    prob.clamp_max_(1.0 - 1e-6);  // EXPECT: tensor-inplace-on-saved
    auto log_miss = torch::log1p(-prob).sum(1);
    auto coverage = 1.0 - torch::exp(log_miss);
    // FACT: x = torch.randn(5, requires_grad=True); c = 1.0 - torch.exp(x); c.clamp_(0.0, 1.0); c.sum().backward(); assert x.grad is not None
    coverage.clamp_(0.0, 1.0);  // LOOKALIKE: tensor-inplace-on-saved -- 1 - exp(..) is not kept by any backward formula
    return coverage.view({cfg_.image_size, cfg_.image_size});
  }

 private:
  RasterConfig cfg_;
  torch::Tensor pixels_;
  torch::Tensor inv_sigma_;
};
TORCH_MODULE(SoftSilhouetteRenderer);

class DeformableMeshImpl : public torch::nn::Module {
 public:
  DeformableMeshImpl(const torch::Tensor& base_verts, const torch::Tensor& faces) {
    base_verts_ = register_buffer("base_verts", base_verts);
    faces_ = register_buffer("faces", faces);
    offsets_ = register_parameter("offsets", torch::zeros_like(base_verts));
  }

  torch::Tensor verts() const { return base_verts_ + offsets_; }

  // Keep every vertex within max_offset of the template.
  void clamp_offsets(double max_offset) {
    offsets_.clamp_(-max_offset, max_offset);  // EXPECT: tensor-inplace-on-leaf
  }

  void reset() {
    torch::NoGradGuard no_grad;
    offsets_.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  torch::Tensor base_verts_, faces_, offsets_;
};
TORCH_MODULE(DeformableMesh);

struct EdgeList {
  torch::Tensor src, dst, degree;
};

EdgeList directed_edges(const torch::Tensor& faces, int64_t n_verts) {
  EdgeList e;
  e.src = torch::cat({faces.select(1, 0), faces.select(1, 1), faces.select(1, 2)});
  e.dst = torch::cat({faces.select(1, 1), faces.select(1, 2), faces.select(1, 0)});
  e.degree = torch::bincount(e.src, {}, n_verts).to(torch::kFloat).clamp_min(1.0);
  return e;
}

torch::Tensor laplacian_loss(const torch::Tensor& verts, const EdgeList& e) {
  auto nbr = torch::zeros_like(verts);
  nbr.index_add_(0, e.src, verts.index_select(0, e.dst));  // LOOKALIKE: tensor-inplace-on-leaf -- zeros_like does not require grad
  auto lap = verts - nbr / e.degree.unsqueeze(1);
  return lap.pow(2).sum(1).mean();
}

torch::Tensor edge_loss(const torch::Tensor& verts, const EdgeList& e) {
  return (verts.index_select(0, e.src) - verts.index_select(0, e.dst)).pow(2).sum(1).mean();
}

torch::Tensor soft_iou_per_view(const torch::Tensor& pred, const torch::Tensor& target) {
  auto inter = (pred * target).sum({1, 2});
  auto uni = (pred + target - pred * target).sum({1, 2});
  return 1.0 - inter / (uni + 1e-6);
}

void write_pgm(const torch::Tensor& img255, const std::string& path) {
  auto bytes = img255.clone();  // EXPECT: tensor-unnecessary-clone
  bytes.clamp_(0.0, 255.0);
  auto u8 = bytes.to(torch::kU8).cpu().contiguous();
  std::ofstream out(path, std::ios::binary);
  out << "P5\n" << u8.size(1) << " " << u8.size(0) << "\n255\n";
  out.write(reinterpret_cast<const char*>(u8.data_ptr<uint8_t>()), u8.numel());
}

}  // namespace softfit

int main() {
  using namespace softfit;
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  RasterConfig rcfg;
  FitConfig fit;

  Mesh sphere = make_uv_sphere(16, 32, 1.0f);
  Mesh target = make_uv_sphere(24, 48, 1.0f);
  target.verts = bumpy(target.verts);
  auto target_unit = to_unit_sphere(target.verts);
  std::printf("target radius before normalisation: %.3f\n", target.verts.norm(2, 1).max().item<double>());

  SoftSilhouetteRenderer renderer(rcfg);
  renderer->to(device);
  CameraRig rig = make_ring(fit.n_views, 2.7, 25.0).to(device);

  torch::Tensor target_sils;
  {
    torch::NoGradGuard no_grad;
    auto tv = target_unit.to(device);
    auto tf = target.faces.to(device);
    std::vector<torch::Tensor> sils;
    for (int64_t v = 0; v < fit.n_views; ++v) {
      sils.push_back(renderer->forward(tv, tf, rig.R[v], rig.eye[v]));
    }
    auto masks = torch::stack(sils) > 0.5;
    target_sils = torch::empty(masks.sizes());
    target_sils.copy_(masks);  // LOOKALIKE: tensor-copy-narrowing -- bool into float is exact
  }

  DeformableMesh mesh(centred_copy(sphere.verts), sphere.faces);
  mesh->to(device);
  mesh->reset();
  EdgeList edges = directed_edges(mesh->faces_, mesh->base_verts_.size(0));
  torch::optim::Adam opt(mesh->parameters(), torch::optim::AdamOptions(fit.lr));

  auto view_weights = torch::ones({fit.n_views});
  view_weights[0] = 2.0;  // the front view is the one people look at
  view_weights /= view_weights.sum();
  std::vector<torch::Tensor> loss_history;
  std::vector<torch::Tensor> snapshots;

  for (int64_t it = 0; it < fit.iterations; ++it) {
    auto tgt = target_sils.to(device);  // EXPECT: tensor-clone-in-loop
    auto verts = mesh->verts();
    std::vector<torch::Tensor> preds;
    for (int64_t v = 0; v < fit.n_views; ++v) {
      preds.push_back(renderer->forward(verts, mesh->faces_, rig.R[v], rig.eye[v]));
    }
    auto pred = torch::stack(preds);

    if (it % fit.log_every == 0) {
      auto shown = pred.detach()[0];
      shown.mul_(255.0);  // EXPECT: tensor-inplace-on-detached
      write_pgm(shown, "fit_" + std::to_string(it) + ".pgm");
    }

    auto iou = soft_iou_per_view(pred, tgt);
    auto loss = (iou * view_weights).sum()  // EXPECT: tensor-device-mismatch
                + fit.w_laplacian * laplacian_loss(verts, edges) + fit.w_edge * edge_loss(verts, edges);

    opt.zero_grad();
    loss.backward();
    opt.step();
    mesh->clamp_offsets(fit.max_offset);

    loss_history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (it % fit.snapshot_every == 0) {
      snapshots.push_back(verts.detach().clone());  // LOOKALIKE: tensor-clone-in-loop, tensor-graph-kept-across-iterations -- verts change every step and the copy is detached
    }
    if (it % fit.log_every == 0) {
      std::printf("it %4ld  loss %.5f\n", static_cast<long>(it), loss.item<double>());  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
    }
  }

  auto curve = torch::stack(loss_history).detach().cpu();
  std::printf("loss: first %.4f last %.4f, %zu snapshots\n", curve[0].item<double>(), curve[-1].item<double>(),
              snapshots.size());
  return 0;
}
