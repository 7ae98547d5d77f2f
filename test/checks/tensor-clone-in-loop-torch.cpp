// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-clone-in-loop %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-clone-in-loop %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>
#include <vector>

float evaluate(const std::vector<torch::Tensor> &preds, const torch::Tensor &targets,
               const torch::Tensor &input, torch::Device device) {
  float total = 0;
  for (const auto &pred : preds) {
    auto target = targets.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:27: warning: 'to' of loop-invariant 'targets' copies it to another device again on every iteration (a synchronising transfer; assuming 'targets' is a float32 CPU tensor, as nearly all are)
    auto mask = input.gt(0).clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:29: warning: 'clone' of loop-invariant 'input.gt(0)' allocates and copies it on every iteration; it is never written
    // CHECK-FIXES: auto mask = input.gt(0);
    total += torch::mse_loss(pred * mask, target).item<float>();
  }
  return total;
}

std::vector<torch::Tensor> negatives(torch::nn::Linear &model, torch::optim::SGD &opt,
                                     const std::vector<torch::Tensor> &batches, int steps) {
  std::vector<torch::Tensor> history;
  for (int step = 0; step < steps; ++step) {
    auto before = model->weight.clone();        // the weight changes in opt.step()
    opt.step();
    history.push_back(model->weight - before);
  }
  for (const auto &b : batches)
    history.push_back(b.clone());               // the loop variable
  for (int step = 0; step < steps; ++step) {
    auto w = batches[0].clone();                // opt.step() may write what batches holds
    opt.step();
    history.push_back(w.sum());
  }
  return history;
}

std::tuple<torch::Tensor, torch::Tensor> policy(const torch::Tensor &obs);

// Conversions that return the tensor itself, and values that change per step.
float noCopies(int64_t n, int64_t d, torch::Device device, const std::vector<torch::Tensor> &obs) {
  auto p = torch::randn({n, d});
  auto r = torch::ones({4});
  auto labels = torch::arange(10);
  float total = 0;
  for (int i = 0; i < 100; ++i) {
    total += p.contiguous().sum().item<float>();    // contiguous already
    total += r.cpu().sum().item<float>();           // on the CPU already
    total += r.to(torch::kFloat).sum().item<float>(); // float32 already
    total += labels.to(device).sum().item<float>();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'to' of loop-invariant 'labels' copies it to another device again on every iteration (a synchronising transfer, 80 bytes each time); hoist it out of the loop
  }
  for (const auto &o : obs) {
    auto [action, logp] = policy(o.to(device));
    total += action.cpu().sum().item<float>();     // a new action every step
    total += logp.to(torch::kDouble).sum().item<float>();
  }
  return total;
}

// An assertion shows the device.
float hostCopies(const torch::Tensor &x, int n) {
  TORCH_CHECK(x.is_cuda(), "expected a CUDA tensor");
  float total = 0;
  for (int i = 0; i < n; ++i)
    total += x.cpu().sum().item<float>();
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'cpu' of loop-invariant 'x' copies it to another device again on every iteration (a synchronising transfer); hoist it out of the loop
  return total;
}

// A module's forward writes its own state and its arguments, not the
// caller's members: the constants stay invariant across it. An optimizer
// step writes every parameter it was given: members are not invariant then.
class Classifier {
public:
  Classifier(torch::nn::Sequential net, torch::Device device) : net_(std::move(net)), device_(device) {}
  int64_t predict(const std::vector<torch::Tensor> &images) {
    torch::InferenceMode guard;
    int64_t hits = 0;
    for (const auto &img : images) {
      auto m = mean_.to(device_);
      // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'to' of loop-invariant 'mean_' copies it to another device again on every iteration
      auto logits = net_->forward((img.to(device_) - m));
      hits += logits.argmax(1).item<int64_t>();
    }
    return hits;
  }
  void finetune(torch::optim::Optimizer &opt, const std::vector<torch::Tensor> &batches) {
    for (const auto &b : batches) {
      auto w = scale_.to(device_);
      auto loss = net_->forward(b.to(device_) * w).sum();
      loss.backward();
      opt.step();
    }
  }

private:
  torch::nn::Sequential net_;
  torch::Device device_;
  torch::Tensor mean_ = torch::zeros({1, 3, 1, 1});
  torch::Tensor scale_ = torch::ones({1});
};

