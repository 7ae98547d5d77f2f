// SiamRPN tracker: AlexNet backbone, depthwise xcorr RPN head, pair training, online tracking.
#include <torch/torch.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::Slice;

struct TrackerConfig {
  int64_t exemplar_size = 127, instance_size = 255, stride = 8;
  std::vector<double> ratios{0.33, 0.5, 1.0, 2.0, 3.0};
  std::vector<double> scales{8.0};
  double context_amount = 0.5, penalty_k = 0.16, window_influence = 0.40, lr = 0.30;
  int64_t hidden = 256, history = 5;  // history: boxes averaged for the reported box
  int64_t anchor_num() const { return static_cast<int64_t>(ratios.size() * scales.size()); }
  int64_t score_size() const { return (instance_size - exemplar_size) / stride + 1; }
};

torch::nn::Sequential conv_bn_relu(int64_t in, int64_t out, int64_t k) {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k).bias(false)), torch::nn::BatchNorm2d(out), torch::nn::ReLU(torch::nn::ReLUOptions(true)));
}

struct AlexNetImpl : torch::nn::Module {
  torch::nn::Sequential features{nullptr};
  AlexNetImpl() {
    using namespace torch::nn;
    features = register_module(
        "features",
        Sequential(Conv2d(Conv2dOptions(3, 96, 11).stride(2)), BatchNorm2d(96),
                   MaxPool2d(MaxPool2dOptions(3).stride(2)), ReLU(ReLUOptions(true)),
                   Conv2d(Conv2dOptions(96, 256, 5)), BatchNorm2d(256),
                   MaxPool2d(MaxPool2dOptions(3).stride(2)), ReLU(ReLUOptions(true)),
                   Conv2d(Conv2dOptions(256, 384, 3)), BatchNorm2d(384), ReLU(ReLUOptions(true)),
                   Conv2d(Conv2dOptions(384, 384, 3)), BatchNorm2d(384), ReLU(ReLUOptions(true)),
                   Conv2d(Conv2dOptions(384, 256, 3)), BatchNorm2d(256)));
    for (auto& m : modules(/*include_self=*/false))
      if (auto* conv = m->as<torch::nn::Conv2d>())
        torch::nn::init::kaiming_normal_(conv->weight, 0.0, torch::kFanOut, torch::kReLU);  // LOOKALIKE: tensor-inplace-on-leaf -- torch::nn::init writes the parameter under its own NoGradGuard
  }
  torch::Tensor forward(const torch::Tensor& x) { return features->forward(x); }
};
TORCH_MODULE(AlexNet);

torch::Tensor xcorr_depthwise(const torch::Tensor& x, const torch::Tensor& kernel) {
  const int64_t batch = kernel.size(0), channel = kernel.size(1);
  auto search = x.view({1, batch * channel, x.size(2), x.size(3)});
  auto out = F::conv2d(search, kernel.view({batch * channel, 1, kernel.size(2), kernel.size(3)}),
                       F::Conv2dFuncOptions().groups(batch * channel));
  return out.view({batch, channel, out.size(2), out.size(3)});
}

