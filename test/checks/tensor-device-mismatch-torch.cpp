// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-device-mismatch %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-device-mismatch %t.plugin -- --quiet --fix-errors -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;

struct Net : torch::nn::Module {
  Net() { fc = register_module("fc", torch::nn::Linear(10, 2)); }
  Tensor forward(Tensor x) { return fc->forward(x); }
  torch::nn::Linear fc{nullptr};
};

// ===== positives ============================================================

void movedModuleCpuInput() {
  torch::nn::Linear model(10, 2);
  model->to(torch::kCUDA);
  Tensor x = torch::randn({8, 10});
  Tensor y = model->forward(x);
  // CHECK-MESSAGES: :[[@LINE-1]]:21: error: 'forward' combines the CPU tensor 'x' with the parameters of 'model', moved to CUDA: throws at run time ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'x.to(torch::kCUDA)' [tensor-device-mismatch]
  // CHECK-FIXES: {{^}}  Tensor y = model->forward(x.to(torch::kCUDA));{{$}}
}

void customModuleCuda() {
  auto net = std::make_shared<Net>();
  net->to(torch::Device(torch::kCUDA, 0));
  Tensor batch = torch::rand({4, 10});
  Tensor out = net->forward(batch);
  // CHECK-MESSAGES: :[[@LINE-1]]:21: error: 'forward' combines the CPU tensor 'batch' with the parameters of 'net', moved to CUDA
  // CHECK-FIXES: {{^}}  Tensor out = net->forward(batch.to(torch::Device(torch::kCUDA, 0)));{{$}}
}

void lossAgainstCpuTarget() {
  Tensor pred = torch::randn({16, 4}).cuda();
  Tensor target = torch::zeros({16, 4});
  Tensor loss = torch::mse_loss(pred, target);
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: 'mse_loss' combines the CPU tensor 'target' with 'pred'
  // CHECK-FIXES: {{^}}  Tensor loss = torch::mse_loss(pred, target.to(pred.device()));{{$}}
}

void maskOnHost() {
  Tensor scores = torch::randn({8, 8}, torch::device(torch::kCUDA));
  Tensor bias = torch::ones({8, 8});
  Tensor s = scores + bias;
  // CHECK-MESSAGES: :[[@LINE-1]]:21: error: '+' combines the CPU tensor 'bias' with 'scores'
  // CHECK-FIXES: {{^}}  Tensor s = scores + bias.to(scores.device());{{$}}
}

void matmulHost() {
  Tensor w = torch::randn({10, 10}).to(torch::kCUDA);
  Tensor x = torch::randn({10, 10});
  Tensor y = torch::matmul(x, w);
  // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'matmul' combines the CPU tensor 'x' with 'w'
  // CHECK-FIXES: {{^}}  Tensor y = torch::matmul(x.to(w.device()), w);{{$}}
}

// A forward that returns a struct: its tensor fields are on the input's device.
struct Scores {
  Tensor logits, aux;
};
struct Scorer : torch::nn::Module {
  Scorer() { fc = register_module("fc", torch::nn::Linear(10, 4)); }
  Scores forward(const Tensor &x) {
    auto h = fc->forward(x);
    return {h, h.pow(2).mean()};
  }
  torch::nn::Linear fc{nullptr};
};

void structFieldOnCuda(Scorer &model, const Tensor &batch, const std::vector<int64_t> &ids) {
  auto x = batch.to(torch::kCUDA);
  auto labels = torch::tensor(ids, torch::kLong);
  auto out = model.forward(x);
  auto ce = torch::nll_loss(out.logits, labels);
  // CHECK-MESSAGES: :[[@LINE-1]]:13: error: 'nll_loss' combines the CPU tensor 'labels' with 'out.logits'
  auto targets = torch::tensor(ids, torch::kLong);
  auto ce2 = torch::nll_loss(model.forward(x).logits, targets);
  // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'nll_loss' combines the CPU tensor 'targets' with 'model.forward(x).logits'
}

// One report per CPU local: its later uses are the same mistake, mended
// where it is made.
Tensor noisedOnce(const Tensor &audio) {
  auto x = audio.to(torch::kCUDA);
  auto noise = torch::randn({4, 16});
  auto noisy = x + noise;
  // CHECK-MESSAGES: :[[@LINE-1]]:18: error: '+' combines the CPU tensor 'noise' with 'x'
  return torch::l1_loss(noisy, noise);
}

// A forward that returns a tuple: structured bindings of it are on the input's device.
struct Policy : torch::nn::Module {
  Policy() { fc = register_module("fc", torch::nn::Linear(10, 4)); }
  std::tuple<Tensor, Tensor> forward(const Tensor &obs) {
    auto mu = torch::tanh(fc->forward(obs));
    return {mu, mu.sum(1)};
  }
  torch::nn::Linear fc{nullptr};
};

void boundActionOnCuda(Policy &actor, const Tensor &obs, const std::vector<float> &high) {
  auto act_high = torch::tensor(high);
  auto [a, logp] = actor.forward(obs.to(torch::kCUDA));
  auto scaled = a * act_high;
  // CHECK-MESSAGES: :[[@LINE-1]]:19: error: '*' combines the CPU tensor 'act_high' with 'a'
}

// ===== negatives ============================================================

void boundActionOnHost(Policy &actor, const Tensor &obs, const std::vector<float> &high) {
  auto act_high = torch::tensor(high);
  auto [a, logp] = actor.forward(obs.to(torch::kCPU));
  auto scaled = a * act_high;
  auto [b, logq] = actor.forward(obs);
  auto scaled2 = b * act_high; // obs's device is not known
}

