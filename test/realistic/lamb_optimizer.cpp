// Hand-written LAMB: Adam moments with bias correction, decoupled weight decay
// folded into the update, then a per-parameter trust ratio ||w|| / ||update||.
// Trains a small MLP-Mixer on synthetic images with a large batch.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <deque>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct LambOptions {
  double lr = 2e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  double clamp_value = 10.0;
  double grad_scale = 1.0;
};

struct LambParamState {
  int64_t step = 0;
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
};

class Lamb {
 public:
  Lamb(std::vector<torch::Tensor> params, LambOptions opts)
      : params_(std::move(params)), opts_(opts), state_(params_.size()) {
    lr_scale_ = torch::ones({static_cast<int64_t>(params_.size())}, torch::kDouble);
    for (const auto& p : params_) {
      decay_.push_back(p.dim() > 1);
    }
  }

  void set_lr_scale(size_t i, double s) { lr_scale_[static_cast<int64_t>(i)] = s; }

  void zero_grad() {
    for (auto& p : params_) {
      auto& g = p.mutable_grad();
      if (g.defined()) {
        g.detach_();
        g.zero_(); // LOOKALIKE: tensor-inplace-on-detached -- clearing the gradient buffer is the point, nothing in a graph reads it
      }
    }
  }

  void step() {
    torch::NoGradGuard no_grad;
    trust_log_.clear();
    for (size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      if (!p.grad().defined()) {
        continue;
      }
      auto& st = state_[i];
      if (!st.exp_avg.defined()) {
        st.exp_avg = torch::zeros_like(p);
        st.exp_avg_sq = torch::zeros_like(p);
      }
      st.step += 1;

      auto grad = p.grad().clone(); // EXPECT: tensor-unnecessary-clone
      grad.div_(opts_.grad_scale);
      st.exp_avg.mul_(opts_.beta1).add_(grad, 1.0 - opts_.beta1);
      st.exp_avg_sq.mul_(opts_.beta2).addcmul_(grad, grad, 1.0 - opts_.beta2);

      const double bc1 = 1.0 - std::pow(opts_.beta1, static_cast<double>(st.step));
      const double bc2 = 1.0 - std::pow(opts_.beta2, static_cast<double>(st.step));
      // FACT: v = torch.rand(4, 3); d = (v / 0.9).sqrt_().add_(1e-6); assert is_copy_of(d, v)
      auto denom = (st.exp_avg_sq / bc2).sqrt_().add_(opts_.eps); // LOOKALIKE: tensor-alias-then-mutate -- the division returns a new tensor, exp_avg_sq is untouched
      // FACT: m = torch.randn(4, 3); u = m; u.div_(2.0); assert shares_storage(u, m) and m._version == 1
      auto update = st.exp_avg;
      update.div_(denom).div_(bc1); // EXPECT: tensor-alias-then-mutate

      torch::Tensor step_dir = update;
      if (decay_[i] && opts_.weight_decay != 0.0) {
        auto decay = p.detach();
        decay.mul_(opts_.weight_decay); // EXPECT: tensor-inplace-on-detached
        step_dir = update + decay;
      }

      auto w_norm = p.norm().clamp_max(opts_.clamp_value);
      auto u_norm = step_dir.norm();
      auto trust = torch::where(w_norm.gt(0) & u_norm.gt(0), w_norm / u_norm,
                                torch::ones({1})); // EXPECT: tensor-device-mismatch
      trust_log_.push_back(trust.item<double>()); // EXPECT: tensor-sync-in-loop

      auto scaled = step_dir.mul(trust).mul(lr_scale_[static_cast<int64_t>(i)]); // LOOKALIKE: tensor-device-mismatch -- indexing lr_scale_ gives a 0-dim CPU tensor, allowed with CUDA operands
      p.add_(scaled, -opts_.lr); // LOOKALIKE: tensor-inplace-on-leaf -- step() runs under NoGradGuard
    }
  }