struct DepthwiseXCorrImpl : torch::nn::Module {
  torch::nn::Sequential conv_kernel{nullptr}, conv_search{nullptr};
  torch::nn::Conv2d head_conv{nullptr}, head_out{nullptr};
  torch::nn::BatchNorm2d head_bn{nullptr};
  DepthwiseXCorrImpl(int64_t in, int64_t hidden, int64_t out) {
    conv_kernel = register_module("conv_kernel", conv_bn_relu(in, hidden, 3));
    conv_search = register_module("conv_search", conv_bn_relu(in, hidden, 3));
    head_conv = register_module("head_conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, hidden, 1).bias(false)));
    head_bn = register_module("head_bn", torch::nn::BatchNorm2d(hidden));
    head_out = register_module("head_out", torch::nn::Conv2d(torch::nn::Conv2dOptions(hidden, out, 1)));
    // FACT: assert raises(lambda: torch.nn.Conv2d(4, 4, 1).bias.zero_(), "leaf Variable that requires grad")
    head_out->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  }
  torch::Tensor forward(const torch::Tensor& z, const torch::Tensor& x) {
    auto feat = xcorr_depthwise(conv_search->forward(x), conv_kernel->forward(z));
    auto h = torch::relu(head_bn->forward(head_conv->forward(feat)));
    // FACT: x = torch.randn(4, requires_grad=True); f = x * 2; h = torch.relu(f * 3); h += f; assert backward_fails(lambda: h.sum().backward())
    h += feat;  // EXPECT: tensor-inplace-on-saved
    return head_out->forward(h);
  }
};
TORCH_MODULE(DepthwiseXCorr);

struct SiamRPNImpl : torch::nn::Module {
  AlexNet backbone{nullptr};
  DepthwiseXCorr cls{nullptr}, loc{nullptr};
  torch::Tensor zf;  // cached template features while tracking
  explicit SiamRPNImpl(const TrackerConfig& cfg) {
    backbone = register_module("backbone", AlexNet());
    cls = register_module("cls", DepthwiseXCorr(256, cfg.hidden, 2 * cfg.anchor_num()));
    loc = register_module("loc", DepthwiseXCorr(256, cfg.hidden, 4 * cfg.anchor_num()));
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& z, const torch::Tensor& x) {
    auto zfeat = backbone->forward(z), xfeat = backbone->forward(x);
    return {cls->forward(zfeat, xfeat), loc->forward(zfeat, xfeat)};
  }
  void set_template(const torch::Tensor& z) { zf = backbone->forward(z); }
  std::pair<torch::Tensor, torch::Tensor> track(const torch::Tensor& x) {
    auto xfeat = backbone->forward(x);
    return {cls->forward(zf, xfeat), loc->forward(zf, xfeat)};
  }
};
TORCH_MODULE(SiamRPN);

// Anchors for every score-map cell, anchor-major, centred on the search crop: (cx, cy, w, h).
torch::Tensor generate_anchors(const TrackerConfig& cfg) {
  const int64_t A = cfg.anchor_num(), S = cfg.score_size(), area = cfg.stride * cfg.stride;
  auto anchors = torch::zeros({A, S * S, 4});
  auto grid = torch::arange(S, torch::kFloat).sub_(S / 2).mul_(cfg.stride);
  auto mesh = torch::meshgrid({grid, grid}, "ij");
  int64_t a = 0;
  for (double r : cfg.ratios) {
    const double ws = std::floor(std::sqrt(static_cast<double>(area) / r));
    const double hs = std::floor(ws * r);
    for (double s : cfg.scales) {
      auto row = anchors[a++];
      // FACT: a = torch.zeros(5, 16, 4); v = a[0].select(1, 0).view(4, 4); assert is_view_of(v, a) and not is_contiguous(a[0].select(1, 0))
      row.select(1, 0).view({S, S}).copy_(mesh[1]);  // LOOKALIKE: tensor-view-non-contiguous -- view only splits the one strided dim, which strides can express
      row.select(1, 1).view({S, S}).copy_(mesh[0]);
      row.select(1, 2).fill_(ws * s);
      row.select(1, 3).fill_(hs * s);
    }
  }
  return anchors.view({-1, 4});
}

struct TrackResult { torch::Tensor box, score; };  // smoothed (cx, cy, w, h), penalised score

class SiamRPNTracker {
 public:
  SiamRPNTracker(SiamRPN model, TrackerConfig cfg, torch::Device device)
      : model_(std::move(model)), cfg_(std::move(cfg)), device_(device) {
    model_->to(device_);
    model_->eval();
    anchors_ = generate_anchors(cfg_);
    const int64_t S = cfg_.score_size();
    auto hann = torch::hann_window(S, /*periodic=*/false, torch::kFloat);
    // FACT: h = torch.rand(5); c = h.view(1, 5).expand(5, 5).contiguous(); assert is_copy_of(c, h) and is_contiguous(c)
    auto hann2d = hann.view({1, S}).expand({S, S}).contiguous();
    hann2d.mul_(hann.view({S, 1}));  // LOOKALIKE: tensor-inplace-on-expanded -- contiguous() materialised the expanded rows into their own storage
    window_ = hann2d.flatten().repeat({cfg_.anchor_num()}).to(device_);
  }