void structFieldElsewhere(Scorer &model, const Tensor &batch, const std::vector<int64_t> &ids) {
  auto labels = torch::tensor(ids, torch::kLong);
  auto out = model.forward(batch.to(torch::kCUDA));
  out = model.forward(batch); // rebound: the field's device is not the first call's
  auto ce = torch::nll_loss(out.logits, labels);
  auto cpu_out = model.forward(torch::randn({4, 10}));
  auto ce2 = torch::nll_loss(cpu_out.logits, labels);
}

// `is_available() ? kCUDA : kCPU` is CUDA on every machine with a GPU.
void deviceIfAvailable() {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  torch::nn::Linear model(10, 2);
  model->to(device);
  Tensor x = torch::randn({8, 10});
  Tensor y = model->forward(x);
  // CHECK-MESSAGES: :[[@LINE-1]]:21: error: 'forward' combines the CPU tensor 'x' with the parameters of 'model', moved to CUDA: throws at run time on a machine with CUDA (its device is 'is_available() ? kCUDA : kCPU') ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'x.to(device)' [tensor-device-mismatch]
  // CHECK-FIXES: {{^}}  Tensor y = model->forward(x.to(device));{{$}}
}

// A helper's device parameter: every caller passes CUDA-if-available.
Tensor offsetsOnDevice(const Tensor &idx, torch::Device device) {
  Tensor dev_idx = idx.to(device);
  Tensor base = torch::arange(dev_idx.size(0)).view({-1, 1});
  return dev_idx + base;
  // CHECK-MESSAGES: :[[@LINE-1]]:18: error: '+' combines the CPU tensor 'base' with 'dev_idx': throws at run time on a machine with CUDA
  // CHECK-FIXES: {{^}}  return dev_idx + base.to(dev_idx.device());{{$}}
}

void callsOffsets() {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  offsetsOnDevice(torch::zeros({4, 3}, torch::kLong), device);
}

// An op that throws is reported once: its result is not judged again.
void mismatchReportedOnce() {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Tensor scores = torch::randn({4, 8}, torch::device(device));
  Tensor finished = torch::zeros({4}, torch::kBool);
  Tensor next = scores.argmax(-1);
  next = torch::where(finished, torch::zeros_like(next), next);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: error: 'where' combines the CPU tensor 'finished' with 'next': throws at run time on a machine with CUDA
  Tensor picked = scores.gather(-1, next.unsqueeze(-1));
}

// A device the caller chooses, no call in view (Note [caller's device]): the
// CPU operand is reported with that condition; the module call is not (its
// move names no device the code shows).
void runtimeDevice(torch::Device device) {
  torch::nn::Linear model(10, 2);
  model->to(device);
  Tensor x = torch::randn({8, 10});
  Tensor y = model->forward(x);
  Tensor z = torch::randn({8, 2}).to(device) + y;
  // CHECK-MESSAGES: :[[@LINE-1]]:46: error: '+' combines the CPU tensor 'y' with 'torch::randn({8, 2}).to(device)': throws at run time when its caller passes a CUDA device (no call in view chooses one)
  Tensor w = torch::randn({8, 2}).to(device) + torch::ones({8, 2});
  // CHECK-MESSAGES: :[[@LINE-1]]:46: error: '+' combines the CPU tensor 'torch::ones({8, 2})' with 'torch::randn({8, 2}).to(device)': throws at run time when its caller passes a CUDA device
}

void inputMovedToo() {
  torch::nn::Linear model(10, 2);
  model->to(torch::kCUDA);
  Tensor x = torch::randn({8, 10}).to(torch::kCUDA);
  Tensor y = model->forward(x);
}

void moduleMovedInBranch(bool gpu) {
  torch::nn::Linear model(10, 2);
  if (gpu)
    model->to(torch::kCUDA);
  Tensor y = model->forward(torch::randn({8, 10}));
}

void parameterInput(torch::nn::Linear &model, const Tensor &x) {
  model->to(torch::kCUDA);
  Tensor y = model->forward(x); // x's device is not shown
}

void cpuScalarOk() {
  Tensor a = torch::randn({4}).cuda();
  Tensor c = a * torch::tensor(0.5);
  Tensor d = a / a.cpu().max();
}

// `torch::cat` of a braced list: the history lives on the GPU, the new step
// is made on the host. The mismatched result does not flow around the loop
// (the op throws), so the history stays on the GPU at the loop head.
void catHistory(int64_t steps) {
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto timesteps = torch::zeros({1}, opts.dtype(torch::kLong));
  auto actions = torch::zeros({0, 4}, opts);
  for (int64_t t = 0; t < steps; ++t) {
    actions = torch::cat({actions, torch::zeros({1, 4}, opts)}, 0);
    timesteps = torch::cat({timesteps, torch::full({1}, t + 1, torch::kLong)});
    // CHECK-MESSAGES: :[[@LINE-1]]:17: error: 'cat' combines the CPU tensor 'torch::full({1}, t + 1, torch::kLong)' with 'timesteps': throws at run time
    // CHECK-FIXES: {{^}}    timesteps = torch::cat({timesteps, torch::full({1}, t + 1, torch::kLong).to(timesteps.device())});{{$}}
  }
  auto host = torch::stack({torch::ones({2}), torch::zeros({2})});
  auto both = torch::cat({actions, actions.cpu().to(torch::kCUDA)});
}

// A CPU scalar tensor's product goes to the other operand's device: the
// module gets a CUDA input.
void cpuScalarThenModule(const Tensor &batch) {
  torch::nn::Linear model(10, 2);
  model->to(torch::kCUDA);
  Tensor x = batch.to(torch::kCUDA);
  Tensor y = model->forward(torch::tensor(2.0) * x);
}

