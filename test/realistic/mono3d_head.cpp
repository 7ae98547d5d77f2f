// Monocular 3D detection head (CenterNet / SMOKE family) with LID depth bins plus residuals,
// multi-bin orientation and 3D box decoding through the camera intrinsics.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace mono3d {

namespace F = torch::nn::functional;

struct HeadConfig {
  int64_t in_channels = 64, head_conv = 256, num_classes = 3;
  int64_t depth_bins = 80, orient_bins = 4, max_objs = 50, topk = 50, down_ratio = 4;
  double depth_min = 2.0, depth_max = 70.0, lr = 2.5e-4, ema_decay = 0.999, score_thresh = 0.25;
  int64_t epochs = 70, batch_size = 8, log_every = 100;
};

struct Object3D { int64_t cls; float x1, y1, x2, y2, h, w, l, x, y, z, alpha; };
struct Frame { torch::Tensor image, K, lidar_depth; std::vector<Object3D> objects; };
std::vector<Frame> load_frames(const std::string& root, const std::string& split);
void write_kitti(const std::string& dir, int64_t frame, const torch::Tensor& scores, const torch::Tensor& corners);

torch::Tensor lid_bin_edges(const HeadConfig& cfg) {
  auto i = torch::arange(cfg.depth_bins + 1, torch::kFloat);
  return cfg.depth_min + (cfg.depth_max - cfg.depth_min) * i * (i + 1) / double(cfg.depth_bins * (cfg.depth_bins + 1));
}

torch::Tensor bin_centers(const torch::Tensor& edges) {
  const int64_t k = edges.size(0) - 1;
  auto widths = edges.narrow(0, 1, k);
  // FACT: e=torch.arange(6.); assert raises(lambda: e.narrow(0,1,5).sub_(e.narrow(0,0,5)), "refer to a single memory location")
  widths.sub_(edges.narrow(0, 0, k));  // EXPECT: tensor-inplace-overlap
  return edges.narrow(0, 0, k) + 0.5 * widths;
}

struct HeadOutput { torch::Tensor heatmap, offset, wh, depth_logits, depth_res, depth, dims, orient; };

struct Mono3DHeadImpl : torch::nn::Module {
  torch::nn::Sequential heat{nullptr}, offset{nullptr}, wh{nullptr}, depth_cls{nullptr}, depth_res{nullptr},
      dims{nullptr}, orient{nullptr};
  torch::Tensor edges, centers;

  torch::nn::Sequential branch(const std::string& name, const HeadConfig& cfg, int64_t out) {
    return register_module(name, torch::nn::Sequential(
        torch::nn::Conv2d(torch::nn::Conv2dOptions(cfg.in_channels, cfg.head_conv, 3).padding(1)),
        torch::nn::ReLU(torch::nn::ReLUOptions(true)), torch::nn::Conv2d(cfg.head_conv, out, 1)));
  }

  explicit Mono3DHeadImpl(const HeadConfig& cfg) {
    heat = branch("heatmap", cfg, cfg.num_classes);
    offset = branch("offset", cfg, 2);
    wh = branch("wh", cfg, 2);
    depth_cls = branch("depth_cls", cfg, cfg.depth_bins);
    depth_res = branch("depth_res", cfg, cfg.depth_bins);
    dims = branch("dims", cfg, 3);
    orient = branch("orient", cfg, 3 * cfg.orient_bins);
    edges = register_buffer("edges", lid_bin_edges(cfg));
    centers = register_buffer("centers", bin_centers(edges));
    torch::NoGradGuard no_grad;
    heat[2]->as<torch::nn::Conv2d>()->bias.fill_(-2.19);  // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  HeadOutput forward(const torch::Tensor& feat) {
    HeadOutput out;
    out.heatmap = torch::sigmoid(heat->forward(feat)).clamp(1e-4, 1 - 1e-4);
    out.offset = offset->forward(feat);
    out.wh = wh->forward(feat);
    out.depth_logits = depth_cls->forward(feat);
    out.depth_res = depth_res->forward(feat);
    out.dims = dims->forward(feat);
    out.orient = orient->forward(feat);
    auto bin_depth = centers.view({1, -1, 1, 1}).expand_as(out.depth_res);
    // FACT: c=torch.rand(4).view(1,4,1,1).expand(2,4,3,3); assert raises(lambda: c.add_(torch.rand(2,4,3,3)), "more than one element")
    bin_depth += out.depth_res;  // EXPECT: tensor-inplace-on-expanded
    out.depth = (torch::softmax(out.depth_logits, 1) * bin_depth).sum(1, true);
    return out;
  }
};
TORCH_MODULE(Mono3DHead);