  torch::Device device() const { return device_; }
  void init(const torch::Tensor& frame, const std::vector<float>& xywh) {
    torch::NoGradGuard no_grad;
    auto opts = torch::TensorOptions().dtype(torch::kFloat).device(device_);
    const float cx = xywh[0] + (xywh[2] - 1) / 2, cy = xywh[1] + (xywh[3] - 1) / 2;
    center_ = torch::tensor({cx, cy}, opts);
    size_ = torch::tensor({xywh[2], xywh[3]}, opts);
    history_ = torch::cat({center_, size_}).repeat({cfg_.history, 1});
    auto im = frame.to(device_, torch::kFloat);
    avg_chans_ = im.mean({1, 2});
    const float ctx = cfg_.context_amount * (xywh[2] + xywh[3]);
    const auto s_z = std::lround(std::sqrt((xywh[2] + ctx) * (xywh[3] + ctx)));
    model_->set_template(get_subwindow(im, cx, cy, cfg_.exemplar_size, s_z));
  }

  TrackResult track(const torch::Tensor& frame) {
    torch::NoGradGuard no_grad;
    auto im = frame.to(device_, torch::kFloat);
    auto state = torch::cat({center_, size_}).cpu();  // LOOKALIKE: tensor-sync-in-loop -- the next crop window is computed on the host from this state
    auto s = state.accessor<float, 1>();
    const float ctx = cfg_.context_amount * (s[2] + s[3]);
    const float s_z = std::sqrt((s[2] + ctx) * (s[3] + ctx));
    const float scale_z = cfg_.exemplar_size / s_z;
    const auto s_x = std::lround(s_z * cfg_.instance_size / cfg_.exemplar_size);
    auto [cls, loc] = model_->track(get_subwindow(im, s[0], s[1], cfg_.instance_size, s_x));
    auto score = convert_score(cls);
    auto pred = convert_bbox(loc);
    auto pred_wh = pred.narrow(0, 2, 2).t();
    auto sz = [](const torch::Tensor& wh) { return torch::sqrt((wh + wh.sum(1, true) * 0.5).prod(1)); };
    auto change = [](const torch::Tensor& r) { return torch::max(r, r.reciprocal()); };
    // FACT: assert raises(lambda: torch.tensor([3., 4.]).view(1, 2).expand(6, 2).add_(torch.rand(6, 1)), "more than one element")
    auto target_wh = (size_ * scale_z).view({1, 2}).expand_as(pred_wh);
    target_wh.add_(target_wh.sum(1, /*keepdim=*/true) * 0.5);  // EXPECT: tensor-inplace-on-expanded
    auto s_c = change(sz(pred_wh) / torch::sqrt(target_wh.prod(1)));
    auto r_c = change((size_[0] / size_[1]) / (pred_wh.select(1, 0) / pred_wh.select(1, 1)));
    auto penalty = torch::exp(-(r_c * s_c - 1) * cfg_.penalty_k);
    auto pscore = score.clone().mul_(penalty);  // EXPECT: tensor-unnecessary-clone
    pscore.mul_(1 - cfg_.window_influence).add_(window_, cfg_.window_influence);
    auto best = pscore.argmax();
    auto bbox = pred.index({Slice(), best}) / scale_z;
    auto lr = penalty[best] * score[best] * cfg_.lr;
    // FACT: c = torch.rand(2); p = c; c.add_(torch.rand(2)); assert shares_storage(p, c) and torch.equal(p, c)
    auto prev_center = center_;
    center_.add_(bbox.narrow(0, 0, 2));  // EXPECT: tensor-alias-then-mutate
    // FACT: s = torch.rand(2); p = s.clone(); s.mul_(0.7); assert is_copy_of(p, s) and not torch.equal(p, s)
    auto prev_size = size_.clone();
    size_.mul_(1 - lr).add_(bbox.narrow(0, 2, 2) * lr);  // LOOKALIKE: tensor-alias-then-mutate -- prev_size is a clone taken before the update
    size_.clamp_min_(10.0);
    motion_ = torch::cat({center_ - prev_center, size_ / prev_size});
    // FACT: h = torch.rand(5, 4); assert shares_storage(h[:-1], h[1:]) and raises(lambda: h[:-1].copy_(h[1:]), "some elements")
    history_.narrow(0, 0, cfg_.history - 1).copy_(history_.narrow(0, 1, cfg_.history - 1));  // EXPECT: tensor-inplace-overlap
    history_[cfg_.history - 1].copy_(torch::cat({center_, size_}));
    return {history_.mean(0), pscore[best]};
  }

