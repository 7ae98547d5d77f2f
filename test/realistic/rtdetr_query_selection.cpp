// RT-DETR style detector: hybrid encoder, top-k query selection, iterative box refinement.
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace F = torch::nn::functional;
using torch::Tensor;

struct DetOut { Tensor logits, boxes, enc_logits, enc_boxes; };
struct Target { Tensor labels, boxes; };  // normalized cx, cy, w, h
struct Detections { Tensor scores, labels, boxes; };  // top max_dets per image, boxes in pixels
struct Dataset { std::vector<Tensor> images, labels, boxes; };  // COCO-style pixel x, y, w, h
struct DetrConfig {
  int64_t num_classes = 80, hidden = 256, num_queries = 300, heads = 8, dec_layers = 6, ffn = 1024;
  int64_t img_size = 640, batch_size = 4, max_dets = 100, epochs = 2;
  double dropout = 0.1, alpha = 0.25, gamma = 2.0, lr = 1e-4, score_thresh = 0.5;
  double cls_weight = 2.0, l1_weight = 5.0, giou_weight = 2.0;
};

struct ConvNormImpl : torch::nn::Module {
  ConvNormImpl(int64_t in, int64_t out, int64_t k, int64_t stride)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false)))),
        bn(register_module("bn", torch::nn::BatchNorm2d(out))) {}
  Tensor forward(const Tensor& x) { return torch::silu(bn(conv(x))); }
  torch::nn::Conv2d conv;
  torch::nn::BatchNorm2d bn;
};
TORCH_MODULE(ConvNorm);

torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out, int64_t n) {
  torch::nn::Sequential seq;
  for (int64_t i = 0; i < n; ++i) {
    seq->push_back(torch::nn::Linear(i == 0 ? in : hidden, i == n - 1 ? out : hidden));
    if (i + 1 < n) seq->push_back(torch::nn::ReLU());
  }
  return seq;
}

Tensor box_cxcywh_to_xyxy(const Tensor& b) {
  auto c = b.unbind(-1);
  return torch::stack({c[0] - 0.5 * c[2], c[1] - 0.5 * c[3], c[0] + 0.5 * c[2], c[1] + 0.5 * c[3]}, -1);
}

// elementwise (broadcasting) generalized IoU of xyxy boxes
Tensor generalized_iou(const Tensor& a, const Tensor& b) {
  auto area = [](const Tensor& x) { return (x.select(-1, 2) - x.select(-1, 0)) * (x.select(-1, 3) - x.select(-1, 1)); };
  auto wh = (torch::min(a.narrow(-1, 2, 2), b.narrow(-1, 2, 2)) - torch::max(a.narrow(-1, 0, 2), b.narrow(-1, 0, 2))).clamp_min(0);
  auto inter = wh.select(-1, 0) * wh.select(-1, 1);
  auto uni = area(a) + area(b) - inter;
  auto hull = torch::max(a.narrow(-1, 2, 2), b.narrow(-1, 2, 2)) - torch::min(a.narrow(-1, 0, 2), b.narrow(-1, 0, 2));
  auto area_c = hull.select(-1, 0) * hull.select(-1, 1);
  return inter / uni - (area_c - uni) / area_c;
}

Tensor inverse_sigmoid(Tensor x, double eps = 1e-5) {
  // FACT: z = torch.randn(3, requires_grad=True); r = torch.sigmoid(z); assert backward_fails(lambda: (r.detach().clamp_(0, 1), r.sum().backward()))
  x.clamp_(0.0, 1.0); // EXPECT: tensor-inplace-on-detached
  return torch::log(x.clamp_min(eps) / (1 - x).clamp_min(eps));
}

Tensor sincos_pos_embed(int64_t h, int64_t w, int64_t dim, const torch::TensorOptions& opts) {
  auto omega = 1.0 / torch::pow(10000.0, torch::arange(dim / 4, opts) / (dim / 4));
  auto gy = torch::arange(h, opts).repeat_interleave(w).unsqueeze(1) * omega, gx = torch::arange(w, opts).repeat({h}).unsqueeze(1) * omega;
  return torch::cat({gx.sin(), gx.cos(), gy.sin(), gy.cos()}, 1);
}

