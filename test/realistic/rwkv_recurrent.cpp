// RWKV-4 style language model: time-mix with per-channel decay (WKV recurrence) and channel-mix,
// trained chunk by chunk across a document and sampled token by token from the recurrent state.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct RWKVConfig {
  int64_t vocab_size = 256, n_embd = 192, n_layer = 4, ffn_mult = 4;
  int64_t ctx_len = 128, chunks_per_doc = 4, batch_size = 8, epochs = 2, log_every = 20;
  double lr = 4e-4;
  double temperature = 1.0, freq_penalty = 0.3;
  int64_t penalty_window = 32, eos_id = 0;
};

struct LayerState { torch::Tensor att_x, aa, bb, pp, ffn_x; };
using ModelState = std::vector<LayerState>;

ModelState fork_state(const ModelState& st, int64_t n) {
  ModelState out;
  out.reserve(st.size());
  for (const auto& s : st)
    out.push_back({s.att_x.expand({n, -1}), s.aa.expand({n, -1}).clone(), s.bb.expand({n, -1}).clone(),
                   s.pp.expand({n, -1}), s.ffn_x.expand({n, -1})});
  return out;
}

torch::Tensor time_shift(const torch::Tensor& x, const torch::Tensor& prev) {
  const int64_t T = x.size(1);
  auto xx = torch::empty_like(x);
  xx.select(1, 0).copy_(prev);
  // FACT: x=torch.randn(2,5,3); xx=torch.empty_like(x); assert not shares_storage(xx.narrow(1,1,4), x.narrow(1,0,4))
  xx.narrow(1, 1, T - 1).copy_(x.narrow(1, 0, T - 1)); // LOOKALIKE: tensor-inplace-overlap -- the shifted source is x, the destination a separate buffer
  return xx;
}

torch::Tensor wkv_sequence(const torch::Tensor& w, const torch::Tensor& u, const torch::Tensor& k,
                           const torch::Tensor& v, LayerState& s) {
  const int64_t T = k.size(1);
  auto aa = s.aa, bb = s.bb, pp = s.pp;
  std::vector<torch::Tensor> ys;
  ys.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    auto kt = k.select(1, t), vt = v.select(1, t);
    auto ww = u + kt;
    auto p = torch::maximum(pp, ww);
    auto e1 = torch::exp(pp - p), e2 = torch::exp(ww - p);
    ys.push_back((e1 * aa + e2 * vt) / (e1 * bb + e2)); // LOOKALIKE: tensor-graph-kept-across-iterations -- per-step outputs of one forward, stacked and returned
    ww = pp + w;
    p = torch::maximum(ww, kt);
    e1 = torch::exp(ww - p), e2 = torch::exp(kt - p);
    // FACT: e=torch.rand(3,requires_grad=True); a=torch.zeros(3); y=e*a; a.mul_(e).add_(e); assert backward_fails(lambda: (y.sum()+a.sum()).backward())
    aa.mul_(e1).add_(e2 * vt); // EXPECT: tensor-inplace-on-saved
    bb = e1 * bb + e2;
    pp = p;
  }
  s.aa = aa; s.bb = bb; s.pp = pp;
  return torch::stack(ys, 1);
}

struct TimeMixImpl : torch::nn::Module {
  TimeMixImpl(int64_t C, int64_t layer, int64_t n_layer) {
    const double ratio_0_to_1 = static_cast<double>(layer) / std::max<int64_t>(n_layer - 1, 1);
    const double ratio_1_to_almost0 = 1.0 - static_cast<double>(layer) / n_layer;
    auto ddd = torch::arange(C, torch::kFloat) / C;
    auto h = torch::arange(C, torch::kFloat) / std::max<int64_t>(C - 1, 1);
    time_decay_ = register_parameter("time_decay", -5.0 + 8.0 * torch::pow(h, 0.7 + 1.3 * ratio_0_to_1));
    auto zigzag = (torch::arange(C) % 3 - 1).to(torch::kFloat) * 0.5;
    time_first_ = register_parameter("time_first", torch::full({C}, std::log(0.3)));
    // FACT: p=torch.nn.Parameter(torch.full((4,),-1.2)); assert raises(lambda: p.add_(torch.ones(4)), "leaf Variable that requires grad")
    time_first_.add_(zigzag); // EXPECT: tensor-inplace-on-leaf
    time_mix_k_ = register_parameter("time_mix_k", torch::pow(ddd, ratio_1_to_almost0));
    time_mix_v_ = register_parameter("time_mix_v", torch::pow(ddd, ratio_1_to_almost0) + 0.3 * ratio_0_to_1);
    time_mix_r_ = register_parameter("time_mix_r", torch::pow(ddd, 0.5 * ratio_1_to_almost0));
    auto lin = [](int64_t i, int64_t o) { return torch::nn::Linear(torch::nn::LinearOptions(i, o).bias(false)); };
    key = register_module("key", lin(C, C));
    value = register_module("value", lin(C, C));
    receptance = register_module("receptance", lin(C, C));
    output = register_module("output", lin(C, C));
  }

