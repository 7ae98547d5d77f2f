// Learned point-cloud correspondence with entropic optimal transport. A PointNet-style encoder
// embeds two scans of the same object, the cosine distance between the embeddings is the cost
// of a balanced OT problem, and a fixed number of log-domain Sinkhorn iterations (with a learned
// temperature) gives a soft assignment that is differentiable end to end. Training: a matching
// loss against the true partner of each point, a matchability head, and the entropic transport
// cost plus a rigidity term as regularisers. Evaluation runs on padded full scans and reads off
// mutual-best hard matches, the inlier ratio and the soft flow error.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct OtConfig {
  int64_t in_dim = 3, hidden = 128, feat_dim = 96, max_points = 1024;
  double init_eps = 0.05, min_eps = 0.01, max_eps = 0.5, tol = 1e-4;
  int64_t sinkhorn_iters = 50, epochs = 60, log_every = 50;
  double lr = 3e-4, reg_weight = 0.1, conf_threshold = 0.5, inlier_radius = 0.05;
};

// One training pair: fixed-size samples of two scans and, for each source point, the index of its
// partner in the target sample (-1 when it is occluded there).
struct PairBatch {
  torch::Tensor src, tgt, match; // [B, N, 3], [B, M, 3], [B, N] int64
};

// Batches of full scans for evaluation, padded to max_points, with validity masks [B, max_points].
struct PaddedPair {
  torch::Tensor src, tgt, valid_src, valid_tgt, match;
};

// Centre each cloud and scale it into the unit ball: the encoder is trained on normalised scans.
torch::Tensor normalize_cloud(const torch::Tensor &pts) {
  torch::Tensor x = pts;
  // FACT: p = torch.randn(2, 6, 3); p0 = p.clone(); x = p; x -= p.mean(1, keepdim=True); assert shares_storage(x, p) and not torch.equal(p, p0)
  x -= pts.mean(1, /*keepdim=*/true); // EXPECT: tensor-alias-then-mutate -- x is the caller's cloud: centring it here moves the caller's points too
  auto radius = x.norm(2, -1, /*keepdim=*/true).amax(1, /*keepdim=*/true).clamp_min(1e-6);
  return x / radius;
}

// Log-weights of one side of the transport problem: uniform, or uniform over the valid points of
// each padded scan.
torch::Tensor log_marginal(int64_t B, int64_t N, const torch::Tensor &valid, const torch::TensorOptions &opts) {
  auto log_w = torch::full({1, N}, -std::log(static_cast<double>(N)), opts).expand({B, N});
  if (!valid.defined())
    return log_w;
  auto frac = valid.sum(1, /*keepdim=*/true).to(torch::kFloat) / static_cast<double>(N);
  // FACT: w = torch.full((1, 5), -1.6).expand(3, 5); assert raises(lambda: w.sub_(torch.rand(3, 1).log()), "more than one element of the written-to tensor")
  log_w -= frac.log(); // EXPECT: tensor-inplace-on-expanded -- every row of log_w is the same memory: PyTorch refuses the write
  return log_w.masked_fill(valid.logical_not(), -std::numeric_limits<double>::infinity());
}

// Log-domain Sinkhorn for cost C [B, N, M] and marginals log_a [B, N], log_b [B, M]; returns the
// log of the transport plan. f and g are the dual potentials.
torch::Tensor sinkhorn_log(const torch::Tensor &C, const torch::Tensor &log_a, const torch::Tensor &log_b,
                           const torch::Tensor &eps, int64_t iters, double tol) {
  auto f = torch::zeros_like(log_a);
  auto g = torch::zeros_like(log_b);
  for (int64_t it = 0; it < iters; ++it) {
    // FACT: C = torch.randn(2, 3, 4); t = C.transpose(1, 2); assert not is_contiguous(t) and is_copy_of(t.contiguous(), C)
    auto Ct = C.transpose(1, 2).contiguous(); // EXPECT: tensor-clone-in-loop -- the same cost matrix is transposed into a new buffer at every iteration
    auto f_next = eps * (log_a - torch::logsumexp((g.unsqueeze(1) - C) / eps, 2));
    g = eps * (log_b - torch::logsumexp((f_next.unsqueeze(1) - Ct) / eps, 2));
    auto delta = (f_next - f).abs().nan_to_num(0.0).amax();
    f = f_next;
    if (delta.item<double>() < tol) // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop iterating
      break;
  }
  return (f.unsqueeze(2) + g.unsqueeze(1) - C) / eps;
}

