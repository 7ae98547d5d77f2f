// DARTS (Liu et al., 2019) search phase on CIFAR-sized images. Every edge of a cell is a mixed op:
// the sum of all candidate ops weighted by the softmax of that edge's architecture logits (alphas,
// one table for normal and one for reduction cells). Bilevel optimisation: the weights take SGD
// steps on the train half, the alphas Adam steps on the validation half with the second-order
// (unrolled) gradient; the weight step uses SDARTS-RS noise on the alphas. After each epoch the
// genotype is derived: per node the two strongest edges, each with its best op other than 'none'.
#include <torch/torch.h>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

const std::vector<std::string> kPrimitives = {"none",         "max_pool_3x3", "avg_pool_3x3", "skip_connect",
                                              "sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5"};
constexpr int64_t kNone = 0;

struct DartsConfig {
  int64_t C = 16, layers = 8, steps = 4, multiplier = 4, num_classes = 10;
  double w_lr = 0.025, w_lr_min = 1e-3, w_momentum = 0.9, w_wd = 3e-4, grad_clip = 5.0;
  double a_lr = 3e-4, a_wd = 1e-3, rs_eps = 0.03;
  int64_t epochs = 50, report_every = 50;
  bool unrolled = true; // second-order architecture gradient
};

// Halves the resolution with two offset stride-2 1x1 convs (used where the input is twice as big).
struct FactorizedReduceImpl : nn::Module {
  FactorizedReduceImpl(int64_t C_in, int64_t C_out) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(C_in, C_out / 2, 1).stride(2).bias(false)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(C_in, C_out / 2, 1).stride(2).bias(false)));
    bn = register_module("bn", nn::BatchNorm2d(nn::BatchNorm2dOptions(C_out).affine(false)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(x);
    return bn(torch::cat({conv1(h), conv2(h.slice(2, 1).slice(3, 1))}, 1)); // the second path is offset by one pixel
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(FactorizedReduce);

nn::Sequential relu_conv_bn(int64_t C_in, int64_t C_out) {
  return nn::Sequential(nn::ReLU(), nn::Conv2d(nn::Conv2dOptions(C_in, C_out, 1).bias(false)),
                        nn::BatchNorm2d(nn::BatchNorm2dOptions(C_out).affine(false)));
}

nn::Sequential make_op(const std::string &name, int64_t C, int64_t stride) {
  auto bn = [C] { return nn::BatchNorm2d(nn::BatchNorm2dOptions(C).affine(false)); };
  auto dw = [C](int64_t k, int64_t s, int64_t pad, int64_t dil) {
    return nn::Conv2d(nn::Conv2dOptions(C, C, k).stride(s).padding(pad).dilation(dil).groups(C).bias(false));
  };
  auto pw = [C] { return nn::Conv2d(nn::Conv2dOptions(C, C, 1).bias(false)); }; // pointwise
  if (name == "max_pool_3x3")
    return nn::Sequential(nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(stride).padding(1)), bn());
  if (name == "avg_pool_3x3")
    return nn::Sequential(nn::AvgPool2d(nn::AvgPool2dOptions(3).stride(stride).padding(1).count_include_pad(false)), bn());
  if (name == "skip_connect")
    return stride == 1 ? nn::Sequential(nn::Identity()) : nn::Sequential(FactorizedReduce(C, C));
  const int64_t k = name.back() - '0';
  if (name.rfind("sep_conv", 0) == 0)
    return nn::Sequential(nn::ReLU(), dw(k, stride, k / 2, 1), pw(), bn(), nn::ReLU(), dw(k, 1, k / 2, 1), pw(), bn());
  return nn::Sequential(nn::ReLU(), dw(k, stride, k - 1, 2), pw(), bn()); // dil_conv
}

// One edge: every candidate op but 'none' (which adds zero), weighted by w [num_ops].
struct MixedOpImpl : nn::Module {
  MixedOpImpl(int64_t C, int64_t stride) {
    for (size_t i = 1; i < kPrimitives.size(); ++i)
      ops.push_back(register_module(kPrimitives[i], make_op(kPrimitives[i], C, stride)));
  }
  torch::Tensor forward(const torch::Tensor &x, const torch::Tensor &w) {
    auto out = w[1] * ops[0]->forward(x);
    for (size_t i = 1; i < ops.size(); ++i)
      // FACT: w = torch.rand(3, requires_grad=True); h = torch.randn(2, 4, requires_grad=True); out = w[1] * h; out.add_(w[2] * h.exp()); out.sum().backward(); assert w.grad is not None and h.grad is not None
      out.add_(w[i + 1] * ops[i]->forward(x)); // LOOKALIKE: tensor-inplace-on-saved -- mul saves its factors, not its result
    return out;
  }
  std::vector<nn::Sequential> ops;
};
TORCH_MODULE(MixedOp);

struct CellImpl : nn::Module {
  CellImpl(int64_t steps, int64_t multiplier, int64_t C_pp, int64_t C_p, int64_t C, bool reduction, bool reduction_prev)
      : steps_(steps), multiplier_(multiplier), reduction(reduction) {
    pre0 = register_module("pre0", reduction_prev ? nn::Sequential(FactorizedReduce(C_pp, C)) : relu_conv_bn(C_pp, C));
    pre1 = register_module("pre1", relu_conv_bn(C_p, C));
    for (int64_t i = 0; i < steps; ++i)
      for (int64_t j = 0; j < 2 + i; ++j)
        edges.push_back(register_module("edge" + std::to_string(edges.size()), MixedOp(C, reduction && j < 2 ? 2 : 1)));
  }
  torch::Tensor forward(const torch::Tensor &s0, const torch::Tensor &s1, const torch::Tensor &weights) {
    std::vector<torch::Tensor> states = {pre0->forward(s0), pre1->forward(s1)};
    size_t offset = 0;
    for (int64_t i = 0; i < steps_; ++i) {
      torch::Tensor s;
      for (size_t j = 0; j < states.size(); ++j) {
        auto h = edges[offset + j]->forward(states[j], weights[offset + j]);
        s = s.defined() ? s + h : h;
      }
      offset += states.size();
      states.push_back(s); // LOOKALIKE: tensor-graph-kept-across-iterations -- the node outputs are concatenated and returned for the loss
    }
    return torch::cat(std::vector<torch::Tensor>(states.end() - multiplier_, states.end()), 1);
  }
  int64_t steps_, multiplier_;
  bool reduction; // a reduction cell: its first ops have stride 2
  nn::Sequential pre0{nullptr}, pre1{nullptr};
  std::vector<MixedOp> edges;
};
TORCH_MODULE(Cell);

struct SearchNetImpl : nn::Module {
  SearchNetImpl(const DartsConfig &cfg, torch::Device device) {
    int64_t C_curr = 3 * cfg.C;
    stem = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, C_curr, 3).padding(1).bias(false)), nn::BatchNorm2d(C_curr)));
    int64_t C_pp = C_curr, C_p = C_curr;
    C_curr = cfg.C;
    bool reduction_prev = false;
    for (int64_t i = 0; i < cfg.layers; ++i) {
      const bool reduction = i == cfg.layers / 3 || i == 2 * cfg.layers / 3;
      C_curr *= reduction ? 2 : 1;
      cells.push_back(register_module("cell" + std::to_string(i), Cell(cfg.steps, cfg.multiplier, C_pp, C_p, C_curr, reduction, reduction_prev)));
      reduction_prev = reduction;
      std::tie(C_pp, C_p) = std::make_pair(C_p, cfg.multiplier * C_curr);
    }
    classifier = register_module("classifier", nn::Linear(C_p, cfg.num_classes));
    // The alphas are kept apart from parameters(): the weight optimizer must not see them.
    const int64_t k = cfg.steps * (cfg.steps + 3) / 2, n_ops = static_cast<int64_t>(kPrimitives.size());
    alphas_normal = torch::randn({k, n_ops}, torch::TensorOptions().device(device));
    // FACT: a = torch.randn(14, 8); a.mul_(1e-3); a.requires_grad_(); assert a.is_leaf and a.requires_grad
    alphas_normal.mul_(1e-3).requires_grad_(); // LOOKALIKE: tensor-inplace-on-leaf -- scaled before it requires grad
    alphas_reduce = (1e-3 * torch::randn({k, n_ops}, torch::TensorOptions().device(device))).requires_grad_();
  }

  torch::Tensor forward(const torch::Tensor &x) { return forward_with(x, alphas_normal, alphas_reduce); }

  torch::Tensor forward_with(const torch::Tensor &x, const torch::Tensor &a_normal, const torch::Tensor &a_reduce) {
    auto w_normal = torch::softmax(a_normal, -1), w_reduce = torch::softmax(a_reduce, -1);
    auto s0 = stem->forward(x), s1 = s0;
    for (auto &cell : cells)
      std::tie(s0, s1) = std::make_pair(s1, cell->forward(s0, s1, cell->reduction ? w_reduce : w_normal));
    auto out = F::adaptive_avg_pool2d(s1, F::AdaptiveAvgPool2dFuncOptions(1));
    // FACT: o = torch.nn.functional.adaptive_avg_pool2d(torch.randn(4, 64, 8, 8), 1); assert is_view_of(o.view(4, -1), o)
    return classifier(out.view({out.size(0), -1})); // LOOKALIKE: tensor-view-non-contiguous -- the pooled [B, C, 1, 1] map is contiguous
  }

  std::vector<torch::Tensor> arch_parameters() const { return {alphas_normal, alphas_reduce}; }

  nn::Sequential stem{nullptr};
  std::vector<Cell> cells;
  nn::Linear classifier{nullptr};
  torch::Tensor alphas_normal, alphas_reduce;
};
TORCH_MODULE(SearchNet);