  torch::Tensor forward(const torch::Tensor& x, LayerState& s) {
    auto xx = time_shift(x, s.att_x);
    auto k = key(x * time_mix_k_ + xx * (1.0 - time_mix_k_));
    auto v = value(x * time_mix_v_ + xx * (1.0 - time_mix_v_));
    auto r = torch::sigmoid(receptance(x * time_mix_r_ + xx * (1.0 - time_mix_r_)));
    auto y = wkv_sequence(-torch::exp(time_decay_), time_first_, k, v, s);
    s.att_x = x.select(1, x.size(1) - 1);
    return output(r * y);
  }

  torch::Tensor step(const torch::Tensor& x, LayerState& s) {
    auto k = key(x * time_mix_k_ + s.att_x * (1.0 - time_mix_k_));
    auto v = value(x * time_mix_v_ + s.att_x * (1.0 - time_mix_v_));
    auto r = torch::sigmoid(receptance(x * time_mix_r_ + s.att_x * (1.0 - time_mix_r_)));
    s.att_x = x;
    auto ww = time_first_ + k;
    auto p = torch::maximum(s.pp, ww);
    auto e1 = torch::exp(s.pp - p), e2 = torch::exp(ww - p);
    auto wkv = (e1 * s.aa + e2 * v) / (e1 * s.bb + e2);
    ww = s.pp - torch::exp(time_decay_);
    p = torch::maximum(ww, k);
    e1 = torch::exp(ww - p), e2 = torch::exp(k - p);
    s.aa.mul_(e1).add_(e2 * v); // LOOKALIKE: tensor-inplace-on-saved -- step() only runs under NoGradGuard: nothing is saved
    // FACT: b=torch.zeros(1,4).expand(3,4).clone(); b.mul_(0.5).add_(1.0); assert b.stride()==(4,1) and not shares_storage(b, torch.zeros(1,4))
    s.bb.mul_(e1).add_(e2); // LOOKALIKE: tensor-inplace-on-expanded -- fork_state cloned bb after expanding it
    // FACT: p=torch.zeros(1,4).expand(3,4); assert raises(lambda: p.copy_(torch.ones(3,4)), "more than one element")
    s.pp.copy_(p); // EXPECT: tensor-inplace-on-expanded
    return output(r * wkv);
  }

  torch::Tensor time_decay_, time_first_, time_mix_k_, time_mix_v_, time_mix_r_;
  torch::nn::Linear key{nullptr}, value{nullptr}, receptance{nullptr}, output{nullptr};
};
TORCH_MODULE(TimeMix);

struct ChannelMixImpl : torch::nn::Module {
  ChannelMixImpl(int64_t C, int64_t hidden, int64_t layer, int64_t n_layer) {
    const double ratio_1_to_almost0 = 1.0 - static_cast<double>(layer) / n_layer;
    auto ddd = torch::arange(C, torch::kFloat) / C;
    time_mix_k_ = register_parameter("time_mix_k", torch::pow(ddd, ratio_1_to_almost0));
    time_mix_r_ = register_parameter("time_mix_r", torch::pow(ddd, ratio_1_to_almost0));
    auto lin = [](int64_t i, int64_t o) { return torch::nn::Linear(torch::nn::LinearOptions(i, o).bias(false)); };
    key = register_module("key", lin(C, hidden));
    value = register_module("value", lin(hidden, C));
    receptance = register_module("receptance", lin(C, C));
  }

  torch::Tensor forward(const torch::Tensor& x, LayerState& s) {
    auto xx = time_shift(x, s.ffn_x);
    auto k = torch::relu(key(x * time_mix_k_ + xx * (1.0 - time_mix_k_))).square();
    auto kv = value(k);
    if (track_sparsity) {
      auto dead = k.detach();
      // FACT: a=torch.randn(4,requires_grad=True); k=torch.relu(a).square(); w=torch.randn(4,3,requires_grad=True); kv=k@w; d=k.detach(); d.eq_(0); assert backward_fails(lambda: kv.sum().backward())
      dead.eq_(0); // EXPECT: tensor-inplace-on-detached
      sparsity = dead.mean();
    }
    s.ffn_x = x.select(1, x.size(1) - 1);
    return torch::sigmoid(receptance(x * time_mix_r_ + xx * (1.0 - time_mix_r_))) * kv;
  }

