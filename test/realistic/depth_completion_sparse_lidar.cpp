// Depth completion from sparse LiDAR: projection into the camera image, sparsity-invariant convs,
// normalized-convolution confidence propagation, RGB guidance, KITTI-style metrics on valid pixels.
#include <torch/torch.h>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::Slice;

struct DCConfig {
  double max_depth = 85.0, min_depth = 0.1, lr = 1e-3;
  int64_t skip_rows = 40;                   // rows above the LiDAR's vertical field of view
  int64_t eval_h = 352, eval_w = 1216;      // KITTI evaluation crop
};

struct Calib { torch::Tensor K, T_cam_lidar; };  // intrinsics, LiDAR-to-camera extrinsics

// Rasterises the LiDAR returns that fall inside the image into a depth map (0 = no return).
torch::Tensor project_to_depth(const torch::Tensor& scan, const Calib& calib, int64_t H, int64_t W) {
  auto xyz = scan.narrow(1, 0, 3).to(torch::kDouble);  // drop intensity
  auto pts = torch::cat({xyz, torch::ones({xyz.size(0), 1}, xyz.options())}, 1);
  auto cam = torch::matmul(calib.T_cam_lidar, pts.t()).narrow(0, 0, 3);
  cam = cam.index({Slice(), cam[2] > 0.5});
  auto uvw = torch::matmul(calib.K, cam);
  auto u = (uvw[0] / uvw[2]).round().to(torch::kLong), v = (uvw[1] / uvw[2]).round().to(torch::kLong);
  auto inside = (u >= 0) & (u < W) & (v >= 0) & (v < H);
  auto depth = torch::zeros({H, W}, torch::kFloat);
  auto z = cam[2].masked_select(inside);
  depth.index_put_({v.masked_select(inside), u.masked_select(inside)}, z.to(depth.scalar_type()));  // LOOKALIKE: tensor-copy-narrowing -- the double->float conversion is spelled out with to(dst.scalar_type())
  return depth;
}

struct Sample { torch::Tensor rgb, sparse, gt; };

Sample make_sample(const torch::Tensor& rgb_hwc, const torch::Tensor& scan, const Calib& calib, const torch::Tensor& gt_png) {
  // FACT: p = torch.zeros(4, 4, dtype=torch.int32); g = p.to(torch.float32); g.div_(256.0); assert is_copy_of(g, p)
  auto gt = gt_png.to(torch::kFloat);
  gt.div_(256.0);  // LOOKALIKE: tensor-alias-then-mutate -- to(kFloat) of the integer PNG is a new tensor
  // FACT: a = torch.zeros(4, 5, 3, dtype=torch.uint8); r = a.permute(2, 0, 1).to(torch.float32); r.div_(255.0); assert is_copy_of(r, a)
  auto rgb = rgb_hwc.permute({2, 0, 1}).to(torch::kFloat).div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- the uint8 image is converted, so to() returns a new tensor
  auto sparse = project_to_depth(scan, calib, gt.size(0), gt.size(1));
  return {rgb.unsqueeze(0), sparse.unsqueeze(0).unsqueeze(0), gt.unsqueeze(0).unsqueeze(0)};
}

// Cheap dense guess for the guidance branch: dilate, then carry returns along rows and down columns.
torch::Tensor initial_guess(const torch::Tensor& sparse, int64_t passes) {
  auto filled = F::max_pool2d(sparse, F::MaxPool2dFuncOptions(3).stride(1).padding(1));
  const int64_t H = filled.size(2), W = filled.size(3);
  for (int64_t p = 0; p < passes; ++p) {
    auto left = filled.narrow(3, 0, W - 1), right = filled.narrow(3, 1, W - 1);
    // FACT: d = torch.zeros(1, 1, 2, 6); d[..., 0] = 1.0; l = d.narrow(3, 0, 5); r = d.narrow(3, 1, 5); r.addcmul_(l, r.eq(0)); assert shares_storage(l, r) and d[0, 0, 0, 5] == 1.0
    right.addcmul_(left, right.eq(0));  // EXPECT: tensor-inplace-overlap
    auto up = filled.narrow(2, 0, H - 1), down = filled.narrow(2, 1, H - 1);
    // FACT: d = torch.zeros(1, 1, 6, 2); d[0, 0, 0] = 1.0; u = d.narrow(2, 0, 5); w = d.narrow(2, 1, 5); s = torch.where(w > 0, w, u); w.copy_(s); assert is_copy_of(s, d) and d[0, 0, 2, 0] == 0
    down.copy_(torch::where(down > 0, down, up));  // LOOKALIKE: tensor-inplace-overlap -- where() materialises the source before copy_ writes
  }
  return filled;
}