torch::Tensor gather_feat(const torch::Tensor& feat, const torch::Tensor& ind) {
  const int64_t b = feat.size(0), c = feat.size(1);
  // FACT: f=torch.randn(2,8,4,5); g=f.permute(0,2,3,1).reshape(2,-1,8); assert not is_contiguous(g) and is_view_of(g,f)
  auto flat = feat.permute({0, 2, 3, 1}).reshape({b, -1, c});  // LOOKALIKE: tensor-reshape-non-contiguous -- h and w stay adjacent after the permute, the reshape is a view
  return flat.gather(1, ind.unsqueeze(2).expand({-1, -1, c}));
}

torch::Tensor focal_loss(const torch::Tensor& pred, const torch::Tensor& gt) {
  auto pos = gt.eq(1).to(pred.scalar_type());
  auto pos_loss = torch::log(pred) * (1 - pred).pow(2) * pos;
  auto neg_loss = torch::log(1 - pred) * pred.pow(2) * (1 - gt).pow(4) * (1 - pos);
  return -(pos_loss.sum() + neg_loss.sum()) / pos.sum().clamp_min(1);
}

torch::Tensor multibin_loss(const torch::Tensor& pred, const torch::Tensor& alpha, const torch::Tensor& mask, int64_t bins) {
  const int64_t b = pred.size(0), m = pred.size(1);
  auto conf = pred.narrow(-1, 0, bins);
  // FACT: r=torch.randn(2,5,12).narrow(-1,4,8); v=r.view(2,5,4,2); assert not is_contiguous(r) and is_view_of(v,r)
  auto sc = pred.narrow(-1, bins, 2 * bins).view({b, m, bins, 2});  // LOOKALIKE: tensor-view-non-contiguous -- only the last dim is split, strides can express it
  // FACT: x=torch.randn(2,4,12,requires_grad=True); p=x*1; s=p.narrow(-1,4,8).view(2,4,4,2); n=s.norm(2,-1,True); s.div_(n); assert backward_fails(lambda: p.sum().backward())
  sc.div_(sc.norm(2, -1, true));  // EXPECT: tensor-inplace-on-saved
  auto diff = alpha.unsqueeze(-1) - torch::arange(bins, alpha.options()) * (2 * M_PI / bins);
  diff = torch::atan2(torch::sin(diff), torch::cos(diff));
  auto target = diff.abs().argmin(-1);
  // FACT: p=torch.randn(2,5,12); c=p.narrow(-1,0,4); assert not is_contiguous(c) and is_view_of(c.reshape(-1,4), p)
  auto ce = F::cross_entropy(conf.reshape({-1, bins}), target.view(-1), F::CrossEntropyFuncOptions().reduction(torch::kNone));  // LOOKALIKE: tensor-reshape-non-contiguous -- narrowing the last dim leaves the leading dims mergeable, a view
  auto res = diff.gather(-1, target.unsqueeze(-1)).squeeze(-1);
  auto sc_t = sc.gather(2, target.view({b, m, 1, 1}).expand({-1, -1, 1, 2})).squeeze(2);
  auto reg = (sc_t - torch::stack({torch::sin(res), torch::cos(res)}, -1)).abs().sum(-1);
  return ((ce.view({b, m}) + reg) * mask).sum() / mask.sum().clamp_min(1);
}

struct Targets {
  torch::Tensor heatmap, ind, center_int, offset, wh, depth, dims, alpha, mask, depth_map;
  Targets to(torch::Device d) const {
    return {heatmap.to(d), ind.to(d), center_int.to(d), offset.to(d), wh.to(d), depth.to(d), dims.to(d), alpha.to(d), mask.to(d), depth_map.to(d)};
  }
};

