// Word-level LSTM language model for a large vocabulary (WikiText-103 style, ~267k words) with an
// adaptive softmax output (Grave et al. 2017): the head scores the most frequent words plus one
// entry per tail cluster; each cluster has a low-rank projection and its own softmax, so a rare
// word costs head + one small tail. Training is truncated BPTT over batchified token streams;
// evaluation reports perplexity overall and per frequency bucket; a sampler generates text from
// a fixed-length context window.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace nn = torch::nn;
using State = std::tuple<torch::Tensor, torch::Tensor>;

struct LMConfig {
  int64_t vocab = 267735, emb = 512, hidden = 1024, layers = 2;
  std::vector<int64_t> cutoffs{20000, 60000, 200000}; // head shortlist, then cluster bounds
  double div_value = 4.0, dropout = 0.25, lr = 1e-3, clip = 0.25;
  int64_t bptt = 150, batch_size = 32, eval_batch_size = 10, epochs = 5, log_every = 200;
};

struct AdaptiveSoftmaxImpl : nn::Module {
  AdaptiveSoftmaxImpl(int64_t in, int64_t vocab, std::vector<int64_t> cutoffs, double div) : cutoffs_(std::move(cutoffs)) {
    cutoffs_.push_back(vocab);
    shortlist_ = cutoffs_[0];
    n_clusters_ = static_cast<int64_t>(cutoffs_.size()) - 1;
    head_ = register_module("head", nn::Linear(nn::LinearOptions(in, shortlist_ + n_clusters_).bias(false)));
    for (int64_t i = 0; i < n_clusters_; ++i) {
      const auto hsz = static_cast<int64_t>(in / std::pow(div, i + 1));
      const auto osz = cutoffs_[i + 1] - cutoffs_[i];
      tails_.push_back(register_module("tail" + std::to_string(i),
                                       nn::Sequential(nn::Linear(nn::LinearOptions(in, hsz).bias(false)),
                                                      nn::Linear(nn::LinearOptions(hsz, osz).bias(false)))));
    }
  }

  // hidden [N, in], targets [N] -> negative log-likelihood of each target [N]
  torch::Tensor forward(const torch::Tensor &hidden, const torch::Tensor &targets) {
    auto head_lp = torch::log_softmax(head_(hidden), 1);
    auto output = torch::zeros({hidden.size(0)}, hidden.options());
    auto head_rows = (targets < shortlist_).nonzero().squeeze(1);
    auto head_tgt = targets.index_select(0, head_rows).unsqueeze(1);
    // FACT: o = torch.zeros(4); s = torch.randn(2, requires_grad=True) * 1; o.index_copy_(0, torch.tensor([0, 2]), s); o.sum().backward(); assert not o.is_leaf
    output.index_copy_(0, head_rows, head_lp.index_select(0, head_rows).gather(1, head_tgt).squeeze(1)); // LOOKALIKE: tensor-inplace-on-leaf -- output is a fresh zeros tensor that requires no grad
    for (int64_t i = 0; i < n_clusters_; ++i) {
      const auto low = cutoffs_[i], high = cutoffs_[i + 1];
      auto mask = (targets >= low) & (targets < high);
      auto rows = mask.nonzero().squeeze(1);
      if (rows.numel() == 0)
        continue;
      auto rel = targets.masked_select(mask);
      // FACT: t = torch.tensor([3, 25000, 70000, 25010]); m = (t >= 20000) & (t < 60000); r = t.masked_select(m); r -= 20000; assert is_copy_of(r, t) and t[1] == 25000
      rel -= low; // LOOKALIKE: tensor-alias-then-mutate -- masked_select copies: the batch's targets keep their word ids for the next cluster
      auto tail_lp = torch::log_softmax(tails_[i]->forward(hidden.index_select(0, rows)), 1);
      // FACT: l = torch.nn.Linear(4, 6); lp = torch.log_softmax(l(torch.randn(3, 4)), 1); lp.add_(torch.randn(3, 1)); assert backward_fails(lambda: lp.sum().backward())
      tail_lp.add_(head_lp.index_select(0, rows).select(1, shortlist_ + i).unsqueeze(1)); // EXPECT: tensor-inplace-on-saved -- log_softmax saved its output for backward: adding the cluster's log-prob in place breaks loss.backward()
      output.index_copy_(0, rows, tail_lp.gather(1, rel.unsqueeze(1)).squeeze(1));
    }
    return -output;
  }

