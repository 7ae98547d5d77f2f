// Segment Anything, prompt side: prompt encoder, two-way transformer, mask decoder with hypernetwork
// MLPs and an IoU head, the click predictor, and interactive fine-tuning of the prompt side.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

namespace nn = torch::nn;
namespace F = torch::nn::functional;
constexpr double kPi = 3.14159265358979323846;

struct SamConfig {
  int64_t embed_dim = 256, image_size = 1024, embed_hw = 64, mask_in_chans = 16;
  int64_t num_multimask = 3, depth = 2, num_heads = 8, mlp_dim = 2048, attn_downsample = 2, iou_hidden = 256;
  bool iou_sigmoid = true;  // the IoU head predicts a probability
  float mask_threshold = 0.0f, pe_scale = 1.0f;  // pe_scale: std of the random Fourier features
};

struct LayerNorm2dImpl : nn::Module {  // LayerNorm over the channels of an NCHW map
  explicit LayerNorm2dImpl(int64_t ch)
      : weight(register_parameter("weight", torch::ones({ch}))), bias(register_parameter("bias", torch::zeros({ch}))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto d = x - x.mean(1, true);
    return weight.view({1, -1, 1, 1}) * (d / torch::sqrt(d.pow(2).mean(1, true) + 1e-6)) + bias.view({1, -1, 1, 1});
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(LayerNorm2d);

class PromptEncoderImpl : public nn::Module {
 public:
  explicit PromptEncoderImpl(const SamConfig& c) : cfg_(c) {
    gaussian_ = register_buffer("positional_encoding_gaussian_matrix", torch::randn({2, c.embed_dim / 2}));
    gaussian_.mul_(c.pe_scale);  // LOOKALIKE: tensor-inplace-on-leaf -- a registered buffer does not require grad
    for (int i = 0; i < 4; ++i)  // positive point, negative point, box top-left, box bottom-right
      point_embeddings.push_back(register_module("point_embeddings_" + std::to_string(i), nn::Embedding(1, c.embed_dim)));
    not_a_point_embed = register_module("not_a_point_embed", nn::Embedding(1, c.embed_dim));
    no_mask_embed = register_module("no_mask_embed", nn::Embedding(1, c.embed_dim));
    const int64_t m = c.mask_in_chans;
    mask_downscaling = register_module("mask_downscaling", nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(1, m / 4, 2).stride(2)), LayerNorm2d(m / 4), nn::GELU(),
        nn::Conv2d(nn::Conv2dOptions(m / 4, m, 2).stride(2)), LayerNorm2d(m), nn::GELU(),
        nn::Conv2d(nn::Conv2dOptions(m, c.embed_dim, 1))));
  }
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& points, const torch::Tensor& labels,  // -> sparse [B, N, C], dense [B, C, 64, 64]
                                                   const torch::Tensor& boxes, const torch::Tensor& masks) {
    const int64_t bs = points.defined() ? points.size(0) : boxes.defined() ? boxes.size(0) : 1;
    std::vector<torch::Tensor> parts;
    if (points.defined()) parts.push_back(embed_points(points, labels, !boxes.defined()));
    if (boxes.defined()) parts.push_back(embed_boxes(boxes));
    auto sparse = parts.empty() ? torch::empty({bs, 0, cfg_.embed_dim}, no_mask_embed->weight.options()) : torch::cat(parts, 1);
    auto dense = masks.defined() ? mask_downscaling->forward(masks)
                                 : no_mask_embed->weight.reshape({1, -1, 1, 1}).expand({bs, -1, cfg_.embed_hw, cfg_.embed_hw});
    return {sparse, dense};
  }
  torch::Tensor dense_pe() const {  // random Fourier features of the 64 x 64 grid, [1, C, 64, 64]
    auto ones = torch::ones({cfg_.embed_hw, cfg_.embed_hw}, gaussian_.options());
    auto xy = torch::stack({(ones.cumsum(1) - 0.5) / cfg_.embed_hw, (ones.cumsum(0) - 0.5) / cfg_.embed_hw}, -1);
    return encode(xy).permute({2, 0, 1}).unsqueeze(0);
  }
  torch::Tensor gaussian_;
  std::vector<nn::Embedding> point_embeddings;
  nn::Embedding not_a_point_embed{nullptr}, no_mask_embed{nullptr};
  nn::Sequential mask_downscaling{nullptr};
 private:
  torch::Tensor encode(torch::Tensor coords) const {  // coords in [0, 1], [..., 2] -> [..., C]
    coords = torch::matmul(2 * coords - 1, gaussian_) * (2 * kPi);
    return torch::cat({torch::sin(coords), torch::cos(coords)}, -1);
  }
  torch::Tensor with_coords(const torch::Tensor& coords_px) const {
    auto coords = coords_px.clone();  // LOOKALIKE: tensor-unnecessary-clone -- written through select views; the caller's pixel coordinates stay
    coords.select(-1, 0).div_(cfg_.image_size);
    coords.select(-1, 1).div_(cfg_.image_size);
    return encode(coords);
  }
  torch::Tensor embed_points(torch::Tensor points, torch::Tensor labels, bool pad) {
    points = points + 0.5;  // pixel centres
    if (pad) {  // without a box a padding point keeps the token count fixed
      points = torch::cat({points, torch::zeros({points.size(0), 1, 2}, points.options())}, 1);
      labels = torch::cat({labels, -torch::ones({labels.size(0), 1}, labels.options())}, 1);
    }
    auto pe = with_coords(points);
    auto lab = labels.unsqueeze(-1);
    pe = torch::where(lab == -1, torch::zeros_like(pe), pe) + (lab == -1).to(pe.scalar_type()) * not_a_point_embed->weight;
    pe = pe + (lab == 0).to(pe.scalar_type()) * point_embeddings[0]->weight;
    return pe + (lab == 1).to(pe.scalar_type()) * point_embeddings[1]->weight;
  }
  torch::Tensor embed_boxes(const torch::Tensor& boxes) {
    auto corners = with_coords((boxes + 0.5).reshape({-1, 2, 2}));
    // FACT: c = torch.randn(2, 2, 2, requires_grad=True); e = torch.cat([torch.sin(c), torch.cos(c)], -1); e[:, 0] += 1; e.sum().backward()
    corners.select(1, 0).add_(point_embeddings[2]->weight.squeeze(0));  // LOOKALIKE: tensor-inplace-on-saved -- cat does not save its output; sin/cos saved their inputs
    corners.select(1, 1).add_(point_embeddings[3]->weight.squeeze(0));
    return corners;
  }
  SamConfig cfg_;
};
TORCH_MODULE(PromptEncoder);

