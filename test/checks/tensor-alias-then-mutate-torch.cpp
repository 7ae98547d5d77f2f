// REQUIRES: torch
// RUN: %check_tensor_tidy --compile-fixed %s tensor-alias-then-mutate %t -- --quiet -- %torch_pch
// RUN: %check_tensor_tidy --compile-fixed --runner=clang-tidy %s tensor-alias-then-mutate %t.plugin -- --quiet -- %torch_pch
#include <torch/torch.h>

using torch::Tensor;

// ===== positives ============================================================

Tensor normalize(const Tensor &input, const Tensor &mean, const Tensor &stdev) {
  Tensor x = input;
  // CHECK-FIXES: {{^}}  Tensor x = input.clone();{{$}}
  x -= mean;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place '-=' on 'x' also changes 'input', which shares its storage
  x /= stdev;
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place '/=' on 'x' also changes 'input'
  return x;
}

Tensor toFloatAndScale(const Tensor &img) {
  auto f = img.to(torch::kFloat);
  // CHECK-FIXES: {{^}}  auto f = img.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);{{$}}
  f.sub_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sub_' on 'f' may also change 'img': 'to' returns its input, not a copy, when it can
  f.clamp_(0, 1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'clamp_' on 'f' may also change 'img'
  return f;
}

Tensor packed(const Tensor &x) {
  Tensor c = x.contiguous();
  // CHECK-FIXES: {{^}}  Tensor c = x.clone(c10::MemoryFormat::Contiguous);{{$}}
  c.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'c' may also change 'x': 'contiguous' returns its input
  c.add_(1);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'add_' on 'c' may also change 'x'
  return c;
}

struct Net : torch::nn::Module {
  Tensor running_mean = torch::zeros({8});
  void update(const Tensor &batch_mean) {
    Tensor m = running_mean;
    m.mul_(0.9);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'mul_' on 'm' also changes 'running_mean'
    // CHECK-FIXES: {{^}}    m = m.mul(0.9);{{$}}
    (void)batch_mean;
  }
};

void flattenedWrite() {
  Tensor a = torch::ones({2, 3});
  auto flat = torch::flatten(a);
  // CHECK-FIXES: {{^}}  auto flat = torch::flatten(a).clone();{{$}}
  flat.zero_();
  // CHECK-MESSAGES: :[[@LINE-1]]:8: warning: in-place 'zero_' on 'flat' may also change 'a': 'flatten' returns its input
  std::cout << a << std::endl;
}

// ===== negatives ============================================================

Tensor cloned(const Tensor &input) {
  Tensor x = input.clone();
  x -= x.mean();
  return x;
}

void slicesAreTheIdiom(Tensor &buf) {
  buf.slice(0, 0, 2).zero_();
  buf.index_put_({0}, 1);
  buf[1].fill_(2);
  auto head = buf.narrow(0, 0, 1);
  head.mul_(3);
}

void gradsInPlace(torch::nn::Module &m) {
  for (auto &p : m.parameters())
    if (p.grad().defined())
      p.grad().zero_();
}

Tensor forcedCopy(const Tensor &x) {
  auto y = x.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
  y.mul_(2);
  return y;
}

void metadataReadsOnly() {
  Tensor a = torch::ones({3});
  Tensor b = a;
  b.add_(1);
  std::cout << a.sizes() << a.dtype() << std::endl;
  std::cout << b << std::endl;
}

// dtype facts: an assertion shows the dtype; without one, inputs are float32.
torch::Tensor frameToInput(const torch::Tensor &frame_u8) {
  TORCH_CHECK(frame_u8.scalar_type() == torch::kByte, "expected a uint8 frame");
  auto f = frame_u8.permute({2, 0, 1}).to(torch::kFloat); // uint8 -> float32: a copy
  f.div_(255.0);
  return f;
}

torch::Tensor scaleInput(const torch::Tensor &frame) {
  auto f = frame.to(torch::kFloat); // a float32 input: f is frame itself
  f.mul_(0.5);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'f' may also change 'frame': 'to' returns its input, not a copy, when it can
  return f;
}

// `to(other.dtype())` converts to other's dtype: a bool mask to the (assumed
// float) dtype of a parameter or of a structured binding's tensor copies.
torch::Tensor maskWeights(torch::nn::LSTM &lstm, const torch::Tensor &x, const torch::Tensor &len) {
  auto [out, state] = lstm->forward(x);
  auto mask = torch::arange(x.size(1)).unsqueeze(0) < len.unsqueeze(1);
  auto w = mask.to(out.dtype());
  w.div_(len.unsqueeze(1));
  auto v = mask.to(x.scalar_type());
  v.mul_(2);
  return w + v + mask;
}

// The same dtype: `to` returns its input.
torch::Tensor sameDtype(const torch::Tensor &x, const torch::Tensor &y) {
  auto z = x.to(y.dtype());
  z.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'z' may also change 'x'
  return z;
}

// A field of a local struct (a module's result) is this function's storage:
// a write through a copy of it matters only if that field is read again.
struct HeadsOut {
  torch::Tensor logits, value;
};
struct HeadsImpl : torch::nn::Module {
  HeadsImpl() { fc = register_module("fc", torch::nn::Linear(4, 4)); }
  HeadsOut forward(const torch::Tensor &x) { return {fc(x), fc(x).sum(1)}; }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Heads);
void keepOutput(const HeadsOut &o);

float fieldNotReadAgain(Heads &net, const torch::Tensor &x, const torch::Tensor &illegal) {
  auto out = net->forward(x);
  auto logits = out.logits;
  logits.masked_fill_(illegal, -1e9);
  return (torch::softmax(logits, 1).sum() + out.value.sum()).item<float>();
}

float fieldReadAgain(Heads &net, const torch::Tensor &x, const torch::Tensor &illegal) {
  auto out = net->forward(x);
  auto logits = out.logits;
  logits.masked_fill_(illegal, -1e9);
  // CHECK-MESSAGES: :[[@LINE-1]]:10: warning: in-place 'masked_fill_' on 'logits' also changes 'out.logits', which shares its storage
  return out.logits.sum().item<float>();
}

void structPassedOn(Heads &net, const torch::Tensor &x) {
  auto out = net->forward(x);
  auto v = out.value;
  v.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'v' also changes 'out.value'
  keepOutput(out);
}

// A module made in the function owns its parameters: initialising the new
// table writes none of the old one's storage.
void growEmbedding(torch::nn::Embedding &word, int64_t n) {
  auto old_w = word->weight;
  auto grown = torch::nn::Embedding(n, old_w.size(1));
  torch::nn::init::normal_(grown->weight, 0.0, 0.02);
  torch::NoGradGuard no_grad;
  grown->weight.narrow(0, 0, old_w.size(0)).copy_(old_w);
  word = grown;
}
// A handle of its weight written while the weight is read later is reported,
// named through the holder.
torch::Tensor doubledLayer(int64_t n, const torch::Tensor &x) {
  auto lin = torch::nn::Linear(n, n);
  auto w = lin->weight;
  torch::NoGradGuard no_grad;
  w.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'w' also changes 'lin->weight', which shares its storage
  return x.matmul(lin->weight);
}

// A data loader makes each batch anew: normalising its images in place
// changes nothing the loop reads again; reading them after the write does.
void normaliseBatches(torch::nn::Linear &model) {
  auto loader = torch::data::make_data_loader(
      torch::data::datasets::MNIST("data").map(torch::data::transforms::Stack<>()), 64);
  for (auto &batch : *loader) {
    auto x = batch.data;
    x.sub_(0.5);
    model->forward(x.flatten(1));
  }
  for (auto &batch : *loader) {
    auto x = batch.data;
    x.sub_(0.5);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'sub_' on 'x' also changes 'batch.data', which shares its storage
    std::cout << batch.data.mean() << "\n";
  }
}

// Twelfth session: integer data by name, and columns past the first.
// Visit counts are int64: to(kFloat) copies them.
Tensor countsToFloat(const Tensor &child_visits) {
  auto visits = child_visits.to(torch::kFloat);
  visits.div_(visits.sum());
  return visits + child_visits;
}

// Either path holds integer data by name, so the join does too: to(kFloat) copies.
Tensor chosenToFloat(bool greedy, const Tensor &actions, const Tensor &sampled_actions) {
  auto chosen = greedy ? actions : sampled_actions;
  auto scaled = chosen.to(torch::kFloat);
  scaled.div_(2);
  return scaled + chosen;
}

// A dtype every constructor asserts is the class's invariant for that member:
// uint8 pixels convert by copy; float32 ones are returned as they are.
struct BytePixels {
  explicit BytePixels(Tensor images) : images_(std::move(images)) {
    TORCH_CHECK(images_.scalar_type() == torch::kByte, "expected uint8 pixels");
  }
  Tensor get(int64_t i) {
    auto x = images_[i].to(torch::kFloat);
    x.div_(255);
    return x;
  }
  Tensor images_;
};
struct FloatPixels {
  explicit FloatPixels(Tensor images) : images_(std::move(images)) {
    TORCH_CHECK(images_.dtype() == torch::kFloat, "expected float32 pixels");
  }
  Tensor get(int64_t i) {
    auto x = images_[i].to(torch::kFloat);
    x.div_(255);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'div_' on 'x' may also change 'images_'
    return x;
  }
  Tensor images_;
};

// A master copy's update written back into the parameter: the write through
// the alias is meant to reach it (for float32 parameters to() returns p).
void masterUpdate(std::vector<Tensor> &params, const Tensor &update) {
  torch::NoGradGuard no_grad;
  for (auto &p : params) {
    auto p32 = p.to(torch::kFloat);
    p32.sub_(update);
    if (p.scalar_type() != torch::kFloat)
      p.copy_(p32);
  }
}

// 16-bit PCM samples scaled to [-1, 1]: the conversion of integer data copies.
Tensor pcmToFloat(const Tensor &pcm16) {
  auto wav = pcm16.to(torch::kFloat);
  wav.div_(32768.0);
  return wav;
}

// Columns 2..5 of every row are not contiguous: contiguous() copies them.
Tensor columnsCopied(const Tensor &labels, int64_t img) {
  auto boxes = labels.narrow(1, 2, 4).contiguous();
  boxes.mul_(static_cast<double>(img));
  return boxes + labels;
}

// The first four columns may be all of them: contiguous() may return labels.
Tensor leadingColumns(const Tensor &labels) {
  auto boxes = labels.narrow(1, 0, 4).contiguous();
  boxes.mul_(2);
  // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'mul_' on 'boxes' may also change 'labels': 'contiguous' returns its input, not a copy, when it can [tensor-alias-then-mutate]
  // CHECK-FIXES: {{^}}  boxes = boxes.mul(2);{{$}}
  return boxes + labels;
}

// A handle to a module's parameter, written under no-grad, initialises it:
// changing the parameter is the point.
void loadEmbedding(torch::nn::Embedding &emb, torch::nn::Linear &fc, const torch::Tensor &vectors) {
  torch::NoGradGuard no_grad;
  auto w = emb->weight;
  w.copy_(vectors);
  auto b = fc->bias;
  b.zero_();
}

// A may-alias op on a parameter may be meant as a copy: `to(kFloat)` of a
// float32 parameter is the parameter.
torch::Tensor exportScaled(torch::nn::Linear &fc, double scale) {
  torch::NoGradGuard no_grad;
  auto w = fc->weight.to(torch::kFloat);
  w.mul_(scale);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'mul_' on 'w' may also change 'weight': 'to' returns its input, not a copy, when it can [tensor-alias-then-mutate]
  return w;
}

// A write PyTorch refuses on an expanded tensor changes nothing: that is
// tensor-inplace-on-expanded's finding.
torch::Tensor broadcastGrid(const torch::Tensor &slots, const torch::Tensor &pos, int64_t r) {
  auto z = slots.reshape({slots.size(0) * slots.size(1), slots.size(2), 1, 1})
               .expand({-1, -1, r, r});
  z.add_(pos);
  return z;
}

// Integer data by its name may be int64 already: to(kLong) may return it.
torch::Tensor maskedTargets(const torch::Tensor &logits, const torch::Tensor &labels, int64_t T) {
  auto targets = labels.narrow(1, 1, T - 1).to(torch::kLong);
  targets.masked_fill_(targets.eq(-100), 0);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: in-place 'masked_fill_' on 'targets' may also change 'labels': 'to' returns its input, not a copy, when it can
  return logits.narrow(1, 0, T - 1).gather(2, targets.unsqueeze(-1));
}

// A device chosen at run time may be the input's: on a CPU-only machine
// `b.energy.to(device)` is the dataset's tensor, rewritten every epoch.
struct EnergyBatch {
  torch::Tensor energy, atoms;
};
void normaliseEnergies(std::vector<EnergyBatch> &batches, double mean, double stdev, int epochs) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  for (int e = 0; e < epochs; ++e)
    for (auto &b : batches) {
      auto target = b.energy.to(device);
      target.sub_(mean).div_(stdev);
      // CHECK-MESSAGES: :[[@LINE-1]]:14: warning: in-place 'sub_' on 'target' may also change 'energy': 'to' returns its input, not a copy, when it can [tensor-alias-then-mutate]
      std::cout << target.sum().item<double>() << "\n";
    }
}

