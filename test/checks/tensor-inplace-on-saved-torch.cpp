// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-inplace-on-saved %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-inplace-on-saved %t.plugin -- --fix-errors -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;

struct Res : torch::nn::Module {
  Res() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    w = register_parameter("w", torch::ones({8}));
  }
  Tensor forward(Tensor x) {
    auto identity = x;
    auto out = torch::relu(fc1(x));
    out += identity;
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place '+=' on 'out', which 'relu' saved for backward (its result): backward() through 'relu' raises "one of the variables needed for gradient computation has been modified by an inplace operation" [tensor-inplace-on-saved]
    // CHECK-FIXES: {{^}}    out = out + identity;{{$}}
    return fc2(out);
  }
  Tensor forwardResNetOrder(Tensor x) {
    auto identity = x;
    auto out = bn(fc1(x));
    out += identity;
    out = torch::relu(out);
    return fc2(out);
  }
  Tensor forwardReassigned(Tensor x) {
    x = torch::relu(fc1(x));
    x += fc2(x);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place '+=' on 'x', which 'fc2' saved for backward (its input)
    return x;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  Tensor w;
};

// ===== positives ============================================================

// norm saves its input and its result (TT_SAVES SelfResult): dividing the
// embedding by its own norm in place breaks backward.
void unitLookups(torch::nn::Embedding &ent, const Tensor &ids) {
  auto h = ent(ids);
  h.div_(h.norm(2, -1, true));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'div_' on 'h', which 'norm' saved for backward (its input): backward() raises
  h.sum().backward();
}

void reluThenBias(Res &m, const Tensor &x, const Tensor &b, const Tensor &y) {
  auto h = torch::relu(m.fc1(x));
  h.add_(b);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on 'h', which 'relu' saved for backward (its result): backward() raises "one of the variables needed for gradient computation has been modified by an inplace operation"
  // CHECK-FIXES: {{^}}  h = h.add(b);{{$}}
  auto loss = torch::mse_loss(m.fc2(h), y);
  loss.backward();
}

void sigmoidScaled(Res &m, const Tensor &x) {
  auto y = torch::sigmoid(m.fc1(x));
  y.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'y', which 'sigmoid' saved
  y.sum().backward();
}

