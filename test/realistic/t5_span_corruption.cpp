// T5 span-corruption pre-training: noise spans become sentinels in the encoder input,
// targets list each sentinel and the tokens it hid; the decoder is teacher-forced.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct T5Config {
  int64_t vocab = 32128, d_model = 512, d_kv = 64, heads = 8, d_ff = 2048, layers = 4;
  int64_t num_buckets = 32, max_distance = 128, extra_ids = 100;
  int64_t pad_id = 0, eos_id = 1, raw_len = 568, input_len = 512, target_len = 114, batch = 8;
  double noise_density = 0.15, mean_span = 3.0, dropout = 0.1, bias_clip = 8.0;
};

// Concatenate tokenized documents (int32 shards) and cut fixed-size raw windows.
std::vector<torch::Tensor> pack_windows(const std::vector<torch::Tensor>& docs, int64_t raw_len) {
  std::vector<torch::Tensor> windows;
  auto buf = torch::empty({raw_len}, torch::kLong);
  int64_t fill = 0;
  for (const auto& doc : docs) {
    int64_t off = 0;
    while (off < doc.size(0)) {
      const int64_t n = std::min(raw_len - fill, doc.size(0) - off);
      buf.narrow(0, fill, n).copy_(doc.narrow(0, off, n));  // LOOKALIKE: tensor-copy-narrowing -- int32 shard tokens widen into the int64 buffer
      fill += n, off += n;
      if (fill == raw_len) {
        windows.push_back(buf.clone());  // LOOKALIKE: tensor-clone-in-loop, tensor-unnecessary-clone -- buf is refilled for the next window, so each window needs its own copy
        fill = 0;
      }
    }
  }
  return windows;
}

// Split `total` items into `segments` non-empty runs of random length.
torch::Tensor random_segmentation(int64_t total, int64_t segments) {
  auto marks = torch::zeros({total - 1}, torch::kLong);
  marks.narrow(0, 0, segments - 1).fill_(1);
  marks = marks.index_select(0, torch::randperm(total - 1));
  auto segment_id = torch::cumsum(torch::cat({torch::zeros({1}, torch::kLong), marks}), 0);
  return torch::bincount(segment_id, {}, segments);
}

torch::Tensor random_spans_noise_mask(int64_t length, double density, double mean_span) {
  const int64_t num_noise = std::clamp<int64_t>(std::lround(length * density), 1, length - 1);
  const int64_t num_spans = std::max<int64_t>(1, std::lround(num_noise / mean_span));
  auto noise_lengths = random_segmentation(num_noise, num_spans);
  auto keep_lengths = random_segmentation(length - num_noise, num_spans);
  // FACT: s=torch.stack([torch.tensor([4,2]),torch.tensor([1,3])]); assert is_copy_of(s.t().reshape(-1), s)
  auto interleaved = torch::stack({keep_lengths, noise_lengths}).t().reshape({-1});  // EXPECT: tensor-reshape-non-contiguous
  auto span_starts = torch::cumsum(interleaved, 0).narrow(0, 0, 2 * num_spans - 1);
  auto start_indicator = torch::zeros({length}, torch::kLong).index_fill_(0, span_starts, 1);
  return torch::cumsum(start_indicator, 0).remainder(2).eq(1);
}

// Each run of masked positions becomes one sentinel (counting down from the top
// of the vocabulary); the rest of the run is dropped.
torch::Tensor apply_sentinels(const torch::Tensor& tokens, const torch::Tensor& mask, const T5Config& cfg) {
  auto prev = torch::cat({torch::zeros({1}, torch::kBool), mask.narrow(0, 0, mask.size(0) - 1)});
  auto first = mask.logical_and(prev.logical_not());
  auto sentinels = (cfg.vocab - 1) - (torch::cumsum(first.to(torch::kLong), 0) - 1);
  auto out = tokens.clone();  // EXPECT: tensor-unnecessary-clone
  out.masked_scatter_(first, sentinels.masked_select(first));
  return out.masked_select(mask.logical_and(prev).logical_not());
}