  void save_state(const std::string& path) const {
    torch::serialize::OutputArchive ar;
    for (size_t i = 0; i < state_.size(); ++i) {
      if (!state_[i].exp_avg.defined()) {
        continue;
      }
      const auto key = std::to_string(i);
      ar.write("exp_avg." + key, state_[i].exp_avg.to(torch::kDouble));
      ar.write("exp_avg_sq." + key, state_[i].exp_avg_sq.to(torch::kDouble));
      ar.write("step." + key, torch::tensor(state_[i].step));
    }
    ar.save_to(path);
  }

  void load_state(const std::string& path) {
    torch::serialize::InputArchive ar;
    ar.load_from(path);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < state_.size(); ++i) {
      const auto key = std::to_string(i);
      torch::Tensor m, v, s;
      if (!ar.try_read("exp_avg." + key, m)) {
        continue;
      }
      ar.read("exp_avg_sq." + key, v);
      ar.read("step." + key, s);
      auto& st = state_[i];
      st.exp_avg = torch::zeros_like(params_[i]);
      st.exp_avg_sq = torch::zeros_like(params_[i]);
      st.exp_avg.copy_(m); // EXPECT: tensor-copy-narrowing
      st.exp_avg_sq.copy_(v.to(st.exp_avg_sq.scalar_type())); // LOOKALIKE: tensor-copy-narrowing -- the conversion is spelled out before the copy
      st.step = s.item<int64_t>();
    }
  }

  const std::vector<double>& trust_ratios() const { return trust_log_; }

 private:
  std::vector<torch::Tensor> params_;
  LambOptions opts_;
  std::vector<LambParamState> state_;
  std::vector<bool> decay_;
  torch::Tensor lr_scale_;
  std::vector<double> trust_log_;
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, in))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2->forward(torch::gelu(fc1->forward(x)));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

struct MixerBlockImpl : torch::nn::Module {
  MixerBlockImpl(int64_t tokens, int64_t channels)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})))),
        token_mlp(register_module("token_mlp", Mlp(tokens, tokens * 2))),
        channel_mlp(register_module("channel_mlp", Mlp(channels, channels * 4))) {}

  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), c = x.size(2);
    auto yt = norm1->forward(x).transpose(1, 2);
    // FACT: yt = torch.nn.functional.layer_norm(torch.randn(2, 5, 6), (6,)).transpose(1, 2); assert raises(lambda: yt.view(-1, 5), "view size is not compatible")
    auto mixed = token_mlp->forward(yt.view({-1, t})); // EXPECT: tensor-view-non-contiguous
    // FACT: m = torch.nn.functional.linear(torch.randn(12, 5), torch.randn(5, 5)); assert is_view_of(m.view(2, 6, 5), m)
    x = x + mixed.view({b, c, t}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- the linear output is contiguous, the transpose comes after the view
    return x + channel_mlp->forward(norm2->forward(x));
  }

  torch::nn::LayerNorm norm1, norm2;
  Mlp token_mlp, channel_mlp;
};
TORCH_MODULE(MixerBlock);

struct MixerImpl : torch::nn::Module {
  MixerImpl(int64_t image, int64_t patch_size, int64_t channels, int64_t depth,
            int64_t classes)
      : patch(register_module("patch", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, channels, patch_size)
                                                             .stride(patch_size)))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({channels})))),
        head(register_module("head", torch::nn::Linear(channels, classes))) {
    const int64_t tokens = (image / patch_size) * (image / patch_size);
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < depth; ++i) {
      blocks->push_back(MixerBlock(tokens, channels));
    }
  }

  torch::Tensor forward(const torch::Tensor& images) {
    auto feats = patch->forward(images);
    // FACT: f = torch.nn.functional.conv2d(torch.randn(2, 3, 8, 8), torch.randn(6, 3, 4, 4), stride=4); assert is_view_of(f.flatten(2), f)
    auto tokens = feats.flatten(2).transpose(1, 2); // LOOKALIKE: tensor-reshape-non-contiguous -- the conv output is contiguous, flatten(2) is a view and the transpose follows it
    for (const auto& blk : *blocks) {
      tokens = blk->as<MixerBlock>()->forward(tokens);
    }
    return head->forward(norm->forward(tokens).mean(1));
  }

  torch::nn::Conv2d patch;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
  torch::nn::ModuleList blocks{nullptr};
};
TORCH_MODULE(Mixer);

