// Triangle-mesh utilities for the scan-to-template pipeline: edge extraction, uniform and
// cotangent Laplacians, smoothing, vertex normals, curvature colouring for the viewer, and a
// GPU fit of a template mesh to a scanned point cloud (chamfer + Laplacian + normal terms).
#include <torch/torch.h>

#include <iostream>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

struct Mesh {
  torch::Tensor verts;  // [V, 3] float32
  torch::Tensor faces;  // [F, 3] int64
};

struct SmoothConfig {
  int64_t iterations = 10;
  double lambda = 0.5;
  double mu = -0.53;  // Taubin's shrink-compensation step
  double tol = 1e-6;
};

struct FitConfig {
  int64_t iterations = 800;
  double lr = 5e-4;
  double w_lap = 0.2;
  double w_normal = 0.01;
  double max_disp = 0.05;
  int64_t log_every = 100;
  int64_t recenter_every = 200;
};

Mesh make_mesh(std::vector<float>& vbuf, std::vector<int64_t>& fbuf) {
  const int64_t nv = static_cast<int64_t>(vbuf.size()) / 3;
  const int64_t nf = static_cast<int64_t>(fbuf.size()) / 3;
  Mesh m;
  m.verts = torch::from_blob(vbuf.data(), {nv, 3}, torch::kFloat).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob does not own the loader's buffer
  m.faces = torch::from_blob(fbuf.data(), {nf, 3}, torch::kLong).clone();
  return m;
}

// Centre at the origin and scale the longest bounding-box side to 1.
torch::Tensor normalize_to_unit_box(const torch::Tensor& verts) {
  auto lo = std::get<0>(verts.min(0));
  auto hi = std::get<0>(verts.max(0));
  auto scale = (hi - lo).max().clamp_min(1e-12);
  // FACT: v = torch.randn(6, 3); c = v - v.mean(0); assert is_copy_of(c, v)
  auto centered = verts - 0.5 * (lo + hi);
  centered /= scale;  // LOOKALIKE: tensor-alias-then-mutate -- the subtraction made a new tensor
  return centered;
}

// Undirected edges, each once, as [E, 2] with e[:, 0] < e[:, 1].
torch::Tensor unique_edges(const torch::Tensor& faces, int64_t num_verts) {
  // FACT: f = torch.randint(0, 9, (4, 3)); e = torch.stack([f, f.roll(-1, 1)], 2); assert is_contiguous(e) and is_view_of(e.view(-1, 2), e)
  auto e = torch::stack({faces, faces.roll(-1, 1)}, 2).view({-1, 2});  // LOOKALIKE: tensor-view-non-contiguous -- stack returns a contiguous tensor
  auto sorted = std::get<0>(e.sort(1));
  auto key = sorted.select(1, 0) * num_verts + sorted.select(1, 1);
  auto uniq = std::get<0>(torch::_unique(key, /*sorted=*/true, /*return_inverse=*/false));
  return torch::stack({uniq.div(num_verts, "floor"), uniq.remainder(num_verts)}, 1);
}

// (mean of the one-ring) - v, per vertex.
torch::Tensor uniform_laplacian(const torch::Tensor& verts, const torch::Tensor& edges) {
  const int64_t V = verts.size(0);
  auto i = edges.select(1, 0);
  auto j = edges.select(1, 1);
  auto nbr = torch::zeros_like(verts);
  nbr.index_add_(0, i, verts.index_select(0, j));
  nbr.index_add_(0, j, verts.index_select(0, i));
  auto ones = torch::ones({edges.size(0)}, verts.options());
  auto deg = torch::zeros({V}, verts.options());
  deg.index_add_(0, i, ones).index_add_(0, j, ones);
  return nbr / deg.clamp_min(1.0).unsqueeze(1) - verts;
}

