// Joint CTC/attention speech recogniser (ESPnet-style) in LibTorch: conv-subsampled
// BLSTM encoder, CTC head, LSTM attention decoder with cached keys/values and state,
// one-pass beam search with CTC prefix scoring and length normalisation, and the
// hybrid training step (ctc_weight * CTC + (1 - ctc_weight) * label-smoothed CE).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct AsrConfig {
  int64_t n_mels = 80, vocab = 500, d_model = 256, conv_ch = 64, enc_layers = 3, heads = 4;
  int64_t blank = 0, sos_eos = 499, ignore_id = -1, beam = 10, log_every = 50;
  double ctc_weight = 0.3, lsm = 0.1, len_alpha = 0.6;
};

constexpr double kLogZero = -1e10;

class GlobalCmvn {
 public:
  GlobalCmvn(torch::Tensor mean, torch::Tensor istd) : mean_(std::move(mean)), istd_(std::move(istd)) {}

  torch::Tensor operator()(const torch::Tensor& feats) const {
    // FACT: f = torch.randn(2, 7, 4); assert shares_storage(f.to(torch.float32), f)
    auto x = feats.to(torch::kFloat);
    x.sub_(mean_).mul_(istd_);  // EXPECT: tensor-alias-then-mutate
    return x;
  }

 private:
  torch::Tensor mean_, istd_;
};

struct EncoderImpl : nn::Module {
  explicit EncoderImpl(const AsrConfig& c)
      : conv1(nn::Conv2dOptions(1, c.conv_ch, 3).stride(2)),
        conv2(nn::Conv2dOptions(c.conv_ch, c.conv_ch, 3).stride(2)),
        proj(c.conv_ch * (((c.n_mels - 1) / 2 - 1) / 2), c.d_model),
        rnn(nn::LSTMOptions(c.d_model, c.d_model / 2).num_layers(c.enc_layers).bidirectional(true)) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("proj", proj);
    register_module("rnn", rnn);
  }

  torch::Tensor forward(const torch::Tensor& feats) {  // [B, T, n_mels] -> [B, T', D]
    auto x = torch::relu(conv1(feats.unsqueeze(1)));
    x = torch::relu(conv2(x));
    const int64_t b = x.size(0), c = x.size(1), t = x.size(2), f = x.size(3);
    // FACT: x = torch.randn(2, 3, 5, 7); assert is_copy_of(x.transpose(1, 2).reshape(2, 5, 21), x)
    x = proj(x.transpose(1, 2).reshape({b, t, c * f}));  // EXPECT: tensor-reshape-non-contiguous
    auto out = std::get<0>(rnn(x.transpose(0, 1)));
    return out.transpose(0, 1);
  }

  static torch::Tensor out_lengths(const torch::Tensor& in_lens) {
    return ((in_lens - 1).div(2, "floor") - 1).div(2, "floor");
  }

  nn::Conv2d conv1, conv2;
  nn::Linear proj;
  nn::LSTM rnn;
};
TORCH_MODULE(Encoder);

struct DecState {
  torch::Tensor h, c, ctx;
};

struct AttDecoderImpl : nn::Module {
  explicit AttDecoderImpl(const AsrConfig& c)
      : heads(c.heads), d(c.d_model),
        embed(register_module("embed", nn::Embedding(c.vocab, d))),
        cell(register_module("cell", nn::LSTMCell(2 * d, d))),
        q_proj(register_module("q_proj", nn::Linear(d, d))),
        k_proj(register_module("k_proj", nn::Linear(d, d))),
        v_proj(register_module("v_proj", nn::Linear(d, d))),
        o_proj(register_module("o_proj", nn::Linear(d, d))),
        out(register_module("out", nn::Linear(d, c.vocab))) {}

  // Keys/values of the encoder output: computed once per utterance, cached by the caller.
  std::pair<torch::Tensor, torch::Tensor> memory(const torch::Tensor& enc) {
    const int64_t B = enc.size(0), T = enc.size(1), dh = d / heads;
    auto k = k_proj(enc).view({B, T, heads, dh}).transpose(1, 2);
    auto v = v_proj(enc).view({B, T, heads, dh}).transpose(1, 2);
    return {k, v};
  }

  DecState init_state(int64_t B, const torch::TensorOptions& opts) {
    return {torch::zeros({B, d}, opts), torch::zeros({B, d}, opts), torch::zeros({B, d}, opts)};
  }