  torch::Tensor step(const torch::Tensor& x, LayerState& s) {
    auto k = torch::relu(key(x * time_mix_k_ + s.ffn_x * (1.0 - time_mix_k_))).square();
    auto r = torch::sigmoid(receptance(x * time_mix_r_ + s.ffn_x * (1.0 - time_mix_r_)));
    s.ffn_x = x;
    return r * value(k);
  }

  bool track_sparsity = false;
  torch::Tensor sparsity, time_mix_k_, time_mix_r_;
  torch::nn::Linear key{nullptr}, value{nullptr}, receptance{nullptr};
};
TORCH_MODULE(ChannelMix);

struct RWKVBlockImpl : torch::nn::Module {
  RWKVBlockImpl(const RWKVConfig& cfg, int64_t layer) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
    att = register_module("att", TimeMix(cfg.n_embd, layer, cfg.n_layer));
    ffn = register_module("ffn", ChannelMix(cfg.n_embd, cfg.ffn_mult * cfg.n_embd, layer, cfg.n_layer));
  }
  torch::Tensor forward(torch::Tensor x, LayerState& s) {
    x = x + att->forward(ln1(x), s);
    return x + ffn->forward(ln2(x), s);
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  TimeMix att{nullptr};
  ChannelMix ffn{nullptr};
};
TORCH_MODULE(RWKVBlock);

struct RWKVImpl : torch::nn::Module {
  explicit RWKVImpl(const RWKVConfig& cfg) : cfg_(cfg) {
    emb = register_module("emb", torch::nn::Embedding(cfg.vocab_size, cfg.n_embd));
    ln0 = register_module("ln0", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
    for (int64_t i = 0; i < cfg.n_layer; ++i)
      blocks.push_back(register_module("block" + std::to_string(i), RWKVBlock(cfg, i)));
    ln_out = register_module("ln_out", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
    head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(cfg.n_embd, cfg.vocab_size).bias(false)));
  }

  ModelState fresh_state(int64_t B) const {
    const auto opts = emb->weight.options();
    ModelState st(blocks.size());
    for (auto& s : st) {
      auto z = torch::zeros({B, cfg_.n_embd}, opts);
      s = LayerState{z, torch::zeros_like(z), torch::zeros_like(z), torch::full_like(z, -1e38), torch::zeros_like(z)};
    }
    return st;
  }

  std::pair<torch::Tensor, ModelState> forward(const torch::Tensor& idx, ModelState state) {
    auto x = ln0(emb(idx));
    for (size_t i = 0; i < blocks.size(); ++i) x = blocks[i]->forward(x, state[i]);
    return {head(ln_out(x)), std::move(state)};
  }

  void prepare_inference() {
    torch::NoGradGuard no_grad;
    emb_table_ = ln0(emb->weight);
  }

  torch::Tensor run_blocks(torch::Tensor x, ModelState& st) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto& blk = blocks[i];
      auto att = blk->att->step(blk->ln1(x), st[i]);
      // FACT: W=torch.randn(10,4); x=W[3].unsqueeze(0); assert is_view_of(x, W)
      x.add_(att); // EXPECT: tensor-alias-then-mutate
      x = x + blk->ffn->step(blk->ln2(x), st[i]);
    }
    return head(ln_out(x));
  }

  torch::Tensor step_token(int64_t token, ModelState& st) { return run_blocks(emb_table_[token].unsqueeze(0), st); }
  torch::Tensor step_batch(const torch::Tensor& tokens, ModelState& st) { return run_blocks(emb_table_.index_select(0, tokens), st); }

  RWKVConfig cfg_;
  torch::nn::Embedding emb{nullptr};
  torch::nn::LayerNorm ln0{nullptr}, ln_out{nullptr};
  std::vector<RWKVBlock> blocks;
  torch::nn::Linear head{nullptr};
  torch::Tensor emb_table_;
};
TORCH_MODULE(RWKV);

