// Decode loop of a small GQA decoder over a paged KV cache: keys and values
// live in fixed-size physical blocks, each running sequence owns a row of the
// block table mapping its logical blocks to physical ones.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

struct EngineConfig {
  int64_t vocab = 32000, hidden = 512, num_layers = 4;
  int64_t num_heads = 8, num_kv_heads = 2, head_dim = 64, ffn = 1408;
  int64_t num_blocks = 2048, num_swap_blocks = 256, block_size = 16;
  int64_t max_seqs = 64, max_blocks_per_seq = 128, max_tokens = 1024, eos_id = 2;
  torch::ScalarType cache_dtype = torch::kHalf;
};

struct SequenceState {
  int64_t id = 0;
  std::vector<int64_t> tokens;
  std::vector<int64_t> blocks;  // physical block ids, in logical order
  int64_t context_len = 0;      // tokens whose K/V are in the cache
  float temperature = 0.8f, top_p = 0.95f;
  double logprob_sum = 0.0;
};

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t n) {
    for (int64_t b = n - 1; b >= 0; --b) free_.push_back(b);
  }
  int64_t allocate() {
    if (free_.empty()) throw std::runtime_error("KV cache out of blocks");
    auto b = free_.back();
    free_.pop_back();
    return b;
  }
  void release(int64_t b) { free_.push_back(b); }

 private:
  std::vector<int64_t> free_;
};