// One report per mismatch: the mixed product is not judged again where the
// module reads it (the first op throws).
void mixedOnce(const Tensor &batch) {
  torch::nn::Linear model(10, 2);
  model->to(torch::kCUDA);
  Tensor x = batch.to(torch::kCUDA);
  Tensor t = torch::rand({x.size(0), 1});
  Tensor xt = (1.0 - t) * x;
  // CHECK-MESSAGES: :[[@LINE-1]]:25: error: '*' combines the CPU tensor '(1.0 - t)' with 'x': throws at run time
  // CHECK-FIXES: {{^}}  Tensor xt = (1.0 - t).to(x.device()) * x;{{$}}
  Tensor y = model->forward(xt);
}

void copyIntoHost() {
  Tensor gpu = torch::randn({4}).cuda();
  Tensor host = torch::empty({4});
  host.copy_(gpu);
}

// A module's output is on its input's device; randint makes CPU int64 tensors.
double moduleOutputOnInputDevice(torch::nn::Linear &clf, int64_t n) {
  clf->to(torch::kCUDA);
  auto x = torch::randn({n, 16}).cuda();
  auto pred = clf(x).argmax(1);
  auto labels = torch::randint(0, 4, {n});
  return pred.eq(labels).sum().item<double>();
  // CHECK-MESSAGES: :[[@LINE-1]]:15: error: 'eq' combines the CPU tensor 'labels' with 'pred'
}

struct Head : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor &x) { return x.relu(); }
};
torch::Tensor userModuleOutput(Head &head, int64_t n) {
  auto h = head.forward(torch::ones({n, 4}).to(torch::kCUDA));
  return h + torch::randperm(n);
  // CHECK-MESSAGES: :[[@LINE-1]]:12: error: '+' combines the CPU tensor 'torch::randperm(n)' with 'h'
}

void moduleOutputNegatives(torch::nn::Linear &clf, Head &head, const torch::Tensor &in, int64_t n) {
  auto labels = torch::randint(0, 4, {n});
  auto x = torch::randn({n, 16}).cuda();
  auto onHost = clf(x).argmax(1).cpu();
  onHost.eq(labels);                             // brought back to the host
  clf(torch::randn({n, 16})).argmax(1).eq(labels); // both on the CPU
  clf(in).argmax(1).eq(labels);                  // the input's device is not known
  head.forward(in).eq(labels.cuda());            // nor here
  clf(x).argmax(1).eq(labels.to(x.device()));    // moved to the input's device
}

// A factory given only a dtype makes a CPU tensor (the default device).
void hostCounts(const torch::Tensor &labels) {
  auto hist = torch::zeros({10}, torch::kLong);
  hist += labels.cuda();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: '+=' combines the CPU tensor 'hist' with 'labels.cuda()'
}

// A torch::Device variable every value of which names CUDA is CUDA; one the
// code may point elsewhere stays a run-time device.
torch::Tensor priorAdjusted(torch::nn::Linear model, const torch::Tensor &staging,
                            const std::vector<float> &freq) {
  torch::Device device(torch::kCUDA);
  auto logPrior = torch::log(torch::tensor(freq)).unsqueeze(0); // [1, C] on the CPU
  auto logits = model->forward(staging.to(device, /*non_blocking=*/true));
  return logits - logPrior;
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: '-' combines the CPU tensor 'logPrior' with 'logits'
}
torch::Tensor chosenDevice(const torch::Tensor &x, const std::vector<float> &freq, bool gpu) {
  torch::Device device(torch::kCUDA);
  if (!gpu)
    device = torch::Device(torch::kCPU);
  return x.to(device) - torch::tensor(freq); // may be the CPU
}
// torch::tensor of a scalar is 0-dim: a CPU scalar is allowed beside CUDA.
torch::Tensor scaled(const torch::Tensor &x) { return x.cuda() * torch::tensor(0.5); }

// Masks combine with `|`, `&`, `^` like any op.
torch::Tensor finishedRows(const torch::Tensor &tokensCpu, int64_t eos) {
  auto tokens = tokensCpu.to(torch::kCUDA);
  auto finished = torch::zeros({tokens.size(0)}, torch::kBool);
  return finished | (tokens.argmax(-1) == eos);
  // CHECK-MESSAGES: :[[@LINE-1]]:19: error: '|' combines the CPU tensor 'finished' with '(tokens.argmax(-1) == eos)'
}

// A function of the TU returns what its body makes of its argument: here,
// on the argument's device.
torch::Tensor asFloat(const torch::Tensor &logits) { return logits.to(torch::kFloat); }
torch::Tensor logProbs(const torch::Tensor &logitsCpu) {
  auto logits = logitsCpu.cuda();
  auto bias = torch::zeros({logits.size(1)});
  return asFloat(logits) + bias;
  // CHECK-MESSAGES: :[[@LINE-1]]:26: error: '+' combines the CPU tensor 'bias' with 'asFloat(logits)'
}
torch::Tensor mixedArgs(const torch::Tensor &a, const torch::Tensor &b) {
  return asFloat(a.cuda()) + asFloat(b); // b's device is not known
}