Targets build_targets(const std::vector<Frame>& frames, size_t first, const HeadConfig& cfg, int64_t h, int64_t w) {
  const int64_t b_sz = cfg.batch_size, m = cfg.max_objs;
  Targets t{torch::zeros({b_sz, cfg.num_classes, h, w}), torch::zeros({b_sz, m}, torch::kLong),
            torch::zeros({b_sz, m, 2}, torch::kLong), torch::zeros({b_sz, m, 2}), torch::zeros({b_sz, m, 2}),
            torch::ones({b_sz, m}), torch::ones({b_sz, m, 3}), torch::zeros({b_sz, m}), torch::zeros({b_sz, m}),
            torch::zeros({b_sz, h, w})};
  auto r = torch::arange(-2, 3, torch::kFloat);
  auto gauss = torch::exp(-(r.view({-1, 1}).pow(2) + r.view({1, -1}).pow(2)) / 2.0);
  for (int64_t b = 0; b < b_sz; ++b) {
    const Frame& f = frames[first + b];
    t.depth_map[b].copy_(F::interpolate(f.lidar_depth.view({1, 1, f.lidar_depth.size(0), -1}),
                                        F::InterpolateFuncOptions().size(std::vector<int64_t>{h, w}).mode(torch::kNearest))[0][0]);
    for (int64_t k = 0; k < std::min<int64_t>(m, f.objects.size()); ++k) {
      const Object3D& o = f.objects[k];
      auto proj = torch::matmul(f.K, torch::tensor({o.x, o.y - o.h / 2, o.z}));
      auto ct = proj.narrow(0, 0, 2) / (proj[2] * double(cfg.down_ratio));
      auto ct_int = t.center_int[b][k];
      ct_int.copy_(ct);  // EXPECT: tensor-copy-narrowing
      const int64_t cx = ct_int[0].item<int64_t>(), cy = ct_int[1].item<int64_t>();
      if (cx < 0 || cy < 0 || cx >= w || cy >= h) continue;
      t.offset[b][k].copy_(ct - ct_int);  // LOOKALIKE: tensor-copy-narrowing -- float minus int64 stays float, written into float
      t.ind[b][k] = cy * w + cx;
      t.wh[b][k].copy_(torch::tensor({o.x2 - o.x1, o.y2 - o.y1}) / double(cfg.down_ratio));
      t.depth[b][k] = o.z;
      t.dims[b][k].copy_(torch::tensor({o.h, o.w, o.l}));
      t.alpha[b][k] = o.alpha;
      t.mask[b][k] = 1.0;
      const int64_t y0 = std::max<int64_t>(cy - 2, 0), y1 = std::min(cy + 3, h), x0 = std::max<int64_t>(cx - 2, 0), x1 = std::min(cx + 3, w);
      auto region = t.heatmap[b][o.cls].narrow(0, y0, y1 - y0).narrow(1, x0, x1 - x0);
      region.copy_(torch::maximum(region, gauss.narrow(0, y0 - cy + 2, y1 - y0).narrow(1, x0 - cx + 2, x1 - x0)));
    }
  }
  return t;
}

struct LossStats { torch::Tensor heat, offset, dims, depth, depth_dense, orient, total; };

LossStats compute_losses(Mono3DHead& head, const HeadOutput& out, const Targets& t, const HeadConfig& cfg) {
  LossStats s;
  auto mask = t.mask;
  auto norm = mask.sum().clamp_min(1);
  auto l1 = [&](const torch::Tensor& p, const torch::Tensor& g) { return ((p - g).abs() * mask.unsqueeze(-1)).sum() / norm; };
  s.heat = focal_loss(out.heatmap, t.heatmap);
  s.offset = l1(gather_feat(out.offset, t.ind), t.offset) + 0.1 * l1(gather_feat(out.wh, t.ind), t.wh);
  s.dims = l1(gather_feat(out.dims, t.ind), t.dims.log());
  auto flat_depth = t.depth.view(-1);
  // FACT: c=torch.rand(4); r=c.unsqueeze(0).repeat(3,1); r.sub_(torch.rand(3,1)).abs_(); assert is_copy_of(r,c)
  auto gap = head->centers.unsqueeze(0).repeat({flat_depth.size(0), 1});
  gap.sub_(flat_depth.unsqueeze(1)).abs_();  // LOOKALIKE: tensor-inplace-on-expanded -- repeat materialises every row
  auto dbin = gap.argmin(1).view_as(t.depth);
  auto res_t = t.depth - head->centers.index_select(0, dbin.view(-1)).view_as(t.depth);
  auto res_p = gather_feat(out.depth_res, t.ind).gather(2, dbin.unsqueeze(-1)).squeeze(-1);
  auto exp_p = gather_feat(out.depth, t.ind).squeeze(-1);
  s.depth = (((res_p - res_t).abs() + (exp_p - t.depth).abs()) * mask).sum() / norm;
  auto lidar = t.depth_map.view(-1);
  auto valid = (lidar > 0).to(lidar.scalar_type());
  auto lidar_bin = torch::bucketize(lidar, head->edges).sub(1).clamp(0, cfg.depth_bins - 1);
  // FACT: x=torch.randn(2,6,4,5); assert is_copy_of(x.permute(0,2,3,1).reshape(-1,6), x)
  auto dense_logits = out.depth_logits.permute({0, 2, 3, 1}).reshape({-1, cfg.depth_bins});  // EXPECT: tensor-reshape-non-contiguous
  auto dense_ce = F::cross_entropy(dense_logits, lidar_bin, F::CrossEntropyFuncOptions().reduction(torch::kNone));
  s.depth_dense = (dense_ce * valid).sum() / valid.sum().clamp_min(1);
  s.orient = multibin_loss(gather_feat(out.orient, t.ind), t.alpha, mask, cfg.orient_bins);
  s.total = s.heat + s.offset + 0.1 * s.dims + s.depth + 0.5 * s.depth_dense + s.orient;
  return s;
}