class PagedKVCache {
 public:
  PagedKVCache(const EngineConfig& cfg, torch::Device device)
      : block_size_(cfg.block_size), kv_heads_(cfg.num_kv_heads), head_dim_(cfg.head_dim) {
    auto opts = torch::TensorOptions().dtype(cfg.cache_dtype).device(device);
    auto host = torch::TensorOptions().dtype(cfg.cache_dtype);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      k_.push_back(torch::zeros({cfg.num_blocks, block_size_, kv_heads_, head_dim_}, opts));
      v_.push_back(torch::zeros({cfg.num_blocks, block_size_, kv_heads_, head_dim_}, opts));
      k_swap_.push_back(torch::empty({cfg.num_swap_blocks, block_size_, kv_heads_, head_dim_}, host));
      v_swap_.push_back(torch::empty({cfg.num_swap_blocks, block_size_, kv_heads_, head_dim_}, host));
    }
  }

  void write(int64_t layer, const torch::Tensor& slots, const torch::Tensor& k, const torch::Tensor& v) {
    auto kc = k_[layer].view({-1, kv_heads_, head_dim_});
    auto vc = v_[layer].view({-1, kv_heads_, head_dim_});
    kc.index_copy_(0, slots, k.to(kc.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the conversion to the cache dtype is explicit
    vc.index_copy_(0, slots, v.to(vc.scalar_type()));
  }

  // Keys/values of every sequence, laid out per kv head over its padded context.
  std::pair<torch::Tensor, torch::Tensor> gather(int64_t layer, const torch::Tensor& tables) const {
    const int64_t S = tables.size(0), MB = tables.size(1);
    auto flat = tables.view(-1);
    // FACT: kb=torch.randn(6,4,2,3).index_select(0, torch.tensor([2,0,5,1,3,4])); assert is_view_of(kb.view(2,3,4,2,3).permute(0,3,1,2,4).reshape(2,2,12,3), kb)
    auto to_heads = [&](const torch::Tensor& blocks) {
      return blocks.view({S, MB, block_size_, kv_heads_, head_dim_}).permute({0, 3, 1, 2, 4}).reshape({S, kv_heads_, MB * block_size_, head_dim_});  // LOOKALIKE: tensor-reshape-non-contiguous -- block and slot stay adjacent after the permute, so the merge is a view
    };
    return {to_heads(k_[layer].index_select(0, flat)), to_heads(v_[layer].index_select(0, flat))};
  }

  // Preemption: park a block in host memory.
  void swap_out(int64_t gpu_block, int64_t cpu_block) {
    for (size_t l = 0; l < k_.size(); ++l) {
      for (int kv = 0; kv < 2; ++kv) {
        auto& host = kv ? v_swap_[l] : k_swap_[l];
        host[cpu_block].copy_((kv ? v_ : k_)[l][gpu_block], /*non_blocking=*/true);  // LOOKALIKE: tensor-device-mismatch -- copy_ between devices is allowed
      }
    }
  }

  // Defragmentation: slide a run of used blocks down into the free hole before it.
  void move_blocks(int64_t src, int64_t dst, int64_t n) {
    for (auto* pool : {&k_, &v_}) {
      for (auto& t : *pool) {
        // FACT: k=torch.randn(10,2,3); assert raises(lambda: k.narrow(0,2,6).copy_(k.narrow(0,4,6)), "single memory location")
        t.narrow(0, dst, n).copy_(t.narrow(0, src, n));  // EXPECT: tensor-inplace-overlap
      }
    }
  }

 private:
  int64_t block_size_, kv_heads_, head_dim_;
  std::vector<torch::Tensor> k_, v_, k_swap_, v_swap_;
};

struct RunningBatch {
  explicit RunningBatch(const EngineConfig& cfg)
      : tables(torch::zeros({cfg.max_seqs, cfg.max_blocks_per_seq}, torch::kInt)) {}

  void admit(SequenceState seq) {
    const auto row = static_cast<int64_t>(seqs.size());
    // FACT: t=torch.zeros(2,4,dtype=torch.int32); t[0].narrow(0,0,2).copy_(torch.tensor([2**31+5, 7])); assert t[0,0].item() != 2**31+5
    tables[row].narrow(0, 0, seq.blocks.size()).copy_(torch::tensor(seq.blocks));  // EXPECT: tensor-copy-narrowing
    seqs.push_back(std::move(seq));
  }

  void append_block(int64_t row, int64_t block) {
    seqs[row].blocks.push_back(block);
    tables[row][static_cast<int64_t>(seqs[row].blocks.size()) - 1] = block;
  }

  SequenceState retire(int64_t row, BlockAllocator& alloc) {
    SequenceState done = std::move(seqs[row]);
    for (auto b : done.blocks) alloc.release(b);
    const int64_t tail = static_cast<int64_t>(seqs.size()) - row - 1;
    // FACT: t=torch.arange(12,dtype=torch.int32).view(4,3); src=t.narrow(0,2,2).clone(); t.narrow(0,1,2).copy_(src); assert is_copy_of(src,t) and t[1].tolist()==[6,7,8]
    if (tail > 0) tables.narrow(0, row, tail).copy_(tables.narrow(0, row + 1, tail).clone());  // LOOKALIKE: tensor-inplace-overlap, tensor-unnecessary-clone -- the clone gives the shift a separate source
    tables[row + tail].zero_();
    seqs.erase(seqs.begin() + row);
    return done;
  }

  torch::Tensor tables;
  std::vector<SequenceState> seqs;
};

struct DecodeMetadata {
  torch::Tensor input_ids, positions, context_lens, slot_mapping, block_tables;
};

DecodeMetadata prepare_decode(RunningBatch& batch, BlockAllocator& alloc, const EngineConfig& cfg) {
  const auto S = static_cast<int64_t>(batch.seqs.size());
  std::vector<int64_t> lens, last;
  int64_t max_blocks = 1;
  for (int64_t i = 0; i < S; ++i) {
    auto& seq = batch.seqs[i];
    if (seq.context_len % cfg.block_size == 0) batch.append_block(i, alloc.allocate());
    seq.context_len += 1;
    lens.push_back(seq.context_len);
    last.push_back(seq.tokens.back());
    max_blocks = std::max<int64_t>(max_blocks, seq.blocks.size());
  }
  DecodeMetadata meta;
  meta.input_ids = torch::tensor(last);
  meta.block_tables = batch.tables.narrow(0, 0, S).narrow(1, 0, max_blocks).contiguous();
  meta.context_lens = torch::tensor(lens);
  // FACT: c=torch.tensor([3,5]); p=c.to(torch.long); p.sub_(1); assert c.tolist()==[2,4]
  meta.positions = meta.context_lens.to(torch::kLong);
  meta.positions.sub_(1);  // EXPECT: tensor-alias-then-mutate
  auto slot_base = meta.block_tables.to(torch::kLong);
  // FACT: t=torch.tensor([[3,5]],dtype=torch.int32); b=t.to(torch.long); b.mul_(16); assert is_copy_of(b,t) and t.tolist()==[[3,5]]
  slot_base.mul_(cfg.block_size);  // LOOKALIKE: tensor-alias-then-mutate -- the table is int32, to(kLong) allocates
  auto block_idx = meta.positions.div(cfg.block_size, "floor").unsqueeze(1);
  meta.slot_mapping = slot_base.gather(1, block_idx).squeeze(1) + meta.positions.remainder(cfg.block_size);
  return meta;
}

// Grouped-query attention: every kv head serves num_heads / num_kv_heads query heads.
torch::Tensor repeat_kv(const torch::Tensor& t, int64_t n_rep) {
  if (n_rep == 1) return t;
  const auto B = t.size(0), Hkv = t.size(1), L = t.size(2), D = t.size(3);
  // FACT: k=torch.randn(2,2,7,3); assert is_copy_of(k.unsqueeze(2).expand(2,2,3,7,3).reshape(2,6,7,3), k)
  return t.unsqueeze(2).expand({B, Hkv, n_rep, L, D}).reshape({B, Hkv * n_rep, L, D});  // EXPECT: tensor-reshape-non-contiguous
}

struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(const EngineConfig& cfg, int64_t idx)
      : idx_(idx), H(cfg.num_heads), Hkv(cfg.num_kv_heads), D(cfg.head_dim), scale_(1.0 / std::sqrt(cfg.head_dim)) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(cfg.hidden, (H + 2 * Hkv) * D).bias(false)));
    o_proj = register_module("o_proj", torch::nn::Linear(torch::nn::LinearOptions(H * D, cfg.hidden).bias(false)));
    fc1 = register_module("fc1", torch::nn::Linear(cfg.hidden, cfg.ffn));
    fc2 = register_module("fc2", torch::nn::Linear(cfg.ffn, cfg.hidden));
  }

  torch::Tensor mlp(const torch::Tensor& h) { return h + fc2(torch::gelu(fc1(ln2(h)))); }

  // One new token per sequence.
  torch::Tensor forward(const torch::Tensor& x, PagedKVCache& cache, const DecodeMetadata& meta,
                        const torch::Tensor& slots, const torch::Tensor& tables) {
    const int64_t S = x.size(0);
    auto parts = qkv(ln1(x)).split({H * D, Hkv * D, Hkv * D}, -1);
    // FACT: qkv=torch.randn(3,32); q=qkv.split([16,8,8],-1)[0]; assert not is_contiguous(q) and is_view_of(q.view(3,4,4), qkv)
    auto q = parts[0].view({S, H, D});  // LOOKALIKE: tensor-view-non-contiguous -- only the contiguous last dim of the split is divided
    cache.write(idx_, slots, parts[1].view({S, Hkv, D}), parts[2].view({S, Hkv, D}));
    auto kv = cache.gather(idx_, tables);
    auto keys = repeat_kv(kv.first.to(q.scalar_type()), H / Hkv);
    auto values = repeat_kv(kv.second.to(q.scalar_type()), H / Hkv);
    const int64_t L = keys.size(2);
    auto scores = torch::matmul(q.unsqueeze(2), keys.transpose(-2, -1)).mul_(scale_);
    auto past_end = torch::arange(L, torch::TensorOptions().dtype(torch::kLong).device(x.device())).unsqueeze(0) >= meta.context_lens.unsqueeze(1);  // EXPECT: tensor-device-mismatch
    auto bias = torch::zeros({1, L}, scores.options()).expand({S, L});
    // FACT: b=torch.zeros(1,4).expand(3,4); b.masked_fill_(torch.arange(4).unsqueeze(0) >= torch.tensor([[2],[3],[4]]), float('-inf')); assert shares_storage(b[0], b[2]) and b[2].isinf().sum()==2
    bias.masked_fill_(past_end, -INFINITY);  // EXPECT: tensor-inplace-on-expanded
    auto ctx = torch::matmul(torch::softmax(scores + bias.unsqueeze(1).unsqueeze(1), -1), values);
    // FACT: c=torch.randn(2,4,1,3); assert is_view_of(c.transpose(1,2).view(2,12), c)
    return mlp(x + o_proj(ctx.transpose(1, 2).view({S, H * D})));  // LOOKALIKE: tensor-view-non-contiguous -- the swapped query dim has size 1
  }

  // Prompt processing: T tokens of one sequence, causal attention, K/V into its blocks.
  torch::Tensor forward_prefill(const torch::Tensor& x, PagedKVCache& cache, const torch::Tensor& slots) {
    const int64_t T = x.size(0);
    auto parts = qkv(ln1(x)).split({H * D, Hkv * D, Hkv * D}, -1);
    auto k = parts[1].view({T, Hkv, D}), v = parts[2].view({T, Hkv, D});
    cache.write(idx_, slots, k, v);
    auto q = parts[0].view({T, H, D}).transpose(0, 1);
    auto keys = repeat_kv(k.transpose(0, 1).unsqueeze(0), H / Hkv)[0];
    auto values = repeat_kv(v.transpose(0, 1).unsqueeze(0), H / Hkv)[0];
    auto scores = torch::matmul(q, keys.transpose(1, 2)) * scale_;
    scores.masked_fill_(torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1), -INFINITY);
    auto ctx = torch::matmul(torch::softmax(scores, -1), values);
    // FACT: c=torch.randn(4,5,3); assert raises(lambda: c.transpose(0,1).view(5,12), "view size is not compatible")
    return mlp(x + o_proj(ctx.transpose(0, 1).view({T, H * D})));  // EXPECT: tensor-view-non-contiguous
  }

  int64_t idx_, H, Hkv, D;
  double scale_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, o_proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct DecoderLMImpl : torch::nn::Module {
  explicit DecoderLMImpl(const EngineConfig& cfg) {
    embed = register_module("embed", torch::nn::Embedding(cfg.vocab, cfg.hidden));
    for (int64_t i = 0; i < cfg.num_layers; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), DecoderLayer(cfg, i)));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.hidden})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.hidden, cfg.vocab).bias(false)));
  }
  torch::nn::Embedding embed{nullptr};
  std::vector<DecoderLayer> layers;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(DecoderLM);