// `to(other.device())` keeps the device when both sides share it.
torch::Tensor standardise(const torch::Tensor &x, const torch::Tensor &mean,
                          const torch::Tensor &stdev) {
  auto z = x.to(mean.device());
  z.sub_(mean).div_(stdev);
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'sub_' on 'z' may also change 'x': 'to' returns its input, not a copy, when it can [tensor-alias-then-mutate]
  return z;
}

// A function that writes its argument is given the device copy to write:
// not reported at the call (only a CPU-only run writes the batch).
void dither(torch::Tensor &wav, double amount) { wav.add_(torch::randn_like(wav), amount); }
double ditheredEnergy(const std::vector<torch::Tensor> &clips) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  double total = 0;
  for (const auto &clip : clips) {
    auto wav = clip.to(device);
    dither(wav, 1e-4);
    total += wav.pow(2).sum().item<double>();
  }
  return total;
}

// A helper returning a may-alias op of its argument's view: the caller did
// not ask for a view of f.
torch::Tensor sampleSensors(const torch::Tensor &f, int64_t stride) {
  return f.slice(1, 0, f.size(1), stride).flatten(1);
}
torch::Tensor branchInput(const torch::Tensor &f, double mean, int64_t stride) {
  auto sensors = sampleSensors(f, stride);
  sensors.sub_(mean);
  // CHECK-MESSAGES: :[[@LINE-1]]:11: warning: in-place 'sub_' on 'sensors' may also change 'f': 'sampleSensors' returns its input, not a copy, when it can [tensor-alias-then-mutate]
  return sensors;
}

