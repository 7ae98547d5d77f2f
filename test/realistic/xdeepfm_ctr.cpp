// xDeepFM for click-through-rate prediction: linear part + Compressed Interaction
// Network (CIN) + plain MLP over shared field embeddings.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <iostream>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

struct XDeepFMConfig {
  std::vector<int64_t> field_dims{1000, 500, 200, 50, 3000, 20, 80, 10};
  int64_t num_dense = 13;
  int64_t embed_dim = 16;
  std::vector<int64_t> cin_layers{128, 128, 64};
  bool cin_split_half = true;
  std::vector<int64_t> mlp_layers{400, 400};
  double dropout = 0.2;
  double lr = 1e-3;
  double weight_decay = 1e-6;
  double max_embed_norm = 5.0;
  double pos_weight = 3.0;
  int64_t batch_size = 1024;
  int64_t epochs = 4;
  int64_t log_every = 100;
};

struct CtrBatch {
  torch::Tensor sparse, dense, label;
};

class CtrData {
 public:
  CtrData(const std::vector<int64_t>& ids, const std::vector<double>& dense,
          const std::vector<float>& labels, int64_t num_fields, int64_t num_dense) {
    const int64_t n = static_cast<int64_t>(labels.size());
    sparse_ = torch::empty({n, num_fields}, torch::kLong);
    dense_ = torch::empty({n, num_dense}, torch::kFloat);
    // FACT: a = torch.empty(4, 3, dtype=torch.long); a.copy_(torch.arange(12).view(4, 3)); assert a.dtype == torch.long
    sparse_.copy_(torch::from_blob(const_cast<int64_t*>(ids.data()), {n, num_fields}, torch::kLong));  // LOOKALIKE: tensor-copy-narrowing -- int64 ids into an int64 buffer
    // FACT: a = torch.empty(2, 3); a.copy_(torch.rand(2, 3, dtype=torch.float64)); assert a.dtype == torch.float32
    dense_.copy_(torch::from_blob(const_cast<double*>(dense.data()), {n, num_dense}, torch::kDouble));  // EXPECT: tensor-copy-narrowing
    label_ = torch::tensor(labels);

    // FACT: a = torch.rand(4, 3); b = a; b = torch.log1p(b.clamp_min(0)); assert is_copy_of(b, a)
    auto counts = dense_;
    counts = torch::log1p(counts.clamp_min(0));  // LOOKALIKE: tensor-alias-then-mutate -- out-of-place result rebinds the handle, dense_ is untouched
    mean_ = counts.mean(0);
    std_ = counts.std(0).clamp_min(1e-6);
    dense_ = counts;
  }

  int64_t size() const { return label_.size(0); }

  void shuffle() {
    auto perm = torch::randperm(size());
    sparse_ = sparse_.index_select(0, perm);
    dense_ = dense_.index_select(0, perm);
    label_ = label_.index_select(0, perm);
  }

  CtrBatch get(int64_t start, int64_t n) const {
    CtrBatch b{sparse_.narrow(0, start, n), dense_.narrow(0, start, n), label_.narrow(0, start, n)};
    // FACT: d = torch.randn(8, 3); b = d.narrow(0, 2, 4); assert is_view_of(b, d)
    b.dense.sub_(mean_).div_(std_);  // EXPECT: tensor-alias-then-mutate
    return b;
  }

 private:
  torch::Tensor sparse_, dense_, label_, mean_, std_;
};

class CINImpl : public torch::nn::Module {
 public:
  CINImpl(int64_t num_fields, const std::vector<int64_t>& layer_sizes, bool split_half)
      : split_half_(split_half) {
    int64_t prev = num_fields;
    for (size_t i = 0; i < layer_sizes.size(); ++i) {
      auto conv = torch::nn::Conv1d(torch::nn::Conv1dOptions(num_fields * prev, layer_sizes[i], 1));
      convs_.push_back(register_module("conv" + std::to_string(i), conv));
      int64_t out = layer_sizes[i];
      if (split_half_ && i + 1 < layer_sizes.size()) out /= 2;
      prev = out;
      output_dim_ += out;
    }
  }

  torch::Tensor forward(const torch::Tensor& x0) {
    const int64_t batch = x0.size(0), dim = x0.size(2);
    auto x0_cols = x0.permute({2, 0, 1}).unsqueeze(-1);
    torch::Tensor h = x0;
    std::vector<torch::Tensor> pooled;
    for (size_t i = 0; i < convs_.size(); ++i) {
      auto outer = torch::matmul(x0_cols, h.permute({2, 0, 1}).unsqueeze(-2));
      // FACT: c = torch.randn(3, 4, 5).transpose(1, 2).permute(2, 0, 1).unsqueeze(-1); o = torch.matmul(c, c.transpose(-1, -2)); assert is_view_of(o.permute(1, 2, 3, 0).reshape(3, 25, 4), o)
      auto z = outer.permute({1, 2, 3, 0}).reshape({batch, -1, dim});  // LOOKALIKE: tensor-reshape-non-contiguous -- merges two dims that stay adjacent after the permute: a view
      z = torch::relu(convs_[i]->forward(z));
      if (split_half_ && i + 1 < convs_.size()) {
        auto halves = z.split(z.size(1) / 2, 1);
        h = halves[0];
        pooled.push_back(halves[1]);
      } else {
        h = z;
        pooled.push_back(z);
      }
    }
    return torch::cat(pooled, 1).sum(2);
  }