class Architect {
public:
  Architect(SearchNet net, const DartsConfig &cfg) : net_(std::move(net)), cfg_(cfg),
        opt_(net_->arch_parameters(), torch::optim::AdamOptions(cfg.a_lr).betas({0.5, 0.999}).weight_decay(cfg.a_wd)) {}

  // One update of the alphas on a validation batch; eta is the weights' current learning rate.
  void step(const torch::Tensor &tx, const torch::Tensor &ty, const torch::Tensor &vx, const torch::Tensor &vy, double eta) {
    opt_.zero_grad();
    if (cfg_.unrolled)
      unrolled_backward(tx, ty, vx, vy, eta);
    else // first-order: the gradient at the current weights
      F::cross_entropy(net_->forward(vx), vy).backward();
    opt_.step();
  }

private:
  torch::Tensor train_loss(const torch::Tensor &tx, const torch::Tensor &ty) { return F::cross_entropy(net_->forward(tx), ty); }
  void unrolled_backward(const torch::Tensor &tx, const torch::Tensor &ty, const torch::Tensor &vx, const torch::Tensor &vy, double eta) {
    auto weights = net_->parameters(), alphas = net_->arch_parameters();
    // Virtual step w' = w - eta * (dL_train/dw + wd * w), taken on the weights and undone below.
    auto gw = torch::autograd::grad({train_loss(tx, ty)}, weights);
    std::vector<torch::Tensor> saved;
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < weights.size(); ++i) {
        saved.push_back(weights[i].detach().clone()); // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- a snapshot per weight, kept: the next line changes the weight
        weights[i].sub_(gw[i] + cfg_.w_wd * weights[i], eta); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      }
    }
    std::vector<torch::Tensor> inputs(alphas.begin(), alphas.end());
    inputs.insert(inputs.end(), weights.begin(), weights.end());
    auto gv = torch::autograd::grad({F::cross_entropy(net_->forward(vx), vy)}, inputs);
    std::vector<torch::Tensor> v(gv.begin() + static_cast<std::ptrdiff_t>(alphas.size()), gv.end());
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < weights.size(); ++i)
        weights[i].copy_(saved[i]); // LOOKALIKE: tensor-inplace-on-leaf -- the restore is under NoGradGuard
    }
    // Finite-difference Hessian-vector product around w: (dL_train/dalpha(w+) - dL_train/dalpha(w-)) / 2R.
    std::vector<torch::Tensor> flat;
    for (const auto &t : v)
      flat.push_back(t.reshape({-1}));
    const double R = 0.01 / torch::cat(flat).norm().item<double>();
    for (size_t i = 0; i < weights.size(); ++i)
      // FACT: p = torch.nn.Parameter(torch.randn(4, 3)); assert raises(lambda: p.add_(torch.randn(4, 3), alpha=0.01), "a leaf Variable that requires grad")
      weights[i].add_(v[i], R); // EXPECT: tensor-inplace-on-leaf -- w+ = w + R v with grad mode on: PyTorch refuses the write
    auto g_pos = torch::autograd::grad({train_loss(tx, ty)}, alphas);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < weights.size(); ++i)
        weights[i].sub_(v[i], 2.0 * R); // LOOKALIKE: tensor-inplace-on-leaf -- w- under NoGradGuard
    }
    auto g_neg = torch::autograd::grad({train_loss(tx, ty)}, alphas);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < weights.size(); ++i)
        weights[i].add_(v[i], R);
    }
    for (size_t k = 0; k < alphas.size(); ++k) {
      // FACT: g = torch.randn(14, 8); h = torch.randn(14, 8); d = g.clone(); d.sub_(h, alpha=0.5); assert torch.equal(d, g.sub(h, alpha=0.5))
      auto dalpha = gv[k].clone(); // EXPECT: tensor-unnecessary-clone -- overwritten at once by sub_: gv[k].sub(...) gives the same tensor in one pass
      dalpha.sub_(g_pos[k] - g_neg[k], eta / (2.0 * R));
      alphas[k].mutable_grad() = dalpha;
    }
  }

  SearchNet net_;
  DartsConfig cfg_;
  torch::optim::Adam opt_;
};

