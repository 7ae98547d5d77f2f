// RetinaFace-style face detector: small backbone, FPN + SSH context modules, class / box /
// landmark heads, priors, target matching, multibox loss and decoding for inference.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;

struct DetectorConfig {
  int64_t image_size = 640;
  std::vector<std::vector<int64_t>> min_sizes{{16, 32}, {64, 128}, {256, 512}};
  std::vector<int64_t> steps{8, 16, 32};
  double variance0 = 0.1, variance1 = 0.2;
  int64_t out_channels = 64, anchors_per_cell = 2;
  double neg_pos_ratio = 7.0, overlap_thresh = 0.35, loc_weight = 2.0, conf_thresh = 0.5;
  int64_t epochs = 4, steps_per_epoch = 200, batch_size = 8, log_every = 50;
};

struct ConvBnImpl : torch::nn::Module {
  ConvBnImpl(int64_t in, int64_t out, int64_t k, int64_t stride, bool act = true) : act_(act) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k)
                                                         .stride(stride).padding(k / 2).bias(false)));
    bn = register_module("bn", torch::nn::BatchNorm2d(out));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = bn(conv(x));
    return act_ ? F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.1)) : x;
  }
  bool act_;
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
};
TORCH_MODULE(ConvBn);

// SSH context module: parallel 3x3, 5x5 and 7x7 receptive fields.
struct SSHImpl : torch::nn::Module {
  SSHImpl(int64_t in, int64_t out) {
    conv3 = register_module("conv3", ConvBn(in, out / 2, 3, 1, false));
    conv5 = register_module("conv5", ConvBn(in, out / 4, 3, 1));
    conv5_out = register_module("conv5_out", ConvBn(out / 4, out / 4, 3, 1, false));
    conv7_out = register_module("conv7_out", ConvBn(out / 4, out / 4, 3, 1, false));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto c5 = conv5(x);
    return torch::relu(torch::cat({conv3(x), conv5_out(c5), conv7_out(conv5_out(c5))}, 1));
  }
  ConvBn conv3{nullptr}, conv5{nullptr}, conv5_out{nullptr}, conv7_out{nullptr};
};
TORCH_MODULE(SSH);

struct HeadsImpl : torch::nn::Module {
  HeadsImpl(int64_t in, int64_t anchors) {
    cls = register_module("cls", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, anchors * 2, 1)));
    box = register_module("box", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, anchors * 4, 1)));
    landm = register_module("landm", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, anchors * 10, 1)));
    // start with a low face prior so background dominates the first iterations
    cls->bias.fill_(-std::log((1.0 - 0.01) / 0.01));  // EXPECT: tensor-inplace-on-leaf
  }
  // returns (loc, conf, landmarks), one row per anchor in (y, x, anchor) order
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
    const int64_t n = x.size(0);
    // FACT: x=torch.randn(2,4,5,5).permute(0,2,3,1); assert is_copy_of(x.reshape(2,-1,2), x)
    auto conf = cls(x).permute({0, 2, 3, 1}).reshape({n, -1, 2});  // EXPECT: tensor-reshape-non-contiguous
    auto loc = box(x).permute({0, 2, 3, 1}).contiguous();
    // FACT: x=torch.randn(2,8,5,5).permute(0,2,3,1).contiguous(); assert is_view_of(x.view(2,-1,4), x)
    loc = loc.view({n, -1, 4});  // LOOKALIKE: tensor-view-non-contiguous -- contiguous() right before the view
    auto lm = landm(x).permute({0, 2, 3, 1});
    // FACT: x=torch.randn(2,20,5,5).permute(0,2,3,1); assert raises(lambda: x.view(2,-1,10), "view size is not compatible")
    return {loc, conf, lm.view({n, -1, 10})};  // EXPECT: tensor-view-non-contiguous
  }
  torch::nn::Conv2d cls{nullptr}, box{nullptr}, landm{nullptr};
};
TORCH_MODULE(Heads);

