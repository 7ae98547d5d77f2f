// IRIS-style agent: VQ tokenizer + GPT world model; the actor-critic learns only in imagination.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::None;
using torch::indexing::Slice;

struct Config {
  int64_t img = 64, vocab = 512, z_dim = 256, tokens_per_frame = 16, n_actions = 6;
  int64_t embed = 256, heads = 4, layers = 6, max_blocks = 20;
  int64_t tok_batch = 64, wm_batch = 32, seq_blocks = 20, imag_batch = 64, horizon = 20;
  int64_t tok_steps = 200, wm_steps = 200, ac_steps = 100, epochs = 500;
  double lr = 1e-4, beta = 0.25, dropout = 0.1, gamma = 0.995, lambda = 0.95, entropy_coef = 1e-3;
  std::vector<float> reward_class_weights{1.0f, 0.1f, 1.0f};
};

inline torch::Tensor preprocess(const torch::Tensor& x) { return x.mul(2.0).sub(1.0); }
struct TokenizerImpl : torch::nn::Module {
  struct Out { torch::Tensor z, z_flat, z_q, tokens, recon; };
  explicit TokenizerImpl(const Config& c) {
    using namespace torch::nn;
    auto relu = [] { return ReLU(ReLUOptions().inplace(true)); };
    auto down = [](int64_t i, int64_t o) { return Conv2d(Conv2dOptions(i, o, 4).stride(2).padding(1)); };
    auto up = [](int64_t i, int64_t o) { return ConvTranspose2d(ConvTranspose2dOptions(i, o, 4).stride(2).padding(1)); };
    encoder = register_module("encoder", Sequential(down(3, 64), relu(), down(64, 128), relu(),  // LOOKALIKE: tensor-inplace-on-saved -- conv does not save its output; relu_ saves its own result
                                                    down(128, 256), relu(), down(256, c.z_dim)));
    decoder = register_module("decoder", Sequential(up(c.z_dim, 256), relu(), up(256, 128), relu(),
                                                    up(128, 64), relu(), up(64, 3)));
    codebook = register_module("codebook", Embedding(c.vocab, c.z_dim));
    init::uniform_(codebook->weight, -1.0 / c.vocab, 1.0 / c.vocab);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions write under NoGradGuard
  }

  Out forward(const torch::Tensor& x) {
    auto z = encoder->forward(x);
    const auto B = z.size(0), D = z.size(1), h = z.size(2), w = z.size(3);
    // FACT: z=torch.randn(2,8,4,4); assert is_copy_of(z.permute(0,2,3,1).reshape(-1,8), z)
    auto z_flat = z.permute({0, 2, 3, 1}).reshape({-1, D});  // EXPECT: tensor-reshape-non-contiguous
    auto e = codebook->weight;
    auto dist = z_flat.pow(2).sum(1, true) - 2.0 * z_flat.matmul(e.t()) + e.pow(2).sum(1).unsqueeze(0);
    auto tokens = dist.argmin(1).view({B, h * w});
    // FACT: e=torch.randn(2,16,8); assert is_view_of(e.transpose(1,2).view(2,8,4,4), e)
    auto z_q = codebook->forward(tokens).transpose(1, 2).view({B, D, h, w});  // LOOKALIKE: tensor-view-non-contiguous -- only the token dim is split, which strides can express
    auto recon = decoder->forward(z + (z_q - z).detach());
    return {z, z_flat, z_q, tokens, recon};
  }
  torch::Tensor tokenize(const torch::Tensor& x) { return forward(x).tokens; }
  void reset_dead_codes(const torch::Tensor& z_flat, const torch::Tensor& usage) {
    auto dead = (usage == 0).nonzero().squeeze(1);
    if (dead.numel() == 0) return;
    auto pool = z_flat.detach().clone();  // EXPECT: tensor-unnecessary-clone
    auto pick = torch::randint(pool.size(0), {dead.size(0)}, dead.options());
    codebook->weight.index_copy_(0, dead, pool.index({pick}));  // EXPECT: tensor-inplace-on-leaf
  }

  torch::nn::Sequential encoder{nullptr}, decoder{nullptr};
  torch::nn::Embedding codebook{nullptr};
};
TORCH_MODULE(Tokenizer);

struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(const Config& c, int64_t max_tokens) : n_head(c.heads), p(c.dropout) {
    qkv = register_module("qkv", torch::nn::Linear(c.embed, 3 * c.embed));
    proj = register_module("proj", torch::nn::Linear(c.embed, c.embed));
    mask = register_buffer("mask", torch::ones({max_tokens, max_tokens}, torch::kBool).tril());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2), Dh = C / n_head;
    auto parts = qkv->forward(x).chunk(3, -1);
    // FACT: x=torch.randn(2,5,24); q=x.chunk(3,-1)[0]; assert not is_contiguous(q) and is_view_of(q.view(2,5,2,4), x)
    auto q = parts[0].view({B, T, n_head, Dh}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- the chunk only narrows the last dim, and view splits it
    auto k = parts[1].view({B, T, n_head, Dh}).transpose(1, 2), v = parts[2].view({B, T, n_head, Dh}).transpose(1, 2);
    auto att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(Dh)));
    att.masked_fill_(mask.index({Slice(0, T), Slice(0, T)}).logical_not(), -std::numeric_limits<float>::infinity());  // LOOKALIKE: tensor-inplace-on-saved -- multiplying by a plain double saves no tensor, and softmax runs after the fill
    att = torch::softmax(att, -1);
    // FACT: s=torch.randn(2,2,5,5,requires_grad=True); a=torch.softmax(s,-1); torch.nn.functional.dropout(a,0.1,True,inplace=True); assert backward_fails(lambda: a.sum().backward())
    att = F::dropout(att, F::DropoutFuncOptions().p(p).training(is_training()).inplace(true));  // EXPECT: tensor-inplace-on-saved
    auto y = att.matmul(v);
    // FACT: y=torch.randn(2,4,3,8); assert raises(lambda: y.transpose(1,2).view(2,3,32), "view size is not compatible")
    y = y.transpose(1, 2).view({B, T, C});  // EXPECT: tensor-view-non-contiguous
    return F::dropout(proj->forward(y), F::DropoutFuncOptions().p(p).training(is_training()));
  }
  int64_t n_head;
  double p;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor mask;
};
TORCH_MODULE(CausalSelfAttention);

struct BlockImpl : torch::nn::Module {
  BlockImpl(const Config& c, int64_t max_tokens) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    attn = register_module("attn", CausalSelfAttention(c, max_tokens));
    mlp = register_module("mlp", torch::nn::Sequential(
        torch::nn::Linear(c.embed, 4 * c.embed), torch::nn::GELU(),
        torch::nn::Linear(4 * c.embed, c.embed), torch::nn::Dropout(c.dropout)));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln1(x));
    return x + mlp->forward(ln2(x));
  }
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::Sequential mlp{nullptr};
};
TORCH_MODULE(Block);

struct WorldModelImpl : torch::nn::Module {
  struct Out { torch::Tensor obs_logits, reward_logits, end_logits; };
  explicit WorldModelImpl(const Config& c) : max_tokens(c.max_blocks * (c.tokens_per_frame + 1)) {
    tok_emb = register_module("tok_emb", torch::nn::Embedding(c.vocab + c.n_actions, c.embed));
    pos_emb = register_module("pos_emb", torch::nn::Embedding(max_tokens, c.embed));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c, max_tokens));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.embed})));
    head_obs = register_module("head_obs", torch::nn::Linear(c.embed, c.vocab));
    head_reward = register_module("head_reward", torch::nn::Linear(c.embed, 3));
    head_end = register_module("head_end", torch::nn::Linear(c.embed, 2));
  }
  Out forward(const torch::Tensor& tokens) {
    const auto T = tokens.size(1);
    auto x = tok_emb(tokens) + pos_emb(torch::arange(T));  // EXPECT: tensor-device-mismatch
    for (const auto& blk : *blocks) x = blk->as<Block>()->forward(x);
    x = ln_f(x);
    return {head_obs(x), head_reward(x), head_end(x)};
  }
  int64_t max_tokens;
  torch::nn::Embedding tok_emb{nullptr}, pos_emb{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear head_obs{nullptr}, head_reward{nullptr}, head_end{nullptr};
};
TORCH_MODULE(WorldModel);

