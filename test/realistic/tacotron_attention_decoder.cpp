// Tacotron 2 style text-to-mel model: a conv + BiLSTM text encoder, an autoregressive decoder with
// location-sensitive attention (Chorowski et al. 2015) that emits r mel frames per step, a stop
// token per step and a convolutional postnet. Training uses teacher forcing on padded batches of
// LJSpeech-like utterances; synthesis decodes until every stop token fires.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace nn = torch::nn;

struct TacoConfig {
  int64_t n_symbols = 148, symbols_dim = 512, enc_dim = 512, n_mels = 80, frames_per_step = 2;
  int64_t prenet_dim = 256, attn_rnn_dim = 1024, dec_rnn_dim = 1024, attn_dim = 128;
  int64_t loc_filters = 32, loc_kernel = 31, postnet_dim = 512, postnet_kernel = 5, postnet_layers = 5;
  double p_attn_dropout = 0.1, p_dec_dropout = 0.1, gate_threshold = 0.5;
  int64_t max_decoder_steps = 1000, epochs = 300, batch_size = 32, log_every = 100;
  double lr = 1e-3, weight_decay = 1e-6, grad_clip = 1.0;
};

struct EncoderImpl : nn::Module {
  explicit EncoderImpl(const TacoConfig &c) {
    embedding_ = register_module("embedding", nn::Embedding(c.n_symbols, c.symbols_dim));
    for (int64_t i = 0; i < 3; ++i)
      convs_.push_back(register_module("conv" + std::to_string(i), nn::Sequential(nn::Conv1d(nn::Conv1dOptions(c.symbols_dim, c.symbols_dim, 5).padding(2)), nn::BatchNorm1d(c.symbols_dim))));
    lstm_ = register_module("lstm", nn::LSTM(nn::LSTMOptions(c.symbols_dim, c.enc_dim / 2).batch_first(true).bidirectional(true)));
  }
  // text [B, L] int64 -> memory [B, L, enc_dim]
  torch::Tensor forward(const torch::Tensor &text) {
    auto x = embedding_(text).transpose(1, 2);
    for (auto &conv : convs_)
      x = torch::dropout(torch::relu(conv->forward(x)), 0.5, is_training());
    return std::get<0>(lstm_->forward(x.transpose(1, 2)));
  }
  nn::Embedding embedding_{nullptr};
  std::vector<nn::Sequential> convs_;
  nn::LSTM lstm_{nullptr};
};
TORCH_MODULE(Encoder);

