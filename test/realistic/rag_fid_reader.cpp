// Retrieval-augmented generation: a bi-encoder chunk index searched by inner
// product, and a Fusion-in-Decoder reader that encodes (question, passage) pairs
// independently and lets the decoder cross-attend over all of them at once. The
// retriever is trained by distilling the reader's cross-attention mass (FiD-KD).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct RagConfig {
  int64_t vocab = 32128, d_model = 512, heads = 8, enc_layers = 4, dec_layers = 4, d_ff = 2048;
  int64_t embed_dim = 256, chunk_len = 96, question_len = 32, answer_len = 24, top_k = 8;
  int64_t pad_id = 0, bos_id = 1, batch = 4, log_every = 20;
  double dropout = 0.1, kd_tau = 0.1;
};

struct ChunkEncoderImpl : torch::nn::Module {
  explicit ChunkEncoderImpl(const RagConfig& cfg) : pad_id(cfg.pad_id) {
    tok = register_module("tok", torch::nn::Embedding(
        torch::nn::EmbeddingOptions(cfg.vocab, cfg.d_model).padding_idx(cfg.pad_id)));
    type = register_module("type", torch::nn::Embedding(2, cfg.d_model));
    auto layer = torch::nn::TransformerEncoderLayerOptions(cfg.d_model, cfg.heads)
                     .dim_feedforward(cfg.d_ff).dropout(cfg.dropout);
    encoder = register_module("encoder", torch::nn::TransformerEncoder(
        torch::nn::TransformerEncoderOptions(layer, 2)));
    pool = register_module("pool", torch::nn::Linear(cfg.d_model, cfg.embed_dim));
    type->weight[0].zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  // type 0: passage, type 1: question.
  torch::Tensor forward(const torch::Tensor& ids, int64_t type_id) {
    auto pad = ids.eq(pad_id);
    auto x = tok(ids) + type(torch::full_like(ids, type_id));
    auto h = encoder->forward(x.transpose(0, 1), {}, pad).transpose(0, 1);
    auto keep = pad.logical_not().unsqueeze(-1).to(h.scalar_type());
    auto mean = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0);
    auto emb = torch::tanh(pool(mean));
    // FACT: w=torch.randn(2,4,requires_grad=True); q=torch.tanh(w); q.div_(q.norm(2,-1,True)); assert backward_fails(lambda: q.sum().backward())
    emb.div_(emb.norm(2, -1, /*keepdim=*/true).clamp_min(1e-6));  // EXPECT: tensor-inplace-on-saved
    return emb;
  }

  int64_t pad_id;
  torch::nn::Embedding tok{nullptr}, type{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
  torch::nn::Linear pool{nullptr};
};
TORCH_MODULE(ChunkEncoder);

class ChunkIndex {
 public:
  ChunkIndex(int64_t capacity, int64_t dim, torch::Device device)
      : embeddings_(torch::empty({capacity, dim}, torch::dtype(torch::kHalf).device(device))),
        doc_ids_(torch::empty({capacity}, torch::dtype(torch::kLong).device(device))) {}

  void add(const torch::Tensor& embs, const torch::Tensor& tokens, const torch::Tensor& docs) {
    torch::NoGradGuard no_grad;
    const int64_t n = embs.size(0);
    // FACT: e=torch.randn(3,4); assert is_copy_of(e.to(torch.float32, copy=True), e)
    auto block = embs.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    block.div_(block.norm(2, 1, /*keepdim=*/true).clamp_min(1e-6));  // LOOKALIKE: tensor-alias-then-mutate -- copy=true always hands back a new tensor
    embeddings_.narrow(0, size_, n).copy_(block);  // EXPECT: tensor-copy-narrowing
    doc_ids_.narrow(0, size_, n).copy_(docs);
    token_blocks_.push_back(tokens.cpu());
    size_ += n;
  }

  void finalize() {
    tokens_ = torch::cat(token_blocks_, 0);
    token_blocks_.clear();
  }

