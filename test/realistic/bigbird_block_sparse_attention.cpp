// BigBird-style block-sparse self-attention (ITC variant) and a small MLM encoder around it.
//
// The sequence is cut into nb blocks of block_size tokens. Every query block attends to
//   - the first and last block (global keys),
//   - its left neighbour, itself and its right neighbour (sliding window, built with roll),
//   - num_rand_blocks random blocks sampled per forward pass.
// The first and last query blocks are global queries and attend to the whole sequence.
// Sequences are padded to a multiple of block_size by the caller.

#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct BigBirdConfig {
  int64_t vocab_size = 30522;
  int64_t max_len = 4096;
  int64_t d_model = 768;
  int64_t n_heads = 12;
  int64_t n_layers = 4;
  int64_t block_size = 64;
  int64_t num_rand_blocks = 3;
  int64_t pad_id = 0;
  int64_t mask_id = 103;
  double dropout = 0.1;
  double mlm_prob = 0.15;
};

// [nb, r] indices of random key blocks for every query block, drawn from the non-global blocks
// outside the query block's window. Rows 0 and nb-1 (global queries) are not used.
torch::Tensor sample_random_blocks(int64_t nb, int64_t r) {
  auto idx = torch::empty({nb, r}, torch::kLong);
  auto candidates = torch::arange(1, nb - 1);
  for (int64_t i = 0; i < nb; ++i) {
    auto far = candidates.masked_select((candidates - i).abs() > 1);
    auto pick = far.index_select(0, torch::randperm(far.size(0)).narrow(0, 0, r));
    idx[i] = pick;  // LOOKALIKE: tensor-copy-narrowing -- int64 indices into an int64 row
  }
  return idx;
}

struct BlockSparseAttentionImpl : torch::nn::Module {
  explicit BlockSparseAttentionImpl(const BigBirdConfig& cfg)
      : n_heads_(cfg.n_heads), block_size_(cfg.block_size), num_rand_(cfg.num_rand_blocks) {
    qkv = register_module("qkv", torch::nn::Linear(cfg.d_model, 3 * cfg.d_model));
    out = register_module("out", torch::nn::Linear(cfg.d_model, cfg.d_model));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }

