// Transformer-XL LM (Dai et al., 2019): segment-level memory recurrence, relative positional attention.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace txl {

using torch::Tensor;
namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct TxlConfig {
  int64_t n_token = 32000, n_layer = 12, n_head = 8, d_model = 512, d_head = 64, d_inner = 2048;
  int64_t tgt_len = 128, mem_len = 128, clamp_len = -1, batch_size = 22;
  int64_t max_step = 200000, log_interval = 200, eval_interval = 4000, eos_id = 0;
  double dropout = 0.1, dropatt = 0.1, lr = 2.5e-4, clip = 0.25;
};

// Lays the token stream out as [n_step, bsz]: column b is a contiguous stretch of the corpus.
Tensor batchify(const Tensor& ids, int64_t bsz) {
  const int64_t n_step = ids.size(0) / bsz;
  auto data = torch::empty({n_step, bsz}, torch::kInt32);
  // FACT: d=torch.empty(2,dtype=torch.int32); d.copy_(torch.tensor([2**40+5,7])); assert d.tolist()==[5,7]
  data.copy_(ids.narrow(0, 0, n_step * bsz).view({bsz, n_step}).t());  // EXPECT: tensor-copy-narrowing
  return data;
}

struct PositionalEmbeddingImpl : nn::Module {
  explicit PositionalEmbeddingImpl(int64_t d_model) {
    inv_freq_ = register_buffer("inv_freq", 1.0 / torch::pow(10000.0, torch::arange(0.0, d_model, 2.0) / d_model));
  }

  // Embeddings of the relative distances klen-1 ... 0.
  Tensor forward(int64_t klen, int64_t clamp_len) {
    auto pos_seq = torch::arange(klen - 1, -1, -1.0);
    if (clamp_len > 0) pos_seq.clamp_max_(clamp_len);
    auto sinusoid = torch::outer(pos_seq, inv_freq_);  // EXPECT: tensor-device-mismatch
    return torch::cat({sinusoid.sin(), sinusoid.cos()}, -1).unsqueeze(1);
  }
  Tensor inv_freq_;
};
TORCH_MODULE(PositionalEmbedding);

// Shifts row i of the score matrix so that column j holds the score of relative distance i - j.
Tensor rel_shift(const Tensor& x) {
  auto zero_pad = torch::zeros({x.size(0), 1, x.size(2), x.size(3)}, x.options());
  auto padded = torch::cat({zero_pad, x}, 1).view({x.size(1) + 1, x.size(0), x.size(2), x.size(3)});
  // FACT: x=torch.randn(3,5,2,2); p=torch.cat([torch.zeros(3,1,2,2),x],1).view(6,3,2,2); assert is_contiguous(p[1:]) and is_view_of(p[1:].view_as(x), p)
  return padded.slice(0, 1).view_as(x);  // LOOKALIKE: tensor-view-non-contiguous -- dropping leading rows keeps the tensor contiguous
}

struct RelMultiHeadAttnImpl : nn::Module {
  RelMultiHeadAttnImpl(const TxlConfig& c, Tensor r_w_bias, Tensor r_r_bias)
      : n_head_(c.n_head), d_head_(c.d_head), scale_(1.0 / std::sqrt(static_cast<double>(c.d_head))),
        r_w_bias_(std::move(r_w_bias)), r_r_bias_(std::move(r_r_bias)) {
    qkv_net = register_module("qkv_net", nn::Linear(nn::LinearOptions(c.d_model, 3 * n_head_ * d_head_).bias(false)));
    r_net = register_module("r_net", nn::Linear(nn::LinearOptions(c.d_model, n_head_ * d_head_).bias(false)));
    o_net = register_module("o_net", nn::Linear(nn::LinearOptions(n_head_ * d_head_, c.d_model).bias(false)));
    layer_norm = register_module("layer_norm", nn::LayerNorm(nn::LayerNormOptions({c.d_model})));
    drop = register_module("drop", nn::Dropout(c.dropout));
    dropatt = register_module("dropatt", nn::Dropout(nn::DropoutOptions(c.dropatt).inplace(true)));
  }

