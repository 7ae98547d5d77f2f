// Sparse autoencoder (dictionary learning) on residual-stream activations cached from a
// transformer: ReLU encoder with a pre-encoder bias, unit-norm decoder rows (renormalised after
// every step, the gradient component parallel to each row removed before it), L1 sparsity, and
// periodic resampling of latents that have not fired for a while. Activations are harvested by a
// separate job into shards of [n_seq, ctx, d_model] and kept on the host in half precision.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

struct SaeConfig {
  int64_t d_in = 768, expansion = 16, ctx = 128, seqs_per_shard = 2048;
  int64_t batch_size = 4096, steps = 30000, norm_samples = 65536;
  int64_t resample_every = 2500, dead_window = 2000, resample_inputs = 16384;
  int64_t log_every = 200, eval_every = 5000;
  double lr = 1e-4, l1_coeff = 5e-4, resample_scale = 0.2;
  std::string out_path = "sae.pt";
};

// All shards but the last are training data; the last one is held out for evaluation.
class ActivationCache {
public:
  ActivationCache(const std::vector<std::string> &shard_paths, const SaeConfig &cfg)
      : rows_per_shard_(cfg.seqs_per_shard * cfg.ctx) {
    const auto n_shards = static_cast<int64_t>(shard_paths.size());
    TORCH_CHECK(n_shards >= 2, "need at least one training shard and one held-out shard");
    acts_ = torch::empty({n_shards * rows_per_shard_, cfg.d_in}, torch::kHalf);
    for (int64_t i = 0; i < n_shards; ++i) {
      torch::Tensor shard;
      torch::load(shard, shard_paths[i]);
      TORCH_CHECK(shard.numel() == rows_per_shard_ * cfg.d_in, "unexpected shard size in ", shard_paths[i]);
      // FACT: c = torch.empty(4, 3, dtype=torch.half); s = torch.randn(2, 3) * 5; c.narrow(0, 0, 2).copy_(s.view(2, 3)); assert torch.allclose(c[:2].float(), s, rtol=1e-3, atol=1e-3)
      acts_.narrow(0, i * rows_per_shard_, rows_per_shard_).copy_(shard.view({-1, cfg.d_in})); // LOOKALIKE: tensor-copy-narrowing -- fp16 is the cache's chosen precision (as a mixed-precision copy); residual values fit its range
    }
    train_rows_ = (n_shards - 1) * rows_per_shard_;
    heldout_ = acts_.narrow(0, train_rows_, rows_per_shard_).to(torch::kFloat).view({-1, cfg.ctx, cfg.d_in});
  }

  // A random batch of training rows, float32 on the host.
  torch::Tensor sample(int64_t n) const {
    auto idx = torch::randint(train_rows_, {n}, torch::kLong);
    return acts_.index_select(0, idx).to(torch::kFloat);
  }

  const torch::Tensor &heldout() const { return heldout_; }

private:
  int64_t rows_per_shard_, train_rows_ = 0;
  torch::Tensor acts_, heldout_;
};

// x -> (x - mean) * scale, so that E||x|| = sqrt(d_in) whatever the layer's activation scale.
struct ActNorm {
  torch::Tensor mean;
  double scale = 1.0;
};

ActNorm estimate_norm(const ActivationCache &cache, int64_t n) {
  auto sample = cache.sample(n);
  auto mean = sample.mean(0);
  // FACT: s = torch.randn(6, 4); m = s.mean(0); c = s.clone(); c.sub_(m); assert torch.equal(c, s - m)
  auto centred = sample.clone(); // EXPECT: tensor-unnecessary-clone -- rewritten by sub_ at once: sample - mean is one pass
  centred.sub_(mean);
  const double avg_norm = centred.norm(2, 1).mean().item<double>();
  return {mean, std::sqrt(static_cast<double>(sample.size(1))) / avg_norm};
}

struct SaeOutput {
  torch::Tensor x_hat; // [B, d_in]
  torch::Tensor f;     // [B, n_latents], post-ReLU
};