  // x: [B, L, C]; key_bias: [B, L], 0 for real tokens and -1e4 for padding.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_bias) {
    const auto B = x.size(0), L = x.size(1), C = x.size(2);
    const auto H = n_heads_, D = C / n_heads_, bs = block_size_, nb = L / block_size_, r = num_rand_;
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));

    auto proj = qkv(x).view({B, L, 3, H, D});
    auto q = proj.select(2, 0).permute({0, 2, 1, 3});  // [B, H, L, D]
    auto k = proj.select(2, 1).permute({0, 2, 1, 3});
    auto v = proj.select(2, 2).permute({0, 2, 1, 3});

    // FACT: t = torch.randn(2, 8, 3, 2, 4).select(2, 0).permute(0, 2, 1, 3); assert not is_contiguous(t) and is_view_of(t.view(2, 2, 4, 2, 4), t)
    auto qb = q.view({B, H, nb, bs, D});  // LOOKALIKE: tensor-view-non-contiguous -- only splits L, whose stride survives the permute
    // FACT: t = torch.randn(2, 8, 3, 2, 4).select(2, 1).permute(0, 2, 1, 3); assert is_view_of(t.reshape(2, 2, 4, 2, 4), t)
    auto kb = k.reshape({B, H, nb, bs, D});  // LOOKALIKE: tensor-reshape-non-contiguous -- splitting one dim is a view
    auto vb = v.reshape({B, H, nb, bs, D});

    // ---- keys/values for the sparse query blocks: [global | window | random] along dim 3
    auto glob_k = torch::cat({kb.select(2, 0), kb.select(2, nb - 1)}, 2).unsqueeze(2).expand({B, H, nb, 2 * bs, D});
    auto glob_v = torch::cat({vb.select(2, 0), vb.select(2, nb - 1)}, 2).unsqueeze(2).expand({B, H, nb, 2 * bs, D});
    auto win_k = torch::cat({torch::roll(kb, 1, 2), kb, torch::roll(kb, -1, 2)}, 3);
    auto win_v = torch::cat({torch::roll(vb, 1, 2), vb, torch::roll(vb, -1, 2)}, 3);

    auto ridx = sample_random_blocks(nb, r).flatten().to(x.device());
    auto gather_random = [&](const torch::Tensor& blocks) {
      // FACT: t = torch.randn(2, 8, 3, 2, 4).select(2, 1).permute(0, 2, 1, 3).reshape(2, 2, 4, 2, 4); assert raises(lambda: t.view(4, 4, 8), "view size is not compatible")
      auto flat = blocks.view({B * H, nb, bs * D});  // EXPECT: tensor-view-non-contiguous
      // FACT: f = torch.randn(4, 4, 8); g = f.index_select(1, torch.tensor([2, 3, 0, 3, 0, 1, 1, 2])); assert is_contiguous(g) and is_view_of(g.view(2, 2, 4, 4, 4), g)
      return flat.index_select(1, ridx).view({B, H, nb, r * bs, D});  // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
    };
    auto rand_k = gather_random(kb);
    auto rand_v = gather_random(vb);

    auto keys = torch::cat({glob_k, win_k, rand_k}, 3);  // [B, H, nb, (5 + r) * bs, D]
    auto values = torch::cat({glob_v, win_v, rand_v}, 3);

    // ---- additive bias over the same key layout, broadcast over heads and query rows
    auto kbias = key_bias.view({B, 1, nb, 1, bs});
    auto glob_bias = torch::cat({kbias.select(2, 0), kbias.select(2, nb - 1)}, -1).unsqueeze(2).expand({B, 1, nb, 1, 2 * bs});
    // roll wraps the last block in front of block 0 and block 0 behind the last one: mask those.
    auto edge = torch::zeros({1, 1, nb, 1, 3 * bs}, x.options());
    edge.select(2, 0).narrow(-1, 0, bs).fill_(-1e4);
    edge.select(2, nb - 1).narrow(-1, 2 * bs, bs).fill_(-1e4);
    auto win_bias = edge.expand({B, -1, -1, -1, -1});
    // FACT: e = torch.zeros(1, 1, 3, 1, 6).expand(2, -1, -1, -1, -1); assert raises(lambda: e.add_(torch.zeros(2, 1, 3, 1, 6)), "more than one element")
    win_bias += torch::cat({torch::roll(kbias, 1, 2), kbias, torch::roll(kbias, -1, 2)}, -1);  // EXPECT: tensor-inplace-on-expanded
    auto rand_bias = key_bias.view({B, nb, bs}).index_select(1, ridx).view({B, 1, nb, 1, r * bs});
    auto bias = torch::cat({glob_bias, win_bias, rand_bias}, -1);

    auto scores = torch::matmul(qb, keys.transpose(-1, -2)) * scale;  // [B, H, nb, bs, K]
    // FACT: s = torch.zeros(2, 2, 3, 4, 6); b = torch.zeros(2, 1, 3, 1, 6).expand(2, 2, 3, 4, 6); assert not raises(lambda: s.add_(b))
    scores.add_(bias.expand_as(scores));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded bias is only read
    auto probs = drop(torch::softmax(scores, -1));
    auto ctx = torch::matmul(probs, values);  // [B, H, nb, bs, D]

    // ---- global queries (first and last block) see every key
    auto qg = torch::cat({qb.select(2, 0), qb.select(2, nb - 1)}, 2);  // [B, H, 2bs, D]
    auto sg = torch::matmul(qg, k.transpose(-1, -2)) * scale;          // [B, H, 2bs, L]
    auto sg_masked = sg.clone();  // EXPECT: tensor-unnecessary-clone
    sg_masked += key_bias.view({B, 1, 1, L});
    auto og = torch::matmul(drop(torch::softmax(sg_masked, -1)), v).view({B, H, 2, bs, D});

    auto merged = torch::cat({og.narrow(2, 0, 1), ctx.narrow(2, 1, nb - 2), og.narrow(2, 1, 1)}, 2);
    // FACT: m = torch.cat([torch.randn(2, 3, 1, 4, 5), torch.randn(2, 3, 2, 4, 5)], 2); assert is_contiguous(m) and is_view_of(m.view(2, 3, 12, 5), m)
    auto per_head = merged.view({B, H, L, D});  // LOOKALIKE: tensor-view-non-contiguous -- cat output is contiguous
    // FACT: t = torch.randn(2, 3, 12, 5).transpose(1, 2); assert is_copy_of(t.reshape(2, 12, 15), t)
    return out(per_head.transpose(1, 2).reshape({B, L, C}));  // EXPECT: tensor-reshape-non-contiguous
  }

  int64_t n_heads_, block_size_, num_rand_;
  torch::nn::Linear qkv{nullptr}, out{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(BlockSparseAttention);

struct BigBirdLayerImpl : torch::nn::Module {
  explicit BigBirdLayerImpl(const BigBirdConfig& cfg) {
    attn = register_module("attn", BlockSparseAttention(cfg));
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.d_model})));
    ff1 = register_module("ff1", torch::nn::Linear(cfg.d_model, 4 * cfg.d_model));
    ff2 = register_module("ff2", torch::nn::Linear(4 * cfg.d_model, cfg.d_model));
  }

  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& key_bias) {
    auto a = ln1(h + attn(h, key_bias));
    return ln2(a + ff2(F::gelu(ff1(a))));
  }

  BlockSparseAttention attn{nullptr};
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear ff1{nullptr}, ff2{nullptr};
};
TORCH_MODULE(BigBirdLayer);

