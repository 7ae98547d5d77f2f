// DCN-v2 for click-through prediction: a low-rank cross network and a deep
// tower run side by side on the concatenated field embeddings and dense
// counters, and a single logit head reads both. Categorical values are hashed
// into per-field buckets of one shared embedding table.

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct CtrConfig {
  int64_t num_fields = 26;
  int64_t num_dense = 13;
  int64_t buckets = 1 << 15;
  int64_t embed_dim = 16;
  int64_t cross_layers = 3;
  int64_t cross_rank = 64;
  int64_t batch_size = 2048;
  int64_t epochs = 4;
  double lr = 1e-3;
  double max_embed_norm = 1.0;
  double ema_decay = 0.999;
  double temperature = 1.0;
};

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ULL ^ (seed * 0x9E3779B97F4A7C15ULL);
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// One row of ids per field, the way the column files are laid out on disk.
torch::Tensor hash_columns(const std::vector<std::vector<std::string>>& columns, int64_t buckets) {
  const auto fields = static_cast<int64_t>(columns.size());
  const auto rows = static_cast<int64_t>(columns.front().size());
  auto ids = torch::empty({fields, rows}, torch::kInt32);
  std::vector<int64_t> raw(rows);
  for (int64_t f = 0; f < fields; ++f) {
    for (int64_t i = 0; i < rows; ++i) raw[i] = static_cast<int64_t>(fnv1a(columns[f][i], f));
    // FACT: a=torch.zeros(1,dtype=torch.int32); a.copy_(torch.tensor([2**40+5])); assert a.item()==5
    ids[f].copy_(torch::from_blob(raw.data(), {rows}, torch::kInt64));  // EXPECT: tensor-copy-narrowing
  }
  return ids.remainder_(buckets);
}

struct CtrBatch {
  torch::Tensor ids, dense, labels;
};

struct CtrDataset {
  torch::Tensor ids, dense, labels;

  int64_t size() const { return labels.size(0); }

  CtrBatch batch(const torch::Tensor& idx) const {
    auto d = dense.index_select(0, idx);
    // FACT: d=torch.rand(8,3); x=d.index_select(0, torch.tensor([0,2,5])); x.log1p_(); assert is_copy_of(x,d)
    d.clamp_min_(0).log1p_();  // LOOKALIKE: tensor-alias-then-mutate -- index_select gathered the rows into a new tensor
    return {ids.index_select(1, idx), d, labels.index_select(0, idx)};
  }

  CtrBatch all() const {
    auto d = dense.contiguous();
    // FACT: d=torch.rand(4,3); o=d.contiguous(); o.clamp_min_(0).log1p_(); assert shares_storage(o,d)
    d.clamp_min_(0).log1p_();  // EXPECT: tensor-alias-then-mutate
    return {ids, d, labels};
  }
};

CtrDataset synth_dataset(const CtrConfig& cfg, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::geometric_distribution<int> value(0.02);
  std::bernoulli_distribution noise(0.03);
  std::vector<std::vector<std::string>> columns(cfg.num_fields, std::vector<std::string>(rows));
  std::vector<uint8_t> clicks(rows);
  for (int64_t i = 0; i < rows; ++i) {
    int signal = 0;
    for (int64_t f = 0; f < cfg.num_fields; ++f) {
      const int v = value(rng);
      columns[f][i] = "f" + std::to_string(f) + "=" + std::to_string(v);
      if (f < 4 && v % 7 == 0) ++signal;
    }
    clicks[i] = noise(rng) || signal >= 3;
  }
  CtrDataset ds;
  ds.ids = hash_columns(columns, cfg.buckets);
  ds.dense = torch::rand({rows, cfg.num_dense}) * 50.0 - 1.0;
  ds.labels = torch::empty({rows});
  ds.labels.copy_(torch::from_blob(clicks.data(), {rows}, torch::kUInt8));  // LOOKALIKE: tensor-copy-narrowing -- uint8 into float widens
  return ds;
}

class CrossLayerImpl : public torch::nn::Module {
 public:
  CrossLayerImpl(int64_t dim, int64_t rank)
      : down(register_module("down", torch::nn::Linear(torch::nn::LinearOptions(dim, rank).bias(false)))),
        up(register_module("up", torch::nn::Linear(rank, dim))) {}