// A device member is what every value its class gives it names: kCUDA in
// the one constructor here. An element of a list of tensors is on the list's
// device (`chunk` keeps its input's).
class GuidedSampler {
public:
  GuidedSampler() : device_(torch::kCUDA) {}
  torch::Tensor guide(torch::nn::Linear &net, const std::vector<double> &guidance) {
    auto x = torch::randn({4, 8}, torch::TensorOptions().device(device_));
    auto scales = torch::tensor(guidance); // [B] on the CPU
    auto halves = net->forward(x).chunk(2);
    auto cond = halves[0], uncond = halves[1];
    return uncond + scales.view({-1, 1}) * (cond - uncond);
    // CHECK-MESSAGES: :[[@LINE-1]]:42: error: '*' combines the CPU tensor 'scales.view({-1, 1})' with '(cond - uncond)'
  }
  torch::Tensor scalarGuide(torch::nn::Linear &net, double g) {
    auto out = net->forward(torch::randn({4, 8}, torch::TensorOptions().device(device_)));
    return out * torch::tensor(g); // a 0-dim CPU tensor: allowed
  }

private:
  torch::Device device_;
};

// The device comes from a caller out of view (Note [caller's device]); see
// below for a class that gives it two.
class ChosenDevice {
public:
  explicit ChosenDevice(torch::Device d) : device_(d) {}
  torch::Tensor shift(torch::nn::Linear &net, int64_t n) {
    return net->forward(torch::randn({4, 8}, device_)) + torch::ones({n});
    // CHECK-MESSAGES: :[[@LINE-1]]:56: error: '+' combines the CPU tensor 'torch::ones({n})' with 'net->forward(torch::randn({4, 8}, device_))': throws at run time when its caller passes a CUDA device (no call in view chooses one)
  }
  torch::Device device_;
};
class SwitchedDevice {
public:
  SwitchedDevice() : device_(torch::kCUDA) {}
  void toHost() { device_ = torch::kCPU; }
  torch::Tensor shift(torch::nn::Linear &net, int64_t n) {
    return net->forward(torch::randn({4, 8}, device_)) + torch::ones({n});
  }
  torch::Device device_;
};
// The constructor's body overrides the default member initialiser: both
// count, so the device is unknown (not the initialiser's kCPU).
class BodySetDevice {
public:
  BodySetDevice() { device_ = torch::Device(torch::kCUDA); }
  torch::Tensor shift(int64_t n) {
    return torch::zeros({n, 4}, device_) + torch::ones({n, 4}, torch::kCUDA);
  }

private:
  torch::Device device_ = torch::kCPU;
};
// A private tensor field of a plain class: every value its class gives it
// (Note [own tensor field]), a value read from the field itself included.
class ParticleCloud {
public:
  ParticleCloud(const torch::Tensor &init, int64_t beams) : device_(torch::kCUDA) {
    particles_ = init.to(device_).unsqueeze(1);
    angles_ = torch::linspace(-1.0, 1.0, beams);
  }
  // A copy keeps what the fields hold: not a value of its own.
  ParticleCloud(const ParticleCloud &o)
      : device_(o.device_), particles_(o.particles_.clone()), angles_(o.angles_) {}
  void resample(const torch::Tensor &idx, const torch::Tensor &m) {
    auto picked = particles_.index_select(1, idx.to(device_));
    particles_ = torch::where(m, picked, particles_);
  }
  torch::Tensor beams() const {
    auto th = particles_.select(2, 2).unsqueeze(-1);
    return th + angles_;
    // CHECK-MESSAGES: :[[@LINE-1]]:15: error: '+' combines the CPU tensor 'angles_' with 'th': throws at run time
    // CHECK-FIXES: {{^}}    return th + angles_.to(th.device());{{$}}
  }

private:
  torch::Device device_;
  torch::Tensor particles_, angles_;
};
// Not known: a reference handed out, a load through one, two devices, a public field.
class ExposedField {
public:
  ExposedField() : w_(torch::zeros({4, 4})) {}
  torch::Tensor &weights() { return w_; }
  torch::Tensor apply(const torch::Tensor &x) { return x.cuda() + w_; }

private:
  torch::Tensor w_;
};
class LoadedField {
public:
  explicit LoadedField(const std::string &p) { torch::load(w_, p); }
  torch::Tensor apply(const torch::Tensor &x) { return x.cuda() + w_; }

private:
  torch::Tensor w_ = torch::zeros({4});
};
class SwitchingField {
public:
  SwitchingField() : w_(torch::zeros({4})) {}
  void toGpu() { w_ = w_.cuda(); }
  torch::Tensor apply(const torch::Tensor &x) { return x.cuda() + w_; }

private:
  torch::Tensor w_;
};
class OpenField {
public:
  torch::Tensor apply(const torch::Tensor &x) { return x.cuda() + w_; }
  torch::Tensor w_ = torch::zeros({4});
};
torch::Tensor collected(torch::nn::Linear &net, const torch::Tensor &x, int64_t n) {
  std::vector<torch::Tensor> parts;
  parts.push_back(net->forward(x.cuda()));
  return parts[0] + torch::ones({n}); // every element pushed is on CUDA
  // CHECK-MESSAGES: :[[@LINE-1]]:19: error: '+' combines the CPU tensor 'torch::ones({n})' with 'parts[0]': throws at run time
}
torch::Tensor collectedMixed(torch::nn::Linear &net, const torch::Tensor &x, int64_t n) {
  std::vector<torch::Tensor> parts;
  parts.push_back(net->forward(x.cuda()));
  parts.push_back(x);
  return parts[0] + torch::ones({n}); // one element on the host: unknown
}

