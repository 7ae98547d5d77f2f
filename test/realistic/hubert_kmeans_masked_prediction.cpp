// HuBERT-style pre-training in two iterations: k-means pseudo-labels over
// MFCC frames, masked prediction over span-masked inputs, then re-clustering
// of an intermediate transformer layer for the second iteration.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace F = torch::nn::functional;

namespace hubert {

struct HubertConfig {
  int64_t in_dim = 39;  // 13 MFCC + deltas + delta-deltas
  int64_t dim = 256;
  int64_t layers = 6;
  int64_t heads = 4;
  int64_t ffn = 1024;
  int64_t final_dim = 128;
  int64_t max_len = 1024;
  int64_t num_clusters = 100;
  int64_t feature_layer = 4;
  double mask_prob = 0.08;
  int64_t mask_span = 10;
  double logit_temp = 0.1;
  double recon_weight = 1.0;
  double usage_weight = 0.1;
  int64_t kmeans_iters = 50;
  double lr = 5e-4;
  int64_t epochs = 20;
  int64_t log_every = 100;
};

// Provided by the feature pipeline: equal-length random crops, CPU.
std::vector<torch::Tensor> load_mfcc_crops(const std::string& manifest, int64_t batch_size, int64_t frames);

torch::Tensor sqdist(const torch::Tensor& x, const torch::Tensor& c) {
  return x.pow(2).sum(1, true) - 2.0 * x.matmul(c.t()) + c.pow(2).sum(1).unsqueeze(0);
}

class KMeans {
 public:
  KMeans(int64_t k, torch::Device device) : k_(k), device_(device) {}

  void fit(const torch::Tensor& feats, int64_t iters, double tol) {
    const int64_t n = feats.size(0);
    auto perm = torch::randperm(n, torch::TensorOptions().dtype(torch::kLong).device(device_));
    centroids_ = feats.to(device_).index_select(0, perm.narrow(0, 0, k_));
    for (int64_t it = 0; it < iters; ++it) {
      auto x = feats.to(device_);  // EXPECT: tensor-clone-in-loop
      auto prev = centroids_.clone();  // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- centroids change every pass and copy_ below overwrites them
      auto ids = sqdist(x, centroids_).argmin(1);
      auto sums = torch::zeros_like(centroids_).index_add_(0, ids, x);
      auto cnt = torch::bincount(ids, {}, k_).to(x.scalar_type());
      centroids_.copy_(sums / cnt.clamp_min(1.0).unsqueeze(1));

      auto empty = cnt.eq(0).nonzero().squeeze(1);
      if (empty.numel() > 0) {
        // Re-seed empty clusters next to the most populated ones.
        auto big = std::get<1>(cnt.topk(empty.numel()));
        auto jitter = 1e-3 * torch::randn({empty.numel(), centroids_.size(1)}, centroids_.options());
        // FACT: is_copy_of((c:=torch.randn(8,4)).index_select(0, torch.tensor([1,2])), c)
        centroids_.index_copy_(0, empty, centroids_.index_select(0, big) + jitter);  // LOOKALIKE: tensor-inplace-overlap -- index_select gathered the source into new storage
      }
      const double shift = (centroids_ - prev).pow(2).sum(1).max().item<double>();  // LOOKALIKE: tensor-sync-in-loop -- the value decides the early stop
      if (shift < tol) break;
    }
  }

  torch::Tensor assign(const torch::Tensor& feats) const {
    auto x = feats.to(centroids_.device()).clone();  // EXPECT: tensor-unnecessary-clone
    return sqdist(x, centroids_).argmin(1);
  }

  const torch::Tensor& centroids() const { return centroids_; }

