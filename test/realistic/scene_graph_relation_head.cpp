// Neural Motifs-style (Zellers et al. 2018) relation head for SGCls on a frozen backbone's feature maps.

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace sgg {
namespace F = torch::nn::functional;

struct Config {
  int64_t num_obj_classes = 151, num_rel_classes = 51, fmap_channels = 256, crop = 7;
  int64_t obj_feat_dim = 1024, embed_dim = 200, hidden = 256, rel_dim = 512;
  int64_t rels_per_image = 256, images_per_batch = 4, epochs = 12, recall_k = 50;
  double lr = 0.01, bg_prior = 0.9;
  bool predcls = false;
};

struct ImageEntry {
  torch::Tensor fmap, boxes, labels, gt_rels;
  int64_t width = 0, height = 0;
  ImageEntry to(torch::Device d) const { return {fmap.to(d), boxes.to(d), labels.to(d), gt_rels.to(d), width, height}; }
};

ImageEntry load_entry(const std::string& prefix) {
  ImageEntry e;
  torch::load(e.fmap, prefix + ".fmap.pt");
  std::ifstream meta(prefix + ".meta");
  int64_t n = 0, r = 0;
  meta >> e.width >> e.height >> n >> r;
  std::vector<double> boxes(n * 4);
  std::vector<int64_t> labels(n), rels(r * 3);
  for (auto& v : boxes) meta >> v;
  for (auto& v : labels) meta >> v;
  for (auto& v : rels) meta >> v;
  e.boxes = torch::empty({n, 4});
  e.boxes.copy_(torch::from_blob(boxes.data(), {n, 4}, torch::kDouble));  // EXPECT: tensor-copy-narrowing
  e.labels = torch::empty({n}, torch::kLong);
  e.labels.copy_(torch::from_blob(labels.data(), {n}, torch::kLong));  // LOOKALIKE: tensor-copy-narrowing -- int64 into int64
  e.gt_rels = torch::from_blob(rels.data(), {r, 3}, torch::kLong).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob does not own the vector, which dies on return
  return e;
}

// Bilinear crops of a [C, H, W] feature map, one out x out grid per box (boxes in image pixels).
torch::Tensor crop_features(const torch::Tensor& fmap, const torch::Tensor& rois, int64_t w, int64_t h, int64_t out) {
  auto scale = torch::tensor({2.0 / w, 2.0 / h, 2.0 / w, 2.0 / h});
  auto r = rois * scale - 1.0;  // EXPECT: tensor-device-mismatch
  auto steps = torch::linspace(0.0, 1.0, out, rois.options());
  auto gx = r.select(1, 0).unsqueeze(1) + (r.select(1, 2) - r.select(1, 0)).unsqueeze(1) * steps;
  auto gy = r.select(1, 1).unsqueeze(1) + (r.select(1, 3) - r.select(1, 1)).unsqueeze(1) * steps;
  auto grid = torch::stack({gx.unsqueeze(1).expand({-1, out, out}), gy.unsqueeze(2).expand({-1, out, out})}, 3);
  auto input = fmap.unsqueeze(0).expand({rois.size(0), -1, -1, -1});
  return F::grid_sample(input, grid, F::GridSampleFuncOptions().align_corners(true)).flatten(1);
}

torch::Tensor union_boxes(const torch::Tensor& boxes, const torch::Tensor& pairs) {
  auto s = boxes.index_select(0, pairs.select(1, 0)), o = boxes.index_select(0, pairs.select(1, 1));
  return torch::cat({torch::min(s.narrow(1, 0, 2), o.narrow(1, 0, 2)), torch::max(s.narrow(1, 2, 2), o.narrow(1, 2, 2))}, 1);
}

// Normalised subject/object boxes plus the relative offset and log scale of the object.
torch::Tensor pair_geometry(const torch::Tensor& boxes, const torch::Tensor& pairs, int64_t w, int64_t h) {
  auto b = boxes.contiguous();
  auto wh = torch::tensor({double(w), double(h), double(w), double(h)}, boxes.options());
  // FACT: b = torch.rand(5, 4); assert shares_storage(b.contiguous(), b)
  b.div_(wh);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-device-mismatch -- wh is built with boxes.options(), on the boxes' device
  auto s = b.index_select(0, pairs.select(1, 0)), o = b.index_select(0, pairs.select(1, 1));
  // FACT: b = torch.rand(5, 4); s = b.index_select(0, torch.tensor([0, 2, 3])); r = s.clone(); s.narrow(1, 2, 2).sub_(s.narrow(1, 0, 2)); assert is_copy_of(s, b) and torch.equal(s[:, 2:], r[:, 2:] - r[:, :2])
  s.narrow(1, 2, 2).sub_(s.narrow(1, 0, 2));  // LOOKALIKE: tensor-alias-then-mutate, tensor-inplace-overlap -- index_select gave s its own storage, and the two column ranges are disjoint
  o.narrow(1, 2, 2).sub_(o.narrow(1, 0, 2));
  auto s_wh = s.narrow(1, 2, 2).clamp_min(1e-3);
  auto d_xy = (o.narrow(1, 0, 2) - s.narrow(1, 0, 2)) / s_wh;
  auto d_wh = torch::log(o.narrow(1, 2, 2).clamp_min(1e-3) / s_wh);
  return torch::cat({s, o, d_xy, d_wh}, 1);
}

torch::Tensor all_pairs(int64_t n, torch::Device device) {
  auto idx = torch::arange(n, torch::dtype(torch::kLong).device(device));
  auto s = idx.repeat_interleave(n), o = idx.repeat({n});
  auto keep = s != o;
  return torch::stack({s.masked_select(keep), o.masked_select(keep)}, 1);
}

// All ordered pairs labelled from the ground truth, foreground kept, background subsampled.
torch::Tensor sample_pairs(const ImageEntry& im, const Config& cfg, torch::Tensor& labels_out) {
  const int64_t n = im.boxes.size(0);
  auto pairs = all_pairs(n, im.boxes.device());
  auto rel_map = torch::zeros({n, n}, im.gt_rels.options());
  rel_map.index_put_({im.gt_rels.select(1, 0), im.gt_rels.select(1, 1)}, im.gt_rels.select(1, 2));
  auto labels = rel_map.index({pairs.select(1, 0), pairs.select(1, 1)});
  auto fg = torch::nonzero(labels > 0).squeeze(1), bg = torch::nonzero(labels == 0).squeeze(1);
  const int64_t num_bg = std::clamp<int64_t>(cfg.rels_per_image - fg.size(0), 0, bg.size(0));
  bg = bg.index_select(0, torch::randperm(bg.size(0), bg.options()).narrow(0, 0, num_bg));
  auto keep = torch::cat({fg, bg});
  labels_out = labels.index_select(0, keep);
  return pairs.index_select(0, keep);
}

class ObjectContextImpl : public torch::nn::Module {
 public:
  explicit ObjectContextImpl(const Config& cfg) {
    obj_embed_ = register_module("obj_embed", torch::nn::Embedding(cfg.num_obj_classes, cfg.embed_dim));
    lstm_ = register_module("lstm", torch::nn::LSTM(torch::nn::LSTMOptions(cfg.obj_feat_dim + cfg.embed_dim, cfg.hidden).bidirectional(true)));
    obj_cls_ = register_module("obj_cls", torch::nn::Linear(2 * cfg.hidden, cfg.num_obj_classes));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const std::vector<ImageEntry>& imgs, const std::vector<torch::Tensor>& obj_feats) {
    std::vector<torch::Tensor> seqs;
    std::vector<int64_t> counts;
    for (size_t i = 0; i < imgs.size(); ++i) {
      seqs.push_back(torch::cat({obj_feats[i], obj_embed_(imgs[i].labels)}, 1));
      counts.push_back(imgs[i].boxes.size(0));
    }
    auto out = std::get<0>(lstm_->forward(torch::nn::utils::rnn::pad_sequence(seqs)));
    const int64_t nmax = out.size(0), b = out.size(1);
    // FACT: o = torch.randn(5, 2, 6); assert raises(lambda: o.transpose(0, 1).view(10, 6), "view size is not compatible")
    auto rows = out.transpose(0, 1).view({b * nmax, out.size(2)});  // EXPECT: tensor-view-non-contiguous
    std::vector<torch::Tensor> valid;
    for (int64_t i = 0; i < b; ++i) valid.push_back(rows.narrow(0, i * nmax, counts[i]));
    auto ctx = torch::cat(valid, 0);
    return {ctx, obj_cls_(ctx)};
  }

 private:
  torch::nn::Embedding obj_embed_{nullptr};
  torch::nn::LSTM lstm_{nullptr};
  torch::nn::Linear obj_cls_{nullptr};
};
TORCH_MODULE(ObjectContext);

struct SGOutput { torch::Tensor obj_logits, rel_logits, pairs, rel_labels; };

class SceneGraphModelImpl : public torch::nn::Module {
 public:
  explicit SceneGraphModelImpl(const Config& cfg) : cfg_(cfg) {
    const int64_t crop_dim = cfg.fmap_channels * cfg.crop * cfg.crop;
    obj_fc_ = register_module("obj_fc", torch::nn::Linear(crop_dim, cfg.obj_feat_dim));
    union_fc_ = register_module("union_fc", torch::nn::Linear(crop_dim, cfg.rel_dim));
    context_ = register_module("context", ObjectContext(cfg));
    post_emb_ = register_module("post_emb", torch::nn::Linear(2 * cfg.hidden, 2 * cfg.rel_dim));
    geo_fc_ = register_module("geo_fc", torch::nn::Sequential(torch::nn::Linear(12, 64), torch::nn::ReLU(), torch::nn::Linear(64, cfg.rel_dim)));
    rel_cls_ = register_module("rel_cls", torch::nn::Linear(cfg.rel_dim, cfg.num_rel_classes));
    freq_bias_ = register_module("freq_bias", torch::nn::Embedding(cfg.num_obj_classes * cfg.num_obj_classes, cfg.num_rel_classes));
    rel_cls_->bias[0].fill_(std::log(cfg.bg_prior / (1.0 - cfg.bg_prior)));  // EXPECT: tensor-inplace-on-leaf
  }

  // fg_matrix[s][o][p]: how often predicate p links a subject of class s to an object of class o.
  void load_frequency_bias(const torch::Tensor& fg_matrix) {
    torch::NoGradGuard no_grad;
    auto counts = fg_matrix.to(torch::kFloat);
    auto dist = torch::log(counts / counts.sum(2, true).clamp_min(1.0) + 1e-3);
    freq_bias_->weight.copy_(dist.view({-1, cfg_.num_rel_classes}));  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard, the documented way to load weights
  }

  SGOutput forward(const std::vector<ImageEntry>& imgs) {
    std::vector<torch::Tensor> obj_feats;
    for (const auto& im : imgs)
      obj_feats.push_back(torch::relu(obj_fc_(crop_features(im.fmap, im.boxes, im.width, im.height, cfg_.crop))));
    auto ctx_logits = context_(imgs, obj_feats);
    SGOutput out{ctx_logits.second, {}, {}, {}};
    auto obj_dists = out.obj_logits.detach();
    obj_dists.select(1, 0).fill_(-1e4);  // EXPECT: tensor-inplace-on-detached
    auto obj_preds = obj_dists.argmax(1);
    const auto& ctx = ctx_logits.first;
    // FACT: y = torch.randn(5, 8); assert is_view_of(y.view(5, 2, 4), y)
    auto so = post_emb_(ctx).view({ctx.size(0), 2, cfg_.rel_dim});  // LOOKALIKE: tensor-view-non-contiguous -- a linear layer's output is contiguous
    std::vector<torch::Tensor> rel_logits, pairs, rel_labels;
    int64_t offset = 0;
    for (const auto& im : imgs) {
      const int64_t n = im.boxes.size(0);
      auto labels = is_training() ? im.labels : obj_preds.narrow(0, offset, n);
      torch::Tensor rl;
      auto pr = is_training() ? sample_pairs(im, cfg_, rl) : all_pairs(n, im.boxes.device());
      auto s = so.select(1, 0).narrow(0, offset, n).index_select(0, pr.select(1, 0));
      auto o = so.select(1, 1).narrow(0, offset, n).index_select(0, pr.select(1, 1));
      auto geo = geo_fc_->forward(pair_geometry(im.boxes, pr, im.width, im.height));
      auto rep = torch::relu(union_fc_(crop_features(im.fmap, union_boxes(im.boxes, pr), im.width, im.height, cfg_.crop)));
      // FACT: x = torch.randn(4, 3, requires_grad=True); r = torch.relu(x); r.mul_(torch.rand(4, 3)); assert backward_fails(lambda: r.sum().backward())
      rep.mul_(s * o);  // EXPECT: tensor-inplace-on-saved
      auto freq_idx = labels.index_select(0, pr.select(1, 0)) * cfg_.num_obj_classes + labels.index_select(0, pr.select(1, 1));
      rel_logits.push_back(rel_cls_(rep + geo) + freq_bias_(freq_idx));
      pairs.push_back(pr);
      if (rl.defined()) rel_labels.push_back(rl);
      offset += n;
    }
    out.rel_logits = torch::cat(rel_logits);
    out.pairs = torch::cat(pairs);
    if (!rel_labels.empty()) out.rel_labels = torch::cat(rel_labels);
    return out;
  }

 private:
  Config cfg_;
  torch::nn::Linear obj_fc_{nullptr}, union_fc_{nullptr}, post_emb_{nullptr}, rel_cls_{nullptr};
  ObjectContext context_{nullptr};
  torch::nn::Sequential geo_fc_{nullptr};
  torch::nn::Embedding freq_bias_{nullptr};
};
TORCH_MODULE(SceneGraphModel);

// Top-k (subject, object, predicate) triplets of one image.
using Triplets = std::tuple<torch::Tensor, torch::Tensor, torch::Tensor>;  // pairs, predicates, scores
Triplets rank_triplets(const torch::Tensor& rel_logits, const torch::Tensor& pairs, const torch::Tensor& obj_scores, int64_t k) {
  auto probs = torch::softmax(rel_logits, 1);
  const int64_t p = probs.size(1);
  auto fg = probs.narrow(1, 1, p - 1);
  torch::Tensor flat;
  if (obj_scores.defined()) {
    auto pair_scores = obj_scores.index_select(0, pairs.select(1, 0)) * obj_scores.index_select(0, pairs.select(1, 1));
    // FACT: r = torch.rand(6, 5); t = r.narrow(1, 1, 4) * torch.rand(6, 1); assert is_view_of(t.reshape(-1), t)
    flat = (fg * pair_scores.unsqueeze(1)).reshape({-1});  // LOOKALIKE: tensor-reshape-non-contiguous -- the product is a fresh contiguous tensor
  } else {
    // FACT: r = torch.rand(6, 5); assert is_copy_of(r.narrow(1, 1, 4).reshape(-1), r)
    flat = fg.reshape({-1});  // EXPECT: tensor-reshape-non-contiguous
  }
  auto top = flat.topk(std::min<int64_t>(k, flat.size(0)));
  auto idx = std::get<1>(top);
  return {pairs.index_select(0, idx.div(p - 1, "floor")), idx.remainder(p - 1) + 1, std::get<0>(top)};
}

SceneGraphModel train(const Config& cfg, const std::vector<ImageEntry>& data, const torch::Tensor& fg_matrix,
                      torch::Device device) {
  SceneGraphModel model(cfg);
  model->to(device);
  model->load_frequency_bias(fg_matrix);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(cfg.lr).momentum(0.9).weight_decay(1e-4));
  auto per_pred = fg_matrix.sum(0).sum(0).to(torch::kFloat) + 1.0;
  auto rel_weights = (per_pred.sum() / per_pred).sqrt();
  auto window_loss = torch::zeros({}, device), window_obj = torch::zeros({}, device);
  std::vector<size_t> order(data.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  int64_t it = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t start = 0; start < order.size(); start += cfg.images_per_batch) {
      std::vector<ImageEntry> batch;
      for (size_t j = start; j < std::min(start + cfg.images_per_batch, order.size()); ++j) {
        batch.push_back(data[order[j]].to(device));
      }
      auto out = model(batch);
      std::vector<torch::Tensor> gt_labels;
      for (const auto& im : batch) gt_labels.push_back(im.labels);
      auto obj_loss = F::cross_entropy(out.obj_logits, torch::cat(gt_labels));
      auto rel_loss = F::cross_entropy(out.rel_logits, out.rel_labels,
                                       F::CrossEntropyFuncOptions().weight(rel_weights.to(device)));  // EXPECT: tensor-clone-in-loop
      auto loss = obj_loss + rel_loss;
      opt.zero_grad();
      loss.backward();
      torch::nn::utils::clip_grad_norm_(model->parameters(), 5.0);
      opt.step();
      window_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      window_obj += obj_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, only the value is summed
      if (++it % 100 == 0) {
        std::cout << "it " << it << " loss " << window_loss.item<double>() / 100.0 << " obj " << window_obj.item<double>() / 100.0 << "\n";
        window_loss = torch::zeros({}, device);
        window_obj.zero_();
      }
    }
    torch::save(model, "motifs_sgcls_" + std::to_string(epoch) + ".pt");
  }
  return model;
}