struct Batch { torch::Tensor input_ids, labels, dec_in; };

Batch collate(const std::vector<torch::Tensor>& windows, const T5Config& cfg) {
  const int64_t B = static_cast<int64_t>(windows.size());
  auto inputs = torch::full({B, cfg.input_len}, cfg.pad_id, torch::kLong);
  auto labels = torch::full({B, cfg.target_len}, -100, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    auto noise = random_spans_noise_mask(windows[i].size(0), cfg.noise_density, cfg.mean_span);
    auto enc = apply_sentinels(windows[i], noise, cfg);
    auto tgt = apply_sentinels(windows[i], noise.logical_not(), cfg);
    const int64_t n_in = std::min<int64_t>(enc.size(0), cfg.input_len - 1);
    const int64_t n_tg = std::min<int64_t>(tgt.size(0), cfg.target_len - 1);
    inputs[i].narrow(0, 0, n_in).copy_(enc.narrow(0, 0, n_in));
    inputs[i][n_in] = cfg.eos_id;
    labels[i].narrow(0, 0, n_tg).copy_(tgt.narrow(0, 0, n_tg));
    labels[i][n_tg] = cfg.eos_id;
  }
  // Shift right in place to save an allocation per batch.
  auto dec_in = labels.masked_fill(labels.eq(-100), cfg.pad_id);
  // FACT: x=torch.arange(12).view(2,6); r=x[:,:-1].clone(); x[:,1:].copy_(x[:,:-1]); assert not torch.equal(x[:,1:], r)
  dec_in.narrow(1, 1, cfg.target_len - 1).copy_(dec_in.narrow(1, 0, cfg.target_len - 1));  // EXPECT: tensor-inplace-overlap
  dec_in.select(1, 0).fill_(cfg.pad_id);
  return {inputs, labels, dec_in};
}

torch::Tensor shift_right(const torch::Tensor& labels, int64_t start_id) {
  auto dec_in = torch::full_like(labels, start_id);
  // FACT: l=torch.arange(12).view(2,6); d=torch.zeros_like(l); d[:,1:].copy_(l[:,:-1]); assert is_copy_of(d, l) and torch.equal(d[:,1:], l[:,:-1])
  dec_in.narrow(1, 1, labels.size(1) - 1).copy_(labels.narrow(1, 0, labels.size(1) - 1));  // LOOKALIKE: tensor-inplace-overlap -- the source is another tensor
  return dec_in.masked_fill(dec_in.eq(-100), start_id);
}

torch::Tensor relative_position_bucket(const torch::Tensor& rel, bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  if (bidirectional) num_buckets /= 2;
  auto buckets = bidirectional ? rel.gt(0).to(torch::kLong) * num_buckets : torch::zeros_like(rel);
  auto n = bidirectional ? rel.abs() : -torch::clamp_max(rel, 0);
  const int64_t max_exact = num_buckets / 2;
  auto large = max_exact + (torch::log(n.to(torch::kFloat) / max_exact) / std::log(static_cast<double>(max_distance) / max_exact) *
                            (num_buckets - max_exact)).to(torch::kLong);
  large = torch::clamp_max(large, num_buckets - 1);
  return buckets + torch::where(n.lt(max_exact), n, large);
}