// Note [pixel bytes]: a conversion to float whose result is divided by 255 in
// place converts 8-bit pixels, so it copies: neither the write nor a caller's
// write through the helper is reported.
torch::Tensor toUnitRange(const torch::Tensor &frames) {
  auto x = frames.to(torch::kFloat32);
  return x.div_(255.0);
}
torch::Tensor scaledFrame(const torch::Tensor &frame) { return frame.to(torch::kFloat).div_(255); }
// Through the layout change that follows the conversion (HWC frames to CHW).
torch::Tensor toChannelsFirst(const torch::Tensor &frames_u8, torch::Device device) {
  auto f = frames_u8.to(device, torch::kFloat).permute({0, 3, 1, 2});
  f.div_(255.0);
  return f;
}
void stepFrames(torch::Tensor obs) {
  auto in = toUnitRange(obs);
  in.sub_(0.5);
  auto one = scaledFrame(obs[0]);
  one /= 2;
  auto centred = obs.to(torch::kFloat32); // to [-1, 1]: 127.5 is half of 255
  centred.div_(127.5).sub_(1.0);
}

// Scaled by another constant: the float32 default holds.
torch::Tensor toSignedRange(const torch::Tensor &samples) {
  auto img = samples.to(torch::kFloat);
  img.div_(2.0);
  // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'div_' on 'img' may also change 'samples': 'to' returns its input, not a copy, when it can [tensor-alias-then-mutate]
  return img;
}