// Sparsity-invariant convolution (Uhrig et al.): normalise by the number of valid inputs.
struct SparseConvImpl : torch::nn::Module {
  torch::nn::Conv2d conv{nullptr};
  torch::Tensor bias;
  int64_t k;
  SparseConvImpl(int64_t in, int64_t out, int64_t k_) : k(k_) {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).padding(k / 2).bias(false)));
    bias = register_parameter("bias", torch::zeros({out}));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& mask) {
    auto norm = F::conv2d(mask, torch::ones({1, 1, k, k}, mask.options()), F::Conv2dFuncOptions().padding(k / 2));
    auto y = conv->forward(x * mask);
    // FACT: x = torch.rand(1, 1, 5, 5, requires_grad=True); w = torch.rand(1, 1, 3, 3, requires_grad=True); assert not backward_fails(lambda: torch.nn.functional.conv2d(x, w).div_(2.0).sum().backward())
    y.div_(norm + 1e-8);  // LOOKALIKE: tensor-inplace-on-saved -- conv2d keeps its input and weight for backward, not its output
    y = y + bias.view({1, -1, 1, 1});
    // FACT: x = torch.rand(4, requires_grad=True); y = x * 2 + 1; y.relu_(); assert not backward_fails(lambda: y.sum().backward())
    y.relu_();  // LOOKALIKE: tensor-inplace-on-saved -- the sum relu_ overwrites is not kept by add
    return {y, F::max_pool2d(mask, F::MaxPool2dFuncOptions(k).stride(1).padding(k / 2))};
  }
};
TORCH_MODULE(SparseConv);

// Normalized convolution (Eldesokey et al.): propagates a per-pixel confidence with the depth.
struct NConvImpl : torch::nn::Module {
  torch::Tensor weight, bias;
  int64_t pad;
  NConvImpl(int64_t in, int64_t out, int64_t k) : pad(k / 2) {
    weight = register_parameter("weight", torch::empty({out, in, k, k}));
    bias = register_parameter("bias", torch::zeros({out}));
    torch::nn::init::uniform_(weight, 0.0, 2.0 / static_cast<double>(in * k * k));
  }
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x, const torch::Tensor& conf) {
    auto opts = F::Conv2dFuncOptions().padding(pad);
    auto denom = F::conv2d(conf, weight, opts);
    auto out = F::conv2d(x * conf, weight, opts) / (denom + 1e-20) + bias.view({1, -1, 1, 1});
    return {out, denom / weight.sum({1, 2, 3}).view({1, -1, 1, 1})};
  }
};
TORCH_MODULE(NConv);

struct DepthNetImpl : torch::nn::Module {
  double max_depth;
  SparseConv sc1{nullptr}, sc2{nullptr};
  NConv nc1{nullptr}, nc2{nullptr}, nc3{nullptr};
  torch::nn::Sequential rgb_enc{nullptr};
  torch::nn::Conv2d depth_head{nullptr}, conf_head{nullptr};
  torch::Tensor log_var;  // learned (log) variance weighting the depth loss

  explicit DepthNetImpl(double max_depth_) : max_depth(max_depth_) {
    using namespace torch::nn;
    sc1 = register_module("sc1", SparseConv(1, 16, 11));
    sc2 = register_module("sc2", SparseConv(16, 16, 5));
    nc1 = register_module("nc1", NConv(1, 4, 5));
    nc2 = register_module("nc2", NConv(4, 4, 5));
    nc3 = register_module("nc3", NConv(4, 1, 3));
    rgb_enc = register_module("rgb_enc", Sequential(Conv2d(Conv2dOptions(4, 32, 3).padding(1)), ReLU(),
                                                    Conv2d(Conv2dOptions(32, 32, 3).padding(1)), ReLU()));
    depth_head = register_module("depth_head", Conv2d(Conv2dOptions(32 + 16 + 2, 1, 3).padding(1)));
    conf_head = register_module("conf_head", Conv2d(Conv2dOptions(32 + 16 + 2, 1, 3).padding(1)));
    log_var = register_parameter("log_var", torch::zeros({1}));
  }

