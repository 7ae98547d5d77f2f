// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-graph-kept-across-iterations %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-graph-kept-across-iterations %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::Tensor embed(torch::Tensor x) { return fc1(x); }
  // Runs the layers under its own guard: its result holds no graph.
  torch::Tensor codes(torch::Tensor x) {
    torch::NoGradGuard no_grad;
    return torch::relu(fc1(x));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

// A forward that returns a struct: its tensor fields follow the module call.
struct RouterOut {
  torch::Tensor logits, aux_loss;
};
struct RouterImpl : torch::nn::Module {
  RouterImpl() { fc = register_module("fc", torch::nn::Linear(8, 4)); }
  RouterOut forward(const torch::Tensor &x) {
    auto h = fc(x);
    return {h, h.pow(2).mean()};
  }
  // A method that runs a layer and returns a struct, as forward does.
  RouterOut route(const torch::Tensor &x) { return forward(x * 2); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Router);

// ---- flagged ------------------------------------------------------------------

void trainRouter(Router &router, const std::vector<torch::Tensor> &xs) {
  auto aux_total = torch::zeros({});
  auto logged = torch::zeros({});
  for (const auto &x : xs) {
    auto out = router->forward(x);
    (out.logits.sum() + out.aux_loss).backward();
    aux_total += out.aux_loss;
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'out.aux_loss' requires grad and is accumulated into 'aux_total'
    // CHECK-FIXES: aux_total += out.aux_loss.detach();
    logged += out.aux_loss.detach();
    auto routed = router->route(x);
    aux_total += routed.aux_loss;
    // CHECK-MESSAGES: :[[@LINE-1]]:15: warning: 'routed.aux_loss' requires grad and is accumulated into 'aux_total'
    // CHECK-FIXES: aux_total += routed.aux_loss.detach();
  }
  {
    torch::NoGradGuard no_grad;
    for (const auto &x : xs)
      logged += router->forward(x).aux_loss; // no graph under the guard
  }
}

double trainEpoch(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
                  const std::vector<torch::Tensor> &ys) {
  torch::Tensor epoch_loss = torch::zeros({});
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::mse_loss(net->forward(xs[i]), ys[i]);
    opt.zero_grad();
    loss.backward();
    opt.step();
    epoch_loss += loss;
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'loss' requires grad and is accumulated into 'epoch_loss', which outlives the loop iteration: every iteration's autograd graph (its nodes and the tensors they saved for backward) stays alive as long as 'epoch_loss' does, and nothing differentiates it; keep 'loss.detach()', or '.item<double>()' to keep a number [tensor-graph-kept-across-iterations]
    // CHECK-FIXES: epoch_loss += loss.detach();
  }
  return epoch_loss.item<double>() / xs.size();
}

double validate(Net &net, const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys) {
  auto total = torch::zeros({1});
  for (size_t i = 0; i < xs.size(); ++i)
    total = total + torch::nn::functional::cross_entropy(net(xs[i]), ys[i]);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: the value requires grad and is accumulated into 'total'
  // CHECK-FIXES: total = total + torch::nn::functional::cross_entropy(net(xs[i]), ys[i]).detach();
  return total.item<double>() / xs.size();
}

double collectLogits(Net &net, const std::vector<torch::Tensor> &xs, const torch::Tensor &labels) {
  net->eval();
  std::vector<torch::Tensor> logits;
  for (const auto &x : xs) {
    auto out = net->forward(x);
    logits.push_back(out);
    // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'out' requires grad and is stored in 'logits'
    // CHECK-FIXES: logits.push_back(out.detach());
  }
  return torch::cat(logits).argmax(1).eq(labels).to(torch::kFloat).mean().item<double>();
}

std::vector<double> perBatchLosses(Net &net, const std::vector<torch::Tensor> &xs,
                                   const std::vector<torch::Tensor> &ys) {
  std::vector<torch::Tensor> losses;
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::nll_loss(torch::log_softmax(net->forward(xs[i]), 1), ys[i]);
    losses.emplace_back(loss);
    // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'loss' requires grad and is stored in 'losses'
  }
  std::vector<double> out;
  for (const auto &l : losses)
    out.push_back(l.item<double>());
  return out;
}

