// Hypernetwork for multi-task regression (Ha et al. 2017; von Oswald et al. 2020). A learned task
// embedding is mapped by a hypernetwork to the full flat weight vector of a small two-layer target
// MLP; the vector is cut into weight matrices and biases, and the target network runs functionally
// (batched over tasks with bmm) on the generated weights. Meta-training samples a batch of tasks per
// step; evaluation scores held-out points on a shared grid, and a new task is fitted by optimising
// only a fresh task embedding with the hypernetwork frozen.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct HyperConfig {
  int64_t num_tasks = 512, task_dim = 32, in_dim = 8, hidden = 64, out_dim = 2, hyper_hidden = 256;
  int64_t meta_steps = 20000, log_every = 200, adapt_steps = 100;
  double lr = 1e-3, adapt_lr = 1e-2, weight_reg = 1e-4, dropout = 0.1, ema = 0.98, head_init_scale = 0.1;
  double adapt_tol = 1e-4, emb_clip = 3.0;
};

// A batch of T tasks sampled from the meta-training pool.
struct TaskBatch {
  torch::Tensor task_ids; // [T] int64
  torch::Tensor x, y;     // [T, N, in], [T, N, out]
};

// The generated parameters of the target MLP, one set per task.
struct TargetWeights {
  torch::Tensor w1, b1, w2, b2; // [T, H, in], [T, H], [T, out, H], [T, out]
};

int64_t target_param_count(const HyperConfig &c) { return c.in_dim * c.hidden + c.hidden + c.hidden * c.out_dim + c.out_dim; }

struct HyperNetImpl : nn::Module {
  explicit HyperNetImpl(const HyperConfig &cfg) : cfg_(cfg) {
    task_emb = register_module("task_emb", nn::Embedding(cfg.num_tasks, cfg.task_dim));
    fc1 = register_module("fc1", nn::Linear(cfg.task_dim, cfg.hyper_hidden));
    fc2 = register_module("fc2", nn::Linear(cfg.hyper_hidden, cfg.hyper_hidden));
    head = register_module("head", nn::Linear(cfg.hyper_hidden, target_param_count(cfg)));
    {
      torch::NoGradGuard no_grad;
      // FACT: e = torch.nn.Embedding(10, 4); g = torch.no_grad(); g.__enter__(); e.weight.normal_(0.0, 0.5); g.__exit__(None, None, None); assert e.weight.is_leaf and e.weight.requires_grad
      task_emb->weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(cfg.task_dim))); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    // Hyperfan-style start: a small head, so that the first generated target nets are near zero.
    // FACT: fc = torch.nn.Linear(16, 40); assert raises(lambda: fc.weight.mul_(0.1), "a leaf Variable that requires grad")
    head->weight.mul_(cfg.head_init_scale); // EXPECT: tensor-inplace-on-leaf
    nn::init::zeros_(head->bias); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
  }

  torch::Tensor embed(const torch::Tensor &task_ids) { return task_emb(task_ids); }

  // Flat target parameters [T, P] for task embeddings z [T, task_dim].
  torch::Tensor generate(const torch::Tensor &z) {
    auto h = torch::relu(fc1(z));
    h = torch::relu(fc2(h));
    return head(h);
  }

  // Cuts the flat vector into the target's tensors. The head emits the first layer input-major (one
  // H-vector per input feature, the hyperfan-in layout); it is kept [T, H, in] like nn::Linear.
  TargetWeights unpack(const torch::Tensor &flat) const {
    const auto T = flat.size(0), I = cfg_.in_dim, H = cfg_.hidden, O = cfg_.out_dim;
    int64_t off = 0;
    TargetWeights w;
    // FACT: f = torch.randn(4, 30); assert is_view_of(f.narrow(1, 0, 12).view(4, 3, 4), f)
    w.w1 = flat.narrow(1, off, I * H).view({T, I, H}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- splitting one dim of a column block is a view
    off += I * H;
    w.b1 = flat.narrow(1, off, H);
    off += H;
    // FACT: f = torch.randn(4, 30); assert is_view_of(f.narrow(1, 16, 10).view(4, 2, 5), f)
    w.w2 = flat.narrow(1, off, O * H).view({T, O, H}); // LOOKALIKE: tensor-view-non-contiguous -- a split of the column block again
    off += O * H;
    w.b2 = flat.narrow(1, off, O);
    return w;
  }

  HyperConfig cfg_;
  nn::Embedding task_emb{nullptr};
  nn::Linear fc1{nullptr}, fc2{nullptr}, head{nullptr};
};
TORCH_MODULE(HyperNet);