class AttentionImpl : public nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t heads, int64_t downsample = 1) : heads_(heads) {
    q_proj = register_module("q_proj", nn::Linear(dim, dim / downsample));
    k_proj = register_module("k_proj", nn::Linear(dim, dim / downsample));
    v_proj = register_module("v_proj", nn::Linear(dim, dim / downsample));
    out_proj = register_module("out_proj", nn::Linear(dim / downsample, dim));
  }
  torch::Tensor forward(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in) {
    auto q = separate_heads(q_proj(q_in)), k = separate_heads(k_proj(k_in)), v = separate_heads(v_proj(v_in));
    auto attn = torch::softmax(torch::matmul(q, k.permute({0, 1, 3, 2})) / std::sqrt(static_cast<double>(q.size(3))), -1);
    return out_proj(recombine_heads(torch::matmul(attn, v)));
  }
 private:
  torch::Tensor separate_heads(const torch::Tensor& x) const {
    const int64_t b = x.size(0), n = x.size(1), c = x.size(2);
    // FACT: x = torch.randn(2, 7, 256); assert is_view_of(x.reshape(2, 7, 8, 32), x)
    return x.reshape({b, n, heads_, c / heads_}).transpose(1, 2);  // LOOKALIKE: tensor-reshape-non-contiguous -- splits the last dim of a contiguous Linear output: a view
  }
  torch::Tensor recombine_heads(const torch::Tensor& x) const {
    const int64_t b = x.size(0), h = x.size(1), n = x.size(2), c = x.size(3);
    // FACT: x = torch.randn(2, 8, 7, 16); r = x.transpose(1, 2).reshape(2, 7, 128); assert is_copy_of(r, x)
    return x.transpose(1, 2).reshape({b, n, h * c});  // EXPECT: tensor-reshape-non-contiguous
  }
  int64_t heads_;
  nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(Attention);

