// Arbitrary style transfer in real time with adaptive instance normalisation
// (Huang & Belongie, 2017): frozen VGG-19 encoder up to relu4_1, trainable mirror
// decoder, content loss on the AdaIN target and style loss on feature statistics.
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;

struct StyleConfig {
  int64_t image_size = 256;
  int64_t batch_size = 8;
  int64_t iterations = 160000;
  double lr = 1e-4;
  double lr_decay = 5e-5;
  double content_weight = 1.0, style_weight = 10.0;
  int64_t log_every = 100, preview_every = 1000;
  double alpha = 1.0, temporal_beta = 0.3;
  std::string vgg_path = "vgg_normalised.pt";
  std::string decoder_path = "decoder.pt";
};

std::pair<torch::Tensor, torch::Tensor> calc_mean_std(const torch::Tensor& feat, double eps = 1e-5) {
  const int64_t N = feat.size(0), C = feat.size(1);
  // FACT: f = torch.relu(torch.nn.functional.conv2d(torch.rand(2, 3, 8, 8), torch.rand(4, 3, 3, 3))); assert is_contiguous(f) and f.view(2, 4, -1).shape[-1] == 36
  auto flat = feat.view({N, C, -1});  // LOOKALIKE: tensor-view-non-contiguous -- encoder features come straight out of conv + relu and are contiguous
  return {flat.mean(2).view({N, C, 1, 1}), (flat.var(2) + eps).sqrt().view({N, C, 1, 1})};
}

torch::Tensor adain_with_stats(const torch::Tensor& content_feat, const torch::Tensor& s_mean,
                               const torch::Tensor& s_std) {
  auto c_stats = calc_mean_std(content_feat);
  // FACT: c = torch.rand(2, 3, 4, 4); n = c - c.mean((2, 3), keepdim=True); n.div_(2.0); assert is_copy_of(n, c)
  auto normalized = content_feat - c_stats.first.expand_as(content_feat);
  normalized.div_(c_stats.second.expand_as(content_feat));  // LOOKALIKE: tensor-alias-then-mutate -- the subtraction made a new tensor, content_feat is untouched
  // FACT: n = torch.rand(2, 3, 4, 4); e = torch.rand(2, 3, 1, 1).expand_as(n); assert not raises(lambda: n.mul_(e))
  normalized.mul_(s_std.expand_as(content_feat));  // LOOKALIKE: tensor-inplace-on-expanded -- the expanded std is only read; the written tensor is dense
  return normalized.add_(s_mean.expand_as(content_feat));
}

torch::Tensor adain(const torch::Tensor& content_feat, const torch::Tensor& style_feat) {
  auto s = calc_mean_std(style_feat);
  return adain_with_stats(content_feat, s.first, s.second);
}

static void conv_relu(torch::nn::Sequential& seq, int64_t in, int64_t out) {
  seq->push_back(torch::nn::ReflectionPad2d(1));
  seq->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3)));
  seq->push_back(torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
}

static torch::nn::MaxPool2d pool() { return torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(2).ceil_mode(true)); }

// The "normalised" VGG of the original release: a 1x1 colour conv, then VGG-19 up to relu4_1.
struct VggEncoderImpl : torch::nn::Module {
  torch::nn::Sequential slice1, slice2, slice3, slice4;

  VggEncoderImpl() {
    slice1->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 3, 1)));
    conv_relu(slice1, 3, 64);
    conv_relu(slice2, 64, 64);
    slice2->push_back(pool());
    conv_relu(slice2, 64, 128);
    conv_relu(slice3, 128, 128);
    slice3->push_back(pool());
    conv_relu(slice3, 128, 256);
    for (int i = 0; i < 3; ++i) conv_relu(slice4, 256, 256);
    slice4->push_back(pool());
    conv_relu(slice4, 256, 512);
    register_module("slice1", slice1), register_module("slice2", slice2);
    register_module("slice3", slice3), register_module("slice4", slice4);
  }

  std::vector<torch::Tensor> forward(const torch::Tensor& x) {
    std::vector<torch::Tensor> feats{slice1->forward(x)};
    for (auto* s : {&slice2, &slice3, &slice4}) feats.push_back((*s)->forward(feats.back()));
    return feats;
  }
};
TORCH_MODULE(VggEncoder);

struct ResBlockImpl : torch::nn::Module {
  torch::nn::ReflectionPad2d pad1{1}, pad2{1};
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};

  explicit ResBlockImpl(int64_t ch) {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, 3)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, 3)));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(conv1(pad1(x)));
    h += x;  // EXPECT: tensor-inplace-on-saved
    return conv2(pad2(h));
  }
};
TORCH_MODULE(ResBlock);

struct UpBlockImpl : torch::nn::Module {
  std::vector<torch::nn::Conv2d> convs;
  bool upsample;

  UpBlockImpl(int64_t in, int64_t out, int64_t n_convs, bool up) : upsample(up) {
    for (int64_t i = 0; i < n_convs; ++i) {
      const int64_t cout = (i + 1 == n_convs) ? out : in;
      convs.push_back(register_module("conv" + std::to_string(i),
                                      torch::nn::Conv2d(torch::nn::Conv2dOptions(in, cout, 3))));
    }
  }