  int64_t output_dim() const { return output_dim_; }

 private:
  bool split_half_;
  int64_t output_dim_ = 0;
  std::vector<torch::nn::Conv1d> convs_;
};
TORCH_MODULE(CIN);

class XDeepFMImpl : public torch::nn::Module {
 public:
  explicit XDeepFMImpl(const XDeepFMConfig& cfg) {
    const int64_t num_fields = static_cast<int64_t>(cfg.field_dims.size());
    std::vector<int64_t> offs(cfg.field_dims.size(), 0);
    for (size_t i = 1; i < offs.size(); ++i) offs[i] = offs[i - 1] + cfg.field_dims[i - 1];
    const int64_t vocab = offs.back() + cfg.field_dims.back();
    offsets_ = torch::tensor(offs).unsqueeze(0);

    embedding = register_module("embedding", torch::nn::Embedding(vocab, cfg.embed_dim));
    linear_emb = register_module("linear_emb", torch::nn::Embedding(vocab, 1));
    dense_proj = register_module("dense_proj", torch::nn::Linear(cfg.num_dense, cfg.embed_dim));
    emb_norm = register_module("emb_norm", torch::nn::BatchNorm1d(cfg.embed_dim));
    cin = register_module("cin", CIN(num_fields + 1, cfg.cin_layers, cfg.cin_split_half));

    torch::nn::Sequential mlp;
    int64_t in = (num_fields + 1) * cfg.embed_dim;
    for (int64_t width : cfg.mlp_layers) {
      mlp->push_back(torch::nn::Linear(in, width));
      mlp->push_back(torch::nn::BatchNorm1d(width));
      mlp->push_back(torch::nn::ReLU());
      mlp->push_back(torch::nn::Dropout(cfg.dropout));
      in = width;
    }
    mlp->push_back(torch::nn::Linear(in, 1));
    this->mlp = register_module("mlp", mlp);
    cin_head = register_module("cin_head", torch::nn::Linear(cin->output_dim(), 1));
    bias_ = register_parameter("bias", torch::zeros({1}));

    torch::nn::init::xavier_uniform_(embedding->weight);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under its own NoGradGuard
  }

  void init_output_bias(double base_ctr) {
    bias_.fill_(std::log(base_ctr / (1.0 - base_ctr)));  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& sparse, const torch::Tensor& dense) {
    const int64_t batch = sparse.size(0);
    auto idx = sparse + offsets_;  // EXPECT: tensor-device-mismatch
    auto emb = embedding(idx);
    auto x0 = torch::cat({emb, dense_proj(dense).unsqueeze(1)}, 1);
    x0 = emb_norm(x0.transpose(1, 2)).transpose(1, 2);

    auto linear_logit = linear_emb(idx).sum({1, 2}).unsqueeze(1);
    auto cin_logit = cin_head(cin(x0));
    // FACT: y = torch.randn(3, 16, 9).transpose(1, 2); assert is_copy_of(y.flatten(1), y)
    auto dnn_logit = mlp->forward(x0.flatten(1));  // EXPECT: tensor-reshape-non-contiguous
    return (linear_logit + cin_logit + dnn_logit + bias_).squeeze(1);
  }

  torch::nn::Embedding embedding{nullptr}, linear_emb{nullptr};
  torch::nn::Linear dense_proj{nullptr}, cin_head{nullptr};
  torch::nn::BatchNorm1d emb_norm{nullptr};
  torch::nn::Sequential mlp{nullptr};
  CIN cin{nullptr};

 private:
  torch::Tensor offsets_, bias_;
};
TORCH_MODULE(XDeepFM);

torch::Tensor calibrated_ctr(const torch::Tensor& logit, double temperature) {
  auto scaled = logit.clone().div_(temperature);  // EXPECT: tensor-unnecessary-clone
  return torch::sigmoid(scaled);
}

void warm_start_embeddings(XDeepFM& model, const torch::Tensor& pretrained) {
  torch::NoGradGuard no_grad;
  auto table = model->embedding->weight.detach();
  const int64_t rows = std::min(pretrained.size(0), table.size(0));
  table.narrow(0, 0, rows).copy_(pretrained.narrow(0, 0, rows).to(table.scalar_type()));  // LOOKALIKE: tensor-inplace-on-detached -- writing the parameter is the point, before any forward // LOOKALIKE: tensor-copy-narrowing -- source converted to the table's dtype first
}

struct EvalResult { double auc = 0.0, accuracy = 0.0; };