struct HybridEncoderImpl : torch::nn::Module {
  explicit HybridEncoderImpl(const DetrConfig& c) {
    const int64_t d = c.hidden;
    for (int64_t in : {128, 256, 512}) proj->push_back(ConvNorm(in, d, 1, 1));
    register_module("proj", proj);
    aifi = register_module("aifi", torch::nn::TransformerEncoderLayer(
        torch::nn::TransformerEncoderLayerOptions(d, c.heads).dim_feedforward(c.ffn).dropout(c.dropout)));
    td4 = register_module("td4", ConvNorm(2 * d, d, 3, 1)), td3 = register_module("td3", ConvNorm(2 * d, d, 3, 1));
    bu4 = register_module("bu4", ConvNorm(2 * d, d, 3, 1)), bu5 = register_module("bu5", ConvNorm(2 * d, d, 3, 1));
    down3 = register_module("down3", ConvNorm(d, d, 3, 2)), down4 = register_module("down4", ConvNorm(d, d, 3, 2));
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& feats) {
    std::vector<Tensor> p;
    for (size_t i = 0; i < feats.size(); ++i) p.push_back(proj[i]->as<ConvNorm>()->forward(feats[i]));
    const auto B = p[2].size(0), C = p[2].size(1), H = p[2].size(2), W = p[2].size(3);
    auto src = p[2].flatten(2).permute({2, 0, 1});
    auto mem = aifi(src + sincos_pos_embed(H, W, C, src.options()).unsqueeze(1));
    // FACT: m = torch.nn.TransformerEncoderLayer(8, 2, 16)(torch.randn(2, 8, 3, 3).flatten(2).permute(2, 0, 1)); assert is_view_of(m.permute(1, 2, 0).reshape(2, 8, 3, 3), m)
    p[2] = mem.permute({1, 2, 0}).reshape({B, C, H, W}); // LOOKALIKE: tensor-reshape-non-contiguous -- only the HW dim is split back into H, W, which strides can express
    auto up = [](const Tensor& x) { return F::interpolate(x, F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest)); };
    auto inner4 = td4(torch::cat({up(p[2]), p[1]}, 1));
    auto inner3 = td3(torch::cat({up(inner4), p[0]}, 1));
    auto out4 = bu4(torch::cat({down3(inner3), inner4}, 1));
    auto out5 = bu5(torch::cat({down4(out4), p[2]}, 1));
    return {inner3, out4, out5};
  }
  torch::nn::ModuleList proj;
  torch::nn::TransformerEncoderLayer aifi{nullptr};
  ConvNorm td4{nullptr}, td3{nullptr}, bu4{nullptr}, bu5{nullptr}, down3{nullptr}, down4{nullptr};
};
TORCH_MODULE(HybridEncoder);

struct DecoderLayerImpl : torch::nn::Module {
  explicit DecoderLayerImpl(const DetrConfig& c)
      : self_attn(register_module("self_attn", torch::nn::MultiheadAttention(c.hidden, c.heads))), cross_attn(register_module("cross_attn", torch::nn::MultiheadAttention(c.hidden, c.heads))),
        linear1(register_module("linear1", torch::nn::Linear(c.hidden, c.ffn))), linear2(register_module("linear2", torch::nn::Linear(c.ffn, c.hidden))),
        norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))), norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        norm3(register_module("norm3", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})))),
        dropout(c.dropout) {}
  Tensor forward(Tensor tgt, const Tensor& query_pos, const Tensor& memory) {
    auto q = tgt + query_pos;
    tgt = norm1(tgt + std::get<0>(self_attn->forward(q, q, tgt)));
    tgt = norm2(tgt + std::get<0>(cross_attn->forward(tgt + query_pos, memory, memory)));
    auto h = torch::relu(linear1(tgt));
    // FACT: a = torch.randn(4, 5, requires_grad=True); h = torch.relu(a); assert backward_fails(lambda: (torch.dropout_(h, 0.5, True), h.sum().backward()))
    torch::dropout_(h, dropout, is_training()); // EXPECT: tensor-inplace-on-saved
    return norm3(tgt + linear2(h));
  }
  torch::nn::MultiheadAttention self_attn, cross_attn;
  torch::nn::Linear linear1, linear2;
  torch::nn::LayerNorm norm1, norm2, norm3;
  double dropout;
};
TORCH_MODULE(DecoderLayer);