struct Detections { torch::Tensor scores, classes, boxes2d, loc, dims, roty; };

Detections decode(const HeadOutput& out, const torch::Tensor& K_inv, const HeadConfig& cfg) {
  torch::NoGradGuard no_grad;
  auto heat = out.heatmap.contiguous();
  auto keep = F::max_pool2d(heat, F::MaxPool2dFuncOptions(3).stride(1).padding(1)).eq(heat);
  // FACT: h=torch.rand(1,3,4,4); c=h.contiguous(); c.mul_(0.5); assert shares_storage(c,h)
  heat.mul_(keep);  // EXPECT: tensor-alias-then-mutate
  const int64_t b = heat.size(0), h = heat.size(2), w = heat.size(3), bins = cfg.orient_bins;
  auto [scores, inds] = heat.view({b, -1}).topk(cfg.topk);
  auto pix = inds.remainder(h * w);
  auto xs = pix.remainder(w).to(torch::kFloat), ys = pix.div(w, "floor").to(torch::kFloat);
  auto off = gather_feat(out.offset, pix), size = gather_feat(out.wh, pix);
  auto u = (xs + off.select(-1, 0)) * cfg.down_ratio, v = (ys + off.select(-1, 1)) * cfg.down_ratio;
  auto boxes2d = torch::stack({u, v, size.select(-1, 0) * cfg.down_ratio, size.select(-1, 1) * cfg.down_ratio}, -1);
  boxes2d.narrow(-1, 0, 2).sub_(boxes2d.narrow(-1, 2, 2) / 2);
  // FACT: b=torch.rand(2,5,4); e=b[...,:2]+b[...,2:]; b[...,2:].add_(b[...,:2]); assert torch.equal(b[...,2:], e)
  boxes2d.narrow(-1, 2, 2).add_(boxes2d.narrow(-1, 0, 2));  // LOOKALIKE: tensor-inplace-overlap -- the two column pairs share no element
  auto depth = gather_feat(out.depth, pix).squeeze(-1);
  // FACT: f=torch.randn(2,3,4,5); i=torch.randint(0,20,(2,6)); g=f.permute(0,2,3,1).reshape(2,-1,3).gather(1,i.unsqueeze(2).expand(-1,-1,3)); g.exp_(); assert is_copy_of(g,f)
  auto dims = gather_feat(out.dims, pix).exp_();  // LOOKALIKE: tensor-alias-then-mutate -- gather writes a new tensor
  auto orient = gather_feat(out.orient, pix);
  auto bin = orient.narrow(-1, 0, bins).argmax(-1);
  auto sc = orient.narrow(-1, bins, 2 * bins).view({b, -1, bins, 2}).gather(2, bin.view({b, -1, 1, 1}).expand({-1, -1, 1, 2})).squeeze(2);
  auto alpha = torch::atan2(sc.select(-1, 0), sc.select(-1, 1)) + bin.to(torch::kFloat) * (2 * M_PI / bins);
  auto loc = torch::matmul(torch::stack({u * depth, v * depth, depth}, -1), K_inv.transpose(1, 2));  // EXPECT: tensor-device-mismatch
  auto roty = alpha + torch::atan2(loc.select(-1, 0), loc.select(-1, 2));
  return {scores, inds.div(h * w, "floor"), boxes2d, loc, dims, roty};
}