struct T5AttentionImpl : torch::nn::Module {
  T5AttentionImpl(const T5Config& cfg, bool has_bias, bool bidirectional)
      : cfg(cfg), has_bias(has_bias), bidirectional(bidirectional) {
    const int64_t inner = cfg.heads * cfg.d_kv;
    auto lin = [&](int64_t in, int64_t out) { return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)); };
    q = register_module("q", lin(cfg.d_model, inner));
    k = register_module("k", lin(cfg.d_model, inner));
    v = register_module("v", lin(cfg.d_model, inner));
    o = register_module("o", lin(inner, cfg.d_model));
    if (has_bias) rel_bias = register_module("rel_bias", torch::nn::Embedding(cfg.num_buckets, cfg.heads));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }
  torch::Tensor compute_bias(int64_t q_len, int64_t k_len) {
    auto rel = torch::arange(k_len, torch::kLong).unsqueeze(0) - torch::arange(q_len, torch::kLong).unsqueeze(1);
    auto buckets = relative_position_bucket(rel, bidirectional, cfg.num_buckets, cfg.max_distance);
    auto values = rel_bias(buckets);  // EXPECT: tensor-device-mismatch
    // FACT: v=torch.randn(3,3,2); p=v.permute(2,0,1); assert is_view_of(p.reshape(1,2,3,3), v)
    return values.permute({2, 0, 1}).reshape({1, cfg.heads, q_len, k_len});  // LOOKALIKE: tensor-reshape-non-contiguous -- only a leading dim is added, strides can express it
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& kv,
                                                  const torch::Tensor& mask_bias, torch::Tensor position_bias) {
    const auto B = x.size(0), Tq = x.size(1), Tk = kv.size(1);
    auto shape = [&](const torch::Tensor& t) { return t.view({B, -1, cfg.heads, cfg.d_kv}).transpose(1, 2); };
    auto qh = shape(q(x)), kh = shape(k(kv)), vh = shape(v(kv));
    auto scores = torch::matmul(qh, kh.transpose(-2, -1));  // T5 folds the 1/sqrt(d) into the init
    if (!position_bias.defined()) {
      position_bias = has_bias ? compute_bias(Tq, Tk) : torch::zeros({1, cfg.heads, Tq, Tk}, scores.options());
      if (mask_bias.defined()) position_bias = position_bias + mask_bias;
    }
    // FACT: q=torch.randn(1,2,3,4,requires_grad=True); k=torch.randn(1,2,3,4,requires_grad=True); s=torch.matmul(q,k.transpose(-2,-1)); s+=torch.randn(1,2,3,3); s.sum().backward(); assert q.grad is not None
    scores += position_bias;  // LOOKALIKE: tensor-inplace-on-saved -- matmul saved its operands, not its output
    auto attn = drop(torch::softmax(scores, -1));
    auto ctx = torch::matmul(attn, vh);
    // FACT: c=torch.randn(2,4,3,8); assert raises(lambda: c.transpose(1,2).view(2,3,32), "view size is not compatible")
    return {o(ctx.transpose(1, 2).view({B, Tq, cfg.heads * cfg.d_kv})), position_bias};  // EXPECT: tensor-view-non-contiguous
  }
  T5Config cfg;
  bool has_bias, bidirectional;
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};
  torch::nn::Embedding rel_bias{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(T5Attention);

struct T5FeedForwardImpl : torch::nn::Module {
  explicit T5FeedForwardImpl(const T5Config& cfg) : p(cfg.dropout) {
    wi = register_module("wi", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.d_ff).bias(false)));
    wo = register_module("wo", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_ff, cfg.d_model).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    // The ReLU activations are the largest tensors in the layer: drop out in place.
    auto h = torch::relu(wi(x));
    // FACT: x=torch.randn(3,4,requires_grad=True); h=torch.relu(x); torch.nn.functional.dropout(h,0.5,True,inplace=True); assert backward_fails(lambda: h.sum().backward())
    F::dropout(h, F::DropoutFuncOptions().p(p).training(is_training()).inplace(true));  // EXPECT: tensor-inplace-on-saved
    return wo(h);
  }
  double p;
  torch::nn::Linear wi{nullptr}, wo{nullptr};
};
TORCH_MODULE(T5FeedForward);

struct RMSNormImpl : torch::nn::Module {
  explicit RMSNormImpl(int64_t d) { weight = register_parameter("weight", torch::ones({d})); }
  torch::Tensor forward(const torch::Tensor& x) {
    return weight * x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + 1e-6);
  }
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