// SDARTS-RS: the weight step sees the alphas as constants, smoothed by uniform noise.
torch::Tensor perturbed(const torch::Tensor &alpha, double eps) {
  auto a = alpha.detach();
  // FACT: a = torch.randn(14, 8, requires_grad=True); a0 = a.detach().clone(); d = a.detach(); d.add_(torch.empty_like(d).uniform_(-0.03, 0.03)); assert shares_storage(d, a) and not torch.equal(a.detach(), a0)
  a.add_(torch::empty_like(a).uniform_(-eps, eps)); // EXPECT: tensor-inplace-on-detached -- the noise lands in the real alphas, which random-walk from step to step
  return a;
}

// The split tensors hold float images in [0, 1]: per-channel normalisation for the network.
torch::Tensor standardize(const torch::Tensor &images, const torch::Tensor &mean, const torch::Tensor &stdev) {
  auto x = images.to(torch::kFloat);
  // FACT: i = torch.rand(2, 3, 4, 4); x = i.to(torch.float32); x.sub_(0.5).div_(0.25); assert shares_storage(x, i)
  x.sub_(mean).div_(stdev); // EXPECT: tensor-alias-then-mutate -- to(kFloat) of float images is the images: the caller's batch is normalised in place
  return x;
}

using Gene = std::vector<std::pair<std::string, int64_t>>;