std::pair<Tensor, Tensor> make_anchors(int64_t img_size, double grid_size = 0.05) {
  std::vector<Tensor> all;
  for (int64_t lvl = 0; lvl < 3; ++lvl) {
    const int64_t h = img_size / (8 << lvl), w = h;
    auto grid = torch::meshgrid({torch::arange(h, torch::kFloat), torch::arange(w, torch::kFloat)}, "ij");
    // FACT: g = torch.meshgrid(torch.arange(3.), torch.arange(4.), indexing="ij"); s = torch.stack([g[1], g[0]], -1); assert g[1].stride()[0] == 0 and is_copy_of(s, g[1]) and not raises(lambda: s.add_(0.5))
    auto xy = torch::stack({grid[1], grid[0]}, -1);
    xy.add_(0.5).div_(torch::tensor({static_cast<float>(w), static_cast<float>(h)})); // LOOKALIKE: tensor-inplace-on-expanded -- stack copied the expanded meshgrid outputs into a fresh tensor
    all.push_back(torch::cat({xy, torch::full_like(xy, grid_size * std::pow(2.0, lvl))}, -1).reshape({1, h * w, 4}));
  }
  auto anchors = torch::cat(all, 1);
  auto valid = ((anchors > 0.01) & (anchors < 0.99)).all(-1, /*keepdim=*/true);
  anchors = torch::log(anchors / (1 - anchors)).masked_fill(valid.logical_not(), std::numeric_limits<float>::infinity());
  return {anchors, valid};
}