  std::vector<torch::Tensor> nconv_weights() { return {nc1->weight, nc2->weight, nc3->weight}; }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& rgb, const torch::Tensor& sparse) {
    auto mask = (sparse > 0).to(sparse.scalar_type());
    // FACT: s = torch.rand(1, 1, 4, 4); x = s.contiguous(); x.div_(85.0); assert shares_storage(x, s) and x is s
    auto x = sparse.contiguous();
    x.div_(max_depth);  // EXPECT: tensor-alias-then-mutate
    auto [f1, m1] = sc1->forward(x, mask);
    auto [f2, m2] = sc2->forward(f1, m1);
    auto [d1, c1] = nc1->forward(x, mask);
    auto [d2, c2] = nc2->forward(d1, c1);
    auto [d3, c3] = nc3->forward(d2, c2);
    auto guide = rgb_enc->forward(torch::cat({rgb, initial_guess(x, 4)}, 1));
    auto feat = torch::cat({guide, f2, d3, c3}, 1);
    auto depth = (depth_head->forward(feat) + d3) * max_depth;
    auto confidence = torch::sigmoid(conf_head->forward(feat));
    // FACT: x = torch.randn(4, requires_grad=True); c = torch.sigmoid(x); c.masked_fill_(torch.tensor([True, False, False, True]), 1.0); assert backward_fails(lambda: (c * 2).sum().backward())
    confidence.masked_fill_(mask > 0, 1.0);  // EXPECT: tensor-inplace-on-saved
    return {confidence * sparse + (1 - confidence) * depth, confidence};
  }
};
TORCH_MODULE(DepthNet);