std::map<std::string, torch::Tensor> buildIndex(Net &net, const std::vector<std::string> &ids,
                                                const std::vector<torch::Tensor> &xs) {
  net->eval();
  std::map<std::string, torch::Tensor> index;
  for (size_t i = 0; i < ids.size(); ++i) {
    index[ids[i]] = net->embed(xs[i]);
    // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'net->embed(xs[i])' requires grad and is stored under a new key in 'index'
    // CHECK-FIXES: index[ids[i]] = net->embed(xs[i]).detach();
  }
  return index;
}

struct Trainer {
  Net net;
  torch::optim::SGD opt{net->parameters(), torch::optim::SGDOptions(0.1)};
  std::vector<torch::Tensor> history_;

  void run(const std::vector<torch::Tensor> &xs, const std::vector<torch::Tensor> &ys) {
    for (size_t i = 0; i < xs.size(); ++i) {
      auto loss = torch::mse_loss(net->forward(xs[i]), ys[i]);
      opt.zero_grad();
      loss.backward();
      opt.step();
      history_.push_back(loss);
      // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'loss' requires grad and is stored in 'history_'
      // CHECK-FIXES: history_.push_back(loss.detach());
    }
  }
  double meanLoss() const { return torch::stack(history_).mean().item<double>(); }
};

double cpuFeatures(Net &net, const std::vector<torch::Tensor> &xs, const torch::Tensor &centroids) {
  std::vector<torch::Tensor> feats;
  for (const auto &x : xs)
    feats.push_back(net->embed(x).cpu());
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'net->embed(x).cpu()' requires grad and is stored in 'feats'
  // CHECK-FIXES: feats.push_back(net->embed(x).cpu().detach());
  return torch::cdist(torch::cat(feats), centroids).min().item<double>();
}

double codeSpread(Net &net, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> maps;
  for (const auto &x : xs)
    maps.push_back(net->codes(x).cpu());
  return torch::cat(maps).std().item<double>();
}

double structuredBinding(Net &net, const std::vector<torch::Tensor> &xs) {
  torch::Tensor total = torch::zeros({});
  for (const auto &x : xs) {
    auto [values, indices] = net->forward(x).max(1);
    total += values.sum();
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'values.sum()' requires grad and is accumulated into 'total'
  }
  return total.item<double>();
}

// ---- not flagged --------------------------------------------------------------

double itemLoss(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
                const std::vector<torch::Tensor> &ys) {
  double running = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::mse_loss(net->forward(xs[i]), ys[i]);
    loss.backward();
    running += loss.item<double>();
  }
  return running;
}

torch::Tensor noGradEval(Net &net, const std::vector<torch::Tensor> &xs) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> outs;
  for (const auto &x : xs)
    outs.push_back(net->forward(x));
  return torch::cat(outs);
}

torch::Tensor inferenceMode(Net &net, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> outs;
  {
    c10::InferenceMode guard;
    for (const auto &x : xs)
      outs.push_back(torch::softmax(net->forward(x), 1));
  }
  return torch::cat(outs);
}

void gradientAccumulation(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
                          const std::vector<torch::Tensor> &ys) {
  torch::Tensor total_loss = torch::zeros({});
  for (size_t i = 0; i < xs.size(); ++i)
    total_loss += torch::mse_loss(net->forward(xs[i]), ys[i]) / 4.0;
  opt.zero_grad();
  total_loss.backward();
  opt.step();
}

