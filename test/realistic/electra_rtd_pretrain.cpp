// ELECTRA replaced-token-detection pretraining.
// A small MLM generator fills the masked positions with sampled tokens; the
// discriminator labels every token as original or replaced. Both share the
// token embeddings; the generator's output layer is tied to them.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

struct ElectraConfig {
  int64_t vocab_size = 30522;
  int64_t embedding_size = 128;
  int64_t gen_hidden = 64;
  int64_t disc_hidden = 256;
  int64_t gen_layers = 2;
  int64_t disc_layers = 4;
  int64_t heads = 4;
  int64_t max_len = 128;
  int64_t pad_id = 0, unk_id = 100, cls_id = 101, sep_id = 102, mask_id = 103;
  double mask_prob = 0.15;
  bool extend_spans = true;
  double temperature = 1.0;
  double disc_weight = 50.0;
  double replace_rate = 0.1;   // expected share of replaced tokens, for the head prior
  double lr = 5e-4;
  int64_t log_every = 100;
};

class SharedEmbeddingsImpl : public torch::nn::Module {
 public:
  explicit SharedEmbeddingsImpl(const ElectraConfig& cfg)
      : tok(torch::nn::EmbeddingOptions(cfg.vocab_size, cfg.embedding_size).padding_idx(cfg.pad_id)),
        pos(cfg.max_len, cfg.embedding_size),
        norm(torch::nn::LayerNormOptions({cfg.embedding_size})),
        drop(0.1) {
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("norm", norm);
    register_module("drop", drop);
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    auto positions = torch::arange(ids.size(1), ids.options());
    return drop(norm(tok(ids) + pos(positions)));
  }
  torch::nn::Embedding tok, pos;
  torch::nn::LayerNorm norm;
  torch::nn::Dropout drop;
};
TORCH_MODULE(SharedEmbeddings);

class BackboneImpl : public torch::nn::Module {
 public:
  BackboneImpl(int64_t emb, int64_t hidden, int64_t heads, int64_t layers)
      : project(emb, hidden),
        encoder(torch::nn::TransformerEncoderOptions(
            torch::nn::TransformerEncoderLayerOptions(hidden, heads).dim_feedforward(4 * hidden),
            layers)) {
    register_module("project", project);
    register_module("encoder", encoder);
  }
  torch::Tensor forward(const torch::Tensor& emb, const torch::Tensor& pad_mask) {
    auto x = project(emb).transpose(0, 1);
    return encoder->forward(x, /*src_mask=*/{}, pad_mask).transpose(0, 1);
  }
  torch::nn::Linear project;
  torch::nn::TransformerEncoder encoder;
};
TORCH_MODULE(Backbone);

class GeneratorImpl : public torch::nn::Module {
 public:
  explicit GeneratorImpl(const ElectraConfig& cfg)
      : body(cfg.embedding_size, cfg.gen_hidden, cfg.heads / 2, cfg.gen_layers),
        dense(cfg.gen_hidden, cfg.embedding_size),
        norm(torch::nn::LayerNormOptions({cfg.embedding_size})) {
    register_module("body", body);
    register_module("dense", dense);
    register_module("norm", norm);
    out_bias = register_parameter("out_bias", torch::zeros({cfg.vocab_size}));
  }
  // Output layer tied to the shared token embedding.
  torch::Tensor forward(const torch::Tensor& emb, const torch::Tensor& pad_mask,
                        const torch::Tensor& tied_weight) {
    auto h = body(emb, pad_mask);
    h = norm(F::gelu(dense(h)));
    return F::linear(h, tied_weight, out_bias);
  }
  Backbone body;
  torch::nn::Linear dense;
  torch::nn::LayerNorm norm;
  torch::Tensor out_bias;
};
TORCH_MODULE(Generator);

class DiscriminatorImpl : public torch::nn::Module {
 public:
  explicit DiscriminatorImpl(const ElectraConfig& cfg)
      : body(cfg.embedding_size, cfg.disc_hidden, cfg.heads, cfg.disc_layers),
        dense(cfg.disc_hidden, cfg.disc_hidden),
        head(cfg.disc_hidden, 1) {
    register_module("body", body);
    register_module("dense", dense);
    register_module("head", head);
    // Start the head at the prior log-odds of a token being replaced.
    head->bias.fill_(std::log(cfg.replace_rate / (1.0 - cfg.replace_rate)));  // EXPECT: tensor-inplace-on-leaf
  }
  torch::Tensor forward(const torch::Tensor& emb, const torch::Tensor& pad_mask) {
    auto h = body(emb, pad_mask);
    return head(F::gelu(dense(h))).squeeze(-1);
  }
  Backbone body;
  torch::nn::Linear dense, head;
};
TORCH_MODULE(Discriminator);