void train(RWKV& model, const torch::Tensor& corpus, const RWKVConfig& cfg, torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.99}).eps(1e-8));
  const int64_t doc_len = cfg.ctx_len * cfg.chunks_per_doc + 1;
  const int64_t n_docs = corpus.size(0) / (doc_len * cfg.batch_size);
  auto docs = corpus.narrow(0, 0, n_docs * cfg.batch_size * doc_len).view({n_docs, cfg.batch_size, doc_len});
  double train_loss = 0.0;
  int64_t seen = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    for (int64_t d = 0; d < n_docs; ++d) {
      auto doc = docs[d].to(device);
      auto state = model->fresh_state(cfg.batch_size);
      for (int64_t c = 0; c < cfg.chunks_per_doc; ++c) {
        auto x = doc.narrow(1, c * cfg.ctx_len, cfg.ctx_len);
        auto y = doc.narrow(1, c * cfg.ctx_len + 1, cfg.ctx_len);
        auto out = model->forward(x, state);
        auto loss = F::cross_entropy(out.first.transpose(1, 2), y);
        opt.zero_grad();
        loss.backward();
        torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
        opt.step();
        {
          torch::NoGradGuard no_grad;
          for (auto& blk : model->blocks) blk->att->time_decay_.clamp_(-8.0, 3.0); // LOOKALIKE: tensor-inplace-on-leaf -- parameter clamp inside NoGradGuard
        }
        train_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop
        ++seen;
        state = std::move(out.second); // EXPECT: tensor-graph-kept-across-iterations
      }
      if ((d + 1) % cfg.log_every == 0) {
        std::cout << "epoch " << epoch << " doc " << d + 1 << " loss " << train_loss / seen << std::endl;
        train_loss = 0.0, seen = 0;
      }
    }
  }
}

torch::Tensor sample(RWKV& model, const torch::Tensor& prompt, int64_t n_samples, int64_t n_new,
                     const RWKVConfig& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->prepare_inference();
  auto st = model->fresh_state(1);
  torch::Tensor logits;
  const int64_t P = prompt.size(0);
  const int32_t* ids = prompt.data_ptr<int32_t>();
  for (int64_t i = 0; i < P; ++i) logits = model->step_token(ids[i], st);
  auto forked = fork_state(st, n_samples);
  logits = logits.expand({n_samples, -1});
  const int64_t W = cfg.penalty_window;
  const int64_t k0 = std::min(P, W);
  auto recent = torch::zeros({n_samples, W}, torch::dtype(torch::kLong).device(device));
  recent.narrow(1, W - k0, k0).copy_(prompt.narrow(0, P - k0, k0)); // LOOKALIKE: tensor-copy-narrowing -- int32 prompt ids widen into int64
  int64_t filled = k0;
  auto out_ids = torch::zeros({n_samples, n_new}, torch::dtype(torch::kInt32).device(device));
  for (int64_t t = 0; t < n_new; ++t) {
    auto scores = logits / cfg.temperature;
    auto seen = recent.narrow(1, W - filled, filled);
    scores = scores.scatter_add(1, seen, torch::full(seen.sizes(), -cfg.freq_penalty, scores.options()));
    auto next = torch::multinomial(torch::softmax(scores, -1), 1);
    out_ids.narrow(1, t, 1).copy_(next); // EXPECT: tensor-copy-narrowing
    // FACT: r=torch.arange(12).view(3,4); a=r.narrow(1,0,3); b=r.narrow(1,1,3); assert shares_storage(a,b) and a[0,1].data_ptr()==b[0,0].data_ptr()
    recent.narrow(1, 0, W - 1).copy_(recent.narrow(1, 1, W - 1)); // EXPECT: tensor-inplace-overlap
    recent.narrow(1, W - 1, 1).copy_(next);
    filled = std::min(filled + 1, W);
    if ((t + 1) % 16 == 0 && (out_ids.narrow(1, 0, t + 1) == cfg.eos_id).any(1).all().item<bool>()) break; // LOOKALIKE: tensor-sync-in-loop -- a stop decision every 16 tokens, not a logged value
    logits = model->step_batch(next.squeeze(1), forked);
  }
  return out_ids.cpu();
}

int main() {
  torch::manual_seed(0);
  RWKVConfig cfg;
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  auto corpus = torch::randint(1, cfg.vocab_size, {600000}, torch::kLong);

  RWKV model(cfg);
  model->to(device);
  model->blocks.back()->ffn->track_sparsity = true;
  train(model, corpus, cfg, device);

  auto prompt = corpus.narrow(0, 0, 24).to(torch::kInt32);
  auto samples = sample(model, prompt, 4, 200, cfg, device);
  std::cout << "sampled " << samples.sizes() << " sparsity "
            << model->blocks.back()->ffn->sparsity.item<double>() << std::endl;
  return 0;
}
