// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-unnecessary-clone %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-unnecessary-clone %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>
#include <deque>
#include <vector>

torch::Tensor normalize(const torch::Tensor &img, const torch::Tensor &mean, const torch::Tensor &std) {
  auto out = img.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: 'clone' copies 'img', then 'sub_' rewrites the copy in place at once{{.*}}use 'img.sub(mean)' [tensor-unnecessary-clone]
  out.sub_(mean);
  out.div_(std);
  return out;
}
// CHECK-FIXES: auto out = img.sub(mean);
// CHECK-FIXES-NEXT: //
// CHECK-FIXES-NEXT: out.div_(std);

torch::Tensor td_target(const torch::Tensor &rewards, const torch::Tensor &next_q, double gamma) {
  auto target = rewards.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'clone' copies 'rewards', then 'add_' rewrites{{.*}}use 'rewards.add(next_q * gamma)'
  target.add_(next_q * gamma);
  return target;
}
// CHECK-FIXES: auto target = rewards.add(next_q * gamma);

torch::Tensor to_unit(const torch::Tensor &img) {
  torch::Tensor x = img.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:25: warning: 'clone' copies 'img', then '/=' rewrites{{.*}}use 'img.div(255.0)'
  x /= 255.0;
  return x;
}
// CHECK-FIXES: torch::Tensor x = img.div(255.0);

torch::Tensor stats(const torch::Tensor &batch) {
  auto b = batch.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:18: warning: 'clone' copies 'batch' for nothing: neither 'b' nor 'batch' is written while 'b' lives, and 'b' does not leave the block; use 'batch' itself
  return torch::stack({b.mean(0), b.var(0)});
}
// CHECK-FIXES: auto b = batch;

double mean_fg(const std::vector<torch::Tensor> &masks) {
  double total = 0;
  for (const auto &m0 : masks) {
    auto m = m0.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'clone' copies 'm0' for nothing
    total += (m > 0).to(torch::kFloat).mean().item<double>();
  }
  return total;
}
// CHECK-FIXES: auto m = m0;