void init_bert_weights(torch::nn::Module& model, double std) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    auto& p = item.value();
    if (p.dim() == 2 && item.key().find("weight") != std::string::npos) {
      p.normal_(0.0, std);  // LOOKALIKE: tensor-inplace-on-leaf -- initialised under NoGradGuard
    }
  }
}

struct MaskedBatch {
  torch::Tensor masked_ids;
  torch::Tensor mlm_labels;
  torch::Tensor masked;
  torch::Tensor pad_mask;
};

MaskedBatch mask_tokens(const torch::Tensor& input_ids, const ElectraConfig& cfg) {
  const auto L = input_ids.size(1);
  auto special_ids = torch::tensor({cfg.pad_id, cfg.cls_id, cfg.sep_id}, torch::kLong);
  auto is_special = (input_ids.unsqueeze(-1) == special_ids).any(-1);  // EXPECT: tensor-device-mismatch
  auto prob = torch::full(input_ids.sizes(), cfg.mask_prob, input_ids.options().dtype(torch::kFloat));  // LOOKALIKE: tensor-device-mismatch -- takes input_ids' device
  prob.masked_fill_(is_special, 0.0);
  auto masked = torch::bernoulli(prob).to(torch::kBool);
  if (cfg.extend_spans) {
    // Also mask the token that follows each masked one (two-token spans).
    // FACT: m = torch.zeros(2, 8, dtype=torch.bool); m[:, 1] = True; e = m[:, 1:] | m[:, :-1]; m[:, 1:].logical_or_(m[:, :-1]); assert shares_storage(m[:, 1:], m[:, :-1]) and not torch.equal(m[:, 1:], e)
    masked.narrow(1, 1, L - 1).logical_or_(masked.narrow(1, 0, L - 1));  // EXPECT: tensor-inplace-overlap
    masked.logical_and_(is_special.logical_not());
  }
  auto labels = input_ids.clone();  // EXPECT: tensor-unnecessary-clone
  labels.masked_fill_(masked.logical_not(), -100);
  // FACT: a = torch.ones(2, 6, dtype=torch.long); b = a; b.masked_fill_(torch.ones(2, 6, dtype=torch.bool), 103); assert shares_storage(a, b) and int(a[0, 0]) == 103
  auto masked_ids = input_ids;
  masked_ids.masked_fill_(masked, cfg.mask_id);  // EXPECT: tensor-alias-then-mutate
  return {masked_ids, labels, masked, input_ids.eq(cfg.pad_id)};
}

// Gumbel-max sampling from the generator; no gradient flows through the sample.
torch::Tensor sample_replacements(const torch::Tensor& gen_logits, const torch::Tensor& banned,
                                  double temperature) {
  torch::NoGradGuard no_grad;
  auto logits = gen_logits.detach();
  // FACT: x = torch.randn(2, 3, requires_grad=True); y = x * 2; d = y.detach(); d.div_(4.0); assert shares_storage(d, y) and torch.allclose(y, x / 2)
  logits.div_(temperature);  // EXPECT: tensor-inplace-on-detached
  logits = logits.masked_fill(banned, -1e4);
  auto u = torch::rand_like(logits);
  auto gumbel = -torch::log(-torch::log(u + 1e-9) + 1e-9);
  return (logits + gumbel).argmax(-1);
}

struct TokenShard {
  torch::Tensor tokens;  // stored as int32 to halve the shard size
  int64_t cursor = 0;
  torch::Tensor next(int64_t batch, const ElectraConfig& cfg) {
    if (cursor + batch > tokens.size(0)) cursor = 0;
    // FACT: s = torch.zeros(4, 6, dtype=torch.int32); ids = s.narrow(0, 0, 2).to(torch.long); ids.masked_fill_(ids.ge(0), 100); assert is_copy_of(ids, s)
    auto ids = tokens.narrow(0, cursor, batch).to(torch::kLong);
    ids.masked_fill_(ids.ge(cfg.vocab_size), cfg.unk_id);  // LOOKALIKE: tensor-alias-then-mutate -- the int32 -> int64 conversion made a copy
    cursor += batch;
    return ids;
  }
};

