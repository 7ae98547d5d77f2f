// SoundStream-style neural audio codec: strided-conv encoder, residual vector
// quantiser with EMA codebooks, mirrored decoder, trained adversarially against
// a multi-scale complex-STFT discriminator plus a multi-resolution spectral loss.
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <tuple>
#include <vector>

namespace codec {

struct Config {
  int64_t channels = 32;
  std::vector<int64_t> strides{2, 4, 5, 8};
  int64_t latent_dim = 128, n_quantizers = 8, codebook_size = 1024;
  std::vector<int64_t> disc_ffts{2048, 1024, 512};
  std::vector<int64_t> loss_ffts{64, 128, 256, 512, 1024, 2048};
  double w_adv = 1.0, w_feat = 100.0, w_rec = 1.0, w_commit = 1.0;
  double ema_decay = 0.99, preemph = 0.86, lr = 1e-4;
  int64_t batch = 8, segment = 9600;
  int64_t steps = 2000, log_every = 100;
  torch::Device device = torch::kCPU;
};

using DiscOutputs = std::vector<std::vector<torch::Tensor>>;

struct EncoderImpl : torch::nn::Module {
  explicit EncoderImpl(const Config& cfg) {
    int64_t ch = cfg.channels;
    net->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(1, ch, 7).padding(3)));
    for (auto s : cfg.strides) {
      net->push_back(torch::nn::ELU());
      net->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, 2 * ch, 2 * s).stride(s).padding((s + 1) / 2)));
      ch *= 2;
    }
    net->push_back(torch::nn::ELU());
    net->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, cfg.latent_dim, 3).padding(1)));
    register_module("net", net);
  }
  torch::Tensor forward(const torch::Tensor& wav) { return net->forward(wav); }
  torch::nn::Sequential net;
};
TORCH_MODULE(Encoder);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const Config& cfg) {
    int64_t ch = cfg.channels << cfg.strides.size();
    net->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(cfg.latent_dim, ch, 7).padding(3)));
    for (auto it = cfg.strides.rbegin(); it != cfg.strides.rend(); ++it) {
      const auto s = *it;
      net->push_back(torch::nn::ELU());
      net->push_back(torch::nn::ConvTranspose1d(
          torch::nn::ConvTranspose1dOptions(ch, ch / 2, 2 * s).stride(s).padding((s + 1) / 2).output_padding(s % 2)));
      ch /= 2;
    }
    net->push_back(torch::nn::ELU());
    net->push_back(torch::nn::Conv1d(torch::nn::Conv1dOptions(ch, 1, 7).padding(3)));
    register_module("net", net);
  }
  torch::Tensor forward(const torch::Tensor& z) { return torch::tanh(net->forward(z)); }
  torch::nn::Sequential net;
};
TORCH_MODULE(Decoder);