struct RetinaFaceImpl : torch::nn::Module {
  explicit RetinaFaceImpl(const DetectorConfig& cfg) {
    const int64_t oc = cfg.out_channels, a = cfg.anchors_per_cell;
    stage1 = register_module("stage1", torch::nn::Sequential(ConvBn(3, 16, 3, 2), ConvBn(16, 32, 3, 2), ConvBn(32, 64, 3, 2)));
    stage2 = register_module("stage2", torch::nn::Sequential(ConvBn(64, 128, 3, 2), ConvBn(128, 128, 3, 1)));
    stage3 = register_module("stage3", torch::nn::Sequential(ConvBn(128, 256, 3, 2), ConvBn(256, 256, 3, 1)));
    lat1 = register_module("lat1", ConvBn(64, oc, 1, 1));
    lat2 = register_module("lat2", ConvBn(128, oc, 1, 1));
    lat3 = register_module("lat3", ConvBn(256, oc, 1, 1));
    merge1 = register_module("merge1", ConvBn(oc, oc, 3, 1));
    merge2 = register_module("merge2", ConvBn(oc, oc, 3, 1));
    for (int i = 0; i < 3; ++i) {
      ssh->push_back(SSH(oc, oc));
      heads->push_back(Heads(oc, a));
    }
    register_module("ssh", ssh);
    register_module("heads", heads);
  }

  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> forward(const torch::Tensor& images) {
    const auto up = F::InterpolateFuncOptions().scale_factor(std::vector<double>{2.0, 2.0}).mode(torch::kNearest);
    auto c1 = stage1->forward(images);
    auto c2 = stage2->forward(c1);
    auto p3 = lat3(stage3->forward(c2));
    auto p2 = merge2(lat2(c2) + F::interpolate(p3, up));
    std::vector<torch::Tensor> feats{merge1(lat1(c1) + F::interpolate(p2, up)), p2, p3};
    std::vector<torch::Tensor> locs, confs, landms;
    for (size_t i = 0; i < feats.size(); ++i) {
      auto out = heads->at<HeadsImpl>(i).forward(ssh->at<SSHImpl>(i).forward(feats[i]));
      locs.push_back(std::get<0>(out));
      confs.push_back(std::get<1>(out));
      landms.push_back(std::get<2>(out));
    }
    return {torch::cat(locs, 1), torch::cat(confs, 1), torch::cat(landms, 1)};
  }
  torch::nn::Sequential stage1{nullptr}, stage2{nullptr}, stage3{nullptr};
  ConvBn lat1{nullptr}, lat2{nullptr}, lat3{nullptr}, merge1{nullptr}, merge2{nullptr};
  torch::nn::ModuleList ssh, heads;
};
TORCH_MODULE(RetinaFace);

// Priors in (cx, cy, w, h), normalised to the input size, ordered like the heads' outputs.
torch::Tensor make_priors(const DetectorConfig& cfg) {
  std::vector<float> coords;
  for (size_t k = 0; k < cfg.steps.size(); ++k) {
    const int64_t step = cfg.steps[k];
    const int64_t fm = (cfg.image_size + step - 1) / step;
    for (int64_t i = 0; i < fm; ++i)
      for (int64_t j = 0; j < fm; ++j)
        for (int64_t ms : cfg.min_sizes[k]) {
          coords.push_back(std::min(1.0f, (j + 0.5f) * step / cfg.image_size));
          coords.push_back(std::min(1.0f, (i + 0.5f) * step / cfg.image_size));
          coords.push_back(std::min(1.0f, float(ms) / cfg.image_size));
          coords.push_back(std::min(1.0f, float(ms) / cfg.image_size));
        }
  }
  const int64_t n = static_cast<int64_t>(coords.size()) / 4;
  return torch::from_blob(coords.data(), {n, 4}, torch::kFloat).clone();  // LOOKALIKE: tensor-unnecessary-clone -- from_blob does not own the vector, which dies on return
}

torch::Tensor point_form(const torch::Tensor& p) {
  return torch::cat({p.slice(1, 0, 2) - p.slice(1, 2, 4) / 2, p.slice(1, 0, 2) + p.slice(1, 2, 4) / 2}, 1);
}