  // x_{l+1} = x_0 * (U (V^T x_l) + b) + x_l
  torch::Tensor forward(const torch::Tensor& x0, const torch::Tensor& xl) {
    auto out = x0 * up(down(xl));
    // FACT: x0=torch.randn(4,6,requires_grad=True); p=torch.randn(4,6,requires_grad=True); o=x0*p; o.add_(x0); o.sum().backward(); assert p.grad is not None
    out.add_(xl);  // LOOKALIKE: tensor-inplace-on-saved -- mul saved its two operands, not the product being written
    return out;
  }

  torch::nn::Linear down, up;
};
TORCH_MODULE(CrossLayer);

class DcnV2Impl : public torch::nn::Module {
 public:
  explicit DcnV2Impl(const CtrConfig& cfg) {
    table = register_module("table", torch::nn::Embedding(cfg.num_fields * cfg.buckets, cfg.embed_dim));
    {
      torch::NoGradGuard no_grad;
      table->weight.normal_(0.0, 0.01);  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
    }
    offsets = register_buffer("offsets", (torch::arange(cfg.num_fields, torch::kInt64) * cfg.buckets).unsqueeze(1));
    const auto dim = cfg.num_fields * cfg.embed_dim + cfg.num_dense;
    for (int64_t i = 0; i < cfg.cross_layers; ++i)
      cross.push_back(register_module("cross" + std::to_string(i), CrossLayer(dim, cfg.cross_rank)));
    deep = register_module("deep", torch::nn::Sequential(torch::nn::Linear(dim, 256), torch::nn::ReLU(),
                                                         torch::nn::Dropout(0.1), torch::nn::Linear(256, 128),
                                                         torch::nn::ReLU()));
    head = register_module("head", torch::nn::Linear(dim + 128, 1));
  }

  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& dense) {
    auto emb = table(ids.to(torch::kInt64) + offsets);
    // FACT: e=torch.randn(3,4,5); r=e.transpose(0,1).reshape(4,-1); assert is_copy_of(r,e)
    auto sparse = emb.transpose(0, 1).reshape({emb.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
    auto x0 = torch::cat({sparse, dense}, 1);
    auto xl = x0;
    for (auto& layer : cross) xl = layer->forward(x0, xl);
    return head(torch::cat({xl, deep->forward(x0)}, 1)).squeeze(1);
  }

  // Hash collisions let a few rows grow without bound; pull them back into the ball.
  void clip_embedding_norms(double max_norm) {
    auto& w = table->weight;
    auto scale = w.norm(2, {1}, true).clamp_min(max_norm).reciprocal().mul(max_norm);
    // FACT: w=torch.randn(5,3,requires_grad=True); assert raises(lambda: w.mul_(0.5), 'leaf Variable')
    w.mul_(scale);  // EXPECT: tensor-inplace-on-leaf
  }

  torch::nn::Embedding table{nullptr};
  torch::Tensor offsets;
  std::vector<CrossLayer> cross;
  torch::nn::Sequential deep{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(DcnV2);

struct Ema {
  Ema(const torch::nn::Module& m, double d) : decay(d) {
    for (const auto& p : m.parameters()) shadow.push_back(p.detach().clone());  // LOOKALIKE: tensor-unnecessary-clone -- the shadow is blended in place every step and must not alias the live weights
  }

  void update(const torch::nn::Module& m) {
    torch::NoGradGuard no_grad;
    const auto params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) shadow[i].mul_(decay).add_(params[i].detach(), 1.0 - decay);
  }

  void copy_to(torch::nn::Module& m) const {
    torch::NoGradGuard no_grad;
    auto params = m.parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].detach().copy_(shadow[i]);  // LOOKALIKE: tensor-inplace-on-detached -- overwrites the live weights on purpose, under NoGradGuard, after training
  }

  std::vector<torch::Tensor> shadow;
  double decay;
};

double roc_auc(const torch::Tensor& scores, const torch::Tensor& labels) {
  auto s = scores.clone();  // EXPECT: tensor-unnecessary-clone
  auto order = std::get<1>(torch::sort(s, 0, /*descending=*/true));
  auto y = labels.index_select(0, order).to(torch::kFloat64);
  auto zero = torch::zeros({1}, y.options());
  auto tps = torch::cat({zero, y.cumsum(0)});
  auto fps = torch::cat({zero, (1 - y).cumsum(0)});
  const double pos = tps[-1].item<double>(), neg = fps[-1].item<double>();
  if (pos == 0 || neg == 0) return 0.5;
  return torch::trapz(tps / pos, fps / neg).item<double>();
}

double evaluate(DcnV2& model, const CtrDataset& val, const torch::Device& device,
                const torch::Tensor& temperature, int64_t chunk) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto data = val.all();
  std::vector<torch::Tensor> probs;
  for (int64_t start = 0; start < val.size(); start += chunk) {
    const auto len = std::min(chunk, val.size() - start);
    auto ids = data.ids.narrow(1, start, len).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different slice of the validation set each step
    auto dense = data.dense.narrow(0, start, len).to(device);
    auto logits = model->forward(ids, dense) / temperature;  // LOOKALIKE: tensor-device-mismatch -- the temperature is a 0-dim CPU tensor, which may meet CUDA operands
    probs.push_back(torch::sigmoid(logits));  // LOOKALIKE: tensor-graph-kept-across-iterations -- evaluation runs under NoGradGuard, no graph is recorded
  }
  return roc_auc(torch::cat(probs).cpu(), data.labels);
}