  std::pair<torch::Tensor, DecState> step(const torch::Tensor& prev, const DecState& st,
                                          const torch::Tensor& k, const torch::Tensor& v) {
    const int64_t B = prev.size(0), dh = d / heads;
    auto hc = cell(torch::cat({embed(prev), st.ctx}, -1), std::make_tuple(st.h, st.c));
    auto h = std::get<0>(hc);
    auto q = q_proj(h).view({B, heads, 1, dh});
    auto att = torch::softmax(torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(double(dh)), -1);
    auto ctx = torch::matmul(att, v);
    // FACT: k = torch.randn(2, 7, 3, 4).transpose(1, 2); a = torch.softmax(torch.randn(2, 3, 1, 7), -1); c = torch.matmul(a, k); assert is_contiguous(c) and c.view(2, 12).shape == (2, 12)
    auto ctx_flat = ctx.view({B, d});  // LOOKALIKE: tensor-view-non-contiguous -- matmul returns a fresh contiguous [B, H, 1, dh]
    auto hid = o_proj(ctx_flat);
    hid.add_(h);  // LOOKALIKE: tensor-inplace-on-saved -- Linear saves its input, not its output
    return {out(torch::tanh(hid)), DecState{h, std::get<1>(hc), ctx_flat}};
  }

  // Teacher forcing: ys_in [B, L] -> logits [B, L, V].
  torch::Tensor forward(const torch::Tensor& ys_in, const torch::Tensor& enc) {
    auto kv = memory(enc);
    auto st = init_state(ys_in.size(0), enc.options());
    std::vector<torch::Tensor> steps;
    for (int64_t i = 0; i < ys_in.size(1); ++i) {
      auto r = step(ys_in.select(1, i), st, kv.first, kv.second);
      steps.push_back(r.first);  // LOOKALIKE: tensor-graph-kept-across-iterations -- stacked and returned: the loss backpropagates through every step
      st = r.second;
    }
    return torch::stack(steps, 1);
  }

  int64_t heads, d;
  nn::Embedding embed;
  nn::LSTMCell cell;
  nn::Linear q_proj, k_proj, v_proj, o_proj, out;
};
TORCH_MODULE(AttDecoder);

struct JointModelImpl : nn::Module {
  explicit JointModelImpl(const AsrConfig& c)
      : encoder(register_module("encoder", Encoder(c))),
        ctc_head(register_module("ctc_head", nn::Linear(c.d_model, c.vocab))),
        decoder(register_module("decoder", AttDecoder(c))) {
    torch::NoGradGuard no_grad;
    ctc_head->bias.zero_();  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
    ctc_head->bias[c.blank] = 2.0;
  }
  Encoder encoder;
  nn::Linear ctc_head;
  AttDecoder decoder;
};
TORCH_MODULE(JointModel);

torch::Tensor label_smoothing_loss(const torch::Tensor& logits, const torch::Tensor& target,
                                   double smoothing, int64_t ignore_id) {
  const int64_t V = logits.size(-1);
  auto logp = F::log_softmax(logits, F::LogSoftmaxFuncOptions(-1));
  auto ignore = target.eq(ignore_id);
  auto true_dist = torch::full_like(logp, smoothing / static_cast<double>(V - 1));
  true_dist.scatter_(-1, target.masked_fill(ignore, 0).unsqueeze(-1), 1.0 - smoothing);
  logp.masked_fill_(ignore.unsqueeze(-1), 0.0);  // EXPECT: tensor-inplace-on-saved
  auto n_tokens = (~ignore).sum().clamp_min(1);
  return -(true_dist * logp).sum() / n_tokens;
}

// CTC prefix state r: [T, 2] log-probs of the prefix ending in non-blank (0) / blank (1).
torch::Tensor ctc_initial_state(const torch::Tensor& logp, int64_t blank) {
  auto r = torch::full({logp.size(0), 2}, kLogZero, logp.options());
  r.select(1, 1).copy_(logp.select(1, blank).cumsum(0));  // LOOKALIKE: tensor-copy-narrowing -- r is made with logp's own options: same dtype
  return r;
}

struct CtcScore {
  torch::Tensor psi;  // [n] prefix scores of the candidates
  torch::Tensor r;    // [n, T, 2]
};

