// Physics-informed network for the viscous Burgers' equation (Raissi et al. 2019)
//   u_t + u u_x - nu u_xx = 0,  x in [-1, 1], t in [0, 1],
//   u(x, 0) = -sin(pi x),  u(-1, t) = u(1, t) = 0,  nu = 0.01 / pi.
// The network is the gated "modified MLP" of Wang, Teng & Perdikaris (2021). Adam runs first,
// with residual-based adaptive refinement (RAR, Lu et al. 2021): every few thousand steps the
// candidates with the largest PDE residual replace random collocation points. L-BFGS polishes the
// result; the error is measured against a reference solution on a 256 x 100 grid (CSV, x-major).
#include <torch/torch.h>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

constexpr double kPi = 3.14159265358979323846;

struct PinnConfig {
  int64_t hidden = 64, depth = 4;
  int64_t n_collocation = 8000, n_boundary = 256, n_initial = 256;
  int64_t adam_steps = 10000, lbfgs_rounds = 20, lbfgs_iters = 500, log_every = 500;
  int64_t rar_every = 2000, rar_candidates = 100000, rar_replaced = 400;
  double lr = 1e-3, nu = 0.01 / kPi, w_bc = 10.0, w_ic = 10.0, lbfgs_tol = 1e-7;
  std::string reference_csv = "data/burgers_shock.csv";
  int64_t ref_nx = 256, ref_nt = 100;
};

struct ModifiedMlpImpl : torch::nn::Module {
  explicit ModifiedMlpImpl(const PinnConfig &cfg) {
    enc_u_ = register_module("enc_u", torch::nn::Linear(2, cfg.hidden));
    enc_v_ = register_module("enc_v", torch::nn::Linear(2, cfg.hidden));
    hidden_ = register_module("hidden", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.depth; ++i)
      hidden_->push_back(torch::nn::Linear(i == 0 ? 2 : cfg.hidden, cfg.hidden));
    out_ = register_module("out", torch::nn::Linear(cfg.hidden, 1));
    // Corners of the domain: inputs are mapped to [-1, 1]^2 inside the network.
    lo_ = register_buffer("lo", torch::tensor({-1.0f, 0.0f}));
    hi_ = register_buffer("hi", torch::tensor({1.0f, 1.0f}));
    for (auto &m : modules(/*include_self=*/false))
      if (auto *lin = m->as<torch::nn::Linear>()) {
        torch::nn::init::xavier_normal_(lin->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
        torch::nn::init::zeros_(lin->bias);
      }
  }

  // xt [N, 2], columns x and t -> u [N, 1]
  torch::Tensor forward(const torch::Tensor &xt) {
    auto h = 2.0 * (xt - lo_) / (hi_ - lo_) - 1.0; // LOOKALIKE: tensor-device-mismatch -- registered buffers move with the module
    auto u = torch::tanh(enc_u_(h));
    auto v = torch::tanh(enc_v_(h));
    auto span = v - u;
    for (size_t i = 0; i < hidden_->size(); ++i) {
      auto z = torch::tanh(hidden_->ptr<torch::nn::LinearImpl>(i)->forward(h));
      // h = z * v + (1 - z) * u, written without the two temporaries
      // FACT: l = torch.nn.Linear(2, 4); z = torch.tanh(l(torch.randn(5, 2))); s = torch.randn(5, 4); assert backward_fails(lambda: (z.mul_(s).add_(s), z.sum().backward()))
      z.mul_(span).add_(u); // EXPECT: tensor-inplace-on-saved -- tanh saved z (its result) for backward: every grad through the net raises
      h = z;
    }
    return out_(h);
  }

  torch::nn::Linear enc_u_{nullptr}, enc_v_{nullptr}, out_{nullptr};
  torch::nn::ModuleList hidden_{nullptr};
  torch::Tensor lo_, hi_;
};
TORCH_MODULE(ModifiedMlp);

// Burgers' residual at points (x, t), both [N, 1] and requiring grad. create_graph keeps the
// derivatives differentiable so that the loss built on them can be backpropagated.
torch::Tensor burgers_residual(ModifiedMlp &net, const torch::Tensor &x, const torch::Tensor &t, double nu) {
  auto u = net->forward(torch::cat({x, t}, 1));
  auto ones = torch::ones_like(u);
  auto du = torch::autograd::grad({u}, {x, t}, {ones}, /*retain_graph=*/true, /*create_graph=*/true);
  auto u_x = du[0], u_t = du[1];
  auto u_xx = torch::autograd::grad({u_x}, {x}, {ones}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  auto r = u_t + u * u_x;
  // FACT: x = torch.randn(5, 1, requires_grad=True); u = torch.tanh(2 * x); ux = torch.autograd.grad(u.sum(), x, create_graph=True)[0]; r = x + u * ux; r.sub_(ux, alpha=0.1); r.pow(2).mean().backward(); assert x.grad is not None
  r.sub_(u_xx, nu); // LOOKALIKE: tensor-inplace-on-saved -- r is a sum, which add does not save; the product's factors are untouched
  return r;
}

// Reference solution, nx rows of nt values (x-major), as written by the spectral solver.
torch::Tensor read_reference(const std::string &path, int64_t nx, int64_t nt) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "cannot open ", path);
  std::vector<float> vals;
  vals.reserve(static_cast<size_t>(nx * nt));
  std::string line, cell;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    while (std::getline(ss, cell, ','))
      vals.push_back(std::stof(cell));
  }
  TORCH_CHECK(static_cast<int64_t>(vals.size()) == nx * nt, "reference has ", vals.size(), " values");
  return torch::tensor(vals).view({nx, nt});
}

