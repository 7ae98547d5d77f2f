// Multi-scale deformable attention (Deformable DETR) and its encoder, ported from the
// PyTorch reference path (ms_deform_attn_core_pytorch) so the model runs in a LibTorch
// build that does not ship the custom CUDA kernel.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace F = torch::nn::functional;

namespace detr {

constexpr double kPi = 3.14159265358979323846;

struct MSDeformAttnConfig {
  int64_t d_model = 256;
  int64_t n_levels = 4;
  int64_t n_heads = 8;
  int64_t n_points = 4;
  int64_t d_ffn = 1024;
  double dropout = 0.1;
  double level_drop = 0.0;  // probability of dropping a whole level for a query (training only)
};

// Sizes of the flattened feature pyramid, on the host and as a tensor.
struct LevelLayout {
  std::vector<int64_t> heights, widths;
  torch::Tensor shapes;  // [L, 2] int64, (H, W) per level

  static LevelLayout from_features(const std::vector<torch::Tensor>& feats) {
    LevelLayout lv;
    std::vector<int64_t> flat;
    for (const auto& f : feats) {
      lv.heights.push_back(f.size(2));
      lv.widths.push_back(f.size(3));
      flat.push_back(f.size(2));
      flat.push_back(f.size(3));
    }
    lv.shapes = torch::tensor(flat).view({-1, 2});
    return lv;
  }
  int64_t numel(size_t l) const { return heights[l] * widths[l]; }
};

// value: [N, S, M, D]; sampling_locations: [N, Lq, M, L, P, 2] in [0, 1];
// attention_weights: [N, Lq, M, L, P]. Returns [N, Lq, M * D].
torch::Tensor ms_deform_attn_core(const torch::Tensor& value, const LevelLayout& lv,
                                  const torch::Tensor& sampling_locations,
                                  const torch::Tensor& attention_weights) {
  const int64_t N = value.size(0), M = value.size(2), D = value.size(3);
  const int64_t Lq = sampling_locations.size(1);
  const int64_t L = sampling_locations.size(3), P = sampling_locations.size(4);

  std::vector<int64_t> split_sizes;
  for (size_t l = 0; l < lv.heights.size(); ++l) split_sizes.push_back(lv.numel(l));
  auto value_list = value.split_with_sizes(split_sizes, 1);
  auto sampling_grids = 2 * sampling_locations - 1;

  const auto gs_opts = F::GridSampleFuncOptions()
                           .mode(torch::kBilinear)
                           .padding_mode(torch::kZeros)
                           .align_corners(false);
  std::vector<torch::Tensor> sampled;
  sampled.reserve(L);
  for (int64_t lvl = 0; lvl < L; ++lvl) {
    // FACT: v = torch.randn(2, 30, 4, 8); s = v.split([12, 18], 1)[0]; assert not is_contiguous(s) and is_view_of(s.flatten(2), v)
    auto v_flat = value_list[lvl].flatten(2);  // LOOKALIKE: tensor-reshape-non-contiguous -- merges only the trailing [M, D] dims of the level slice, which stay adjacent: a view
    // (N, H*W, M*D) -> (N*M, D, H, W)
    // FACT: v = torch.randn(2, 30, 4, 8); s = v.split([12, 18], 1)[0]; assert is_copy_of(s.flatten(2).transpose(1, 2).reshape(8, 8, 3, 4), v)
    auto value_l = v_flat.transpose(1, 2).reshape({N * M, D, lv.heights[lvl], lv.widths[lvl]});  // EXPECT: tensor-reshape-non-contiguous
    // (N, Lq, M, P, 2) -> (N*M, Lq, P, 2)
    // FACT: g = torch.rand(2, 5, 4, 3, 6, 2); assert is_copy_of(g.select(3, 1).transpose(1, 2).flatten(0, 1), g)
    auto grid_l = sampling_grids.select(3, lvl).transpose(1, 2).flatten(0, 1);  // EXPECT: tensor-reshape-non-contiguous
    sampled.push_back(F::grid_sample(value_l, grid_l, gs_opts));  // LOOKALIKE: tensor-graph-kept-across-iterations -- per-level samples of one forward, stacked and returned for backward
  }
  // (N, Lq, M, L, P) -> (N*M, 1, Lq, L*P)
  // FACT: a = torch.rand(2, 5, 4, 3, 6); assert raises(lambda: a.transpose(1, 2).view(8, 1, 5, 18), "view size is not compatible")
  auto attn = attention_weights.transpose(1, 2).view({N * M, 1, Lq, L * P});  // EXPECT: tensor-view-non-contiguous
  auto weighted = torch::stack(sampled, -2).flatten(-2) * attn;  // [N*M, D, Lq, L*P]
  // FACT: w = torch.rand(8, 16, 5, 18); o = w.sum(-1); assert is_contiguous(o) and is_view_of(o.view(2, 64, 5), o)
  auto out = weighted.sum(-1).view({N, M * D, Lq});  // LOOKALIKE: tensor-view-non-contiguous -- sum(-1) returns a fresh contiguous [N*M, D, Lq]; splitting dim 0 is a view
  return out.transpose(1, 2).contiguous();
}

struct MSDeformAttnImpl : torch::nn::Module {
  explicit MSDeformAttnImpl(const MSDeformAttnConfig& c) : cfg(c) {
    TORCH_CHECK(cfg.d_model % cfg.n_heads == 0, "d_model must be divisible by n_heads");
    const int64_t hlp = cfg.n_heads * cfg.n_levels * cfg.n_points;
    sampling_offsets = register_module("sampling_offsets", torch::nn::Linear(cfg.d_model, hlp * 2));
    attention_weights = register_module("attention_weights", torch::nn::Linear(cfg.d_model, hlp));
    value_proj = register_module("value_proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
    output_proj = register_module("output_proj", torch::nn::Linear(cfg.d_model, cfg.d_model));
    reset_parameters();
  }

  void reset_parameters() {
    const int64_t H = cfg.n_heads, L = cfg.n_levels, P = cfg.n_points;
    torch::nn::init::constant_(sampling_offsets->weight, 0.0);
    // Head h starts looking along direction 2*pi*h/H, point p at distance p + 1.
    auto thetas = torch::arange(H, torch::kFloat) * (2.0 * kPi / static_cast<double>(H));
    auto grid_init = torch::stack({thetas.cos(), thetas.sin()}, -1);
    grid_init = (grid_init / std::get<0>(grid_init.abs().max(-1, true)))
                    .view({H, 1, 1, 2})
                    .repeat({1, L, P, 1});
    for (int64_t p = 0; p < P; ++p) grid_init.select(2, p).mul_(static_cast<double>(p + 1));
    {
      torch::NoGradGuard no_grad;
      sampling_offsets->bias.copy_(grid_init.view({-1}));  // LOOKALIKE: tensor-inplace-on-leaf -- written under NoGradGuard
    }
    torch::nn::init::constant_(attention_weights->weight, 0.0);
    torch::nn::init::constant_(attention_weights->bias, 0.0);
    torch::nn::init::xavier_uniform_(value_proj->weight);
    value_proj->bias.fill_(0.0);  // EXPECT: tensor-inplace-on-leaf
    torch::nn::init::xavier_uniform_(output_proj->weight);
    torch::nn::init::constant_(output_proj->bias, 0.0);
  }

  // query: [N, Lq, C]; reference_points: [N, Lq, L, 2] in [0, 1]; input_flatten: [N, S, C];
  // padding_mask: [N, S], true where padded (may be undefined).
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& reference_points,
                        const torch::Tensor& input_flatten, const LevelLayout& lv,
                        const torch::Tensor& padding_mask) {
    const int64_t N = query.size(0), Lq = query.size(1), S = input_flatten.size(1);
    const int64_t H = cfg.n_heads, L = cfg.n_levels, P = cfg.n_points;
    TORCH_CHECK(static_cast<int64_t>(lv.heights.size()) == L, "expected ", L, " levels");

    auto value = value_proj(input_flatten);
    if (padding_mask.defined())
      value.masked_fill_(padding_mask.unsqueeze(-1), 0.0);  // LOOKALIKE: tensor-inplace-on-saved -- Linear does not save its output for backward
    value = value.view({N, S, H, cfg.d_model / H});

    auto offsets = sampling_offsets(query).view({N, Lq, H, L, P, 2});
    auto attn = F::softmax(attention_weights(query).view({N, Lq, H, L * P}), -1);
    if (is_training() && cfg.level_drop > 0.0) {
      auto keep = torch::bernoulli(torch::full({N, Lq, 1, L, 1}, 1.0 - cfg.level_drop, attn.options()));
      // FACT: x = torch.randn(2, 6, requires_grad=True); a = torch.softmax(x, -1); a.view(2, 3, 2).mul_(torch.ones(2, 1, 2)); assert backward_fails(lambda: a.sum().backward())
      attn.view({N, Lq, H, L, P}).mul_(keep);  // EXPECT: tensor-inplace-on-saved
      attn = attn / attn.sum(-1, true).clamp_min(1e-6);
    }

    // (W, H) per level, so offsets are in units of the level's cells.
    auto offset_normalizer =
        torch::stack({lv.shapes.select(1, 1), lv.shapes.select(1, 0)}, -1).to(query.options());
    auto sampling_locations = reference_points.view({N, Lq, 1, L, 1, 2}) +
                              offsets / offset_normalizer.view({1, 1, 1, L, 1, 2});
    auto out = ms_deform_attn_core(value, lv, sampling_locations, attn.view({N, Lq, H, L, P}));
    return output_proj(out);
  }