torch::Tensor jaccard(const torch::Tensor& a, const torch::Tensor& b) {
  auto max_xy = torch::min(a.slice(1, 2, 4).unsqueeze(1), b.slice(1, 2, 4).unsqueeze(0));
  auto min_xy = torch::max(a.slice(1, 0, 2).unsqueeze(1), b.slice(1, 0, 2).unsqueeze(0));
  auto wh = (max_xy - min_xy).clamp_min(0);
  auto inter = wh.select(2, 0) * wh.select(2, 1);
  auto area_a = ((a.select(1, 2) - a.select(1, 0)) * (a.select(1, 3) - a.select(1, 1))).unsqueeze(1);
  auto area_b = ((b.select(1, 2) - b.select(1, 0)) * (b.select(1, 3) - b.select(1, 1))).unsqueeze(0);
  return inter / (area_a + area_b - inter);
}

struct Matched { torch::Tensor loc, conf, landm; };

// truths: corner boxes, labels: 1 face with landmarks, -1 face without, landms: 10 coords.
Matched match(const torch::Tensor& truths, const torch::Tensor& labels, const torch::Tensor& landms,
              const torch::Tensor& priors, const DetectorConfig& cfg) {
  auto overlaps = jaccard(truths, point_form(priors));
  auto best_prior_idx = std::get<1>(overlaps.max(1));
  auto [best_truth_overlap, best_truth_idx] = overlaps.max(0);
  best_truth_overlap.index_fill_(0, best_prior_idx, 2.0);
  best_truth_idx.index_put_({best_prior_idx}, torch::arange(best_prior_idx.size(0), best_truth_idx.options()));

  auto conf = labels.index({best_truth_idx});
  // FACT: l=torch.tensor([1.,-1.]); c=l[torch.tensor([0,1,1,0])]; c.masked_fill_(c<0,0); assert is_copy_of(c,l) and l[1]==-1
  conf.masked_fill_(best_truth_overlap < cfg.overlap_thresh, 0);  // LOOKALIKE: tensor-alias-then-mutate -- advanced indexing returned a new tensor

  auto m = truths.index({best_truth_idx});
  auto g_cxcy = ((m.slice(1, 0, 2) + m.slice(1, 2, 4)) / 2 - priors.slice(1, 0, 2)) /
                (cfg.variance0 * priors.slice(1, 2, 4));
  auto g_wh = torch::log((m.slice(1, 2, 4) - m.slice(1, 0, 2)) / priors.slice(1, 2, 4)) / cfg.variance1;

  auto pts = landms.index({best_truth_idx}).view({-1, 5, 2});
  auto g_landm = (pts - priors.slice(1, 0, 2).unsqueeze(1)) / (cfg.variance0 * priors.slice(1, 2, 4).unsqueeze(1));
  return {torch::cat({g_cxcy, g_wh}, 1), conf, g_landm.reshape({-1, 10})};
}

struct LossParts { torch::Tensor loc, conf, landm, landm_pred, faces_without_landmarks; };