struct MatchOutput {
  torch::Tensor log_plan, cost, conf; // [B, N, M], [B, N, M], [B, N]
};

struct PointMatcherImpl : nn::Module {
  explicit PointMatcherImpl(const OtConfig &cfg) : cfg_(cfg) {
    conv1 = register_module("conv1", nn::Conv1d(nn::Conv1dOptions(cfg.in_dim, cfg.hidden, 1)));
    conv2 = register_module("conv2", nn::Conv1d(nn::Conv1dOptions(cfg.hidden, cfg.hidden, 1)));
    conv3 = register_module("conv3", nn::Conv1d(nn::Conv1dOptions(2 * cfg.hidden, cfg.feat_dim, 1)));
    bn1 = register_module("bn1", nn::BatchNorm1d(cfg.hidden));
    bn2 = register_module("bn2", nn::BatchNorm1d(cfg.hidden));
    score = register_module("score", nn::Linear(cfg.feat_dim, 1));
    log_eps = register_parameter("log_eps", torch::full({}, std::log(cfg.init_eps)));
  }

  // pts [B, N, 3] -> per-point features [B, D, N] (local features next to a global max-pooled one).
  torch::Tensor encode(const torch::Tensor &pts) {
    auto h = torch::relu(bn1(conv1(pts.transpose(1, 2))));
    h = torch::relu(bn2(conv2(h)));
    auto global = h.amax(2, /*keepdim=*/true).expand_as(h);
    return conv3(torch::cat({h, global}, 1));
  }

  MatchOutput forward(const torch::Tensor &src, const torch::Tensor &tgt, const torch::Tensor &valid_src = {},
                      const torch::Tensor &valid_tgt = {}) {
    const auto B = src.size(0), N = src.size(1), M = tgt.size(1);
    auto fs = encode(src), ft = encode(tgt);
    const auto D = fs.size(1);
    // FACT: f = torch.randn(2, 8, 5); assert not is_contiguous(f.transpose(1, 2)) and is_copy_of(f.transpose(1, 2).reshape(10, 8), f)
    auto rows = fs.transpose(1, 2).reshape({B * N, D}); // EXPECT: tensor-reshape-non-contiguous -- the channels-first features are copied point by point for the head
    // FACT: y = torch.nn.Linear(8, 1)(torch.randn(10, 8)); assert is_view_of(y.view(2, 5), y)
    auto conf = torch::sigmoid(score(rows)).view({B, N}); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output [B*N, 1] is contiguous
    auto a = F::normalize(fs, F::NormalizeFuncOptions().dim(1));
    auto b = F::normalize(ft, F::NormalizeFuncOptions().dim(1));
    auto cost = 1.0 - torch::bmm(a.transpose(1, 2), b);
    auto log_a = log_marginal(B, N, valid_src, cost.options());
    auto log_b = log_marginal(B, M, valid_tgt, cost.options());
    auto log_plan = sinkhorn_log(cost, log_a, log_b, log_eps.exp(), cfg_.sinkhorn_iters, cfg_.tol);
    return {log_plan, cost, conf};
  }

  OtConfig cfg_;
  nn::Conv1d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  nn::BatchNorm1d bn1{nullptr}, bn2{nullptr};
  nn::Linear score{nullptr};
  torch::Tensor log_eps;
};
TORCH_MODULE(PointMatcher);