struct PrenetImpl : nn::Module { // dropout stays on at synthesis too, as in the paper
  PrenetImpl(int64_t in, int64_t dim) {
    fc1_ = register_module("fc1", nn::Linear(nn::LinearOptions(in, dim).bias(false)));
    fc2_ = register_module("fc2", nn::Linear(nn::LinearOptions(dim, dim).bias(false)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::dropout(torch::relu(fc1_(x)), 0.5, true);
    return torch::dropout(torch::relu(fc2_(h)), 0.5, true);
  }
  nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Prenet);

struct LocationLayerImpl : nn::Module {
  explicit LocationLayerImpl(const TacoConfig &c) {
    conv_ = register_module("conv", nn::Conv1d(nn::Conv1dOptions(2, c.loc_filters, c.loc_kernel).padding((c.loc_kernel - 1) / 2).bias(false)));
    dense_ = register_module("dense", nn::Linear(nn::LinearOptions(c.loc_filters, c.attn_dim).bias(false)));
  }
  // previous and cumulative weights [B, 2, T_in] -> location features [B, T_in, attn_dim]
  torch::Tensor forward(const torch::Tensor &attn_cat) {
    auto f = conv_(attn_cat);
    const auto B = f.size(0), F = f.size(1), T = f.size(2);
    // FACT: c = torch.nn.Conv1d(2, 4, 3, padding=1)(torch.randn(2, 2, 7)); assert is_copy_of(c.transpose(1, 2).reshape(14, 4), c)
    auto rows = f.transpose(1, 2).reshape({B * T, F}); // EXPECT: tensor-reshape-non-contiguous -- the conv output keeps T innermost: the [B * T, F] rows cannot be a view and are gathered into a new buffer at every decoder step
    // FACT: y = torch.nn.Linear(4, 6)(torch.randn(14, 4)); assert is_view_of(y.view(2, 7, -1), y)
    return dense_(rows).view({B, T, -1}); // LOOKALIKE: tensor-view-non-contiguous -- a Linear's output is contiguous
  }
  nn::Conv1d conv_{nullptr};
  nn::Linear dense_{nullptr};
};
TORCH_MODULE(LocationLayer);

struct AttentionImpl : nn::Module {
  explicit AttentionImpl(const TacoConfig &c) {
    query_ = register_module("query_layer", nn::Linear(nn::LinearOptions(c.attn_rnn_dim, c.attn_dim).bias(false)));
    memory_ = register_module("memory_layer", nn::Linear(nn::LinearOptions(c.enc_dim, c.attn_dim).bias(false)));
    v_ = register_module("v", nn::Linear(nn::LinearOptions(c.attn_dim, 1).bias(false)));
    location_ = register_module("location_layer", LocationLayer(c));
  }
  torch::Tensor process_memory(const torch::Tensor &memory) { return memory_(memory); }

  // query [B, attn_rnn_dim], memory [B, T_in, enc_dim], processed [B, T_in, attn_dim],
  // attn_cat [B, 2, T_in], pad_mask [B, T_in] (true on padding, may be undefined)
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor &query, const torch::Tensor &memory, const torch::Tensor &processed,
                                                   const torch::Tensor &attn_cat, const torch::Tensor &pad_mask) {
    auto pq = query_(query.unsqueeze(1));
    auto energies = v_(torch::tanh(pq + location_(attn_cat) + processed)).squeeze(2);
    // FACT: v = torch.nn.Linear(4, 1, bias=False); q = torch.randn(2, 5, 4, requires_grad=True); e = v(torch.tanh(q)).squeeze(2); m = torch.zeros(2, 5, dtype=torch.bool); m[:, 3:] = True; e.masked_fill_(m, float('-inf')); torch.softmax(e, 1).pow(2).sum().backward(); assert q.grad is not None
    if (pad_mask.defined())
      energies.masked_fill_(pad_mask, -std::numeric_limits<float>::infinity()); // LOOKALIKE: tensor-inplace-on-saved -- a Linear does not save its output, and tanh's result is not written
    auto weights = torch::softmax(energies, 1);
    auto context = torch::bmm(weights.unsqueeze(1), memory).squeeze(1);
    return {context, weights};
  }
  nn::Linear query_{nullptr}, memory_{nullptr}, v_{nullptr};
  LocationLayer location_{nullptr};
};
TORCH_MODULE(Attention);

struct DecoderStep { torch::Tensor mel, gate, weights; };
struct DecoderOutput { torch::Tensor mels, gates, alignments; }; // [B, n_mels, T_out], [B, steps], [B, steps, T_in]

struct DecoderImpl : nn::Module {
  explicit DecoderImpl(const TacoConfig &c) : cfg_(c) {
    prenet_ = register_module("prenet", Prenet(c.n_mels * c.frames_per_step, c.prenet_dim));
    attn_rnn_ = register_module("attention_rnn", nn::LSTMCell(c.prenet_dim + c.enc_dim, c.attn_rnn_dim));
    attention_ = register_module("attention_layer", Attention(c));
    dec_rnn_ = register_module("decoder_rnn", nn::LSTMCell(c.attn_rnn_dim + c.enc_dim, c.dec_rnn_dim));
    proj_ = register_module("linear_projection", nn::Linear(c.dec_rnn_dim + c.enc_dim, c.n_mels * c.frames_per_step));
    gate_ = register_module("gate_layer", nn::Linear(c.dec_rnn_dim + c.enc_dim, 1));
  }
  void init_states(const torch::Tensor &memory, const torch::Tensor &pad_mask) {
    const auto B = memory.size(0), T = memory.size(1);
    const auto opts = memory.options();
    attn_h_ = torch::zeros({B, cfg_.attn_rnn_dim}, opts), attn_c_ = torch::zeros({B, cfg_.attn_rnn_dim}, opts);
    dec_h_ = torch::zeros({B, cfg_.dec_rnn_dim}, opts), dec_c_ = torch::zeros({B, cfg_.dec_rnn_dim}, opts);
    weights_ = torch::zeros({B, T}, opts), weights_cum_ = torch::zeros({B, T}, opts);
    context_ = torch::zeros({B, cfg_.enc_dim}, opts);
    memory_ = memory, processed_ = attention_->process_memory(memory), mask_ = pad_mask;
  }
  DecoderStep decode(const torch::Tensor &prev_frames) {
    std::tie(attn_h_, attn_c_) = attn_rnn_(torch::cat({prenet_(prev_frames), context_}, -1), std::make_tuple(attn_h_, attn_c_));
    attn_h_ = torch::dropout(attn_h_, cfg_.p_attn_dropout, is_training());
    auto attn_cat = torch::cat({weights_.unsqueeze(1), weights_cum_.unsqueeze(1)}, 1);
    std::tie(context_, weights_) = attention_(attn_h_, memory_, processed_, attn_cat, mask_);
    // FACT: conv = torch.nn.Conv1d(2, 3, 3, padding=1); w = torch.softmax(torch.randn(2, 5, requires_grad=True), 1); cum = torch.zeros(2, 5); y = conv(torch.cat([w.unsqueeze(1), cum.unsqueeze(1)], 1)); cum += w; y.sum().backward(); assert conv.weight.grad is not None
    weights_cum_ += weights_; // LOOKALIKE: tensor-inplace-on-saved -- cat copied the running sum: the location conv saved the concatenation, not this tensor
    std::tie(dec_h_, dec_c_) = dec_rnn_(torch::cat({attn_h_, context_}, -1), std::make_tuple(dec_h_, dec_c_));
    dec_h_ = torch::dropout(dec_h_, cfg_.p_dec_dropout, is_training());
    auto hc = torch::cat({dec_h_, context_}, 1);
    return {proj_(hc), gate_(hc), weights_};
  }