double evaluate(SceneGraphModel& model, const std::vector<ImageEntry>& data, const Config& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto hits = torch::zeros({}, torch::dtype(torch::kLong).device(device));
  int64_t total_gt = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    auto im = data[i].to(device);
    auto out = model->forward({im});
    auto obj_scores = torch::softmax(out.obj_logits.detach(), 1);
    obj_scores.select(1, 0).zero_();  // LOOKALIKE: tensor-inplace-on-detached -- softmax made a new tensor; only its input was detached
    auto best = obj_scores.max(1);
    auto tri = rank_triplets(out.rel_logits, out.pairs, cfg.predcls ? torch::Tensor() : std::get<0>(best), cfg.recall_k);
    auto cls_ok = std::get<1>(best) == im.labels;
    const int64_t n = im.boxes.size(0), p = cfg.num_rel_classes;
    auto sp = std::get<0>(tri).select(1, 0), op = std::get<0>(tri).select(1, 1);
    auto pred_key = (sp * n + op) * p + std::get<1>(tri);
    cls_ok = cls_ok.index_select(0, sp) & cls_ok.index_select(0, op);
    auto gt_key = (im.gt_rels.select(1, 0) * n + im.gt_rels.select(1, 1)) * p + im.gt_rels.select(1, 2);
    hits += ((gt_key.unsqueeze(1) == pred_key.unsqueeze(0)) & cls_ok.unsqueeze(0)).any(1).sum();
    total_gt += im.gt_rels.size(0);
    torch::save(std::vector<torch::Tensor>{std::get<0>(tri).cpu(), std::get<1>(tri).cpu(), std::get<2>(tri).cpu()},  // LOOKALIKE: tensor-sync-in-loop -- each image's triplets are written out, so they must reach the host
                "pred_" + std::to_string(i) + ".pt");
  }
  return hits.item<double>() / double(std::max<int64_t>(total_gt, 1));
}

}  // namespace sgg