LossParts multibox_loss(const torch::Tensor& loc_data, const torch::Tensor& conf_data, const torch::Tensor& landm_data,
                        const torch::Tensor& priors, const std::vector<torch::Tensor>& targets,
                        const DetectorConfig& cfg) {
  const int64_t num = loc_data.size(0), num_priors = priors.size(0);
  auto loc_t = torch::empty({num, num_priors, 4}, loc_data.options());
  auto conf_t = torch::empty({num, num_priors}, loc_data.options().dtype(torch::kLong));
  auto landm_t = torch::empty({num, num_priors, 10}, loc_data.options());
  {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < num; ++i) {
      auto t = targets[i].to(loc_data.device());
      auto m = match(t.slice(1, 0, 4), t.select(1, 14), t.slice(1, 4, 14), priors, cfg);
      loc_t[i].copy_(m.loc);
      conf_t[i].copy_(m.conf.to(torch::kLong));  // LOOKALIKE: tensor-copy-narrowing -- the float to long conversion is spelled out
      landm_t[i].copy_(m.landm);
    }
  }

  auto zeros = torch::tensor(0, torch::kLong);
  auto pos_landm = conf_t > zeros;  // LOOKALIKE: tensor-device-mismatch -- a 0-dim CPU tensor acts as a scalar next to CUDA tensors
  auto landm_p = landm_data.index({pos_landm});
  auto n_landm = pos_landm.sum().clamp_min(1).to(torch::kFloat);
  auto loss_landm = F::smooth_l1_loss(landm_p, landm_t.index({pos_landm}),
                                      F::SmoothL1LossFuncOptions().reduction(torch::kSum)) / n_landm;
  // faces without landmarks (-1) are still faces for the box and class losses
  auto labels = conf_t;
  // FACT: a=torch.tensor([-1,0,1,1,-1]); b=a; b.masked_fill_(b!=0,1); assert shares_storage(a,b) and (a<0).sum()==0
  labels.masked_fill_(labels != 0, 1);  // EXPECT: tensor-alias-then-mutate
  auto pos = labels > 0;
  auto n_faces = pos.sum().clamp_min(1).to(torch::kFloat);
  auto loss_l = F::smooth_l1_loss(loc_data.index({pos}), loc_t.index({pos}),
                                  F::SmoothL1LossFuncOptions().reduction(torch::kSum)) / n_faces;
  // hard negative mining on the per-prior classification loss
  // FACT: c=torch.cat([torch.randn(2,50,2),torch.randn(2,12,2)],1); assert is_view_of(c.reshape(-1,2), c)
  auto batch_conf = conf_data.reshape({-1, 2});  // LOOKALIKE: tensor-reshape-non-contiguous -- torch::cat output is contiguous, this is a view
  auto loss_c = batch_conf.logsumexp(1, true) - batch_conf.gather(1, labels.view({-1, 1}));
  loss_c.masked_fill_(pos.view({-1, 1}), 0);  // LOOKALIKE: tensor-inplace-on-saved -- sub keeps nothing for backward and loss_c only ranks priors
  auto loss_idx = std::get<1>(loss_c.view({num, -1}).sort(1, true));
  auto idx_rank = std::get<1>(loss_idx.sort(1));
  auto num_pos = pos.sum(1, true);
  auto num_neg = torch::clamp_max(num_pos * static_cast<int64_t>(cfg.neg_pos_ratio), num_priors - 1);
  auto sel = pos | (idx_rank < num_neg);
  auto loss_conf = F::cross_entropy(conf_data.index({sel}), labels.index({sel}),
                                    F::CrossEntropyFuncOptions().reduction(torch::kSum)) / n_faces;

  return {loss_l, loss_conf, loss_landm, landm_p, (conf_t < 0).sum()};
}

torch::Tensor decode_boxes(const torch::Tensor& loc, const torch::Tensor& priors, const DetectorConfig& cfg) {
  auto boxes = torch::cat({priors.slice(1, 0, 2) + loc.slice(1, 0, 2) * cfg.variance0 * priors.slice(1, 2, 4),
                           priors.slice(1, 2, 4) * torch::exp(loc.slice(1, 2, 4) * cfg.variance1)}, 1);
  boxes.slice(1, 0, 2) -= boxes.slice(1, 2, 4) / 2;
  // FACT: b=torch.rand(6,4); s=b[:,2:]+b[:,:2]; b[:,2:]+=b[:,:2]; assert torch.equal(b[:,2:], s)
  boxes.slice(1, 2, 4) += boxes.slice(1, 0, 2);  // LOOKALIKE: tensor-inplace-overlap -- the two column slices share a buffer but no element
  return boxes;
}

torch::Tensor decode_landmarks(const torch::Tensor& pre, const torch::Tensor& priors, const DetectorConfig& cfg) {
  const int64_t n = priors.size(0);
  auto centers = priors.slice(1, 0, 2).unsqueeze(1).expand({n, 5, 2});
  auto scale = priors.slice(1, 2, 4).unsqueeze(1).expand({n, 5, 2});
  // FACT: p=torch.rand(6,4); s=p[:,2:4].unsqueeze(1).expand(6,5,2); assert raises(lambda: s.mul_(0.1), "more than one element")
  scale.mul_(cfg.variance0);  // EXPECT: tensor-inplace-on-expanded
  return (centers + pre.view({n, 5, 2}) * scale).reshape({n, 10});
}