void reinforce(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &obs,
               const torch::Tensor &returns) {
  std::vector<torch::Tensor> log_probs;
  for (const auto &o : obs) {
    auto logp = torch::log_softmax(net->forward(o), -1);
    auto action = logp.exp().multinomial(1);
    log_probs.push_back(logp.gather(-1, action));
  }
  auto loss = -(torch::stack(log_probs).squeeze() * returns).sum();
  opt.zero_grad();
  loss.backward();
  opt.step();
}

torch::Tensor unroll(Net &net, torch::Tensor x, int steps) {
  std::vector<torch::Tensor> outs;
  for (int t = 0; t < steps; ++t) {
    x = net->forward(x).narrow(1, 0, 4).repeat({1, 2});
    outs.push_back(x); // returned: the caller differentiates the sequence
  }
  return torch::stack(outs, 1);
}

torch::Tensor lastOnly(Net &net, const std::vector<torch::Tensor> &xs) {
  torch::Tensor last;
  for (const auto &x : xs)
    last = net->forward(x);
  return last.detach();
}

double detachedLog(Net &net, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> outs;
  torch::Tensor sum = torch::zeros({});
  for (const auto &x : xs) {
    auto out = net->forward(x);
    outs.push_back(out.detach());
    sum += out.sum().detach();
  }
  return sum.item<double>() + outs.size();
}

double gradients(Net &net, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> norms;
  for (const auto &x : xs) {
    net->forward(x).sum().backward();
    norms.push_back(net->fc1->weight.grad().norm());
  }
  return torch::stack(norms).mean().item<double>();
}

double labelsOnly(const std::vector<torch::Tensor> &ys) {
  std::vector<torch::Tensor> all;
  torch::Tensor counts = torch::zeros({4});
  for (const auto &y : ys) {
    all.push_back(y);
    counts += torch::bincount(y, {}, 4);
  }
  return counts.sum().item<double>() + all.size();
}

double sameKey(Net &net, const std::vector<torch::Tensor> &xs) {
  std::map<std::string, torch::Tensor> latest;
  for (const auto &x : xs)
    latest["out"] = net->forward(x);
  return latest["out"].sum().item<double>();
}

void handedOn(Net &net, const std::vector<torch::Tensor> &xs, void (*consume)(std::vector<torch::Tensor> &)) {
  std::vector<torch::Tensor> outs;
  for (const auto &x : xs)
    outs.push_back(net->forward(x));
  consume(outs);
}

// Gradient accumulation: the micro-batch sum starts from zeros({}) (no grad)
// and may skip the inner loop, but once backward() has returned it requires grad.
void microBatches(torch::nn::Linear &net, torch::optim::Optimizer &opt,
                  const std::vector<torch::Tensor> &xs, int epochs, int accum) {
  torch::Tensor epoch_loss = torch::zeros({});
  for (int e = 0; e < epochs; ++e) {
    torch::Tensor micro_total = torch::zeros({});
    for (int k = 0; k < accum; ++k)
      micro_total = micro_total + net->forward(xs[k]).pow(2).mean() / accum;
    micro_total.backward();
    opt.step();
    epoch_loss += micro_total;
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'micro_total' requires grad and is accumulated into 'epoch_loss'
    // CHECK-FIXES: {{^}}    epoch_loss += micro_total.detach();{{$}}
  }
}

// Leaves hold no graph: collecting parameters for an optimizer keeps none.
// Comparisons are not differentiable: a count of zero weights keeps none.
struct AdapterImpl : torch::nn::Module {
  AdapterImpl() { A = register_parameter("A", torch::randn({4, 8})); }
  torch::Tensor A;
};
TORCH_MODULE(Adapter);
void collect(std::vector<Adapter> &adapters, torch::nn::Linear &net) {
  std::vector<torch::Tensor> trainable, zeros;
  for (auto &a : adapters)
    trainable.push_back(a->A);
  for (auto &p : net->parameters())
    zeros.push_back((p == 0).sum());
  torch::optim::SGD opt(trainable, 0.1);
}