 private:
  torch::Tensor get_subwindow(const torch::Tensor& im, float cx, float cy, int64_t model_sz,
                              int64_t original_sz) const {
    const int64_t H = im.size(1), W = im.size(2);
    const double c = (original_sz + 1) / 2.0;
    const auto x0 = static_cast<int64_t>(std::floor(cx - c + 0.5));
    const auto y0 = static_cast<int64_t>(std::floor(cy - c + 0.5));
    const int64_t left = std::max<int64_t>(0, -x0), top = std::max<int64_t>(0, -y0);
    const int64_t right = std::max<int64_t>(0, x0 + original_sz - W), bottom = std::max<int64_t>(0, y0 + original_sz - H);
    torch::Tensor patch;
    if (left + top + right + bottom > 0) {
      // FACT: a = torch.rand(3); c = a.view(3, 1, 1).expand(3, 6, 6).clone(); assert is_copy_of(c, a) and c.stride() == (36, 6, 1)
      auto padded = avg_chans_.view({3, 1, 1}).expand({3, H + top + bottom, W + left + right}).clone();
      padded.narrow(1, top, H).narrow(2, left, W).copy_(im);  // LOOKALIKE: tensor-inplace-on-expanded -- clone() gave the padded canvas dense storage of its own
      patch = padded.narrow(1, y0 + top, original_sz).narrow(2, x0 + left, original_sz);
    } else {
      patch = im.narrow(1, y0, original_sz).narrow(2, x0, original_sz);
    }
    patch = patch.unsqueeze(0);
    if (original_sz == model_sz) return patch;
    return F::interpolate(patch, F::InterpolateFuncOptions().size(std::vector<int64_t>{model_sz, model_sz})
                                     .mode(torch::kBilinear).align_corners(false));
  }
  torch::Tensor convert_score(const torch::Tensor& cls) const {
    auto logits = cls.permute({1, 2, 3, 0}).contiguous().view({2, -1}).t();
    return torch::softmax(logits, 1).select(1, 1);
  }
  torch::Tensor convert_bbox(const torch::Tensor& loc) const {
    // FACT: l = torch.rand(1, 20, 5, 5); d = l.permute(1, 2, 3, 0).reshape(4, -1); assert is_view_of(d, l)
    auto delta = loc.permute({1, 2, 3, 0}).reshape({4, -1});  // LOOKALIKE: tensor-reshape-non-contiguous -- with one search crop the permute only moves a size-1 dim, so reshape is a view
    auto a = anchors_.t();
    auto a_wh = a.narrow(0, 2, 2);
    return torch::cat({delta.narrow(0, 0, 2) * a_wh + a.narrow(0, 0, 2), delta.narrow(0, 2, 2).exp() * a_wh});  // EXPECT: tensor-device-mismatch
  }