struct T5BlockImpl : torch::nn::Module {
  T5BlockImpl(const T5Config& cfg, bool decoder, bool has_bias) : decoder(decoder) {
    self_attn = register_module("self_attn", T5Attention(cfg, has_bias, /*bidirectional=*/!decoder));
    if (decoder) cross_attn = register_module("cross_attn", T5Attention(cfg, false, false));
    ff = register_module("ff", T5FeedForward(cfg));
    for (int i = 0; i < 3; ++i) norms.push_back(register_module("norm" + std::to_string(i), RMSNorm(cfg.d_model)));
    drop = register_module("drop", torch::nn::Dropout(cfg.dropout));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor h, const torch::Tensor& self_mask, const torch::Tensor& bias,
                                                  const torch::Tensor& memory, const torch::Tensor& mem_mask) {
    auto n = norms[0](h);
    auto [attn_out, pos_bias] = self_attn->forward(n, n, self_mask, bias);
    h = h + drop(attn_out);
    if (decoder) h = h + drop(cross_attn->forward(norms[1](h), memory, mem_mask, {}).first);
    return {h + drop(ff(norms[2](h))), pos_bias};
  }
  bool decoder;
  T5Attention self_attn{nullptr}, cross_attn{nullptr};
  T5FeedForward ff{nullptr};
  std::vector<RMSNorm> norms;
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(T5Block);

struct T5ModelImpl : torch::nn::Module {
  explicit T5ModelImpl(const T5Config& cfg) : cfg(cfg) {
    shared = register_module("shared", torch::nn::Embedding(cfg.vocab, cfg.d_model));
    for (int64_t i = 0; i < cfg.layers; ++i) {
      enc.push_back(register_module("enc" + std::to_string(i), T5Block(cfg, false, i == 0)));
      dec.push_back(register_module("dec" + std::to_string(i), T5Block(cfg, true, i == 0)));
    }
    enc_norm = register_module("enc_norm", RMSNorm(cfg.d_model));
    dec_norm = register_module("dec_norm", RMSNorm(cfg.d_model));
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.d_model, cfg.vocab).bias(false)));
    torch::NoGradGuard no_grad;
    shared->weight.normal_(0.0, 1.0);  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
    lm_head->weight.normal_(0.0, std::pow(static_cast<double>(cfg.d_model), -0.5));
  }
  torch::Tensor mask_bias(const torch::Tensor& ids) const {
    return ids.eq(cfg.pad_id).to(torch::kFloat).mul(-1e9).view({ids.size(0), 1, 1, ids.size(1)});
  }
  torch::Tensor encode(const torch::Tensor& ids) {
    auto h = shared(ids);
    torch::Tensor bias;
    auto mask = mask_bias(ids);
    for (auto& block : enc) std::tie(h, bias) = block->forward(h, mask, bias, {}, {});
    return enc_norm(h);
  }
  torch::Tensor decode(const torch::Tensor& dec_in, const torch::Tensor& memory, const torch::Tensor& enc_ids) {
    const int64_t T = dec_in.size(1);
    auto pos = torch::arange(T, dec_in.options());  // LOOKALIKE: tensor-device-mismatch -- arange takes the decoder input's device
    auto causal = pos.unsqueeze(0).gt(pos.unsqueeze(1)).to(torch::kFloat).mul(-1e9).view({1, 1, T, T});
    auto h = shared(dec_in);
    torch::Tensor bias;
    auto mem_mask = mask_bias(enc_ids);
    for (auto& block : dec) std::tie(h, bias) = block->forward(h, causal, bias, memory, mem_mask);
    return lm_head(dec_norm(h));
  }
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& dec_in) {
    return decode(dec_in, encode(input_ids), input_ids);
  }
  T5Config cfg;
  torch::nn::Embedding shared{nullptr};
  std::vector<T5Block> enc, dec;
  RMSNorm enc_norm{nullptr}, dec_norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(T5Model);

