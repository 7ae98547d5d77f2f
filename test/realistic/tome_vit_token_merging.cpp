// Token Merging (ToMe) for a plain ViT. Between attention and MLP every block merges r
// tokens by bipartite soft matching on the mean attention keys; merged tokens carry a
// size so that later blocks can use proportional attention.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace tome {

namespace F = torch::nn::functional;

struct ViTConfig {
  int64_t image_size = 224, patch = 16;
  int64_t dim = 384, depth = 12, heads = 6, mlp_ratio = 4;
  int64_t num_classes = 1000;
  int64_t r = 8;              // tokens merged per block
  bool prop_attn = true;
  bool trace_source = false;
};

struct Matching {
  torch::Tensor unm_idx, src_idx, dst_idx;
  int64_t r = 0;
};

// Splits tokens into alternating sets A and B, links each A token to its most similar
// B token and keeps the r strongest links. The class token is never merged.
Matching bipartite_soft_matching(const torch::Tensor& metric, int64_t r, bool class_token) {
  Matching m;
  const int64_t t = metric.size(1);
  m.r = std::min(r, (t - (class_token ? 1 : 0)) / 2);
  if (m.r <= 0) return m;

  auto met = metric.detach();
  // FACT: k = torch.randn(2, 3, 5, 4, requires_grad=True); y = k * 2; d = y.mean(1).detach(); d.div_(d.norm(dim=-1, keepdim=True)); y.sum().backward()
  met.div_(met.norm(2, -1, true));  // LOOKALIKE: tensor-inplace-on-detached -- the key mean is only used for matching, autograd keeps no reference to it
  torch::NoGradGuard no_grad;
  auto a = met.slice(1, 0, t, 2);
  auto b = met.slice(1, 1, t, 2);
  auto scores = a.matmul(b.transpose(-1, -2));
  if (class_token) scores.select(1, 0).fill_(-std::numeric_limits<float>::infinity());

  auto best = scores.max(-1);
  auto node_max = std::get<0>(best);
  auto node_idx = std::get<1>(best);
  auto edge_idx = node_max.argsort(-1, /*descending=*/true).unsqueeze(-1);
  m.unm_idx = edge_idx.slice(1, m.r);
  m.src_idx = edge_idx.slice(1, 0, m.r);
  m.dst_idx = node_idx.unsqueeze(-1).gather(1, m.src_idx);
  if (class_token) m.unm_idx = std::get<0>(m.unm_idx.sort(1));
  return m;
}

torch::Tensor merge(const Matching& m, const torch::Tensor& x, const std::string& mode) {
  if (m.r == 0) return x;
  const int64_t t = x.size(1);
  auto src = x.slice(1, 0, t, 2);
  auto dst = x.slice(1, 1, t, 2);
  const int64_t n = src.size(0), t1 = src.size(1), c = src.size(2);
  auto unm = src.gather(1, m.unm_idx.expand({n, t1 - m.r, c}));
  auto moved = src.gather(1, m.src_idx.expand({n, m.r, c}));
  dst = dst.scatter_reduce(1, m.dst_idx.expand({n, m.r, c}), moved, mode);
  return torch::cat({unm, dst}, 1);
}

// Plain average of the merged tokens, used when no size is tracked.
torch::Tensor merge_mean(const Matching& m, const torch::Tensor& x) {
  if (m.r == 0) return x;
  const int64_t t = x.size(1);
  auto src = x.slice(1, 0, t, 2);
  auto dst = x.slice(1, 1, t, 2);
  const int64_t n = src.size(0), t1 = src.size(1), t2 = dst.size(1), c = src.size(2);
  auto unm = src.gather(1, m.unm_idx.expand({n, t1 - m.r, c}));
  auto moved = src.gather(1, m.src_idx.expand({n, m.r, c}));
  auto summed = dst.scatter_add(1, m.dst_idx.expand({n, m.r, c}), moved);
  auto counts = torch::ones({1, 1, 1}, x.options()).expand({n, t2, 1});
  // FACT: c = torch.ones(1, 1, 1).expand(2, 6, 1); assert raises(lambda: c.scatter_add_(1, torch.zeros(2, 3, 1, dtype=torch.long), torch.ones(2, 3, 1)), "more than one element")
  counts.scatter_add_(1, m.dst_idx, torch::ones({n, m.r, 1}, x.options()));  // EXPECT: tensor-inplace-on-expanded
  return torch::cat({unm, summed / counts}, 1);
}

