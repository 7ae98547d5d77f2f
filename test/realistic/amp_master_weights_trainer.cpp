// Mixed-precision training written out by hand: the model runs in fp16, the
// optimizer owns fp32 master copies of every parameter, a dynamic loss scaler
// backs off on inf/nan gradients and grows after a run of clean steps, and the
// master gradients are clipped to a global norm before each update.
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace {

struct AmpConfig {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;
  double max_grad_norm = 1.0;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 1e-4;
  int64_t batch_size = 64;
  int64_t steps_per_epoch = 200;
  int64_t epochs = 10;
  int64_t log_every = 50;
  int64_t image_size = 32;
  int64_t num_classes = 10;
  int64_t hidden = 1024;
  std::string checkpoint = "master_weights.pt";
};

class DynamicLossScaler {
 public:
  DynamicLossScaler(const AmpConfig& cfg, torch::Device device)
      : cfg_(cfg),
        scale_(torch::full({}, cfg.init_scale,
                           torch::TensorOptions().dtype(torch::kFloat).device(device))) {}

  torch::Tensor scale(const torch::Tensor& loss) const { return loss * scale_; }

  // Unscales the fp16 model gradients into fp32 master gradients. Returns a
  // device-side flag that is true when any gradient was inf or nan.
  torch::Tensor unscale_into(const std::vector<torch::Tensor>& model_params,
                             std::vector<torch::Tensor>& master_params) const {
    torch::NoGradGuard no_grad;
    const auto inv_scale = scale_.reciprocal();
    std::vector<torch::Tensor> non_finite;
    for (size_t i = 0; i < model_params.size(); ++i) {
      const auto& grad = model_params[i].grad();
      if (!grad.defined()) {
        continue;
      }
      // FACT: g = torch.randn(8, 4).half(); g32 = g.to(torch.float32); g32.mul_(0.5); assert is_copy_of(g32, g)
      auto g32 = grad.to(torch::kFloat);
      g32.mul_(inv_scale);  // LOOKALIKE: tensor-alias-then-mutate -- the whole model is fp16, so to(kFloat) allocates a fresh fp32 tensor
      non_finite.push_back(torch::isfinite(g32).all().logical_not());
      master_params[i].mutable_grad() = g32;
    }
    if (non_finite.empty()) {
      return torch::zeros({}, scale_.options().dtype(torch::kBool));
    }
    return torch::stack(non_finite).any();
  }

  void update(bool found_inf) {
    if (found_inf) {
      // FACT: w = torch.randn(3, requires_grad=True); s = torch.tensor(8.); ((w * 2).sum() * s).backward(); s.mul_(0.5); assert w.grad is not None
      scale_.mul_(cfg_.backoff_factor).clamp_min_(cfg_.min_scale);  // LOOKALIKE: tensor-inplace-on-saved -- the mul that saved scale_ was consumed by backward() before update() runs
      good_steps_ = 0;
      ++skipped_;
      return;
    }
    if (++good_steps_ % cfg_.growth_interval == 0) {
      scale_.mul_(cfg_.growth_factor);
    }
  }

  int64_t skipped() const { return skipped_; }

 private:
  AmpConfig cfg_;
  torch::Tensor scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

struct GatedMlpImpl : torch::nn::Module {
  GatedMlpImpl(int64_t in_features, int64_t hidden, int64_t classes)
      : stem(register_module("stem", torch::nn::Linear(in_features, hidden))),
        gate(register_module("gate", torch::nn::Linear(hidden, hidden))),
        up(register_module("up", torch::nn::Linear(hidden, hidden))),
        down(register_module("down", torch::nn::Linear(hidden, hidden))),
        head(register_module("head", torch::nn::Linear(hidden, classes))) {}

  // Logit adjustment for an imbalanced label distribution.
  void set_prior(const torch::Tensor& class_counts) {
    log_prior = (class_counts / class_counts.sum()).log();
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = stem(x);
    // FACT: w = torch.randn(4, 4, requires_grad=True); a = torch.randn(2, 4) @ w; a.relu_(); (a @ w).sum().backward(); assert w.grad is not None
    h.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- the linear saved its input and weight, not its output; relu_ then saves its own result
    auto g = torch::sigmoid(gate(h));
    // FACT: w = torch.randn(4, 4, requires_grad=True); h = torch.randn(2, 4); assert backward_fails(lambda: (lambda g: (g.mul_(h @ w), g.sum().backward()))(torch.sigmoid(h @ w)))
    g.mul_(up(h));  // EXPECT: tensor-inplace-on-saved
    h = h + down(g);
    last_hidden = h;
    return head(h) + log_prior;  // EXPECT: tensor-device-mismatch
  }

  torch::nn::Linear stem, gate, up, down, head;
  torch::Tensor log_prior;
  torch::Tensor last_hidden;
};
TORCH_MODULE(GatedMlp);

struct Batch {
  torch::Tensor images;  // NHWC, straight from the decoder
  torch::Tensor labels;
};

Batch synthetic_batch(int64_t n, const AmpConfig& cfg) {
  auto labels = torch::randint(cfg.num_classes, {n}, torch::kLong);
  auto images = torch::randint(0, 256, {n, cfg.image_size, cfg.image_size, 3}, torch::kUInt8);
  return {images, labels};
}

std::pair<torch::Tensor, torch::Tensor> channel_stats(const torch::Tensor& images_nhwc) {
  auto x = images_nhwc.to(torch::kFloat).permute({3, 0, 1, 2});
  // FACT: x = torch.randn(2, 4, 4, 3); y = x.permute(3, 0, 1, 2).reshape(3, -1); assert is_view_of(y, x)
  auto per_channel = x.reshape({x.size(0), -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- N, H, W keep their order after the permute, so they merge into one strided dim and reshape is a view
  return {per_channel.mean(1), per_channel.std(1)};
}

torch::Tensor prepare_batch(const torch::Tensor& images_nhwc, const torch::Tensor& mean,
                            const torch::Tensor& stddev) {
  auto x = images_nhwc.to(torch::kHalf);
  // FACT: a = torch.ones(2, 4, 4, 3).half(); b = a.to(torch.float16); b.sub_(1); assert shares_storage(a, b) and a.sum() == 0
  x.sub_(mean).div_(stddev);  // EXPECT: tensor-alias-then-mutate
  auto nchw = x.permute({0, 3, 1, 2});
  // FACT: x = torch.randn(2, 4, 4, 3).half(); y = x.permute(0, 3, 1, 2).reshape(2, -1); assert is_copy_of(y, x)
  return nchw.reshape({nchw.size(0), -1});  // EXPECT: tensor-reshape-non-contiguous
}

std::vector<torch::Tensor> make_master_copy(const std::vector<torch::Tensor>& model_params) {
  std::vector<torch::Tensor> master;
  master.reserve(model_params.size());
  for (const auto& p : model_params) {
    master.push_back(p.detach().to(torch::kFloat).requires_grad_(true));
  }
  return master;
}

void copy_master_to_model(const std::vector<torch::Tensor>& master,
                          std::vector<torch::Tensor>& model_params) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master.size(); ++i) {
    auto& p = model_params[i];
    p.copy_(master[i].to(p.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the fp32->fp16 rounding is spelled out with to(), copy_ sees matching dtypes
  }
}

void restore_model_from_master(const std::string& path, std::vector<torch::Tensor>& master,
                               std::vector<torch::Tensor>& model_params) {
  torch::load(master, path);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < master.size(); ++i) {
    model_params[i].copy_(master[i]);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
  }
}

// Decoupled weight decay on the fp32 copy, before the momentum step.
void decay_master_weights(std::vector<torch::Tensor>& master, double lr, double wd) {
  for (auto& m : master) {
    if (m.dim() < 2) {
      continue;  // biases are not decayed
    }
    m.mul_(1.0 - lr * wd);  // EXPECT: tensor-inplace-on-leaf
  }
}

torch::Tensor clip_master_grads(std::vector<torch::Tensor>& master, double max_norm) {
  std::vector<torch::Tensor> norms;
  for (const auto& m : master) {
    if (m.grad().defined()) {
      norms.push_back(m.grad().norm());
    }
  }
  auto total_norm = torch::stack(norms).norm();
  auto clip_coef = (torch::tensor(max_norm) / (total_norm + 1e-6)).clamp_max(1.0);  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor may join a CUDA op
  for (auto& m : master) {
    if (m.grad().defined()) {
      m.grad().data().mul_(clip_coef);  // LOOKALIKE: tensor-inplace-on-detached -- rewriting the gradient is the point, and no graph saved it
    }
  }
  return total_norm;
}

// fp16 saturates at 65504; report how much room the widest activation leaves.
double activation_headroom(const torch::Tensor& act) {
  auto probe = act.detach();
  probe.abs_();  // EXPECT: tensor-inplace-on-detached
  return 65504.0 / probe.max().item<double>();
}

}  // namespace

int main() {
  TORCH_CHECK(torch::cuda::is_available(), "fp16 training needs a CUDA device");
  const torch::Device device(torch::kCUDA);
  torch::manual_seed(0);
  AmpConfig cfg;

  const int64_t in_features = cfg.image_size * cfg.image_size * 3;
  GatedMlp model(in_features, cfg.hidden, cfg.num_classes);
  model->set_prior(torch::ones({cfg.num_classes}));
  model->to(device, torch::kHalf);

  auto model_params = model->parameters();
  auto master = make_master_copy(model_params);
  if (std::ifstream(cfg.checkpoint).good()) {
    restore_model_from_master(cfg.checkpoint, master, model_params);
  }
  torch::optim::SGD opt(master, torch::optim::SGDOptions(cfg.lr).momentum(cfg.momentum));
  DynamicLossScaler scaler(cfg, device);

  const auto stats = channel_stats(synthetic_batch(1024, cfg).images);
  const auto mean = stats.first.to(device, torch::kHalf);
  const auto stddev = stats.second.to(device, torch::kHalf);

  const auto val = synthetic_batch(512, cfg);
  const auto val_images = val.images.to(device, torch::kHalf);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> train_logits;
    std::vector<torch::Tensor> train_targets;
    double running_loss = 0.0;
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      auto batch = synthetic_batch(cfg.batch_size, cfg);
      auto x = prepare_batch(batch.images.to(device), mean, stddev);
      auto y = batch.labels.to(device);

      auto logits = model->forward(x);
      auto loss = torch::nn::functional::cross_entropy(logits.to(torch::kFloat), y);
      running_loss += loss.item<double>();  // EXPECT: tensor-sync-in-loop
      train_logits.push_back(logits);  // EXPECT: tensor-graph-kept-across-iterations
      train_targets.push_back(y);

      if (step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step
                  << " loss " << running_loss / (step + 1)
                  << " headroom " << activation_headroom(model->last_hidden) << "\n";
      }

      model->zero_grad();
      scaler.scale(loss).backward();
      auto found_inf = scaler.unscale_into(model_params, master);
      const bool overflow = found_inf.item<bool>();  // LOOKALIKE: tensor-sync-in-loop -- the host must know before it can skip the step
      scaler.update(overflow);
      if (overflow) {
        continue;
      }
      clip_master_grads(master, cfg.max_grad_norm);
      decay_master_weights(master, cfg.lr, cfg.weight_decay);
      opt.step();
      copy_master_to_model(master, model_params);
    }

    auto train_acc = (torch::cat(train_logits).argmax(1) == torch::cat(train_targets))
                         .to(torch::kFloat).mean().item<double>();

    torch::NoGradGuard no_grad;
    model->eval();
    auto vx = prepare_batch(val_images, mean, stddev);
    auto vy = val.labels.to(device);  // EXPECT: tensor-clone-in-loop
    std::vector<torch::Tensor> val_logits;
    for (const auto& chunk : vx.split(128)) {
      val_logits.push_back(model->forward(chunk));  // LOOKALIKE: tensor-graph-kept-across-iterations -- evaluated under NoGradGuard, no graph is recorded
    }
    auto val_acc = (torch::cat(val_logits).argmax(1) == vy).to(torch::kFloat).mean().item<double>();
    std::cout << "epoch " << epoch << " train acc " << train_acc << " val acc " << val_acc
              << " skipped steps " << scaler.skipped() << "\n";
    torch::save(master, cfg.checkpoint);
  }
  return 0;
}