// A function of the file that returns a struct keeps only the arguments its
// body keeps: targets computed from the copy do not hold it, so the optimizer
// step cannot reach the source; a struct that holds the copy can.
struct MatchTargets {
  torch::Tensor labels, anchors;
};
MatchTargets matchAnchors(const torch::Tensor &anchors, const torch::Tensor &boxes) {
  auto iou = anchors.matmul(boxes.t());
  return {iou.argmax(1), torch::Tensor()};
}
MatchTargets keepAnchors(const torch::Tensor &anchors) { return {anchors.sum(1), anchors}; }
void trainDetector(torch::nn::Linear &head, torch::optim::Optimizer &opt,
                   const std::vector<torch::Tensor> &boxes) {
  torch::Device device(torch::kCUDA);
  auto anchors = torch::rand({64, 4});
  for (const auto &b : boxes) {
    auto anc = anchors.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:24: warning: 'to' of loop-invariant 'anchors' copies it to another device again on every iteration
    auto t = matchAnchors(anc, b.to(device));
    auto loss = head->forward(b.to(device)).sum() + t.labels.sum();
    loss.backward();
    opt.step();
  }
}
void trainKeeping(torch::nn::Linear &head, torch::optim::Optimizer &opt,
                  const std::vector<torch::Tensor> &boxes) {
  torch::Device device(torch::kCUDA);
  auto anchors = torch::rand({64, 4});
  for (const auto &b : boxes) {
    auto anc = anchors.to(device);
    auto t = keepAnchors(anc);
    auto loss = head->forward(b.to(device)).sum() + t.labels.sum();
    loss.backward();
    opt.step();
  }
}

// A helper of the file returning a conversion of storage it made returns
// fresh storage, not the labels': the optimizer step cannot change it.
torch::Tensor classWeights(const torch::Tensor &labels, int64_t n) {
  auto counts = torch::bincount(labels, {}, n).to(torch::kDouble);
  return (counts / counts.sum()).to(torch::kFloat);
}
void trainWeighted(torch::nn::Linear &model, torch::optim::Optimizer &opt,
                   const torch::Tensor &labels, int n) {
  torch::Device device(torch::kCUDA);
  auto w = classWeights(labels, 4);
  auto inv = torch::inverse(torch::eye(4));
  for (int i = 0; i < n; ++i) {
    auto x = torch::randn({2, 4}).to(device);
    auto loss = (model->forward(x) * w.to(device)).sum() + inv.to(device).sum();
    // CHECK-MESSAGES: :[[@LINE-1]]:40: warning: 'to' of loop-invariant 'w' copies it to another device again on every iteration
    // CHECK-MESSAGES: :[[@LINE-2]]:64: warning: 'to' of loop-invariant 'inv' copies it to another device again on every iteration
    loss.backward();
    opt.step();
  }
}

// The fields of the caller's struct of tensors are the caller's data: the
// optimizer step does not reach them; a loop that assigns one does.
struct Series {
  torch::Tensor times, states;
};
void fitSeries(torch::nn::Linear &model, torch::optim::Optimizer &opt, const Series &s, int n) {
  torch::Device device(torch::kCUDA);
  for (int i = 0; i < n; ++i) {
    auto t = s.times.narrow(0, 0, 4).to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:38: warning: 'to' of loop-invariant 's.times.narrow(0, 0, 4)' copies it to another device again on every iteration
    model->forward(t).sum().backward();
    opt.step();
  }
}
void shiftSeries(Series &s, int n) {
  torch::Device device(torch::kCUDA);
  for (int i = 0; i < n; ++i) {
    auto t = s.times.to(device);
    s.times = s.times + 1;
  }
}

// A method of the object called in the loop is read: one that writes no
// field leaves `device_` invariant; one that assigns it does not.
class Planner {
public:
  torch::Tensor plan(const torch::Tensor &s0, const torch::Tensor &goal, int iters) {
    torch::Tensor best;
    for (int it = 0; it < iters; ++it) {
      auto g = goal.to(device_);
      // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'to' of loop-invariant 'goal' copies it to another device again on every iteration
      best = rollout(s0, g);
    }
    return best;
  }
  torch::Tensor replan(const torch::Tensor &goal, int iters) {
    torch::Tensor best;
    for (int it = 0; it < iters; ++it) {
      auto g = goal.to(device_);
      best = rollout(g, g);
      pickDevice(it);
    }
    return best;
  }

private:
  torch::Tensor rollout(const torch::Tensor &s, const torch::Tensor &goal) {
    return (s - goal).pow(2).sum(-1);
  }
  void pickDevice(int it) { device_ = it % 2 ? torch::kCUDA : torch::kCPU; }
  torch::Device device_ = torch::kCUDA;
};