 private:
  int64_t k_;
  torch::Device device_;
  torch::Tensor centroids_;
};

// Span masking: starts drawn with mask_prob, each start covers `span` frames.
torch::Tensor span_mask(int64_t B, int64_t T, double prob, int64_t span) {
  auto mask = torch::rand({B, T}) < prob;
  for (int64_t k = 1; k < span; ++k) {
    // FACT: (m:=torch.zeros(2,10,dtype=torch.bool)).index_fill_(1,torch.tensor([2]),True).narrow(1,1,9).logical_or_(m.narrow(1,0,9)) is not None and int(m[0].sum()) > 2
    mask.narrow(1, 1, T - 1).logical_or_(mask.narrow(1, 0, T - 1));  // EXPECT: tensor-inplace-overlap
  }
  return mask;
}

struct PredictorOutput {
  torch::Tensor logits;
  torch::Tensor tap;       // intermediate layer, time-major
  torch::Tensor unmasked;  // reconstruction target
  torch::Tensor recon;
};

class MaskedPredictorImpl : public torch::nn::Module {
 public:
  explicit MaskedPredictorImpl(const HubertConfig& cfg)
      : dim_(cfg.dim), feature_layer_(cfg.feature_layer), logit_temp_(cfg.logit_temp) {
    proj_ = register_module("proj", torch::nn::Linear(cfg.in_dim, cfg.dim));
    ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    for (int64_t i = 0; i < cfg.layers; ++i) {
      layers_.push_back(register_module(
          "layer" + std::to_string(i),
          torch::nn::TransformerEncoderLayer(
              torch::nn::TransformerEncoderLayerOptions(cfg.dim, cfg.heads).dim_feedforward(cfg.ffn).dropout(0.1))));
    }
    final_proj_ = register_module("final_proj", torch::nn::Linear(cfg.dim, cfg.final_dim));
    recon_ = register_module("recon", torch::nn::Linear(cfg.dim, cfg.dim));
    pos_emb_ = register_parameter("pos_emb", torch::randn({cfg.max_len, cfg.dim}) * 0.02);
    // FACT: not raises(lambda: torch.nn.Parameter(torch.empty(3,4).normal_(0.0,0.02)))
    label_emb_ = register_parameter("label_emb", torch::empty({cfg.num_clusters, cfg.final_dim}).normal_(0.0, 0.02));  // LOOKALIKE: tensor-inplace-on-leaf -- normal_ runs before the tensor becomes a parameter
    mask_emb_ = register_parameter("mask_emb", torch::empty({cfg.dim}));
    // FACT: raises(lambda: torch.nn.Parameter(torch.empty(4)).uniform_(), "leaf Variable")
    mask_emb_.uniform_();  // EXPECT: tensor-inplace-on-leaf
  }

  PredictorOutput forward(const torch::Tensor& feats, const torch::Tensor& mask) {
    const int64_t B = feats.size(0), T = feats.size(1);
    auto x = ln_(proj_(feats));
    auto unmasked = x;
    // FACT: (u:=(x:=torch.randn(3,4))) is not None and x.index_put_((torch.tensor([True,False,True]),), torch.zeros(4)) is not None and bool(u[0].eq(0).all())
    x.index_put_({mask}, mask_emb_);  // EXPECT: tensor-alias-then-mutate

    // FACT: is_copy_of((x:=torch.randn(1,5,8)).transpose(0,1) * 16.0, x)
    auto h = x.transpose(0, 1) * std::sqrt(double(dim_));
    h.add_(pos_emb_.narrow(0, 0, T).unsqueeze(1));  // LOOKALIKE: tensor-alias-then-mutate -- the scaling already wrote a new tensor, x is untouched
    PredictorOutput out;
    for (size_t i = 0; i < layers_.size(); ++i) {
      h = layers_[i]->forward(h);
      if (static_cast<int64_t>(i) == feature_layer_) out.tap = h;
    }

    // FACT: is_copy_of((y:=torch.randn(5,2,8).transpose(0,1)).reshape(10,8), y)
    auto flat = h.transpose(0, 1).reshape({B * T, dim_});  // EXPECT: tensor-reshape-non-contiguous
    auto z = F::normalize(final_proj_(flat), F::NormalizeFuncOptions().dim(-1));
    // FACT: not backward_fails(lambda: ((z:=torch.nn.functional.normalize(torch.randn(3,4,requires_grad=True)*1, dim=-1)).div_(0.1) @ torch.randn(4,5)).sum().backward())
    z.div_(logit_temp_);  // LOOKALIKE: tensor-inplace-on-saved -- the division inside normalize saves its operands, not its result
    auto c = F::normalize(label_emb_, F::NormalizeFuncOptions().dim(-1));
    out.logits = z.matmul(c.t());
    out.unmasked = unmasked.reshape({B * T, dim_});
    out.recon = recon_(flat);
    return out;
  }