struct RTDETRImpl : torch::nn::Module {
  explicit RTDETRImpl(const DetrConfig& c) : cfg(c) {
    stem = register_module("stem", torch::nn::Sequential(ConvNorm(3, 32, 3, 2), ConvNorm(32, 64, 3, 2), ConvNorm(64, 128, 3, 2)));
    c4 = register_module("c4", ConvNorm(128, 256, 3, 2)), c5 = register_module("c5", ConvNorm(256, 512, 3, 2));
    encoder = register_module("encoder", HybridEncoder(c));
    enc_output = register_module("enc_output", torch::nn::Sequential(torch::nn::Linear(c.hidden, c.hidden), torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden}))));
    enc_score_head = register_module("enc_score_head", torch::nn::Linear(c.hidden, c.num_classes));
    enc_bbox_head = register_module("enc_bbox_head", mlp(c.hidden, c.hidden, 4, 3));
    query_pos_head = register_module("query_pos_head", mlp(4, 2 * c.hidden, c.hidden, 2));
    for (int64_t i = 0; i < c.dec_layers; ++i) {
      dec_layers->push_back(DecoderLayer(c));
      dec_score_heads->push_back(torch::nn::Linear(c.hidden, c.num_classes));
      dec_bbox_heads->push_back(mlp(c.hidden, c.hidden, 4, 3));
    }
    register_module("dec_layers", dec_layers), register_module("dec_score_heads", dec_score_heads), register_module("dec_bbox_heads", dec_bbox_heads);
    auto anc = make_anchors(c.img_size);
    anchors = register_buffer("anchors", anc.first), valid_mask = register_buffer("valid_mask", anc.second);
  }
  DetOut forward(const Tensor& images) {
    auto s3 = stem->forward(images), s4 = c4(s3);
    std::vector<Tensor> flat;
    for (auto& f : encoder(std::vector<Tensor>{s3, s4, c5(s4)})) flat.push_back(f.flatten(2).permute({0, 2, 1}));
    auto memory = torch::cat(flat, 1);
    auto out_memory = enc_output->forward(memory.masked_fill(valid_mask.logical_not(), 0.0));
    auto enc_logits = enc_score_head(out_memory);
    auto enc_coord = anchors.expand({memory.size(0), -1, -1});
    // FACT: a = torch.zeros(1, 6, 4); assert raises(lambda: a.expand(2, -1, -1).add_(torch.ones(2, 6, 4)), "more than one element")
    enc_coord.add_(enc_bbox_head->forward(out_memory)); // EXPECT: tensor-inplace-on-expanded
    auto top_idx = std::get<1>(std::get<0>(enc_logits.max(-1)).topk(cfg.num_queries, 1));
    auto take = [&](const Tensor& src) { return src.gather(1, top_idx.unsqueeze(-1).repeat({1, 1, src.size(-1)})); };
    auto ref_unact = take(enc_coord);
    auto dec = decode(take(out_memory).detach(), ref_unact.detach(), memory);
    return {dec.first, dec.second, take(enc_logits), torch::sigmoid(ref_unact)};
  }
  // per-layer logits and boxes; the layers run sequence-first like nn::MultiheadAttention
  std::pair<Tensor, Tensor> decode(const Tensor& target, const Tensor& ref_unact, const Tensor& memory) {
    auto out = target.transpose(0, 1);
    auto ref = torch::sigmoid(ref_unact.transpose(0, 1));
    std::vector<Tensor> logits, boxes;
    for (size_t i = 0; i < dec_layers->size(); ++i) {
      auto mem = memory.transpose(0, 1).contiguous(); // EXPECT: tensor-clone-in-loop
      out = dec_layers[i]->as<DecoderLayer>()->forward(out, query_pos_head->forward(ref), mem);
      auto new_ref = torch::sigmoid(dec_bbox_heads[i]->as<torch::nn::Sequential>()->forward(out) + inverse_sigmoid(ref));
      logits.push_back(dec_score_heads[i]->as<torch::nn::Linear>()->forward(out));
      boxes.push_back(new_ref);
      ref = new_ref.detach();
    }
    return {torch::stack(logits).transpose(1, 2), torch::stack(boxes).transpose(1, 2)};
  }
  DetrConfig cfg;
  torch::nn::Sequential stem{nullptr}, enc_output{nullptr};
  ConvNorm c4{nullptr}, c5{nullptr};
  HybridEncoder encoder{nullptr};
  torch::nn::Linear enc_score_head{nullptr};
  torch::nn::Sequential enc_bbox_head{nullptr}, query_pos_head{nullptr};
  torch::nn::ModuleList dec_layers, dec_score_heads, dec_bbox_heads;
  Tensor anchors, valid_mask;
};
TORCH_MODULE(RTDETR);

// greedy one-to-one assignment on the DETR matching cost (stands in for the Hungarian solver)
Tensor greedy_match(const Tensor& logits, const Tensor& boxes, const Target& tgt, const DetrConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto cost = -cfg.cls_weight * torch::sigmoid(logits).index_select(1, tgt.labels) +
              cfg.l1_weight * torch::cdist(boxes, tgt.boxes, 1.0) -
              cfg.giou_weight * generalized_iou(box_cxcywh_to_xyxy(boxes).unsqueeze(1), box_cxcywh_to_xyxy(tgt.boxes).unsqueeze(0));
  std::vector<int64_t> picked;
  for (int64_t g = 0; g < tgt.labels.size(0); ++g) {
    const auto q = cost.select(1, g).argmin().item<int64_t>(); // LOOKALIKE: tensor-sync-in-loop -- the host needs the index to retire that query before the next pick
    picked.push_back(q);
    cost.select(0, q).fill_(1e4);
  }
  return torch::tensor(picked, tgt.labels.options());
}