class TwoWayBlockImpl : public nn::Module {
 public:
  TwoWayBlockImpl(const SamConfig& c, bool skip_first_pe) : skip_pe_(skip_first_pe) {
    self_attn = register_module("self_attn", Attention(c.embed_dim, c.num_heads));
    token_to_image = register_module("token_to_image", Attention(c.embed_dim, c.num_heads, c.attn_downsample));
    image_to_token = register_module("image_to_token", Attention(c.embed_dim, c.num_heads, c.attn_downsample));
    mlp = register_module("mlp", nn::Sequential(nn::Linear(c.embed_dim, c.mlp_dim), nn::ReLU(), nn::Linear(c.mlp_dim, c.embed_dim)));
    for (int i = 0; i < 4; ++i) norms.push_back(register_module("norm" + std::to_string(i + 1), nn::LayerNorm(nn::LayerNormOptions({c.embed_dim}))));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(torch::Tensor queries, torch::Tensor keys, const torch::Tensor& query_pe, const torch::Tensor& key_pe) {
    auto q = queries + query_pe;  // the first block has no PE on its self-attention
    queries = norms[0](skip_pe_ ? self_attn(queries, queries, queries) : queries + self_attn(q, q, queries));
    auto attn_out = token_to_image(queries + query_pe, keys + key_pe, keys);
    // FACT: ln = torch.nn.LayerNorm(8); x = torch.randn(3, 8, requires_grad=True); y = ln(x); y += torch.randn(3, 8); y.sum().backward()
    queries += attn_out;  // LOOKALIKE: tensor-inplace-on-saved -- LayerNorm saves its input and statistics, not its output
    queries = norms[1](queries);
    queries = norms[2](queries + mlp->forward(queries));
    keys = norms[3](keys + image_to_token(keys + key_pe, queries + query_pe, queries));
    return {queries, keys};
  }
  bool skip_pe_;
  Attention self_attn{nullptr}, token_to_image{nullptr}, image_to_token{nullptr};
  nn::Sequential mlp{nullptr};
  std::vector<nn::LayerNorm> norms;
};
TORCH_MODULE(TwoWayBlock);

class MlpHeadImpl : public nn::Module {
 public:
  MlpHeadImpl(int64_t in, int64_t hidden, int64_t out, int64_t num_layers, bool sigmoid_output) : sigmoid_(sigmoid_output) {
    for (int64_t i = 0; i < num_layers; ++i)
      layers.push_back(register_module("layers_" + std::to_string(i), nn::Linear(i == 0 ? in : hidden, i + 1 == num_layers ? out : hidden)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) x = i + 1 < layers.size() ? torch::relu(layers[i](x)) : layers[i](x);
    if (!sigmoid_) return x;
    x = torch::sigmoid(x);
    x.clamp_(1e-4, 1.0 - 1e-4);  // EXPECT: tensor-inplace-on-saved
    return x;
  }
  bool sigmoid_;  // squash the head's output into (0, 1)
  std::vector<nn::Linear> layers;
};
TORCH_MODULE(MlpHead);

struct MaskPrediction { torch::Tensor low_res_logits, iou; };

class MaskDecoderImpl : public nn::Module {
 public:
  explicit MaskDecoderImpl(const SamConfig& c) : n_tokens_(c.num_multimask + 1) {
    const int64_t d = c.embed_dim;
    for (int64_t i = 0; i < c.depth; ++i) blocks.push_back(register_module("block" + std::to_string(i), TwoWayBlock(c, i == 0)));
    iou_token = register_module("iou_token", nn::Embedding(1, d));
    mask_tokens = register_module("mask_tokens", nn::Embedding(n_tokens_, d));
    upscaling = register_module("upscaling", nn::Sequential(
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(d, d / 4, 2).stride(2)), LayerNorm2d(d / 4), nn::GELU(),
        nn::ConvTranspose2d(nn::ConvTranspose2dOptions(d / 4, d / 8, 2).stride(2)), nn::GELU()));
    for (int64_t i = 0; i < n_tokens_; ++i)
      hypernetworks.push_back(register_module("hyper" + std::to_string(i), MlpHead(d, d, d / 8, 3, false)));
    iou_head = register_module("iou_head", MlpHead(d, c.iou_hidden, n_tokens_, 3, c.iou_sigmoid));
  }
  MaskPrediction forward(const torch::Tensor& image_embedding, const torch::Tensor& image_pe, const torch::Tensor& sparse, const torch::Tensor& dense, bool multimask) {
    auto output_tokens = torch::cat({iou_token->weight, mask_tokens->weight}, 0);
    auto tokens = torch::cat({output_tokens.unsqueeze(0).expand({sparse.size(0), -1, -1}), sparse}, 1);
    auto src = image_embedding.repeat_interleave(tokens.size(0), 0) + dense;
    const int64_t b = src.size(0), c = src.size(1), h = src.size(2), w = src.size(3);
    // FACT: e = torch.randn(2, 16, 8, 8); f = e.flatten(2); assert is_view_of(f, e)
    auto keys = src.flatten(2).permute({0, 2, 1});  // LOOKALIKE: tensor-reshape-non-contiguous -- flatten of the contiguous NCHW sum is a view
    auto key_pe = image_pe.repeat_interleave(tokens.size(0), 0).flatten(2).permute({0, 2, 1});
    auto queries = tokens;
    for (auto& blk : blocks) std::tie(queries, keys) = blk->forward(queries, keys, tokens, key_pe);
    // FACT: k = torch.randn(2, 12, 5); assert is_view_of(k.transpose(1, 2).view(2, 5, 3, 4), k)
    auto up = upscaling->forward(keys.transpose(1, 2).view({b, c, h, w}));  // LOOKALIKE: tensor-view-non-contiguous -- only splits the token dim back into h x w
    std::vector<torch::Tensor> hyper;
    for (int64_t i = 0; i < n_tokens_; ++i) hyper.push_back(hypernetworks[i]->forward(queries.select(1, i + 1)));
    const int64_t uc = up.size(1), uh = up.size(2), uw = up.size(3);
    auto masks = torch::matmul(torch::stack(hyper, 1), up.view({b, uc, uh * uw})).view({b, -1, uh, uw});
    const int64_t first = multimask ? 1 : 0, count = multimask ? n_tokens_ - 1 : 1;
    return {masks.narrow(1, first, count), iou_head->forward(queries.select(1, 0)).narrow(1, first, count)};
  }
  int64_t n_tokens_;
  std::vector<TwoWayBlock> blocks;
  std::vector<MlpHead> hypernetworks;
  nn::Embedding iou_token{nullptr}, mask_tokens{nullptr};
  nn::Sequential upscaling{nullptr};
  MlpHead iou_head{nullptr};
};
TORCH_MODULE(MaskDecoder);

class SamPredictor {
 public:
  static constexpr int64_t kHistory = 4;  // mask prompts of the last clicks, newest last
  SamPredictor(PromptEncoder pe, MaskDecoder md, SamConfig cfg)
      : pe_(std::move(pe)), md_(std::move(md)), cfg_(cfg), device_(torch::kCUDA) {
    pe_->to(device_);
    md_->to(device_);
    pe_->eval(), md_->eval();  // inference only
    history_ = torch::zeros({kHistory, 1, 4 * cfg.embed_hw, 4 * cfg.embed_hw}, torch::TensorOptions().device(device_));
  }
  void set_embedding(const torch::Tensor& embedding, int64_t orig_h, int64_t orig_w) {
    embedding_ = embedding.to(device_);
    const double s = static_cast<double>(cfg_.image_size) / static_cast<double>(std::max(orig_h, orig_w));
    std::tie(orig_h_, orig_w_, input_h_, input_w_) = std::make_tuple(orig_h, orig_w, std::llround(orig_h * s), std::llround(orig_w * s));
    input_scale_ = torch::tensor({static_cast<float>(input_w_) / orig_w, static_cast<float>(input_h_) / orig_h});  // ResizeLongestSide
    n_history_ = 0;
    click_log_.clear();
  }
  // clicks x0, y0, x1, y1, ... in original-image pixels, labels 1 = foreground / 0 = background -> bool masks [M, H, W]
  torch::Tensor predict(const std::vector<float>& clicks_xy, const std::vector<int64_t>& labels, bool multimask) {
    torch::NoGradGuard no_grad;
    auto coords = torch::tensor(clicks_xy).view({1, -1, 2});
    click_log_.push_back(coords);  // the UI draws these over the original image
    auto model_coords = coords.to(torch::kFloat);
    // FACT: c = torch.rand(1, 3, 2) * 640; o = c.to(torch.float32); assert shares_storage(c, o)
    model_coords *= input_scale_;  // EXPECT: tensor-alias-then-mutate
    auto mask_prompt = n_history_ > 0 ? history_.select(0, kHistory - 1).unsqueeze(0) : torch::Tensor();
    auto [sparse, dense] = pe_->forward(model_coords, torch::tensor(labels).view({1, -1}), torch::Tensor(), mask_prompt);  // EXPECT: tensor-device-mismatch
    auto out = md_->forward(embedding_, pe_->dense_pe(), sparse, dense, multimask);
    auto best_logits = out.low_res_logits.index_select(1, std::get<1>(out.iou.max(1))).squeeze(0);  // [1, 256, 256]
    auto prompt_logits = best_logits.clone();  // EXPECT: tensor-unnecessary-clone
    prompt_logits.clamp_(-20.0, 20.0);
    // FACT: h = torch.randn(4, 1, 8, 8); assert raises(lambda: h.narrow(0, 0, 3).copy_(h.narrow(0, 1, 3)), "some elements of the input tensor")
    history_.narrow(0, 0, kHistory - 1).copy_(history_.narrow(0, 1, kHistory - 1));  // EXPECT: tensor-inplace-overlap
    history_.select(0, kHistory - 1).copy_(prompt_logits);
    n_history_ = std::min(n_history_ + 1, kHistory);
    // upscale to the model input, crop its padding, resize to the original image, threshold
    auto opts = F::InterpolateFuncOptions().mode(torch::kBilinear).align_corners(false);
    auto up = F::interpolate(out.low_res_logits, opts.size(std::vector<int64_t>{cfg_.image_size, cfg_.image_size}));
    up = F::interpolate(up.narrow(2, 0, input_h_).narrow(3, 0, input_w_), opts.size(std::vector<int64_t>{orig_h_, orig_w_}));
    return (up > cfg_.mask_threshold).squeeze(0).cpu();
  }
 private:
  PromptEncoder pe_;
  MaskDecoder md_;
  SamConfig cfg_;
  torch::Device device_;
  torch::Tensor embedding_, history_, input_scale_;
  int64_t orig_h_ = 0, orig_w_ = 0, input_h_ = 0, input_w_ = 0, n_history_ = 0;
  std::vector<torch::Tensor> click_log_;
};

// Interactive fine-tuning (embeddings precomputed): rounds of corrective clicks, each fed the last low-res logits.
struct RefineSample { torch::Tensor embedding, gt_low_res, first_click; };  // [1, C, 64, 64], [1, 1, 256, 256], [1, 1, 2]

double refine_step(PromptEncoder& pe, MaskDecoder& dec, torch::optim::Optimizer& opt, const RefineSample& s, int64_t rounds) {
  auto coords = s.first_click;
  auto labels = torch::ones({1, 1}, torch::kLong);
  auto gt = s.gt_low_res > 0.5;
  torch::Tensor mask_input, total_loss = torch::zeros({});
  for (int64_t r = 0; r < rounds; ++r) {
    auto [sparse, dense] = pe->forward(coords, labels, torch::Tensor(), mask_input);
    auto out = dec->forward(s.embedding, pe->dense_pe(), sparse, dense, false);
    auto pred = out.low_res_logits.detach() > 0;
    auto true_iou = (pred & gt).sum().to(torch::kFloat) / (pred | gt).sum().clamp_min(1).to(torch::kFloat);
    auto loss = F::binary_cross_entropy_with_logits(out.low_res_logits, s.gt_low_res) + F::mse_loss(out.iou.view({}), true_iou);
    total_loss = total_loss + loss;  // LOOKALIKE: tensor-graph-kept-across-iterations -- backpropagated once after the loop
    mask_input = out.low_res_logits.detach();
    // FACT: x = torch.randn(4, requires_grad=True); y = (x * 2)[:2]; l = torch.nn.functional.binary_cross_entropy_with_logits(y, torch.ones(2)); d = y.detach(); d.clamp_(-0.1, 0.1); assert backward_fails(lambda: l.backward())
    mask_input.clamp_(-20.0, 20.0);  // EXPECT: tensor-inplace-on-detached
    // next click: the most confidently wrong pixel, labelled by the ground truth
    const int64_t idx = ((pred != gt).to(torch::kFloat) * out.low_res_logits.abs()).flatten().argmax().item<int64_t>();
    const int64_t grid = gt.size(-1);
    auto pt = torch::tensor({(idx % grid) * 4.0f + 2.0f, (idx / grid) * 4.0f + 2.0f}).view({1, 1, 2});
    coords = torch::cat({coords, pt.to(coords.device())}, 1);
    labels = torch::cat({labels, gt.flatten()[idx].to(torch::kLong).view({1, 1}).to(labels.device())}, 1);
  }
  opt.zero_grad();
  total_loss.backward();
  opt.step();
  for (auto& emb : pe->point_embeddings) emb->weight.div_(emb->weight.norm().clamp_min(1.0));  // EXPECT: tensor-inplace-on-leaf
  return total_loss.item<double>() / static_cast<double>(rounds);
}