// A tensor field of the struct a function of the TU returns, given CUDA
// tensors: on CUDA (the last of a module's list of outputs, too), unless the
// function moves something to the host.
struct Peaks {
  torch::Tensor coords, conf;
};
Peaks decodePeaks(const torch::Tensor &hm) {
  auto flat = hm.flatten(2);
  auto [conf, idx] = flat.max(-1);
  return {idx.to(torch::kFloat), conf};
}
Peaks hostPeaks(const torch::Tensor &hm) {
  auto [conf, idx] = hm.flatten(2).max(-1);
  return {idx.to(torch::kFloat).cpu(), conf.cpu()};
}
struct StackedImpl : torch::nn::Module {
  std::vector<torch::Tensor> forward(torch::Tensor x) { return {x, x * 2}; }
};
TORCH_MODULE(Stacked);
torch::Tensor toInput(Stacked &net, const torch::Tensor &images) {
  torch::Device device(torch::kCUDA);
  auto scale = torch::tensor({4.0f, 4.0f});
  auto hm = net->forward(images.to(device)).back();
  auto kp = decodePeaks(hm);
  return kp.coords * scale;
  // CHECK-MESSAGES: :[[@LINE-1]]:20: error: '*' combines the CPU tensor 'scale' with 'kp.coords'
}
torch::Tensor toInputHost(Stacked &net, const torch::Tensor &images) {
  auto scale = torch::tensor({4.0f, 4.0f});
  auto kp = hostPeaks(net->forward(images.cuda()).back());
  return kp.coords * scale; // hostPeaks moves its results to the host
}
// A public field of a config struct: the code that fills the config sets it.
struct RunConfig {
  torch::Device device = torch::kCPU;
};
torch::Tensor configured(const RunConfig &cfg, int64_t n) {
  auto h = torch::ones({n}, cfg.device);
  return h + torch::ones({n}).cuda(); // cfg.device may be CUDA
}
// Noise made with another tensor's sizes has its rank: not a CPU scalar.
torch::Tensor dequantise(const torch::Tensor &images) {
  auto x = images.to(torch::kCUDA);
  x = (x + torch::rand(x.sizes())) / 256.0;
  // CHECK-MESSAGES: :[[@LINE-1]]:10: error: '+' combines the CPU tensor 'torch::rand(x.sizes())' with 'x'
  return x + torch::rand({});  // a 0-dim CPU tensor is a scalar: allowed
}

// A method of the user's module that runs its layers takes its input as
// forward does; one that runs none (a statistics update) is not judged.
struct SpeakerNetImpl : torch::nn::Module {
  SpeakerNetImpl() : emb(register_module("emb", torch::nn::Embedding(40, 8))) {}
  torch::Tensor infer(const torch::Tensor &ids) { return emb(ids).mean(1); }
  void track(const torch::Tensor &lengths) { total += lengths.sum().item<int64_t>(); }
  torch::nn::Embedding emb;
  int64_t total = 0;
};
TORCH_MODULE(SpeakerNet);
torch::Tensor synthesize(SpeakerNet &model, const std::vector<int64_t> &ids) {
  model->to(torch::kCUDA);
  auto text = torch::tensor(ids).unsqueeze(0);
  model->track(text);
  return model->infer(text);
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: 'infer' combines the CPU tensor 'text' with the parameters of 'model', moved to CUDA
}

// Options held in a local never assigned again name the device of their
// initializer; assigned again, any device.
torch::Tensor projectPoints(int64_t b) {
  torch::Device device(torch::kCUDA);
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto k = torch::tensor({{1.0, 0.0}, {0.0, 1.0}});
  auto pose = torch::eye(2, opts).unsqueeze(0).expand({b, 2, 2});
  auto p = k.matmul(pose);
  // CHECK-MESSAGES: :[[@LINE-1]]:14: error: 'matmul' combines the CPU tensor 'k' with 'pose'
  auto host = torch::TensorOptions().device(device);
  host = torch::TensorOptions();
  auto q = torch::randn({2, 2}).to(device);
  auto noise = torch::randn({2, 2}, q.options()); // q's options: q's device
  return p + k.matmul(torch::eye(2, host)) + q.add(noise);
}

// ===== a device variable, run-time arange, a helper of the file =============

struct DecoderImpl : torch::nn::Module {
  DecoderImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  Tensor decode(const Tensor &z) { return fc(z); }
  Tensor forward(const Tensor &z) { return fc(z); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Decoder);

// The module is a parameter, moved with a device variable every value of
// which names CUDA.
Tensor sampleOnHost(Decoder &model) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  auto z = torch::randint(4, {3, 4}).to(torch::kFloat);
  return model->decode(z);
  // CHECK-MESSAGES: :[[@LINE-1]]:17: error: 'decode' combines the CPU tensor 'z' with the parameters of 'model', moved to CUDA: throws at run time ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'z.to(device)' [tensor-device-mismatch]
  // CHECK-FIXES: {{^}}  return model->decode(z.to(device));{{$}}
}