// Temperature + nucleus sampling; also returns the log-probability of each pick.
torch::Tensor sample(const torch::Tensor& logits, const std::vector<SequenceState>& seqs, torch::Tensor& chosen_logp) {
  std::vector<float> temps, top_ps;
  for (const auto& s : seqs) {
    temps.push_back(s.temperature);
    top_ps.push_back(s.top_p);
  }
  auto opts = torch::TensorOptions().dtype(torch::kFloat).device(logits.device());
  auto scaled = logits.clone();  // EXPECT: tensor-unnecessary-clone
  scaled.div_(torch::tensor(temps, opts).clamp_min(1e-5).unsqueeze(1));
  auto sorted = scaled.sort(-1, /*descending=*/true);
  auto probs = torch::softmax(std::get<0>(sorted), -1);
  auto before = probs.cumsum(-1) - probs;
  probs.masked_fill_(before > torch::tensor(top_ps, opts).unsqueeze(1), 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- runs under InferenceMode, softmax saved nothing
  auto next = std::get<1>(sorted).gather(1, torch::multinomial(probs, 1)).squeeze(1);
  chosen_logp = torch::log_softmax(scaled, -1).gather(1, next.unsqueeze(1)).squeeze(1);
  return next;
}

void prefill(DecoderLM& model, PagedKVCache& cache, BlockAllocator& alloc, RunningBatch& batch,
             SequenceState seq, const EngineConfig& cfg, torch::Device device) {
  torch::InferenceMode guard;
  // The last prompt token is fed by the first decode step.
  const auto T = static_cast<int64_t>(seq.tokens.size()) - 1;
  std::vector<int64_t> slots;
  for (int64_t t = 0; t < T; ++t) {
    if (t % cfg.block_size == 0) seq.blocks.push_back(alloc.allocate());
    slots.push_back(seq.blocks.back() * cfg.block_size + t % cfg.block_size);
  }
  auto slot_t = torch::tensor(slots).to(device);
  auto ids = torch::tensor(std::vector<int64_t>(seq.tokens.begin(), seq.tokens.end() - 1)).to(device);
  auto x = model->embed(ids);
  for (auto& layer : model->layers) x = layer->forward_prefill(x, cache, slot_t);
  seq.context_len = T;
  batch.admit(std::move(seq));
}

std::vector<SequenceState> generate(DecoderLM& model, PagedKVCache& cache, BlockAllocator& alloc,
                                    RunningBatch& batch, const EngineConfig& cfg, torch::Device device) {
  torch::InferenceMode guard;
  std::vector<SequenceState> finished;
  while (!batch.seqs.empty()) {
    auto meta = prepare_decode(batch, alloc, cfg);
    auto slots = meta.slot_mapping.to(device);
    auto x = model->embed(meta.input_ids.to(device));
    for (auto& layer : model->layers) {
      auto tables = meta.block_tables.to(device);  // EXPECT: tensor-clone-in-loop
      x = layer->forward(x, cache, meta, slots, tables);
    }
    torch::Tensor logp;
    auto next = sample(model->lm_head(model->norm(x)), batch.seqs, logp);
    auto next_host = next.to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the tokens decide EOS and block allocation on the host
    auto tok = next_host.accessor<int64_t, 1>();
    for (int64_t i = static_cast<int64_t>(batch.seqs.size()) - 1; i >= 0; --i) {
      auto& seq = batch.seqs[i];
      seq.tokens.push_back(tok[i]);
      seq.logprob_sum += logp[i].item<double>();  // EXPECT: tensor-sync-in-loop
      if (tok[i] == cfg.eos_id || static_cast<int64_t>(seq.tokens.size()) >= cfg.max_tokens)
        finished.push_back(batch.retire(i, alloc));
    }
  }
  return finished;
}