void tanhClamped(Res &m, const Tensor &x) {
  auto t = torch::tanh(m.fc1(x));
  t.clamp_(-0.5, 0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'clamp_' on 't', which 'tanh' saved
  t.mean().backward();
}

void expNormalised(Res &m, const Tensor &x) {
  auto e = torch::exp(m.fc1(x));
  e.div_(e.sum());
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'div_' on 'e', which 'exp' saved
  e.sum().backward();
}

void softmaxFloor(Res &m, const Tensor &x) {
  auto p = torch::softmax(m.fc1(x), 1);
  p.clamp_(1e-6, 1.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'clamp_' on 'p', which 'softmax' saved
  torch::log(p).sum().backward();
}

void maskedLogProbs(Res &m, const Tensor &x, const Tensor &mask) {
  auto lp = torch::log_softmax(m.fc1(x), 1);
  lp.mul_(mask);
  // CHECK-MESSAGES: :[[@LINE-1]]:6: error: in-place 'mul_' on 'lp', which 'log_softmax' saved
  (-lp.sum()).backward();
}

void logInput(Res &m, const Tensor &x) {
  auto a = torch::sigmoid(m.fc1(x)) + 1;
  auto l = torch::log(a);
  a.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on 'a', which 'log' saved for backward (its input)
  l.sum().backward();
}

void gatedByParameter(Res &m, const Tensor &x) {
  auto h = m.fc1(x);
  auto g = h * m.w;
  h.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'h', which 'operator*' saved for backward (its input)
  g.sum().backward();
}

void lossInput(Res &m, const Tensor &x, const Tensor &y) {
  auto pred = m.fc1(x);
  auto loss = torch::mse_loss(pred, y);
  pred.clamp_(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place 'clamp_' on 'pred', which 'mse_loss' saved for backward (its input)
  loss.backward();
}

void rowOfSaved(Res &m, const Tensor &x) {
  auto h = torch::relu(m.fc1(x));
  h[0].zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place 'zero_' on 'h', which 'relu' saved
  h.sum().backward();
}

void sqrtEps(Res &m, const Tensor &x) {
  auto s = torch::sqrt(m.fc1(x).abs());
  s.add_(1e-6);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on 's', which 'sqrt' saved
  s.sum().backward();
}

void methodSigmoid(Res &m, const Tensor &x) {
  auto h = m.fc1(x).sigmoid();
  h.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'h', which 'sigmoid' saved
  h.sum().backward();
}

void matmulInput(Res &m, const Tensor &x) {
  auto a = m.fc1(x);
  auto out = torch::matmul(a, m.fc2->weight);
  a.relu_();
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'relu_' on 'a', which 'matmul' saved
  out.sum().backward();
}

void trainLoop(Res &m, const Tensor &x, torch::optim::SGD &opt) {
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    auto h = torch::relu(m.fc1(x));
    h.add_(1);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'add_' on 'h', which 'relu' saved
    auto loss = h.sum();
    loss.backward();
    opt.step();
  }
}

void geluInput(Res &m, const Tensor &x) {
  auto a = m.fc1(x);
  auto g = torch::gelu(a);
  a.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'a', which 'gelu' saved
  g.sum().backward();
}

Tensor gradOfSaved(Res &m, const Tensor &x) {
  auto y = torch::sigmoid(m.fc1(x));
  y.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'add_' on 'y', which 'sigmoid' saved
  return torch::autograd::grad({y.sum()}, {m.w}, {}, true)[0];
}

// ===== negatives (the idioms) ================================================

void linearOutput(Res &m, Tensor x) {
  x = m.fc1(x);
  x.add_(1);
  x.sum().backward();
}

void logSoftmaxInput(Res &m, const Tensor &x) {
  auto q = m.fc1(x);
  auto ls = torch::log_softmax(q, 1);
  q.add_(1);
  ls.sum().backward();
}

void writeBeforeRelu(Res &m, const Tensor &x) {
  auto h = m.fc1(x);
  h.add_(1);
  h = torch::relu(h);
  h.sum().backward();
}

void writeAfterBackward(Res &m, const Tensor &x) {
  auto h = torch::relu(m.fc1(x));
  h.sum().backward();
  h.add_(1);
}

void freshGraphEachStep(Res &m, const Tensor &x) {
  for (int i = 0; i < 3; ++i) {
    auto h = torch::relu(m.fc1(x));
    h.sum().backward();
    h.add_(1);
  }
}

void preprocess(const Tensor &batch) {
  auto y = torch::sigmoid(batch);
  y.mul_(2);
}

void inference(Res &m, const Tensor &x) {
  torch::NoGradGuard no_grad;
  auto y = torch::sigmoid(m.fc1(x));
  y.mul_(2);
}

void dropoutOutput(Res &m, const Tensor &x) {
  auto d = torch::dropout(m.fc1(x), 0.5, true);
  d.mul_(2);
  d.sum().backward();
}

void sumsAndMeans(Res &m, const Tensor &x) {
  auto s = m.fc1(x) + m.fc2(x);
  s.mul_(2);
  auto mean = s.mean();
  mean.mul_(2);
  mean.backward();
}

void scalarFactor(Res &m, const Tensor &x) {
  auto h = m.fc1(x);
  auto y = h * 2;
  h.add_(1);
  auto z = h * torch::ones({8});
  h.add_(1);
  (y + z).sum().backward();
}

void cloneFirst(Res &m, const Tensor &x) {
  auto h = torch::relu(m.fc1(x));
  auto h2 = h.clone();
  h2.add_(1);
  h2.sum().backward();
}

void outOfPlace(Res &m, const Tensor &x) {
  auto h = torch::relu(m.fc1(x));
  h = h + 1;
  h.add_(1);
  h.sum().backward();
}

void crossEntropyLogits(Res &m, const Tensor &x, const Tensor &t) {
  auto logits = m.fc1(x);
  auto loss = torch::nn::functional::cross_entropy(logits, t);
  logits.add_(1);
  loss.backward();
}

void catResult(Res &m, const Tensor &x) {
  auto c = torch::cat({torch::relu(m.fc1(x)), m.fc2(x)});
  c.add_(1);
  c.sum().backward();
}

void unknownInput(const Tensor &x) {
  auto h = torch::relu(x);
  h.add_(1);
  h.sum().backward();
}

void leafWrite(Res &m, const Tensor &x) {
  auto y = torch::sigmoid(m.w * 2);
  m.w.data().add_(1);
  y.sum().backward();
}

void noBackwardHere(Res &m, const Tensor &x) {
  auto y = torch::sigmoid(m.fc1(x));
  y.mul_(2);
}

// What a function of the TU returns: the result a saving op made in its body.
struct Squash : torch::nn::Module {
  Squash() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  torch::Tensor forward(const torch::Tensor &x) { return torch::tanh(fc(x)); }
  torch::Tensor gated(const torch::Tensor &x) {
    auto g = torch::sigmoid(fc(x));
    return g;
  }
  torch::Tensor shifted(const torch::Tensor &x) { return fc(x) + 1; }
  torch::Tensor frozen(const torch::Tensor &x) { return torch::tanh(fc(x)).detach(); }
  torch::Tensor copied(const torch::Tensor &x) { return torch::tanh(fc(x)).clone(); }
  torch::nn::Linear fc{nullptr};
};

void scaleReturned(Squash &m, const torch::Tensor &x) {
  auto t = m.forward(x);
  t.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 't', which 'tanh' saved for backward (its result): backward() raises
  t.sum().backward();
}

void scaleReturnedLocal(Squash &m, const torch::Tensor &x) {
  auto g = m.gated(x);
  g += 1;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place '+=' on 'g', which 'sigmoid' saved for backward (its result)
  g.sum().backward();
}

void returnedNegatives(Squash &m, const torch::Tensor &x) {
  auto a = m.shifted(x);
  a.mul_(2); // add saves nothing
  auto b = m.frozen(x);
  b.mul_(2); // detached in the callee
  auto c = m.copied(x);
  c.mul_(2); // a clone of what tanh saved
  auto d = m.forward(x).detach();
  d.mul_(2); // detached here
  {
    torch::NoGradGuard no_grad;
    auto e = m.forward(x);
    e.mul_(2); // grad mode off around the call
  }
  (a + b + c + d).sum().backward();
}

// A custom autograd Function whose forward saves the tensor it returns: its
// apply() result is saved like a table op's (autograd checks its version).
struct ClippedLog : public torch::autograd::Function<ClippedLog> {
  static Tensor forward(torch::autograd::AutogradContext *ctx, Tensor x) {
    auto out = torch::log(x.clamp_min(1e-6));
    ctx->save_for_backward({x, out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list g) {
    return {g[0] / ctx->get_saved_variables()[0]};
  }
};
// Saves its input only: writing the result is fine.
struct Doubled : public torch::autograd::Function<Doubled> {
  static Tensor forward(torch::autograd::AutogradContext *ctx, Tensor x) {
    ctx->save_for_backward({x});
    return x * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list g) {
    return {g[0] * 2};
  }
};

void customFunctions(torch::nn::Linear &fc, const Tensor &x) {
  auto logs = ClippedLog::apply(torch::sigmoid(fc->forward(x)));
  logs.sub_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place 'sub_' on 'logs', which 'ClippedLog::apply' saved for backward (its result)
  // CHECK-MESSAGES: :[[@LINE-3]]:15: note: 'ClippedLog::apply' saves its result for backward here
  logs.sum().backward();
  // CHECK-MESSAGES: :[[@LINE-1]]:3: note: backward() runs here
  auto twice = Doubled::apply(fc->forward(x));
  twice.sub_(1);
  twice.sum().backward();
}

// The graph leaves through a struct of losses as through a tensor, and a
// struct parameter every call gives a module's result requires grad.
struct HeadLosses {
  torch::Tensor cls, mask;
};
HeadLosses headLosses(const torch::Tensor &logits) {
  auto probs = torch::sigmoid(logits);
  probs.clamp_(1e-6, 1.0 - 1e-6);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'clamp_' on 'probs', which 'sigmoid' saved for backward (its result)
  return {probs.sum(), logits.sum()};
}
struct DecoderOut {
  torch::Tensor mel, gates;
};
struct DecoderImpl : torch::nn::Module {
  DecoderImpl() : proj(register_module("proj", torch::nn::Linear(4, 4))) {}
  DecoderOut forward(const torch::Tensor &x) { return {proj(x), proj(x).sum(1)}; }
  torch::nn::Linear proj;
};
TORCH_MODULE(Decoder);
torch::Tensor stopLoss(const DecoderOut &out, const torch::Tensor &target) {
  auto stop = torch::sigmoid(out.gates);
  stop.clamp_(1e-6, 1.0 - 1e-6);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'clamp_' on 'stop', which 'sigmoid' saved for backward (its result)
  return torch::binary_cross_entropy(stop, target);
}
void trainDecoder(Decoder &dec, torch::nn::Linear &head, const torch::Tensor &x) {
  auto out = dec->forward(x);
  auto l = headLosses(head(x));
  (stopLoss(out, torch::rand({4})) + l.cls + l.mask).backward();
}
// Under no-grad at its only call, the struct carries no graph.
torch::Tensor evalStop(const DecoderOut &out) {
  auto stop = torch::sigmoid(out.gates);
  stop.clamp_(1e-6, 1.0 - 1e-6);
  return stop;
}
torch::Tensor evaluateDecoder(Decoder &dec, const torch::Tensor &x) {
  torch::NoGradGuard no_grad;
  return evalStop(dec->forward(x));
}

// A method of the module that reads its own parameter (`rel`) computes a
// result that requires grad, as a layer's does; one returning the parameter
// detached does not.
struct RelScorerImpl : torch::nn::Module {
  RelScorerImpl() { rel = register_parameter("rel", torch::randn({4, 8})); }
  torch::Tensor score(const torch::Tensor &emb, const torch::Tensor &t) {
    return (emb.index_select(0, t) * rel.index_select(0, t)).sum(-1);
  }
  torch::Tensor frozenRel() { return rel.detach(); }
  torch::Tensor rel;
};
TORCH_MODULE(RelScorer);
void trainScorer(RelScorer &model, const torch::Tensor &emb, const torch::Tensor &pos) {
  auto probs = torch::sigmoid(model->score(emb, pos));
  probs.clamp_(1e-6, 1.0 - 1e-6);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: error: in-place 'clamp_' on 'probs', which 'sigmoid' saved for backward (its result)
  auto gate = torch::sigmoid(model->frozenRel());
  gate.clamp_(0.1, 0.9); // no graph: the parameter detached
  (probs.log().mean() + gate.mean()).backward();
}

// LibTorch's mean over a dim saves its input (MeanBackward1 in 1.13); the
// mean of all elements does not.
Tensor removeDc(torch::nn::Linear &proj, const Tensor &x) {
  auto w = proj(x);
  w.sub_(w.mean(-1, true));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sub_' on 'w', which 'mean' saved for backward (its input)
  auto v = proj(x);
  v.sub_(v.mean());
  return w.pow(2).sum() + v.pow(2).sum();
}

// `std::tie(flow, mask) = block->forward(x)` binds a module's results as a
// structured binding does; an undefined handle (`torch::Tensor mask;`) joins
// as nothing, so the loop that refines it keeps its grad.
struct FlowBlockImpl : torch::nn::Module {
  FlowBlockImpl() { conv = register_module("conv", torch::nn::Conv2d(4, 5, 3)); }
  std::pair<Tensor, Tensor> forward(const Tensor &x) {
    auto y = conv(x);
    return {y.narrow(1, 0, 4), y.narrow(1, 4, 1)};
  }
  torch::nn::Conv2d conv{nullptr};
};
TORCH_MODULE(FlowBlock);
Tensor refineMask(std::vector<FlowBlock> &blocks, const Tensor &x) {
  Tensor flow, mask;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!flow.defined()) {
      std::tie(flow, mask) = blocks[i]->forward(x);
    } else {
      auto res = blocks[i]->forward(x + flow);
      flow = flow + res.first;
      mask = mask + res.second;
    }
  }
  auto m = torch::sigmoid(mask);
  m.clamp_(0.01, 0.99);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'clamp_' on 'm', which 'sigmoid' saved for backward (its result)
  return m * flow;
}
// A tensor library function given a list of tensors (`einsum`) computes from
// them: its result requires grad when one of them does.
Tensor bandScores(torch::nn::Linear &key, const Tensor &x, const Tensor &pad) {
  auto k = key(x);
  auto probs = torch::softmax(torch::einsum("btd,bsd->bts", {k, k}), -1);
  probs.masked_fill_(pad, 0.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'masked_fill_' on 'probs', which 'softmax' saved for backward (its result)
  auto fixed = torch::softmax(torch::einsum("btd,bsd->bts", {x, x}), -1);
  fixed.masked_fill_(pad, 0.0); // nothing requires grad
  return probs + fixed;
}
// A functional op given `inplace(true)` writes its first argument.
namespace F = torch::nn::functional;
Tensor attendDropped(torch::nn::Linear &q, const Tensor &x, double p, bool train) {
  auto attn = torch::softmax(torch::matmul(q(x), x.transpose(-2, -1)), -1);
  if (train)
    F::dropout(attn, F::DropoutFuncOptions().p(p).training(true).inplace(true));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'dropout' on 'attn', which 'softmax' saved for backward (its result)
  auto gate = torch::sigmoid(q(x));
  F::relu(gate, F::ReLUFuncOptions(true));
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: in-place 'relu' on 'gate', which 'sigmoid' saved for backward (its result)
  auto kept = torch::softmax(q(x), -1);
  auto dropped = F::dropout(kept, F::DropoutFuncOptions().p(p).inplace(false)); // a new tensor
  auto h = q(x);
  F::relu(h, F::ReLUFuncOptions(true)); // Linear saves its input, not its output
  auto plain = torch::tanh(q(x));
  auto out = F::relu(plain, F::ReLUFuncOptions(false)) + F::dropout(plain, F::DropoutFuncOptions());
  return attn + gate + dropped + h + out;
}

// Note [vector elements]: `torch::cat(parts)` of a local vector requires grad
// when a tensor pushed into it does; per-layer outputs in a vector field of a
// module's result follow the result.
Tensor clampedBce(const Tensor &logits, const Tensor &targets) {
  auto p = torch::sigmoid(logits);
  p.clamp_(1e-6, 1.0 - 1e-6);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'clamp_' on 'p', which 'sigmoid' saved for backward (its result)
  return -(targets * torch::log(p)).mean();
}
Tensor setLoss(const Tensor &pred, const Tensor &tgt, int64_t n) {
  std::vector<Tensor> parts, fixed;
  for (int64_t b = 0; b < n; ++b) {
    parts.push_back(pred[b].narrow(0, 0, 2));
    fixed.push_back(pred[b].detach());
  }
  auto q = torch::sigmoid(torch::cat(fixed));
  q.clamp_(0.0, 1.0); // nothing pushed into fixed requires grad
  return clampedBce(torch::cat(parts).flatten(1), tgt.flatten(1)) + q.sum();
}
struct LayersOut {
  Tensor logits;
  std::vector<Tensor> aux;
};
struct LayersImpl : torch::nn::Module {
  LayersOut forward(const Tensor &x) { return {fc(x), {fc(x), fc(x)}}; }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Layers);
void layersStep(Layers &net, torch::optim::Optimizer &opt, const Tensor &x, const Tensor &t) {
  auto out = net->forward(x);
  auto loss = setLoss(out.logits, t, 2);
  for (size_t i = 0; i < out.aux.size(); ++i)
    loss = loss + setLoss(out.aux[i], t, 2);
  opt.zero_grad();
  loss.backward();
  opt.step();
}

// A holder's call `decoder(x)` runs the forward of the module it holds: its
// result is what that forward returns, saved by tanh.
struct SdfHeadImpl : torch::nn::Module {
  torch::nn::Linear head{nullptr};
  SdfHeadImpl() { head = register_module("head", torch::nn::Linear(4, 1)); }
  torch::Tensor forward(const torch::Tensor &h) { return torch::tanh(head(h)); }
};
TORCH_MODULE(SdfHead);
torch::Tensor sdfStep(SdfHead &decoder, const torch::Tensor &x, const torch::Tensor &y) {
  auto pred = decoder(x);
  pred.clamp_(-0.1, 0.1);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: in-place 'clamp_' on 'pred', which 'tanh' saved for backward (its result)
  auto loss = torch::nn::functional::l1_loss(pred, y);
  loss.backward();
  return loss;
}

// An in-place op whose out-of-place form saves its result saves what it
// wrote (exp_, relu_, sigmoid_, tanh_, sqrt_); log_ saves nothing reachable.
void rbf(torch::nn::Linear &fc, const Tensor &x, double scale) {
  auto k = fc(x).pow(2).mul(-0.5).exp_();
  k.mul_(scale);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: error: in-place 'mul_' on 'k', which 'exp_' saved for backward (its result)
  k.sum().backward();
}
void droppedMessages(torch::nn::Linear &fc, const Tensor &x) {
  auto msg = fc(x);
  msg.relu_();
  msg.mul_(torch::rand({1}) > 0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: error: in-place 'mul_' on 'msg', which 'relu_' saved for backward (its result)
  auto logs = fc(x).abs();
  logs.log_();
  logs.mul_(2.0);
  (msg.sum() + logs.sum()).backward();
}

// What a torch::nn module saves is its ops.def row (TT_MODULE): GroupNorm
// its input, Sigmoid its output, Dropout neither (only its mask).
struct NormBlock : torch::nn::Module {
  NormBlock() {
    norm = register_module("norm", torch::nn::GroupNorm(2, 8));
    gate = register_module("gate", torch::nn::Sigmoid());
    drop = register_module("drop", torch::nn::Dropout(0.1));
    conv = register_module("conv", torch::nn::Conv2d(8, 8, 1));
  }
  Tensor forward(Tensor x) {
    auto h = conv(norm(x));
    return x.add_(h);
    // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: in-place 'add_' on 'x', which 'norm' saved for backward (its input)
  }
  Tensor gated(Tensor x) {
    auto g = gate(conv(x));
    g.mul_(2.0);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'mul_' on 'g', which 'gate' saved for backward (its result)
    return g;
  }
  Tensor dropped(Tensor x) {
    auto d = drop(conv(x));
    d.mul_(2.0);
    return d;
  }
  torch::nn::GroupNorm norm{nullptr};
  torch::nn::Sigmoid gate{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::Conv2d conv{nullptr};
};
