// Recurrent Memory Transformer language model: every segment is processed as
// [read memory | tokens | write memory]; the write-memory outputs become the next
// segment's memory, and gradients flow back through a window of segments.
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <vector>

namespace rmt {

struct Config {
  int64_t vocab = 32000;
  int64_t d_model = 512;
  int64_t n_heads = 8;
  int64_t n_layers = 6;
  int64_t n_mem = 10;
  int64_t seg_len = 128;
  int64_t bptt_segments = 2;
  int64_t pad_id = 0;
  int64_t unk_id = 1;
  double dropout = 0.1;
  double token_dropout = 0.05;
  double mem_decay = 0.9;
  double mem_max_norm = 5.0;
  double mem_grad_scale = 4.0;
  double clip = 1.0;
};

struct SelfAttentionImpl : torch::nn::Module {
  SelfAttentionImpl(int64_t d_model, int64_t n_heads, double dropout) : n_heads(n_heads), d_head(d_model / n_heads) {
    q = register_module("q", torch::nn::Linear(d_model, d_model));
    k = register_module("k", torch::nn::Linear(d_model, d_model));
    v = register_module("v", torch::nn::Linear(d_model, d_model));
    o = register_module("o", torch::nn::Linear(d_model, d_model));
    drop = register_module("drop", torch::nn::Dropout(dropout));
  }

  // mask: true where attention is blocked.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto B = x.size(0), L = x.size(1);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, L, n_heads, d_head}).transpose(1, 2); };
    auto scores = torch::matmul(heads(q(x)), heads(k(x)).transpose(-2, -1)) / std::sqrt(static_cast<double>(d_head));
    // FACT: assert not raises(lambda: (torch.matmul(torch.randn(2, 3, requires_grad=True), torch.randn(3, 2)) / 2.0).masked_fill_(torch.tensor([[False, True], [False, False]]), -1e9).softmax(-1).sum().backward())
    scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-inplace-on-saved -- neither matmul nor the scalar division saves its result
    auto ctx = torch::matmul(drop(torch::softmax(scores, -1)), heads(v(x)));
    // FACT: assert is_contiguous(torch.randn(2, 2, 5, 3).transpose(1, 2).contiguous())
    return o(ctx.transpose(1, 2).contiguous().view({B, L, -1}));  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() comes first
  }

  int64_t n_heads, d_head;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(SelfAttention);

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(const Config& c) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    attn = register_module("attn", SelfAttention(c.d_model, c.n_heads, c.dropout));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    fc1 = register_module("fc1", torch::nn::Linear(c.d_model, 4 * c.d_model));
    fc2 = register_module("fc2", torch::nn::Linear(4 * c.d_model, c.d_model));
    drop = register_module("drop", torch::nn::Dropout(c.dropout));
  }

  torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask) {
    x = x + drop(attn(ln1(x), mask));
    // FACT: assert backward_fails(lambda: (lambda x: x.add_(torch.nn.functional.layer_norm(x, (4,))).sum().backward())(torch.randn(3, 4, requires_grad=True) * 1.0))
    x.add_(drop(fc2(torch::gelu(fc1(ln2(x))))));  // EXPECT: tensor-inplace-on-saved
    return x;
  }

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  SelfAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Block);

struct SegmentOutput {
  torch::Tensor logits, memory;
};

struct RecurrentMemoryTransformerImpl : torch::nn::Module {
  explicit RecurrentMemoryTransformerImpl(const Config& c) : cfg(c) {
    tok = register_module("tok", torch::nn::Embedding(c.vocab, c.d_model));
    pos = register_module("pos", torch::nn::Embedding(c.seg_len + c.n_mem, c.d_model));
    for (int64_t i = 0; i < c.n_layers; ++i) blocks->push_back(Block(c));
    register_module("blocks", blocks);
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
    mem_update = register_module("mem_update", torch::nn::Linear(c.d_model, c.d_model));
    memory_init = register_parameter("memory_init", torch::randn({c.n_mem, c.d_model}) * 0.02);
    causal = register_buffer("causal", torch::ones({c.seg_len, c.seg_len}, torch::kBool).triu(1));
  }

  torch::Tensor initial_memory(int64_t batch) const { return memory_init.unsqueeze(0).expand({batch, -1, -1}); }