  // Exact inner-product search, block by block so the score matrix stays small.
  std::pair<torch::Tensor, torch::Tensor> search(const torch::Tensor& queries, int64_t k,
                                                 int64_t block = 65536) const {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> best_scores, best_ids;
    for (int64_t start = 0; start < size_; start += block) {
      const int64_t len = std::min(block, size_ - start);
      auto keys = embeddings_.narrow(0, start, len);
      auto q = queries.to(keys.scalar_type());  // EXPECT: tensor-clone-in-loop
      auto sims = torch::matmul(q, keys.t()).to(torch::kFloat);
      auto top = sims.topk(std::min(k, len), /*dim=*/1);
      best_scores.push_back(std::get<0>(top));  // LOOKALIKE: tensor-graph-kept-across-iterations -- search runs under NoGradGuard, the candidates carry no graph
      best_ids.push_back(std::get<1>(top) + start);
    }
    auto scores = torch::cat(best_scores, 1);
    auto merged = scores.topk(k, 1);
    return {std::get<0>(merged), torch::cat(best_ids, 1).gather(1, std::get<1>(merged))};
  }

  torch::Tensor chunk_tokens(const torch::Tensor& ids) const {
    return tokens_.index_select(0, ids.flatten());  // EXPECT: tensor-device-mismatch
  }

  torch::Tensor chunk_docs(const torch::Tensor& ids) const {
    return doc_ids_.index_select(0, ids.flatten()).view_as(ids);  // LOOKALIKE: tensor-device-mismatch -- doc ids live on the index device, next to the search results
  }

 private:
  torch::Tensor embeddings_, doc_ids_, tokens_;
  std::vector<torch::Tensor> token_blocks_;
  int64_t size_ = 0;
};

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d_model, int64_t heads, double dropout)
      : heads(heads), head_dim(d_model / heads) {
    q_proj = register_module("q_proj", torch::nn::Linear(d_model, d_model));
    k_proj = register_module("k_proj", torch::nn::Linear(d_model, d_model));
    v_proj = register_module("v_proj", torch::nn::Linear(d_model, d_model));
    o_proj = register_module("o_proj", torch::nn::Linear(d_model, d_model));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mem,
                        const torch::Tensor& key_pad, const torch::Tensor& causal) {
    const auto B = x.size(0), T = x.size(1), M = mem.size(1);
    auto split = [&](const torch::Tensor& t) {
      // FACT: t=torch.randn(2,5,12); assert is_copy_of(t.view(2,-1,4,3).permute(0,2,1,3).reshape(8,-1,3), t)
      return t.view({B, -1, heads, head_dim}).permute({0, 2, 1, 3}).reshape({B * heads, -1, head_dim});  // EXPECT: tensor-reshape-non-contiguous
    };
    auto q = split(q_proj(x)), k = split(k_proj(mem)), v = split(v_proj(mem));
    auto scores = torch::bmm(q, k.transpose(1, 2)).view({B, heads, T, M}) / std::sqrt(static_cast<double>(head_dim));
    if (key_pad.defined()) scores = scores.masked_fill(key_pad.view({B, 1, 1, M}), -1e4);
    if (causal.defined()) scores = scores.masked_fill(causal, -1e4);
    auto attn = torch::softmax(scores, -1);
    if (record_mass) {
      // Average attention over heads and decoder positions: the relevance signal
      // the retriever is distilled from.
      auto a = attn.detach();
      a.div_(static_cast<double>(heads * T));  // EXPECT: tensor-inplace-on-detached
      last_mass = a.sum(2).sum(1);
    }
    auto ctx = torch::bmm(drop(attn).view({B * heads, T, M}), v);
    // FACT: c=torch.randn(2,4,3,8); p=c.permute(0,2,1,3).contiguous(); assert is_copy_of(p, c) and is_view_of(p.view(2,3,32), p)
    return o_proj(ctx.view({B, heads, T, head_dim}).permute({0, 2, 1, 3}).contiguous().view({B, T, heads * head_dim}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() comes first
  }

  int64_t heads, head_dim;
  bool record_mass = false;
  torch::Tensor last_mass;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Attention);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const RagConfig& cfg) {
    self_attn = register_module("self_attn", Attention(cfg.d_model, cfg.heads, cfg.dropout));
    cross_attn = register_module("cross_attn", Attention(cfg.d_model, cfg.heads, cfg.dropout));
    cross_attn->record_mass = true;
    ff = register_module("ff", torch::nn::Sequential(
        torch::nn::Linear(cfg.d_model, cfg.d_ff), torch::nn::GELU(), torch::nn::Linear(cfg.d_ff, cfg.d_model)));
    for (auto name : {"ln1", "ln2", "ln3"}) {
      lns.push_back(register_module(name, torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model}))));
    }
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& memory, const torch::Tensor& mem_pad,
                        const torch::Tensor& causal) {
    auto h = lns[0](x);
    x = x + self_attn->forward(h, h, {}, causal);
    x = x + cross_attn->forward(lns[1](x), memory, mem_pad, {});
    return x + ff->forward(lns[2](x));
  }

  Attention self_attn{nullptr}, cross_attn{nullptr};
  torch::nn::Sequential ff{nullptr};
  std::vector<torch::nn::LayerNorm> lns;
};
TORCH_MODULE(DecoderLayer);

