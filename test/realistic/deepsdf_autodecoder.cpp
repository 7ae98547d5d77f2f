// DeepSDF auto-decoder: one latent code per training shape (an Embedding table
// optimised together with the decoder), an MLP with a skip connection mapping
// (code, Fourier features of xyz) to a truncated signed distance, and test-time
// latent optimisation for shapes that were not in the training set.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct SdfConfig {
  int64_t latent_dim = 256;
  int64_t hidden = 512;
  int64_t num_layers = 8;
  int64_t skip_layer = 4;
  int64_t pe_freqs = 6;
  double dropout = 0.2;
  double clamp_dist = 0.1;
  double code_reg = 1e-4;
  double max_code_norm = 1.0;
  double jitter = 0.0025;
};

// One batch of shapes: SDF samples are rows of (x, y, z, sdf).
struct ShapeBatch {
  torch::Tensor shape_idx;  // [S], int64
  torch::Tensor samples;    // [S, N, 4]
};

// Centres a surface point cloud at the origin and scales it into the unit sphere.
torch::Tensor normalize_points(const torch::Tensor& xyz) {
  auto center = xyz.mean(0, true);
  auto radius = (xyz - center).norm(2, 1).max();
  torch::Tensor out = xyz;
  // FACT: p = torch.randn(10, 3); o = p; o.sub_(p.mean(0, True)).div_(2.0); assert shares_storage(o, p)
  out.sub_(center).div_(radius * 1.03);  // EXPECT: tensor-alias-then-mutate
  return out;
}

class FourierFeaturesImpl : public nn::Module {
 public:
  explicit FourierFeaturesImpl(int64_t num_freqs) {
    freqs_ = register_buffer("freqs", torch::pow(2.0, torch::arange(num_freqs, torch::kFloat)) * M_PI);
  }

  // [N, 3] -> [N, 3 + 6 L], frequency-major like NeRF's encoding
  torch::Tensor forward(const torch::Tensor& xyz) {
    const auto n = xyz.size(0);
    auto ang = xyz.unsqueeze(-1) * freqs_;              // [N, 3, L]
    auto enc = torch::cat({ang.sin(), ang.cos()}, -1);  // [N, 3, 2L]
    // FACT: e = torch.cat([torch.randn(5, 3, 4).sin(), torch.randn(5, 3, 4).cos()], -1); assert is_copy_of(e.transpose(1, 2).reshape(5, -1), e)
    auto grouped = enc.transpose(1, 2).reshape({n, -1});  // EXPECT: tensor-reshape-non-contiguous
    return torch::cat({xyz, grouped}, 1);
  }

  int64_t out_dim() const { return 3 + 6 * freqs_.size(0); }

 private:
  torch::Tensor freqs_;
};
TORCH_MODULE(FourierFeatures);

class SdfDecoderImpl : public nn::Module {
 public:
  SdfDecoderImpl(const SdfConfig& cfg, int64_t point_dim)
      : skip_(cfg.skip_layer), dropout_(cfg.dropout) {
    const auto in_dim = cfg.latent_dim + point_dim;
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      int64_t fan_in = i == 0 ? in_dim : cfg.hidden;
      if (i == skip_) fan_in += in_dim;
      layers_.push_back(register_module("fc" + std::to_string(i), nn::Linear(fan_in, cfg.hidden)));
    }
    head_ = register_module("head", nn::Linear(cfg.hidden, 1));
  }

  // input: [N, latent + point features] -> sdf in (-1, 1), [N, 1]
  torch::Tensor forward(const torch::Tensor& input) {
    auto h = input;
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (static_cast<int64_t>(i) == skip_) h = torch::cat({h, input}, 1);
      h = layers_[i](h);
      F::relu(h, F::ReLUFuncOptions(true));  // LOOKALIKE: tensor-inplace-on-saved -- Linear saves its input, not its output
      h = F::dropout(h, F::DropoutFuncOptions().p(dropout_).training(is_training()));
    }
    return torch::tanh(head_(h));
  }

 private:
  int64_t skip_;
  double dropout_;
  std::vector<nn::Linear> layers_;
  nn::Linear head_{nullptr};
};
TORCH_MODULE(SdfDecoder);

class AutoDecoderTrainer {
 public:
  AutoDecoderTrainer(const SdfConfig& cfg, int64_t num_shapes)
      : cfg_(cfg),
        device_(torch::kCUDA),
        pe_(cfg.pe_freqs),
        decoder_(cfg, 3 + 6 * cfg.pe_freqs),
        codes_(nn::EmbeddingOptions(num_shapes, cfg.latent_dim)) {
    nn::init::normal_(codes_->weight, 0.0, 0.01);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    pe_->to(device_);
    decoder_->to(device_);
    codes_->to(device_);
    opt_dec_ = std::make_unique<torch::optim::Adam>(decoder_->parameters(), torch::optim::AdamOptions(5e-4));
    opt_codes_ = std::make_unique<torch::optim::Adam>(codes_->parameters(), torch::optim::AdamOptions(1e-3));
  }