  // Teacher forcing. memory [B, T_in, enc_dim]; targets [B, n_mels, T_out] with T_out a multiple of r.
  DecoderOutput forward(const torch::Tensor &memory, const torch::Tensor &targets, const torch::Tensor &pad_mask) {
    const auto B = targets.size(0), r = cfg_.frames_per_step;
    // FACT: m = torch.randn(2, 80, 12); assert raises(lambda: m.transpose(1, 2).view(2, 6, -1), "view size is not compatible")
    auto groups = targets.transpose(1, 2).view({B, targets.size(2) / r, -1}); // EXPECT: tensor-view-non-contiguous -- after the transpose a frame's mel bins lie T apart: r frames cannot merge into one dim (only r = 1 would be a view)
    auto go = torch::zeros({B, 1, groups.size(2)}, memory.options());
    auto inputs = torch::cat({go, groups.narrow(1, 0, groups.size(1) - 1)}, 1).transpose(0, 1); // [steps, B, n_mels * r]
    init_states(memory, pad_mask);
    std::vector<torch::Tensor> mels, gates, aligns;
    for (int64_t t = 0; t < inputs.size(0); ++t) {
      auto s = decode(inputs[t]);
      mels.push_back(s.mel); // LOOKALIKE: tensor-graph-kept-across-iterations -- the steps of one batch, stacked and returned for the loss to differentiate
      gates.push_back(s.gate), aligns.push_back(s.weights);
    }
    // FACT: s = torch.stack([torch.randn(2, 160) for _ in range(3)], 1); assert is_view_of(s.view(2, -1, 80), s)
    auto mel = torch::stack(mels, 1).view({B, -1, cfg_.n_mels}).transpose(1, 2); // LOOKALIKE: tensor-view-non-contiguous -- stack's result is contiguous; the transpose comes after the view
    return {mel, torch::cat(gates, 1), torch::stack(aligns, 1)};
  }

  // Free running: each step's frames feed the next, until every stop token fires.
  DecoderOutput infer(const torch::Tensor &memory) {
    const auto B = memory.size(0);
    auto frames = torch::zeros({B, cfg_.n_mels * cfg_.frames_per_step}, memory.options());
    init_states(memory, torch::Tensor());
    std::vector<torch::Tensor> mels, gates, aligns;
    for (int64_t t = 0; t < cfg_.max_decoder_steps; ++t) {
      auto s = decode(frames);
      mels.push_back(s.mel), gates.push_back(s.gate), aligns.push_back(s.weights);
      if ((torch::sigmoid(s.gate) > cfg_.gate_threshold).all().item<bool>()) // LOOKALIKE: tensor-sync-in-loop -- the stop tokens decide whether to go on: the host has to know
        break;
      frames = s.mel;
    }
    auto mel = torch::stack(mels, 1).view({B, -1, cfg_.n_mels}).transpose(1, 2);
    return {mel, torch::cat(gates, 1), torch::stack(aligns, 1)};
  }