Tensor set_loss(const Tensor& logits, const Tensor& boxes, const std::vector<Target>& tgts, const DetrConfig& cfg) {
  const auto B = logits.size(0), Q = logits.size(1), K = logits.size(2);
  auto cls_target = torch::zeros({B, Q, K}, logits.options());
  std::vector<Tensor> src_boxes, tgt_boxes;
  for (int64_t b = 0; b < B; ++b) {
    auto qidx = greedy_match(logits[b], boxes[b], tgts[b], cfg);
    cls_target[b].index_put_({qidx, tgts[b].labels}, 1.0);
    src_boxes.push_back(boxes[b].index_select(0, qidx));
    tgt_boxes.push_back(tgts[b].boxes);
  }
  auto sb = torch::cat(src_boxes), tb = torch::cat(tgt_boxes);
  auto num_boxes = torch::tensor(static_cast<float>(std::max<int64_t>(tb.size(0), 1)));
  // FACT: l = torch.randn(2, 5, 3, 4).transpose(1, 2)[0]; assert raises(lambda: l.view(-1, 4), "view size is not compatible")
  auto flat_logits = logits.view({-1, K}); // EXPECT: tensor-view-non-contiguous
  // FACT: t = torch.zeros(3, 5, 4); assert is_contiguous(t) and is_view_of(t.view(-1, 4), t)
  auto flat_tgt = cls_target.view({-1, K}); // LOOKALIKE: tensor-view-non-contiguous -- cls_target was allocated contiguous by zeros()
  auto prob = torch::sigmoid(flat_logits);
  auto ce = F::binary_cross_entropy_with_logits(flat_logits, flat_tgt, F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kNone));
  auto modulator = 1 - (prob * flat_tgt + (1 - prob) * (1 - flat_tgt));
  // FACT: a = torch.rand(4, requires_grad=True); m = 1 - a; assert not backward_fails(lambda: (m.pow_(2.0), m.sum().backward()))
  modulator.pow_(cfg.gamma); // LOOKALIKE: tensor-inplace-on-saved -- `1 - p_t` is a fresh result no backward node keeps
  auto alpha_t = cfg.alpha * flat_tgt + (1 - cfg.alpha) * (1 - flat_tgt);
  auto loss_cls = (alpha_t * ce * modulator).sum() / num_boxes; // LOOKALIKE: tensor-device-mismatch -- num_boxes is a 0-dim CPU tensor, which may mix with CUDA operands
  auto loss_l1 = (sb - tb).abs().sum() / num_boxes;
  auto loss_giou = (1 - generalized_iou(box_cxcywh_to_xyxy(sb), box_cxcywh_to_xyxy(tb))).sum() / num_boxes;
  return cfg.cls_weight * loss_cls + cfg.l1_weight * loss_l1 + cfg.giou_weight * loss_giou;
}

Tensor detr_loss(const DetOut& out, const std::vector<Target>& tgts, const DetrConfig& cfg) {
  std::vector<Tensor> terms;
  for (int64_t l = 0; l < out.logits.size(0); ++l)
    terms.push_back(set_loss(out.logits[l], out.boxes[l], tgts, cfg)); // LOOKALIKE: tensor-graph-kept-across-iterations -- deep-supervision terms of one step, summed and backpropagated together
  terms.push_back(set_loss(out.enc_logits, out.enc_boxes, tgts, cfg));
  return torch::stack(terms).sum();
}

Detections postprocess(const DetOut& out, const Tensor& orig_sizes, const DetrConfig& cfg) {
  auto boxes = box_cxcywh_to_xyxy(out.boxes.select(0, -1));
  // FACT: b = torch.rand(3, 5, 4); c = b.unbind(-1); o = torch.stack([c[0] - 0.5 * c[2], c[1] - 0.5 * c[3], c[0] + 0.5 * c[2], c[1] + 0.5 * c[3]], -1); assert is_copy_of(o, b)
  boxes.clamp_(0.0, 1.0); // LOOKALIKE: tensor-alias-then-mutate -- the conversion stacks new coordinates, the decoder output is untouched
  boxes = boxes * orig_sizes.repeat({1, 2}).unsqueeze(1); // EXPECT: tensor-device-mismatch
  // FACT: l = torch.randn(2, 5, 3, 4).transpose(1, 2)[-1]; s = torch.sigmoid(l); assert not is_contiguous(s) and is_copy_of(s.flatten(1), s)
  auto scores = torch::sigmoid(out.logits.select(0, -1)).flatten(1); // EXPECT: tensor-reshape-non-contiguous
  auto top = scores.topk(cfg.max_dets, 1);
  auto labels = std::get<1>(top).remainder(cfg.num_classes);
  auto sel = boxes.gather(1, std::get<1>(top).div(cfg.num_classes, "floor").unsqueeze(-1).repeat({1, 1, 4}));
  // FACT: s = torch.rand(2, 3, 4); r = s[..., 2:] - s[..., :2]; s[..., 2:].sub_(s[..., :2]); assert torch.equal(s[..., 2:], r)
  sel.narrow(-1, 2, 2).sub_(sel.narrow(-1, 0, 2)); // LOOKALIKE: tensor-inplace-overlap -- x2,y2 and x1,y1 are disjoint columns of one buffer
  return {std::get<0>(top), labels, sel};
}