struct Detections { torch::Tensor boxes, scores, landmarks, pixel_boxes; };

Detections detect(RetinaFace& net, const torch::Tensor& image, const torch::Tensor& priors, const DetectorConfig& cfg) {
  torch::NoGradGuard no_grad;
  net->eval();
  auto out = net->forward(image.unsqueeze(0));
  const float h = image.size(1), w = image.size(2);
  auto scale = torch::tensor({w, h, w, h});
  auto boxes = decode_boxes(std::get<0>(out)[0], priors, cfg) * scale;  // EXPECT: tensor-device-mismatch
  auto scores = torch::softmax(std::get<1>(out)[0], -1).select(1, 1);
  auto landm_scale = torch::tensor({w, h}).repeat({5}).to(image.device());
  auto landms = decode_landmarks(std::get<2>(out)[0], priors, cfg) * landm_scale;
  auto keep = scores > cfg.conf_thresh;
  Detections d{boxes.index({keep}), scores.index({keep}), landms.index({keep}), torch::Tensor()};
  d.pixel_boxes = torch::empty({d.boxes.size(0), 4}, torch::kInt32);
  d.pixel_boxes.copy_(d.boxes.cpu());  // EXPECT: tensor-copy-narrowing
  return d;
}

std::vector<torch::Tensor> synthetic_targets(int64_t batch) {
  std::vector<torch::Tensor> out;
  for (int64_t b = 0; b < batch; ++b) {
    auto xy = torch::rand({3, 2}) * 0.7, wh = torch::rand({3, 2}) * 0.2 + 0.05;
    auto lm = (xy + wh / 2).repeat({1, 5}) + torch::randn({3, 10}) * 0.01;
    out.push_back(torch::cat({xy, xy + wh, lm, torch::tensor({1.0f, 1.0f, -1.0f}).unsqueeze(1)}, 1));
  }
  return out;
}

void train(RetinaFace& net, const DetectorConfig& cfg, torch::Device device) {
  auto priors = make_priors(cfg);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(1e-3).momentum(0.9).weight_decay(5e-4));
  auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
  std::vector<torch::Tensor> landm_curve;
  net->train();
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    epoch_loss.zero_();
    for (int64_t step = 0; step < cfg.steps_per_epoch; ++step) {
      auto targets = synthetic_targets(cfg.batch_size);
      auto images = torch::randn({cfg.batch_size, 3, cfg.image_size, cfg.image_size}).to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step
      auto anchors = priors.to(device);  // EXPECT: tensor-clone-in-loop
      auto out = net->forward(images);
      auto parts = multibox_loss(std::get<0>(out), std::get<1>(out), std::get<2>(out), anchors, targets, cfg);
      auto loss = cfg.loc_weight * parts.loc + parts.conf + parts.landm;
      // landmark offsets in pixels for the progress line
      auto pred_px = parts.landm_pred.detach();
      pred_px.mul_(static_cast<double>(cfg.image_size));  // EXPECT: tensor-inplace-on-detached
      auto mean_px = pred_px.abs().mean();
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph is kept
      landm_curve.push_back(parts.landm);  // EXPECT: tensor-graph-kept-across-iterations
      if (step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>()
                  << " landm px " << mean_px.item<float>() << " faces w/o landmarks "
                  << parts.faces_without_landmarks.item<int64_t>() << "\n";
    }
    std::cout << "epoch " << epoch << " mean loss " << (epoch_loss / cfg.steps_per_epoch).item<float>() << "\n";
  }
  std::cout << "final landmark loss " << torch::stack(landm_curve).slice(0, -cfg.log_every).mean().item<float>() << "\n";
}

int main() {
  DetectorConfig cfg;
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  RetinaFace net(cfg);
  net->to(device);
  train(net, cfg, device);

  auto image = torch::rand({3, cfg.image_size, cfg.image_size}).to(device);
  auto dets = detect(net, image, make_priors(cfg).to(device), cfg);
  std::cout << "faces: " << dets.boxes.size(0) << "\n";
  return 0;
}
