// RAFT-style optical flow in LibTorch: feature/context encoders, an all-pairs
// correlation volume with a pooled pyramid, correlation lookup around the current
// flow estimate and a ConvGRU update operator iterated `iters` times.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct RaftConfig {
  int64_t fdim = 256, hdim = 128, cdim = 128;  // feature / GRU hidden / context channels
  int64_t corr_levels = 4, corr_radius = 4, iters = 12, log_every = 100;
  double gamma = 0.8, max_flow = 400.0, lr = 4e-4;  // sequence-loss decay, flow cap, AdamW
};

struct FlowBatch {
  torch::Tensor image1;  // [B, 3, H, W], 0..255
  torch::Tensor image2;
  torch::Tensor flow;    // [B, 2, H, W]
  torch::Tensor valid;   // [B, H, W]
};

// Encoders: three stride-2 stages, instance norm, 1x1 projection (1/8 resolution).
struct BasicEncoderImpl : nn::Module {
  explicit BasicEncoderImpl(int64_t out_dim) {
    const int64_t widths[] = {3, 64, 96, 128};
    for (int i = 0; i < 3; ++i) {
      convs.push_back(register_module("conv" + std::to_string(i + 1),
          nn::Conv2d(nn::Conv2dOptions(widths[i], widths[i + 1], i == 0 ? 7 : 3).stride(2).padding(i == 0 ? 3 : 1))));
      norms.push_back(register_module("norm" + std::to_string(i + 1), nn::InstanceNorm2d(widths[i + 1])));
    }
    proj = register_module("proj", nn::Conv2d(nn::Conv2dOptions(128, out_dim, 1)));
  }

  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < convs.size(); ++i) x = F::relu(norms[i](convs[i](x)));
    return proj(x);
  }

  std::vector<nn::Conv2d> convs;
  std::vector<nn::InstanceNorm2d> norms;
  nn::Conv2d proj{nullptr};
};
TORCH_MODULE(BasicEncoder);

// ---- correlation volume ------------------------------------------------------
torch::Tensor bilinear_sample(const torch::Tensor& img, const torch::Tensor& coords) {
  const auto H = img.size(2), W = img.size(3);
  auto xy = coords.split(1, -1);
  auto xg = 2.0 * xy[0] / static_cast<double>(W - 1) - 1.0;
  auto yg = 2.0 * xy[1] / static_cast<double>(H - 1) - 1.0;
  auto grid = torch::cat({xg, yg}, -1);
  return F::grid_sample(img, grid, F::GridSampleFuncOptions().align_corners(true));
}