void train_matcher(PointMatcher &model, const std::vector<PairBatch> &train, const OtConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  std::vector<torch::Tensor> ot_history;
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double running = 0;
    for (const auto &batch : train) {
      auto src = normalize_cloud(batch.src.to(device)); // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto tgt = normalize_cloud(batch.tgt.to(device));
      auto match = batch.match.to(device);
      const auto B = src.size(0), N = src.size(1), M = tgt.size(1);
      auto out = model->forward(src, tgt);

      // Rows of the plan sum to 1/N: shifted by log N they are each point's distribution over partners.
      auto log_cond = out.log_plan + std::log(static_cast<double>(N));
      // FACT: p = (torch.randn(2, 3, 1) + torch.randn(2, 1, 4) - torch.randn(2, 3, 4)) / 0.1 + 1.5; assert is_contiguous(p) and is_view_of(p.reshape(6, 4), p)
      auto nll = F::nll_loss(log_cond.reshape({B * N, M}), match.reshape({-1}), F::NLLLossFuncOptions().ignore_index(-1)); // LOOKALIKE: tensor-reshape-non-contiguous -- an elementwise result is contiguous: a view
      // FACT: m = torch.tensor([[0, -1, 2]]); h = (m >= 0).to(torch.float32); h.mul_(0.9).add_(0.05); assert (m >= 0).dtype == torch.bool and is_copy_of(h, m)
      auto has_match = (match >= 0).to(torch::kFloat); // a bool comparison: to(kFloat) makes a new float tensor
      has_match.mul_(0.9).add_(0.05); // LOOKALIKE: tensor-alias-then-mutate -- the float targets are a converted copy of a temporary mask
      auto conf_loss = F::binary_cross_entropy(out.conf, has_match);

      auto plan = out.log_plan.exp();
      auto ot_cost = (plan * out.cost).sum({1, 2}).mean();
      // FACT: l = torch.randn(2, 3, 4, requires_grad=True); p = l.exp(); c = (p * torch.rand(2, 3, 4, requires_grad=True)).sum(); p.mul_(3.0); assert backward_fails(lambda: (c + p.sum()).backward())
      plan.mul_(static_cast<double>(N)); // EXPECT: tensor-inplace-on-saved -- exp saved its result (and the product saved plan): loss.backward() throws
      auto soft_tgt = torch::bmm(plan, tgt);
      auto rigid = (torch::cdist(soft_tgt, soft_tgt) - torch::cdist(src, src)).abs().mean();

      auto loss = nll + conf_loss + cfg.reg_weight * (ot_cost + rigid);
      opt.zero_grad();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        // FACT: p = torch.nn.Parameter(torch.tensor(-3.0)); exec('with torch.no_grad(): p.clamp_(-4.6, -0.7)'); assert p.is_leaf and p.requires_grad
        model->log_eps.clamp_(std::log(cfg.min_eps), std::log(cfg.max_eps)); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      }
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop -- on a GPU this waits for every step only to sum the loss
      ot_history.push_back(ot_cost); // EXPECT: tensor-graph-kept-across-iterations -- each step's transport cost keeps its graph until the epoch report
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " eps " << model->log_eps.exp().item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    const auto mean_ot = torch::stack(ot_history).mean().item<double>();
    ot_history.clear();
    std::cout << "epoch " << epoch << " loss " << running / static_cast<double>(train.size()) << " transport cost "
              << mean_ot << "\n";
  }
}

struct EvalReport {
  torch::Tensor matches; // [scans, max_points] int64, -1 where no match was kept
  double inlier_ratio = 0, flow_err = 0;
};