struct SparseAutoencoderImpl : torch::nn::Module {
  SparseAutoencoderImpl(int64_t d_in, int64_t n_latents) {
    W_enc_ = register_parameter("W_enc", torch::empty({d_in, n_latents}));
    b_enc_ = register_parameter("b_enc", torch::zeros({n_latents}));
    W_dec_ = register_parameter("W_dec", torch::empty({n_latents, d_in}));
    b_dec_ = register_parameter("b_dec", torch::zeros({d_in}));
    torch::nn::init::kaiming_uniform_(W_dec_, std::sqrt(5.0)); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    torch::NoGradGuard no_grad;
    W_dec_.div_(W_dec_.norm(2, 1, true)); // LOOKALIKE: tensor-inplace-on-leaf -- under the constructor's NoGradGuard
    // FACT: d = torch.nn.Parameter(torch.randn(5, 3)); e = torch.nn.Parameter(torch.empty(3, 5)); exec('with torch.no_grad(): e.copy_(d.t())'); assert not shares_storage(e, d) and torch.equal(e, d.t())
    W_enc_.copy_(W_dec_.t()); // LOOKALIKE: tensor-inplace-on-leaf, tensor-inplace-overlap -- under NoGradGuard; the transpose is of the other parameter, its own storage
  }

  SaeOutput forward(const torch::Tensor &x) {
    auto f = torch::relu(torch::addmm(b_enc_, x - b_dec_, W_enc_));
    auto x_hat = torch::addmm(b_dec_, f, W_dec_);
    return {x_hat, f};
  }

  // Between backward() and step(): the part of each row's gradient along the row would only
  // change its norm, which normalize_decoder() undoes anyway.
  void remove_parallel_grad() {
    auto w = W_dec_.detach();
    auto g = W_dec_.grad();
    // FACT: w = torch.nn.Parameter(torch.randn(4, 3)); w.sum().backward(); g = w.grad; g.sub_((g * w.detach()).sum(1, keepdim=True) * w.detach()); assert w.is_leaf and not g.requires_grad
    g.sub_((g * w).sum(1, true) * w); // LOOKALIKE: tensor-inplace-on-leaf -- the gradient buffer is written, not the parameter
  }

  // Unit-norm dictionary rows: otherwise the L1 penalty is gamed by shrinking f and growing W_dec.
  void normalize_decoder() {
    auto norms = W_dec_.norm(2, 1, true).clamp_min(1e-8);
    // FACT: w = torch.nn.Parameter(torch.randn(4, 3)); assert raises(lambda: w.div_(w.norm(2, 1, True).clamp_min(1e-8)), "a leaf Variable that requires grad")
    W_dec_.div_(norms); // EXPECT: tensor-inplace-on-leaf -- called after opt.step() with grad mode on: W_dec is a leaf that requires grad
  }

  torch::Tensor W_enc_, b_enc_, W_dec_, b_dec_;
};
TORCH_MODULE(SparseAutoencoder);