// index_add_ / scatter_add_ add their source: a per-class loss table fed the
// per-sample losses keeps every batch's graph; counts of ones keep none.
void perClassLoss(Net &net, const std::vector<torch::Tensor> &xs,
                  const std::vector<torch::Tensor> &ys, int64_t classes) {
  auto loss_sum = torch::zeros({classes});
  auto seen = torch::zeros({classes});
  for (size_t i = 0; i < xs.size(); ++i) {
    auto per = net->forward(xs[i]).pow(2).mean(1);
    loss_sum.index_add_(0, ys[i], per);
    // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'per' requires grad and is accumulated into 'loss_sum'
    // CHECK-FIXES: {{^}}    loss_sum.index_add_(0, ys[i], per.detach());{{$}}
    seen.index_add_(0, ys[i], torch::ones({ys[i].size(0)}));
  }
  std::cout << loss_sum / seen << "\n";
}

// Chunked inference without a guard: the kept value is a conditional, and the
// handle is rebuilt by `cat` of a braced list of values that require grad.
torch::Tensor chunks(Net &net, const torch::Tensor &wav, int64_t n) {
  net->eval();
  std::vector<torch::Tensor> pieces;
  torch::Tensor tail;
  for (int64_t s = 0; s < n; ++s) {
    auto y = net->forward(wav.narrow(0, s, 4));
    if (tail.defined())
      y = torch::cat({y.narrow(0, 0, 2) + tail, y.narrow(0, 2, 2)});
    pieces.push_back(s + 1 == n ? y : y.narrow(0, 0, 2));
    // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 's + 1 == n ? y : y.narrow(0, 0, 2)' requires grad and is stored in 'pieces'
    // CHECK-FIXES: {{^}}    pieces.push_back((s + 1 == n ? y : y.narrow(0, 0, 2)).detach());{{$}}
    tail = y.narrow(0, 2, 2);
  }
  return torch::cat(pieces);
}

// One branch holds no graph: not claimed.
torch::Tensor chunksOneBranch(Net &net, const torch::Tensor &wav, int64_t n) {
  net->eval();
  std::vector<torch::Tensor> pieces;
  for (int64_t s = 0; s < n; ++s) {
    auto y = net->forward(wav.narrow(0, s, 4));
    pieces.push_back(s % 2 ? y.detach() : wav.narrow(0, s, 1));
  }
  return torch::cat(pieces);
}

// A helper of the file computes from its argument: its result requires grad
// when the argument does. One that detaches, or returns another parameter,
// does not make it so.
torch::Tensor klToUniform(const torch::Tensor &logits) {
  auto q = torch::softmax(logits, 1);
  return (q * q.log()).sum(1);
}
torch::Tensor detachedScore(const torch::Tensor &logits) { return logits.detach().sum(); }
torch::Tensor secondOf(const torch::Tensor &a, const torch::Tensor &b) { return b * 2; }
void helperResults(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> kls, scores, seconds;
  for (const auto &x : xs) {
    auto out = net->forward(x);
    auto kl = klToUniform(out).mean();
    opt.zero_grad();
    (kl * 2).backward();
    opt.step();
    kls.push_back(kl);
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'kl' requires grad and is stored in 'kls'
    scores.push_back(detachedScore(out));
    seconds.push_back(secondOf(out, x));
  }
  std::cout << torch::stack(kls).mean().item<double>() << "\n";
}

// The kept probabilities reach user code only through detach(): nothing
// differentiates them, so each step's graph is kept for nothing.
double areaUnderCurve(const torch::Tensor &probs, const torch::Tensor &labels);

double detachedOnlyAfterwards(Net &net, torch::optim::Optimizer &opt,
                              const std::vector<torch::Tensor> &xs, const torch::Tensor &labels) {
  std::vector<torch::Tensor> probs;
  for (const auto &x : xs) {
    auto logits = net->forward(x);
    auto loss = logits.pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    probs.push_back(torch::sigmoid(logits));
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'torch::sigmoid(logits)' requires grad and is stored in 'probs'
  }
  return areaUnderCurve(torch::cat(probs).detach(), labels);
}

