// Segment Anything style prompt encoder and mask decoder, trained on cached
// image embeddings with simulated corrective clicks.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace sam {

struct SamConfig {
  int64_t embed_dim = 256, embed_hw = 64, image_size = 1024, mask_in_chans = 16;
  int64_t num_heads = 8, num_multimask = 3, click_rounds = 3;
  int64_t steps = 20000, log_every = 50;
  double lr = 1e-4;
};

struct SamBatch { torch::Tensor embedding, masks, valid, boxes; };
struct EvalSample { torch::Tensor features, gt, clicks, click_labels; int64_t height, width; };

SamBatch load_batch(const std::string& root, int64_t step);
std::vector<EvalSample> load_eval_set(const std::string& root);

struct ResizeLongestSide {
  int64_t target;
  std::pair<double, double> scale(int64_t h, int64_t w) const {
    const double s = static_cast<double>(target) / std::max(h, w);
    return {std::floor(w * s + 0.5) / w, std::floor(h * s + 0.5) / h};
  }
  torch::Tensor apply_coords(const torch::Tensor& coords, int64_t h, int64_t w) const {
    const auto [sx, sy] = scale(h, w);
    auto out = coords.to(torch::kFloat);
    // FACT: c=torch.rand(1,3,2); o=c.to(torch.float32); o.select(-1,0).mul_(2.0); assert shares_storage(o,c)
    out.select(-1, 0).mul_(sx);  // EXPECT: tensor-alias-then-mutate
    out.select(-1, 1).mul_(sy);
    return out;
  }
};

struct PositionEmbeddingRandomImpl : torch::nn::Module {
  torch::Tensor gaussian_;
  explicit PositionEmbeddingRandomImpl(int64_t num_pos_feats, double scale = 1.0) {
    gaussian_ = register_buffer("gaussian", scale * torch::randn({2, num_pos_feats}));
  }

  torch::Tensor encode(torch::Tensor coords) {
    coords = 2 * coords - 1;
    coords = torch::matmul(coords, gaussian_) * (2 * M_PI);
    return torch::cat({torch::sin(coords), torch::cos(coords)}, -1);
  }

  torch::Tensor forward(int64_t h, int64_t w) {
    auto grid = torch::ones({h, w}, gaussian_.options());  // LOOKALIKE: tensor-device-mismatch -- built with the buffer's options
    auto xs = (grid.cumsum(1) - 0.5) / w, ys = (grid.cumsum(0) - 0.5) / h;
    return encode(torch::stack({xs, ys}, -1)).permute({2, 0, 1});
  }

  torch::Tensor forward_with_coords(const torch::Tensor& coords, int64_t img_h, int64_t img_w) {
    auto norm = torch::tensor({static_cast<float>(img_w), static_cast<float>(img_h)});
    return encode(coords / norm);  // EXPECT: tensor-device-mismatch
  }
};
TORCH_MODULE(PositionEmbeddingRandom);

struct PromptEncoderImpl : torch::nn::Module {
  SamConfig cfg_;
  PositionEmbeddingRandom pe_{nullptr};
  std::vector<torch::nn::Embedding> point_embeddings_;
  torch::nn::Embedding not_a_point_{nullptr}, no_mask_{nullptr};
  torch::nn::Sequential mask_downscaling_{nullptr};