std::pair<torch::Tensor, torch::Tensor> merge_wavg(const Matching& m, const torch::Tensor& x,
                                                   torch::Tensor size) {
  auto weighted = merge(m, x * size, "sum");
  size = merge(m, size, "sum");
  return {weighted / size, size};
}

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t dim, int64_t heads)
      : qkv(register_module("qkv", torch::nn::Linear(dim, dim * 3))),
        proj(register_module("proj", torch::nn::Linear(dim, dim))),
        heads_(heads),
        scale_(1.0 / std::sqrt(static_cast<double>(dim / heads))) {}

  // Returns the attention output and the per-token key mean used as the merge metric.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& size) {
    const int64_t B = x.size(0), N = x.size(1), C = x.size(2);
    // FACT: y = torch.randn(2, 5, 24); assert is_view_of(y.reshape(2, 5, 3, 2, 4), y)
    auto qkv_t = qkv->forward(x).reshape({B, N, 3, heads_, C / heads_}).permute({2, 0, 3, 1, 4});  // LOOKALIKE: tensor-reshape-non-contiguous -- the linear output is contiguous, the reshape is a view
    auto q = qkv_t[0], k = qkv_t[1], v = qkv_t[2];

    auto attn = q.matmul(k.transpose(-2, -1)) * scale_;
    if (size.defined()) {
      // FACT: q = torch.randn(2, 3, 4, requires_grad=True); a = (q @ q.transpose(-1, -2)) * 0.5; a.add_(torch.randn(2, 1, 3)); a.softmax(-1).sum().backward()
      attn.add_(size.log().squeeze(-1).unsqueeze(1).unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-saved -- the scaled product is saved by nothing, softmax saves its own output
    }
    attn = attn.softmax(-1);
    // FACT: o = torch.randn(2, 3, 5, 4); assert is_copy_of(o.transpose(1, 2).reshape(2, 5, 12), o)
    auto out = attn.matmul(v).transpose(1, 2).reshape({B, N, C});  // EXPECT: tensor-reshape-non-contiguous
    return {proj->forward(out), k.mean(1)};
  }

  torch::nn::Linear qkv, proj;
  int64_t heads_;
  double scale_;
};
TORCH_MODULE(Attention);

struct ToMeBlockImpl : torch::nn::Module {
  ToMeBlockImpl(int64_t dim, int64_t heads, int64_t mlp_ratio, int64_t r, bool prop_attn)
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        attn(register_module("attn", Attention(dim, heads))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", torch::nn::Linear(dim, dim * mlp_ratio))),
        fc2(register_module("fc2", torch::nn::Linear(dim * mlp_ratio, dim))),
        r_(r),
        prop_attn_(prop_attn) {}

  torch::Tensor forward(torch::Tensor x, torch::Tensor& size, torch::Tensor& source) {
    auto res = attn->forward(norm1->forward(x), prop_attn_ ? size : torch::Tensor());
    x = x + res.first;
    if (r_ > 0) {
      auto m = bipartite_soft_matching(res.second, r_, /*class_token=*/true);
      if (source.defined()) source = merge(m, source, "amax");
      if (prop_attn_) {
        std::tie(x, size) = merge_wavg(m, x, size);
      } else {
        x = merge_mean(m, x);
      }
    }
    return x + fc2->forward(F::gelu(fc1->forward(norm2->forward(x))));
  }

  torch::nn::LayerNorm norm1{nullptr};
  Attention attn{nullptr};
  torch::nn::LayerNorm norm2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  int64_t r_;
  bool prop_attn_;
};
TORCH_MODULE(ToMeBlock);

struct ToMeViTImpl : torch::nn::Module {
  explicit ToMeViTImpl(const ViTConfig& cfg) : cfg_(cfg) {
    const int64_t grid = cfg.image_size / cfg.patch;
    patch_embed = register_module(
        "patch_embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, cfg.dim, cfg.patch).stride(cfg.patch)));
    cls_token = register_parameter("cls_token", torch::zeros({1, 1, cfg.dim}));
    pos_embed = register_parameter("pos_embed", torch::zeros({1, grid * grid + 1, cfg.dim}));
    torch::nn::init::normal_(pos_embed, 0.0, 0.02);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under its own NoGradGuard
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.depth; ++i) {
      blocks->push_back(ToMeBlock(cfg.dim, cfg.heads, cfg.mlp_ratio, cfg.r, cfg.prop_attn));
    }
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    head = register_module("head", torch::nn::Linear(cfg.dim, cfg.num_classes));
  }