// Dense symmetric cotangent weights W[i, j] = (cot a_ij + cot b_ij) / 2; meshes up to ~10k verts.
torch::Tensor cotangent_weights(const torch::Tensor& verts, const torch::Tensor& faces) {
  const int64_t V = verts.size(0);
  auto v0 = verts.index_select(0, faces.select(1, 0));
  auto v1 = verts.index_select(0, faces.select(1, 1));
  auto v2 = verts.index_select(0, faces.select(1, 2));
  auto cot = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a * b).sum(1) / torch::cross(a, b, 1).norm(2, 1).clamp_min(1e-12);
  };
  // Column k: cotangent of the angle at corner k, which weighs the opposite edge.
  auto c = torch::stack({cot(v1 - v0, v2 - v0), cot(v2 - v1, v0 - v1), cot(v0 - v2, v1 - v2)}, 1);
  auto opp_i = torch::tensor({1, 2, 0}, torch::kLong);
  auto opp_j = torch::tensor({2, 0, 1}, torch::kLong);
  // FACT: f = torch.randint(0, 9, (4, 3)); g = f.index_select(1, torch.tensor([1, 2, 0])); assert is_contiguous(g) and is_view_of(g.reshape(-1), g)
  auto ii = faces.index_select(1, opp_i).reshape({-1});  // LOOKALIKE: tensor-reshape-non-contiguous -- index_select made a contiguous copy
  auto jj = faces.index_select(1, opp_j).reshape({-1});
  auto W = torch::zeros({V, V}, verts.options());
  W.index_put_({ii, jj}, 0.5 * c.reshape({-1}), /*accumulate=*/true);
  // FACT: W = torch.rand(5, 5); assert raises(lambda: W.add_(W.t()), "some elements of the input tensor")
  W.add_(W.t());  // EXPECT: tensor-inplace-overlap
  return W;
}

torch::Tensor cotangent_smooth(const torch::Tensor& verts, const torch::Tensor& faces, const SmoothConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto v = verts;
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    auto W = cotangent_weights(v, faces).clamp_min(0.0);  // obtuse triangles give negative weights
    auto Lv = W.mm(v) / W.sum(1, true).clamp_min(1e-12) - v;
    v = v + cfg.lambda * Lv;
  }
  return v;
}

torch::Tensor laplacian_smooth(const torch::Tensor& verts, const torch::Tensor& edges, const SmoothConfig& cfg) {
  torch::NoGradGuard no_grad;
  torch::Tensor smoothed = verts;
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    // FACT: v = torch.randn(5, 3); s = v; s += 0.5 * torch.randn(5, 3); assert shares_storage(s, v) and torch.equal(s, v)
    smoothed += cfg.lambda * uniform_laplacian(smoothed, edges);  // EXPECT: tensor-alias-then-mutate
  }
  return smoothed;
}

// Taubin lambda/mu smoothing: no shrinkage, stops early once a pass barely moves anything.
torch::Tensor taubin_smooth(const torch::Tensor& verts, const torch::Tensor& edges, const SmoothConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto v = verts.clone();  // LOOKALIKE: tensor-unnecessary-clone -- the copy is rewritten in place below and returned
  for (int64_t it = 0; it < cfg.iterations; ++it) {
    auto prev = v.clone();  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- snapshot of v, which this iteration rewrites in place
    v.add_(uniform_laplacian(v, edges), cfg.lambda);
    v.add_(uniform_laplacian(v, edges), cfg.mu);
    if ((v - prev).abs().max().item<double>() < cfg.tol) break;
  }
  return v;
}

torch::Tensor face_normals(const torch::Tensor& verts, const torch::Tensor& faces) {
  auto v0 = verts.index_select(0, faces.select(1, 0));
  auto v1 = verts.index_select(0, faces.select(1, 1));
  auto v2 = verts.index_select(0, faces.select(1, 2));
  auto n = torch::cross(v1 - v0, v2 - v0, 1);
  auto len = n.norm(2, 1, /*keepdim=*/true);
  n.div_(len.clamp_min(1e-12));  // EXPECT: tensor-inplace-on-saved
  return n;
}

// Angle-agnostic vertex normals: mean of the unit normals of the incident faces.
torch::Tensor vertex_normals(const torch::Tensor& verts, const torch::Tensor& faces) {
  auto fn = face_normals(verts, faces);
  auto vn = torch::zeros_like(verts);
  for (int64_t k = 0; k < 3; ++k) vn.index_add_(0, faces.select(1, k), fn);
  return F::normalize(vn, F::NormalizeFuncOptions().dim(1).eps(1e-12));
}

// Mean-curvature magnitude mapped to an 8-bit red/blue ramp for the viewer.
torch::Tensor curvature_colors(const torch::Tensor& verts, const torch::Tensor& edges) {
  torch::NoGradGuard no_grad;
  auto curv = uniform_laplacian(verts, edges).norm(2, 1);
  auto t = (curv - curv.min()) / (curv.max() - curv.min() + 1e-12);
  auto rgb = torch::empty({verts.size(0), 3}, torch::kUInt8);
  rgb.select(1, 0).copy_(t * 255.0);  // EXPECT: tensor-copy-narrowing
  rgb.select(1, 1).fill_(48);
  rgb.select(1, 2).copy_(((1.0 - t) * 255.0).round());  // LOOKALIKE: tensor-copy-narrowing -- rounded to whole numbers in [0, 255]
  return rgb;
}