struct SeqBatch { torch::Tensor frames, actions, rewards, ends; };
class Replay {
 public:
  Replay(const Config& c, torch::Device d, int64_t capacity)
      : capacity_(capacity), device_(d), long_opts_(torch::TensorOptions().dtype(torch::kLong).device(d)),
        frames_(torch::zeros({capacity, 3, c.img, c.img}, torch::TensorOptions().device(d))),
        actions_(torch::zeros({capacity}, long_opts_)),
        rewards_(torch::zeros({capacity}, frames_.options())), ends_(torch::zeros({capacity}, frames_.options())) {}

  // Straight from the emulator: uint8 HWC frames, int64 actions, float rewards.
  void add_episode(const torch::Tensor& frames_u8, const torch::Tensor& actions, const torch::Tensor& rewards) {
    const int64_t n = std::min(frames_u8.size(0), capacity_ - ptr_);
    // FACT: u=torch.randint(0,255,(2,4,4,3),dtype=torch.uint8); f=u.to(torch.float32).permute(0,3,1,2); f.div_(255.0); assert is_copy_of(f,u)
    auto f = frames_u8.narrow(0, 0, n).to(device_, torch::kFloat).permute({0, 3, 1, 2});
    f.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 to float always allocates a new tensor
    frames_.narrow(0, ptr_, n).copy_(f);
    actions_.narrow(0, ptr_, n).copy_(actions.narrow(0, 0, n));
    rewards_.narrow(0, ptr_, n).copy_(rewards.narrow(0, 0, n));
    ends_.narrow(0, ptr_ + n - 1, 1).fill_(1.0);
    ptr_ += n;
    size_ = std::max(size_, ptr_);
    if (ptr_ == capacity_) ptr_ = 0;
  }
  torch::Tensor sample_frames(int64_t B) const { return frames_.index({torch::randint(size_, {B}, long_opts_)}); }
  SeqBatch sample_sequences(int64_t B, int64_t nb) const {
    auto idx = torch::randint(size_ - nb, {B, 1}, long_opts_) + torch::arange(nb, long_opts_);
    return {frames_.index({idx}), actions_.index({idx}), rewards_.index({idx}), ends_.index({idx})};
  }
 private:
  int64_t capacity_, ptr_ = 0, size_ = 0;
  torch::Device device_;
  torch::TensorOptions long_opts_;
  torch::Tensor frames_, actions_, rewards_, ends_;
};