struct VectorQuantizerImpl : torch::nn::Module {
  VectorQuantizerImpl(int64_t size, int64_t dim, double decay) : decay_(decay) {
    embed = register_buffer("embed", torch::randn({size, dim}));
    cluster_size = register_buffer("cluster_size", torch::ones({size}));
    embed_sum = register_buffer("embed_sum", embed.clone());  // LOOKALIKE: tensor-unnecessary-clone -- the EMA accumulator is updated in place and needs its own storage
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    auto dist = x.pow(2).sum(1, true) - 2 * x.matmul(embed.t()) + embed.pow(2).sum(1).unsqueeze(0);
    auto codes = dist.argmin(1);
    auto q = embed.index_select(0, codes);
    if (is_training()) {
      torch::NoGradGuard no_grad;
      auto onehot = torch::one_hot(codes, embed.size(0)).to(x.scalar_type());
      cluster_size.mul_(decay_).add_(onehot.sum(0), 1.0 - decay_);  // LOOKALIKE: tensor-inplace-on-leaf -- a buffer without grad, updated under NoGradGuard
      embed_sum.mul_(decay_).add_(onehot.t().matmul(x), 1.0 - decay_);
      const auto n = cluster_size.sum();
      auto smoothed = (cluster_size + 1e-5) / (n + embed.size(0) * 1e-5) * n;
      // FACT: x=torch.randn(6,4,requires_grad=True); e=torch.randn(5,4); d=x.pow(2).sum(1,keepdim=True)-2*x.matmul(e.t()); q=e.index_select(0,d.argmin(1)); e.mul_(0.9); l=(x+(q-x).detach()).sum()+(x-q).pow(2).mean(); assert not backward_fails(lambda: l.backward())
      embed.copy_(embed_sum / smoothed.unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-saved -- the distance graph ends at argmin, backward never reaches the saved codebook
    }
    return {q, codes};
  }
  double decay_;
  torch::Tensor embed, cluster_size, embed_sum;
};
TORCH_MODULE(VectorQuantizer);

struct RVQOutput { torch::Tensor quantized, codes, commit_loss; };

struct ResidualVQImpl : torch::nn::Module {
  explicit ResidualVQImpl(const Config& cfg) {
    for (int64_t i = 0; i < cfg.n_quantizers; ++i)
      stages->push_back(VectorQuantizer(cfg.codebook_size, cfg.latent_dim, cfg.ema_decay));
    register_module("stages", stages);
  }
  RVQOutput forward(const torch::Tensor& z, int64_t n_q) {
    const auto B = z.size(0), D = z.size(1), T = z.size(2);
    // FACT: z=torch.randn(2,128,30); assert is_copy_of(z.transpose(1,2).reshape(-1,128), z)
    auto flat = z.transpose(1, 2).reshape({-1, D});  // EXPECT: tensor-reshape-non-contiguous
    auto residual = flat;
    auto quantized = torch::zeros_like(flat);
    std::vector<torch::Tensor> codes;
    for (int64_t i = 0; i < n_q; ++i) {
      auto [q, c] = stages[i]->as<VectorQuantizerImpl>()->forward(residual);
      quantized = quantized + q;
      // FACT: f=torch.randn(60,128); r=f; r.sub_(torch.randn(60,128)); assert shares_storage(r,f) and torch.equal(r,f)
      residual.sub_(q);  // EXPECT: tensor-alias-then-mutate
      codes.push_back(c);
    }
    auto commit = (flat - quantized).pow(2).mean();
    auto st = flat + (quantized - flat).detach();
    // FACT: f=torch.randn(60,128,requires_grad=True); st=f+(torch.randn(60,128)-f).detach(); assert is_contiguous(st) and is_view_of(st.view(2,30,128), st)
    auto out = st.view({B, T, D}).transpose(1, 2);  // LOOKALIKE: tensor-view-non-contiguous -- the straight-through sum is a fresh contiguous tensor
    return {out, torch::stack(codes, 1).view({B, T, n_q}), commit};
  }
  torch::nn::ModuleList stages;
};
TORCH_MODULE(ResidualVQ);

struct SoundStreamImpl : torch::nn::Module {
  explicit SoundStreamImpl(const Config& cfg)
      : encoder(register_module("encoder", Encoder(cfg))),
        rvq(register_module("rvq", ResidualVQ(cfg))),
        decoder(register_module("decoder", Decoder(cfg))) {}
  Encoder encoder;
  ResidualVQ rvq;
  Decoder decoder;
};
TORCH_MODULE(SoundStream);

struct STFTDiscriminatorImpl : torch::nn::Module {
  STFTDiscriminatorImpl(int64_t n_fft, int64_t ch) : n_fft_(n_fft) {
    window = register_buffer("window", torch::hann_window(n_fft));
    convs->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(2, ch, {3, 9}).padding({1, 4})));
    for (int i = 0; i < 3; ++i)
      convs->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, {3, 9}).stride({1, 2}).padding({1, 4})));
    convs->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, {3, 3}).padding({1, 1})));
    register_module("convs", convs);
    post = register_module("post", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, 1, {3, 3}).padding({1, 1})));
  }
  // Every layer's feature map, logits last.
  std::vector<torch::Tensor> forward(const torch::Tensor& wav) {
    auto spec = torch::stft(wav.squeeze(1), n_fft_, n_fft_ / 4, n_fft_, window, true, "reflect", false, true, true);  // LOOKALIKE: tensor-device-mismatch -- the window is a registered buffer and follows the module to the GPU
    auto h = torch::view_as_real(spec).permute({0, 3, 2, 1});
    std::vector<torch::Tensor> fmaps;
    for (const auto& m : *convs) {
      h = m->as<torch::nn::Conv2dImpl>()->forward(h);
      // FACT: x=torch.randn(1,2,8,9,requires_grad=True); h=torch.nn.Conv2d(2,3,3)(x); torch.nn.functional.leaky_relu_(h,0.2); assert not backward_fails(lambda: torch.nn.Conv2d(3,1,3)(h).sum().backward())
      torch::leaky_relu_(h, 0.2);  // LOOKALIKE: tensor-inplace-on-saved -- conv2d saves its input, not its output
      fmaps.push_back(h);
    }
    fmaps.push_back(post(h));
    return fmaps;
  }
  int64_t n_fft_;
  torch::Tensor window;
  torch::nn::ModuleList convs;
  torch::nn::Conv2d post{nullptr};
};
TORCH_MODULE(STFTDiscriminator);