CtcScore ctc_prefix_score(const torch::Tensor& logp, int64_t blank, int64_t eos,
                          const std::vector<int64_t>& y, const torch::Tensor& cands,
                          const torch::Tensor& r_prev) {
  const int64_t T = logp.size(0), n = cands.size(0);
  const int64_t out_len = static_cast<int64_t>(y.size()) - 1;
  auto xs = logp.index_select(1, cands);
  auto r = torch::full({T, 2, n}, kLogZero, logp.options());
  if (out_len == 0) r[0][0] = xs[0];
  auto r_sum = torch::logaddexp(r_prev.select(1, 0), r_prev.select(1, 1));
  // FACT: s = torch.randn(6); p = s.unsqueeze(1).expand(6, 4).clone(); p[:, 1].copy_(torch.randn(6)); assert is_copy_of(p, s)
  auto log_phi = r_sum.unsqueeze(1).expand({T, n}).clone();
  auto c = cands.accessor<int64_t, 1>();
  for (int64_t i = 0; i < n; ++i)
    if (c[i] == y.back()) log_phi.select(1, i).copy_(r_prev.select(1, 1));  // LOOKALIKE: tensor-inplace-on-expanded -- the clone gave log_phi memory of its own
  const int64_t start = std::max<int64_t>(out_len, 1);
  auto log_psi = r[start - 1][0];
  for (int64_t t = start; t < T; ++t) {
    r[t][0] = torch::logaddexp(r[t - 1][0], log_phi[t - 1]) + xs[t];
    r[t][1] = torch::logaddexp(r[t - 1][0], r[t - 1][1]) + logp[t][blank];
    log_psi = torch::logaddexp(log_psi, log_phi[t - 1] + xs[t]);
  }
  log_psi = torch::where(cands == eos, r_sum[T - 1], log_psi);
  return {log_psi, r.permute({2, 0, 1})};
}

struct Hyp {
  std::vector<int64_t> ys;
  double score = 0.0, ctc_psi = 0.0;
  torch::Tensor ctc_r;
  DecState state;
};

std::vector<int64_t> joint_beam_search(JointModel& model, const torch::Tensor& enc,
                                       const torch::Tensor& ctc_logp, const AsrConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto& dec = model->decoder;
  auto kv = dec->memory(enc);
  const double w = cfg.ctc_weight;
  const int64_t V = ctc_logp.size(1), pre_beam = std::min<int64_t>(V, cfg.beam + cfg.beam / 2);
  Hyp init;
  init.ys = {cfg.sos_eos};
  init.ctc_r = ctc_initial_state(ctc_logp.to(torch::kDouble), cfg.blank);
  init.state = dec->init_state(1, enc.options());
  std::vector<Hyp> beam{init}, ended;
  for (int64_t len = 0; len < enc.size(1) && !beam.empty(); ++len) {
    const int64_t n = static_cast<int64_t>(beam.size());
    std::vector<int64_t> prev_ids;
    std::vector<double> hyp_scores;
    std::vector<torch::Tensor> hs, cs, ctxs;
    for (const auto& hyp : beam) {
      prev_ids.push_back(hyp.ys.back()), hyp_scores.push_back(hyp.score);
      hs.push_back(hyp.state.h), cs.push_back(hyp.state.c), ctxs.push_back(hyp.state.ctx);
    }
    DecState st{torch::cat(hs), torch::cat(cs), torch::cat(ctxs)};
    auto out = dec->step(torch::tensor(prev_ids, torch::kLong), st, kv.first.expand({n, -1, -1, -1}),
                         kv.second.expand({n, -1, -1, -1}));
    auto att_logp = F::log_softmax(out.first, F::LogSoftmaxFuncOptions(-1)).to(torch::kDouble);
    auto lp64 = ctc_logp.to(torch::kDouble);  // EXPECT: tensor-clone-in-loop
    auto base = torch::tensor(hyp_scores, torch::kDouble);
    // FACT: s = torch.randn(3, dtype=torch.float64); assert raises(lambda: s.unsqueeze(1).expand(3, 5).add_(torch.randn(3, 5, dtype=torch.float64), alpha=0.7), "more than one element")
    auto joint = base.unsqueeze(1).expand({n, V});
    joint.add_(att_logp, 1.0 - w);  // EXPECT: tensor-inplace-on-expanded
    std::vector<Hyp> next;
    for (int64_t i = 0; i < n; ++i) {
      const auto& hyp = beam[i];
      auto top = std::get<1>(joint[i].topk(pre_beam));
      auto ctc = ctc_prefix_score(lp64, cfg.blank, cfg.sos_eos, hyp.ys, top, hyp.ctc_r);
      auto total = joint[i].index_select(0, top) + w * (ctc.psi - hyp.ctc_psi);
      const auto& so = out.second;
      DecState st_i{so.h.narrow(0, i, 1).clone(), so.c.narrow(0, i, 1).clone(), so.ctx.narrow(0, i, 1).clone()};  // LOOKALIKE: tensor-clone-in-loop -- a different row each pass, kept by the new hypotheses
      auto tot = total.accessor<double, 1>();
      auto tk = top.accessor<int64_t, 1>();
      auto psi = ctc.psi.accessor<double, 1>();
      for (int64_t j = 0; j < pre_beam; ++j) {
        auto ys = hyp.ys;
        ys.push_back(tk[j]);
        next.push_back(Hyp{std::move(ys), tot[j], psi[j], ctc.r[j], st_i});
      }
    }
    std::sort(next.begin(), next.end(), [](const Hyp& a, const Hyp& b) { return a.score > b.score; });
    beam.clear();
    for (auto& h : next) {
      if (static_cast<int64_t>(beam.size()) >= cfg.beam) break;
      if (h.ys.back() == cfg.sos_eos) ended.push_back(std::move(h));
      else beam.push_back(std::move(h));
    }
  }
  if (ended.empty()) ended = beam;
  std::vector<double> raw, lens;
  for (const auto& h : ended)
    raw.push_back(h.score), lens.push_back(static_cast<double>(h.ys.size() - 1));
  auto scores = torch::tensor(raw, torch::kDouble);
  auto lengths = torch::tensor(lens, torch::kDouble);
  torch::Tensor normed = scores;
  // FACT: s = torch.randn(4, dtype=torch.float64); n = s; n = n / torch.tensor([2., 3., 4., 5.], dtype=torch.float64).pow(0.6); assert is_copy_of(n, s)
  normed = normed / lengths.pow(cfg.len_alpha);
  normed.masked_fill_(lengths < 2, -std::numeric_limits<double>::infinity());  // LOOKALIKE: tensor-alias-then-mutate -- normed was rebound to the division's new tensor
  const int64_t best = normed.argmax().item<int64_t>();
  std::cout << "best raw score " << scores[best].item<double>() << "\n";
  return ended[best].ys;
}