// `arange(n)` has rank 1 whatever n is: not a CPU scalar.
Tensor lengthMask(const Tensor &x, const Tensor &lengths) {
  torch::Device device(torch::kCUDA);
  auto len = lengths.to(device);
  return torch::arange(x.size(1)).unsqueeze(0) < len.unsqueeze(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:48: error: '<' combines the CPU tensor 'torch::arange(x.size(1)).unsqueeze(0)' with 'len.unsqueeze(1)'
}

Tensor normalizeRgb(const Tensor &img, const Tensor &mean) { return img - mean; }

// A helper of the file computing from its inputs returns on their device.
void histogramOnHost(const Tensor &img, const Tensor &mean) {
  const torch::Device device(torch::kCUDA);
  auto hist = torch::zeros({10});
  auto x = normalizeRgb(img.to(device), mean.to(device));
  hist += torch::histc(x, 10, 0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:8: error: '+=' combines the CPU tensor 'hist' with 'torch::histc(x, 10, 0, 1)'
}

// Negatives: the device is chosen at run time; the helper's inputs disagree.
Tensor sampleRuntimeDevice(Decoder &model, bool gpu) {
  torch::Device device(gpu ? torch::kCUDA : torch::kCPU);
  model->to(device);
  return model->decode(torch::randn({3, 4}));
}

void histogramMixedInputs(const Tensor &img, const Tensor &mean) {
  const torch::Device device(torch::kCUDA);
  auto hist = torch::zeros({10});
  auto x = normalizeRgb(img.to(device), mean.cpu()); // throws in the helper, not here
  hist += torch::histc(x, 10, 0, 1);
}

// A plain class that moves its module member to CUDA in its constructor:
// the member computes on CUDA and its parameters are there.
class HumanScorer {
public:
  HumanScorer() : device_(torch::kCUDA) { dec_->to(device_); }
  Tensor agreement(const Tensor &z, const std::vector<float> &human) {
    auto score = dec_->forward(z);
    auto h = torch::tensor(human);
    return score * h;
    // CHECK-MESSAGES: :[[@LINE-1]]:18: error: '*' combines the CPU tensor 'h' with 'score'
  }
  Tensor scaledWeight(const std::vector<float> &w) {
    return dec_->fc->weight * torch::tensor(w);
    // CHECK-MESSAGES: :[[@LINE-1]]:29: error: '*' combines the CPU tensor 'torch::tensor(w)' with 'dec_->fc->weight'
  }

private:
  torch::Device device_;
  Decoder dec_;
};

// Negatives: another method moves it back; a module's member moves with it.
class Offloader {
public:
  Offloader() : device_(torch::kCUDA) { dec_->to(device_); }
  void offload() { dec_->to(torch::kCPU); }
  Tensor agreement(const Tensor &z, const std::vector<float> &human) {
    return dec_->forward(z) * torch::tensor(human);
  }

private:
  torch::Device device_;
  Decoder dec_;
};

struct Wrapper : torch::nn::Module {
  Wrapper() { dec_ = register_module("dec", Decoder()); dec_->to(torch::kCUDA); }
  Tensor agreement(const Tensor &z, const std::vector<float> &human) {
    return dec_->forward(z) * torch::tensor(human);
  }
  Decoder dec_{nullptr};
};

// Call-site facts: every call passes a CUDA image, so the helper's host
// weights meet a CUDA tensor.
Tensor luma(const Tensor &rgb) {
  auto w = torch::tensor({65.481f, 128.553f, 24.966f}).view({1, 3, 1, 1});
  return (rgb * w).sum(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:15: error: '*' combines the CPU tensor 'w' with 'rgb'
  // CHECK-FIXES: {{^}}  return (rgb * w.to(rgb.device())).sum(1);{{$}}
}
// One call passes a host image: the calls do not agree, nothing is said.
Tensor lumaAny(const Tensor &rgb) {
  auto w = torch::tensor({65.481f, 128.553f, 24.966f}).view({1, 3, 1, 1});
  return (rgb * w).sum(1);
}
double psnrY(const Tensor &sr, const Tensor &hr) {
  torch::Device cuda(torch::kCUDA);
  auto a = sr.to(cuda), b = hr.to(cuda);
  auto d = luma(a) - luma(b);
  return (lumaAny(a) - lumaAny(hr.cpu())).mean().item<double>() + d.mean().item<double>();
}

// No fix-it where the CUDA operand has no name to take the device from; the
// advice keeps the CPU operand's arithmetic together.
void denoise(const std::vector<torch::Tensor> &clips) {
  torch::Device device(torch::kCUDA);
  auto bias = torch::zeros({3, 8});
  for (const auto &clip : clips) {
    auto audio = clip.to(device).squeeze(0);
    audio.narrow(0, 0, 4).sub_(bias.select(0, 0).narrow(0, 0, 4) * 0.1);
    // CHECK-MESSAGES: :[[@LINE-1]]:27: error: 'sub_' combines the CPU tensor 'bias.select(0, 0).narrow(0, 0, 4) * 0.1' with 'audio.narrow(0, 0, 4)': throws at run time ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with '(bias.select(0, 0).narrow(0, 0, 4) * 0.1).to(<device>)'
  }
}

// Note [module device]: a module's to() moves what it registered. A tensor
// member made on the host and never registered stays there, while the
// registered layers compute on the device the model was moved to.
struct WarpHeadImpl : torch::nn::Module {
  WarpHeadImpl() : fc(16, 6) {
    register_module("fc", fc);
    identity_ = torch::tensor({1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f}).view({1, 2, 3});
    shift_ = register_buffer("shift", torch::zeros({1, 2, 3}));
    scale_ = torch::tensor(0.5);
  }
  Tensor forward(const Tensor &x) {
    auto delta = torch::tanh(fc->forward(x)).view({-1, 2, 3});
    auto theta = delta + identity_;
    // CHECK-MESSAGES: :[[@LINE-1]]:24: error: '+' combines the CPU tensor 'identity_' (a member the module's to() does not move: it is not registered) with 'delta': throws at run time on a machine with CUDA (its device is 'is_available() ? kCUDA : kCPU') ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'identity_.to(delta.device())' or register it with register_buffer [tensor-device-mismatch]
    // CHECK-FIXES: auto theta = delta + identity_.to(delta.device());
    auto moved = delta + identity_.to(delta.device());
    return theta + shift_ + moved * scale_; // registered; a 0-dim CPU tensor
  }
  torch::nn::Linear fc{nullptr};
  Tensor identity_, shift_, scale_;
};
TORCH_MODULE(WarpHead);

// The class computes where every model holding it is moved: here inside a
// registered submodule of the model main moves.
struct WarpNetImpl : torch::nn::Module {
  WarpNetImpl() : head(register_module("head", WarpHead())) {}
  Tensor forward(const Tensor &x) { return head->forward(x); }
  WarpHead head;
};
TORCH_MODULE(WarpNet);

// Members the class's own moves do not decide: registered by a statement,
// moved by code outside the class, 0-dim, or read in the constructor (before
// any move).
struct GridHeadImpl : torch::nn::Module {
  GridHeadImpl() : fc(register_module("fc", torch::nn::Linear(16, 6))) {
    base_ = torch::ones({1, 2, 3});
    register_buffer("base", base_);
    grid_ = torch::zeros({1, 2, 3});
    temp_ = torch::zeros({});
    W_ = register_parameter("W", torch::randn({16, 6}));
    W_.mul_(torch::rand({16, 6}) < 0.5);
  }
  Tensor forward(const Tensor &x) {
    auto y = fc->forward(x).view({-1, 2, 3});
    return (y + base_ + grid_) / temp_;
  }
  torch::nn::Linear fc;
  Tensor base_, grid_, temp_, W_;
};
TORCH_MODULE(GridHead);
void runGrid(const Tensor &batch) {
  GridHead head;
  head->to(torch::kCUDA);
  head->grid_ = head->grid_.to(torch::kCUDA);
  head->forward(batch.cuda());
}

// Never moved (only to a dtype): the member and the layers share the CPU.
struct HostHeadImpl : torch::nn::Module {
  HostHeadImpl() : fc(register_module("fc", torch::nn::Linear(16, 6))) {
    identity_ = torch::eye(3).narrow(0, 0, 2).unsqueeze(0);
  }
  Tensor forward(const Tensor &x) { return fc->forward(x).view({-1, 2, 3}) + identity_; }
  torch::nn::Linear fc;
  Tensor identity_;
};
TORCH_MODULE(HostHead);

// Moved to CUDA and back to the host: the class's device is unknown; but its
// only caller passes a CUDA tensor (Note [device parameters]), so the layer's
// output is on CUDA there.
struct ExportHeadImpl : torch::nn::Module {
  ExportHeadImpl() : fc(register_module("fc", torch::nn::Linear(16, 6))) {
    identity_ = torch::eye(3).narrow(0, 0, 2).unsqueeze(0);
  }
  Tensor forward(const Tensor &x) { return fc->forward(x).view({-1, 2, 3}) + identity_; }
  // CHECK-MESSAGES: :[[@LINE-1]]:76: error: '+' combines the CPU tensor 'identity_' (a member the module's to() does not move: it is not registered) with 'fc->forward(x).view({-1, 2, 3})': throws at run time
  torch::nn::Linear fc;
  Tensor identity_;
};
TORCH_MODULE(ExportHead);

// Member modules of a class moved to CUDA: their outputs are on CUDA
// (`fc(x)` as `fc->forward(x)`), and a CPU input to one that holds weights
// throws; Dropout holds none.
struct PointerHeadImpl : torch::nn::Module {
  PointerHeadImpl()
      : out(register_module("out", torch::nn::Linear(16, 8))),
        pos_emb(register_module("pos_emb", torch::nn::Embedding(32, 16))),
        drop(register_module("drop", torch::nn::Dropout(0.1))) {}
  Tensor forward(const Tensor &h) {
    auto pos = torch::arange(h.size(1), torch::kLong);
    auto x = h + pos_emb(pos);
    // CHECK-MESSAGES: :[[@LINE-1]]:18: error: 'forward' combines the CPU tensor 'pos' with the parameters of 'pos_emb', moved to CUDA: throws at run time on a machine with CUDA (its device is 'is_available() ? kCUDA : kCPU') ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'pos.to(<device>)' [tensor-device-mismatch]
    auto dist = torch::softmax(out(x), -1);
    auto extra = torch::zeros({dist.size(0), dist.size(1), 4});
    auto extended = torch::cat({dist, extra}, -1);
    // CHECK-MESSAGES: :[[@LINE-1]]:21: error: 'cat' combines the CPU tensor 'extra' with 'dist'
    auto mask = drop(torch::ones({4, 16}));
    return extended.sum(-1) + mask.sum();
  }
  torch::nn::Linear out;
  torch::nn::Embedding pos_emb;
  torch::nn::Dropout drop;
};
TORCH_MODULE(PointerHead);

void trainPointer(const Tensor &h) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  PointerHead head;
  head->to(device);
  head(h.to(device));
}

void trainWarp(const Tensor &batch) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  WarpNet net;
  net->to(device);
  HostHead host;
  host->to(torch::kDouble);
  ExportHead exported;
  exported->to(torch::kCUDA);
  auto out = net->forward(batch.to(device)) + exported->forward(batch.cuda());
  exported->to(torch::kCPU);
  torch::save(exported, "head.pt");
  host->forward(batch.to(torch::kDouble));
}

// A filterbank made by a function of the TU (factories filled in a loop) is
// a CPU member when it is not registered; a parameter reassigned from itself
// (`wav = pad(wav)`) is still what the callers pass, moved to the device.
Tensor melFilterbank(int64_t mels, int64_t freqs) {
  auto fb = torch::zeros({mels, freqs});
  for (int64_t m = 0; m < mels; ++m)
    fb[m] = torch::rand({freqs});
  return fb;
}
struct MelSpecImpl : torch::nn::Module {
  MelSpecImpl() {
    window_ = register_buffer("window", torch::hann_window(16));
    basis_ = melFilterbank(8, 9);
    registered_ = register_buffer("registered", melFilterbank(8, 9));
  }
  Tensor forward(Tensor wav) {
    namespace F = torch::nn::functional;
    wav = F::pad(wav.unsqueeze(1), F::PadFuncOptions({2, 2}).mode(torch::kReflect)).squeeze(1);
    auto spec = torch::stft(wav, 16, 4, 16, window_, false, true, true).abs();
    auto ok = torch::matmul(registered_, spec);
    return torch::matmul(basis_, spec) + ok;
    // CHECK-MESSAGES: :[[@LINE-1]]:12: error: 'matmul' combines the CPU tensor 'basis_' (a member the module's to() does not move: it is not registered) with 'spec': throws at run time on a machine with CUDA
  }
  Tensor window_, basis_, registered_;
};
TORCH_MODULE(MelSpec);

void logMel(const Tensor &audio) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  MelSpec mel;
  mel->to(device);
  mel->forward(audio.to(device));
}