  // Read memory sees only itself, tokens see the read memory and earlier tokens,
  // write memory sees everything.
  torch::Tensor attention_mask() const {
    const int64_t m = cfg.n_mem, L = cfg.seg_len;
    auto full = torch::zeros({2 * m + L, 2 * m + L}, torch::kBool);
    full.narrow(0, 0, m).narrow(1, m, m + L).fill_(true);
    full.narrow(0, m, L).narrow(1, m + L, m).fill_(true);
    full.narrow(0, m, L).narrow(1, m, L).copy_(causal);  // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
    return full;
  }

  SegmentOutput forward(const torch::Tensor& segment, const torch::Tensor& memory) {
    const int64_t B = segment.size(0), L = segment.size(1), m = cfg.n_mem;
    auto x = torch::cat({memory, tok(segment), memory}, 1);

    // The write memory reuses the read-memory positions.
    auto pos_ids = torch::arange(2 * m + L, segment.options()).unsqueeze(0).expand({B, -1});
    // FACT: assert raises(lambda: torch.arange(6).unsqueeze(0).expand(2, 6).narrow(1, 4, 2).sub_(4), "more than one element")
    pos_ids.narrow(1, m + L, m).sub_(m + L);  // EXPECT: tensor-inplace-on-expanded
    x = x + pos(pos_ids);

    auto no_pad = torch::zeros({B, m}, segment.options().dtype(torch::kBool));
    auto key_pad = torch::cat({no_pad, segment.eq(cfg.pad_id), no_pad}, 1);
    auto mask = (attention_mask().unsqueeze(0) | key_pad.unsqueeze(1)).unsqueeze(1);  // EXPECT: tensor-device-mismatch
    for (const auto& block : *blocks) x = block->as<Block>()->forward(x, mask);
    x = ln_f(x);
    return {lm_head(x.narrow(1, m, L)), torch::tanh(mem_update(x.narrow(1, m + L, m)))};
  }

  Config cfg;
  torch::nn::Embedding tok{nullptr}, pos{nullptr};
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr}, mem_update{nullptr};
  torch::Tensor memory_init, causal;
};
TORCH_MODULE(RecurrentMemoryTransformer);

double train_epoch(RecurrentMemoryTransformer& model, torch::optim::Optimizer& opt,
                   const std::vector<torch::Tensor>& docs, const Config& cfg) {
  model->train();
  const auto ce = torch::nn::functional::CrossEntropyFuncOptions().ignore_index(cfg.pad_id);
  auto epoch_loss = torch::zeros({}, docs.front().options().dtype(torch::kFloat));
  int64_t n_windows = 0;
  for (const auto& doc : docs) {
    const int64_t T = doc.size(1) - 1;
    auto input_ids = doc.narrow(1, 0, T);
    auto labels = doc.narrow(1, 1, T);
    if (cfg.token_dropout > 0.0) {
      auto dropped = torch::rand(input_ids.sizes(), input_ids.options().dtype(torch::kFloat)) < cfg.token_dropout;
      // FACT: assert (lambda d: is_view_of(d.narrow(1, 0, 5), d) and shares_storage(d.narrow(1, 1, 5), d))(torch.randint(0, 9, (2, 6)))
      input_ids.masked_fill_(dropped, cfg.unk_id);  // EXPECT: tensor-alias-then-mutate
    }

    auto memory = model->initial_memory(doc.size(0));
    torch::Tensor window_loss;
    const int64_t n_seg = T / cfg.seg_len;
    for (int64_t s = 0; s < n_seg; ++s) {
      auto seg_in = input_ids.narrow(1, s * cfg.seg_len, cfg.seg_len);
      auto seg_lab = labels.narrow(1, s * cfg.seg_len, cfg.seg_len);
      auto out = model->forward(seg_in, memory);
      // FACT: assert is_contiguous(torch.nn.functional.linear(torch.randn(2, 6, 8)[:, 1:4], torch.randn(11, 8)))
      auto flat_logits = out.logits.view({-1, cfg.vocab});  // LOOKALIKE: tensor-view-non-contiguous -- the lm_head output is freshly allocated
      // FACT: assert raises(lambda: torch.randint(0, 9, (2, 13)).narrow(1, 1, 12).narrow(1, 4, 4).view(-1), "view size is not compatible")
      auto loss = torch::nn::functional::cross_entropy(flat_logits, seg_lab.view(-1), ce);  // EXPECT: tensor-view-non-contiguous
      window_loss = window_loss.defined() ? window_loss + loss : loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- BPTT needs this graph, backward() releases it every window
      memory = out.memory;

      if ((s + 1) % cfg.bptt_segments != 0 && s + 1 != n_seg) continue;
      auto next_memory = out.memory.detach();
      // FACT: assert backward_fails(lambda: (lambda m: (m.detach().mul_(0.9), m.sum().backward()))(torch.tanh(torch.randn(3, requires_grad=True))))
      next_memory.mul_(cfg.mem_decay);  // EXPECT: tensor-inplace-on-detached
      opt.zero_grad();
      (window_loss / cfg.bptt_segments).backward();
      if (model->memory_init.grad().defined())
        model->memory_init.grad().mul_(cfg.mem_grad_scale);  // LOOKALIKE: tensor-inplace-on-leaf -- the .grad() tensor does not itself require grad
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
      opt.step();
      // FACT: assert raises(lambda: torch.nn.Parameter(torch.randn(3, 4)).renorm_(2, 0, 1.0), "leaf Variable")
      model->memory_init.renorm_(2, 0, cfg.mem_max_norm);  // EXPECT: tensor-inplace-on-leaf
      epoch_loss += window_loss;  // EXPECT: tensor-graph-kept-across-iterations
      ++n_windows;
      window_loss = torch::Tensor();
      memory = next_memory;
    }
  }
  return epoch_loss.item<double>() / static_cast<double>(n_windows * cfg.bptt_segments);
}