class BurgersSolver {
public:
  explicit BurgersSolver(const PinnConfig &cfg) : cfg_(cfg), device_(torch::kCUDA), net_(cfg) {
    net_->to(device_);
    auto opts = torch::TensorOptions().device(device_);
    x_col_ = (torch::rand({cfg.n_collocation, 1}, opts) * 2 - 1).requires_grad_(true);
    t_col_ = torch::rand({cfg.n_collocation, 1}, opts).requires_grad_(true);
    // u(x, 0) = -sin(pi x)
    auto x0 = torch::rand({cfg.n_initial, 1}, opts) * 2 - 1;
    ic_in_ = torch::cat({x0, torch::zeros_like(x0)}, 1);
    ic_u_ = -torch::sin(kPi * x0);
    // u(+-1, t) = 0
    auto side = torch::bernoulli(torch::full({cfg.n_boundary, 1}, 0.5, opts)) * 2 - 1;
    bc_in_ = torch::cat({side, torch::rand({cfg.n_boundary, 1}, opts)}, 1);
  }

  struct Losses {
    torch::Tensor pde, bc, ic, total;
  };

  Losses losses() {
    Losses l;
    l.pde = burgers_residual(net_, x_col_, t_col_, cfg_.nu).pow(2).mean();
    l.bc = net_->forward(bc_in_).pow(2).mean();
    l.ic = torch::mse_loss(net_->forward(ic_in_), ic_u_);
    l.total = l.pde + cfg_.w_bc * l.bc + cfg_.w_ic * l.ic;
    return l;
  }

  // RAR with a fixed budget: the worst candidates overwrite randomly chosen collocation points.
  void refine() {
    auto opts = torch::TensorOptions().device(device_);
    auto xc = (torch::rand({cfg_.rar_candidates, 1}, opts) * 2 - 1).requires_grad_(true); // LOOKALIKE: tensor-inplace-on-leaf -- sets the flag on a fresh tensor
    auto tc = torch::rand({cfg_.rar_candidates, 1}, opts).requires_grad_(true);
    // The residual needs u_x and u_xx, so the scoring cannot run under NoGradGuard.
    auto score = burgers_residual(net_, xc, tc, cfg_.nu).abs().squeeze(1);
    auto worst = std::get<1>(score.topk(cfg_.rar_replaced));
    auto slots = torch::randperm(cfg_.n_collocation, opts.dtype(torch::kLong)).narrow(0, 0, cfg_.rar_replaced);
    // FACT: p = (torch.rand(6, 1) * 2 - 1).requires_grad_(True); assert raises(lambda: p.index_copy_(0, torch.tensor([1, 4]), torch.randn(2, 1)), "a leaf Variable that requires grad")
    x_col_.index_copy_(0, slots, xc.index_select(0, worst)); // EXPECT: tensor-inplace-on-leaf -- the collocation points are leaves that require grad, and grad mode is on here
    t_col_.index_copy_(0, slots, tc.index_select(0, worst)); // EXPECT: tensor-inplace-on-leaf -- same for the time coordinates
    std::cout << "rar: max residual " << score.max().item<double>() << "\n";
  }