EvalReport evaluate(PointMatcher &model, const std::vector<PaddedPair> &batches, const OtConfig &cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t total = 0;
  for (const auto &b : batches)
    total += b.src.size(0);
  EvalReport rep;
  rep.matches = torch::full({total, cfg.max_points}, -1, torch::kLong);
  std::vector<torch::Tensor> plans; // for the correspondence viewer
  auto thresh = torch::tensor(cfg.conf_threshold);
  auto opts = torch::TensorOptions().device(device);
  auto inliers = torch::zeros({}, opts.dtype(torch::kLong)), kept = torch::zeros({}, opts.dtype(torch::kLong));
  auto flow_err = torch::zeros({}, opts), valid_pts = torch::zeros({}, opts);
  int64_t row = 0;
  for (const auto &pair : batches) {
    auto src = pair.src.to(device); // LOOKALIKE: tensor-clone-in-loop -- each batch of scans is moved once
    auto tgt = pair.tgt.to(device);
    auto vs = pair.valid_src.to(device), vt = pair.valid_tgt.to(device), gt = pair.match.to(device);
    auto out = model->forward(normalize_cloud(src), normalize_cloud(tgt), vs, vt);
    const auto B = src.size(0), N = src.size(1);

    auto P = out.log_plan.exp();
    // FACT: l = torch.randn(2, 3, 4, requires_grad=True); exec('with torch.no_grad():\n    p = l.exp()\n    p.div_(p.sum(2, keepdim=True))'); assert p.grad_fn is None
    P.div_(P.sum(2, /*keepdim=*/true).clamp_min(1e-12)); // LOOKALIKE: tensor-inplace-on-saved -- nothing is recorded under NoGradGuard
    // FACT: P = torch.rand(2, 3, 4); t = torch.randn(2, 4, 3); s = torch.randn(2, 3, 3); flow = torch.bmm(P, t); flow -= s; assert is_copy_of(flow, P) and is_copy_of(flow, t)
    auto flow = torch::bmm(P, tgt);
    flow -= src; // LOOKALIKE: tensor-alias-then-mutate -- bmm made a tensor of its own
    auto partner = tgt.gather(1, gt.clamp_min(0).unsqueeze(-1).expand({-1, -1, tgt.size(2)}));
    auto gt_ok = (gt >= 0) & vs;
    flow_err += ((flow - (partner - src)).norm(2, -1) * gt_ok).sum();
    valid_pts += gt_ok.sum();

    auto nn_idx = std::get<1>(P.max(2));
    auto back = std::get<1>(P.max(1));
    auto mutual = back.gather(1, nn_idx) == torch::arange(N, nn_idx.options()).unsqueeze(0);
    auto keep = mutual & vs & (out.conf > thresh); // LOOKALIKE: tensor-device-mismatch -- thresh is a 0-dim CPU tensor, which CUDA ops accept
    auto matched = torch::where(keep, nn_idx, torch::full_like(nn_idx, -1));
    // FACT: d = torch.full((4, 5), -1, dtype=torch.long); s = torch.rand(2, 5, 4).max(2)[1]; d.narrow(0, 1, 2).copy_(s); assert s.dtype == torch.long and torch.equal(d[1:3], s)
    rep.matches.narrow(0, row, B).copy_(matched); // LOOKALIKE: tensor-copy-narrowing -- argmax indices are int64 like the buffer
    inliers += (keep & (matched == gt)).sum();
    kept += keep.sum();
    plans.push_back(P.cpu()); // LOOKALIKE: tensor-graph-kept-across-iterations, tensor-sync-in-loop -- no graph under NoGradGuard; the host copy is kept as data
    row += B;
  }
  rep.inlier_ratio = inliers.item<double>() / std::max(1.0, kept.item<double>());
  rep.flow_err = flow_err.item<double>() / std::max(1.0, valid_pts.item<double>());
  std::cout << "kept " << kept.item<int64_t>() << " matches, " << plans.size() << " plans for the viewer\n";
  return rep;
}

void run_ot_matching(const std::vector<PairBatch> &train, const std::vector<PaddedPair> &val, const OtConfig &cfg) {
  PointMatcher model(cfg);
  train_matcher(model, train, cfg);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto rep = evaluate(model, val, cfg, device);
  std::cout << "inlier ratio " << rep.inlier_ratio << ", soft flow error " << rep.flow_err << "\n";
}