int main(int argc, char** argv) {
  if (argc < 3) { std::cerr << "usage: " << argv[0] << " train_prefixes.txt test_prefixes.txt\n"; return 1; }
  sgg::Config cfg;
  auto read_split = [](const std::string& list) {
    std::vector<sgg::ImageEntry> out;
    std::ifstream in(list);
    for (std::string prefix; std::getline(in, prefix);) out.push_back(sgg::load_entry(prefix));
    return out;
  };
  const auto train_set = read_split(argv[1]);
  const auto test_set = read_split(argv[2]);
  auto fg_matrix = torch::zeros({cfg.num_obj_classes, cfg.num_obj_classes, cfg.num_rel_classes}, torch::kLong);
  for (const auto& e : train_set) {
    auto s = e.labels.index_select(0, e.gt_rels.select(1, 0));
    auto o = e.labels.index_select(0, e.gt_rels.select(1, 1));
    fg_matrix.index_put_({s, o, e.gt_rels.select(1, 2)}, torch::ones_like(s), /*accumulate=*/true);
  }
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  auto model = sgg::train(cfg, train_set, fg_matrix, device);
  std::cout << "SGCls R@" << cfg.recall_k << " " << sgg::evaluate(model, test_set, cfg, device) << std::endl;
  return 0;
}