  MSDeformAttnConfig cfg;
  torch::nn::Linear sampling_offsets{nullptr}, attention_weights{nullptr};
  torch::nn::Linear value_proj{nullptr}, output_proj{nullptr};
};
TORCH_MODULE(MSDeformAttn);

struct EncoderLayerImpl : torch::nn::Module {
  explicit EncoderLayerImpl(const MSDeformAttnConfig& c)
      : self_attn(register_module("self_attn", MSDeformAttn(c))),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})))),
        linear1(register_module("linear1", torch::nn::Linear(c.d_model, c.d_ffn))),
        linear2(register_module("linear2", torch::nn::Linear(c.d_ffn, c.d_model))),
        dropout1(register_module("dropout1", torch::nn::Dropout(c.dropout))),
        dropout2(register_module("dropout2", torch::nn::Dropout(c.dropout))),
        dropout3(register_module("dropout3", torch::nn::Dropout(c.dropout))) {}

  torch::Tensor forward(torch::Tensor src, const torch::Tensor& pos, const torch::Tensor& reference_points,
                        const LevelLayout& lv, const torch::Tensor& padding_mask) {
    // FACT: s = torch.randn(2, 5, 8); q = s; q += torch.randn(2, 5, 8); assert shares_storage(q, s)
    torch::Tensor query = src;
    if (pos.defined()) query += pos;  // EXPECT: tensor-alias-then-mutate
    auto src2 = self_attn(query, reference_points, src, lv, padding_mask);
    src = norm1(src + dropout1(src2));

    auto ffn = dropout3(linear2(dropout2(F::relu(linear1(src)))));
    // FACT: l = torch.nn.Linear(8, 8); x = torch.randn(2, 5, 8); o = l(x); assert is_copy_of(o, x)
    ffn += src;  // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-on-saved -- ffn is Linear's fresh output with no other handle, and Linear does not save its output
    return norm2(ffn);
  }

  MSDeformAttn self_attn;
  torch::nn::LayerNorm norm1, norm2;
  torch::nn::Linear linear1, linear2;
  torch::nn::Dropout dropout1, dropout2, dropout3;
};
TORCH_MODULE(EncoderLayer);