// A public field of a plain struct has the dtype every value the file gives
// it has, outside its class too (`shard.tokens = randint(..., kInt)` in the
// caller): to(kLong) of it copies. A field bound to a non-const reference
// may change out of sight: unknown, so reported.
struct TokenShard {
  torch::Tensor tokens;
  int64_t cursor = 0;
  torch::Tensor next(int64_t batch) {
    auto ids = tokens.narrow(0, cursor, batch).to(torch::kLong);
    ids.masked_fill_(ids.ge(1000), 1);
    cursor += batch;
    return ids;
  }
};
struct LoadedShard {
  torch::Tensor tokens;
  torch::Tensor next(int64_t batch) {
    auto ids = tokens.narrow(0, 0, batch).to(torch::kLong);
    ids.masked_fill_(ids.ge(1000), 1);
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'masked_fill_' on 'ids' may also change 'tokens': 'to' returns its input, not a copy, when it can [tensor-alias-then-mutate]
    return ids;
  }
};
// Brace initialisation gives the fields their values in order; with a base
// class the initialisers are not one per field: unknown, so reported.
struct PlainShard {
  torch::Tensor tokens;
  torch::Tensor next() {
    auto ids = tokens.to(torch::kLong);
    ids.add_(1);
    return ids;
  }
};
struct IdsBase {
  int64_t offset = 0;
};
struct ShardOfBase : IdsBase {
  torch::Tensor tokens;
  torch::Tensor next() {
    auto ids = tokens.to(torch::kLong);
    ids.add_(1);
    // CHECK-MESSAGES: :[[@LINE-1]]:9: warning: in-place 'add_' on 'ids' may also change 'tokens': 'to' returns its input, not a copy, when it can [tensor-alias-then-mutate]
    return ids;
  }
};
torch::Tensor braced(int64_t n) {
  PlainShard plain{torch::randint(0, 1000, {n, 4}, torch::kInt)};
  ShardOfBase based{{}, torch::randint(0, 1000, {n, 4}, torch::kInt)};
  return plain.next() + based.next();
}
void fillShards(TokenShard &shard, LoadedShard &loaded) {
  shard.tokens = torch::randint(0, 1000, {64, 16}, torch::kInt);
  loaded.tokens = torch::randint(0, 1000, {64, 16}, torch::kInt);
  torch::load(loaded.tokens, "tokens.pt");
}