class CorrBlock {
 public:
  // reverse = true builds the volume for frame2 -> frame1 from the same matmul.
  CorrBlock(const torch::Tensor& fmap1, const torch::Tensor& fmap2, int64_t levels, int64_t radius,
            bool reverse = false)
      : radius_(radius) {
    const auto B = fmap1.size(0), D = fmap1.size(1), H = fmap1.size(2), W = fmap1.size(3);
    auto f1 = fmap1.view({B, D, H * W});
    auto f2 = fmap2.view({B, D, H * W});
    auto corr = torch::matmul(f1.transpose(1, 2), f2) / std::sqrt(static_cast<double>(D));  // [B, HW, HW]
    torch::Tensor base;
    if (reverse) {
      // FACT: c = torch.randn(2, 12, 12); assert raises(lambda: c.transpose(1, 2).view(24, 1, 3, 4), "view size is not compatible")
      base = corr.transpose(1, 2).view({B * H * W, 1, H, W}); // EXPECT: tensor-view-non-contiguous
    } else {
      // FACT: c = torch.matmul(torch.randn(2, 12, 8), torch.randn(2, 8, 12)) / 2.0; assert is_view_of(c.view(24, 1, 3, 4), c)
      base = corr.view({B * H * W, 1, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- matmul result divided out of place is contiguous
    }
    pyramid_.push_back(base);
    for (int64_t i = 1; i < levels; ++i) {
      base = F::avg_pool2d(base, F::AvgPool2dFuncOptions(2).stride(2));
      pyramid_.push_back(base);
    }
  }

  // coords: [B, 2, H, W] pixel positions in frame 2; returns [B, L*(2r+1)^2, H, W].
  torch::Tensor lookup(const torch::Tensor& coords) const {
    const int64_t r = radius_;
    const auto B = coords.size(0), H = coords.size(2), W = coords.size(3);
    // FACT: c = torch.randn(2, 2, 3, 4); assert is_copy_of(c.permute(0, 2, 3, 1).reshape(24, 1, 1, 2), c)
    auto centroid = coords.permute({0, 2, 3, 1}).reshape({B * H * W, 1, 1, 2}); // EXPECT: tensor-reshape-non-contiguous
    auto d = torch::linspace(-r, r, 2 * r + 1, coords.options());
    auto mesh = torch::meshgrid({d, d}, "ij");
    auto delta = torch::stack({mesh[1], mesh[0]}, -1).unsqueeze(0);  // [1, 2r+1, 2r+1, 2]
    std::vector<torch::Tensor> per_level;
    for (size_t i = 0; i < pyramid_.size(); ++i) {
      auto coords_lvl = centroid / std::pow(2.0, static_cast<double>(i)) + delta;
      auto sampled = bilinear_sample(pyramid_[i], coords_lvl);  // [BHW, 1, 2r+1, 2r+1]
      // FACT: s = torch.nn.functional.grid_sample(torch.randn(24, 1, 5, 5), torch.rand(24, 3, 3, 2) * 2 - 1, align_corners=True); assert is_contiguous(s) and is_view_of(s.view(2, 3, 4, -1), s)
      per_level.push_back(sampled.view({B, H, W, -1})); // LOOKALIKE: tensor-view-non-contiguous -- grid_sample allocates a contiguous output
    }
    return torch::cat(per_level, -1).permute({0, 3, 1, 2}).contiguous();
  }

 private:
  int64_t radius_;
  std::vector<torch::Tensor> pyramid_;
};

torch::Tensor coords_grid(int64_t batch, int64_t ht, int64_t wd, const torch::TensorOptions& opts) {
  auto mesh = torch::meshgrid({torch::arange(ht, opts), torch::arange(wd, opts)}, "ij");
  auto coords = torch::stack({mesh[1], mesh[0]}, 0);
  return coords.unsqueeze(0).repeat({batch, 1, 1, 1});
}

// ---- update operator ---------------------------------------------------------
struct ConvGRUImpl : nn::Module {
  ConvGRUImpl(int64_t hidden, int64_t input)
      : convz(register_module("convz", nn::Conv2d(nn::Conv2dOptions(hidden + input, hidden, 3).padding(1)))),
        convr(register_module("convr", nn::Conv2d(nn::Conv2dOptions(hidden + input, hidden, 3).padding(1)))),
        convq(register_module("convq", nn::Conv2d(nn::Conv2dOptions(hidden + input, hidden, 3).padding(1)))) {}
  torch::Tensor forward(torch::Tensor h, const torch::Tensor& x) {
    auto hx = torch::cat({h, x}, 1);
    auto z = torch::sigmoid(convz(hx));
    auto r = torch::sigmoid(convr(hx));
    auto q = torch::tanh(convq(torch::cat({r * h, x}, 1)));
    h.mul_(1 - z); // EXPECT: tensor-inplace-on-saved
    h.add_(z * q);
    return h;
  }

  nn::Conv2d convz, convr, convq;
};
TORCH_MODULE(ConvGRU);

struct MotionEncoderImpl : nn::Module {
  explicit MotionEncoderImpl(int64_t corr_planes)
      : convc1(register_module("convc1", nn::Conv2d(nn::Conv2dOptions(corr_planes, 256, 1)))),
        convf1(register_module("convf1", nn::Conv2d(nn::Conv2dOptions(2, 128, 7).padding(3)))),
        convf2(register_module("convf2", nn::Conv2d(nn::Conv2dOptions(128, 64, 3).padding(1)))),
        conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(256 + 64, 128 - 2, 3).padding(1)))) {}
  torch::Tensor forward(const torch::Tensor& flow, const torch::Tensor& corr) {
    auto cor = F::relu(convc1(corr));
    auto flo = F::relu(convf1(flow));
    flo = F::relu(convf2(flo));
    auto out = conv(torch::cat({cor, flo}, 1));
    out.relu_(); // LOOKALIKE: tensor-inplace-on-saved -- a convolution saves its input and weight, not its output
    return torch::cat({out, flow}, 1);
  }

  nn::Conv2d convc1, convf1, convf2, conv;
};
TORCH_MODULE(MotionEncoder);