struct Net : torch::nn::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  torch::Tensor forward(torch::Tensor x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

torch::Tensor top5(Net &net, const torch::Tensor &x) {
  auto logits = net.forward(x);
  auto kept = logits.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'clone' copies 'logits' for nothing
  return std::get<0>(kept.topk(2));
}
// CHECK-FIXES: auto kept = logits;

torch::Tensor masked(const torch::Tensor &x, const torch::Tensor &mask) {
  auto y = x.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: 'clone' copies 'x', then 'masked_fill_' rewrites{{.*}}use 'x.masked_fill(mask, 0)'
  y.masked_fill_(mask, 0);
  return y;
}
// CHECK-FIXES: auto y = x.masked_fill(mask, 0);

torch::Tensor zeroed(const torch::Tensor &x) {
  auto y = x.clone(); // zero_: zeros_like is no twin (it drops the autograd history)
  y.zero_();
  return y;
}

// ---- not flagged ----------------------------------------------------------------

struct Transition {
  torch::Tensor s, s2;
};
void push(std::deque<Transition> &buf, const torch::Tensor &state, const torch::Tensor &next) {
  buf.push_back({state.clone(), next.clone()}); // stored in the replay buffer
}

torch::Tensor returned(const torch::Tensor &x) {
  auto y = x.clone(); // the caller owns the copy
  return y;
}

std::vector<torch::Tensor> snapshot(Net &net, torch::optim::SGD &opt, const torch::Tensor &x) {
  std::vector<torch::Tensor> before;
  for (const auto &p : net.parameters())
    before.push_back(p.detach().clone()); // snapshot before the step
  auto loss = net.forward(x).sum();
  opt.zero_grad();
  loss.backward();
  opt.step();
  return before;
}

torch::Tensor weight_delta(Net &net, torch::optim::SGD &opt, const torch::Tensor &x) {
  auto w0 = net.fc->weight.clone(); // the step writes the weight while w0 is read
  net.forward(x).sum().backward();
  opt.step();
  return net.fc->weight - w0;
}

torch::Tensor flip_boxes(const torch::Tensor &boxes, int64_t w) {
  auto f = boxes.clone(); // columns rewritten through views
  f.select(1, 0).copy_(w - boxes.select(1, 2));
  f.select(1, 2).copy_(w - boxes.select(1, 0));
  return f;
}

torch::Tensor leaf_copy(const torch::Tensor &init) {
  auto p = init.detach().clone().requires_grad_(true); // a new leaf
  return p;
}


torch::Tensor discounted(const torch::Tensor &r, double gamma) {
  auto ret = r.clone(); // elements written in the loop
  for (int64_t i = r.size(0) - 2; i >= 0; --i)
    ret[i] += gamma * ret[i + 1];
  return ret;
}

// The in-place op's arguments read the copy itself: on a named source they
// read the source instead (the copy holds its values).
torch::Tensor centred(const torch::Tensor &ref) {
  auto r = ref.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'clone' copies 'ref', then 'sub_' rewrites the copy in place at once{{.*}}use 'ref.sub(ref.mean(-1, true))' [tensor-unnecessary-clone]
  r.sub_(r.mean(-1, true));
  return r * 2;
}
// CHECK-FIXES: auto r = ref.sub(ref.mean(-1, true));

struct Sampled {
  torch::Tensor weights;
};
torch::Tensor normalisedWeights(const Sampled &batch) {
  auto w = batch.weights.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:26: warning: 'clone' copies 'batch.weights', then 'div_' rewrites
  w.div_(w.max());
  return w;
}
// CHECK-FIXES: auto w = batch.weights.div(batch.weights.max());

// A call's result is not a named source: its arguments keep naming the copy.
torch::Tensor fromCall(torch::nn::Linear &lin, const torch::Tensor &x) {
  auto y = lin(x).clone();
  y.sub_(y.mean());
  return y;
}

// A chain of in-place ops on the copy: its first is what the clone feeds.
// No fix-it: the rest of the chain stays on the copy.
torch::Tensor normalizedChain(const torch::Tensor &obs, const torch::Tensor &mean) {
  auto x = obs.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:16: warning: 'clone' copies 'obs', then 'sub_' rewrites the copy in place at once: two passes over the data where the out-of-place op makes the same tensor in one; use 'obs.sub(mean)' [tensor-unnecessary-clone]
  x.sub_(mean).div_(2).clamp_(-5.0, 5.0);
  return x;
}

// scatter_ has its out-of-place twin (ops.def: scatter): masking the probe
// words' own similarity out of a copy is one pass.
torch::Tensor nearestOthers(const torch::Tensor &sims, const torch::Tensor &ids, int64_t k) {
  auto scores = sims.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:22: warning: 'clone' copies 'sims', then 'scatter_' rewrites the copy in place at once{{.*}}use 'sims.scatter(1, ids.unsqueeze(1), -2.0)' [tensor-unnecessary-clone]
  scores.scatter_(1, ids.unsqueeze(1), -2.0);
  return std::get<1>(scores.topk(k, 1));
}

// A view of a named tensor holds its storage: the copy of one column is for
// nothing while the tensor is only read, and needed once it is written.
torch::Tensor meanHeading(const torch::Tensor &particles) {
  auto theta = particles.select(2, 2).clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:39: warning: 'clone' copies 'particles.select(2, 2)' for nothing
  return torch::atan2(torch::sin(theta).sum(1), torch::cos(theta).sum(1));
}
torch::Tensor headingBeforeTurn(torch::Tensor &particles) {
  auto theta = particles.select(2, 2).clone();
  particles.select(2, 2).add_(0.1);
  return torch::sin(theta).sum(1);
}

// A method of another object whose body writes nothing it is given and
// calls nothing opaque: the copy handed to it is only read.
struct PolicyHeadImpl : torch::nn::Module {
  PolicyHeadImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor smoothed(const torch::Tensor &q, double eps) {
    return torch::softmax(q, 1) * (1 - eps) + eps / q.size(1);
  }
  torch::Tensor clipped(torch::Tensor q) { return q.clamp_(-1.0, 1.0); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(PolicyHead);

double optionValues(PolicyHead &head, const torch::Tensor &x) {
  auto q = head->fc(x);
  auto snapshot = q.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'clone' copies 'q' for nothing
  auto v = (head->smoothed(snapshot, 0.1) * snapshot).sum();
  auto kept = q.clone();
  auto w = head->clipped(kept).sum(); // writes its argument: the copy is needed
  return v.item<double>() + w.item<double>() + q.sum().item<double>();
}

// A member's copy that an op saves for backward is needed: the next forward
// rewrites the member in place before backward runs (spectral normalisation).
struct SpectralLinearImpl : torch::nn::Module {
  SpectralLinearImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::randn({out, in}));
    u_ = register_buffer("u", torch::randn({out}));
    v_ = register_buffer("v", torch::randn({in}));
    scale_ = register_buffer("scale", torch::ones({1}));
  }
  torch::Tensor weight, u_, v_, scale_;
  torch::Tensor sigma() {
    {
      torch::NoGradGuard no_grad;
      v_.copy_(torch::mv(weight.t(), u_));
      u_.copy_(torch::mv(weight, v_));
    }
    auto u = u_.clone();
    auto v = v_.clone();
    auto s = scale_.clone();
    // CHECK-MESSAGES: :[[@LINE-1]]:21: warning: 'clone' copies 'scale_' for nothing
    return torch::dot(u, torch::mv(weight, v)) + s.sum();
  }
};

// A clone no variable holds: rewritten in place at once (chained), or a copy
// of an op's fresh result, which nothing else holds.
torch::Tensor plausibleScores(const torch::Tensor &scores, const torch::Tensor &keep) {
  auto masked = scores.clone().masked_fill_(keep.logical_not(), -1e9);
  // CHECK-MESSAGES: :[[@LINE-1]]:24: warning: 'clone' copies 'scores', then 'masked_fill_' rewrites the copy in place at once
  // CHECK-FIXES: auto masked = scores.masked_fill(keep.logical_not(), -1e9);
  return masked;
}
torch::Tensor tdTarget(const torch::Tensor &reward, const torch::Tensor &q) {
  return reward.clone().add_(0.99 * q);
  // CHECK-MESSAGES: :[[@LINE-1]]:17: warning: 'clone' copies 'reward', then 'add_' rewrites
  // CHECK-FIXES: return reward.add(0.99 * q);
}
torch::Tensor forcesOf(const std::vector<torch::Tensor> &grads) {
  return grads[0].clone().neg_();
  // CHECK-MESSAGES: :[[@LINE-1]]:19: warning: 'clone' copies 'grads[0]', then 'neg_' rewrites
  // CHECK-FIXES: return grads[0].neg();
}
torch::Tensor labelsOf(const torch::Tensor &prob) {
  auto pred = prob.argmax(0).clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:30: warning: 'clone' copies 'prob.argmax(0)', then 'masked_fill_' rewrites the copy in place at once
  // CHECK-FIXES: auto pred = prob.argmax(0).masked_fill(prob.amax(0) < 0.5, 0);
  pred.masked_fill_(prob.amax(0) < 0.5, 0);
  return pred;
}
// Not flagged: the copy is written by an op without an out-of-place twin,
// an integer copy stays integer in place, a view's copy is needed when the
// view's base is written, and clone(memory_format) changes the layout.
torch::Tensor keptCopies(torch::Tensor buf, const torch::Tensor &src, int64_t n) {
  auto a = src.clone().zero_();
  auto ids = torch::arange(n).clone().add_(1);
  auto row = buf.select(0, 0).clone();
  buf.zero_();
  auto cl = src.permute({0, 2, 3, 1}).clone(torch::MemoryFormat::Contiguous);
  return a.sum() + ids.sum() + row.sum() + cl.sum();
}

// masked_fill keeps self's dtype whatever the fill value: an integer copy
// filled at once is the out-of-place op (add_ above may promote: kept).
torch::Tensor clozeInput(const torch::Tensor &seq, const torch::Tensor &masked, int64_t token) {
  auto ids = seq.to(torch::kLong);
  auto input = ids.clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:20: warning: 'clone' copies 'ids', then 'masked_fill_' rewrites the copy in place at once
  input.masked_fill_(masked, token);
  return input;
}
// CHECK-FIXES: auto input = ids.masked_fill(masked, token);

// A function of the file whose every return is a fresh op's result, and one
// of the results of a (values, indices) op.
torch::Tensor flatParams(torch::nn::Module &m) {
  std::vector<torch::Tensor> flat;
  for (const auto &p : m.parameters())
    flat.push_back(p.view(-1));
  return torch::cat(flat);
}
struct Cache {
  const torch::Tensor &table() const { return table_; }
  torch::Tensor table_;
};
torch::Tensor snapshot(torch::nn::Module &m, const torch::Tensor &x, const Cache &c) {
  auto old = flatParams(m).clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:28: warning: 'clone' copies the fresh result of 'flatParams' (a new tensor from 'cat'), which nothing else holds
  // CHECK-FIXES: auto old = flatParams(m);
  auto sorted = std::get<0>(torch::sort(x, 0)).clone();
  // CHECK-MESSAGES: :[[@LINE-1]]:48: warning: 'clone' copies the fresh result of 'sort', which nothing else holds
  // CHECK-FIXES: auto sorted = std::get<0>(torch::sort(x, 0));
  auto kept = c.table().clone(); // the member the cache holds
  return old.sum() + sorted.sum() + kept.sum();
}