// Resampling as in "Towards Monosemanticity" (2023): each dead latent gets the direction of an
// input the SAE reconstructs badly, drawn with probability proportional to its squared error; the
// encoder column is scaled to a fraction of the alive columns' mean norm; Adam's moments of the
// rewritten rows are cleared.
void resample_dead(SparseAutoencoder &sae, torch::optim::Adam &opt, const torch::Tensor &dead,
                   const torch::Tensor &inputs, const SaeConfig &cfg) {
  torch::NoGradGuard no_grad;
  auto out = sae->forward(inputs);
  auto err = (out.x_hat - inputs).pow(2).sum(-1);
  auto picked = torch::multinomial(err, dead.size(0), /*replacement=*/true);
  auto dirs = inputs.index_select(0, picked) - sae->b_dec_;
  // FACT: i = torch.randn(6, 4); b = torch.randn(4); d = i.index_select(0, torch.tensor([1, 3])) - b; d.div_(d.norm(2, 1, keepdim=True)); assert is_copy_of(d, i) and is_copy_of(d, b)
  dirs.div_(dirs.norm(2, 1, true).clamp_min(1e-8)); // LOOKALIKE: tensor-alias-then-mutate -- dirs is the fresh result of the subtraction
  auto alive = torch::ones_like(sae->b_enc_, torch::kBool).index_fill_(0, dead, false);
  auto enc_norm = sae->W_enc_.norm(2, 0).masked_select(alive).mean();

  // FACT: w = torch.randn(5, 3); s = w.clone(); w.index_copy_(0, torch.tensor([1]), torch.ones(1, 3)); assert not torch.equal(s, w)
  auto w_dec_before = sae->W_dec_.clone(); // LOOKALIKE: tensor-unnecessary-clone -- a snapshot: W_dec is rewritten below and compared with it
  sae->W_dec_.index_copy_(0, dead, dirs); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  sae->W_enc_.index_copy_(1, dead, (dirs * enc_norm * cfg.resample_scale).t());
  sae->b_enc_.index_fill_(0, dead, 0.0);

  auto clear_moments = [&](const torch::Tensor &p, int64_t dim) {
    auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it == opt.state().end())
      return;
    auto &st = static_cast<torch::optim::AdamParamState &>(*it->second);
    st.exp_avg().index_fill_(dim, dead, 0.0);
    st.exp_avg_sq().index_fill_(dim, dead, 0.0);
  };
  clear_moments(sae->W_dec_, 0);
  clear_moments(sae->W_enc_, 1);
  clear_moments(sae->b_enc_, 0);

  auto moved = (sae->W_dec_ - w_dec_before).norm(2, 1).index_select(0, dead).mean();
  std::cout << "resampled " << dead.size(0) << " latents, mean |dW_dec| " << moved.item<float>() << "\n";
}

struct EvalStats {
  double fvu = 0, l0 = 0;
};

// Fraction of variance unexplained and mean L0 on the held-out sequences [n_seq, ctx, d_in].
EvalStats evaluate(SparseAutoencoder &sae, const torch::Tensor &heldout, const ActNorm &norm, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto x = heldout.reshape({-1, heldout.size(-1)});
  // FACT: h = torch.randn(3, 4, 5); h0 = h.clone(); x = h.reshape(-1, h.size(-1)); x.sub_(torch.ones(5)).mul_(2.0); assert shares_storage(x, h) and not torch.equal(h, h0)
  x.sub_(norm.mean).mul_(norm.scale); // EXPECT: tensor-alias-then-mutate -- reshape of the contiguous held-out set is a view: the cache's copy is normalised again at every evaluation
  auto xd = x.to(device);
  auto out = sae->forward(xd);
  auto resid = (out.x_hat - xd).pow(2).sum();
  auto total = (xd - xd.mean(0)).pow(2).sum();
  EvalStats s;
  s.fvu = (resid / total).item<double>();
  s.l0 = (out.f > 0).sum(-1).to(torch::kFloat).mean().item<double>();
  return s;
}

// Log10 firing densities, one bin per decade from 1e-10 to 1, for the dashboard.
torch::Tensor density_histogram(const torch::Tensor &fire_count, int64_t tokens) {
  auto density = fire_count.to(torch::kDouble).cpu() / static_cast<double>(tokens);
  auto decade = torch::empty({density.size(0)}, torch::kLong);
  // FACT: d = torch.empty(2, dtype=torch.long); d.copy_(torch.log10(torch.tensor([2e-4, 0.5], dtype=torch.double))); assert d.tolist() == [-3, 0] and torch.floor(torch.log10(torch.tensor(2e-4))).item() == -4
  decade.copy_(torch::log10(density + 1e-10)); // EXPECT: tensor-copy-narrowing -- float64 into int64 truncates toward zero: a density of 2e-4 lands in bin -3, not -4
  return torch::bincount(decade.neg(), {}, 11);
}

