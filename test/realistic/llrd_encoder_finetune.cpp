// BERT-style encoder fine-tuning with layer-wise learning-rate decay (LLRD)
// and a linear warmup/decay schedule over all parameter groups.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct FinetuneConfig {
  int64_t vocab_size = 30522, hidden = 256, num_layers = 6, num_heads = 4, ffn = 1024;
  int64_t max_positions = 128, num_labels = 3, pad_id = 0, unk_id = 100;
  double dropout = 0.1, token_dropout = 0.05;
  double base_lr = 3e-5, head_lr = 1e-4, layer_decay = 0.85, weight_decay = 0.01, warmup_ratio = 0.06;
  int64_t epochs = 3, batch_size = 32, log_every = 50;
};

struct SelfAttentionImpl : torch::nn::Module {
  explicit SelfAttentionImpl(const FinetuneConfig& cfg) : heads(cfg.num_heads), head_dim(cfg.hidden / cfg.num_heads) {
    qkv = register_module("qkv", torch::nn::Linear(cfg.hidden, 3 * cfg.hidden));
    out = register_module("out", torch::nn::Linear(cfg.hidden, cfg.hidden));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& pad_mask) {
    const auto B = x.size(0), T = x.size(1);
    // FACT: x=torch.nn.Linear(8,24)(torch.randn(2,5,8)); assert is_contiguous(x) and is_view_of(x.view(2,5,3,2,4), x)
    auto parts = qkv(x).view({B, T, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});  // LOOKALIKE: tensor-view-non-contiguous -- the linear output is contiguous, the permute comes after the view
    auto q = parts[0], k = parts[1], v = parts[2];
    auto scores = q.matmul(k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    // FACT: q=torch.randn(2,3,4,requires_grad=True); k=torch.randn(2,3,4); s=q.matmul(k.transpose(1,2))/2.0; assert not backward_fails(lambda: (s.masked_fill_(torch.rand(2,3,3)>0.5, -1e4), torch.softmax(s,-1).sum().backward()))
    scores.masked_fill_(pad_mask.view({B, 1, 1, T}), -1e4);  // LOOKALIKE: tensor-inplace-on-saved -- neither matmul nor division by a scalar saves its result
    auto probs = torch::softmax(scores, -1);
    // Padded query rows should not carry attention mass.
    // FACT: x=torch.randn(2,4,requires_grad=True); p=torch.softmax(x,-1); assert backward_fails(lambda: (p.masked_fill_(torch.tensor([[True,False,False,False]]*2), 0.0), p.pow(2).sum().backward()))
    probs.masked_fill_(pad_mask.view({B, 1, T, 1}), 0.0);  // EXPECT: tensor-inplace-on-saved
    auto ctx = drop(probs).matmul(v);
    // FACT: c=torch.randn(2,2,5,4); assert is_copy_of(c.transpose(1,2).reshape(2,5,8), c)
    return out(ctx.transpose(1, 2).reshape({B, T, heads * head_dim}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t heads, head_dim;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(SelfAttention);

struct EncoderLayerImpl : torch::nn::Module {
  explicit EncoderLayerImpl(const FinetuneConfig& cfg) {
    attn = register_module("attn", SelfAttention(cfg));
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    fc1 = register_module("fc1", torch::nn::Linear(cfg.hidden, cfg.ffn));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.ffn, cfg.hidden));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& pad_mask) {
    auto residual = x;
    x = drop(attn(x, pad_mask));
    // FACT: x=torch.randn(2,3); r=x; x=torch.nn.functional.dropout(x*2, 0.1); x+=r; assert is_copy_of(x, r)
    x += residual;  // LOOKALIKE: tensor-alias-then-mutate -- x was rebound to the attention output, residual is untouched
    x = ln1(x);
    auto h = F::gelu(fc1(x));
    return ln2(x + drop(fc2(h)));
  }

  SelfAttention attn{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(EncoderLayer);

struct EncoderClassifierImpl : torch::nn::Module {
  explicit EncoderClassifierImpl(const FinetuneConfig& cfg) : cfg_(cfg) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.hidden));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.max_positions, cfg.hidden));
    emb_ln = register_module("emb_ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    emb_drop = register_module("emb_drop", torch::nn::Dropout(cfg.dropout));
    for (int64_t i = 0; i < cfg.num_layers; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), EncoderLayer(cfg)));
    pooler = register_module("pooler", torch::nn::Linear(cfg.hidden, cfg.hidden));
    head_drop = register_module("head_drop", torch::nn::Dropout(cfg.dropout));
    classifier = register_module("classifier", torch::nn::Linear(cfg.hidden, cfg.num_labels));
  }

  torch::Tensor encode_pooled(const torch::Tensor& ids) {
    auto pad_mask = ids.eq(cfg_.pad_id);
    auto positions = torch::arange(ids.size(1), torch::kLong);
    auto x = tok_emb(ids) + pos_emb(positions);  // EXPECT: tensor-device-mismatch
    x = emb_drop(emb_ln(x));
    for (auto& layer : layers) x = layer->forward(x, pad_mask);
    // FACT: h=torch.randn(2,5,8); assert is_view_of(h.narrow(1,0,1).reshape(2,8), h)
    auto cls = x.narrow(1, 0, 1).reshape({x.size(0), -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- dropping a size-1 dim of a narrow is a view
    return torch::tanh(pooler(cls));
  }

  torch::Tensor forward(const torch::Tensor& ids) { return classifier(head_drop(encode_pooled(ids))); }

  // Logits plus an L2-normalised sentence embedding for the centroid monitor.
  std::pair<torch::Tensor, torch::Tensor> forward_with_embedding(const torch::Tensor& ids) {
    auto pooled = encode_pooled(ids);
    auto logits = classifier(head_drop(pooled));
    auto emb = pooled.detach();
    // FACT: x=torch.randn(2,4,requires_grad=True); w=torch.randn(3,4,requires_grad=True); pooled=torch.tanh(x); assert backward_fails(lambda: (pooled.detach().div_(2.0), (pooled @ w.t()).sum().backward()))
    emb.div_(emb.norm(2, -1, true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-detached
    return {logits, emb};
  }

  FinetuneConfig cfg_;
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::LayerNorm emb_ln{nullptr};
  torch::nn::Dropout emb_drop{nullptr}, head_drop{nullptr};
  std::vector<EncoderLayer> layers;
  torch::nn::Linear pooler{nullptr}, classifier{nullptr};
};
TORCH_MODULE(EncoderClassifier);

void init_bert_weights(torch::nn::Module& root) {
  torch::NoGradGuard no_grad;
  for (auto& m : root.modules(/*include_self=*/false)) {
    if (auto* lin = m->as<torch::nn::Linear>()) {
      lin->weight.normal_(0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- runs under NoGradGuard
      lin->bias.zero_();
    } else if (auto* emb = m->as<torch::nn::Embedding>()) {
      emb->weight.normal_(0.0, 0.02);
    }
  }
}

// The pretrained checkpoint has a different label space: start the head over.
void reset_classifier(EncoderClassifier& model) {
  model->classifier->weight.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
  torch::nn::init::zeros_(model->classifier->bias);
}

void load_encoder_weights(EncoderClassifier& model, const std::map<std::string, torch::Tensor>& state) {
  for (auto& item : model->named_parameters()) {
    auto it = state.find(item.key());
    if (it == state.end() || it->second.sizes() != item.value().sizes()) continue;
    item.value().data().copy_(it->second.to(item.value().scalar_type()));  // LOOKALIKE: tensor-inplace-on-detached -- loading writes the parameter on purpose
  }
}

int64_t llrd_layer_id(const std::string& name, int64_t num_layers) {
  if (name.rfind("tok_emb", 0) == 0 || name.rfind("pos_emb", 0) == 0 || name.rfind("emb_ln", 0) == 0) return 0;
  if (name.rfind("layer", 0) == 0) return std::stoll(name.substr(5, name.find('.') - 5)) + 1;
  return num_layers + 1;  // pooler and classifier
}

std::vector<torch::optim::OptimizerParamGroup> build_llrd_groups(EncoderClassifier& model, const FinetuneConfig& cfg,
                                                                 std::vector<double>& base_lrs) {
  const int64_t n = cfg.num_layers + 2;
  std::vector<std::vector<torch::Tensor>> decay(n), no_decay(n);
  for (auto& item : model->named_parameters()) {
    auto id = llrd_layer_id(item.key(), cfg.num_layers);
    (item.value().dim() == 1 ? no_decay : decay)[id].push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (int64_t id = 0; id < n; ++id) {
    double lr = id == n - 1 ? cfg.head_lr : cfg.base_lr * std::pow(cfg.layer_decay, cfg.num_layers + 1 - id);
    for (int wd = 0; wd < 2; ++wd) {
      auto& params = wd ? decay[id] : no_decay[id];
      if (params.empty()) continue;
      auto opts = std::make_unique<torch::optim::AdamWOptions>(lr);
      opts->weight_decay(wd ? cfg.weight_decay : 0.0).eps(1e-6);
      groups.emplace_back(params, std::move(opts));
      base_lrs.push_back(lr);
    }
  }
  return groups;
}

class LinearWarmupDecay {
 public:
  LinearWarmupDecay(torch::optim::Optimizer& opt, std::vector<double> base_lrs, int64_t warmup, int64_t total)
      : opt_(opt), base_lrs_(std::move(base_lrs)), warmup_(std::max<int64_t>(1, warmup)), total_(total) {}
  void step() {
    ++step_;
    double f = step_ < warmup_ ? static_cast<double>(step_) / warmup_
                               : std::max(0.0, static_cast<double>(total_ - step_) / std::max<int64_t>(1, total_ - warmup_));
    auto& groups = opt_.param_groups();
    for (size_t i = 0; i < groups.size(); ++i) groups[i].options().set_lr(base_lrs_[i] * f);
  }
 private:
  torch::optim::Optimizer& opt_;
  std::vector<double> base_lrs_;
  int64_t warmup_, total_, step_ = 0;
};

struct Example { std::vector<int64_t> tokens; float label; };  // label: float column of the TSV
struct Batch { torch::Tensor ids, labels; };

Batch collate(const std::vector<Example>& data, size_t begin, size_t end, const FinetuneConfig& cfg) {
  const int64_t n = static_cast<int64_t>(end - begin);
  int64_t T = 1;
  for (size_t i = begin; i < end; ++i) T = std::max<int64_t>(T, data[i].tokens.size());
  T = std::min(T, cfg.max_positions);
  auto ids = torch::full({n, T}, cfg.pad_id, torch::kLong);
  std::vector<float> raw_labels;
  for (int64_t i = 0; i < n; ++i) {
    const auto& toks = data[begin + i].tokens;
    auto len = std::min<int64_t>(T, toks.size());
    ids[i].narrow(0, 0, len).copy_(torch::tensor(std::vector<int64_t>(toks.begin(), toks.begin() + len)));
    raw_labels.push_back(data[begin + i].label);
  }
  auto labels = torch::empty({n}, torch::kLong);
  labels.copy_(torch::tensor(raw_labels));  // EXPECT: tensor-copy-narrowing
  return {ids, labels};
}

// Token-dropout augmentation: replace a random subset of real tokens by [UNK].
torch::Tensor token_dropout(torch::Tensor ids, double p, int64_t pad_id, int64_t unk_id) {
  auto hit = torch::rand(ids.sizes(), torch::TensorOptions().device(ids.device())).lt(p).logical_and(ids.ne(pad_id));
  // FACT: a=torch.randint(1,50,(2,6)); ids=a; ids.masked_fill_(torch.rand(2,6).lt(2.0), 100); assert a.eq(100).all()
  ids.masked_fill_(hit, unk_id);  // EXPECT: tensor-alias-then-mutate
  return ids;
}

double evaluate(EncoderClassifier& model, const std::vector<Batch>& batches, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0, total = 0;
  for (const auto& b : batches) {
    auto pred = model->forward(b.ids.to(device)).argmax(-1);  // LOOKALIKE: tensor-clone-in-loop -- a different batch every iteration
    correct += pred.eq(b.labels.to(device)).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    total += b.labels.size(0);
  }
  model->train();
  return static_cast<double>(correct) / std::max<int64_t>(1, total);
}

void finetune(const std::vector<Example>& train, const std::vector<Example>& dev,
              const std::map<std::string, torch::Tensor>& pretrained, const FinetuneConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  EncoderClassifier model(cfg);
  init_bert_weights(*model);
  load_encoder_weights(model, pretrained);
  reset_classifier(model);
  model->to(device);

  auto make_batches = [&](const std::vector<Example>& data) {
    std::vector<Batch> out;
    for (size_t i = 0; i < data.size(); i += cfg.batch_size)
      out.push_back(collate(data, i, std::min(data.size(), i + cfg.batch_size), cfg));
    return out;
  };
  auto train_batches = make_batches(train), dev_batches = make_batches(dev);

  std::vector<double> base_lrs;
  torch::optim::AdamW optimizer(build_llrd_groups(model, cfg, base_lrs));
  const int64_t total_steps = cfg.epochs * static_cast<int64_t>(train_batches.size());
  LinearWarmupDecay sched(optimizer, base_lrs, static_cast<int64_t>(cfg.warmup_ratio * total_steps), total_steps);

  auto class_weights = torch::tensor({1.0f, 1.0f, 1.5f}).to(device);
  auto class_sum = torch::zeros({cfg.num_labels, cfg.hidden}, torch::TensorOptions().device(device));
  auto class_count = torch::zeros({cfg.num_labels}, torch::TensorOptions().device(device));
  std::map<std::string, torch::Tensor> best_state;
  double best_acc = -1.0;
  std::vector<size_t> order(train_batches.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(13);
  int64_t step = 0;

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    auto window_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (auto bi : order) {
      const auto& batch = train_batches[bi];
      auto ids = token_dropout(batch.ids, cfg.token_dropout, cfg.pad_id, cfg.unk_id).to(device);
      auto labels = batch.labels.to(device);
      auto [logits, emb] = model->forward_with_embedding(ids);
      auto loss = F::cross_entropy(logits, labels, F::CrossEntropyFuncOptions().weight(class_weights));
      optimizer.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      optimizer.step();
      sched.step();
      {
        torch::NoGradGuard no_grad;
        class_sum.index_add_(0, labels, emb);
        class_count.index_add_(0, labels, torch::ones_like(labels, torch::kFloat));
      }
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      window_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
      if (++step % cfg.log_every == 0) {
        double avg = (window_loss / cfg.log_every).item<double>();  // LOOKALIKE: tensor-sync-in-loop -- one read every log_every steps
        std::cout << "step " << step << " loss " << avg << std::endl;
        window_loss.zero_();
      }
    }

    auto centroids = class_sum.clone();  // EXPECT: tensor-unnecessary-clone
    centroids.div_(class_count.clamp_min(1.0).unsqueeze(1));
    auto spread = torch::cdist(centroids, centroids).mean();
    double acc = evaluate(model, dev_batches, device);
    std::cout << "epoch " << epoch << " loss " << epoch_loss.item<double>() / train_batches.size()
              << " dev acc " << acc << " centroid spread " << spread.item<double>() << std::endl;
    class_sum.zero_();
    class_count.zero_();
    if (acc > best_acc) {
      best_acc = acc;
      for (auto& item : model->named_parameters())
        best_state[item.key()] = item.value().detach().clone();  // LOOKALIKE: tensor-unnecessary-clone -- the optimizer keeps updating the parameter in place
    }
  }

  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) item.value().copy_(best_state.at(item.key()));
}