void train(const ElectraConfig& cfg, TokenShard& shard, torch::Device device, int64_t steps,
           int64_t batch_size) {
  SharedEmbeddings embeddings(cfg);
  Generator generator(cfg);
  Discriminator discriminator(cfg);
  init_bert_weights(*embeddings, 0.02);
  init_bert_weights(*generator, 0.02);
  init_bert_weights(*discriminator, 0.02);
  embeddings->to(device);
  generator->to(device);
  discriminator->to(device);

  std::vector<torch::Tensor> params = embeddings->parameters();
  for (auto& p : generator->parameters()) params.push_back(p);
  for (auto& p : discriminator->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.01));

  // Never sample special tokens as replacements.
  auto banned_vocab = torch::zeros({cfg.vocab_size}, torch::kBool);
  for (auto id : {cfg.pad_id, cfg.cls_id, cfg.sep_id, cfg.mask_id}) banned_vocab[id] = true;

  torch::Tensor epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor gen_loss_sum = torch::zeros({}, torch::TensorOptions().device(device));
  torch::Tensor gen_masked = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
  int64_t gen_correct = 0;

  for (int64_t step = 1; step <= steps; ++step) {
    auto input_ids = shard.next(batch_size, cfg).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a fresh batch every step
    auto mb = mask_tokens(input_ids, cfg);

    auto gen_logits = generator(embeddings(mb.masked_ids), mb.pad_mask, embeddings->tok->weight);
    auto banned = banned_vocab.to(device);  // EXPECT: tensor-clone-in-loop
    auto sampled = sample_replacements(gen_logits, banned, cfg.temperature);
    auto disc_ids = torch::where(mb.masked, sampled, input_ids);
    auto is_replaced = disc_ids.ne(input_ids).to(torch::kFloat);
    auto active = mb.pad_mask.logical_not().to(torch::kFloat);

    auto disc_logits = discriminator(embeddings(disc_ids), mb.pad_mask);
    // FACT: h = torch.randn(2, 5, 8, requires_grad=True); w = torch.randn(1, 8, requires_grad=True); o = torch.nn.functional.linear(h, w, torch.zeros(1, requires_grad=True)).squeeze(-1); o.masked_fill_(torch.zeros(2, 5, dtype=torch.bool), 0.0); assert not raises(lambda: o.sum().backward())
    disc_logits.masked_fill_(mb.pad_mask, 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- the linear head saves its inputs, not its output
    auto disc_probs = torch::sigmoid(disc_logits);

    const auto V = gen_logits.size(-1);
    // FACT: h = torch.randn(5, 2, 8).transpose(0, 1); o = torch.nn.functional.linear(h, torch.randn(6, 8)); assert is_contiguous(o) and is_view_of(o.view(-1, 6), o)
    auto mlm_loss = F::cross_entropy(gen_logits.view({-1, V}), mb.mlm_labels.view(-1),  // LOOKALIKE: tensor-view-non-contiguous -- linear output is contiguous
                                     F::CrossEntropyFuncOptions().ignore_index(-100));
    auto disc_loss = F::binary_cross_entropy(
        disc_probs, is_replaced, F::BinaryCrossEntropyFuncOptions().weight(active).reduction(torch::kSum)) /
        active.sum();
    auto loss = mlm_loss + cfg.disc_weight * disc_loss;

    // Discriminator accuracy on real tokens.
    // FACT: z = torch.randn(2, 5, requires_grad=True); t = torch.rand(2, 5).round(); assert backward_fails(lambda: (lambda p: (lambda l: (p.round_(), l.backward()))(torch.nn.functional.binary_cross_entropy(p, t)))(torch.sigmoid(z)))
    auto disc_pred = disc_probs.round_();  // EXPECT: tensor-inplace-on-saved
    auto disc_acc = (disc_pred.eq(is_replaced).to(torch::kFloat) * active).sum() / active.sum();

    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    opt.step();

    {
      torch::NoGradGuard no_grad;
      auto gen_pred = gen_logits.argmax(-1);
      gen_correct += gen_pred.eq(mb.mlm_labels).logical_and(mb.masked).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
      gen_masked += mb.masked.sum();
    }
    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    gen_loss_sum += mlm_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept

    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " loss " << (epoch_loss / step).item<double>()  // LOOKALIKE: tensor-sync-in-loop -- read once per log interval
                << " mlm " << (gen_loss_sum / step).item<double>() << " disc acc " << disc_acc.item<double>()
                << " gen acc " << static_cast<double>(gen_correct) / std::max<int64_t>(gen_masked.item<int64_t>(), 1)
                << std::endl;
    }
  }
  torch::save(discriminator, "electra_discriminator.pt");
}

int main() {
  torch::manual_seed(0);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  ElectraConfig cfg;
  TokenShard shard;
  shard.tokens = torch::randint(104, cfg.vocab_size, {4096, cfg.max_len}, torch::kInt);
  shard.tokens.select(1, 0).fill_(cfg.cls_id);
  shard.tokens.select(1, cfg.max_len - 1).fill_(cfg.sep_id);
  train(cfg, shard, device, 2000, 32);
  return 0;
}