void train_sae(SparseAutoencoder &sae, const ActivationCache &cache, const SaeConfig &cfg) {
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  const ActNorm norm = estimate_norm(cache, cfg.norm_samples);
  sae->to(device);
  torch::optim::Adam opt(sae->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.9, 0.999}));

  const auto n_latents = sae->b_enc_.size(0);
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  auto since_fired = torch::zeros({n_latents}, long_opts);
  auto fire_count = torch::zeros({n_latents}, long_opts);
  auto act_sum = torch::zeros({n_latents}, torch::TensorOptions().device(device));
  double l0_sum = 0.0;
  int64_t tokens_seen = 0;

  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto x = cache.sample(cfg.batch_size).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
    auto mu = norm.mean.to(device); // EXPECT: tensor-clone-in-loop -- the same host mean is uploaded at every step
    x = (x - mu) * norm.scale;

    auto out = sae->forward(x);
    auto recon = (out.x_hat - x).pow(2).sum(-1).mean();
    auto sparsity = out.f.sum(-1).mean(); // f >= 0 and the decoder rows have unit norm
    auto loss = recon + cfg.l1_coeff * sparsity;

    auto active = out.f > 0;
    // FACT: a = torch.zeros(3, dtype=torch.long); l = torch.nn.Linear(2, 3); a += (l(torch.randn(4, 2)) > 0).sum(0); assert not a.requires_grad and a.grad_fn is None
    fire_count += active.sum(0); // LOOKALIKE: tensor-graph-kept-across-iterations -- a count of a comparison carries no graph
    // FACT: a = torch.zeros(3); l = torch.nn.Linear(2, 3); exec('for _ in range(4): a += torch.relu(l(torch.randn(5, 2))).sum(0)'); assert a.requires_grad and kept_nodes(a) >= 4 * 3
    act_sum += out.f.sum(0); // EXPECT: tensor-graph-kept-across-iterations -- f requires grad: act_sum chains every step's graph
    since_fired.add_(1).masked_fill_(active.any(0), 0);
    l0_sum += active.sum(-1).to(torch::kFloat).mean().item<double>(); // EXPECT: tensor-sync-in-loop -- the running L0 waits for the GPU at every step
    tokens_seen += x.size(0);

    opt.zero_grad();
    loss.backward();
    sae->remove_parallel_grad();
    opt.step();
    sae->normalize_decoder();

    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << loss.item<float>() << " mse " << recon.item<float>() // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
                << " L0 " << l0_sum / step << "\n";

    if (step % cfg.resample_every == 0) {
      auto dead = (since_fired >= cfg.dead_window).nonzero().squeeze(1);
      if (dead.numel() > 0) {
        auto inputs = (cache.sample(cfg.resample_inputs).to(device) - mu) * norm.scale;
        resample_dead(sae, opt, dead, inputs, cfg);
        since_fired.index_fill_(0, dead, 0);
      }
    }
    if (step % cfg.eval_every == 0) {
      const auto ev = evaluate(sae, cache.heldout(), norm, device);
      std::cout << "eval step " << step << " FVU " << ev.fvu << " L0 " << ev.l0 << "\n";
    }
  }

  auto mean_act = act_sum / static_cast<double>(tokens_seen);
  std::cout << "dead latents " << (fire_count == 0).sum().item<int64_t>() << " of " << n_latents // LOOKALIKE: tensor-sync-in-loop -- once, after the loop
            << ", mean activation " << mean_act.mean().item<double>() << "\n";
  auto hist = density_histogram(fire_count, tokens_seen);
  for (int64_t b = 0; b < hist.size(0); ++b)
    std::cout << "  1e-" << b << ": " << hist[b].item<int64_t>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- the histogram is a host tensor: nothing to wait for
}

int main(int argc, char **argv) {
  SaeConfig cfg;
  std::vector<std::string> shards;
  for (int i = 1; i < argc; ++i)
    shards.emplace_back(argv[i]);
  ActivationCache cache(shards, cfg);
  SparseAutoencoder sae(cfg.d_in, cfg.d_in * cfg.expansion);
  train_sae(sae, cache, cfg);
  torch::save(sae, cfg.out_path);
  return 0;
}