// ---- loss and metrics ----
torch::Tensor masked_mse(const torch::Tensor& pred, const torch::Tensor& gt, int64_t skip_rows) {
  const auto b = pred.size(0), h = pred.size(2);
  // FACT: d = torch.rand(2, 1, 8, 6); r = d.narrow(2, 3, 5).reshape(2, -1); assert is_view_of(r, d) and not is_contiguous(d.narrow(2, 3, 5))
  auto p = pred.narrow(2, skip_rows, h - skip_rows).reshape({b, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- dropping whole rows keeps each image one strided block: reshape is a view
  auto g = gt.narrow(2, skip_rows, h - skip_rows).reshape({b, -1});
  auto valid = (g > 0).to(p.scalar_type());
  return ((p - g).pow(2) * valid).sum() / valid.sum().clamp_min(1.0);
}

torch::Tensor crop_eval(const torch::Tensor& x, const DCConfig& cfg) {
  const int64_t H = x.size(2), W = x.size(3);
  return x.narrow(2, H - cfg.eval_h, cfg.eval_h).narrow(3, (W - cfg.eval_w) / 2, cfg.eval_w);
}

struct Metrics { torch::Tensor rmse, mae, irmse, imae; };  // metres and 1/km, averaged over images

Metrics compute_metrics(const torch::Tensor& pred, const torch::Tensor& gt, const torch::Tensor& region, const DCConfig& cfg) {
  const auto b = pred.size(0);
  // FACT: d = torch.rand(2, 2, 8, 10); r = d.narrow(2, 1, 6).narrow(3, 2, 6).reshape(2, 2, -1); assert is_copy_of(r, d)
  auto pg = crop_eval(torch::cat({pred, gt}, 1), cfg).reshape({b, 2, -1});  // EXPECT: tensor-reshape-non-contiguous
  auto p = pg.select(1, 0).clamp(cfg.min_depth, cfg.max_depth), g = pg.select(1, 1);
  auto valid = ((g > 0) & region.reshape({1, -1})).to(p.scalar_type());
  auto n = valid.sum(1).clamp_min(1.0);
  auto d = (p - g) * valid;
  auto inv_p = p.clone().reciprocal_();  // EXPECT: tensor-unnecessary-clone
  auto inv_d = (inv_p - g.clamp_min(cfg.min_depth).reciprocal()) * valid * 1000.0;
  return {(d.pow(2).sum(1) / n).sqrt().mean(), (d.abs().sum(1) / n).mean(),
          (inv_d.pow(2).sum(1) / n).sqrt().mean(), (inv_d.abs().sum(1) / n).mean()};
}

void save_depth_png(const std::string& path, const torch::Tensor& depth_x256);  // image I/O (libpng) lives elsewhere

// ---- training and evaluation ----
void train_epoch(DepthNet& model, torch::optim::Optimizer& opt, const std::vector<Sample>& data, const DCConfig& cfg,
                 torch::Device device) {
  model->train();
  std::vector<torch::Tensor> rmse_hist;
  for (const auto& s : data) {
    auto rgb = s.rgb.to(device), sparse = s.sparse.to(device), gt = s.gt.to(device);
    auto [pred, conf] = model->forward(rgb, sparse);
    auto mse = masked_mse(pred, gt, cfg.skip_rows);
    auto loss = torch::exp(-model->log_var) * mse + model->log_var;
    opt.zero_grad();
    loss.sum().backward();
    opt.step();
    // FACT: w = torch.nn.Parameter(torch.zeros(1)); assert raises(lambda: w.clamp_(-4.0, 4.0), "leaf Variable that requires grad")
    model->log_var.clamp_(-4.0, 4.0);  // EXPECT: tensor-inplace-on-leaf
    {
      torch::NoGradGuard no_grad;
      for (auto& w : model->nconv_weights()) w.detach().clamp_min_(0.0);  // LOOKALIKE: tensor-inplace-on-detached -- projects the weights back to non-negative after the step, on purpose, with no graph alive
    }
    rmse_hist.push_back(mse.sqrt());  // EXPECT: tensor-graph-kept-across-iterations
  }
  std::printf("train rmse %.3f m\n", torch::stack(rmse_hist).mean().item<double>());
}

void evaluate(DepthNet& model, const std::vector<Sample>& val, const torch::Tensor& region_cpu, const DCConfig& cfg,
              torch::Device device, const std::string& out_dir) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto sums = torch::zeros({4}, torch::TensorOptions().device(device));
  auto png_buf = torch::empty({cfg.eval_h, cfg.eval_w}, torch::kInt32);
  double running_rmse = 0.0;
  for (size_t i = 0; i < val.size(); ++i) {
    auto region = region_cpu.to(device);  // EXPECT: tensor-clone-in-loop
    auto [pred, conf] = model->forward(val[i].rgb.to(device), val[i].sparse.to(device));  // LOOKALIKE: tensor-clone-in-loop -- each sample is new data
    auto m = compute_metrics(pred, val[i].gt.to(device), region, cfg);
    sums += torch::stack({m.rmse, m.mae, m.irmse, m.imae});  // LOOKALIKE: tensor-graph-kept-across-iterations -- evaluation runs under NoGradGuard, there is no graph to keep
    running_rmse += m.rmse.item<double>();  // EXPECT: tensor-sync-in-loop
    if ((i + 1) % 100 == 0) std::printf("[%zu/%zu] rmse %.3f\n", i + 1, val.size(), running_rmse / (i + 1));
    png_buf.copy_(crop_eval(pred, cfg)[0][0] * 256.0);  // EXPECT: tensor-copy-narrowing
    save_depth_png(out_dir + "/" + std::to_string(i) + ".png", png_buf);
  }
  auto mean = (sums / static_cast<double>(val.size())).cpu();
  auto a = mean.accessor<float, 1>();
  std::printf("RMSE %.1f mm  MAE %.1f mm  iRMSE %.2f  iMAE %.2f\n", a[0] * 1000, a[1] * 1000, a[2], a[3]);
}

int main() {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  DCConfig cfg;
  DepthNet model(cfg.max_depth);
  model->to(device);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));
  Calib calib{torch::tensor({{721.5, 0.0, 609.6}, {0.0, 721.5, 172.9}, {0.0, 0.0, 1.0}}, torch::kDouble),
              torch::tensor({{0.0, -1.0, 0.0, 0.0}, {0.0, 0.0, -1.0, -0.08}, {1.0, 0.0, 0.0, -0.27}, {0.0, 0.0, 0.0, 1.0}},
                            torch::kDouble)};
  std::vector<Sample> data;
  for (int i = 0; i < 4; ++i) {
    auto scan = torch::cat({torch::rand({20000, 1}) * 60 + 2, torch::randn({20000, 2}) * 8, torch::rand({20000, 1})}, 1);
    data.push_back(make_sample(torch::randint(0, 256, {375, 1242, 3}, torch::kUInt8), scan, calib,
                               torch::randint(0, 256 * 80, {375, 1242}, torch::kInt32)));
  }
  auto region = torch::ones({cfg.eval_h, cfg.eval_w}, torch::kBool);
  region.narrow(0, 0, cfg.skip_rows).fill_(false);
  for (int epoch = 0; epoch < 2; ++epoch) train_epoch(model, opt, data, cfg, device);
  evaluate(model, data, region, cfg, device, "pred");
}