  explicit PromptEncoderImpl(const SamConfig& cfg) : cfg_(cfg) {
    const int64_t c = cfg.mask_in_chans;
    pe_ = register_module("pe_layer", PositionEmbeddingRandom(cfg.embed_dim / 2));
    for (int i = 0; i < 4; ++i)
      point_embeddings_.push_back(register_module("point_embeddings_" + std::to_string(i), torch::nn::Embedding(1, cfg.embed_dim)));
    not_a_point_ = register_module("not_a_point_embed", torch::nn::Embedding(1, cfg.embed_dim));
    no_mask_ = register_module("no_mask_embed", torch::nn::Embedding(1, cfg.embed_dim));
    mask_downscaling_ = register_module("mask_downscaling", torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(1, c / 4, 2).stride(2)),
        torch::nn::GroupNorm(torch::nn::GroupNormOptions(1, c / 4)), torch::nn::GELU(),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(c / 4, c, 2).stride(2)),
        torch::nn::GroupNorm(torch::nn::GroupNormOptions(1, c)), torch::nn::GELU(),
        torch::nn::Conv2d(torch::nn::Conv2dOptions(c, cfg.embed_dim, 1))));
  }

  torch::Tensor embed_points(torch::Tensor points, torch::Tensor labels, bool pad) {
    points = points + 0.5;
    if (pad) {
      points = torch::cat({points, torch::zeros({points.size(0), 1, 2}, points.options())}, 1);
      labels = torch::cat({labels, -torch::ones({labels.size(0), 1}, labels.options())}, 1);
    }
    auto emb = pe_->forward_with_coords(points, cfg_.image_size, cfg_.image_size);
    auto lbl = labels.unsqueeze(-1);
    // FACT: c=torch.randn(3,2,requires_grad=True); e=torch.cat([torch.sin(c),torch.cos(c)],-1); e.masked_fill_(e>0.5,0.0); e.sum().backward(); assert c.grad is not None
    emb.masked_fill_(lbl == -1, 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- cat does not save its output, sin/cos saved their inputs
    emb.add_(lbl.eq(-1) * not_a_point_->weight + lbl.eq(0) * point_embeddings_[0]->weight +
             lbl.eq(1) * point_embeddings_[1]->weight);
    return emb;
  }

  torch::Tensor embed_boxes(torch::Tensor boxes) {
    boxes = boxes + 0.5;
    auto corners = pe_->forward_with_coords(boxes.reshape({-1, 2, 2}), cfg_.image_size, cfg_.image_size);
    corners.select(1, 0).add_(point_embeddings_[2]->weight.squeeze(0));
    corners.select(1, 1).add_(point_embeddings_[3]->weight.squeeze(0));
    return corners;
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& points, const torch::Tensor& labels,
                                                  const torch::Tensor& boxes, const torch::Tensor& masks) {
    const int64_t bs = points.defined() ? points.size(0) : boxes.defined() ? boxes.size(0) : 1;
    auto sparse = torch::empty({bs, 0, cfg_.embed_dim}, no_mask_->weight.options());
    if (points.defined()) sparse = torch::cat({sparse, embed_points(points, labels, !boxes.defined())}, 1);
    if (boxes.defined()) sparse = torch::cat({sparse, embed_boxes(boxes)}, 1);
    if (masks.defined()) return {sparse, mask_downscaling_->forward(masks)};
    return {sparse, no_mask_->weight.reshape({1, -1, 1, 1}).expand({bs, -1, cfg_.embed_hw, cfg_.embed_hw})};
  }

  torch::Tensor dense_pe() { return pe_->forward(cfg_.embed_hw, cfg_.embed_hw).unsqueeze(0); }
};
TORCH_MODULE(PromptEncoder);

struct AttentionImpl : torch::nn::Module {
  int64_t heads_;
  torch::nn::Linear q_{nullptr}, k_{nullptr}, v_{nullptr}, out_{nullptr};
  AttentionImpl(int64_t dim, int64_t heads, int64_t downsample = 1) : heads_(heads) {
    const int64_t inner = dim / downsample;
    q_ = register_module("q_proj", torch::nn::Linear(dim, inner));
    k_ = register_module("k_proj", torch::nn::Linear(dim, inner));
    v_ = register_module("v_proj", torch::nn::Linear(dim, inner));
    out_ = register_module("out_proj", torch::nn::Linear(inner, dim));
  }

  torch::Tensor separate(const torch::Tensor& x) const {
    // FACT: x=torch.randn(2,5,16); assert is_view_of(x.reshape(2,5,4,4), x)
    return x.reshape({x.size(0), x.size(1), heads_, -1}).transpose(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- the Linear output is contiguous, splitting its last dim is a view
  }

  torch::Tensor recombine(const torch::Tensor& x) const {
    // FACT: x=torch.randn(2,4,5,8); assert is_copy_of(x.transpose(1,2).reshape(2,5,32), x)
    return x.transpose(1, 2).reshape({x.size(0), x.size(2), -1});  // EXPECT: tensor-reshape-non-contiguous
  }

  torch::Tensor forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    auto qh = separate(q_->forward(q)), kh = separate(k_->forward(k)), vh = separate(v_->forward(v));
    auto attn = torch::softmax(torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(double(qh.size(-1))), -1);
    return out_->forward(recombine(torch::matmul(attn, vh)));
  }
};
TORCH_MODULE(Attention);