struct MultiScaleDiscriminatorImpl : torch::nn::Module {
  explicit MultiScaleDiscriminatorImpl(const Config& cfg) {
    for (auto n : cfg.disc_ffts) discs->push_back(STFTDiscriminator(n, 32));
    register_module("discs", discs);
  }
  DiscOutputs forward(const torch::Tensor& wav) {
    DiscOutputs outs;
    for (const auto& d : *discs) outs.push_back(d->as<STFTDiscriminatorImpl>()->forward(wav));
    return outs;
  }
  torch::nn::ModuleList discs;
};
TORCH_MODULE(MultiScaleDiscriminator);

torch::Tensor stft_magnitude(const torch::Tensor& wav, int64_t n_fft, const torch::Tensor& window) {
  auto spec = torch::stft(wav, n_fft, n_fft / 4, n_fft, window, true, "reflect", false, true, true);  // EXPECT: tensor-device-mismatch
  return torch::sqrt(torch::view_as_real(spec).pow(2).sum(-1) + 1e-7);
}

// Multi-resolution spectral loss: spectral convergence plus log-magnitude L1.
struct SpectralLoss {
  explicit SpectralLoss(std::vector<int64_t> ffts) : ffts_(std::move(ffts)) {
    for (auto n : ffts_) windows_.push_back(torch::hann_window(n));
  }
  torch::Tensor operator()(const torch::Tensor& fake, const torch::Tensor& real) const {
    auto loss = torch::zeros({}, fake.options());
    for (size_t i = 0; i < ffts_.size(); ++i) {
      auto sx = stft_magnitude(fake.squeeze(1), ffts_[i], windows_[i]);
      auto sy = stft_magnitude(real.squeeze(1), ffts_[i], windows_[i]);
      const auto B = sx.size(0);
      // FACT: w=torch.randn(2,9600); m=torch.sqrt(torch.view_as_real(torch.stft(w,256,64,256,torch.hann_window(256),return_complex=True)).pow(2).sum(-1)+1e-7); assert is_contiguous(m) and is_view_of(m.view(2,-1), m)
      auto sc = (sy - sx).view({B, -1}).norm(2, 1) / sy.view({B, -1}).norm(2, 1).clamp_min(1e-7);  // LOOKALIKE: tensor-view-non-contiguous -- summing out the re/im axis leaves contiguous magnitudes although the STFT itself is transposed
      // FACT: w=torch.randn(2,9600,requires_grad=True); m=torch.sqrt(torch.view_as_real(torch.stft(w,256,64,256,torch.hann_window(256),return_complex=True)).pow(2).sum(-1)+1e-7); sc=(1-m).norm(); m.add_(1e-5); assert backward_fails(lambda: (sc+m.log().mean()).backward())
      auto log_x = sx.add_(1e-5).log();  // EXPECT: tensor-inplace-on-saved
      auto log_y = sy.add_(1e-5).log();  // LOOKALIKE: tensor-inplace-on-saved -- the reference audio carries no graph
      loss = loss + sc.mean() + (log_x - log_y).abs().mean();
    }
    return loss / static_cast<double>(ffts_.size());
  }
  std::vector<int64_t> ffts_;
  std::vector<torch::Tensor> windows_;
};