struct FiDReaderImpl : torch::nn::Module {
  explicit FiDReaderImpl(const RagConfig& cfg) : cfg(cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    auto layer = torch::nn::TransformerEncoderLayerOptions(cfg.d_model, cfg.heads)
                     .dim_feedforward(cfg.d_ff).dropout(cfg.dropout);
    encoder = register_module("encoder", torch::nn::TransformerEncoder(
        torch::nn::TransformerEncoderOptions(layer, cfg.enc_layers)));
    for (int64_t i = 0; i < cfg.dec_layers; ++i) {
      decoder.push_back(register_module("dec" + std::to_string(i), DecoderLayer(cfg)));
    }
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
  }

  // inputs: question + passage per retrieved chunk, encoded independently, then fused.
  torch::Tensor forward(const torch::Tensor& inputs, const torch::Tensor& dec_in) {
    const auto B = inputs.size(0), K = inputs.size(1), L = inputs.size(2), T = dec_in.size(1);
    auto flat = inputs.reshape({B * K, L});
    auto pad = flat.eq(cfg.pad_id);
    auto h = encoder->forward(embed(flat).transpose(0, 1), {}, pad);
    // FACT: e=torch.randn(5,6,8); assert is_view_of(e.transpose(0,1).reshape(2,3,5,8), e)
    auto per_passage = h.transpose(0, 1).reshape({B, K, L, cfg.d_model});  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits the passage dim, which strides can express
    // FACT: e=torch.randn(5,6,8); p=e.transpose(0,1).reshape(2,3,5,8); assert raises(lambda: p.view(2,15,8), "view size is not compatible")
    auto memory = per_passage.view({B, K * L, cfg.d_model});  // EXPECT: tensor-view-non-contiguous
    // FACT: f=torch.randint(0,5,(6,4)); p=f.eq(0); assert is_view_of(p.view(2,12), p)
    auto mem_pad = pad.view({B, K * L});  // LOOKALIKE: tensor-view-non-contiguous -- eq() returns a fresh contiguous mask
    auto causal = torch::ones({T, T}, torch::dtype(torch::kBool).device(dec_in.device())).triu(1);
    auto x = embed(dec_in);
    for (auto& layer : decoder) x = layer(x, memory, mem_pad, causal);
    return torch::matmul(ln_f(x), embed->weight.t());
  }

  // Per-passage relevance from the last forward, summed over decoder layers.
  torch::Tensor passage_mass(int64_t K) const {
    auto mass = decoder.front()->cross_attn->last_mass;
    for (size_t i = 1; i < decoder.size(); ++i) mass = mass + decoder[i]->cross_attn->last_mass;
    return mass.view({mass.size(0), K, -1}).sum(2);
  }