// A struct of losses built in the return of a function of the TU: every
// field requires grad, so each one does at the call.
struct LossParts {
  torch::Tensor total, reg;
};

LossParts lossParts(Net &net, const torch::Tensor &x) {
  auto out = net->forward(x);
  auto reg = out.abs().mean();
  return {out.pow(2).mean() + reg, reg};
}

// One field is detached: the struct is not taken as requiring grad.
LossParts lossPartsLogged(Net &net, const torch::Tensor &x) {
  auto out = net->forward(x);
  auto reg = out.abs().mean();
  return {out.pow(2).mean() + reg, reg.detach()};
}

double structOfLosses(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  auto reg_sum = torch::zeros({}), logged_sum = torch::zeros({});
  for (const auto &x : xs) {
    auto parts = lossParts(net, x);
    auto logged = lossPartsLogged(net, x);
    opt.zero_grad();
    (parts.total + logged.total).backward();
    opt.step();
    reg_sum += parts.reg;
    // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'parts.reg' requires grad and is accumulated into 'reg_sum'
    logged_sum += logged.reg;
  }
  return reg_sum.item<double>() + logged_sum.item<double>();
}

// The struct is assembled field by field from the module's output given as
// an argument: each field requires grad, so the call's `.reg` does.
struct Outputs {
  torch::Tensor pred, aux;
};

Outputs headsOf(Net &net, const torch::Tensor &x) {
  auto y = net->forward(x);
  return {y, y.tanh()};
}

LossParts partsOf(const Outputs &o, const torch::Tensor &target) {
  LossParts l;
  l.reg = o.aux.abs().mean();
  l.total = torch::mse_loss(o.pred, target) + l.reg;
  return l;
}

double assembledLosses(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  auto reg_sum = torch::zeros({});
  for (const auto &x : xs) {
    auto out = headsOf(net, x);
    auto parts = partsOf(out, x);
    opt.zero_grad();
    parts.total.backward();
    opt.step();
    reg_sum += partsOf(out, x).reg;
    // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'partsOf(out, x).reg' requires grad and is accumulated into 'reg_sum'
  }
  return reg_sum.item<double>();
}

// A method of a plain class makes its result from its argument: it requires
// grad when the argument does.
struct Normalizer {
  torch::Tensor mean, std;
  torch::Tensor decode(const torch::Tensor &x) const { return x * std + mean; }
  torch::Tensor frozenDecode(const torch::Tensor &x) const { return (x * std + mean).detach(); }
};

double predictAll(Net &net, const Normalizer &norm, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> preds;
  for (const auto &x : xs) {
    preds.push_back(norm.decode(net->forward(x)));
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'norm.decode(net->forward(x))' requires grad and is stored in 'preds'
    preds.push_back(norm.frozenDecode(net->forward(x)));
  }
  return torch::cat(preds).mean().item<double>();
}

// A lambda's result is what its body makes: forces from autograd::grad
// without create_graph hold no graph, though the positions require grad.
double rollout(Net &net, const torch::Tensor &x0, int64_t steps) {
  auto pos = x0.detach().clone().requires_grad_(true);
  auto vel = torch::zeros_like(x0);
  auto forces_at = [&](const torch::Tensor &p) {
    auto e = net->forward(p).sum();
    auto g = torch::autograd::grad({e}, {p})[0];
    return std::make_pair(e.detach(), g.neg());
  };
  auto state = forces_at(pos);
  for (int64_t i = 0; i < steps; ++i) {
    vel += 0.01 * state.second;
    state = forces_at(pos);
  }
  return vel.sum().item<double>();
}
// A functor writing its argument in place into a buffer (`grid += flow`)
// returns a value that requires grad.
struct Shift {
  torch::Tensor base;
  torch::Tensor operator()(const torch::Tensor &img, const torch::Tensor &flow) {
    auto grid = base.expand_as(flow).clone();
    grid += flow;
    return img * grid;
  }
};
double shifted(Net &net, Shift &shift, const std::vector<torch::Tensor> &xs) {
  auto acc = torch::zeros({});
  for (const auto &x : xs) {
    acc += shift(x, net->forward(x)).sum();
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: 'shift(x, net->forward(x)).sum()' requires grad and is accumulated into 'acc'
  }
  return acc.item<double>();
}