  // Full [N, vocab] log-distribution, for sampling only.
  torch::Tensor log_prob(const torch::Tensor &hidden) {
    torch::NoGradGuard no_grad;
    auto head_lp = torch::log_softmax(head_(hidden), 1);
    std::vector<torch::Tensor> parts{head_lp.narrow(1, 0, shortlist_)};
    for (int64_t i = 0; i < n_clusters_; ++i) {
      auto tail_lp = torch::log_softmax(tails_[i]->forward(hidden), 1);
      tail_lp.add_(head_lp.narrow(1, shortlist_ + i, 1)); // LOOKALIKE: tensor-inplace-on-saved -- under NoGradGuard nothing is saved for backward
      parts.push_back(tail_lp);
    }
    return torch::cat(parts, 1);
  }

  std::vector<int64_t> cutoffs_;
  int64_t shortlist_ = 0, n_clusters_ = 0;
  nn::Linear head_{nullptr};
  std::vector<nn::Sequential> tails_;
};
TORCH_MODULE(AdaptiveSoftmax);

struct WordLMImpl : nn::Module {
  explicit WordLMImpl(const LMConfig &cfg) : hidden_(cfg.hidden), layers_(cfg.layers) {
    embed_ = register_module("embed", nn::Embedding(cfg.vocab, cfg.emb));
    lstm_ = register_module("lstm", nn::LSTM(nn::LSTMOptions(cfg.emb, cfg.hidden).num_layers(cfg.layers).dropout(cfg.dropout)));
    drop_ = register_module("drop", nn::Dropout(cfg.dropout));
    softmax_ = register_module("softmax", AdaptiveSoftmax(cfg.hidden, cfg.vocab, cfg.cutoffs, cfg.div_value));
    init_weights();
  }

  void init_weights() {
    // FACT: e = torch.nn.Embedding(10, 4); assert raises(lambda: e.weight.uniform_(-0.1, 0.1), "a leaf Variable that requires grad")
    embed_->weight.uniform_(-0.1, 0.1); // EXPECT: tensor-inplace-on-leaf -- the embedding table is a parameter and grad mode is on in the constructor
    nn::init::xavier_uniform_(softmax_->head_->weight); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under NoGradGuard
    torch::NoGradGuard no_grad;
    for (auto &p : lstm_->named_parameters()) {
      if (p.key().find("bias") == std::string::npos)
        continue;
      // FACT: l = torch.nn.LSTM(4, 3); b = l.bias_ih_l0; exec("with torch.no_grad(): b.narrow(0, 3, 3).fill_(1.0)"); assert b.is_leaf and b.requires_grad and bool((b[3:6] == 1).all())
      p.value().narrow(0, hidden_, hidden_).fill_(1.0); // LOOKALIKE: tensor-inplace-on-leaf -- the forget-gate bias is set under NoGradGuard
    }
  }

  State init_state(int64_t batch, torch::Device device) const {
    auto opts = torch::TensorOptions().device(device);
    return {torch::zeros({layers_, batch, hidden_}, opts), torch::zeros({layers_, batch, hidden_}, opts)};
  }

  // input [T, B] word ids -> (hidden [T, B, H], next state)
  std::tuple<torch::Tensor, State> forward(const torch::Tensor &input, const State &state) {
    auto x = drop_(embed_(input));
    auto res = lstm_->forward(x, state);
    return {drop_(std::get<0>(res)), std::get<1>(res)};
  }

  int64_t hidden_, layers_;
  nn::Embedding embed_{nullptr};
  nn::LSTM lstm_{nullptr};
  nn::Dropout drop_{nullptr};
  AdaptiveSoftmax softmax_{nullptr};
};
TORCH_MODULE(WordLM);