void load_pretrained_patch(Mixer& model, const torch::Tensor& weight) {
  model->patch->weight.copy_(weight); // EXPECT: tensor-inplace-on-leaf
}

void train(Mixer& model, Lamb& opt, const torch::Tensor& images,
           const torch::Tensor& labels, const torch::Tensor& val_images,
           const torch::Tensor& val_labels, torch::Device device, int64_t epochs,
           int64_t batch_size) {
  const int64_t n = images.size(0);
  std::deque<torch::Tensor> recent;
  const size_t plateau_window = 20;
  auto ema_loss = torch::zeros({}, device);
  std::vector<torch::Tensor> best_params;
  double best_acc = 0.0;

  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    auto perm = torch::randperm(n);
    for (int64_t start = 0; start + batch_size <= n; start += batch_size) {
      auto idx = perm.narrow(0, start, batch_size);
      auto x = images.index_select(0, idx).to(device);
      auto y = labels.index_select(0, idx).to(device);

      opt.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      opt.step();

      ema_loss = ema_loss * 0.98 + loss.detach() * 0.02; // LOOKALIKE: tensor-graph-kept-across-iterations -- the detached loss carries no graph
      recent.push_back(loss); // EXPECT: tensor-graph-kept-across-iterations
      if (recent.size() > plateau_window) {
        recent.pop_front();
      }
    }
    const double window_mean = torch::stack(std::vector<torch::Tensor>(recent.begin(), recent.end()))
                                   .mean()
                                   .item<double>();

    torch::NoGradGuard no_grad;
    model->eval();
    auto vx = val_images.to(device); // EXPECT: tensor-clone-in-loop
    auto vy = val_labels.to(device); // EXPECT: tensor-clone-in-loop
    const double acc =
        model->forward(vx).argmax(1).eq(vy).to(torch::kFloat).mean().item<double>();
    std::cout << "epoch " << epoch << " ema loss " << ema_loss.item<double>()
              << " window " << window_mean << " val acc " << acc << "\n";
    if (acc > best_acc) {
      best_acc = acc;
      best_params.clear();
      for (const auto& p : model->parameters()) {
        best_params.push_back(p.detach().clone()); // LOOKALIKE: tensor-unnecessary-clone -- later optimizer steps rewrite p in place, the snapshot must own its storage
      }
    }
  }
  std::cout << "best val acc " << best_acc << " last trust ratios "
            << opt.trust_ratios().size() << "\n";
}

}  // namespace

int main() {
  torch::manual_seed(3);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Mixer model(32, 4, 128, 4, 10);
  load_pretrained_patch(model, torch::randn({128, 3, 4, 4}) * 0.02);
  model->to(device);

  LambOptions opts;
  opts.lr = 4e-3;
  Lamb opt(model->parameters(), opts);
  opt.set_lr_scale(model->parameters().size() - 1, 0.5);

  auto images = torch::randn({4096, 3, 32, 32});
  auto labels = torch::randint(0, 10, {4096}, torch::kLong);
  auto val_images = torch::randn({512, 3, 32, 32});
  auto val_labels = torch::randint(0, 10, {512}, torch::kLong);

  train(model, opt, images, labels, val_images, val_labels, device, 5, 1024);
  opt.save_state("lamb_state.pt");
  opt.load_state("lamb_state.pt");
  return 0;
}