// A method of a plain class returning a braced struct (`return Out{...};`):
// its fields require grad when every tensor given to the braces does.
struct PolicyOut {
  torch::Tensor loss, entropy;
};
class DiscreteAgent {
public:
  PolicyOut actorLoss(const torch::Tensor &obs) {
    auto probs = torch::softmax(actor_->forward(obs), -1);
    return PolicyOut{(probs * 2).sum(), -(probs * probs.log()).sum(-1).mean()};
  }
  PolicyOut evalOnly(const torch::Tensor &obs) {
    auto probs = torch::softmax(actor_->forward(obs), -1).detach();
    return PolicyOut{probs.sum(), -(probs * probs.log()).sum(-1).mean()};
  }
  torch::nn::Linear actor_{4, 3};
};
double trainAgent(DiscreteAgent &agent, const torch::Tensor &obs, int64_t n) {
  auto entropySum = torch::zeros({}), evalSum = torch::zeros({});
  for (int64_t t = 0; t < n; ++t) {
    auto out = agent.actorLoss(obs);
    out.loss.backward();
    entropySum += out.entropy;
    // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'out.entropy' requires grad and is accumulated into 'entropySum'
    evalSum += agent.evalOnly(obs).entropy; // detached: no graph
  }
  return entropySum.item<double>() + evalSum.item<double>();
}

// A module holding only buffers (an EMA codebook) is no layer: its output
// requires grad only as its body makes it from the input, and a codebook
// lookup by argmin indices does not. One that registers its codebook as a
// parameter is a layer.
struct EmaCodesImpl : torch::nn::Module {
  EmaCodesImpl() { embed_ = register_buffer("embed", torch::randn({16, 4})); }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    auto codes = torch::cdist(x, embed_).argmin(1);
    return {torch::nn::functional::embedding(codes, embed_), codes};
  }
  torch::Tensor embed_;
};
TORCH_MODULE(EmaCodes);
struct LearnedCodesImpl : torch::nn::Module {
  LearnedCodesImpl() { embed_ = register_parameter("embed", torch::randn({16, 4})); }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x) {
    auto codes = torch::cdist(x, embed_).argmin(1);
    return {torch::nn::functional::embedding(codes, embed_), codes};
  }
  torch::Tensor embed_;
};
TORCH_MODULE(LearnedCodes);
double quantize(std::vector<EmaCodes> &ema, std::vector<LearnedCodes> &learned,
                const torch::Tensor &z) {
  auto fromEma = torch::zeros_like(z), fromLearned = torch::zeros_like(z);
  for (size_t i = 0; i < ema.size(); ++i) {
    auto stage = ema[i]->forward(z);
    fromEma = fromEma + stage.first;
    auto learnedStage = learned[i]->forward(z);
    fromLearned = fromLearned + learnedStage.first;
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'learnedStage.first' requires grad and is accumulated into 'fromLearned'
  }
  return fromEma.sum().item<double>() + fromLearned.sum().item<double>();
}

// A vector of per-group outputs stacked, or handed to a helper whole, keeps
// their grad: the KL requires grad.
struct GroupsOut {
  torch::Tensor recon;
  std::vector<torch::Tensor> kls;
};
struct GroupsImpl : torch::nn::Module {
  GroupsImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  GroupsOut forward(const torch::Tensor &x) { return {fc(x), {fc(x).pow(2), fc(x).abs()}}; }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Groups);