  Tensor forward(const Tensor& w, const Tensor& r, const Tensor& mem, const Tensor& attn_mask) {
    const auto qlen = w.size(0), bsz = w.size(1), rlen = r.size(0);
    auto heads = qkv_net->forward(torch::cat({mem, w}, 0)).chunk(3, -1);
    const auto klen = heads[1].size(0);
    // FACT: h=torch.randn(5,2,24); q=h.chunk(3,-1)[0][2:]; assert not is_contiguous(q) and is_view_of(q.view(3,2,2,4), h)
    auto q = heads[0].slice(0, klen - qlen).view({qlen, bsz, n_head_, d_head_});  // LOOKALIKE: tensor-view-non-contiguous -- only the unit-stride last dim is split
    auto k = heads[1].view({klen, bsz, n_head_, d_head_});
    auto v = heads[2].view({klen, bsz, n_head_, d_head_});
    auto rk = r_net->forward(r).view({rlen, n_head_, d_head_});

    auto ac = torch::einsum("ibnd,jbnd->ijbn", {q + r_w_bias_, k});
    auto bd = rel_shift(torch::einsum("ibnd,jnd->ijbn", {q + r_r_bias_, rk}));
    auto score = ac + bd;
    score.mul_(scale_);  // LOOKALIKE: tensor-inplace-on-saved -- add keeps no operands, and nothing has read score yet
    score.masked_fill_(attn_mask.unsqueeze(-1).unsqueeze(-1), -1e30);

    auto prob = torch::softmax(score, 1);
    last_prob_ = prob.detach();
    // FACT: a=torch.randn(4,5,requires_grad=True); p=torch.softmax(a,1); torch.nn.functional.dropout(p,0.5,True,True); assert backward_fails(lambda: p.sum().backward())
    prob = dropatt->forward(prob);  // EXPECT: tensor-inplace-on-saved

    auto attn_vec = torch::einsum("ijbn,jbnd->ibnd", {prob, v});
    // FACT: e=torch.einsum('ijbn,jbnd->ibnd', torch.randn(3,5,2,2), torch.randn(5,2,2,4)); assert not is_contiguous(e) and is_copy_of(e.reshape(3,2,8), e)
    attn_vec = attn_vec.reshape({qlen, bsz, n_head_ * d_head_});  // EXPECT: tensor-reshape-non-contiguous
    auto attn_out = drop->forward(o_net->forward(attn_vec));
    return layer_norm->forward(w + attn_out);
  }
  int64_t n_head_, d_head_;
  double scale_;
  Tensor r_w_bias_, r_r_bias_, last_prob_;
  nn::Linear qkv_net{nullptr}, r_net{nullptr}, o_net{nullptr};
  nn::LayerNorm layer_norm{nullptr};
  nn::Dropout drop{nullptr}, dropatt{nullptr};
};
TORCH_MODULE(RelMultiHeadAttn);

struct PositionwiseFFImpl : nn::Module {
  explicit PositionwiseFFImpl(const TxlConfig& c)
      : fc1(register_module("fc1", nn::Linear(c.d_model, c.d_inner))),
        fc2(register_module("fc2", nn::Linear(c.d_inner, c.d_model))),
        layer_norm(register_module("layer_norm", nn::LayerNorm(nn::LayerNormOptions({c.d_model})))),
        drop(register_module("drop", nn::Dropout(c.dropout))) {}
  Tensor forward(const Tensor& inp) {
    // FACT: l=torch.nn.Linear(4,6); x=torch.randn(3,2,4,requires_grad=True); y=l(x).relu_(); y.sum().backward(); assert x.grad is not None
    auto core = fc2->forward(drop->forward(fc1->forward(inp).relu_()));  // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output
    Tensor out = inp;
    // FACT: l=torch.nn.Linear(4,4); x=torch.randn(2,4,requires_grad=True)*1; y=l(x); out=x; out+=y; assert out is x and backward_fails(lambda: out.sum().backward())
    out += drop->forward(core);  // EXPECT: tensor-alias-then-mutate, tensor-inplace-on-saved
    return layer_norm->forward(out);
  }
  nn::Linear fc1, fc2;
  nn::LayerNorm layer_norm;
  nn::Dropout drop;
};
TORCH_MODULE(PositionwiseFF);

