// Pointer-generator summarizer with coverage (See et al., 2017).
// Bi-LSTM encoder, LSTMCell decoder with additive attention, copy distribution
// over the extended (per-batch OOV) vocabulary and the coverage penalty.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

namespace pg {

using torch::Tensor;

struct Config {
  int64_t vocab_size = 5000, emb_dim = 128, hidden = 256;
  int64_t max_dec_steps = 40, batch_size = 16;
  double cov_weight = 1.0, lr = 0.15, max_grad_norm = 2.0;
  int64_t pad_id = 0, unk_id = 1, bos_id = 2, eos_id = 3;
  int epochs = 3, log_every = 20;
};

struct Example {
  std::vector<int32_t> src;      // OOV words mapped to UNK
  std::vector<int32_t> src_ext;  // OOV words numbered from vocab_size on
  std::vector<int64_t> tgt_ext;
  int64_t n_oov = 0;
};

struct Batch {
  Tensor src, src_ext, src_len, tgt, tgt_len;
  int64_t max_oov = 0;
};

Batch collate(const std::vector<Example>& exs, const std::vector<size_t>& idx, const Config& cfg, torch::Device device) {
  const auto B = static_cast<int64_t>(idx.size());
  int64_t S = 1, T = 1, max_oov = 0;
  for (auto i : idx) {
    S = std::max<int64_t>(S, exs[i].src.size());
    T = std::max<int64_t>(T, exs[i].tgt_ext.size() + 2);
    max_oov = std::max(max_oov, exs[i].n_oov);
  }
  auto src = torch::full({B, S}, cfg.pad_id, torch::kInt), src_ext = torch::full({B, S}, cfg.pad_id, torch::kInt);
  auto tgt = torch::full({B, T}, cfg.pad_id, torch::kLong);
  auto src_len = torch::empty({B}, torch::kLong), tgt_len = torch::empty({B}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const auto& ex = exs[idx[b]];
    const auto n = static_cast<int64_t>(ex.src.size());
    src[b].narrow(0, 0, n).copy_(torch::tensor(ex.src, torch::kInt));
    src_ext[b].narrow(0, 0, n).copy_(torch::tensor(ex.src_ext, torch::kInt));
    std::vector<int64_t> ids{cfg.bos_id};
    ids.insert(ids.end(), ex.tgt_ext.begin(), ex.tgt_ext.end());
    ids.push_back(cfg.eos_id);
    tgt[b].narrow(0, 0, ids.size()).copy_(torch::tensor(ids)); // LOOKALIKE: tensor-copy-narrowing -- int64 ids into an int64 buffer
    src_len[b] = n;
    tgt_len[b] = static_cast<int64_t>(ids.size()) - 1;
  }
  return {src.to(device), src_ext.to(device), src_len.to(device), tgt.to(device), tgt_len.to(device), max_oov};
}

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const Config& c)
      : embed(register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab_size, c.emb_dim).padding_idx(c.pad_id)))),
        lstm(register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(c.emb_dim, c.hidden).batch_first(true).bidirectional(true)))),
        W_h(register_module("W_h", torch::nn::Linear(torch::nn::LinearOptions(2 * c.hidden, 2 * c.hidden).bias(false)))),
        reduce_h(register_module("reduce_h", torch::nn::Linear(2 * c.hidden, c.hidden))),
        reduce_c(register_module("reduce_c", torch::nn::Linear(2 * c.hidden, c.hidden))) {}

  // encoder states, their attention features, initial decoder state
  std::tuple<Tensor, Tensor, std::tuple<Tensor, Tensor>> forward(const Tensor& src) {
    auto out = lstm->forward(embed(src.to(torch::kLong)));
    auto enc_out = std::get<0>(out);
    auto h_n = std::get<0>(std::get<1>(out));
    auto c_n = std::get<1>(std::get<1>(out));
    const auto B = enc_out.size(0), S = enc_out.size(1);
    // FACT: o = torch.nn.LSTM(4, 3, batch_first=True, bidirectional=True)(torch.randn(2, 5, 4))[0]; assert not is_contiguous(o) and is_copy_of(o.reshape(-1, 6), o)
    auto enc_feat = W_h(enc_out.reshape({B * S, -1})); // EXPECT: tensor-reshape-non-contiguous
    // FACT: l = torch.nn.Linear(6, 6, bias=False)(torch.randn(10, 6)); assert is_contiguous(l) and is_view_of(l.view(2, 5, 6), l)
    enc_feat = enc_feat.view({B, S, -1}); // LOOKALIKE: tensor-view-non-contiguous -- the linear output is freshly allocated and contiguous
    auto h = torch::relu(reduce_h(torch::cat({h_n[0], h_n[1]}, 1)));
    auto c = torch::relu(reduce_c(torch::cat({c_n[0], c_n[1]}, 1)));
    return {enc_out, enc_feat, {h, c}};
  }

  torch::nn::Embedding embed;
  torch::nn::LSTM lstm;
  torch::nn::Linear W_h, reduce_h, reduce_c;
};
TORCH_MODULE(Encoder);

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(int64_t hidden)
      : W_s(register_module("W_s", torch::nn::Linear(2 * hidden, 2 * hidden))),
        w_c(register_module("w_c", torch::nn::Linear(torch::nn::LinearOptions(1, 2 * hidden).bias(false)))),
        v(register_module("v", torch::nn::Linear(torch::nn::LinearOptions(2 * hidden, 1).bias(false)))) {}

  std::pair<Tensor, Tensor> forward(const Tensor& s_hat, const Tensor& enc_out, const Tensor& enc_feat,
                                    const Tensor& mask, const Tensor& coverage) {
    auto feat = enc_feat + W_s(s_hat).unsqueeze(1) + w_c(coverage.unsqueeze(2));
    auto scores = v(torch::tanh(feat)).squeeze(2).masked_fill(mask.logical_not(), -1e9);
    auto attn = torch::softmax(scores, 1);
    auto context = torch::bmm(attn.unsqueeze(1), enc_out).squeeze(1);
    return {context, attn};
  }

  torch::nn::Linear W_s, w_c, v;
};
TORCH_MODULE(Attention);