torch::Tensor sumGroups(const std::vector<torch::Tensor> &kls) {
  return torch::stack(kls, 1).sum(1);
}
double groupKl(Groups &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  auto epochKl = torch::zeros({}), helperKl = torch::zeros({});
  for (const auto &x : xs) {
    auto out = net->forward(x);
    auto kl = torch::stack(out.kls, 1).mean();
    auto loss = out.recon.sum() + kl + sumGroups(out.kls).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    epochKl += kl;
    // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'kl' requires grad and is accumulated into 'epochKl'
    helperKl += sumGroups({out.recon}).mean();
    // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'sumGroups({out.recon}).mean()' requires grad and is accumulated into 'helperKl'
  }
  return epochKl.item<double>() + helperKl.item<double>();
}

// Note [Kept state across calls]: the history a reference parameter names is
// the caller's; this file's only caller logs it, so the graphs are kept for
// nothing. Another caller that differentiates what it gets keeps this quiet.
double epochInto(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs,
                 std::vector<torch::Tensor> &history) {
  for (const auto &x : xs) {
    auto loss = net->forward(x).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    history.push_back(loss);
    // CHECK-MESSAGES: :[[@LINE-1]]:13: warning: 'loss' requires grad and is stored in 'history'
  }
  return 0.0;
}
std::vector<torch::Tensor> lossCurve(Net &net, torch::optim::Optimizer &opt,
                                     const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> curve;
  for (const auto &x : xs) {
    auto loss = net->forward(x).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    curve.push_back(loss);
    // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: 'loss' requires grad and is stored in 'curve'
  }
  return curve;
}
void outputsInto(Net &net, const std::vector<torch::Tensor> &xs, std::vector<torch::Tensor> &outs) {
  for (const auto &x : xs)
    outs.push_back(net->forward(x));
}
std::vector<torch::Tensor> outputsOf(Net &net, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> outs;
  for (const auto &x : xs)
    outs.push_back(net->forward(x));
  return outs;
}
// A value computed from the state is the caller's concern: not followed.
torch::Tensor decodeSteps(Net &net, torch::Tensor h, int64_t steps) {
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < steps; ++t) {
    h = net->forward(h);
    outs.push_back(h);
  }
  return torch::stack(outs, 1);
}
// Unless what was kept had its graph differentiated already: no caller can
// differentiate it again, so the callers decide.
torch::Tensor epochMean(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  std::vector<torch::Tensor> losses;
  for (const auto &x : xs) {
    auto loss = net->forward(x).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step();
    losses.push_back(loss);
    // CHECK-MESSAGES: :[[@LINE-1]]:12: warning: 'loss' requires grad and is stored in 'losses'
  }
  return torch::stack(losses).mean();
}
// A structured binding of the result is the state the caller uses.
std::pair<torch::Tensor, std::vector<torch::Tensor>> withHidden(Net &net, torch::Tensor h) {
  std::vector<torch::Tensor> hids;
  for (int k = 0; k < 3; ++k) {
    h = net->forward(h);
    hids.push_back(h);
  }
  return {h, hids};
}
void runEpochs(Net &net, torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &xs) {
  std::cout << decodeSteps(net, xs[0], 4).sum().item<double>();
  auto mean = epochMean(net, opt, xs);
  std::cout << mean.item<double>();
  auto [last, hids] = withHidden(net, xs[0]);
  (last + torch::stack(hids).sum()).sum().backward();
  std::vector<torch::Tensor> history;
  epochInto(net, opt, xs, history);
  auto curve = lossCurve(net, opt, xs);
  std::cout << history.size() << " " << curve.back().item<double>() << "\n";
  std::vector<torch::Tensor> outs;
  outputsInto(net, xs, outs);
  torch::stack(outs).sum().backward(); // differentiated here: kept on purpose
  torch::stack(outputsOf(net, xs)).sum().backward();
}