  int64_t grid_size() const { return cfg_.image_size / cfg_.patch; }

  torch::Tensor forward_features(const torch::Tensor& img) {
    auto x = patch_embed->forward(img).flatten(2).transpose(1, 2);
    const int64_t B = x.size(0);
    // FACT: c = torch.zeros(1, 1, 4).expand(2, 1, 4); x = torch.cat([c, torch.randn(2, 3, 4)], 1); x.add_(torch.randn(1, 4, 4)); assert is_copy_of(x, c)
    x = torch::cat({cls_token.expand({B, -1, -1}), x}, 1);
    x.add_(pos_embed);  // LOOKALIKE: tensor-inplace-on-expanded -- cat copied the expanded class token into fresh storage
    const int64_t T = x.size(1);
    torch::Tensor size = torch::ones({B, T, 1}, x.options());
    torch::Tensor source;
    if (cfg_.trace_source) source = torch::eye(T, x.options()).unsqueeze(0).expand({B, T, T});
    for (const auto& blk : *blocks) {
      x = blk->as<ToMeBlock>()->forward(x, size, source);
    }
    last_source_ = source;
    last_size_ = size;
    return norm->forward(x);
  }

  torch::Tensor forward(const torch::Tensor& img) {
    auto feats = forward_features(img);
    auto cls = feats.select(1, 0).clone();  // EXPECT: tensor-unnecessary-clone
    return head->forward(cls);
  }