// A member made by elementwise math over a host factory (`1.0 / pow(base,
// arange(...))`) is a host member; arange's result is 1-D, never a CPU scalar.
// A 0-dim member (a reduction) is a CPU scalar CUDA ops accept; a registered
// one moves.
struct RotaryImpl : torch::nn::Module {
  RotaryImpl(int64_t dim, double base) {
    inv_freq_ = 1.0 / torch::pow(base, torch::arange(0, dim, 2, torch::kFloat) / dim);
    moved_ = register_buffer("moved", 1.0 / torch::pow(base, torch::arange(0, dim, 2) / dim));
    total_ = torch::arange(0, dim, 2).sum();
  }
  Tensor forward(const Tensor &x, const Tensor &positions) {
    auto freqs = torch::outer(positions.to(torch::kFloat), inv_freq_);
    // CHECK-MESSAGES: :[[@LINE-1]]:18: error: 'outer' combines the CPU tensor 'inv_freq_' (a member the module's to() does not move: it is not registered) with 'positions.to(torch::kFloat)': throws at run time on a machine with CUDA
    auto ok = torch::outer(positions.to(torch::kFloat), moved_) * total_;
    return x * freqs.cos() + ok;
  }
  Tensor relative(int64_t klen) {
    auto pos_seq = torch::arange(klen - 1, -1, -1.0);
    return torch::outer(pos_seq, moved_);
    // CHECK-MESSAGES: :[[@LINE-1]]:12: error: 'outer' combines the CPU tensor 'pos_seq' with 'moved_': throws at run time on a machine with CUDA
  }
  Tensor inv_freq_, moved_, total_;
};
TORCH_MODULE(Rotary);