int main() {
  torch::manual_seed(3);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  CtrConfig cfg;
  auto train = synth_dataset(cfg, 60000, 1);
  auto val = synth_dataset(cfg, 10000, 2);

  DcnV2 model(cfg);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  Ema ema(*model, cfg.ema_decay);

  const double pos_rate = train.labels.mean().item<double>();
  auto pos_weight = torch::full({1}, (1.0 - pos_rate) / pos_rate);
  auto temperature = torch::scalar_tensor(cfg.temperature);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<torch::Tensor> train_probs, train_labels;
    double clicks_seen = 0.0;
    auto perm = torch::randperm(train.size(), torch::kLong);
    for (int64_t start = 0; start + cfg.batch_size <= train.size(); start += cfg.batch_size) {
      auto b = train.batch(perm.narrow(0, start, cfg.batch_size));
      auto ids = b.ids.to(device);
      auto dense = b.dense.to(device);
      auto y = b.labels.to(device);

      auto prob = torch::sigmoid(model->forward(ids, dense));
      // FACT: l=torch.randn(8,requires_grad=True); p=torch.sigmoid(l); p.clamp_(1e-7,1-1e-7); y=torch.rand(8); assert backward_fails(lambda: torch.nn.functional.binary_cross_entropy(p,y).backward())
      prob.clamp_(1e-7, 1.0 - 1e-7);  // EXPECT: tensor-inplace-on-saved
      auto weight = y * pos_weight + (1.0 - y);  // EXPECT: tensor-device-mismatch
      auto loss = F::binary_cross_entropy(prob, y, F::BinaryCrossEntropyFuncOptions().weight(weight));

      opt.zero_grad();
      loss.backward();
      opt.step();
      model->clip_embedding_norms(cfg.max_embed_norm);
      ema.update(*model);

      train_probs.push_back(prob);  // EXPECT: tensor-graph-kept-across-iterations
      train_labels.push_back(y);  // LOOKALIKE: tensor-graph-kept-across-iterations -- labels come from the loader and carry no graph
      clicks_seen += y.sum().item<double>();  // EXPECT: tensor-sync-in-loop
    }
    const double train_auc = roc_auc(torch::cat(train_probs).detach().cpu(), torch::cat(train_labels).cpu());
    const double val_auc = evaluate(model, val, device, temperature, 8192);
    std::cout << "epoch " << epoch << " clicks " << clicks_seen << " train auc " << train_auc
              << " val auc " << val_auc << std::endl;
  }

  ema.copy_to(*model);
  std::cout << "ema val auc " << evaluate(model, val, device, temperature, 8192) << std::endl;
  torch::save(model, "dcn_v2_ctr.pt");
  return 0;
}