struct MultiScaleEncoderImpl : torch::nn::Module {
  MultiScaleEncoderImpl(const MSDeformAttnConfig& c, int64_t num_layers) : cfg(c) {
    level_embed = register_parameter("level_embed", torch::empty({c.n_levels, c.d_model}));
    torch::nn::init::normal_(level_embed);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init writes under no-grad
    for (int64_t i = 0; i < num_layers; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), EncoderLayer(c)));
  }

  // Reference point of every flattened pixel on every level: [N, S, L, 2].
  static torch::Tensor reference_points(const LevelLayout& lv, const torch::Tensor& valid_ratios) {
    const auto opts = valid_ratios.options();
    std::vector<torch::Tensor> per_level;
    for (size_t lvl = 0; lvl < lv.heights.size(); ++lvl) {
      const int64_t H = lv.heights[lvl], W = lv.widths[lvl];
      auto ys = torch::linspace(0.5, H - 0.5, H, opts);
      auto xs = torch::linspace(0.5, W - 0.5, W, opts);
      // FACT: ys = torch.linspace(0.5, 2.5, 3); xs = torch.linspace(0.5, 3.5, 4); g = torch.stack((xs[None].expand(3, 4), ys[:, None].expand(3, 4)), -1); assert is_view_of(g.reshape(1, 12, 2), g)
      auto grid = torch::stack({xs.unsqueeze(0).expand({H, W}), ys.unsqueeze(1).expand({H, W})}, -1).reshape({1, H * W, 2});  // LOOKALIKE: tensor-reshape-non-contiguous -- stack writes a fresh contiguous [H, W, 2]: the reshape is a view
      // FACT: v = torch.rand(3, 4, 2); s = v.select(1, 1); assert not is_contiguous(s) and is_view_of(s.view(-1, 1, 2), v)
      auto ratio = valid_ratios.select(1, static_cast<int64_t>(lvl)).view({-1, 1, 2});  // LOOKALIKE: tensor-view-non-contiguous -- only inserts a size-1 dim into the strided [N, 2] slice: expressible with strides
      auto wh = torch::tensor({static_cast<double>(W), static_cast<double>(H)}, opts);
      per_level.push_back(grid / (ratio * wh));
    }
    auto ref = torch::cat(per_level, 1);                  // [N, S, 2]
    return ref.unsqueeze(2) * valid_ratios.unsqueeze(1);  // [N, S, L, 2]
  }

  // mask: [N, H, W], true where padded. Returns (w, h) fractions of valid pixels: [N, 2].
  static torch::Tensor valid_ratio(const torch::Tensor& mask) {
    auto valid = mask.logical_not();
    auto valid_h = valid.select(2, 0).sum(1).to(torch::kFloat);
    auto valid_w = valid.select(1, 0).sum(1).to(torch::kFloat);
    return torch::stack({valid_w / static_cast<double>(mask.size(2)), valid_h / static_cast<double>(mask.size(1))}, -1);
  }

  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& feats,
                                     const std::vector<torch::Tensor>& masks,
                                     const std::vector<torch::Tensor>& pos_embeds) {
    auto lv = LevelLayout::from_features(feats);
    std::vector<torch::Tensor> src_flat, mask_flat, pos_flat, ratios;
    for (size_t l = 0; l < feats.size(); ++l) {
      src_flat.push_back(feats[l].flatten(2).transpose(1, 2));  // [N, H*W, C]
      mask_flat.push_back(masks[l].flatten(1));
      auto lvl_pos = pos_embeds[l].flatten(2).transpose(1, 2) + level_embed[static_cast<int64_t>(l)].view({1, 1, -1});
      pos_flat.push_back(lvl_pos);
      ratios.push_back(valid_ratio(masks[l]));
    }
    auto valid_ratios = torch::stack(ratios, 1);  // [N, L, 2]
    auto ref = reference_points(lv, valid_ratios);
    auto padding = torch::cat(mask_flat, 1);
    auto pos = torch::cat(pos_flat, 1);

    torch::Tensor memory = torch::cat(src_flat, 1);
    for (auto& layer : layers) memory = layer(memory, pos, ref, lv, padding);

    // Split the memory back into per-level maps [N, C, H, W] for the detection head.
    std::vector<torch::Tensor> outs;
    const int64_t B = memory.size(0), C = memory.size(2);
    int64_t start = 0;
    for (size_t l = 0; l < lv.heights.size(); ++l) {
      const int64_t h = lv.heights[l], w = lv.widths[l];
      // FACT: m = torch.randn(2, 30, 8); assert is_view_of(m.narrow(1, 6, 12).transpose(1, 2).view(2, 8, 3, 4), m)
      outs.push_back(memory.narrow(1, start, h * w).transpose(1, 2).view({B, C, h, w}));  // LOOKALIKE: tensor-view-non-contiguous -- only the H*W dim is split; batch and channel strides stay as they are
      start += h * w;
    }
    return outs;
  }

  MSDeformAttnConfig cfg;
  torch::Tensor level_embed;
  std::vector<EncoderLayer> layers;
};
TORCH_MODULE(MultiScaleEncoder);

// Overfit check run by the model's smoke test: a few hundred steps on one fixed pyramid
// should drive the reconstruction loss well down.
double overfit_check(MultiScaleEncoder& model, const std::vector<torch::Tensor>& feats,
                     const std::vector<torch::Tensor>& masks, const std::vector<torch::Tensor>& pos,
                     const std::vector<torch::Tensor>& targets, int steps) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-4));
  model->train();
  std::vector<torch::Tensor> history;
  for (int step = 0; step < steps; ++step) {
    auto outs = model->forward(feats, masks, pos);
    torch::Tensor loss = torch::zeros({});
    for (size_t l = 0; l < outs.size(); ++l)
      loss = loss + F::mse_loss(outs[l], targets[l]);  // LOOKALIKE: tensor-graph-kept-across-iterations -- summed over levels of one step, then backpropagated
    opt.zero_grad();
    loss.backward();
    opt.step();
    history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
  }
  auto tail = torch::stack(history).narrow(0, steps / 2, steps - steps / 2);
  const double mean_tail = tail.mean().item<double>();
  std::cout << "overfit check: mean loss over last half = " << mean_tail << "\n";
  return mean_tail;
}

}  // namespace detr