// The target MLP, run functionally for T tasks at once: x [T, N, in] -> [T, N, out].
torch::Tensor target_forward(const TargetWeights &w, const torch::Tensor &x, double drop_p, bool train) {
  auto h = torch::bmm(x, w.w1.transpose(1, 2));
  // FACT: w = torch.randn(2, 5, 4, requires_grad=True); b = torch.randn(2, 5, requires_grad=True); h = torch.bmm(torch.randn(2, 3, 4), w.transpose(1, 2)); h.add_(b.unsqueeze(1)); h.relu().sum().backward(); assert w.grad is not None
  h.add_(w.b1.unsqueeze(1)); // LOOKALIKE: tensor-inplace-on-saved -- bmm saves its inputs, not its output
  h = torch::relu(h);
  if (train && drop_p > 0) {
    auto keep = torch::bernoulli(torch::full_like(h, 1.0 - drop_p));
    // FACT: w = torch.randn(2, 5, 4, requires_grad=True); h = torch.relu(torch.bmm(torch.randn(2, 3, 4), w.transpose(1, 2))); h.mul_(torch.bernoulli(torch.full_like(h, 0.9)) / 0.9); assert backward_fails(lambda: h.sum().backward())
    h.mul_(keep / (1.0 - drop_p)); // EXPECT: tensor-inplace-on-saved
  }
  return torch::bmm(h, w.w2.transpose(1, 2)) + w.b2.unsqueeze(1);
}

// L2 penalty on the generated weights, averaged over tasks.
torch::Tensor weight_penalty(const TargetWeights &w) {
  const auto T = w.w1.size(0);
  // FACT: f = torch.randn(4, 30); w1 = f.narrow(1, 0, 12).view(4, 3, 4).transpose(1, 2); assert raises(lambda: w1.view(4, -1), "view size is not compatible")
  auto l1 = w.w1.view({T, -1}).pow(2).sum(1); // EXPECT: tensor-view-non-contiguous
  // FACT: f = torch.randn(4, 30); w2 = f.narrow(1, 16, 10).view(4, 2, 5); assert is_view_of(w2.view(4, -1), f)
  auto l2 = w.w2.view({T, -1}).pow(2).sum(1); // LOOKALIKE: tensor-view-non-contiguous -- merges back the two dims the split made
  return (l1 + l2 + w.b1.pow(2).sum(1) + w.b2.pow(2).sum(1)).mean();
}

// Cosine similarity of the first-layer weights between the tasks of a batch: how much the
// hypernetwork specialises. Logged only.
torch::Tensor task_similarity(const TargetWeights &w) {
  // FACT: f = torch.randn(4, 30); w1 = f.narrow(1, 0, 12).view(4, 3, 4).transpose(1, 2); r = w1.flatten(1); assert is_copy_of(r, f)
  auto v = F::normalize(w.w1.flatten(1), F::NormalizeFuncOptions().dim(1)); // EXPECT: tensor-reshape-non-contiguous
  return torch::mm(v, v.t());
}

struct InputStats {
  torch::Tensor mean, stdev; // [in]
};

InputStats input_stats(const std::vector<TaskBatch> &pool) {
  std::vector<torch::Tensor> xs;
  for (const auto &b : pool)
    xs.push_back(b.x.reshape({-1, b.x.size(-1)}));
  auto all = torch::cat(xs);
  return {all.mean(0), all.std(0).clamp_min(1e-6)};
}

void meta_train(HyperNet &net, const std::vector<TaskBatch> &pool, const HyperConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  net->to(device);
  const auto stats = input_stats(pool);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr));
  torch::Tensor loss_ema = torch::zeros({});
  auto reg_sum = torch::zeros({}, torch::TensorOptions().device(device));
  double running = 0;
  for (int64_t step = 0; step < cfg.meta_steps; ++step) {
    const auto &batch = pool[static_cast<size_t>(step) % pool.size()];
    // Standardise on the host, then move.
    auto x = batch.x.contiguous();
    // FACT: b = torch.randn(4, 6, 3); x = b.contiguous(); x.sub_(torch.zeros(3) + 0.5).div_(torch.ones(3) * 2); assert shares_storage(x, b)
    x.sub_(stats.mean).div_(stats.stdev); // EXPECT: tensor-alias-then-mutate
    x = x.to(device);
    auto y = batch.y.to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch of the pool every step
    auto ids = batch.task_ids.to(device);

    auto w = net->unpack(net->generate(net->embed(ids)));
    auto pred = target_forward(w, x, cfg.dropout, /*train=*/true);
    auto reg = weight_penalty(w);
    auto loss = F::mse_loss(pred, y) + cfg.weight_reg * reg;
    opt.zero_grad();
    loss.backward();
    opt.step();

    loss_ema = cfg.ema * loss_ema + (1.0 - cfg.ema) * loss; // EXPECT: tensor-graph-kept-across-iterations
    reg_sum += reg.detach(); // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: no graph is kept
    running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    if ((step + 1) % cfg.log_every == 0) {
      std::cout << "step " << step + 1 << " loss " << running / cfg.log_every << " ema " << loss_ema.item<double>() // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
                << " task sim " << task_similarity(w).mean().item<double>() << "\n";
      running = 0;
    }
  }
  std::cout << "mean weight penalty " << reg_sum.item<double>() / cfg.meta_steps << "\n";
}