// Hinge losses on the last (logit) map of each scale; pass no `real` for the generator side.
torch::Tensor hinge(const DiscOutputs& fake, const DiscOutputs* real = nullptr) {
  auto loss = torch::zeros({}, fake[0].back().options());
  for (size_t k = 0; k < fake.size(); ++k)
    loss = real ? loss + torch::relu(1 - (*real)[k].back()).mean() + torch::relu(1 + fake[k].back()).mean()
                : loss + torch::relu(1 - fake[k].back()).mean();
  return loss / static_cast<double>(fake.size());
}

torch::Tensor feature_matching(const DiscOutputs& real, const DiscOutputs& fake) {
  auto loss = torch::zeros({}, fake[0].back().options());
  for (size_t k = 0; k < real.size(); ++k)
    for (size_t l = 0; l + 1 < real[k].size(); ++l)
      loss = loss + (fake[k][l] - real[k][l]).abs().mean() / (real[k][l].abs().mean() + 1e-5);
  return loss / static_cast<double>(real.size());
}

// The codec works on pre-emphasised audio.
void preemphasize_(torch::Tensor& wav, double coef) {
  const auto L = wav.size(-1);
  // FACT: x=torch.randn(8,1,9600); ref=x[...,1:]-0.86*x[...,:-1]; y=x.clone(); y[...,1:].sub_(y[...,:-1],alpha=0.86); assert shares_storage(y[...,1:],y[...,:-1]) and not torch.allclose(y[...,1:],ref)
  wav.narrow(-1, 1, L - 1).sub_(wav.narrow(-1, 0, L - 1), coef);  // EXPECT: tensor-inplace-overlap
}

// Stand-in for the speech/music corpus: random harmonic tones in noise.
torch::Tensor random_batch(const Config& cfg) {
  auto t = torch::arange(cfg.segment, torch::kFloat).div(24000.0);
  auto f0 = torch::rand({cfg.batch, 1, 1}) * 400 + 80;
  auto wav = 0.4 * torch::sin(2 * 3.14159265 * f0 * t) + 0.2 * torch::sin(6 * 3.14159265 * f0 * t);
  wav = wav + 0.02 * torch::randn({cfg.batch, 1, cfg.segment});
  preemphasize_(wav, cfg.preemph);
  return wav;
}

void pack_codes(const torch::Tensor& codes, torch::Tensor& packet, int64_t codebook_size) {
  TORCH_CHECK(codebook_size <= 32768, "codebook indices do not fit the int16 packet");
  packet.copy_(codes.to(torch::kInt16));  // LOOKALIKE: tensor-copy-narrowing -- range checked above and converted explicitly
}

std::vector<int16_t> to_pcm16(const torch::Tensor& wav) {
  auto pcm = torch::empty({wav.numel()}, torch::kInt16);
  // FACT: p=torch.empty(2,dtype=torch.int16); p.copy_(torch.tensor([0.5,1.2])*32767); assert p[1].item() < 0
  pcm.copy_(wav.detach().flatten().cpu() * 32767.0);  // EXPECT: tensor-copy-narrowing
  return std::vector<int16_t>(pcm.data_ptr<int16_t>(), pcm.data_ptr<int16_t>() + pcm.numel());
}