// A helper that writes only a copy of the handle it is given: one finding,
// in the helper, where the copy is made; its calls are not reported again.
// A helper that writes its argument itself is reported at the call.
struct Normalizer {
  torch::Tensor mean, var;
  torch::Tensor normalize(const torch::Tensor &x) const {
    auto y = x.to(torch::kFloat32);
    // CHECK-FIXES: {{^}}    auto y = x.to(torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);{{$}}
    y.sub_(mean).div_(var);
    // CHECK-MESSAGES: :[[@LINE-1]]:7: warning: in-place 'sub_' on 'y' may also change 'x': 'to' returns its input
    return y;
  }
};
void scaleInPlace(torch::Tensor x) { x.mul_(2); }
float normalizedTwice(const Normalizer &n, const torch::Tensor &obs) {
  auto a = n.normalize(obs);
  auto b = n.normalize(obs);
  auto c = obs;
  // CHECK-FIXES: {{^}}  auto c = obs.clone();{{$}}
  scaleInPlace(c);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: call to 'scaleInPlace', which writes its argument in place, on 'c' also changes
  return (a - b + obs).sum().item<float>();
}
// The same through a second helper that passes its argument on: still a copy.
torch::Tensor preprocess(const Normalizer &n, const torch::Tensor &x) { return n.normalize(x); }
void scaleTwice(torch::Tensor x) { scaleInPlace(x); }
float preprocessedTwice(const Normalizer &n, const torch::Tensor &obs) {
  auto a = preprocess(n, obs);
  auto b = preprocess(n, obs);
  auto c = obs;
  // CHECK-FIXES: {{^}}  auto c = obs.clone();{{$}}
  scaleTwice(c);
  // CHECK-MESSAGES: :[[@LINE-1]]:3: warning: call to 'scaleTwice', which writes its argument in place, on 'c' also changes
  return (a - b + obs).sum().item<float>();
}