 private:
  int64_t dim_, feature_layer_;
  double logit_temp_;
  torch::nn::Linear proj_{nullptr}, final_proj_{nullptr}, recon_{nullptr};
  torch::nn::LayerNorm ln_{nullptr};
  std::vector<torch::nn::TransformerEncoderLayer> layers_;
  torch::Tensor pos_emb_, label_emb_, mask_emb_;
};
TORCH_MODULE(MaskedPredictor);

torch::Tensor extract_features(MaskedPredictor& model, const std::vector<torch::Tensor>& batches, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> bank;
  for (const auto& b : batches) {
    auto feats = b.to(device);
    auto none = torch::zeros({feats.size(0), feats.size(1)}, torch::TensorOptions().dtype(torch::kBool).device(device));
    auto out = model->forward(feats, none);
    // FACT: raises(lambda: torch.randn(5,2,8).transpose(0,1).view(-1,8), "view size is not compatible")
    auto frames = out.tap.transpose(0, 1).view({-1, out.tap.size(2)});  // EXPECT: tensor-view-non-contiguous
    bank.push_back(frames.cpu());  // LOOKALIKE: tensor-graph-kept-across-iterations -- NoGradGuard: no graph behind these features
  }
  return torch::cat(bank);
}

torch::Tensor make_labels(const KMeans& km, const torch::Tensor& bank, int64_t chunk) {
  auto store = torch::empty({bank.size(0)}, torch::kInt);  // 100 clusters fit easily in int32
  for (int64_t off = 0; off < bank.size(0); off += chunk) {
    const int64_t n = std::min(chunk, bank.size(0) - off);
    auto ids = km.assign(bank.narrow(0, off, n));
    store.narrow(0, off, n).copy_(ids.to(store.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing, tensor-device-mismatch -- the conversion is explicit, and copy_ may cross devices
  }
  return store;
}

void train_iteration(MaskedPredictor& model, const std::vector<torch::Tensor>& batches, const torch::Tensor& labels_store,
                     const HubertConfig& cfg, torch::Device device) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(0.01));
  model->train();
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::vector<torch::Tensor> history;
    int64_t offset = 0;
    for (const auto& batch : batches) {
      auto feats = batch.to(device);
      const int64_t B = feats.size(0), T = feats.size(1);
      auto labels = labels_store.narrow(0, offset, B * T).to(device).to(torch::kLong);
      offset += B * T;

      auto mask = span_mask(B, T, cfg.mask_prob, cfg.mask_span);
      auto mask_d = mask.to(device);
      auto out = model->forward(feats, mask_d);

      auto ce = F::cross_entropy(out.logits, labels, F::CrossEntropyFuncOptions().reduction(torch::kNone));
      auto weight = mask.view({-1}).to(torch::kFloat);
      auto pred_loss = (ce * weight).sum() / weight.sum().clamp_min(1.0);  // EXPECT: tensor-device-mismatch
      auto m = mask_d.view({-1});
      auto recon = F::mse_loss(out.recon.index({m}), out.unmasked.index({m}).detach());

      // Keep the average cluster usage spread out on masked frames.
      auto probs = torch::softmax(out.logits, -1);
      // FACT: backward_fails(lambda: (lambda p: (p.clamp_min_(1e-7), p.mean(0).log().sum().backward()))(torch.randn(4,5,requires_grad=True).softmax(-1)))
      probs.clamp_min_(1e-7);  // EXPECT: tensor-inplace-on-saved
      auto usage = probs.index({m}).mean(0);
      auto loss = pred_loss + cfg.recon_weight * recon + cfg.usage_weight * (usage * usage.log()).sum();

      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 10.0);
      opt.step();

      history.push_back(pred_loss);  // EXPECT: tensor-graph-kept-across-iterations
      if (step % cfg.log_every == 0) {
        std::cout << "step " << step << " loss " << loss.item<double>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
      ++step;
    }
    std::cout << "epoch " << epoch << " masked CE " << torch::stack(history).mean().item<double>() << std::endl;
  }
}

}  // namespace hubert

int main(int argc, char** argv) {
  using namespace hubert;
  if (argc < 2) {
    std::cerr << "usage: hubert_pretrain manifest.tsv" << std::endl;
    return 1;
  }
  HubertConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto batches = load_mfcc_crops(argv[1], 16, 250);

  // Iteration 1: cluster the MFCC frames themselves.
  std::vector<torch::Tensor> frames;
  // FACT: is_view_of((f:=torch.randn(2,7,8)).flatten(0,1), f)
  for (const auto& b : batches) frames.push_back(b.flatten(0, 1));  // LOOKALIKE: tensor-reshape-non-contiguous -- the crops are dense, flatten is a view
  auto bank = torch::cat(frames);
  KMeans km1(cfg.num_clusters, device);
  km1.fit(bank, cfg.kmeans_iters, 1e-4);
  MaskedPredictor model1(cfg);
  model1->to(device);
  train_iteration(model1, batches, make_labels(km1, bank, 1 << 16), cfg, device);

  // Iteration 2: cluster an intermediate layer of the first model.
  auto bank2 = extract_features(model1, batches, device);
  KMeans km2(cfg.num_clusters * 5, device);
  km2.fit(bank2, cfg.kmeans_iters, 1e-4);
  HubertConfig cfg2 = cfg;
  cfg2.num_clusters = cfg.num_clusters * 5;
  MaskedPredictor model2(cfg2);
  model2->to(device);
  train_iteration(model2, batches, make_labels(km2, bank2, 1 << 16), cfg2, device);
  torch::save(model2, "hubert_iter2.pt");
  return 0;
}