torch::Tensor chamfer_distance(const torch::Tensor& a, const torch::Tensor& b) {
  auto d = torch::cdist(a, b).pow(2);
  return std::get<0>(d.min(1)).mean() + std::get<0>(d.min(0)).mean();
}

struct FitResult {
  torch::Tensor verts;
  double mean_loss = 0.0;
  int64_t best_iter = 0;
};

FitResult fit_to_point_cloud(const Mesh& mesh, const torch::Tensor& target_cpu, const torch::Tensor& boundary,
                             const FitConfig& cfg) {
  TORCH_CHECK(torch::cuda::is_available(), "mesh fitting needs a CUDA device");
  torch::Device dev(torch::kCUDA);
  const int64_t V = mesh.verts.size(0);
  auto verts_d = mesh.verts.to(dev);
  auto faces_d = mesh.faces.to(dev);
  auto edges_d = unique_edges(mesh.faces, V).to(dev);
  auto e0 = edges_d.select(1, 0);
  auto e1 = edges_d.select(1, 1);
  auto target_d = target_cpu.to(dev);
  auto diag = (std::get<0>(target_cpu.max(0)) - std::get<0>(target_cpu.min(0))).norm();

  // Boundary vertices of the template are pinned: their gradient is zeroed every step.
  auto pin_mask = torch::ones({V, 1});
  pin_mask.index_fill_(0, boundary, 0.0);

  auto offsets = torch::zeros({V, 3}, torch::TensorOptions().device(dev).requires_grad(true));
  torch::optim::Adam opt(std::vector<torch::Tensor>{offsets}, torch::optim::AdamOptions(cfg.lr));
  double total = 0.0;
  std::vector<torch::Tensor> history;

  for (int64_t it = 0; it < cfg.iterations; ++it) {
    opt.zero_grad();
    auto v = verts_d + offsets;
    auto cham = chamfer_distance(v, target_d);
    auto lap = uniform_laplacian(v, edges_d).pow(2).sum(1).mean();
    auto vn = vertex_normals(v, faces_d);
    auto cons = (1.0 - (vn.index_select(0, e0) * vn.index_select(0, e1)).sum(1)).mean();
    auto loss = cham / diag + cfg.w_lap * lap + cfg.w_normal * cons;  // LOOKALIKE: tensor-device-mismatch -- diag is a 0-dim CPU tensor, allowed beside CUDA
    loss.backward();
    offsets.grad().mul_(pin_mask);  // EXPECT: tensor-device-mismatch
    opt.step();
    offsets.clamp_(-cfg.max_disp, cfg.max_disp);  // EXPECT: tensor-inplace-on-leaf
    if (cfg.recenter_every > 0 && it % cfg.recenter_every == 0) {
      torch::NoGradGuard no_grad;
      offsets.sub_(offsets.mean(0, /*keepdim=*/true));  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    total += loss.item<double>();  // EXPECT: tensor-sync-in-loop
    history.push_back(cham);  // EXPECT: tensor-graph-kept-across-iterations
    if (it % cfg.log_every == 0) {
      std::cout << "fit " << it << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
  }

  FitResult r;
  r.best_iter = torch::stack(history).argmin().item<int64_t>();
  r.mean_loss = total / static_cast<double>(cfg.iterations);
  r.verts = (verts_d + offsets).detach().cpu();
  return r;
}

// Template -> scan: normalise both, fit, then a light Taubin pass and colours for the viewer.
Mesh register_template(const Mesh& tmpl, const torch::Tensor& scan_points, const torch::Tensor& boundary,
                       torch::Tensor& colors_out) {
  Mesh m{normalize_to_unit_box(tmpl.verts), tmpl.faces};
  auto target = normalize_to_unit_box(scan_points);
  auto fit = fit_to_point_cloud(m, target, boundary, FitConfig{});
  auto edges = unique_edges(m.faces, m.verts.size(0));
  SmoothConfig smooth;
  smooth.iterations = 3;
  m.verts = taubin_smooth(fit.verts, edges, smooth);
  colors_out = curvature_colors(m.verts, edges);
  std::cout << "best iteration " << fit.best_iter << ", mean loss " << fit.mean_loss << "\n";
  return m;
}