// `acc.add_(x)` writes acc, not x: the copy of x is still loop-invariant.
void accumulate(const torch::Tensor &x, int n) {
  torch::Device device(torch::kCUDA);
  auto acc = torch::zeros({4}, torch::TensorOptions().device(device));
  for (int i = 0; i < n; ++i) {
    auto xd = x.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'to' of loop-invariant 'x' copies it to another device again on every iteration
    acc.add_(xd);
    acc.add_(x.sum());
  }
}

// An options setter keeps the handle it is given (TORCH_ARG's `T&&` overload):
// the class weights are read, not written, and go to the device every step.
void weightedSteps(torch::nn::Linear &model, const std::vector<torch::Tensor> &xs,
                   const std::vector<torch::Tensor> &ys, const torch::Tensor &counts,
                   torch::Device device) {
  torch::optim::SGD opt(model->parameters(), 0.1);
  auto class_w = counts.sum() / counts.clamp_min(1.0);
  for (size_t i = 0; i < xs.size(); ++i) {
    auto loss = torch::nn::functional::cross_entropy(
        model->forward(xs[i].to(device)), ys[i].to(device),
        torch::nn::functional::CrossEntropyFuncOptions().weight(class_w.to(device)));
    // CHECK-MESSAGES: :[[@LINE-1]]:73: warning: 'to' of loop-invariant 'class_w' copies it to another device again on every iteration
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

// A value computed by any out-of-place operator (`~m`, `a < b`) is as
// invariant as its operands.
void tuneRows(torch::nn::Embedding &emb, const torch::Tensor &has_vector, int64_t steps) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto tune_rows = (~has_vector).to(torch::kFloat).unsqueeze(1);
  for (int64_t s = 0; s < steps; ++s) {
    auto row_mask = tune_rows.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:31: warning: 'to' of loop-invariant 'tune_rows' copies it to another device again on every iteration
    emb->weight.grad().mul_(row_mask);
  }
}

// The module rebinds its padding argument locally and returns values it
// computes from it: it neither writes nor keeps the copy, so the mask moved
// to the device every step is still a repeated transfer.
struct MaskedEncoderImpl : torch::nn::Module {
  MaskedEncoderImpl() { fc = register_module("fc", torch::nn::Linear(8, 8)); }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor &x,
                                                  const torch::Tensor &pad_in) {
    auto pad = pad_in;
    if (pad.size(1) > x.size(1))
      pad = pad.narrow(1, 0, x.size(1));
    auto keep = pad.logical_not().to(x.dtype()).unsqueeze(-1);
    auto h = fc(x) * keep;
    return {h.sum(), keep.sum()};
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(MaskedEncoder);

struct CropLoader {
  torch::Tensor next(); // defined elsewhere: an opaque call in the loop
};

void pretrainMasked(MaskedEncoder &model, CropLoader &loader, int64_t steps) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  auto no_pad = torch::zeros({4, 16}, torch::kBool);
  for (int64_t s = 0; s < steps; ++s) {
    auto c = loader.next().to(device);
    auto pad = no_pad.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:23: warning: 'to' of loop-invariant 'no_pad' copies it to another device again on every iteration
    auto out = model->forward(c, pad);
    out.first.backward();
  }
}

// `TensorOptions().device(device)` binds the device through a forwarding
// reference (`Args&&`): a library call that only reads it, so the device
// stays loop-invariant and the upload of the fixed fractions is per step.
void quantileActing(torch::nn::Linear &net, torch::Tensor obs, int64_t steps, int64_t B) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto act_taus = torch::linspace(0.1, 0.9, 8).unsqueeze(0);
  for (int64_t step = 0; step < steps; ++step) {
    auto taus_act = act_taus.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: 'to' of loop-invariant 'act_taus' copies it to another device again on every iteration
    auto noise = torch::rand({B, 8}, torch::TensorOptions().device(device));
    obs = net->forward(obs.to(device)) * taus_act + noise;
  }
}

// An accumulator started afresh each epoch from a factory and then written in
// place: the fresh value is the point, not a copy of data kept across epochs.
int64_t epochAccuracy(torch::nn::Linear &net, const std::vector<torch::Tensor> &xs, int epochs) {
  torch::Device device(torch::kCUDA);
  int64_t total = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    torch::Tensor correct = torch::zeros({}, torch::kLong).to(device);
    for (const auto &x : xs)
      correct += net->forward(x.to(device)).argmax(1).eq(0).sum();
    total += correct.item<int64_t>();
  }
  return total;
}