// A trailing underscore names an in-place function (PyTorch's convention):
// writing its parameter through an alias is what it is for. The same body
// under a plain name is reported.
void rotateRows_(const torch::Tensor &rows, const torch::Tensor &rot) {
  auto v = rows.reshape({-1, 3});
  v.copy_(v.mm(rot));
}
torch::Tensor rotateRows(const torch::Tensor &rows, const torch::Tensor &rot) {
  auto v = rows.reshape({-1, 3});
  // CHECK-FIXES: {{^}}  auto v = rows.clone(c10::MemoryFormat::Contiguous).reshape({-1, 3});{{$}}
  v.copy_(v.mm(rot));
  // CHECK-MESSAGES: :[[@LINE-1]]:5: warning: in-place 'copy_' on 'v' may also change 'rows': 'reshape' returns its input
  return v;
}

// Note [Recency of a loop's handle]: a handle holds the newest instance its
// site made. The clone written here is not the one last iteration's
// `x_next = x_euler` handed on (edm_heun_sampler); nor does `x_cur.add_`
// reach an `x_next` reassigned since `auto x_cur = x_next`.
torch::Tensor heunSteps(const torch::Tensor &x0, int64_t steps) {
  auto x_next = x0.clone();
  for (int64_t i = 0; i < steps; ++i) {
    auto x_cur = x_next;
    auto x_hat = x_cur;
    auto x_euler = x_hat.clone();
    x_euler.add_(x_hat, 0.5);
    x_next = x_euler;
  }
  return x_next;
}
torch::Tensor relaxSteps(const torch::Tensor &x0, int64_t steps) {
  auto x_next = x0.clone();
  for (int64_t i = 0; i < steps; ++i) {
    auto x_cur = x_next;
    x_next = x_cur * 2;
    x_cur.add_(1);
    std::cout << x_next.sum().item<float>() << x_cur.sum().item<float>();
  }
  return x_next;
}
// The alias made after the clone in the same iteration is the clone's.
torch::Tensor keptClone(const torch::Tensor &x0, int64_t steps) {
  torch::Tensor keep;
  for (int64_t i = 0; i < steps; ++i) {
    auto y = x0.clone();
    keep = y;
    y.add_(1);
    // CHECK-FIXES: {{^}}    y = y.add(1);{{$}}
    // CHECK-MESSAGES: :[[@LINE-2]]:7: warning: in-place 'add_' on 'y' also changes 'keep'
    std::cout << keep.sum().item<float>();
  }
  return keep;
}
// A handle copy is the same storage every iteration.
void stepState(const torch::Tensor &state, int64_t steps) {
  torch::Tensor seen;
  for (int64_t i = 0; i < steps; ++i) {
    torch::Tensor v = state;
    v.add_(1);
    // CHECK-FIXES: {{^}}    v = v.add(1);{{$}}
    // CHECK-MESSAGES: :[[@LINE-2]]:7: warning: in-place 'add_' on 'v' also changes 'state'
    seen = v;
    std::cout << seen.sum().item<float>();
  }
}