void train(SoundStream& model, MultiScaleDiscriminator& disc, const Config& cfg) {
  torch::optim::Adam opt_g(model->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.5, 0.9}));
  torch::optim::Adam opt_d(disc->parameters(), torch::optim::AdamOptions(cfg.lr).betas({0.5, 0.9}));
  SpectralLoss spectral(cfg.loss_ffts);
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int64_t> pick_nq(1, cfg.n_quantizers);
  std::uniform_real_distribution<double> pick_gain(0.3, 1.0);
  auto d_running = torch::zeros({}, torch::TensorOptions().device(cfg.device));
  auto g_running = torch::zeros({}, torch::TensorOptions().device(cfg.device));
  for (int64_t step = 1; step <= cfg.steps; ++step) {
    auto real = random_batch(cfg).to(cfg.device);
    auto vq = model->rvq->forward(model->encoder(real), pick_nq(rng));
    auto fake = model->decoder(vq.quantized);
    // Discriminator: real and decoded audio at the same random gain.
    const double gain = pick_gain(rng);
    auto fake_in = fake.detach();
    // FACT: x=torch.randn(2,1,16,requires_grad=True); f=torch.tanh(x*2); l=f.pow(2).mean(); d=f.detach(); d.mul_(0.5); assert backward_fails(lambda: l.backward())
    fake_in.mul_(gain);  // EXPECT: tensor-inplace-on-detached
    auto real_in = real.clone().mul_(gain);  // EXPECT: tensor-unnecessary-clone
    auto d_real_in = disc(real_in);
    auto d_loss = hinge(disc(fake_in), &d_real_in);
    opt_d.zero_grad();
    d_loss.backward();
    opt_d.step();
    d_running += d_loss;  // EXPECT: tensor-graph-kept-across-iterations
    // Generator: adversarial + feature matching + spectral reconstruction + commitment.
    auto d_fake = disc(fake);
    auto d_real = [&] { torch::NoGradGuard no_grad; return disc(real); }();
    auto g_loss = cfg.w_adv * hinge(d_fake) + cfg.w_feat * feature_matching(d_real, d_fake) +
                  cfg.w_rec * spectral(fake, real) + cfg.w_commit * vq.commit_loss;
    opt_g.zero_grad();
    g_loss.backward();
    opt_g.step();
    g_running += g_loss.detach();
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " d " << d_running.item<double>() / cfg.log_every  // LOOKALIKE: tensor-sync-in-loop -- read once per logging interval
                << " g " << g_running.item<double>() / cfg.log_every << "\n";
      d_running.zero_(), g_running.zero_();
    }
  }
}

}  // namespace codec

int main() {
  torch::manual_seed(0);
  codec::Config cfg;
  cfg.steps = 20, cfg.log_every = 5;
  cfg.device = torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  codec::SoundStream model(cfg);
  codec::MultiScaleDiscriminator disc(cfg);
  model->to(cfg.device), disc->to(cfg.device);
  codec::train(model, disc, cfg);
  torch::NoGradGuard no_grad;
  model->eval();
  auto wav = codec::random_batch(cfg).narrow(0, 0, 1).to(cfg.device);
  auto vq = model->rvq->forward(model->encoder(wav), cfg.n_quantizers);
  auto packet = torch::empty(vq.codes.sizes(), torch::kInt16);
  codec::pack_codes(vq.codes.cpu(), packet, cfg.codebook_size);
  auto pcm = codec::to_pcm16(model->decoder(vq.quantized));
  std::cout << packet.numel() * 10 << " bits for " << pcm.size() << " samples\n";
  return 0;
}