// [N] token stream -> [N / bsz, bsz]: column b is the b-th slice of the stream.
torch::Tensor batchify(const torch::Tensor &ids, int64_t bsz) {
  const auto nbatch = ids.size(0) / bsz;
  // FACT: d = torch.arange(23); assert is_view_of(d.narrow(0, 0, 20).view(4, -1), d)
  return ids.narrow(0, 0, nbatch * bsz).view({bsz, -1}).t().contiguous(); // LOOKALIKE: tensor-view-non-contiguous -- a prefix of a 1-D stream is contiguous
}

std::pair<torch::Tensor, torch::Tensor> get_batch(const torch::Tensor &source, int64_t i, int64_t bptt) {
  const auto len = std::min(bptt, source.size(0) - 1 - i);
  // FACT: s = torch.arange(40).view(8, 5); t = s.narrow(0, 3, 4); assert is_view_of(t.view(-1), s)
  return {source.narrow(0, i, len), source.narrow(0, i + 1, len).view({-1})}; // LOOKALIKE: tensor-view-non-contiguous -- whole rows of a contiguous [N, B] block are contiguous
}

void train_epoch(WordLM &model, const torch::Tensor &data, torch::optim::Optimizer &opt, const LMConfig &cfg,
                 torch::Device device, int64_t epoch) {
  model->train();
  auto state = model->init_state(data.size(1), device);
  int64_t step = 0;
  for (int64_t i = 0; i < data.size(0) - 1; i += cfg.bptt, ++step) {
    auto batch = get_batch(data, i, cfg.bptt);
    // truncated BPTT: the state carries values, not the previous segment's graph
    state = std::make_tuple(std::get<0>(state).detach(), std::get<1>(state).detach());
    auto [out, next] = model->forward(batch.first, state);
    // FACT: l = torch.nn.LSTM(3, 4); h = (torch.zeros(1, 2, 4), torch.zeros(1, 2, 4)); exec("for _ in range(3):\n    h = tuple(t.detach() for t in h)\n    o, h = l(torch.randn(5, 2, 3), h)"); assert kept_nodes(list(h)) < 2 * kept_nodes(list(l(torch.randn(5, 2, 3))[1]))
    state = next; // LOOKALIKE: tensor-graph-kept-across-iterations -- detached at the top of the next segment: one segment's graph at a time
    // FACT: o, _ = torch.nn.LSTM(4, 8)(torch.randn(5, 3, 4)); assert is_view_of(o.view(-1, 8), o)
    auto nll = model->softmax_->forward(out.view({-1, cfg.hidden}), batch.second); // LOOKALIKE: tensor-view-non-contiguous -- a sequence-first LSTM output is contiguous
    auto loss = nll.mean();
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), cfg.clip);
    opt.step();
    if (step % cfg.log_every == 0)
      std::cout << "epoch " << epoch << " step " << step << " ppl " << std::exp(loss.item<double>()) << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every segments
  }
}

struct EvalResult {
  double ppl = 0;
  std::vector<double> bucket_ppl; // head words, then each tail cluster
};

EvalResult evaluate(WordLM &model, const torch::Tensor &data, const LMConfig &cfg) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  model->to(device);
  model->eval();
  auto bounds = torch::tensor(cfg.cutoffs); // frequency-rank bucket bounds
  const auto n_buckets = static_cast<int64_t>(cfg.cutoffs.size()) + 1;
  auto dopts = torch::TensorOptions().dtype(torch::kDouble).device(device);
  auto bucket_nll = torch::zeros({n_buckets}, dopts), bucket_count = torch::zeros({n_buckets}, dopts);
  auto state = model->init_state(data.size(1), device);
  double total_nll = 0;
  int64_t total_tokens = 0;
  for (int64_t i = 0; i < data.size(0) - 1; i += cfg.bptt) {
    auto batch = get_batch(data, i, cfg.bptt);
    auto target = batch.second.to(device);
    auto [out, next] = model->forward(batch.first.to(device), state);
    state = next;
    auto nll = model->softmax_->forward(out.view({-1, cfg.hidden}), target);
    total_nll += nll.sum().item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU after every segment only to add up a sum
    total_tokens += target.numel();
    auto bucket = torch::bucketize(target, bounds.to(device), false, true); // EXPECT: tensor-clone-in-loop -- the same bucket bounds are copied to the GPU for every segment
    bucket_nll.index_add_(0, bucket, nll.to(torch::kDouble));
    bucket_count.index_add_(0, bucket, torch::ones_like(nll, dopts));
  }
  EvalResult res;
  res.ppl = std::exp(total_nll / static_cast<double>(std::max<int64_t>(total_tokens, 1)));
  auto per_bucket = torch::exp(bucket_nll / bucket_count.clamp_min(1)).cpu();
  for (int64_t b = 0; b < n_buckets; ++b)
    res.bucket_ppl.push_back(per_bucket[b].item<double>()); // LOOKALIKE: tensor-sync-in-loop -- per_bucket was copied to the host once: item() reads host memory
  return res;
}