struct UpdateBlockImpl : nn::Module {
  UpdateBlockImpl(const RaftConfig& cfg)
      : encoder(register_module("encoder", MotionEncoder(cfg.corr_levels * (2 * cfg.corr_radius + 1) * (2 * cfg.corr_radius + 1)))),
        gru(register_module("gru", ConvGRU(cfg.hdim, cfg.cdim + 128))),
        flow_head1(register_module("flow_head1", nn::Conv2d(nn::Conv2dOptions(cfg.hdim, 256, 3).padding(1)))),
        flow_head2(register_module("flow_head2", nn::Conv2d(nn::Conv2dOptions(256, 2, 3).padding(1)))),
        mask1(register_module("mask1", nn::Conv2d(nn::Conv2dOptions(cfg.hdim, 256, 3).padding(1)))),
        mask2(register_module("mask2", nn::Conv2d(nn::Conv2dOptions(256, 64 * 9, 1)))) {}
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(torch::Tensor net, const torch::Tensor& inp,
                                                                  const torch::Tensor& corr, const torch::Tensor& flow) {
    auto motion = encoder(flow, corr);
    net = gru(net, torch::cat({inp, motion}, 1));
    auto delta = flow_head2(F::relu(flow_head1(net)));
    auto mask = 0.25 * mask2(F::relu(mask1(net)));
    return {net, mask, delta};
  }

  MotionEncoder encoder;
  ConvGRU gru;
  nn::Conv2d flow_head1, flow_head2, mask1, mask2;
};
TORCH_MODULE(UpdateBlock);