struct DecoderLayerImpl : nn::Module {
  DecoderLayerImpl(const TxlConfig& c, const Tensor& r_w_bias, const Tensor& r_r_bias)
      : attn(register_module("attn", RelMultiHeadAttn(c, r_w_bias, r_r_bias))),
        ff(register_module("ff", PositionwiseFF(c))) {}
  Tensor forward(const Tensor& w, const Tensor& r, const Tensor& mem, const Tensor& mask) {
    return ff->forward(attn->forward(w, r, mem, mask));
  }
  RelMultiHeadAttn attn;
  PositionwiseFF ff;
};
TORCH_MODULE(DecoderLayer);

struct MemTransformerLMImpl : nn::Module {
  explicit MemTransformerLMImpl(const TxlConfig& c) : cfg_(c), emb_scale_(std::sqrt(static_cast<double>(c.d_model))) {
    word_emb = register_module("word_emb", nn::Embedding(c.n_token, c.d_model));
    pos_emb = register_module("pos_emb", PositionalEmbedding(c.d_model));
    r_w_bias = register_parameter("r_w_bias", torch::empty({c.n_head, c.d_head}));
    r_r_bias = register_parameter("r_r_bias", torch::empty({c.n_head, c.d_head}));
    nn::init::normal_(r_w_bias, 0.0, 0.02);
    nn::init::normal_(r_r_bias, 0.0, 0.02);
    for (int64_t i = 0; i < c.n_layer; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), DecoderLayer(c, r_w_bias, r_r_bias)));
    drop = register_module("drop", nn::Dropout(c.dropout));
    out_layer = register_module("out_layer", nn::Linear(c.d_model, c.n_token));
  }

  std::vector<Tensor> init_mems(int64_t bsz, torch::Device device) const {
    return std::vector<Tensor>(cfg_.n_layer + 1, torch::empty({0, bsz, cfg_.d_model}, torch::TensorOptions(device)));
  }

  // Last hidden state and the input of every layer (what the memory keeps).
  std::pair<Tensor, std::vector<Tensor>> core_forward(const Tensor& data, const std::vector<Tensor>& mems) {
    const auto qlen = data.size(0), mlen = mems[0].size(0), klen = mlen + qlen;
    auto word = word_emb->forward(data);
    // FACT: e=torch.nn.Embedding(5,3); o=e(torch.tensor([[1,2]])); o.mul_(2.0); o.sum().backward(); assert e.weight.grad is not None
    word.mul_(emb_scale_);  // LOOKALIKE: tensor-inplace-on-saved -- embedding backward needs only the indices
    auto mask = torch::ones({qlen, klen}, word.options().dtype(torch::kUInt8)).triu(1 + mlen).to(torch::kBool);  // LOOKALIKE: tensor-device-mismatch -- built with the activations' options
    auto pos = drop->forward(pos_emb->forward(klen, cfg_.clamp_len));
    auto core = drop->forward(word);
    std::vector<Tensor> hids{core};
    for (size_t i = 0; i < layers.size(); ++i) {
      core = layers[i]->forward(core, pos, mems[i], mask);
      hids.push_back(core);
    }
    return {drop->forward(core), hids};
  }

  std::vector<Tensor> update_mems(const std::vector<Tensor>& hids, const std::vector<Tensor>& mems) {
    torch::NoGradGuard no_grad;
    const int64_t end = mems[0].size(0) + hids[0].size(0);
    const int64_t beg = std::max<int64_t>(0, end - cfg_.mem_len);
    std::vector<Tensor> new_mems;
    for (size_t i = 0; i < hids.size(); ++i)
      new_mems.push_back(torch::cat({mems[i], hids[i]}, 0).slice(0, beg, end).detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached under NoGradGuard
    return new_mems;
  }

  std::pair<Tensor, std::vector<Tensor>> forward(const Tensor& data, const Tensor& target,
                                                 const std::vector<Tensor>& mems) {
    auto [hidden, hids] = core_forward(data, mems);
    auto logits = out_layer->forward(hidden);
    auto loss = F::cross_entropy(logits.view({-1, cfg_.n_token}), target.reshape({-1}).to(torch::kLong));
    return {loss, update_mems(hids, mems)};
  }
  TxlConfig cfg_;
  double emb_scale_;
  nn::Embedding word_emb{nullptr};
  PositionalEmbedding pos_emb{nullptr};
  Tensor r_w_bias, r_r_bias;
  std::vector<DecoderLayer> layers;
  nn::Dropout drop{nullptr};
  nn::Linear out_layer{nullptr};
};
TORCH_MODULE(MemTransformerLM);