// Mean squared error on held-out tasks, all sampled on one shared grid grid_x [G, in] (batch.y holds
// the targets there). Predictions and targets are centred per grid point, so only the task-specific
// part is scored; the spread of the predictions across tasks is logged.
double evaluate(HyperNet &net, const std::vector<TaskBatch> &tasks, const torch::Tensor &grid_x, const InputStats &stats,
                torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto mu = stats.mean.to(device), sd = stats.stdev.to(device);
  auto mse = torch::zeros({}, torch::TensorOptions().device(device)); // LOOKALIKE: tensor-device-mismatch -- made on the device it is added to
  std::vector<torch::Tensor> spreads;
  int64_t n = 0;
  for (const auto &batch : tasks) {
    auto grid = grid_x.to(device); // EXPECT: tensor-clone-in-loop
    const auto T = batch.task_ids.size(0);
    auto xg = ((grid - mu) / sd).unsqueeze(0).expand({T, -1, -1});
    auto w = net->unpack(net->generate(net->embed(batch.task_ids.to(device))));
    auto pred = target_forward(w, xg, 0.0, /*train=*/false);
    auto y = batch.y.to(device);
    // FACT: p = torch.randn(3, 5, 1); m = p.mean(0, keepdim=True); p.sub_(m.expand_as(p)); assert torch.allclose(p.mean(0), torch.zeros(5, 1), atol=1e-6)
    pred.sub_(pred.mean(0, /*keepdim=*/true).expand_as(pred)); // LOOKALIKE: tensor-inplace-on-expanded, tensor-inplace-overlap -- the expanded mean is a new tensor, only read
    mse += (pred - (y - y.mean(0, true))).pow(2).sum();
    // FACT: p = torch.randn(3, 5, 2); assert is_copy_of(p.transpose(0, 1).reshape(5, -1), p)
    auto per_point = pred.transpose(0, 1).reshape({pred.size(1), -1}); // EXPECT: tensor-reshape-non-contiguous
    spreads.push_back(per_point.std(1)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
    n += pred.numel();
  }
  net->train();
  std::cout << "prediction spread across tasks " << torch::cat(spreads).mean().item<double>() << "\n";
  return mse.item<double>() / static_cast<double>(n);
}

// Few-shot fit of an unseen task: only a new task embedding is optimised; the hypernetwork stays as it is.
torch::Tensor adapt_new_task(HyperNet &net, const torch::Tensor &x_support, const torch::Tensor &y_support, const HyperConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto z = net->task_emb->weight.mean(0, /*keepdim=*/true).detach().clone().requires_grad_(true);
  auto z_start = z.detach().clone(); // LOOKALIKE: tensor-unnecessary-clone -- opt.step() rewrites z while the start point is still needed
  torch::optim::Adam opt({z}, torch::optim::AdamOptions(cfg.adapt_lr));
  auto x = x_support.unsqueeze(0).to(device);
  auto y = y_support.unsqueeze(0).to(device);
  std::vector<double> curve;
  for (int64_t it = 0; it < cfg.adapt_steps; ++it) {
    auto pred = target_forward(net->unpack(net->generate(z)), x, 0.0, /*train=*/false);
    auto loss = F::mse_loss(pred, y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    {
      torch::NoGradGuard no_grad;
      // FACT: z = torch.zeros(1, 4, requires_grad=True); assert raises(lambda: z.clamp_(-3, 3), "a leaf Variable that requires grad")
      z.clamp_(-cfg.emb_clip, cfg.emb_clip); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
    }
    const double l = loss.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the value decides when to stop
    curve.push_back(l);
    if (l < cfg.adapt_tol)
      break;
  }
  std::cout << "adapted in " << curve.size() << " steps, embedding moved " << (z.detach() - z_start).norm().item<double>() << "\n";
  net->zero_grad(); // the hypernetwork's gradients from the fit are not wanted
  return z.detach();
}