EvalResult evaluate(XDeepFM& model, CtrData& data, torch::Device device, int64_t bs) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<torch::Tensor> probs, labels;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size(); start += bs) {
    auto batch = data.get(start, std::min(bs, data.size() - start));
    auto label = batch.label.to(device);
    auto prob = calibrated_ctr(model->forward(batch.sparse.to(device), batch.dense.to(device)), 1.0);
    correct += ((prob > 0.5).to(torch::kFloat) == label).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    probs.push_back(prob);  // LOOKALIKE: tensor-graph-kept-across-iterations -- NoGradGuard is active, prob carries no graph
    labels.push_back(label);
  }
  auto p = torch::cat(probs).cpu();
  auto y = torch::cat(labels).cpu();
  auto ranks = p.argsort().argsort().to(torch::kDouble) + 1.0;
  const double n_pos = y.sum().item<double>();
  const double n_neg = static_cast<double>(y.numel()) - n_pos;
  const double rank_sum = (ranks * y.to(torch::kDouble)).sum().item<double>();
  EvalResult r;
  r.auc = (rank_sum - n_pos * (n_pos + 1) / 2.0) / std::max(1.0, n_pos * n_neg);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(y.numel());
  return r;
}

void train(XDeepFM& model, CtrData& train_set, CtrData& valid_set, const XDeepFMConfig& cfg,
           torch::Device device) {
  torch::optim::Adam opt(model->parameters(),
                         torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto class_weights = torch::tensor({1.0f, static_cast<float>(cfg.pos_weight)});
  std::unordered_map<std::string, torch::Tensor> best;
  double best_auc = 0.0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    train_set.shuffle();
    torch::Tensor epoch_loss = torch::zeros({}, device);
    int64_t step = 0;
    for (int64_t start = 0; start < train_set.size(); start += cfg.batch_size, ++step) {
      auto batch = train_set.get(start, std::min(cfg.batch_size, train_set.size() - start));
      auto sparse = batch.sparse.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every step
      auto dense = batch.dense.to(device);
      auto label = batch.label.to(device);
      auto w = class_weights.to(device);  // EXPECT: tensor-clone-in-loop

      opt.zero_grad();
      auto prob = torch::sigmoid(model->forward(sparse, dense));
      prob.clamp_(1e-7, 1.0 - 1e-7);  // EXPECT: tensor-inplace-on-saved
      auto sample_w = torch::where(label > 0.5, w[1], w[0]);
      auto loss = torch::binary_cross_entropy(prob, label, sample_w);
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 10.0);
      opt.step();

      {
        torch::NoGradGuard no_grad;
        model->embedding->weight.renorm_(2, 0, cfg.max_embed_norm);  // LOOKALIKE: tensor-inplace-on-leaf -- max-norm projection under NoGradGuard
      }

      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (step % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step << " loss " << std::fixed
                  << std::setprecision(5) << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
      }
    }

    auto metrics = evaluate(model, valid_set, device, cfg.batch_size * 4);
    std::cout << "epoch " << epoch << " mean loss " << epoch_loss.item<double>() / std::max<int64_t>(1, step)
              << " val auc " << metrics.auc << " acc " << metrics.accuracy << std::endl;
    if (metrics.auc > best_auc) {
      best_auc = metrics.auc;
      for (const auto& kv : model->named_parameters()) {
        best[kv.key()] = kv.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- the snapshot must survive later optimizer steps
      }
    }
  }

  torch::NoGradGuard no_grad;
  for (auto& kv : model->named_parameters()) {
    auto it = best.find(kv.key());
    if (it != best.end()) kv.value().copy_(it->second);
  }
}

static CtrData synthetic_split(const XDeepFMConfig& cfg, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> count_dist(1.0, 1.5);
  std::bernoulli_distribution click(0.2);
  const int64_t f = static_cast<int64_t>(cfg.field_dims.size());
  std::vector<int64_t> ids(n * f);
  std::vector<double> dense(n * cfg.num_dense);
  std::vector<float> labels(n);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < f; ++j) {
      std::uniform_int_distribution<int64_t> pick(0, cfg.field_dims[j] - 1);
      ids[r * f + j] = pick(rng);
    }
    for (int64_t j = 0; j < cfg.num_dense; ++j) dense[r * cfg.num_dense + j] = count_dist(rng);
    labels[r] = click(rng) ? 1.0f : 0.0f;
  }
  return CtrData(ids, dense, labels, f, cfg.num_dense);
}

int main(int argc, char** argv) {
  torch::manual_seed(7);
  XDeepFMConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;

  auto train_set = synthetic_split(cfg, 50000, 1);
  auto valid_set = synthetic_split(cfg, 10000, 2);

  XDeepFM model(cfg);
  model->init_output_bias(0.2);
  if (argc > 1) {
    torch::Tensor pretrained;
    torch::load(pretrained, argv[1]);
    warm_start_embeddings(model, pretrained);
  }
  model->to(device);
  train(model, train_set, valid_set, cfg, device);
  return 0;
}