Gene parse_cell(const torch::Tensor &probs, int64_t steps) {
  // FACT: p = torch.rand(14, 8); w = p.to('cpu', copy=True); w.select(1, 0).fill_(-1.0); assert is_copy_of(w, p) and (p[:, 0] >= 0).all()
  auto w = probs.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  w.select(1, kNone).fill_(-1.0); // LOOKALIKE: tensor-alias-then-mutate -- copy=true: the caller's probabilities are untouched
  Gene gene;
  int64_t start = 0, n = 2;
  for (int64_t node = 0; node < steps; ++node) {
    auto edges = w.narrow(0, start, n);                                       // the n edges into this node
    auto top = std::get<1>(std::get<0>(edges.max(1)).topk(2)); // the two with the strongest op
    for (int64_t k = 0; k < 2; ++k) {
      const auto j = top[k].item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- a host tensor, and the value is an index
      gene.emplace_back(kPrimitives[edges[j].argmax().item<int64_t>()], j);
    }
    start += n++;
  }
  return gene;
}

struct Split {
  std::vector<torch::Tensor> images, labels; // batches of [B, 3, 32, 32] float and [B] int64
};

void search(const Split &train, const Split &val, const torch::Tensor &mean, const torch::Tensor &stdev, const DartsConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  SearchNet net(cfg, device);
  net->to(device);
  torch::optim::SGD w_opt(net->parameters(), torch::optim::SGDOptions(cfg.w_lr).momentum(cfg.w_momentum).weight_decay(cfg.w_wd));
  Architect arch(net, cfg);
  std::vector<torch::Tensor> step_losses, alpha_trace;
  const double pi = std::acos(-1.0);
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    const double lr = cfg.w_lr_min + 0.5 * (cfg.w_lr - cfg.w_lr_min) * (1.0 + std::cos(pi * epoch / cfg.epochs));
    for (auto &group : w_opt.param_groups())
      static_cast<torch::optim::SGDOptions &>(group.options()).lr(lr);
    net->train();
    int64_t correct = 0, seen = 0;
    for (size_t b = 0; b < train.images.size(); ++b) {
      auto m = mean.to(device), s = stdev.to(device); // EXPECT: tensor-clone-in-loop -- the same statistics are sent to the device at every step
      auto x = standardize(train.images[b].to(device), m, s);
      auto y = train.labels[b].to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      const auto v = b % val.images.size();
      auto vx = standardize(val.images[v].to(device), m, s), vy = val.labels[v].to(device);
      arch.step(x, y, vx, vy, lr);
      auto logits = net->forward_with(x, perturbed(net->alphas_normal, cfg.rs_eps), perturbed(net->alphas_reduce, cfg.rs_eps));
      auto loss = F::cross_entropy(logits, y);
      w_opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(net->parameters(), cfg.grad_clip);
      w_opt.step();
      step_losses.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations -- every step's graph stays alive until the epoch average
      correct += (logits.argmax(1) == y).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to count hits
      seen += y.size(0);
      if (b % cfg.report_every == 0)
        std::cout << "  step " << b << " loss " << loss.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every report_every steps
    }
    const auto mean_loss = torch::stack(step_losses).mean().item<double>();
    step_losses.clear();
    torch::NoGradGuard no_grad; // the rest of the epoch only reads the alphas
    auto p_normal = torch::softmax(net->alphas_normal, -1), p_reduce = torch::softmax(net->alphas_reduce, -1);
    alpha_trace.push_back(p_normal.cpu()); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard: no graph
    std::cout << "epoch " << epoch << " lr " << lr << " loss " << mean_loss << " train acc "
              << static_cast<double>(correct) / static_cast<double>(seen) << "\n";
    for (const auto &cell : {parse_cell(p_normal, cfg.steps), parse_cell(p_reduce, cfg.steps)}) {
      for (const auto &g : cell)
        std::cout << " (" << g.first << ", " << g.second << ")";
      std::cout << "\n";
    }
  }
  torch::save(alpha_trace, "alpha_trace.pt");
}