// A factory converted in the loop is a construction in two steps (no report);
// moved to a device, it is a host-to-device copy every iteration.
double rampLoss(const std::vector<torch::Tensor> &scenes, const std::vector<float> &w, int64_t n) {
  double total = 0;
  for (const auto &s : scenes) {
    auto t = torch::arange(n).to(torch::kFloat).view({1, -1, 1});
    auto weights = torch::tensor(w).to(torch::kCUDA);
    // CHECK-MESSAGES: :[[@LINE-1]]:37: warning: 'to' of loop-invariant 'torch::tensor(w)'
    total += (s * t).sum().item<double>() + weights.sum().item<double>();
  }
  return total;
}

// An element of a helper's fresh result (`centers(g)[0]`) is local storage:
// an opaque call in the loop (an options setter, a loss) does not change it.
torch::Tensor centersOf(const torch::Tensor &grid) { return grid * 2 + 0.5; }
torch::Tensor matchLoss(const torch::Tensor &grid, const std::vector<torch::Tensor> &gts) {
  auto pts0 = centersOf(grid)[0];
  auto loss = torch::zeros({});
  for (const auto &gt : gts) {
    auto pts = pts0.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'clone' of loop-invariant 'pts0'
    // CHECK-FIXES: {{^}}    auto pts = pts0;{{$}}
    loss = loss + torch::nn::functional::binary_cross_entropy_with_logits(
                      gt, pts, torch::nn::functional::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum));
  }
  return loss;
}

// Note [rebinding in a callee]: `out = out * s` as a statement of the body
// rebinds out before the in-place add, which then writes the product; the
// same rebinding under a condition leaves out aliasing the argument.
torch::Tensor jittered(const torch::Tensor &pts, double s) {
  torch::Tensor out = pts;
  out = out * s;
  out.add_(torch::randn_like(out) * 0.01);
  return out;
}
torch::Tensor maybeScaled(const torch::Tensor &pts, double s) {
  torch::Tensor out = pts;
  if (s != 1.0)
    out = out * s;
  out.add_(1.0);
  return out;
}
// Helpers calling helpers, five deep, only reading their argument.
torch::Tensor dist2(const torch::Tensor &a) { return a.pow(2).sum(-1); }
torch::Tensor nearest(const torch::Tensor &a) { return std::get<1>(dist2(a).topk(2, -1)); }
torch::Tensor grouped(const torch::Tensor &a) { return a.index_select(0, nearest(a).flatten()); }
torch::Tensor embedded(const torch::Tensor &a) { return grouped(a).mean(0); }
torch::Tensor classify(const torch::Tensor &a) { return embedded(a).softmax(-1); }

torch::Tensor votes(const torch::Tensor &points, const std::vector<std::vector<int64_t>> &seen,
                    int64_t n) {
  torch::NoGradGuard no_grad;
  torch::Tensor probs = torch::zeros({3});
  for (int64_t v = 0; v < n; ++v) {
    auto pts = points.to(torch::kCUDA);
    // CHECK-MESSAGES: :[[@LINE-1]]:23: warning: 'to' of loop-invariant 'points' copies it to another device again on every iteration
    std::vector<int64_t> picked;
    for (auto it : seen[v]) // the vector's iterators change no tensor
      picked.push_back(it);
    probs = probs + classify(jittered(pts, 0.9 + 0.1 * v)).cpu();
  }
  for (int64_t v = 0; v < n; ++v) {
    auto pts = points.to(torch::kCUDA); // maybeScaled may write the copy
    probs = probs + maybeScaled(pts, 0.5 * v).sum().cpu();
  }
  return probs;
}

// `w = interior.to(device_)`: assigning the copy to a handle rebinds it; the
// source, which `to` may return itself, is not written by that.
struct TiledDecoder {
  explicit TiledDecoder(torch::nn::Linear m) : m_(std::move(m)), device_(torch::kCUDA) {
    m_->to(device_);
  }
  torch::Tensor run(const torch::Tensor &z0, int64_t n) {
    auto z = z0.to(device_);
    const auto interior = torch::ones({4, 4});
    torch::Tensor acc;
    for (int64_t i = 0; i < n; ++i) {
      torch::Tensor w;
      if (i % 2 == 0) {
        w = interior.to(device_);
        // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'to' of loop-invariant 'interior' copies it to another device again on every iteration
      } else {
        w = torch::ones({i, 4}).to(device_);
      }
      acc = m_->forward(z) * w;
    }
    return acc;
  }
  torch::nn::Linear m_;
  torch::Device device_;
};