void rotate(const Tensor &q) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  Rotary rope(8, 10000.0);
  rope->to(device);
  rope->forward(q.to(device), torch::arange(4, torch::TensorOptions().device(device)));
  rope->relative(4);
}

// Note [caller's device]: a device parameter no call in view passes is the
// caller's choice, and code that takes one is written to run on CUDA too.
class ChosenDeviceTrainer {
public:
  explicit ChosenDeviceTrainer(torch::Device d) : device_(d) {}
  torch::Tensor weighted(const torch::Tensor &x) {
    auto xd = x.to(device_);
    auto w = torch::ones({4});
    return xd * w;
    // CHECK-MESSAGES: :[[@LINE-1]]:15: error: '*' combines the CPU tensor 'w' with 'xd': throws at run time when its caller passes a CUDA device (no call in view chooses one) ('Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!'); move it with 'w.to(xd.device())' [tensor-device-mismatch]
    // CHECK-FIXES: {{^}}    return xd * w.to(xd.device());{{$}}
  }

private:
  torch::Device device_;
};
// The same class given the CPU where it is made: nothing to report.
class HostTrainer {
public:
  explicit HostTrainer(torch::Device d) : device_(d) {}
  torch::Tensor weighted(const torch::Tensor &x) { return x.to(device_) * torch::ones({4}); }

private:
  torch::Device device_;
};
torch::Tensor runOnHost(const torch::Tensor &x) { return HostTrainer(torch::kCPU).weighted(x); }

// A host tensor the code shows meeting one whose device only the default
// says (a parameter no call in view passes): the result is on the host by
// that default alone, so its meeting a CUDA tensor later is not reported.
torch::Tensor regulateLength(const torch::Tensor &enc, const torch::Tensor &durations) {
  auto ends = torch::cumsum(durations, 1);
  auto starts = ends - durations;
  auto frames = torch::arange(16).view({1, 1, -1});
  auto span = (frames >= starts.unsqueeze(-1)) & (frames < ends.unsqueeze(-1));
  return torch::matmul(span.transpose(1, 2).to(enc.scalar_type()), enc);
}
// `empty_like(x, kLong)`: options made from a dtype keep x's device.
torch::Tensor framesUpTo(const torch::Tensor &logDur) {
  auto durations = torch::empty_like(logDur, torch::kLong);
  durations.copy_(logDur.exp().round());
  return torch::arange(16) < durations.unsqueeze(-1);
  // CHECK-MESSAGES: :[[@LINE-1]]:28: error: '<' combines the CPU tensor 'torch::arange(16)' with 'durations.unsqueeze(-1)': throws at run time on a machine with CUDA
}
void runRegulate(const torch::Tensor &durations) {
  auto device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto enc = torch::randn({2, 5, 8}, device);
  std::cout << regulateLength(enc, durations) << framesUpTo(enc);
}