  void train_adam() {
    net_->train();
    torch::optim::Adam opt(net_->parameters(), torch::optim::AdamOptions(cfg_.lr));
    torch::optim::StepLR sched(opt, /*step_size=*/2000, /*gamma=*/0.9);
    double running = 0;
    for (int64_t step = 1; step <= cfg_.adam_steps; ++step) {
      auto l = losses();
      opt.zero_grad();
      l.total.backward();
      opt.step();
      sched.step();
      running += l.total.item<double>(); // EXPECT: tensor-sync-in-loop -- the loss is on the GPU: every step waits for it, only to add it up
      // FACT: l = torch.nn.Linear(2, 1); h = [] ; exec('for _ in range(3):\n x = torch.rand(4, 1, requires_grad=True); u = torch.tanh(l(torch.cat([x, x], 1))); ux = torch.autograd.grad(u.sum(), x, create_graph=True)[0]; h.append(ux.pow(2).mean())'); assert kept_nodes(h) >= 3 * 4
      pde_history_.push_back(l.pde); // EXPECT: tensor-graph-kept-across-iterations -- each entry keeps its step's double-backward graph alive
      if (step % cfg_.log_every == 0) {
        std::cout << "adam " << step << " loss " << running / cfg_.log_every << " pde " << l.pde.item<double>() << " bc " << l.bc.item<double>() << " ic " << l.ic.item<double>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
        running = 0;
      }
      if (step % cfg_.rar_every == 0)
        refine();
    }
  }

  void train_lbfgs() {
    torch::optim::LBFGS opt(net_->parameters(), torch::optim::LBFGSOptions(1.0)
                                                    .max_iter(cfg_.lbfgs_iters)
                                                    .history_size(50)
                                                    .line_search_fn("strong_wolfe"));
    for (int64_t round = 0; round < cfg_.lbfgs_rounds; ++round) {
      auto closure = [&] {
        opt.zero_grad();
        auto l = losses();
        l.total.backward();
        last_ = l; // LOOKALIKE: tensor-graph-kept-across-iterations -- overwritten at each evaluation: one graph at a time
        return l.total;
      };
      auto loss = opt.step(closure);
      const double value = loss.item<double>(); // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to stop, once per round of up to lbfgs_iters evaluations
      std::cout << "lbfgs round " << round << " loss " << value << "\n";
      if (value < cfg_.lbfgs_tol)
        break;
    }
  }

  // Relative L2 error against the reference; the prediction and the error map go to disk for the plots.
  double evaluate(const std::string &prefix) {
    torch::NoGradGuard no_grad;
    net_->eval();
    auto u_ref = read_reference(cfg_.reference_csv, cfg_.ref_nx, cfg_.ref_nt);
    auto xs = torch::linspace(-1, 1, cfg_.ref_nx), ts = torch::linspace(0, 1, cfg_.ref_nt);
    auto grid = torch::stack({xs.repeat_interleave(cfg_.ref_nt), ts.repeat({cfg_.ref_nx})}, 1).to(device_);
    // FACT: o = torch.nn.Linear(4, 1)(torch.randn(12, 4)); assert is_view_of(o.view(3, 4), o)
    auto u_pred = net_->forward(grid).view({cfg_.ref_nx, cfg_.ref_nt}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear's output is contiguous
    auto rel_l2 = ((u_pred - u_ref).norm() / u_ref.norm()).item<double>(); // EXPECT: tensor-device-mismatch -- the reference is a host tensor, the prediction is on the GPU
    auto err = u_pred;
    // FACT: p = torch.randn(3, 4); p0 = p.clone(); e = p; e.sub_(torch.randn(3, 4)).abs_(); assert shares_storage(e, p) and not torch.equal(p, p0)
    err.sub_(u_ref.to(device_)).abs_(); // EXPECT: tensor-alias-then-mutate -- err is u_pred itself: the saved prediction becomes the error map
    torch::save(u_pred.cpu(), prefix + "_u_pred.pt");
    torch::save(err.cpu(), prefix + "_abs_err.pt");

    std::cout << "final pde loss " << last_.pde.item<double>() << "\n";
    auto hist = torch::stack(pde_history_);
    std::cout << "pde loss " << hist[0].item<double>() << " -> " << hist[-1].item<double>() << " over "
              << hist.size(0) << " Adam steps\n";
    return rel_l2;
  }

private:
  PinnConfig cfg_;
  torch::Device device_;
  ModifiedMlp net_;
  torch::Tensor x_col_, t_col_, ic_in_, ic_u_, bc_in_;
  std::vector<torch::Tensor> pde_history_;
  Losses last_;
};

int run_burgers(const PinnConfig &cfg) {
  torch::manual_seed(1234);
  BurgersSolver solver(cfg);
  solver.train_adam();
  solver.train_lbfgs();
  const double err = solver.evaluate("burgers");
  std::cout << "relative L2 error " << err << "\n";
  return err < 5e-3 ? 0 : 1;
}