  RagConfig cfg;
  torch::nn::Embedding embed{nullptr};
  torch::nn::TransformerEncoder encoder{nullptr};
  std::vector<DecoderLayer> decoder;
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(FiDReader);

// Returns the distillation loss and the raw question-passage cosines for logging.
std::pair<torch::Tensor, torch::Tensor> retriever_kd_loss(const torch::Tensor& q, const torch::Tensor& p,
                                                          const torch::Tensor& mass, double tau) {
  auto scores = torch::matmul(q.unsqueeze(1), p.transpose(1, 2)).squeeze(1);
  auto logits = scores;
  // FACT: q=torch.randn(2,1,4,requires_grad=True); p=torch.randn(2,3,4,requires_grad=True); s=torch.matmul(q,p.transpose(1,2)).squeeze(1); l=s; l.div_(0.1); l.sum().backward(); assert shares_storage(l, s) and q.grad is not None
  logits.div_(tau);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-inplace-on-saved -- matmul saved its operands, not its result
  auto target = mass / mass.sum(1, /*keepdim=*/true);
  auto kd = F::kl_div(F::log_softmax(logits, 1), target, F::KLDivFuncOptions().reduction(torch::kBatchMean));
  return {kd, scores.detach()};
}

void train(const RagConfig& cfg, int64_t steps) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ChunkEncoder retriever(cfg);
  FiDReader reader(cfg);
  retriever->to(device);
  reader->to(device);
  {
    torch::NoGradGuard no_grad;
    retriever->tok->weight.detach().copy_(reader->embed->weight);  // LOOKALIKE: tensor-inplace-on-detached -- writes the retriever's table on purpose, under NoGradGuard
  }

  const int64_t num_chunks = 20000, chunks_per_doc = 8;
  auto corpus = torch::randint(2, cfg.vocab, {num_chunks, cfg.chunk_len}, torch::kLong);
  auto doc_of_chunk = torch::arange(num_chunks, torch::kLong).div(chunks_per_doc, "floor");
  ChunkIndex index(num_chunks, cfg.embed_dim, device);
  {
    torch::NoGradGuard no_grad;
    retriever->eval();
    for (int64_t start = 0; start < num_chunks; start += 512) {
      const int64_t n = std::min<int64_t>(512, num_chunks - start);
      auto toks = corpus.narrow(0, start, n);
      index.add(retriever(toks.to(device), 0), toks, doc_of_chunk.narrow(0, start, n).to(device));
    }
    index.finalize();
  }

  std::vector<torch::Tensor> params = reader->parameters();
  for (auto& p : retriever->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-4).weight_decay(0.01));
  retriever->train();
  reader->train();

  auto loss_acc = torch::zeros({}, torch::TensorOptions().device(device));
  auto hits = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t tokens_seen = 0;
  const int64_t B = cfg.batch, K = cfg.top_k;
  for (int64_t step = 1; step <= steps; ++step) {
    auto pick = torch::randint(num_chunks, {B}, torch::kLong);
    auto chunk = corpus.index_select(0, pick).to(device);
    auto question = chunk.narrow(1, 0, cfg.question_len);
    auto answer = chunk.narrow(1, cfg.question_len, cfg.answer_len);
    auto gold_doc = doc_of_chunk.index_select(0, pick).to(device);

    auto q_emb = retriever(question, 1);
    auto hit_ids = std::get<1>(index.search(q_emb.detach(), K));
    hits += index.chunk_docs(hit_ids).eq(gold_doc.unsqueeze(1)).any(1).sum();  // LOOKALIKE: tensor-sync-in-loop -- counted on the device, read only at log time
    auto passages = index.chunk_tokens(hit_ids).to(device);

    auto fid_in = torch::cat({question.unsqueeze(1).expand({B, K, cfg.question_len}),
                              passages.view({B, K, cfg.chunk_len})}, 2);
    auto dec_in = torch::cat({torch::full({B, 1}, cfg.bos_id, answer.options()),
                              answer.narrow(1, 0, cfg.answer_len - 1)}, 1);
    auto logits = reader(fid_in, dec_in);
    auto lm_loss = F::cross_entropy(logits.transpose(1, 2), answer);
    tokens_seen += answer.ne(cfg.pad_id).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop

    auto p_emb = retriever(passages, 0).view({B, K, -1});
    auto [kd, cosines] = retriever_kd_loss(q_emb, p_emb, reader->passage_mass(K), cfg.kd_tau);
    auto loss = lm_loss + kd;
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();

    loss_acc += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached before it is accumulated
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " loss " << (loss_acc / cfg.log_every).item<double>()
                << " recall@" << K << " " << hits.item<double>() / (B * cfg.log_every)
                << " mean cos " << cosines.mean().item<double>() << " tokens " << tokens_seen << std::endl;
      loss_acc.zero_();
      hits.zero_();
    }
  }
}

int main() {
  RagConfig cfg;
  train(cfg, 500);
}