struct Batch { torch::Tensor feats, feat_lens, ys_pad, ys_lens; };

double train_epoch(JointModel& model, torch::optim::Optimizer& opt, const std::vector<Batch>& batches,
                   const GlobalCmvn& cmvn, const AsrConfig& cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> att_history;
  double running_ctc = 0.0;
  int64_t step = 0;
  for (const auto& b : batches) {
    auto feats = cmvn(b.feats).to(device);
    auto ys = b.ys_pad.to(device);
    auto enc = model->encoder(feats);
    auto ctc_logp = F::log_softmax(model->ctc_head(enc), F::LogSoftmaxFuncOptions(-1));
    auto ctc_tgt = ys.clone();  // EXPECT: tensor-unnecessary-clone
    ctc_tgt.masked_fill_(ctc_tgt == cfg.ignore_id, 0);
    auto ctc = F::ctc_loss(ctc_logp.transpose(0, 1), ctc_tgt, Encoder::Impl::out_lengths(b.feat_lens),
                           b.ys_lens, F::CTCLossFuncOptions().blank(cfg.blank).zero_infinity(true));
    auto sos = torch::full({ys.size(0), 1}, cfg.sos_eos, ys.options());
    auto ys_in = torch::cat({sos, ys.masked_fill(ys == cfg.ignore_id, cfg.sos_eos)}, 1);
    auto ys_out = torch::cat({ys, torch::full_like(sos, cfg.ignore_id)}, 1);
    ys_out.scatter_(1, b.ys_lens.to(device).unsqueeze(1), cfg.sos_eos);
    auto att = label_smoothing_loss(model->decoder(ys_in, enc), ys_out, cfg.lsm, cfg.ignore_id);
    auto loss = cfg.ctc_weight * ctc + (1.0 - cfg.ctc_weight) * att;
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 5.0);
    opt.step();
    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    running_ctc += ctc.item<double>();  // EXPECT: tensor-sync-in-loop
    att_history.push_back(att.detach());  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached: the value without its graph
    if (++step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << loss.item<float>() << "\n";  // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
  }
  std::cout << "ctc " << running_ctc / std::max<int64_t>(step, 1) << " att "
            << torch::stack(att_history).mean().item<double>() << "\n";
  return epoch_loss.item<double>() / std::max<int64_t>(step, 1);
}