struct StepOut {
  Tensor final_dist, attn, context;
  std::tuple<Tensor, Tensor> state;
};

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const Config& c)
      : embed(register_module("embed", torch::nn::Embedding(torch::nn::EmbeddingOptions(c.vocab_size, c.emb_dim).padding_idx(c.pad_id)))),
        x_context(register_module("x_context", torch::nn::Linear(2 * c.hidden + c.emb_dim, c.emb_dim))),
        cell(register_module("cell", torch::nn::LSTMCell(c.emb_dim, c.hidden))),
        attention(register_module("attention", Attention(c.hidden))),
        p_gen_linear(register_module("p_gen_linear", torch::nn::Linear(4 * c.hidden + c.emb_dim, 1))),
        out1(register_module("out1", torch::nn::Linear(3 * c.hidden, c.hidden))),
        out2(register_module("out2", torch::nn::Linear(c.hidden, c.vocab_size))) {}

  StepOut forward(const Tensor& y_prev, const std::tuple<Tensor, Tensor>& state, const Tensor& ctx_prev,
                  const Tensor& enc_out, const Tensor& enc_feat, const Tensor& mask, const Tensor& src_ids,
                  const Tensor& coverage, int64_t max_oov) {
    auto x = x_context(torch::cat({embed(y_prev), ctx_prev}, 1));
    auto next_state = cell(x, state);
    auto h = std::get<0>(next_state);
    auto s_hat = torch::cat({h, std::get<1>(next_state)}, 1);
    auto [context, attn] = attention(s_hat, enc_out, enc_feat, mask, coverage);

    auto p_gen = torch::sigmoid(p_gen_linear(torch::cat({context, s_hat, x}, 1)));
    auto vocab_dist = torch::softmax(out2(out1(torch::cat({h, context}, 1))), 1);
    // FACT: z = torch.randn(2, 5, requires_grad=True); p = torch.rand(2, 1); v = torch.softmax(z, 1); assert backward_fails(lambda: (v.mul_(p), v.sum().backward()))
    vocab_dist.mul_(p_gen); // EXPECT: tensor-inplace-on-saved
    auto copy_dist = (1 - p_gen) * attn;
    auto extra = torch::zeros({vocab_dist.size(0), max_oov});
    auto extended = torch::cat({vocab_dist, extra}, 1); // EXPECT: tensor-device-mismatch
    auto final_dist = extended.clone(); // EXPECT: tensor-unnecessary-clone
    final_dist.scatter_add_(1, src_ids, copy_dist);
    return {final_dist, attn, context, next_state};
  }

  torch::nn::Embedding embed;
  torch::nn::Linear x_context;
  torch::nn::LSTMCell cell;
  Attention attention;
  torch::nn::Linear p_gen_linear, out1, out2;
};
TORCH_MODULE(Decoder);