  SiamRPN model_;
  TrackerConfig cfg_;
  torch::Device device_;
  torch::Tensor anchors_, window_, avg_chans_, center_, size_, history_, motion_;
};

// ---- offline training on template/search pairs ----
struct PairBatch {
  torch::Tensor template_img, search_img, label_cls /* 1 pos, 0 neg, -1 ignore */, label_loc, label_loc_weight;
};

torch::Tensor log_softmax_cls(const torch::Tensor& cls, int64_t anchor_num) {
  const auto b = cls.size(0), h = cls.size(2), w = cls.size(3);
  auto x = cls.view({b, 2, anchor_num, h, w}).permute({0, 2, 3, 4, 1}).contiguous();
  return torch::log_softmax(x, 4);
}

torch::Tensor cls_loss_ohem(const torch::Tensor& logp, const torch::Tensor& label, int64_t neg_ratio) {
  auto flat = logp.view({-1, 2}), lab = label.view({-1});
  auto pos = (lab == 1).nonzero().squeeze(1);
  // FACT: l = torch.rand(2, 5, 4, 4, 2); v = l.select(4, 1).view(-1); assert is_view_of(v, l) and not is_contiguous(l.select(4, 1))
  auto fg = logp.detach().select(4, 1).view({-1});  // LOOKALIKE: tensor-view-non-contiguous -- selecting the last dim leaves one uniform stride, so the flattening view is legal
  // FACT: x = torch.randn(8, 2, requires_grad=True); y = torch.log_softmax(x, 1); y.detach().select(1, 1).masked_fill_(torch.rand(8) > 0.5, -1e4); assert backward_fails(lambda: y.sum().backward())
  fg.masked_fill_(lab != 0, -1e4);  // EXPECT: tensor-inplace-on-detached
  const int64_t num_pos = std::max<int64_t>(pos.size(0), 1);
  auto neg = std::get<1>(fg.topk(std::min<int64_t>(num_pos * neg_ratio, fg.size(0))));
  auto loss_pos = -flat.index_select(0, pos).select(1, 1).mean();
  auto loss_neg = -flat.index_select(0, neg).select(1, 0).mean();
  return 0.5 * loss_pos + 0.5 * loss_neg;
}

torch::Tensor weighted_l1(const torch::Tensor& pred_loc, const torch::Tensor& label_loc, const torch::Tensor& weight) {
  const auto b = pred_loc.size(0), h = pred_loc.size(2), w = pred_loc.size(3);
  auto diff = (pred_loc.view({b, 4, -1, h, w}) - label_loc).abs();
  // FACT: p = torch.rand(2, 3, requires_grad=True); d = (p - 0.5).abs(); d.mul_(2.0); assert not backward_fails(lambda: d.sum().backward())
  diff.mul_(weight.unsqueeze(1));  // LOOKALIKE: tensor-inplace-on-saved -- abs() saves its input for backward, not the result scaled here
  return diff.sum() / b;
}

void train_epoch(SiamRPN& model, torch::optim::Optimizer& opt, const std::vector<PairBatch>& batches,
                 const TrackerConfig& cfg, torch::Device device, int epoch) {
  model->train();
  auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device)), cls_total = torch::zeros_like(epoch_loss);
  for (const auto& batch : batches) {
    auto [cls, loc] = model->forward(batch.template_img.to(device), batch.search_img.to(device));
    auto cls_loss = cls_loss_ohem(log_softmax_cls(cls, cfg.anchor_num()), batch.label_cls.to(device), 3);
    auto loc_loss = weighted_l1(loc, batch.label_loc.to(device), batch.label_loc_weight.to(device));
    auto loss = cls_loss + 1.2 * loc_loss;
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 10.0);
    opt.step();
    epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
    cls_total += cls_loss.detach();  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, only the value is accumulated
  }
  const double n = static_cast<double>(std::max<size_t>(batches.size(), 1));
  std::printf("epoch %d loss %.4f cls %.4f\n", epoch, epoch_loss.item<double>() / n, cls_total.item<double>() / n);
}

torch::Tensor run_sequence(SiamRPNTracker& tracker, const std::vector<torch::Tensor>& frames,
                           const std::vector<float>& init_box) {
  tracker.init(frames.front(), init_box);
  auto boxes = torch::zeros({static_cast<int64_t>(frames.size()), 4}, torch::TensorOptions().device(tracker.device()));
  boxes[0].copy_(torch::tensor(init_box));
  double score_sum = 0.0;
  for (size_t i = 1; i < frames.size(); ++i) {
    auto res = tracker.track(frames[i]);
    score_sum += res.score.item<double>();  // EXPECT: tensor-sync-in-loop
    auto wh = res.box.narrow(0, 2, 2);
    boxes[static_cast<int64_t>(i)].copy_(torch::cat({res.box.narrow(0, 0, 2) - wh / 2, wh}));
  }
  std::cout << "mean score " << score_sum / std::max<size_t>(frames.size() - 1, 1) << "\n";
  return boxes.cpu();
}

int main() {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  TrackerConfig cfg;
  SiamRPN model(cfg);
  model->to(device);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(5e-3).momentum(0.9));
  const int64_t S = cfg.score_size(), A = cfg.anchor_num();
  std::vector<PairBatch> batches(
      4, PairBatch{torch::rand({8, 3, 127, 127}) * 255, torch::rand({8, 3, 255, 255}) * 255,
                   torch::randint(-1, 2, {8, A, S, S}, torch::kLong), torch::randn({8, 4, A, S, S}),
                   torch::rand({8, A, S, S})});
  for (int epoch = 0; epoch < 2; ++epoch) train_epoch(model, opt, batches, cfg, device, epoch);
  SiamRPNTracker tracker(model, cfg, device);
  std::vector<torch::Tensor> frames(10, torch::randint(0, 256, {3, 360, 480}, torch::kUInt8));
  std::cout << run_sequence(tracker, frames, {200.f, 150.f, 60.f, 40.f}).sizes() << "\n";
}