// Accuracy on ordinary target tokens; sentinels are trivially predictable.
torch::Tensor token_accuracy(const torch::Tensor& logits, const torch::Tensor& labels, const T5Config& cfg) {
  const int64_t first_sentinel = cfg.vocab - cfg.extra_ids;
  auto scores = logits.detach();
  scores.narrow(-1, first_sentinel, cfg.extra_ids).fill_(-1e9);  // EXPECT: tensor-inplace-on-detached
  auto counted = labels.ne(-100).logical_and(labels.lt(first_sentinel));
  auto correct = scores.argmax(-1).eq(labels).logical_and(counted);
  return correct.sum().to(torch::kFloat) / counted.sum().clamp_min(1);
}

torch::Tensor greedy_generate(T5Model& model, const torch::Tensor& input_ids, const T5Config& cfg, int64_t max_new) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto memory = model->encode(input_ids);
  auto generated = torch::zeros({input_ids.size(0), max_new}, input_ids.options().dtype(torch::kInt32));
  auto dec_in = torch::full({input_ids.size(0), 1}, cfg.pad_id, input_ids.options());
  for (int64_t t = 0; t < max_new; ++t) {
    auto next = model->decode(dec_in, memory, input_ids).select(1, -1).argmax(-1);
    generated.select(1, t).copy_(next);  // EXPECT: tensor-copy-narrowing
    dec_in = torch::cat({dec_in, next.unsqueeze(1)}, 1);
  }
  model->train();
  return generated;
}

void train(const T5Config& cfg, const std::vector<torch::Tensor>& docs, int64_t epochs) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  T5Model model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.0));
  auto windows = pack_windows(docs, cfg.raw_len);
  for (int64_t epoch = 0; epoch < epochs; ++epoch) {
    auto epoch_loss = torch::zeros({}, device), epoch_acc = torch::zeros({}, device);
    int64_t steps = 0;
    for (size_t start = 0; start + cfg.batch <= windows.size(); start += cfg.batch) {
      auto batch = collate(std::vector<torch::Tensor>(windows.begin() + start, windows.begin() + start + cfg.batch), cfg);
      auto input_ids = batch.input_ids.to(device), labels = batch.labels.to(device);
      auto logits = model(input_ids, batch.dec_in.to(device));
      epoch_acc += token_accuracy(logits, labels, cfg);
      // FACT: l=torch.nn.Linear(4,6,bias=False)(torch.randn(2,3,4)); assert is_view_of(l.view(-1,6), l)
      auto loss = F::cross_entropy(logits.view({-1, cfg.vocab}), labels.view({-1}),  // LOOKALIKE: tensor-view-non-contiguous -- lm_head output and collated labels are contiguous
                                   F::CrossEntropyFuncOptions().ignore_index(-100));
      if (!std::isfinite(loss.item<float>())) continue;  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether the step runs
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      opt.step();
      model->enc.front()->self_attn->rel_bias->weight.clamp_(-cfg.bias_clip, cfg.bias_clip);  // EXPECT: tensor-inplace-on-leaf
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      ++steps;
    }
    std::cout << "epoch " << epoch << " loss " << (epoch_loss / std::max<int64_t>(steps, 1)).item<double>()
              << " acc " << (epoch_acc / std::max<int64_t>(steps, 1)).item<double>() << std::endl;
    auto sample = collate(std::vector<torch::Tensor>(windows.begin(), windows.begin() + 2), cfg);
    auto sample_ids = sample.input_ids.to(device);
    auto pred = greedy_generate(model, sample_ids, cfg, 16);
    torch::NoGradGuard no_grad;
    auto forced = model(sample_ids, shift_right(sample.labels, cfg.pad_id).to(device)).argmax(-1);
    std::cout << "teacher-forced " << forced.slice(1, 0, 16).cpu() << "\ngreedy " << pred.cpu() << std::endl;
  }
}

int main() {
  T5Config cfg;
  std::vector<torch::Tensor> docs;
  for (int64_t i = 0; i < 256; ++i) docs.push_back(torch::randint(2, cfg.vocab - cfg.extra_ids, {200 + 7 * i}, torch::kInt32));
  train(cfg, docs, 3);
}