struct PointerGeneratorImpl : torch::nn::Module {
  explicit PointerGeneratorImpl(const Config& c)
      : cfg(c), encoder(register_module("encoder", Encoder(c))), decoder(register_module("decoder", Decoder(c))) {
    for (auto& p : parameters()) {
      torch::nn::init::uniform_(p, -0.02, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs the fill under a NoGradGuard
    }
  }

  void load_pretrained(const Tensor& vectors) {
    const auto n = std::min(vectors.size(0), cfg.vocab_size);
    // FACT: w = torch.nn.Embedding(10, 4).weight; assert raises(lambda: w.narrow(0, 0, 3).copy_(torch.zeros(3, 4)), "leaf Variable")
    encoder->embed->weight.narrow(0, 0, n).copy_(vectors.narrow(0, 0, n)); // EXPECT: tensor-inplace-on-leaf
    torch::NoGradGuard no_grad;
    decoder->embed->weight.data().copy_(encoder->embed->weight); // LOOKALIKE: tensor-inplace-on-detached -- deliberate write of the decoder table at load time, no graph exists
  }

  Tensor source_mask(const Tensor& src_len, int64_t S) const {
    return torch::arange(S, src_len.options()).unsqueeze(0) < src_len.unsqueeze(1); // LOOKALIKE: tensor-device-mismatch -- arange is built with src_len's options, on its device
  }

  // teacher-forced NLL and coverage loss
  std::pair<Tensor, Tensor> forward(const Batch& b) {
    auto [enc_out, enc_feat, state] = encoder(b.src);
    const auto B = enc_out.size(0), S = enc_out.size(1), T = b.tgt.size(1) - 1;
    auto mask = source_mask(b.src_len, S);
    auto coverage = torch::zeros({B, S}, enc_out.options());
    auto context = torch::zeros({B, enc_out.size(2)}, enc_out.options());
    // FACT: t = torch.tensor([[2, 7001]]); y = t.to(t.device, t.dtype, copy=True); y.masked_fill_(y >= 5000, 1); assert is_copy_of(y, t) and t[0, 1].item() == 7001
    auto dec_in = b.tgt.to(b.tgt.options(), /*non_blocking=*/false, /*copy=*/true);
    dec_in.masked_fill_(dec_in >= cfg.vocab_size, cfg.unk_id); // LOOKALIKE: tensor-alias-then-mutate -- copy=true gave a fresh tensor, b.tgt keeps the extended ids
    std::vector<Tensor> nll_steps, cov_steps;
    for (int64_t t = 0; t < T; ++t) {
      auto src_ids = b.src_ext.to(torch::kLong); // EXPECT: tensor-clone-in-loop
      auto step = decoder(dec_in.select(1, t), state, context, enc_out, enc_feat, mask, src_ids, coverage, b.max_oov);
      auto gold = b.tgt.select(1, t + 1);
      auto step_mask = gold.ne(cfg.pad_id).to(enc_out.scalar_type());
      auto p = step.final_dist.gather(1, gold.unsqueeze(1)).squeeze(1);
      nll_steps.push_back(-torch::log(p + 1e-12) * step_mask); // LOOKALIKE: tensor-graph-kept-across-iterations -- per-timestep terms of one batch, summed and backpropagated together
      cov_steps.push_back(torch::minimum(step.attn, coverage).sum(1) * step_mask);
      if (record_attention) {
        auto heat = step.attn.detach();
        heat.mul_(100.0); // EXPECT: tensor-inplace-on-detached
        attention_log.push_back(heat);
      }
      coverage = coverage + step.attn;
      context = step.context, state = step.state;
    }
    auto lens = b.tgt_len.to(enc_out.scalar_type());
    auto nll = (torch::stack(nll_steps, 1).sum(1) / lens).mean();
    auto cov = (torch::stack(cov_steps, 1).sum(1) / lens).mean();
    return {nll, cov};
  }

  std::vector<Tensor> greedy_decode(const Batch& b) {
    torch::NoGradGuard no_grad;
    auto [enc_out, enc_feat, state] = encoder(b.src);
    const auto B = enc_out.size(0), S = enc_out.size(1);
    auto mask = source_mask(b.src_len, S);
    auto src_ids = b.src_ext.to(torch::kLong);
    auto coverage = torch::zeros({B, S}, enc_out.options());
    auto context = torch::zeros({B, enc_out.size(2)}, enc_out.options());
    auto y = torch::full({B}, cfg.bos_id, b.tgt.options());
    auto finished = torch::zeros({B}, b.tgt.options().dtype(torch::kBool));
    std::vector<Tensor> tokens;
    coverage_trace.clear();
    for (int64_t t = 0; t < cfg.max_dec_steps; ++t) {
      auto step = decoder(y, state, context, enc_out, enc_feat, mask, src_ids, coverage, b.max_oov);
      auto next_tok = step.final_dist.argmax(1);
      tokens.push_back(next_tok);
      coverage_trace.push_back(coverage.clone()); // LOOKALIKE: tensor-unnecessary-clone -- coverage is accumulated in place just below, the snapshot must not follow it
      coverage.add_(step.attn);
      // FACT: t = torch.tensor([5, 7001]); y = t; y.masked_fill_(y >= 5000, 1); assert shares_storage(y, t) and t[1].item() == 1
      y = next_tok;
      y.masked_fill_(y >= cfg.vocab_size, cfg.unk_id); // EXPECT: tensor-alias-then-mutate
      finished = finished.logical_or(next_tok.eq(cfg.eos_id));
      if (finished.all().item<bool>()) break; // LOOKALIKE: tensor-sync-in-loop -- the host needs the flag to stop decoding
      context = step.context, state = step.state;
    }
    return tokens;
  }

  Config cfg;
  Encoder encoder;
  Decoder decoder;
  bool record_attention = false;
  std::vector<Tensor> attention_log;
  std::vector<Tensor> coverage_trace;
};
TORCH_MODULE(PointerGenerator);

void train(PointerGenerator& model, const std::vector<Example>& data, const Config& cfg, torch::Device device) {
  torch::optim::Adagrad opt(model->parameters(),
                            torch::optim::AdagradOptions(cfg.lr).initial_accumulator_value(0.1));
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  std::vector<Tensor> cov_history;
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::shuffle(order.begin(), order.end(), rng);
    double running = 0.0;
    int steps = 0;
    for (size_t start = 0; start + cfg.batch_size <= order.size(); start += cfg.batch_size) {
      std::vector<size_t> idx(order.begin() + start, order.begin() + start + cfg.batch_size);
      auto batch = collate(data, idx, cfg, device);
      model->record_attention = (steps % (cfg.log_every * 10) == 0);
      model->attention_log.clear();
      auto [nll, cov] = model(batch);
      auto loss = nll + cfg.cov_weight * cov;
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), cfg.max_grad_norm);
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
      cov_history.push_back(cov); // EXPECT: tensor-graph-kept-across-iterations
      if (++steps % cfg.log_every == 0) std::printf("epoch %d step %d loss %.4f\n", epoch, steps, running / steps);
    }
    if (!cov_history.empty())
      std::printf("epoch %d mean coverage loss %.4f\n", epoch, torch::stack(cov_history).mean().item<double>());
  }
}