  double train_epoch(const std::vector<ShapeBatch>& batches, int64_t epoch) {
    decoder_->train();
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device_));
    for (const auto& batch : batches) {
      auto samples = batch.samples.to(device_);
      const auto num_shapes = samples.size(0);
      const auto per_shape = samples.size(1);
      // FACT: s = torch.randn(3, 7, 4); assert is_view_of(s.reshape(-1, 4), s)
      auto flat = samples.reshape({-1, 4});  // LOOKALIKE: tensor-reshape-non-contiguous -- the batch is contiguous, so this is a view
      auto xyz = flat.narrow(1, 0, 3);
      auto jittered = xyz.clone();  // EXPECT: tensor-unnecessary-clone
      jittered.add_(torch::randn_like(xyz) * cfg_.jitter);
      auto sdf_gt = flat.narrow(1, 3, 1).clamp(-cfg_.clamp_dist, cfg_.clamp_dist);

      auto lat = codes_(batch.shape_idx.to(device_));  // [S, D]
      auto lat_rep = lat.repeat_interleave(per_shape, 0);  // [S * N, D]
      auto pred = decoder_(torch::cat({lat_rep, pe_(jittered)}, 1));
      pred.clamp_(-cfg_.clamp_dist, cfg_.clamp_dist);  // EXPECT: tensor-inplace-on-saved
      auto recon = F::l1_loss(pred, sdf_gt, F::L1LossFuncOptions().reduction(torch::kSum)) /
                   static_cast<double>(num_shapes * per_shape);
      const double ramp = std::min(1.0, static_cast<double>(epoch) / 100.0);
      auto loss = recon + cfg_.code_reg * ramp * lat.pow(2).sum(1).mean();

      opt_dec_->zero_grad();
      opt_codes_->zero_grad();
      loss.backward();
      opt_dec_->step();
      opt_codes_->step();
      // DeepSDF keeps every code inside a ball of radius max_code_norm.
      codes_->weight.renorm_(2, 0, cfg_.max_code_norm);  // EXPECT: tensor-inplace-on-leaf
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
    }
    return epoch_loss.item<double>() / static_cast<double>(std::max<size_t>(1, batches.size()));
  }

  // Shapes whose training samples the network fits worst, for rendering.
  std::vector<int64_t> worst_shapes(const std::vector<ShapeBatch>& batches, int64_t k) {
    decoder_->eval();
    std::vector<torch::Tensor> errors;
    std::vector<torch::Tensor> ids;
    for (const auto& batch : batches) {
      auto samples = batch.samples.to(device_);
      const auto num_shapes = samples.size(0);
      const auto per_shape = samples.size(1);
      auto lat = codes_(batch.shape_idx.to(device_));
      // FACT: l = torch.randn(4, 8); assert raises(lambda: l.unsqueeze(1).expand(-1, 5, -1).view(20, -1), "view size is not compatible")
      auto lat_rep = lat.unsqueeze(1).expand({-1, per_shape, -1}).view({num_shapes * per_shape, -1});  // EXPECT: tensor-view-non-contiguous
      auto flat = samples.view({-1, 4});
      auto pred = decoder_(torch::cat({lat_rep, pe_(flat.narrow(1, 0, 3))}, 1));
      auto err = (pred - flat.narrow(1, 3, 1)).abs();
      // FACT: e = (torch.randn(12, 1) - torch.randn(12, 1)).abs(); assert is_view_of(e.view(3, 4), e)
      errors.push_back(err.view({num_shapes, per_shape}).mean(1));  // EXPECT: tensor-graph-kept-across-iterations // LOOKALIKE: tensor-view-non-contiguous -- abs() of a fresh difference is contiguous
      ids.push_back(batch.shape_idx);
    }
    auto all = torch::cat(errors).to(torch::kCPU);
    auto top = std::get<1>(all.topk(std::min<int64_t>(k, all.size(0))));
    auto shape_ids = torch::cat(ids).index_select(0, top).contiguous();
    return std::vector<int64_t>(shape_ids.data_ptr<int64_t>(), shape_ids.data_ptr<int64_t>() + shape_ids.numel());
  }

  // Test-time optimisation of a latent code for an unseen shape's samples [N, 4].
  torch::Tensor reconstruct(const torch::Tensor& samples, int64_t iters, double lr, double tol) {
    decoder_->eval();
    auto latent = torch::zeros({1, cfg_.latent_dim}).normal_(0.0, 0.01);
    latent.requires_grad_(true);
    torch::optim::Adam opt({latent}, torch::optim::AdamOptions(lr));

    auto enc = pe_(normalize_points(samples.narrow(1, 0, 3)).to(device_));
    auto gt = samples.narrow(1, 3, 1).clamp(-cfg_.clamp_dist, cfg_.clamp_dist).to(device_);

    std::vector<torch::Tensor> snapshots;
    for (int64_t it = 0; it < iters; ++it) {
      opt.zero_grad();
      auto input = torch::cat({latent.expand({enc.size(0), -1}), enc}, 1);  // EXPECT: tensor-device-mismatch
      auto pred = decoder_(input);
      auto loss = F::l1_loss(pred, gt) + cfg_.code_reg * latent.pow(2).sum();
      loss.backward();
      opt.step();
      {
        torch::NoGradGuard no_grad;
        latent.renorm_(2, 0, cfg_.max_code_norm);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
      }
      if (it % 100 == 0) snapshots.push_back(latent.detach().clone());  // LOOKALIKE: tensor-clone-in-loop -- latent changes every step and each copy is kept
      if (loss.item<float>() < tol) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides when to stop
    }
    std::cout << "kept " << snapshots.size() << " latent snapshots\n";
    return latent.detach();
  }

 private:
  SdfConfig cfg_;
  torch::Device device_;
  FourierFeatures pe_;
  SdfDecoder decoder_;
  nn::Embedding codes_;
  std::unique_ptr<torch::optim::Adam> opt_dec_;
  std::unique_ptr<torch::optim::Adam> opt_codes_;
};