// Fixed-size memory for streaming generation: new states go at the end, the oldest fall off.
struct StreamingMemory {
  StreamingMemory(int64_t n, int64_t mem_len, int64_t d_model, torch::Device device) {
    for (int64_t i = 0; i < n; ++i) bufs.push_back(torch::zeros({mem_len, 1, d_model}, torch::TensorOptions(device)));
  }

  void push(const std::vector<Tensor>& hids) {
    torch::NoGradGuard no_grad;
    const int64_t m = bufs[0].size(0), q = std::min(hids[0].size(0), m);
    for (size_t i = 0; i < bufs.size(); ++i) {
      // FACT: m=torch.zeros(6,1,4); assert raises(lambda: m.narrow(0,0,5).copy_(m.narrow(0,1,5)), "some elements")
      bufs[i].narrow(0, 0, m - q).copy_(bufs[i].narrow(0, q, m - q));  // EXPECT: tensor-inplace-overlap
      // FACT: m=torch.zeros(6,1,4); h=torch.randn(2,1,4); m.narrow(0,4,2).copy_(h); assert is_copy_of(h,m) and torch.equal(m[4:],h)
      bufs[i].narrow(0, m - q, q).copy_(hids[i].narrow(0, hids[i].size(0) - q, q));  // LOOKALIKE: tensor-inplace-overlap -- the new states live in their own storage
    }
    filled = std::min(filled + q, m);
  }

  std::vector<Tensor> view() const {
    std::vector<Tensor> out;
    for (const auto& b : bufs) out.push_back(b.narrow(0, b.size(0) - filled, filled));
    return out;
  }
  std::vector<Tensor> bufs;
  int64_t filled = 0;
};

// Mean entropy of the attention rows: flags heads that collapse onto a single position.
Tensor attention_entropy(Tensor p) {
  // FACT: a=torch.randn(3,4,requires_grad=True); p=torch.softmax(a,1); o=p@torch.randn(4,2); p.detach().clamp_min_(0.5); assert backward_fails(lambda: o.sum().backward())
  p.clamp_min_(1e-9);  // EXPECT: tensor-inplace-on-detached
  return -(p * p.log()).sum(1).mean();
}

double evaluate(MemTransformerLM& model, const TxlConfig& cfg, const Tensor& data, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto mems = model->init_mems(data.size(1), device);
  double total_nll = 0.0;
  int64_t n_tok = 0;
  for (int64_t i = 0; i + 1 < data.size(0); i += cfg.tgt_len) {
    const int64_t len = std::min(cfg.tgt_len, data.size(0) - 1 - i);
    auto inp = data.narrow(0, i, len).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different segment each iteration
    auto tgt = data.narrow(0, i + 1, len).to(device);
    auto [loss, new_mems] = model->forward(inp, tgt, mems);
    mems = std::move(new_mems);
    total_nll += len * loss.item<double>();  // EXPECT: tensor-sync-in-loop
    n_tok += len;
  }
  model->train();
  return total_nll / std::max<int64_t>(n_tok, 1);
}