  torch::Tensor forward(torch::Tensor x) {
    for (auto& conv : convs) {
      x = conv(F::pad(x, F::PadFuncOptions({1, 1, 1, 1}).mode(torch::kReflect)));
      x.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- conv2d saves its input and weight, not its output
    }
    if (upsample)
      x = F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest));
    return x;
  }
};
TORCH_MODULE(UpBlock);

struct DecoderImpl : torch::nn::Module {
  ResBlock res{nullptr};
  UpBlock up4{nullptr}, up3{nullptr}, up2{nullptr}, up1{nullptr};
  torch::nn::Conv2d out{nullptr};

  DecoderImpl() {
    res = register_module("res", ResBlock(512));
    up4 = register_module("up4", UpBlock(512, 256, 1, true));
    up3 = register_module("up3", UpBlock(256, 128, 4, true));
    up2 = register_module("up2", UpBlock(128, 64, 2, true));
    up1 = register_module("up1", UpBlock(64, 64, 1, false));
    out = register_module("out", torch::nn::Conv2d(torch::nn::Conv2dOptions(64, 3, 3)));
    for (auto& m : modules(/*include_self=*/false)) {
      if (auto* conv = m->as<torch::nn::Conv2dImpl>()) {
        conv->weight.normal_(0.0, 0.02);  // EXPECT: tensor-inplace-on-leaf
        torch::nn::init::zeros_(conv->bias);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init functions write under their own NoGradGuard
      }
    }
  }

  torch::Tensor forward(const torch::Tensor& t) {
    auto x = up1(up2(up3(up4(res(t)))));
    return out(F::pad(x, F::PadFuncOptions({1, 1, 1, 1}).mode(torch::kReflect)));
  }
};
TORCH_MODULE(Decoder);

torch::Tensor style_loss(const std::vector<torch::Tensor>& g_feats, const std::vector<torch::Tensor>& s_feats) {
  auto loss = torch::zeros({}, g_feats.front().options());
  for (size_t i = 0; i < g_feats.size(); ++i) {
    auto g = calc_mean_std(g_feats[i]);
    auto s = calc_mean_std(s_feats[i]);
    loss = loss + F::mse_loss(g.first, s.first) + F::mse_loss(g.second, s.second);  // LOOKALIKE: tensor-graph-kept-across-iterations -- summing the layer terms of one loss; this graph is meant to be kept
  }
  return loss;
}

// Pooled statistics of a whole collection of style images, used as one "collection style".
std::pair<torch::Tensor, torch::Tensor> collection_stats(VggEncoder& enc, const torch::Tensor& styles) {
  torch::NoGradGuard no_grad;
  auto feats = enc->forward(styles).back();
  const int64_t C = feats.size(1);
  // FACT: f = torch.rand(2, 3, 4, 4); assert is_copy_of(f.permute(1, 0, 2, 3).reshape(3, -1), f)
  auto per_channel = feats.permute({1, 0, 2, 3}).reshape({C, -1});  // EXPECT: tensor-reshape-non-contiguous
  return {per_channel.mean(1).view({1, C, 1, 1}), per_channel.std(1).view({1, C, 1, 1})};
}

torch::Tensor stylize(VggEncoder& enc, Decoder& dec, const torch::Tensor& content, const torch::Tensor& style,
                      double alpha) {
  auto c = enc->forward(content).back();
  auto t = adain(c, enc->forward(style).back());
  return dec->forward(alpha * t + (1.0 - alpha) * c);
}

torch::Tensor stylize_mix(VggEncoder& enc, Decoder& dec, const torch::Tensor& content,
                          const std::vector<torch::Tensor>& styles, const std::vector<double>& weights) {
  torch::NoGradGuard no_grad;
  auto c = enc->forward(content).back();
  std::vector<torch::Tensor> targets;
  for (const auto& s : styles) targets.push_back(adain(c, enc->forward(s).back()));
  auto w = torch::tensor(weights, torch::kFloat).view({-1, 1, 1, 1, 1});
  auto mixed = (w * torch::stack(targets)).sum(0);  // EXPECT: tensor-device-mismatch
  return dec->forward(mixed);
}

struct ImageBank {
  torch::Tensor images;
  torch::Tensor sample(int64_t n, torch::Device device) const {
    auto idx = torch::randint(0, images.size(0), {n}, torch::kLong);
    return images.index_select(0, idx).to(device);
  }
};