std::vector<Example> synthetic_corpus(const Config& cfg, int n) {
  std::mt19937 rng(0);
  std::uniform_int_distribution<int32_t> word(4, static_cast<int32_t>(cfg.vocab_size) + 20);
  std::vector<Example> out(n);
  for (int i = 0; i < n; ++i) {
    auto& ex = out[i];
    std::vector<int32_t> oov;
    for (int k = 0; k < 30 + i % 40; ++k) {
      const auto w = word(rng);
      const bool in_vocab = w < cfg.vocab_size;
      if (!in_vocab && std::find(oov.begin(), oov.end(), w) == oov.end()) oov.push_back(w);
      const auto slot = std::find(oov.begin(), oov.end(), w) - oov.begin();
      ex.src.push_back(in_vocab ? w : static_cast<int32_t>(cfg.unk_id));
      ex.src_ext.push_back(in_vocab ? w : static_cast<int32_t>(cfg.vocab_size + slot));
    }
    for (int k = 0; k < 8 + i % 6; ++k) ex.tgt_ext.push_back(ex.src_ext[(k * 3) % ex.src.size()]);
    ex.n_oov = static_cast<int64_t>(oov.size());
  }
  return out;
}

}  // namespace pg

int main() {
  pg::Config cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto data = pg::synthetic_corpus(cfg, 512);
  pg::PointerGenerator model(cfg);
  model->load_pretrained(torch::randn({cfg.vocab_size, cfg.emb_dim}) * 0.1);
  model->to(device);
  pg::train(model, data, cfg, device);

  model->eval();
  auto batch = pg::collate(data, {0, 1, 2, 3}, cfg, device);
  auto tokens = torch::stack(model->greedy_decode(batch), 1).cpu();
  for (int64_t b = 0; b < tokens.size(0); ++b) {
    for (int64_t t = 0; t < tokens.size(1); ++t) {
      std::printf(" %lld", static_cast<long long>(tokens[b][t].item<int64_t>())); // LOOKALIKE: tensor-sync-in-loop -- tokens were copied to the host once, item() reads CPU memory
    }
    std::printf("  <- summary %lld\n", static_cast<long long>(b));
  }
  return 0;
}