std::vector<int64_t> generate(MemTransformerLM& model, const TxlConfig& cfg, const std::vector<int64_t>& prompt,
                              int64_t n_new, double temperature, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  StreamingMemory memory(cfg.n_layer + 1, cfg.mem_len, cfg.d_model, device);
  auto tok = torch::tensor(prompt, torch::kLong).to(torch::kInt32).view({-1, 1}).to(device);
  std::vector<int64_t> out;
  for (int64_t t = 0; t < n_new; ++t) {
    auto [hidden, hids] = model->core_forward(tok, memory.view());
    memory.push(hids);
    auto logits = model->out_layer->forward(hidden[-1]) / temperature;
    auto next = torch::multinomial(torch::softmax(logits, -1), 1);
    const int64_t id = next.item<int64_t>();  // LOOKALIKE: tensor-sync-in-loop -- the id decides whether generation stops
    if (id == cfg.eos_id) break;
    out.push_back(id);
    tok = next.view({1, 1}).to(torch::kInt32);
  }
  return out;
}

void train(MemTransformerLM& model, const TxlConfig& cfg, const Tensor& train_data, const Tensor& valid_data,
           torch::Device device) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  auto mems = model->init_mems(cfg.batch_size, device);
  auto log_loss = torch::zeros({}, torch::TensorOptions(device));
  int64_t step = 0;
  while (step < cfg.max_step) {
    for (int64_t i = 0; i + 1 < train_data.size(0) && step < cfg.max_step; i += cfg.tgt_len) {
      const int64_t len = std::min(cfg.tgt_len, train_data.size(0) - 1 - i);
      auto stream = train_data.to(device);  // EXPECT: tensor-clone-in-loop
      auto [loss, new_mems] = model->forward(stream.narrow(0, i, len), stream.narrow(0, i + 1, len), mems);
      mems = std::move(new_mems);
      auto head_entropy = attention_entropy(model->layers.back()->attn->last_prob_);
      const double lr = 0.5 * cfg.lr * (1.0 + std::cos(M_PI * step / cfg.max_step));
      for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamOptions&>(group.options()).lr(lr);
      opt.zero_grad();
      loss.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      log_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      if (++step % cfg.log_interval == 0) {
        const double avg = log_loss.item<double>() / cfg.log_interval;
        std::cout << "step " << step << " lr " << lr << " loss " << avg << " ppl " << std::exp(avg)
                  << " top-layer attn entropy " << head_entropy.item<double>() << '\n';
        log_loss = torch::zeros({}, torch::TensorOptions(device));
      }
      if (step % cfg.eval_interval == 0)
        std::cout << "valid ppl " << std::exp(evaluate(model, cfg, valid_data, device)) << '\n';
    }
  }
}
}  // namespace txl

int main(int argc, char** argv) {
  if (argc < 3) return std::cerr << "usage: txl <train_ids.pt> <valid_ids.pt>\n", 1;
  torch::manual_seed(1111);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  txl::TxlConfig cfg;
  torch::Tensor train_ids, valid_ids;
  torch::load(train_ids, argv[1]);
  torch::load(valid_ids, argv[2]);
  txl::MemTransformerLM model(cfg);
  model->to(device);
  txl::train(model, cfg, txl::batchify(train_ids, cfg.batch_size), txl::batchify(valid_ids, 10), device);
  for (int64_t id : txl::generate(model, cfg, {1, 17, 942}, 64, 0.8, device)) std::cout << id << ' ';
  std::cout << '\n';
  torch::save(model, "txl.pt");
  return 0;
}