struct Imagined { std::vector<torch::Tensor> log_probs, entropies, values, rewards, ends; torch::Tensor tokens; };
class IrisTrainer {
 public:
  IrisTrainer(const Config& c, torch::Device d, Replay& replay)
      : cfg_(c), device_(d), replay_(replay), tokenizer_(c), world_model_(c),
        reward_weights_(torch::tensor(c.reward_class_weights)) {
    // policy logits and the value share one trunk: the last output is the value.
    actor_critic_ = torch::nn::Sequential(
        torch::nn::Linear(c.tokens_per_frame * c.z_dim, 512), torch::nn::ELU(),
        torch::nn::Linear(512, 512), torch::nn::ELU(), torch::nn::Linear(512, c.n_actions + 1));
    tokenizer_->to(device_);
    world_model_->to(device_);
    actor_critic_->to(device_);
    tok_opt_ = std::make_unique<torch::optim::Adam>(tokenizer_->parameters(), torch::optim::AdamOptions(c.lr));
    wm_opt_ = std::make_unique<torch::optim::AdamW>(world_model_->parameters(), torch::optim::AdamWOptions(c.lr));
    ac_opt_ = std::make_unique<torch::optim::Adam>(actor_critic_->parameters(), torch::optim::AdamOptions(c.lr));
  }
  void train_tokenizer() {
    for (int64_t step = 0; step < cfg_.tok_steps; ++step) {
      auto frames = replay_.sample_frames(cfg_.tok_batch);
      // FACT: f=torch.rand(2,3,4,4); ref=f.clone(); x=f.to('cpu'); x.mul_(2.0).sub_(1.0); assert shares_storage(x,f) and not torch.equal(f,ref)
      auto x = frames.to(device_);
      x.mul_(2.0).sub_(1.0);  // EXPECT: tensor-alias-then-mutate
      auto out = tokenizer_->forward(x);
      auto rec_loss = (out.recon.add(1.0).div(2.0) - frames).abs().mean();
      auto commit = (out.z.detach() - out.z_q).pow(2).mean() + cfg_.beta * (out.z - out.z_q.detach()).pow(2).mean();
      tok_opt_->zero_grad();
      (rec_loss + commit).backward();
      tok_opt_->step();
      if (step % 50 == 0) tokenizer_->reset_dead_codes(out.z_flat, torch::bincount(out.tokens.flatten(), {}, cfg_.vocab));
    }
  }
  void train_world_model() {
    const int64_t K = cfg_.tokens_per_frame, nb = cfg_.seq_blocks;
    for (int64_t step = 0; step < cfg_.wm_steps; ++step) {
      auto batch = replay_.sample_sequences(cfg_.wm_batch, nb);
      const int64_t B = batch.frames.size(0);
      auto obs_tokens = [&] {
        torch::NoGradGuard no_grad;
        return tokenizer_->tokenize(preprocess(batch.frames.flatten(0, 1))).view({B, nb, K});
      }();
      auto seq = torch::cat({obs_tokens, (batch.actions + cfg_.vocab).unsqueeze(-1)}, -1).flatten(1);
      const int64_t L = seq.size(1);
      auto labels = torch::full_like(seq, -100);
      // FACT: t=torch.arange(12).view(2,6); l=torch.full_like(t,-100); l[:,:-1].copy_(t[:,1:]); assert is_copy_of(l,t) and l[0,0]==1
      labels.narrow(1, 0, L - 1).copy_(seq.narrow(1, 1, L - 1));  // LOOKALIKE: tensor-inplace-overlap -- labels and seq are separate buffers
      labels.masked_fill_(labels >= cfg_.vocab, -100);
      auto out = world_model_->forward(seq);
      auto obs_loss = F::cross_entropy(out.obs_logits.flatten(0, 1), labels.flatten(),
                                       F::CrossEntropyFuncOptions().ignore_index(-100));
      // FACT: r=torch.randn(2,3*17,3); s=r[:,16::17]; assert not is_contiguous(s) and is_view_of(s.flatten(0,1), r)
      auto rew_logits = out.reward_logits.index({Slice(), Slice(K, None, K + 1)}).flatten(0, 1);  // LOOKALIKE: tensor-reshape-non-contiguous -- the strided slice still merges batch and blocks as a view
      auto end_logits = out.end_logits.index({Slice(), Slice(K, None, K + 1)}).flatten(0, 1);
      auto weights = reward_weights_.to(device_);  // EXPECT: tensor-clone-in-loop
      auto rew_loss = F::cross_entropy(rew_logits, (batch.rewards.sign() + 1).to(torch::kLong).flatten(),
                                       F::CrossEntropyFuncOptions().weight(weights));
      auto end_loss = F::cross_entropy(end_logits, batch.ends.to(torch::kLong).flatten());
      wm_opt_->zero_grad();
      (obs_loss + rew_loss + end_loss).backward();
      wm_opt_->step();
    }
  }
  Imagined imagine(const torch::Tensor& start_tokens) {
    const int64_t B = start_tokens.size(0), K = cfg_.tokens_per_frame, blk = K + 1, max_tokens = cfg_.max_blocks * blk;
    Imagined traj;
    traj.tokens = torch::zeros({B, cfg_.horizon, K}, torch::TensorOptions().dtype(torch::kShort).device(device_));
    auto ctx = torch::zeros({B, max_tokens}, torch::TensorOptions().dtype(torch::kLong).device(device_));
    ctx.narrow(1, 0, K).copy_(start_tokens);
    int64_t len = K;
    auto obs_tokens = start_tokens;
    for (int64_t h = 0; h < cfg_.horizon; ++h) {
      auto out_ac = actor_critic_->forward(tokenizer_->codebook->forward(obs_tokens).detach().flatten(1));
      auto log_p = torch::log_softmax(out_ac.narrow(1, 0, cfg_.n_actions), -1);
      auto action = torch::multinomial(log_p.exp().detach(), 1);
      traj.log_probs.push_back(log_p.gather(1, action).squeeze(1));  // LOOKALIKE: tensor-graph-kept-across-iterations -- the whole trajectory feeds one loss and one backward
      traj.entropies.push_back(-(log_p.exp() * log_p).sum(-1));
      traj.values.push_back(out_ac.select(1, cfg_.n_actions));
      torch::NoGradGuard no_grad;
      if (len + blk > max_tokens) {
        // FACT: t=torch.arange(12).view(2,6); d=t[:,:-2]; s=t[:,2:]; assert shares_storage(d,s) and s.storage_offset()-d.storage_offset()==2 and not raises(lambda: d.copy_(s))
        ctx.narrow(1, 0, len - blk).copy_(ctx.narrow(1, blk, len - blk));  // EXPECT: tensor-inplace-overlap
        len -= blk;
      }
      ctx.narrow(1, len++, 1).copy_(action + cfg_.vocab);
      auto out = world_model_->forward(ctx.narrow(1, 0, len));
      traj.rewards.push_back(out.reward_logits.select(1, len - 1).argmax(-1).to(torch::kFloat) - 1.0);
      auto done = out.end_logits.select(1, len - 1).argmax(-1);
      traj.ends.push_back(done.to(torch::kFloat));
      for (int64_t k = 0; k < K; ++k) {
        auto next = world_model_->forward(ctx.narrow(1, 0, len)).obs_logits.select(1, len - 1);
        ctx.narrow(1, len++, 1).copy_(torch::multinomial(torch::softmax(next, -1), 1));
      }
      obs_tokens = ctx.narrow(1, len - K, K);
      traj.tokens.select(1, h).copy_(obs_tokens);  // EXPECT: tensor-copy-narrowing
      if (done.all().item<bool>()) break;  // LOOKALIKE: tensor-sync-in-loop -- the value decides whether to keep imagining
    }
    return traj;
  }
  void train_actor_critic() {
    tokenizer_->eval();
    world_model_->eval();
    for (int64_t step = 0; step < cfg_.ac_steps; ++step) {
      auto start = [&] {
        torch::NoGradGuard no_grad;
        return tokenizer_->tokenize(preprocess(replay_.sample_frames(cfg_.imag_batch)));
      }();
      auto traj = imagine(start);
      auto R = torch::stack(traj.rewards), E = torch::stack(traj.ends), V = torch::stack(traj.values);
      const int64_t H = R.size(0);
      std::vector<torch::Tensor> rets(H);
      auto running = V[H - 1].detach();
      for (int64_t t = H - 1; t >= 0; --t) {
        auto v_next = V[std::min(t + 1, H - 1)].detach();
        running = R[t] + cfg_.gamma * (1.0 - E[t]) * ((1.0 - cfg_.lambda) * v_next + cfg_.lambda * running);
        rets[t] = running;
      }
      auto returns = torch::stack(rets);
      auto adv = returns - V.detach();
      auto policy_loss = -(torch::stack(traj.log_probs) * adv).mean() - cfg_.entropy_coef * torch::stack(traj.entropies).mean();
      auto value_loss = (V - returns).pow(2).mean();
      ac_opt_->zero_grad();
      (policy_loss + value_loss).backward();
      ac_opt_->step();
    }
    tokenizer_->train();
    world_model_->train();
  }
  void run() {
    for (int64_t epoch = 0; epoch < cfg_.epochs; ++epoch) {
      train_tokenizer();
      train_world_model();
      train_actor_critic();
      std::cout << "epoch " << epoch << " done" << std::endl;
    }
  }
 private:
  Config cfg_;
  torch::Device device_;
  Replay& replay_;
  Tokenizer tokenizer_;
  WorldModel world_model_;
  torch::nn::Sequential actor_critic_{nullptr};
  torch::Tensor reward_weights_;
  std::unique_ptr<torch::optim::Adam> tok_opt_, ac_opt_;
  std::unique_ptr<torch::optim::AdamW> wm_opt_;
};