void train(const StyleConfig& cfg, VggEncoder& enc, Decoder& dec, const ImageBank& contents,
           const ImageBank& styles, torch::Device device) {
  enc->eval();
  for (auto& p : enc->parameters()) p.requires_grad_(false);
  dec->train();
  torch::optim::Adam opt(dec->parameters(), torch::optim::AdamOptions(cfg.lr));
  torch::Tensor running_loss = torch::zeros({}, torch::TensorOptions().device(device));

  for (int64_t it = 0; it < cfg.iterations; ++it) {
    for (auto& group : opt.param_groups())
      static_cast<torch::optim::AdamOptions&>(group.options()).lr(cfg.lr / (1.0 + cfg.lr_decay * it));

    auto content = contents.sample(cfg.batch_size, device);
    auto style = styles.sample(cfg.batch_size, device);
    auto style_feats = enc->forward(style);
    auto content_feat = enc->forward(content).back();
    torch::Tensor t;
    {  // the AdaIN target is a constant for the decoder
      torch::NoGradGuard no_grad;
      t = adain(content_feat, style_feats.back());
    }
    auto content_target = t.clone();  // EXPECT: tensor-unnecessary-clone
    auto g_t = dec->forward(t);
    auto g_feats = enc->forward(g_t);
    auto loss_c = F::mse_loss(g_feats.back(), content_target);
    auto loss_s = style_loss(g_feats, style_feats);
    auto loss = cfg.content_weight * loss_c + cfg.style_weight * loss_s;

    if (it % cfg.preview_every == 0) {
      auto preview = g_t.detach();
      preview.clamp_(0.0, 1.0);  // EXPECT: tensor-inplace-on-detached
      torch::save(preview.cpu(), "preview_" + std::to_string(it) + ".pt");
    }

    opt.zero_grad();
    loss.backward();
    opt.step();
    running_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations

    if (it % cfg.log_every == 0)
      std::cout << "iter " << it << " content " << loss_c.item<float>()  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every iterations, not every step
                << " style " << loss_s.item<float>() << " avg " << running_loss.item<double>() / (it + 1) << "\n";
  }
  torch::save(dec, cfg.decoder_path);
}

struct FrameSource {
  int64_t height = 360, width = 640, num_frames = 300;
  torch::Tensor next() { return torch::rand({height, width, 3}) * 255.0; }
};

void run_video(const StyleConfig& cfg, VggEncoder& enc, Decoder& dec, const torch::Tensor& style_img,
               FrameSource& source, torch::Device device) {
  torch::NoGradGuard no_grad;
  enc->eval(), dec->eval();
  auto host_u8 = torch::empty({source.height * source.width, 3}, torch::kUInt8);
  torch::Tensor prev;
  double frame_ms = 0.0;

  for (int64_t i = 0; i < source.num_frames; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor frame = source.next();
    // FACT: f = torch.rand(4, 6, 3) * 255.0; assert shares_storage(f.to(torch.float), f)
    auto x = frame.to(torch::kFloat).div_(255.0);  // EXPECT: tensor-alias-then-mutate
    auto content = x.permute({2, 0, 1}).unsqueeze(0).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new frame every iteration, the upload cannot be hoisted
    auto out = stylize(enc, dec, content, style_img.to(device), cfg.alpha).clamp(0.0, 1.0);  // EXPECT: tensor-clone-in-loop

    if (prev.defined()) {
      auto smoothed = out.detach();
      smoothed.mul_(1.0 - cfg.temporal_beta).add_(prev, cfg.temporal_beta);  // LOOKALIKE: tensor-inplace-on-detached -- inference under NoGradGuard and out is not read again
      out = smoothed;
    }
    prev = out;

    const int64_t HW = source.height * source.width;
    // FACT: o = torch.rand(1, 3, 4, 5); assert is_view_of(o.permute(0, 2, 3, 1).reshape(20, 3), o)
    auto hwc = out.permute({0, 2, 3, 1}).reshape({HW, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- with one image the permuted H and W stay adjacent, so this is a view
    host_u8.copy_(hwc.mul(255.0));  // EXPECT: tensor-copy-narrowing
    frame_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    if (i % 30 == 0)
      std::cout << "frame " << i << " raw mean " << frame.mean().item<float>() << " fps "
                << 1000.0 * (i + 1) / frame_ms << "\n";
  }
}

int main(int argc, char** argv) {
  StyleConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  VggEncoder enc;
  Decoder dec;
  torch::load(enc, cfg.vgg_path);
  enc->to(device), dec->to(device);

  if (argc > 1 && std::string(argv[1]) == "train") {
    ImageBank contents{torch::rand({512, 3, cfg.image_size, cfg.image_size})};
    ImageBank styles{torch::rand({256, 3, cfg.image_size, cfg.image_size})};
    train(cfg, enc, dec, contents, styles, device);
    return 0;
  }

  torch::load(dec, cfg.decoder_path);
  auto style_img = torch::rand({1, 3, 512, 512});
  FrameSource source;
  run_video(cfg, enc, dec, style_img, source, device);

  auto content = torch::rand({1, 3, 512, 512}, device);
  std::vector<torch::Tensor> palette{torch::rand_like(content), torch::rand_like(content)};
  auto mixed = stylize_mix(enc, dec, content, palette, {0.7, 0.3});
  auto stats = collection_stats(enc, torch::stack(palette).squeeze(1));
  torch::NoGradGuard no_grad;
  auto collection = dec->forward(adain_with_stats(enc->forward(content).back(), stats.first, stats.second));
  torch::save(mixed.cpu(), "mixed.pt");
  torch::save(collection.cpu(), "collection.pt");
}
