// MAML (Finn et al., 2017) for N-way K-shot classification with a functional Conv-4
// backbone: fast weights are an explicit parameter list, the inner loop keeps a
// differentiable graph for second-order meta-gradients, per-step inner learning rates
// are meta-learned and the meta-loss is the annealed multi-step loss of MAML++.
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace maml {

struct MamlConfig {
  int64_t n_way = 5;
  int64_t k_shot = 1;
  int64_t k_query = 15;
  int64_t in_channels = 1;
  int64_t hidden = 64;
  int64_t image_size = 28;
  int inner_steps = 5;
  int eval_steps = 10;
  double inner_lr = 0.4;
  double meta_lr = 1e-3;
  int meta_batch = 32;
  int meta_iterations = 60000;
  int msl_iterations = 5000;
  bool second_order = true;
  int log_every = 100;
  int eval_every = 500;
  int eval_tasks = 600;
  int64_t plateau_window = 5;
};

struct Task {
  torch::Tensor support_x, support_y, query_x, query_y;
};

torch::Tensor make_labels(int64_t n_way, int64_t per_class) {
  // FACT: assert raises(lambda: torch.arange(5).unsqueeze(1).expand(5, 15).view(-1), 'view size is not compatible')
  return torch::arange(n_way).unsqueeze(1).expand({n_way, per_class}).view({-1});  // EXPECT: tensor-view-non-contiguous
}

// Character images grouped by class, kept on the host; episodes are assembled there.
class TaskSampler {
 public:
  explicit TaskSampler(torch::Tensor images) : images_(std::move(images)) {}

  Task sample(const MamlConfig& cfg) const {
    const auto n_classes = images_.size(0), per_class = images_.size(1);
    auto classes = torch::randperm(n_classes).narrow(0, 0, cfg.n_way);
    auto cls = classes.accessor<int64_t, 1>();
    std::vector<torch::Tensor> sup, qry;
    for (int64_t c = 0; c < cfg.n_way; ++c) {
      auto pick = torch::randperm(per_class).narrow(0, 0, cfg.k_shot + cfg.k_query);
      auto imgs = images_[cls[c]].index_select(0, pick);
      sup.push_back(imgs.narrow(0, 0, cfg.k_shot));
      qry.push_back(imgs.narrow(0, cfg.k_shot, cfg.k_query));
    }
    auto x = torch::cat({torch::cat(sup), torch::cat(qry)});
    const auto ns = cfg.n_way * cfg.k_shot;
    // FACT: x = torch.rand(20, 1, 4, 4); assert not raises(lambda: x.sub_(x.narrow(0, 0, 5).mean(0, keepdim=True)))
    x.sub_(x.narrow(0, 0, ns).mean(0, true));  // LOOKALIKE: tensor-inplace-overlap -- the support mean is reduced into a new tensor before the subtraction
    return {x.narrow(0, 0, ns), make_labels(cfg.n_way, cfg.k_shot), x.narrow(0, ns, x.size(0) - ns),
            make_labels(cfg.n_way, cfg.k_query)};
  }

 private:
  torch::Tensor images_;
};

// Conv-4: four [conv3x3 -> batch norm -> relu -> maxpool] blocks and a linear head, all
// evaluated from an explicit parameter list so that adapted weights can be swapped in.
struct MetaConvNetImpl : torch::nn::Module {
  explicit MetaConvNetImpl(const MamlConfig& cfg) {
    int64_t c = cfg.in_channels, spatial = cfg.image_size;
    for (int b = 0; b < 4; ++b) {
      const auto s = std::to_string(b);
      register_parameter("conv" + s + "_w",
                         torch::nn::init::xavier_uniform_(torch::empty({cfg.hidden, c, 3, 3})));
      register_parameter("conv" + s + "_b", torch::zeros({cfg.hidden}));
      register_parameter("bn" + s + "_g", torch::ones({cfg.hidden}));
      register_parameter("bn" + s + "_b", torch::zeros({cfg.hidden}));
      c = cfg.hidden;
      spatial /= 2;
    }
    const auto feat = cfg.hidden * spatial * spatial;
    register_parameter("fc_w", torch::nn::init::xavier_uniform_(torch::empty({cfg.n_way, feat})));
    register_parameter("fc_b", torch::zeros({cfg.n_way}));
  }

  torch::Tensor functional_forward(torch::Tensor x, const std::vector<torch::Tensor>& p) const {
    for (int b = 0; b < 4; ++b) {
      x = torch::conv2d(x, p[4 * b], p[4 * b + 1], /*stride=*/1, /*padding=*/1);
      // transductive batch norm: batch statistics at meta-train and meta-test time alike
      x = torch::batch_norm(x, p[4 * b + 2], p[4 * b + 3], {}, {}, /*training=*/true, 0.0, 1e-5, false);
      torch::relu_(x);  // LOOKALIKE: tensor-inplace-on-saved -- batch norm's backward needs its input and statistics, not its output
      x = torch::max_pool2d(x, 2);
    }
    // FACT: h = torch.nn.functional.max_pool2d(torch.rand(4, 8, 6, 6), 2); assert is_view_of(h.flatten(1), h)
    return torch::linear(x.flatten(1), p[16], p[17]);  // LOOKALIKE: tensor-reshape-non-contiguous -- the pooled map is contiguous, flatten is a view
  }
};
TORCH_MODULE(MetaConvNet);

std::vector<torch::Tensor> init_fast(MetaConvNet& net) {
  std::vector<torch::Tensor> fast;
  for (const auto& p : net->parameters()) fast.push_back(p.clone());  // EXPECT: tensor-unnecessary-clone
  return fast;
}

// MAML++ multi-step loss: every inner step's query loss counts at first, the weight
// moves to the last step over the first msl_iterations.
torch::Tensor msl_weights(int steps, int iteration, const MamlConfig& cfg) {
  const double anneal = std::min(1.0, static_cast<double>(iteration) / cfg.msl_iterations);
  auto w = torch::full({1}, 1.0 / steps).expand({steps});
  // FACT: assert raises(lambda: torch.full((1,), 0.2).expand(5).mul_(0.5), 'more than one element')
  w.mul_(1.0 - anneal);  // EXPECT: tensor-inplace-on-expanded
  auto last = torch::zeros({steps});
  last[steps - 1] = anneal;
  return w + last;
}

struct TaskResult {
  torch::Tensor loss, correct;
};

TaskResult task_meta_loss(MetaConvNet& net, const Task& task, const torch::Tensor& step_lrs,
                          const torch::Tensor& msl, const MamlConfig& cfg, torch::Device device) {
  auto xs = task.support_x.to(device), ys = task.support_y.to(device);
  auto xq = task.query_x.to(device), yq = task.query_y.to(device);
  auto fast = init_fast(net);
  auto meta = torch::zeros({}, xs.options());
  torch::Tensor correct;
  for (int s = 0; s < cfg.inner_steps; ++s) {
    auto support_loss = torch::nn::functional::cross_entropy(net->functional_forward(xs, fast), ys);
    auto grads = torch::autograd::grad({support_loss}, fast, /*grad_outputs=*/{},
                                       /*retain_graph=*/cfg.second_order, /*create_graph=*/cfg.second_order);
    for (size_t i = 0; i < fast.size(); ++i)
      fast[i] = fast[i] - step_lrs[s] * grads[i];  // LOOKALIKE: tensor-inplace-on-leaf -- out of place: the handle is rebound, the parameter is untouched
    auto logp = torch::log_softmax(net->functional_forward(xq, fast), 1);
    meta = meta + msl[s] * torch::nll_loss(logp, yq);
    if (s == cfg.inner_steps - 1) {
      // FACT: assert backward_fails(lambda: (lambda lp: (lp.exp_(), lp.sum().backward()))(torch.log_softmax(torch.rand(4, 5, requires_grad=True) * 1, 1)))
      auto probs = logp.exp_();  // EXPECT: tensor-inplace-on-saved
      correct = probs.argmax(1).eq(yq).sum();
    }
  }
  return {meta, correct};
}

double evaluate(MetaConvNet& net, const TaskSampler& tasks, const torch::Tensor& step_lrs,
                const MamlConfig& cfg, torch::Device device) {
  const double lr = step_lrs.mean().item<double>();
  double acc_sum = 0.0;
  for (int t = 0; t < cfg.eval_tasks; ++t) {
    auto task = tasks.sample(cfg);
    auto ys = task.support_y.to(device);
    auto xq = task.query_x.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new task is sampled every iteration
    auto yq = task.query_y.to(device);
    std::vector<torch::Tensor> fast;
    for (const auto& p : net->parameters()) fast.push_back(p.detach().requires_grad_());
    for (int s = 0; s < cfg.eval_steps; ++s) {
      auto logits = net->functional_forward(task.support_x.to(device), fast);  // EXPECT: tensor-clone-in-loop
      auto grads = torch::autograd::grad({torch::nn::functional::cross_entropy(logits, ys)}, fast);
      torch::NoGradGuard no_grad;
      // FACT: p = torch.nn.Parameter(torch.ones(3)); f = p.detach(); f.sub_(0.5); assert float(p.sum()) == 1.5
      for (size_t i = 0; i < fast.size(); ++i) fast[i].sub_(grads[i], lr);  // EXPECT: tensor-inplace-on-detached // LOOKALIKE: tensor-inplace-on-leaf -- the write happens under NoGradGuard
    }
    torch::NoGradGuard no_grad;
    auto pred = net->functional_forward(xq, fast).argmax(1);
    acc_sum += pred.eq(yq).to(torch::kFloat).mean().item<double>();  // EXPECT: tensor-sync-in-loop
  }
  return acc_sum / cfg.eval_tasks;
}

std::vector<torch::Tensor> meta_train(MetaConvNet& net, const TaskSampler& train_tasks,
                                      const TaskSampler& val_tasks, const MamlConfig& cfg, torch::Device device) {
  auto dev = torch::TensorOptions().device(device);
  auto step_lrs = torch::full({cfg.inner_steps}, cfg.inner_lr, dev.requires_grad(true));
  auto meta_params = net->parameters();
  meta_params.push_back(step_lrs);
  torch::optim::Adam opt(meta_params, torch::optim::AdamOptions(cfg.meta_lr));

  std::vector<torch::Tensor> history, best;
  auto val_window = torch::zeros({cfg.plateau_window}, torch::kDouble);
  double best_val = 0.0;
  const auto w = cfg.plateau_window;
  for (int it = 0; it < cfg.meta_iterations; ++it) {
    auto msl = msl_weights(cfg.inner_steps, it, cfg).to(device);
    auto meta_loss = torch::zeros({}, dev);
    auto correct = torch::zeros({}, dev.dtype(torch::kLong));
    for (int t = 0; t < cfg.meta_batch; ++t) {
      auto r = task_meta_loss(net, train_tasks.sample(cfg), step_lrs, msl, cfg, device);
      meta_loss = meta_loss + r.loss / cfg.meta_batch;  // LOOKALIKE: tensor-graph-kept-across-iterations -- one meta-batch, backpropagated once right after the loop
      correct += r.correct;
    }
    opt.zero_grad();
    meta_loss.backward();
    opt.step();
    step_lrs.clamp_(1e-4, 1.0);  // EXPECT: tensor-inplace-on-leaf
    history.push_back(meta_loss);  // EXPECT: tensor-graph-kept-across-iterations
    if (it % cfg.log_every == 0) {
      const double n = static_cast<double>(cfg.meta_batch * cfg.n_way * cfg.k_query);
      std::cout << "it " << it << " meta-loss " << meta_loss.item<double>()  // LOOKALIKE: tensor-sync-in-loop -- only every log_every iterations
                << " query acc " << correct.item<double>() / n << '\n';
    }
    if ((it + 1) % cfg.eval_every != 0) continue;

    const double val_acc = evaluate(net, val_tasks, step_lrs, cfg, device);
    // FACT: v = torch.zeros(5, dtype=torch.float64); assert raises(lambda: v.narrow(0, 0, 4).copy_(v.narrow(0, 1, 4)), 'single memory location')
    val_window.narrow(0, 0, w - 1).copy_(val_window.narrow(0, 1, w - 1));  // EXPECT: tensor-inplace-overlap
    val_window[w - 1] = val_acc;
    std::cout << "it " << it << " val acc " << val_acc << '\n';
    if (val_acc > best_val) {
      best_val = val_acc;
      best.clear();
      for (const auto& p : net->parameters()) best.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the snapshot must not follow later optimizer steps
    }
    const bool full = (it + 1) / cfg.eval_every >= w;
    if (full && (val_window.max() - val_window.min()).item<double>() < 1e-3) break;
  }

  torch::NoGradGuard no_grad;
  auto params = net->parameters();
  for (size_t i = 0; i < best.size(); ++i)
    params[i].data().copy_(best[i]);  // LOOKALIKE: tensor-inplace-on-detached -- restoring the best weights into the parameters on purpose, under NoGradGuard
  return history;
}

void run(const torch::Tensor& train_images, const torch::Tensor& val_images) {
  MamlConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  MetaConvNet net(cfg);
  net->to(device);
  auto curve = meta_train(net, TaskSampler(train_images), TaskSampler(val_images), cfg, device);
  std::cout << "meta-training stopped after " << curve.size() << " iterations\n";
}

}  // namespace maml