// Perplexity over whole documents, carrying the memory across every segment.
double evaluate(RecurrentMemoryTransformer& model, const std::vector<torch::Tensor>& docs, const Config& cfg) {
  torch::NoGradGuard no_grad;
  model->eval();
  const auto ce = torch::nn::functional::CrossEntropyFuncOptions().ignore_index(cfg.pad_id).reduction(torch::kSum);
  double nll = 0.0;
  auto n_tokens = torch::zeros({}, docs.front().options());
  for (const auto& doc : docs) {
    const int64_t T = doc.size(1) - 1;
    auto memory = model->initial_memory(doc.size(0));
    for (int64_t s = 0; s < T / cfg.seg_len; ++s) {
      auto seg_in = doc.narrow(1, s * cfg.seg_len, cfg.seg_len);
      auto seg_lab = doc.narrow(1, s * cfg.seg_len + 1, cfg.seg_len);
      auto out = model->forward(seg_in, memory);
      // FACT: assert (lambda d: is_copy_of(d.narrow(1, 5, 4).reshape(-1), d))(torch.randint(0, 9, (2, 13)))
      auto targets = seg_lab.reshape(-1);  // EXPECT: tensor-reshape-non-contiguous
      nll += torch::nn::functional::cross_entropy(out.logits.view({-1, cfg.vocab}), targets, ce).item<double>();  // EXPECT: tensor-sync-in-loop
      n_tokens += targets.ne(cfg.pad_id).sum();  // LOOKALIKE: tensor-sync-in-loop -- counted on the device, read once after the loop
      memory = out.memory.detach();
      memory.mul_(cfg.mem_decay);  // LOOKALIKE: tensor-inplace-on-detached -- under NoGradGuard no graph saved out.memory
    }
  }
  return std::exp(nll / n_tokens.item<double>());
}

std::vector<torch::Tensor> synthetic_corpus(const Config& cfg, int64_t n_docs, int64_t batch, int64_t n_seg,
                                            torch::Device device) {
  std::vector<torch::Tensor> docs;
  for (int64_t i = 0; i < n_docs; ++i) {
    auto doc = torch::randint(2, cfg.vocab, {batch, n_seg * cfg.seg_len + 1},
                              torch::TensorOptions().dtype(torch::kLong).device(device));
    // every other document ends in padding, as the last chunk of a document usually does
    if (i % 2 == 1) doc.narrow(1, doc.size(1) - cfg.seg_len / 2, cfg.seg_len / 2).fill_(cfg.pad_id);
    docs.push_back(doc);
  }
  return docs;
}

}  // namespace rmt

int main() {
  using namespace rmt;
  torch::manual_seed(3);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  Config cfg;
  cfg.vocab = 8000;
  cfg.n_layers = 4;
  RecurrentMemoryTransformer model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-4).weight_decay(0.01));

  auto train_docs = synthetic_corpus(cfg, 16, 4, 6, device);
  auto valid_docs = synthetic_corpus(cfg, 4, 4, 6, device);
  for (int epoch = 0; epoch < 3; ++epoch) {
    const double loss = train_epoch(model, opt, train_docs, cfg);
    std::cout << "epoch " << epoch << " train loss " << loss << " valid ppl " << evaluate(model, valid_docs, cfg)
              << "\n";
  }
  return 0;
}