// Sampling with a fixed window of the last L words (no carried state: every step sees L words).
std::vector<int64_t> generate(WordLM &model, const std::vector<int64_t> &prompt, int64_t n_words, double temperature,
                              int64_t L) {
  torch::NoGradGuard no_grad;
  model->to(torch::kCPU); // sampling runs on the host
  model->eval();
  const auto n = std::min<int64_t>(L, static_cast<int64_t>(prompt.size()));
  auto window = torch::zeros({L, 1}, torch::kLong);
  auto prompt_ids = torch::tensor(prompt);
  window.narrow(0, L - n, n).copy_(prompt_ids.narrow(0, prompt_ids.size(0) - n, n).unsqueeze(1));
  std::vector<int64_t> words;
  for (int64_t step = 0; step < n_words; ++step) {
    auto res = model->forward(window, model->init_state(1, torch::kCPU));
    auto logits = model->softmax_->log_prob(std::get<0>(res)[-1]);
    // FACT: lp = torch.log_softmax(torch.randn(1, 9), 1); s = lp.clone(); s.div_(0.7); assert torch.equal(s, lp.div(0.7)) and is_copy_of(s, lp)
    auto scaled = logits.clone(); // EXPECT: tensor-unnecessary-clone -- divided in place right away: logits.div(temperature) is the same tensor in one pass
    scaled.div_(temperature);
    auto word = torch::multinomial(torch::softmax(scaled, -1), 1);
    // FACT: w = torch.arange(6).view(6, 1); assert raises(lambda: w.narrow(0, 0, 5).copy_(w.narrow(0, 1, 5)), "some elements of the input tensor and the written-to tensor refer to a single memory location")
    window.narrow(0, 0, L - 1).copy_(window.narrow(0, 1, L - 1)); // EXPECT: tensor-inplace-overlap -- the shift by one word reads rows it is writing
    // FACT: w = torch.zeros(6, 1, dtype=torch.long); x = torch.multinomial(torch.rand(1, 5), 1); w[5] = x.view(1); assert x.dtype == torch.int64 and w[5, 0] == x[0, 0]
    window[L - 1] = word.view({1}); // LOOKALIKE: tensor-copy-narrowing -- multinomial returns int64 ids, the window's dtype
    words.push_back(word.item<int64_t>()); // LOOKALIKE: tensor-sync-in-loop -- the sampled id is the output, on the CPU
  }
  return words;
}

void train_lm(const torch::Tensor &train_ids, const torch::Tensor &valid_ids, const LMConfig &cfg, const std::string &ckpt) {
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  WordLM model(cfg);
  model->to(device);
  auto train_data = batchify(train_ids, cfg.batch_size).to(device);
  auto valid_data = batchify(valid_ids, cfg.eval_batch_size);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  double best = 1e30;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    train_epoch(model, train_data, opt, cfg, device, epoch);
    auto ev = evaluate(model, valid_data, cfg);
    std::cout << "epoch " << epoch << " valid ppl " << ev.ppl << " (head " << ev.bucket_ppl[0] << ", rarest "
              << ev.bucket_ppl.back() << ")\n";
    if (ev.ppl < best) {
      best = ev.ppl;
      torch::save(model, ckpt);
    }
  }
}