struct MaskDecoderImpl : torch::nn::Module {
  int64_t num_mask_tokens_;
  torch::nn::Embedding iou_token_{nullptr}, mask_tokens_{nullptr};
  Attention self_attn_{nullptr}, t2i_{nullptr}, i2t_{nullptr};
  torch::nn::Sequential mlp_{nullptr}, iou_head_{nullptr};
  std::vector<torch::nn::LayerNorm> norms_;
  torch::nn::ConvTranspose2d up1_{nullptr}, up2_{nullptr};
  torch::nn::GroupNorm up_norm_{nullptr};
  torch::nn::Linear hyper_{nullptr};

  explicit MaskDecoderImpl(const SamConfig& cfg) : num_mask_tokens_(cfg.num_multimask + 1) {
    const int64_t c = cfg.embed_dim;
    iou_token_ = register_module("iou_token", torch::nn::Embedding(1, c));
    mask_tokens_ = register_module("mask_tokens", torch::nn::Embedding(num_mask_tokens_, c));
    self_attn_ = register_module("self_attn", Attention(c, cfg.num_heads));
    t2i_ = register_module("cross_attn_token_to_image", Attention(c, cfg.num_heads, 2));
    i2t_ = register_module("cross_attn_image_to_token", Attention(c, cfg.num_heads, 2));
    mlp_ = register_module("mlp", torch::nn::Sequential(torch::nn::Linear(c, 8 * c), torch::nn::ReLU(),
                                                        torch::nn::Linear(8 * c, c)));
    for (int i = 0; i < 4; ++i)
      norms_.push_back(register_module("norm" + std::to_string(i), torch::nn::LayerNorm(torch::nn::LayerNormOptions({c}))));
    up1_ = register_module("up1", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(c, c / 4, 2).stride(2)));
    up_norm_ = register_module("up_norm", torch::nn::GroupNorm(torch::nn::GroupNormOptions(1, c / 4)));
    up2_ = register_module("up2", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(c / 4, c / 8, 2).stride(2)));
    hyper_ = register_module("hypernet", torch::nn::Linear(c, c / 8));
    iou_head_ = register_module("iou_head", torch::nn::Sequential(torch::nn::Linear(c, c), torch::nn::ReLU(),
                                                                  torch::nn::Linear(c, num_mask_tokens_)));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& image_embeddings, const torch::Tensor& image_pe,
                                                  const torch::Tensor& sparse, const torch::Tensor& dense,
                                                  bool multimask) {
    const int64_t b = sparse.size(0), c = sparse.size(2);
    auto out_tokens = torch::cat({iou_token_->weight, mask_tokens_->weight}, 0);
    auto tokens = torch::cat({out_tokens.unsqueeze(0).expand({b, -1, -1}), sparse}, 1);
    // FACT: x=torch.randn(1,4,2,2); s=x.repeat_interleave(1,0); s+=torch.ones(1,4,2,2); assert is_copy_of(s,x)
    auto src = image_embeddings.repeat_interleave(b, 0);
    src += dense;  // LOOKALIKE: tensor-alias-then-mutate -- repeat_interleave returns new storage, even for one repeat
    const int64_t h = src.size(2), w = src.size(3);
    // FACT: pe=torch.randn(4,4,8).permute(2,0,1).unsqueeze(0); assert not is_contiguous(pe) and is_view_of(pe.flatten(2), pe)
    auto key_pe = image_pe.flatten(2).permute({0, 2, 1}).expand({b, -1, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- h and w stay adjacent after the permute, flatten is a view
    auto keys = src.flatten(2).permute({0, 2, 1});
    auto hs = norms_[0](tokens + self_attn_(tokens, tokens, tokens));
    auto k = keys + key_pe;
    hs = norms_[1](hs + t2i_(hs + tokens, k, keys));
    hs = norms_[2](hs + mlp_->forward(hs));
    keys = norms_[3](keys + i2t_(k, hs + tokens, hs));
    auto iou_out = hs.select(1, 0);
    auto mask_tokens_out = hs.narrow(1, 1, num_mask_tokens_);
    // FACT: s=torch.randn(2,16,8); v=s.transpose(1,2).view(2,8,4,4); assert not is_contiguous(s.transpose(1,2)) and is_view_of(v,s)
    auto img = keys.transpose(1, 2).view({b, c, h, w});  // LOOKALIKE: tensor-view-non-contiguous -- only splits the token dim, which strides can express
    auto up = torch::gelu(up_norm_(up1_(img)));
    up = torch::gelu(up2_(up));
    // FACT: hs=torch.randn(2,7,8); assert raises(lambda: hs.narrow(1,1,4).view(-1,8), "view size is not compatible")
    auto hyper = hyper_->forward(mask_tokens_out.view({-1, c})).view({b, num_mask_tokens_, -1});  // EXPECT: tensor-view-non-contiguous
    const int64_t uc = up.size(1), uh = up.size(2), uw = up.size(3);
    auto masks = torch::matmul(hyper, up.view({b, uc, uh * uw})).view({b, -1, uh, uw});
    auto iou = iou_head_->forward(iou_out);
    const int64_t first = multimask ? 1 : 0, count = multimask ? num_mask_tokens_ - 1 : 1;
    return {masks.narrow(1, first, count), iou.narrow(1, first, count)};
  }
};
TORCH_MODULE(MaskDecoder);

torch::Tensor mask_loss(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& valid) {
  auto bce = torch::binary_cross_entropy_with_logits(logits, target, {}, {}, at::Reduction::None);
  auto p = torch::sigmoid(logits);
  auto pt = p * target + (1 - p) * (1 - target);
  auto focal = (bce * (1 - pt).pow(2) * valid).mean({-2, -1});
  // FACT: x=torch.randn(4,requires_grad=True); p=torch.sigmoid(x); p.mul_(torch.ones(4)); assert backward_fails(lambda: p.sum().backward())
  p.mul_(valid);  // EXPECT: tensor-inplace-on-saved
  auto dice = 1 - (2 * (p * target).sum({-2, -1}) + 1) / (p.sum({-2, -1}) + target.sum({-2, -1}) + 1);
  return 20.0 * focal + dice;
}

std::pair<torch::Tensor, torch::Tensor> sample_error_click(const torch::Tensor& logits, const torch::Tensor& gt, int64_t image_size) {
  auto pred = logits > 0, gtb = gt > 0.5;
  auto fn = gtb.logical_and(pred.logical_not()).flatten(1), fp = pred.logical_and(gtb.logical_not()).flatten(1);
  auto use_fn = fn.sum(1) >= fp.sum(1);
  auto err = torch::where(use_fn.unsqueeze(1), fn, fp).to(torch::kFloat);
  auto idx = (err + 1e-3 * torch::rand_like(err)).argmax(1);
  const int64_t w = gt.size(-1);
  auto xy = torch::stack({idx.remainder(w), idx.div(w, "floor")}, -1).to(torch::kFloat) * (double(image_size) / w);
  return {xy.unsqueeze(1), use_fn.to(torch::kFloat).unsqueeze(1)};
}

void train(PromptEncoder encoder, MaskDecoder decoder, const SamConfig& cfg, const std::string& root,
           torch::Device device) {
  std::vector<torch::Tensor> params = encoder->parameters();
  for (auto& p : decoder->parameters()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(cfg.lr).weight_decay(0.1));
  auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  for (int64_t step = 0; step < cfg.steps; ++step) {
    auto batch = load_batch(root, step);
    auto emb = batch.embedding.to(device), gt = batch.masks.to(device), valid = batch.valid.to(device);
    torch::Tensor mask_input, points, labels;
    auto total = torch::zeros({}, emb.options());
    for (int64_t r = 0; r < cfg.click_rounds; ++r) {
      auto [sparse, dense] = encoder->forward(points, labels, r == 0 ? batch.boxes.to(device) : torch::Tensor(), mask_input);
      auto [low_res, iou] = decoder->forward(emb, encoder->dense_pe(), sparse, dense, /*multimask=*/false);
      auto fg = (low_res.detach() > 0), gtb = gt > 0.5;
      auto iou_target = fg.logical_and(gtb).sum({-2, -1}).to(torch::kFloat) / fg.logical_or(gtb).sum({-2, -1}).clamp_min(1);
      total = total + mask_loss(low_res, gt, valid).mean() + torch::mse_loss(iou, iou_target);  // LOOKALIKE: tensor-graph-kept-across-iterations -- the click rounds of one step share one backward
      mask_input = low_res.detach();
      // FACT: x=torch.randn(2,4,requires_grad=True); y=x*2; l=torch.nn.functional.binary_cross_entropy_with_logits(y,torch.ones(2,4)); d=y.detach(); d.clamp_(-1,1); assert backward_fails(lambda: l.backward())
      mask_input.clamp_(-20.0, 20.0);  // EXPECT: tensor-inplace-on-detached
      auto [pt, lbl] = sample_error_click(mask_input, gt, cfg.image_size);
      points = points.defined() ? torch::cat({points, pt}, 1) : pt;
      labels = labels.defined() ? torch::cat({labels, lbl}, 1) : lbl;
    }
    opt.zero_grad();
    total.backward();
    opt.step();
    epoch_loss += total;  // EXPECT: tensor-graph-kept-across-iterations
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " loss " << total.item<float>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
  }
  std::cout << "mean loss " << (epoch_loss / cfg.steps).item<double>() << std::endl;
}

double interactive_eval(PromptEncoder encoder, MaskDecoder decoder, const SamConfig& cfg, const std::string& root,
                        torch::Device device) {
  torch::NoGradGuard no_grad;
  encoder->eval(), decoder->eval();
  ResizeLongestSide resize{cfg.image_size};
  const auto pe = encoder->dense_pe();
  double iou_sum = 0.0, n = 0;
  for (auto& sample : load_eval_set(root)) {
    auto mask_buf = torch::zeros({1, 1, 4 * cfg.embed_hw, 4 * cfg.embed_hw}, pe.options());
    auto gt = sample.gt.to(device);
    auto clicks = sample.clicks.to(torch::kFloat);
    for (int64_t r = 0; r < clicks.size(0); ++r) {
      auto emb = sample.features.to(device);  // EXPECT: tensor-clone-in-loop
      auto pts = resize.apply_coords(clicks.narrow(0, 0, r + 1).unsqueeze(0), sample.height, sample.width);
      auto lbl = sample.click_labels.narrow(0, 0, r + 1).unsqueeze(0).to(device);
      auto [sparse, dense] = encoder->forward(pts.to(device), lbl, torch::Tensor(), r > 0 ? mask_buf : torch::Tensor());
      auto [masks, iou] = decoder->forward(emb, pe, sparse, dense, /*multimask=*/r == 0);
      auto chosen = masks.index_select(1, iou.argmax(1));
      auto prev = mask_buf.clone();  // LOOKALIKE: tensor-unnecessary-clone -- mask_buf is overwritten on the next line, the snapshot is read after
      mask_buf.copy_(chosen);
      auto change = (mask_buf - prev).abs().mean();
      auto probs = chosen.clone().sigmoid_();  // EXPECT: tensor-unnecessary-clone
      auto hit = (probs > 0.5).logical_and(gt > 0.5).sum().to(torch::kFloat);
      auto score = hit / (probs > 0.5).logical_or(gt > 0.5).sum().clamp_min(1);
      iou_sum += score.item<float>();  // EXPECT: tensor-sync-in-loop
      if (r + 1 == clicks.size(0) && change.item<float>() > 1.0)
        std::cout << "mask still moving after the last click" << std::endl;
      ++n;
    }
  }
  return iou_sum / std::max(n, 1.0);
}

}  // namespace sam

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "data/sa1b_cache";
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  sam::SamConfig cfg;
  sam::PromptEncoder encoder(cfg);
  sam::MaskDecoder decoder(cfg);
  encoder->to(device), decoder->to(device);
  sam::train(encoder, decoder, cfg, root, device);
  std::cout << "mIoU per click " << sam::interactive_eval(encoder, decoder, cfg, root + "/val", device) << std::endl;
  return 0;
}