  ViTConfig cfg_;
  torch::nn::Conv2d patch_embed{nullptr};
  torch::Tensor cls_token, pos_embed;
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor last_source_, last_size_;
};
TORCH_MODULE(ToMeViT);

// Resizes a checkpoint's position embedding to this model's patch grid.
void load_pos_embed(ToMeViT& model, const torch::Tensor& ckpt_pos) {
  const int64_t C = ckpt_pos.size(2);
  const int64_t old_g = std::lround(std::sqrt(static_cast<double>(ckpt_pos.size(1) - 1)));
  const int64_t new_g = model->grid_size();
  auto cls = ckpt_pos.slice(1, 0, 1);
  auto grid = ckpt_pos.slice(1, 1).reshape({1, old_g, old_g, C}).permute({0, 3, 1, 2});
  grid = F::interpolate(grid, F::InterpolateFuncOptions()
                                  .size(std::vector<int64_t>{new_g, new_g})
                                  .mode(torch::kBicubic)
                                  .align_corners(false));
  // FACT: i = torch.randn(1, 8, 6, 6); assert is_view_of(i.permute(0, 2, 3, 1).reshape(1, 36, 8), i)
  grid = grid.permute({0, 2, 3, 1}).reshape({1, new_g * new_g, C});  // LOOKALIKE: tensor-reshape-non-contiguous -- merging the two spatial dims of the permuted map is still a view
  // FACT: w = torch.nn.Parameter(torch.zeros(1, 5, 4)); assert raises(lambda: w.copy_(torch.randn(1, 5, 4)), "leaf Variable that requires grad")
  model->pos_embed.copy_(torch::cat({cls, grid}, 1));  // EXPECT: tensor-inplace-on-leaf
}

// Un-merges the final tokens back onto the patch grid through the tracked source matrix.
torch::Tensor dense_feature_map(ToMeViT& model, const torch::Tensor& tokens) {
  const int64_t B = tokens.size(0), C = tokens.size(2), g = model->grid_size();
  auto per_patch = model->last_source_.transpose(1, 2).matmul(tokens);
  // FACT: u = torch.randn(2, 17, 8); assert is_view_of(u[:, 1:].transpose(1, 2).view(2, 8, 4, 4), u)
  return per_patch.slice(1, 1).transpose(1, 2).view({B, C, g, g});  // LOOKALIKE: tensor-view-non-contiguous -- only the token dim is split, which strides allow
}

// Row-normalised source: share of each patch in every surviving token.
torch::Tensor patch_shares(torch::Tensor source) {
  // FACT: s = torch.ones(2, 3, 4); h = s; h.div_(h.sum(-1, keepdim=True)); assert shares_storage(h, s) and s[0, 0, 0].item() == 0.25
  source.div_(source.sum(-1, true));  // EXPECT: tensor-alias-then-mutate
  return source;
}

// Patch tokens as rows, for nearest-neighbour retrieval.
torch::Tensor patch_token_matrix(const torch::Tensor& tokens) {
  // FACT: x = torch.randn(2, 5, 8); assert raises(lambda: x[:, 1:].view(-1, 8), "view size is not compatible")
  return tokens.slice(1, 1).view({-1, tokens.size(2)});  // EXPECT: tensor-view-non-contiguous
}

struct EvalData {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> batches;
  torch::Tensor mean, std;
};

void evaluate(ToMeViT& model, const EvalData& data, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t correct = 0, seen = 0;
  std::vector<torch::Tensor> embeddings;
  for (const auto& batch : data.batches) {
    auto images = batch.first.to(device);  // LOOKALIKE: tensor-clone-in-loop -- every batch brings new images
    auto mean = data.mean.to(device);  // EXPECT: tensor-clone-in-loop
    images = (images - mean) / data.std;  // EXPECT: tensor-device-mismatch
    auto feats = model->forward_features(images);
    auto logits = model->head->forward(feats.select(1, 0));
    correct += logits.argmax(1).eq(batch.second.to(device)).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    seen += images.size(0);

    // FACT: x = torch.randn(2, 5, 8); e = x[:, 0].contiguous(); assert is_copy_of(e, x)
    auto emb = feats.select(1, 0).contiguous();
    emb.div_(emb.norm(2, -1, true));  // LOOKALIKE: tensor-alias-then-mutate -- the class-token row is strided, contiguous() copied it
    embeddings.push_back(emb);  // LOOKALIKE: tensor-graph-kept-across-iterations -- built under NoGradGuard, no graph is attached
    if (model->cfg_.trace_source) {
      auto shares = patch_shares(model->last_source_);
      auto fmap = dense_feature_map(model, feats);
      std::cout << "tokens kept " << shares.size(1) << " map " << fmap.sizes() << '\n';
    }
  }
  std::cout << "top1 " << static_cast<double>(correct) / static_cast<double>(seen) << " over "
            << embeddings.size() << " batches" << std::endl;
}

}  // namespace tome

int main() {
  tome::ViTConfig cfg;
  cfg.depth = 4;
  cfg.trace_source = true;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  tome::ToMeViT model(cfg);
  tome::load_pos_embed(model, torch::randn({1, 14 * 14 + 1, cfg.dim}) * 0.02);
  model->to(device);

  tome::EvalData data;
  data.mean = torch::tensor({0.485, 0.456, 0.406}).view({1, 3, 1, 1});
  data.std = torch::tensor({0.229, 0.224, 0.225}).view({1, 3, 1, 1});
  for (int i = 0; i < 4; ++i) {
    data.batches.emplace_back(torch::rand({8, 3, cfg.image_size, cfg.image_size}),
                              torch::randint(0, cfg.num_classes, {8}, torch::kLong));
  }
  tome::evaluate(model, data, device);
  auto tokens = model->forward_features(torch::rand({2, 3, cfg.image_size, cfg.image_size}).to(device));
  std::cout << "retrieval rows " << tome::patch_token_matrix(tokens).size(0) << std::endl;
}