struct BigBirdEncoderImpl : torch::nn::Module {
  explicit BigBirdEncoderImpl(const BigBirdConfig& cfg) : pad_id_(cfg.pad_id) {
    tok = register_module("tok", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
    pos = register_module("pos", torch::nn::Embedding(cfg.max_len, cfg.d_model));
    for (int64_t i = 0; i < cfg.n_layers; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), BigBirdLayer(cfg)));
    head = register_module("head", torch::nn::Linear(cfg.d_model, cfg.vocab_size));
  }

  // ids: [B, L] with L a multiple of block_size; returns MLM logits [B, L, V].
  torch::Tensor forward(const torch::Tensor& ids) {
    auto keep = ids.ne(pad_id_);
    auto h = tok(ids) + pos(torch::arange(ids.size(1), ids.options()));
    for (auto& layer : layers) {
      auto key_bias = (1.0 - keep.to(torch::kFloat)) * -1e4;  // EXPECT: tensor-clone-in-loop
      h = layer(h, key_bias);
    }
    return head(h);
  }

  int64_t pad_id_;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  std::vector<BigBirdLayer> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(BigBirdEncoder);

torch::Tensor pad_to_blocks(const torch::Tensor& ids, int64_t block_size, int64_t pad_id) {
  const auto extra = (block_size - ids.size(1) % block_size) % block_size;
  if (extra == 0) return ids;
  return F::pad(ids, F::PadFuncOptions({0, extra}).value(static_cast<double>(pad_id)));
}

void pretrain_mlm(BigBirdEncoder model, const std::vector<torch::Tensor>& corpus, const BigBirdConfig& cfg,
                  int64_t steps) {
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
  model->train();
  torch::Tensor loss_sum = torch::zeros({});
  std::vector<double> curve;

  for (int64_t step = 0; step < steps; ++step) {
    auto ids = pad_to_blocks(corpus[step % corpus.size()], cfg.block_size, cfg.pad_id);
    auto pick = (torch::rand(ids.sizes()) < cfg.mlm_prob) & ids.ne(cfg.pad_id);
    auto inputs = ids.masked_fill(pick, cfg.mask_id);
    auto labels = torch::where(pick, ids, torch::full_like(ids, -100));

    auto logits = model->forward(inputs);
    auto loss = F::cross_entropy(logits.view({-1, cfg.vocab_size}), labels.view({-1}),
                                 F::CrossEntropyFuncOptions().ignore_index(-100));
    opt.zero_grad();
    loss.backward();
    opt.step();

    loss_sum = loss_sum + loss;  // EXPECT: tensor-graph-kept-across-iterations
    curve.push_back(loss.item<double>());  // LOOKALIKE: tensor-graph-kept-across-iterations -- a host double keeps no graph
    if ((step + 1) % 100 == 0)
      std::cout << "step " << step + 1 << " mlm loss " << loss_sum.item<double>() / (step + 1) << std::endl;
  }
}

int main() {
  BigBirdConfig cfg;
  cfg.d_model = 256;
  cfg.n_heads = 4;
  cfg.block_size = 16;
  cfg.n_layers = 2;
  BigBirdEncoder model(cfg);
  std::vector<torch::Tensor> corpus;
  for (int i = 0; i < 16; ++i) corpus.push_back(torch::randint(1, cfg.vocab_size, {2, 250}));
  pretrain_mlm(model, corpus, cfg, 200);
  return 0;
}