torch::Tensor box_corners(const torch::Tensor& loc, const torch::Tensor& dims, const torch::Tensor& roty) {
  const int64_t n = loc.size(0);
  auto hh = dims.select(1, 0), ww = dims.select(1, 1) / 2, ll = dims.select(1, 2) / 2, zero = torch::zeros_like(hh);
  auto xs = torch::stack({ll, ll, -ll, -ll, ll, ll, -ll, -ll}, 1);
  auto ys = torch::stack({zero, zero, zero, zero, -hh, -hh, -hh, -hh}, 1);
  auto zs = torch::stack({ww, -ww, -ww, ww, ww, -ww, -ww, ww}, 1);
  auto c = torch::cos(roty), s = torch::sin(roty), one = torch::ones_like(c), z = torch::zeros_like(c);
  auto rot = torch::stack({c, z, s, z, one, z, -s, z, c}, 1).view({n, 3, 3});
  auto corners = torch::matmul(rot, torch::stack({xs, ys, zs}, 1)).transpose(1, 2);
  // FACT: c=torch.randn(4,3,8).transpose(1,2); assert raises(lambda: c.view(-1,3), "view size is not compatible")
  return (corners.view({-1, 3}) + loc.repeat_interleave(8, 0)).view({n, 8, 3});  // EXPECT: tensor-view-non-contiguous
}

void run(const std::string& root, torch::Device device) {
  HeadConfig cfg;
  auto backbone = torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 32, 3).stride(2).padding(1)), torch::nn::BatchNorm2d(32), torch::nn::ReLU(),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(32, cfg.in_channels, 3).stride(2).padding(1)),
      torch::nn::BatchNorm2d(cfg.in_channels), torch::nn::ReLU());
  Mono3DHead head(cfg), ema(cfg);
  backbone->to(device), head->to(device), ema->to(device);
  auto params = head->parameters(), ema_params = ema->parameters();
  std::vector<torch::Tensor> all = backbone->parameters();
  all.insert(all.end(), params.begin(), params.end());
  torch::optim::Adam opt(all, torch::optim::AdamOptions(cfg.lr));
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) ema_params[i].copy_(params[i]);
  }
  auto train_set = load_frames(root, "train"), val_set = load_frames(root, "val");
  LossStats running{};
  running.depth = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    for (size_t first = 0; first + cfg.batch_size <= train_set.size(); first += cfg.batch_size, ++step) {
      std::vector<torch::Tensor> images;
      for (int64_t i = 0; i < cfg.batch_size; ++i) images.push_back(train_set[first + i].image);
      auto feat = backbone->forward(torch::stack(images).to(device));
      auto out = head->forward(feat);
      auto t = build_targets(train_set, first, cfg, feat.size(2), feat.size(3)).to(device);
      auto losses = compute_losses(head, out, t, cfg);
      opt.zero_grad();
      losses.total.backward();
      opt.step();
      running.depth += losses.depth;  // EXPECT: tensor-graph-kept-across-iterations
      {
        torch::NoGradGuard no_grad;
        for (size_t i = 0; i < params.size(); ++i)
          ema_params[i].data().mul_(cfg.ema_decay).add_(params[i].data(), 1.0 - cfg.ema_decay);  // LOOKALIKE: tensor-inplace-on-detached -- writes the EMA copy on purpose, under NoGradGuard
      }
      if (step % cfg.log_every == 0)
        std::cout << "step " << step << " loss " << losses.total.item<float>() << std::endl;
    }
    std::cout << "epoch " << epoch << " mean depth loss " << running.depth.item<double>() / std::max<int64_t>(step, 1) << std::endl;
  }
  torch::NoGradGuard no_grad;
  backbone->eval(), ema->eval();
  auto val_heat = torch::zeros({}, torch::TensorOptions().device(device));
  for (size_t first = 0; first + cfg.batch_size <= val_set.size(); first += cfg.batch_size) {
    std::vector<torch::Tensor> images, intrinsics;
    for (int64_t i = 0; i < cfg.batch_size; ++i) {
      images.push_back(val_set[first + i].image);
      intrinsics.push_back(val_set[first + i].K);
    }
    auto feat = backbone->forward(torch::stack(images).to(device));
    auto out = ema->forward(feat);
    auto dets = decode(out, torch::inverse(torch::stack(intrinsics)), cfg);
    auto tg = build_targets(val_set, first, cfg, feat.size(2), feat.size(3));
    val_heat += focal_loss(out.heatmap, tg.heatmap.to(device));  // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard, no graph is recorded
    for (int64_t b = 0; b < cfg.batch_size; ++b) {
      auto sel = dets.scores[b] > cfg.score_thresh;
      auto corners = box_corners(dets.loc[b].index({sel}), dets.dims[b].index({sel}), dets.roty[b].index({sel}));
      write_kitti("results", int64_t(first) + b, dets.scores[b].index({sel}).cpu(), corners.cpu());
    }
  }
  std::cout << "val heatmap loss " << val_heat.item<double>() << std::endl;
}

}  // namespace mono3d

int main(int argc, char** argv) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  mono3d::run(argc > 1 ? argv[1] : "data/kitti", device);
  return 0;
}