  TacoConfig cfg_;
  Prenet prenet_{nullptr};
  nn::LSTMCell attn_rnn_{nullptr}, dec_rnn_{nullptr};
  Attention attention_{nullptr};
  nn::Linear proj_{nullptr}, gate_{nullptr};
  torch::Tensor attn_h_, attn_c_, dec_h_, dec_c_, weights_, weights_cum_, context_, memory_, processed_, mask_;
};
TORCH_MODULE(Decoder);

struct PostnetImpl : nn::Module {
  explicit PostnetImpl(const TacoConfig &c) {
    for (int64_t i = 0; i < c.postnet_layers; ++i) {
      const auto in = i == 0 ? c.n_mels : c.postnet_dim;
      const auto out = i + 1 == c.postnet_layers ? c.n_mels : c.postnet_dim;
      layers_.push_back(register_module("conv" + std::to_string(i), nn::Sequential(nn::Conv1d(nn::Conv1dOptions(in, out, c.postnet_kernel).padding((c.postnet_kernel - 1) / 2)), nn::BatchNorm1d(out))));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = layers_[i]->forward(x);
      x = torch::dropout(i + 1 < layers_.size() ? torch::tanh(x) : x, 0.5, is_training());
    }
    return x;
  }
  std::vector<nn::Sequential> layers_;
};
TORCH_MODULE(Postnet);

struct TacotronOutput { torch::Tensor mel, mel_post, gates, alignments; };

torch::Tensor padding_mask(const torch::Tensor &lengths, int64_t max_len) {
  return torch::arange(max_len, lengths.options()).unsqueeze(0) >= lengths.unsqueeze(1); // LOOKALIKE: tensor-device-mismatch -- the positions are made with the lengths' options, on their device
}

struct TacotronImpl : nn::Module {
  explicit TacotronImpl(const TacoConfig &c) {
    encoder_ = register_module("encoder", Encoder(c));
    decoder_ = register_module("decoder", Decoder(c));
    postnet_ = register_module("postnet", Postnet(c));
    const double std_ = std::sqrt(2.0 / (c.n_symbols + c.symbols_dim)), val = std::sqrt(3.0) * std_;
    // FACT: e = torch.nn.Embedding(5, 3); e.weight.data.uniform_(-0.1, 0.1); assert e.weight.is_leaf and e.weight.requires_grad and e.weight.abs().max() <= 0.1
    encoder_->embedding_->weight.data().uniform_(-val, val); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-on-detached -- initialising the table through data() is meant to reach the weight
  }
  TacotronOutput forward(const torch::Tensor &text, const torch::Tensor &text_lengths, const torch::Tensor &mels) {
    auto dec = decoder_(encoder_(text), mels, padding_mask(text_lengths, text.size(1)));
    return {dec.mels, dec.mels + postnet_(dec.mels), dec.gates, dec.alignments};
  }
  TacotronOutput infer(const torch::Tensor &text) {
    auto dec = decoder_->infer(encoder_(text));
    return {dec.mels, dec.mels + postnet_(dec.mels), dec.gates, dec.alignments};
  }
  Encoder encoder_{nullptr}; Decoder decoder_{nullptr}; Postnet postnet_{nullptr};
};
TORCH_MODULE(Tacotron);

struct TacotronLoss { torch::Tensor total, mel, gate; };

// gate_target [B, T_out]: 1 from the last real frame on. One stop token per step of r frames.
TacotronLoss tacotron_loss(const TacotronOutput &out, const torch::Tensor &mel_target, const torch::Tensor &gate_target, const TacoConfig &cfg) {
  const auto r = cfg.frames_per_step;
  auto mel_loss = torch::mse_loss(out.mel, mel_target) + torch::mse_loss(out.mel_post, mel_target);
  auto step_target = gate_target.slice(1, r - 1, c10::nullopt, r);
  auto stop = torch::sigmoid(out.gates);
  // FACT: g = torch.randn(2, 6, requires_grad=True); s = torch.sigmoid(g * 1.0); s.clamp_(1e-6, 1 - 1e-6); l = torch.nn.functional.binary_cross_entropy(s, torch.zeros(2, 6)); assert backward_fails(lambda: l.backward())
  stop.clamp_(1e-6, 1.0 - 1e-6); // EXPECT: tensor-inplace-on-saved -- sigmoid saved its result for backward: the training step's backward raises
  auto gate_loss = torch::binary_cross_entropy(stop, step_target);
  return {mel_loss + gate_loss, mel_loss, gate_loss};
}

struct Utterance { torch::Tensor text, mel; }; // [L] int64 symbol ids, [n_mels, T] linear-magnitude mel filterbank

// Features are extracted once and kept in memory; the log compression happens per item.
struct MelCache : torch::data::datasets::Dataset<MelCache, Utterance> {
  Utterance get(size_t i) override {
    auto mel = mels_[i];
    // FACT: cache = [torch.rand(80, 50)]; c0 = cache[0].clone(); mel = cache[0]; mel.clamp_(min=1e-5).log_(); assert shares_storage(mel, cache[0]) and not torch.equal(cache[0], c0)
    mel.clamp_min_(1e-5).log_(); // EXPECT: tensor-alias-then-mutate -- mel is the cached tensor itself: the second epoch takes the log of a log
    return {texts_[i], mel};
  }
  torch::optional<size_t> size() const override { return texts_.size(); }
  std::vector<torch::Tensor> texts_, mels_;
};

struct Batch { torch::Tensor text, text_lengths, mel, gate; };

Batch collate(const std::vector<Utterance> &items, const TacoConfig &cfg) {
  const auto B = static_cast<int64_t>(items.size()), r = cfg.frames_per_step;
  int64_t max_text = 0, max_frames = 0;
  for (const auto &u : items)
    max_text = std::max(max_text, u.text.size(0)), max_frames = std::max(max_frames, u.mel.size(1));
  max_frames = (max_frames + r - 1) / r * r;
  auto text = torch::zeros({B, max_text}, torch::kLong);
  auto lengths = torch::empty({B}, torch::kLong);
  auto mel = torch::zeros({B, cfg.n_mels, max_frames});
  auto gate = torch::zeros({B, max_frames});
  for (int64_t i = 0; i < B; ++i) {
    const auto L = items[i].text.size(0), T = items[i].mel.size(1);
    text[i].narrow(0, 0, L).copy_(items[i].text); // LOOKALIKE: tensor-copy-narrowing -- symbol ids are int64, like the padded batch
    lengths[i] = L;
    mel[i].narrow(1, 0, T).copy_(items[i].mel);
    gate[i].narrow(0, T - 1, max_frames - T + 1).fill_(1.0);
  }
  return {text, lengths, mel, gate};
}

void train(Tacotron &model, MelCache dataset, const TacoConfig &cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(cfg.weight_decay));
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(std::move(dataset), torch::data::DataLoaderOptions(cfg.batch_size).workers(4));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    double mel_sum = 0; int64_t n_batches = 0;
    auto entropy_sum = torch::zeros({}, device);
    for (auto &items : *loader) {
      auto b = collate(items, cfg);
      auto text = b.text.to(device), lengths = b.text_lengths.to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch each step
      auto mel = b.mel.to(device), gate = b.gate.to(device);
      auto out = model->forward(text, lengths, mel);
      auto loss = tacotron_loss(out, mel, gate, cfg);
      opt.zero_grad();
      loss.total.backward();
      nn::utils::clip_grad_norm_(model->parameters(), cfg.grad_clip);
      opt.step();
      // Alignment sharpness: the entropy drops once the attention has learnt to follow the text.
      auto entropy = -(out.alignments * (out.alignments + 1e-8).log()).sum(-1).mean();
      // FACT: l = torch.nn.Linear(3, 2); s = torch.zeros(()); exec('for _ in range(3):\n a = torch.softmax(l(torch.randn(4, 3)), 1); s = s - (a * a.log()).sum()'); assert s.requires_grad and kept_nodes(s) >= 3 * 4
      entropy_sum = entropy_sum + entropy; // EXPECT: tensor-graph-kept-across-iterations -- each step's graph, with the alignments the entropy ops saved, stays reachable from the epoch's sum
      mel_sum += loss.mel.item<double>(); // EXPECT: tensor-sync-in-loop -- waits for the GPU every step only to add the loss up
      ++n_batches;
      if (++step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << loss.total.item<float>() << " gate " << loss.gate.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " mel " << mel_sum / n_batches << " attention entropy " << entropy_sum.item<double>() / n_batches << "\n";
  }
}

// One sentence to a mel spectrogram for the vocoder (host tensor [n_mels, T]).
torch::Tensor synthesize(Tacotron &model, const std::vector<int64_t> &symbol_ids) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  auto text = torch::tensor(symbol_ids).unsqueeze(0); // [1, L] int64
  auto out = model->infer(text); // EXPECT: tensor-device-mismatch -- the model moved to the GPU, the symbol ids are a host tensor
  return out.mel_post.squeeze(0).cpu();
}