// Convex upsampling of a 1/8-resolution flow field with a learned 3x3 mask.
torch::Tensor upsample_flow(const torch::Tensor& flow, const torch::Tensor& mask) {
  const auto N = flow.size(0), H = flow.size(2), W = flow.size(3);
  auto m = torch::softmax(mask.view({N, 1, 9, 8, 8, H, W}), 2);
  auto up = F::unfold(8.0 * flow, F::UnfoldFuncOptions({3, 3}).padding(1));
  up = up.view({N, 2, 9, 1, 1, H, W});
  up = torch::sum(m * up, 2);  // [N, 2, 8, 8, H, W]
  // FACT: u = torch.randn(2, 2, 8, 8, 3, 4).permute(0, 1, 4, 2, 5, 3).contiguous(); assert is_contiguous(u) and is_view_of(u.view(2, 2, 24, 32), u)
  return up.permute({0, 1, 4, 2, 5, 3}).contiguous().view({N, 2, 8 * H, 8 * W}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() is called right before the view
}

struct RAFTImpl : nn::Module {
  explicit RAFTImpl(const RaftConfig& cfg)
      : cfg_(cfg),
        fnet(register_module("fnet", BasicEncoder(cfg.fdim))),
        cnet(register_module("cnet", BasicEncoder(cfg.hdim + cfg.cdim))),
        update(register_module("update", UpdateBlock(cfg))) {}

  std::vector<torch::Tensor> forward(const torch::Tensor& image1, const torch::Tensor& image2, int64_t iters,
                                     const torch::Tensor& flow_init = {}) {
    auto fmap1 = fnet(image1);
    auto fmap2 = fnet(image2);
    CorrBlock corr_fn(fmap1, fmap2, cfg_.corr_levels, cfg_.corr_radius);
    auto ctx = cnet(image1);
    auto net = torch::tanh(ctx.narrow(1, 0, cfg_.hdim));
    auto inp = ctx.narrow(1, cfg_.hdim, cfg_.cdim);
    const auto B = fmap1.size(0), H8 = fmap1.size(2), W8 = fmap1.size(3);
    auto coords0 = coords_grid(B, H8, W8, fmap1.options());
    auto coords1 = coords_grid(B, H8, W8, fmap1.options());
    if (flow_init.defined()) coords1 = coords1 + flow_init;
    std::vector<torch::Tensor> predictions;
    for (int64_t itr = 0; itr < iters; ++itr) {
      coords1 = coords1.detach();
      auto corr = corr_fn.lookup(coords1);
      auto flow = coords1 - coords0;
      auto step = update->forward(net, inp.contiguous(), corr, flow); // EXPECT: tensor-clone-in-loop
      net = std::get<0>(step);
      coords1 = coords1 + std::get<2>(step);
      predictions.push_back(upsample_flow(coords1 - coords0, std::get<1>(step))); // LOOKALIKE: tensor-graph-kept-across-iterations -- the predictions are returned and the sequence loss backpropagates through them
    }
    return predictions;
  }

  RaftConfig cfg_;
  BasicEncoder fnet, cnet;
  UpdateBlock update;
};
TORCH_MODULE(RAFT);

// ---- training ----------------------------------------------------------------
torch::Tensor prepare_image(torch::Tensor image) {
  torch::Tensor x = image;
  // FACT: img = torch.full((1, 3, 4, 4), 255.0); x = img; x.div_(127.5).sub_(1.0); assert shares_storage(x, img) and img.max() == 1.0
  x.div_(127.5).sub_(1.0); // EXPECT: tensor-alias-then-mutate
  return x;
}

// Inference path: replicate-pad to a multiple of 8, then scale to [-1, 1].
torch::Tensor pad_and_normalize(const torch::Tensor& image, int64_t k) {
  const auto H = image.size(2), W = image.size(3);
  const int64_t ph = (k - H % k) % k, pw = (k - W % k) % k;
  auto padded = F::pad(image, F::PadFuncOptions({0, pw, 0, ph}).mode(torch::kReplicate));
  // FACT: img = torch.rand(1, 3, 5, 6) * 255; p = torch.nn.functional.pad(img, (0, 2, 0, 3), mode="replicate"); p.div_(127.5); assert is_copy_of(p, img)
  padded.div_(127.5).sub_(1.0); // LOOKALIKE: tensor-alias-then-mutate -- F::pad writes into a newly allocated tensor
  return padded;
}

torch::Tensor sequence_loss(const std::vector<torch::Tensor>& preds, const torch::Tensor& flow_gt,
                            const torch::Tensor& valid, double gamma, double max_flow) {
  auto mag = flow_gt.pow(2).sum(1, true).sqrt();  // [B, 1, H, W]
  auto weight = valid.unsqueeze(1).expand_as(flow_gt);
  // FACT: v = torch.ones(2, 3, 4); g = torch.randn(2, 2, 3, 4); w = v.unsqueeze(1).expand_as(g); assert raises(lambda: w.mul_((torch.rand(2, 1, 3, 4) < 0.5).float()), "more than one element")
  weight *= (mag < max_flow).to(torch::kFloat); // EXPECT: tensor-inplace-on-expanded
  const auto n = static_cast<int64_t>(preds.size());
  auto loss = torch::zeros({}, flow_gt.options());
  for (int64_t i = 0; i < n; ++i) {
    const double w = std::pow(gamma, static_cast<double>(n - i - 1));
    loss = loss + w * (weight * (preds[i] - flow_gt).abs()).mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- the summed loss is returned and differentiated by the caller
  }
  return loss;
}

torch::Tensor flow_magnitude_image(const torch::Tensor& flow) {
  auto mag = flow.pow(2).sum(0).sqrt();
  auto img = torch::empty({mag.size(0), mag.size(1)}, torch::kByte);
  img.copy_((mag / mag.max().clamp_min(1e-6) * 255.0).round().clamp(0, 255)); // LOOKALIKE: tensor-copy-narrowing -- rounded and clamped to 0..255 before the uint8 store
  return img;
}

void save_preview(const torch::Tensor& rgb_u8, size_t step);  // writes a PNG (image_io.cpp)

void train_raft(RAFT& model, std::vector<FlowBatch>& batches, const RaftConfig& cfg) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  model->to(device);
  model->train();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-5));
  double running_loss = 0.0;
  torch::Tensor last_epe;
  for (size_t step = 0; step < batches.size(); ++step) {
    auto& batch = batches[step];
    auto image1 = prepare_image(batch.image1.to(device));
    auto image2 = prepare_image(batch.image2.to(device));
    auto flow_gt = batch.flow.to(device);
    auto valid = batch.valid.to(device);
    opt.zero_grad();
    auto preds = model->forward(image1, image2, cfg.iters);
    auto flow_final = preds.back();
    auto vis = flow_final.detach();  // for the dashboard image
    vis.div_(vis.abs().max().clamp_min(1.0)); // EXPECT: tensor-inplace-on-detached
    auto loss = sequence_loss(preds, flow_gt, valid, cfg.gamma, cfg.max_flow);
    loss.backward();
    nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    opt.step();
    running_loss += loss.item<double>(); // EXPECT: tensor-sync-in-loop
    last_epe = (flow_final - flow_gt).pow(2).sum(1).sqrt().mean(); // LOOKALIKE: tensor-graph-kept-across-iterations -- one handle overwritten each step keeps a single graph
    if (step % cfg.log_every == 0) {
      std::cout << "step " << step << " loss " << running_loss / (step + 1) << " epe "
                << last_epe.item<float>() << std::endl; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
      save_preview(flow_magnitude_image(vis[0].cpu()), step);
    }
  }
}
