// TrOCR-style line recogniser: a ViT encoder over patches of a text-line image and an
// autoregressive text decoder with cached keys/values, decoded with beam search
// (length penalty, EOS handling) and fine-tuned with teacher forcing.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;

struct TrOCRConfig {
  int64_t img_h = 32, img_w = 384, patch = 16, in_ch = 3;
  int64_t d_model = 384, n_heads = 6, enc_layers = 6, dec_layers = 6, d_ffn = 1536;
  int64_t vocab = 64044, max_len = 128, max_pos = 512;
  int64_t bos = 0, pad = 1, eos = 2, num_beams = 4, min_len = 2;
  double length_penalty = 1.0;
};

struct KVCache { torch::Tensor k, v; };  // [B', H, T, Dh]
struct LayerCache { KVCache self, cross; };

// [B, H, T, Dh] -> [B, T, H * Dh]
torch::Tensor merge_heads(const torch::Tensor& o) {
  // FACT: o = torch.randn(2, 6, 5, 4); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, -1), o)
  return o.transpose(1, 2).reshape({o.size(0), o.size(2), -1});  // EXPECT: tensor-reshape-non-contiguous
}

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t d, int64_t h) : heads(h), head_dim(d / h) {
    q = register_module("q", torch::nn::Linear(d, d)), k = register_module("k", torch::nn::Linear(d, d));
    v = register_module("v", torch::nn::Linear(d, d)), o = register_module("o", torch::nn::Linear(d, d));
  }

  torch::Tensor split(const torch::Tensor& x) const {
    // FACT: x = torch.nn.Linear(8, 24)(torch.randn(2, 5, 8)); assert is_view_of(x.view(2, 5, 6, 4), x)
    return x.view({x.size(0), x.size(1), heads, head_dim}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- x is a Linear output (contiguous); the view only splits its last dim
  }

  // x: [B, T, C]; memory: source of keys/values (x itself for self-attention).
  // With a cache, self-attention appends to it and cross-attention fills it once.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& memory, KVCache* cache, bool cross,
                        const torch::Tensor& attn_mask) {
    auto qh = split(q(x)) / std::sqrt(static_cast<double>(head_dim));
    torch::Tensor kh, vh;
    if (cross && cache != nullptr && cache->k.defined()) {
      kh = cache->k, vh = cache->v;
    } else {
      kh = split(k(memory)), vh = split(v(memory));
      if (cache != nullptr && !cross && cache->k.defined())
        kh = torch::cat({cache->k, kh}, 2), vh = torch::cat({cache->v, vh}, 2);
      if (cache != nullptr) cache->k = kh, cache->v = vh;
    }
    auto att = torch::matmul(qh, kh.transpose(-2, -1));
    if (attn_mask.defined()) att = att.masked_fill(attn_mask, -std::numeric_limits<float>::infinity());
    return o(merge_heads(torch::matmul(F::softmax(att, -1), vh)));
  }

  int64_t heads, head_dim;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
};
TORCH_MODULE(Attention);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t h, int64_t ffn, bool with_cross) {
    auto ln = [d] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})); };
    ln1 = register_module("ln1", ln()), ln3 = register_module("ln3", ln());
    self_attn = register_module("self_attn", Attention(d, h));
    if (with_cross) {
      ln2 = register_module("ln2", ln());
      cross_attn = register_module("cross_attn", Attention(d, h));
    }
    fc1 = register_module("fc1", torch::nn::Linear(d, ffn)), fc2 = register_module("fc2", torch::nn::Linear(ffn, d));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& enc, LayerCache* cache, const torch::Tensor& mask) {
    auto h = ln1(x);
    x = x + self_attn->forward(h, h, cache ? &cache->self : nullptr, false, mask);
    if (cross_attn) {
      h = ln2(x);
      x = x + cross_attn->forward(h, enc, cache ? &cache->cross : nullptr, true, torch::Tensor());
    }
    return x + fc2(F::gelu(fc1(ln3(x))));
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr}, ln3{nullptr};
  Attention self_attn{nullptr}, cross_attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct TrOCRImpl : torch::nn::Module {
  explicit TrOCRImpl(const TrOCRConfig& c) : cfg(c) {
    const int64_t d = c.d_model, n_patches = (c.img_h / c.patch) * (c.img_w / c.patch);
    patch_embed = register_module("patch_embed",
                                  torch::nn::Conv2d(torch::nn::Conv2dOptions(c.in_ch, d, c.patch).stride(c.patch)));
    enc_pos = register_parameter("enc_pos", torch::zeros({1, n_patches, d}));
    for (int64_t i = 0; i < c.enc_layers; ++i)
      enc_blocks.push_back(register_module("enc" + std::to_string(i), Block(d, c.n_heads, c.d_ffn, false)));
    enc_norm = register_module("enc_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    tok_embed = register_module("tok_embed", torch::nn::Embedding(c.vocab, d));
    dec_pos = register_module("dec_pos", torch::nn::Embedding(c.max_pos, d));
    for (int64_t i = 0; i < c.dec_layers; ++i)
      dec_blocks.push_back(register_module("dec" + std::to_string(i), Block(d, c.n_heads, c.d_ffn, true)));
    dec_norm = register_module("dec_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(d, c.vocab).bias(false)));
  }

  // pixels: [B, 3, H, W] in [-1, 1] -> [B, N, C]
  torch::Tensor encode(const torch::Tensor& pixels) {
    // FACT: c = torch.randn(2, 8, 2, 24); assert is_view_of(c.flatten(2), c)
    auto x = patch_embed(pixels).flatten(2).transpose(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- flatten(2) runs on the contiguous conv output (the transpose comes after): a view
    x = x + enc_pos;
    for (auto& b : enc_blocks) x = b->forward(x, torch::Tensor(), nullptr, torch::Tensor());
    return enc_norm(x);
  }

  // tokens: [B', T]; past: number of positions already held by the caches. -> [B', T, V]
  torch::Tensor decode(const torch::Tensor& tokens, const torch::Tensor& enc, std::vector<LayerCache>* caches,
                       int64_t past) {
    const int64_t T = tokens.size(1);
    auto x = tok_embed(tokens) * std::sqrt(static_cast<double>(cfg.d_model)) +
             dec_pos(torch::arange(past, past + T, tokens.options()));
    torch::Tensor mask;
    if (T > 1) mask = torch::ones({T, T}, tokens.options().dtype(torch::kBool)).triu(1);
    for (size_t i = 0; i < dec_blocks.size(); ++i)
      x = dec_blocks[i]->forward(x, enc, caches ? &(*caches)[i] : nullptr, mask);
    return lm_head(dec_norm(x));
  }

  TrOCRConfig cfg;
  torch::nn::Conv2d patch_embed{nullptr};
  torch::Tensor enc_pos;
  std::vector<Block> enc_blocks, dec_blocks;
  torch::nn::LayerNorm enc_norm{nullptr}, dec_norm{nullptr};
  torch::nn::Embedding tok_embed{nullptr}, dec_pos{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TrOCR);

// Line crops come from the binariser as float [B, 1, H, W] in [0, 1]; the encoder was
// pre-trained on 3-channel input in [-1, 1].
torch::Tensor normalize_lines(const torch::Tensor& lines) {
  auto x = lines.contiguous();
  // FACT: a = torch.rand(2, 1, 32, 384); b = a.contiguous(); b.sub_(0.5).div_(0.5); assert shares_storage(a, b) and a.min() < 0
  x.sub_(0.5).div_(0.5);  // EXPECT: tensor-alias-then-mutate
  return x.repeat({1, 3, 1, 1});
}

// The K best finished hypotheses of one image, scored sum_logprobs / len^length_penalty.
struct BeamHypotheses {
  BeamHypotheses(int64_t n, double lp) : num_beams(n), length_penalty(lp) {}
  void add(torch::Tensor tokens, double sum_logprobs) {
    const double score = sum_logprobs / std::pow(static_cast<double>(tokens.size(0)), length_penalty);
    if (static_cast<int64_t>(beams.size()) < num_beams || score > worst) {
      beams.emplace_back(score, std::move(tokens));
      std::sort(beams.begin(), beams.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      if (static_cast<int64_t>(beams.size()) > num_beams) beams.pop_back();
      worst = beams.back().first;
    }
  }
  // Done once no open beam can beat the worst kept hypothesis.
  bool is_done(double best_sum_logprobs, int64_t cur_len) const {
    if (static_cast<int64_t>(beams.size()) < num_beams) return false;
    return worst >= best_sum_logprobs / std::pow(static_cast<double>(cur_len), length_penalty);
  }
  int64_t num_beams;
  double length_penalty, worst = 1e9;
  std::vector<std::pair<double, torch::Tensor>> beams;
};

std::vector<std::vector<int64_t>> beam_search(TrOCR& model, const torch::Tensor& lines, const TrOCRConfig& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();  // no dropout while searching
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  const int64_t B = lines.size(0), K = cfg.num_beams, V = cfg.vocab;
  auto enc = model->encode(normalize_lines(lines).to(device));  // [B, N, C]
  const int64_t N = enc.size(1), C = enc.size(2);
  // Every beam attends to its own image: [B * K, N, C], the beams of one image adjacent.
  // FACT: e = torch.randn(2, 5, 8); r = e.unsqueeze(1).expand(2, 3, 5, 8).reshape(6, 5, 8); assert is_copy_of(r, e)
  auto enc_beams = enc.unsqueeze(1).expand({B, K, N, C}).reshape({B * K, N, C});  // EXPECT: tensor-reshape-non-contiguous

  std::vector<LayerCache> caches(static_cast<size_t>(cfg.dec_layers));
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto seqs = torch::full({B * K, cfg.max_len}, cfg.pad, long_opts);
  seqs.select(1, 0).fill_(cfg.bos);
  auto beam_scores = torch::zeros({B, K}, enc.options());
  // Only beam 0 is live at the start, or all K beams would expand identically.
  // FACT: s = torch.zeros(2, 4); v = s.narrow(1, 1, 3); v.fill_(-1e9); assert is_view_of(v, s) and s[0, 1] == -1e9 and s[0, 0] == 0
  beam_scores.narrow(1, 1, K - 1).fill_(-1e9);  // LOOKALIKE: tensor-alias-then-mutate -- writing through an explicit narrow view of a local is the intent

  std::vector<BeamHypotheses> hyps(static_cast<size_t>(B), BeamHypotheses(K, cfg.length_penalty));
  std::vector<char> done(static_cast<size_t>(B), 0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  int64_t cur_len = 1;
  for (; cur_len < cfg.max_len; ++cur_len) {
    auto logits = model->decode(seqs.narrow(1, cur_len - 1, 1), enc_beams, &caches, cur_len - 1).select(1, 0);
    auto log_probs = F::log_softmax(logits, -1);  // [B * K, V]
    if (cur_len < cfg.min_len)
      log_probs.select(1, cfg.eos).fill_(neg_inf);  // LOOKALIKE: tensor-inplace-on-saved -- decoding runs under NoGradGuard: log_softmax recorded nothing
    auto cand = log_probs.clone();  // EXPECT: tensor-unnecessary-clone
    cand += beam_scores.view({-1, 1});
    // FACT: c = torch.randn(6, 10) + torch.zeros(6, 1); assert is_view_of(c.view(2, 30), c)
    auto flat = cand.view({B, K * V});  // LOOKALIKE: tensor-view-non-contiguous -- cand is a fresh contiguous [B*K, V]
    auto top = flat.topk(2 * K, 1, true, true);
    auto top_scores = std::get<0>(top).to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- the host values steer the beam bookkeeping below
    auto top_ids = std::get<1>(top).to(torch::kCPU);  // LOOKALIKE: tensor-sync-in-loop -- candidate ids pick the surviving beams on the host
    auto sc = top_scores.accessor<float, 2>();
    auto id = top_ids.accessor<int64_t, 2>();

    std::vector<int64_t> next_src, next_tok;
    std::vector<float> next_score;
    for (int64_t b = 0; b < B; ++b) {
      if (done[b]) {  // finished images keep K dummy beams so the batch shape stays [B * K]
        next_src.insert(next_src.end(), K, b * K);
        next_tok.insert(next_tok.end(), K, cfg.pad);
        next_score.insert(next_score.end(), K, 0.f);
        continue;
      }
      int64_t kept = 0;
      for (int64_t j = 0; j < 2 * K && kept < K; ++j) {
        const int64_t src = b * K + id[b][j] / V, tok = id[b][j] % V;
        if (tok == cfg.eos) {
          if (j >= K) continue;  // an EOS below the top K does not finish a beam
          auto tokens = seqs[src].narrow(0, 0, cur_len).clone();  // LOOKALIKE: tensor-unnecessary-clone -- kept by the hypothesis list while seqs is overwritten in place below
          hyps[b].add(std::move(tokens), sc[b][j]);
        } else {
          next_src.push_back(src), next_tok.push_back(tok), next_score.push_back(sc[b][j]);
          ++kept;
        }
      }
      done[b] = hyps[b].is_done(sc[b][0], cur_len);
    }
    if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) break;

    auto sel = torch::tensor(next_src, long_opts);
    // FACT: s = torch.arange(12).view(4, 3); i = torch.tensor([1, 1, 0, 3]); r = s.index_select(0, i); assert is_copy_of(r, s)
    seqs.copy_(seqs.index_select(0, sel));  // LOOKALIKE: tensor-inplace-overlap -- index_select materialises the reordered rows before the copy
    seqs.select(1, cur_len).copy_(torch::tensor(next_tok, long_opts));
    beam_scores = torch::tensor(next_score, enc.options()).view({B, K});
    // Self-attention caches follow their beam; cross K/V are per image and stay put.
    for (auto& c : caches) c.self.k = c.self.k.index_select(0, sel), c.self.v = c.self.v.index_select(0, sel);
  }

  // Beams still open at the end are scored as they stand.
  auto final_scores = beam_scores.to(torch::kCPU);
  for (int64_t b = 0; b < B; ++b) {
    if (done[b]) continue;
    for (int64_t k = 0; k < K; ++k)
      hyps[b].add(seqs[b * K + k].narrow(0, 0, cur_len), final_scores[b][k].item<float>());
  }
  std::vector<std::vector<int64_t>> out;
  for (auto& h : hyps) {
    auto best = h.beams.front().second.cpu();
    out.emplace_back(best.data_ptr<int64_t>() + 1, best.data_ptr<int64_t>() + best.numel());  // drop BOS
  }
  return out;
}

// images: [B, 1, H, W] float in [0, 1]; labels: [B, T] int64 ending in EOS, PAD-padded.
struct LineBatch { torch::Tensor images, labels; };

// Teacher-forcing input: labels shifted right by one position, BOS in front.
torch::Tensor shift_right(const torch::Tensor& labels, int64_t bos) {
  auto dec_in = labels.clone();
  const int64_t T = dec_in.size(1);
  // FACT: l = torch.arange(12).view(2, 6); d = l.clone(); d.narrow(1, 1, 5).copy_(d.narrow(1, 0, 5)); assert not torch.equal(d[:, 1:], l[:, :5])
  dec_in.narrow(1, 1, T - 1).copy_(dec_in.narrow(1, 0, T - 1));  // EXPECT: tensor-inplace-overlap
  dec_in.select(1, 0).fill_(bos);
  return dec_in;
}

void finetune(TrOCR& model, std::vector<LineBatch>& batches, const TrOCRConfig& cfg, int epochs,
              torch::Device device) {
  model->to(device), model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(5e-5).weight_decay(0.01));
  torch::Tensor smoothed = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor last_loss;
  int64_t step = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (auto& batch : batches) {
      auto pixels = normalize_lines(batch.images).to(device);
      auto labels = batch.labels.to(device);
      auto logits = model->decode(shift_right(labels, cfg.bos), model->encode(pixels), nullptr, 0);
      // FACT: o = torch.nn.Linear(8, 50, bias=False)(torch.randn(2, 7, 8)); assert is_view_of(o.view(-1, 50), o)
      auto loss = F::cross_entropy(logits.view({-1, cfg.vocab}), labels.view({-1}), F::CrossEntropyFuncOptions().ignore_index(cfg.pad));  // LOOKALIKE: tensor-view-non-contiguous -- lm_head's output and the loaded labels are contiguous
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      smoothed = 0.98 * smoothed + 0.02 * loss;  // EXPECT: tensor-graph-kept-across-iterations
      last_loss = loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- overwrites one handle: only the latest step's graph stays alive
      if (++step % 200 == 0) std::cout << "step " << step << " smoothed loss " << smoothed.item<float>() << "\n";
    }
    std::cout << "epoch " << epoch << " last loss " << last_loss.item<float>() << "\n";
  }
}