// A slice from a run-time start (> 0 by the defaults) leaves out what precedes
// it: not contiguous, so contiguous() copies it on every iteration.
torch::Tensor refine(torch::nn::Linear &update, const torch::Tensor &ctx, int64_t hdim,
                     int64_t cdim, int iters) {
  auto inp = ctx.narrow(1, hdim, cdim);
  auto net = ctx.narrow(1, 0, hdim).tanh();
  for (int i = 0; i < iters; ++i)
    net = update(torch::cat({net, inp.contiguous()}, 1));
  // CHECK-MESSAGES: :[[@LINE-1]]:39: warning: 'contiguous' of loop-invariant 'inp'
  return net;
}

// A module called through its holder (`fp(x)`) runs its forward, which
// writes only the module and its arguments; `q->` only gives the pointer:
// the dequantised weight stays loop-invariant.
struct DequantImpl : torch::nn::Module {
  DequantImpl() { bias = register_parameter("bias", torch::zeros({3})); w_ = torch::rand({3, 4}); }
  torch::Tensor dequantize() const { return w_ * 2; }
  torch::Tensor w_, bias;
};
TORCH_MODULE(Dequant);
double layerError(Dequant &q, torch::nn::Linear &fp, const std::vector<torch::Tensor> &batches) {
  torch::NoGradGuard no_grad;
  auto w_deq = q->dequantize();
  double err = 0;
  for (const auto &x : batches) {
    auto wt = w_deq.t().contiguous();
    // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'contiguous' of loop-invariant 'w_deq.t()' copies the non-contiguous tensor on every iteration
    auto y = torch::mm(x, wt) + q->bias;
    err += (fp(x) - y).pow(2).mean().item<double>();
  }
  return err;
}

// An opaque call in the loop (`agent.update(b)`) cannot reach a local object
// it is not given (Note [Opaque calls]): a field of that object, and a tensor
// a method of the file returns fresh, stay loop-invariant. Not when a method
// keeps the tensor it is given, another object is given the object, or the
// loop calls a non-const method of it.
struct Normaliser {
  void fit(const torch::Tensor &x) { stats = torch::stack({x.mean(0), x.std(0)}); }
  void keep(const torch::Tensor &x) { stats = x; }
  void update(const torch::Tensor &x) { stats.mul_(0.9).add_(x); }
  torch::Tensor positiveWeights() const { return torch::tensor({3.2f, 5.7f}); }
  torch::Tensor stats;
};
struct Learner {
  double update(const torch::Tensor &b);
  void attach(Normaliser &n);
};
torch::Tensor nextBatch();
double fitLoop(torch::Device device, int n, const torch::Tensor &data) {
  Normaliser norm, kept, given, touched;
  norm.fit(data);
  kept.keep(data);
  given.fit(data);
  touched.fit(data);
  const auto weights = norm.positiveWeights();
  Learner agent;
  agent.attach(given);
  double total = 0;
  for (int it = 0; it < n; ++it) {
    auto b = nextBatch();
    auto s1 = norm.stats.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:26: warning: 'to' of loop-invariant 'norm.stats' copies it to another device again on every iteration
    auto w = weights.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'to' of loop-invariant 'weights' copies it to another device again on every iteration
    auto s2 = kept.stats.to(device);
    auto s3 = given.stats.to(device);
    auto s4 = touched.stats.to(device);
    touched.update(b);
    total += agent.update(b - s1 + s2 + s3 + s4 + w);
  }
  return total;
}

// A copy made only on the first iteration (the counter still at its start)
// is made once; on every other iteration it is still reported.
torch::Tensor firstRoundOnly(const torch::Tensor &boxes, const torch::Tensor &x, int64_t rounds,
                             torch::Device device) {
  torch::Tensor prompt, out = x;
  for (int64_t r = 0; r < rounds; ++r) {
    prompt = r == 0 ? boxes.to(device) : out.detach();
    if (0 == r) {
      out = out + boxes.to(device);
    }
    out = out + prompt;
    if (r == 1)
      out = out * boxes.to(device);
    // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'to' of loop-invariant 'boxes' copies it to another device again on every iteration
  }
  return out;
}