void train(RTDETR& model, Dataset& ds, const DetrConfig& cfg, torch::Device device) {
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr).weight_decay(1e-4));
  auto pixel_mean = torch::tensor({0.485f, 0.456f, 0.406f}).view({3, 1, 1});
  auto pixel_std = torch::tensor({0.229f, 0.224f, 0.225f}).view({3, 1, 1});
  for (int epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    auto epoch_loss = torch::zeros({}, device);
    for (size_t start = 0; start + cfg.batch_size <= ds.images.size(); start += cfg.batch_size) {
      std::vector<Tensor> imgs;
      std::vector<Target> tgts;
      for (size_t i = start; i < start + cfg.batch_size; ++i) {
        auto img = ds.images[i];
        // FACT: imgs = [torch.rand(3, 4, 4)]; img = imgs[0]; img.sub_(0.5).div_(0.25); assert shares_storage(img, imgs[0]) and imgs[0].min() < 0
        img.sub_(pixel_mean).div_(pixel_std); // EXPECT: tensor-alias-then-mutate
        imgs.push_back(img);
        auto xy = ds.boxes[i].narrow(1, 0, 2), wh = ds.boxes[i].narrow(1, 2, 2);
        tgts.push_back({ds.labels[i].to(device), (torch::cat({xy + 0.5 * wh, wh}, 1) / cfg.img_size).to(device)});
      }
      auto images = torch::stack(imgs).to(device); // LOOKALIKE: tensor-clone-in-loop -- a different batch reaches the device every step
      auto loss = detr_loss(model(images), tgts, cfg);
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 0.1);
      opt.step();
      epoch_loss += loss; // EXPECT: tensor-graph-kept-across-iterations
    }
    std::printf("epoch %d loss %.4f\n", epoch, epoch_loss.item<double>() / (ds.images.size() / cfg.batch_size));
  }
}

int main() {
  DetrConfig cfg;
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  Dataset ds;
  for (int64_t i = 0; i < 32; ++i) {
    ds.images.push_back(torch::rand({3, cfg.img_size, cfg.img_size}));
    ds.labels.push_back(torch::randint(cfg.num_classes, {1 + i % 5}, torch::kLong));
    ds.boxes.push_back(torch::cat({torch::rand({1 + i % 5, 2}), torch::rand({1 + i % 5, 2}) + 0.05}, 1) * (cfg.img_size / 2));
  }
  RTDETR model(cfg);
  model->to(device);
  train(model, ds, cfg, device);
  torch::NoGradGuard no_grad;
  model->eval();
  int64_t kept = 0;
  for (size_t start = 0; start + cfg.batch_size <= ds.images.size(); start += cfg.batch_size) {
    std::vector<Tensor> imgs(ds.images.begin() + start, ds.images.begin() + start + cfg.batch_size);
    auto sizes = torch::full({cfg.batch_size, 2}, static_cast<float>(cfg.img_size));
    auto dets = postprocess(model(torch::stack(imgs).to(device)), sizes, cfg);
    kept += (dets.scores > cfg.score_thresh).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop
  }
  std::printf("detections above threshold: %lld\n", static_cast<long long>(kept));
  return 0;
}
