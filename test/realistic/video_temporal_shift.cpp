// Temporal Shift Module (TSM) video classifier: a 2D ResNet-style backbone over [N*T, C, H, W]
// frames, a fraction of the channels shifted one frame back/forward inside each residual block,
// a temporal conv over per-frame features and an average consensus. Also the RGB-difference
// input modality of TSN and a test loop over decoded clips.
#include <torch/torch.h>
#include <iostream>
#include <string>
#include <vector>

struct TSMConfig {
  int64_t num_segments = 8;  // T: frames sampled per clip
  int64_t fold_div = 8;      // 1/8 of the channels shift each way
  int64_t width = 64, num_classes = 174;
  double lr = 0.01, momentum = 0.9, weight_decay = 5e-4;
  int64_t log_every = 20;
};

struct ClipBatch {
  torch::Tensor clips;  // [N, C, T, H, W] float, as the decoder produces them
  torch::Tensor labels; // [N] int64
};

// Zero-parameter shift of part of the channels along time, as in the reference implementation.
torch::Tensor temporal_shift(const torch::Tensor &x, int64_t T, int64_t fold_div) {
  const auto NT = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const auto N = NT / T, fold = C / fold_div;
  auto x5 = x.view({N, T, C, H, W});
  auto out = torch::zeros_like(x5);
  // FACT: x = torch.randn(2, 4, 8, 3, 3); o = torch.zeros_like(x); o[:, :-1, :1].copy_(x[:, 1:, :1]); assert is_copy_of(o, x) and torch.equal(o[:, 0, 0], x[:, 1, 0])
  out.narrow(1, 0, T - 1).narrow(2, 0, fold).copy_(x5.narrow(1, 1, T - 1).narrow(2, 0, fold)); // LOOKALIKE: tensor-inplace-overlap -- 'out' is a buffer of its own
  out.narrow(1, 1, T - 1).narrow(2, fold, fold).copy_(x5.narrow(1, 0, T - 1).narrow(2, fold, fold));
  out.narrow(2, 2 * fold, C - 2 * fold).copy_(x5.narrow(2, 2 * fold, C - 2 * fold));
  // FACT: o = torch.zeros(2, 4, 8, 3, 3); assert is_view_of(o.view(8, 8, 3, 3), o)
  return out.view({NT, C, H, W}); // LOOKALIKE: tensor-view-non-contiguous -- zeros_like of the 5-D view is contiguous
}

struct ShiftBlockImpl : torch::nn::Module {
  ShiftBlockImpl(int64_t ch, int64_t T, int64_t fold_div) : T_(T), fold_div_(fold_div) {
    conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(ch));
    conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(ch, ch, 3).padding(1).bias(false)));
    bn2_ = register_module("bn2", torch::nn::BatchNorm2d(ch));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = torch::relu(bn1_(conv1_(temporal_shift(x, T_, fold_div_))));
    h = bn2_(conv2_(h));
    return torch::relu(h + x);
  }
  int64_t T_, fold_div_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
};
TORCH_MODULE(ShiftBlock);

struct TSMNetImpl : torch::nn::Module {
  explicit TSMNetImpl(const TSMConfig &cfg) : T_(cfg.num_segments) {
    namespace nn = torch::nn;
    stem_ = register_module("stem", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, cfg.width, 7).stride(2).padding(3).bias(false)),
                                                   nn::BatchNorm2d(cfg.width), nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1))));
    blocks_ = register_module("blocks", nn::Sequential(ShiftBlock(cfg.width, cfg.num_segments, cfg.fold_div),
                                                       ShiftBlock(cfg.width, cfg.num_segments, cfg.fold_div)));
    tconv_ = register_module("tconv", nn::Conv1d(nn::Conv1dOptions(cfg.width, cfg.width, 3).padding(1)));
    fc_ = register_module("fc", nn::Linear(cfg.width, cfg.num_classes));
  }

  // frames: [N*T, 3, H, W] -> clip logits [N, classes]
  torch::Tensor forward(const torch::Tensor &frames) {
    auto f = blocks_->forward(stem_->forward(frames));
    // FACT: f = torch.randn(8, 6, 1, 1); assert is_view_of(f.flatten(1), f)
    auto pooled = torch::adaptive_avg_pool2d(f, {1, 1}).flatten(1); // LOOKALIKE: tensor-reshape-non-contiguous -- a pooled [NT, C, 1, 1] map flattens as a view
    const auto N = pooled.size(0) / T_, C = pooled.size(1);
    // Temporal modelling over the per-frame features: Conv1d wants [N, C, T].
    auto seq = pooled.view({N, T_, C}).transpose(1, 2);
    auto tfeat = torch::relu(tconv_(seq)) + seq;
    // FACT: s = torch.randn(2, 4, 6).transpose(1, 2); t = torch.relu(torch.nn.Conv1d(6, 6, 3, padding=1)(s)) + s; assert raises(lambda: t.transpose(1, 2).view(8, 6), "view size is not compatible")
    auto frame_logits = fc_(tfeat.transpose(1, 2).view({N * T_, C})); // EXPECT: tensor-view-non-contiguous -- the conv output is [N, C, T]: frames are not rows
    // FACT: y = torch.nn.Linear(6, 5)(torch.randn(8, 6)); assert is_view_of(y.view(2, 4, -1), y)
    return frame_logits.view({N, T_, -1}).mean(1); // LOOKALIKE: tensor-view-non-contiguous -- the Linear output is contiguous
  }

  int64_t T_;
  torch::nn::Sequential stem_{nullptr}, blocks_{nullptr};
  torch::nn::Conv1d tconv_{nullptr};
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(TSMNet);

// The decoder yields [N, C, T, H, W]; the 2D backbone wants every frame as a batch entry.
torch::Tensor to_frames(const torch::Tensor &clips) {
  const auto N = clips.size(0), C = clips.size(1), T = clips.size(2), H = clips.size(3), W = clips.size(4);
  // FACT: c = torch.randn(2, 3, 4, 5, 5); assert is_copy_of(c.permute(0, 2, 1, 3, 4).reshape(8, 3, 5, 5), c)
  return clips.permute({0, 2, 1, 3, 4}).reshape({N * T, C, H, W}); // EXPECT: tensor-reshape-non-contiguous -- a full copy of every clip, every step
}

// TSN's RGB-difference modality: frame t becomes frame t minus frame t-1.
torch::Tensor rgb_difference(const torch::Tensor &clips) {
  const auto T = clips.size(2);
  auto frames = clips.transpose(1, 2).clone(); // [N, T, C, H, W]
  // FACT: c = torch.randn(2, 3, 4, 2, 2); f = c.transpose(1, 2).clone(); ref = f[:, 1:] - f[:, :-1]; f.narrow(1, 1, 3).sub_(f.narrow(1, 0, 3)); assert not torch.allclose(f[:, 1:], ref)
  frames.narrow(1, 1, T - 1).sub_(frames.narrow(1, 0, T - 1)); // EXPECT: tensor-inplace-overlap -- frame t-1 is already a difference when frame t reads it
  return frames.narrow(1, 1, T - 1).transpose(1, 2);
}

void train_epoch(TSMNet &model, torch::optim::SGD &opt, const std::vector<ClipBatch> &loader, const TSMConfig &cfg) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->train();
  int64_t it = 0;
  for (const auto &b : loader) {
    auto frames = to_frames(b.clips).to(device);
    auto logits = model->forward(frames); // LOOKALIKE: tensor-device-mismatch -- the frames are moved with the model
    auto loss = torch::nn::functional::cross_entropy(logits, b.labels.to(device));
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(model->parameters(), 20.0);
    opt.step();
    if (++it % cfg.log_every == 0)
      std::cout << "iter " << it << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every log_every steps only
  }
}

// Top-1 accuracy over the test clips, ImageNet statistics for the frames.
double evaluate(TSMNet &model, const std::vector<ClipBatch> &loader) {
  torch::NoGradGuard no_grad;
  torch::Device device(torch::kCUDA);
  model->to(device);
  model->eval();
  auto mean = torch::tensor({0.485, 0.456, 0.406}, torch::kFloat).view({1, 3, 1, 1});
  auto stdev = torch::tensor({0.229, 0.224, 0.225}, torch::kFloat).view({1, 3, 1, 1});
  int64_t correct = 0, seen = 0;
  for (const auto &b : loader) {
    auto frames = to_frames(b.clips).to(device); // LOOKALIKE: tensor-clone-in-loop -- a new batch every iteration
    frames = (frames - mean.to(device)) / stdev.to(device); // EXPECT: tensor-clone-in-loop -- the same constants go to the GPU for every batch
    auto pred = model->forward(frames).argmax(1);
    correct += pred.eq(b.labels.to(device)).sum().item<int64_t>(); // EXPECT: tensor-sync-in-loop -- waits for every batch, only summed
    seen += b.labels.size(0);
  }
  return double(correct) / double(seen);
}

// One clip from a file, for the demo: scores of the five best classes.
std::vector<std::pair<int64_t, float>> classify_clip(TSMNet &model, const torch::Tensor &clip) {
  torch::NoGradGuard no_grad;
  model->eval();
  model->to(torch::kCUDA);
  auto mean = torch::tensor({0.485, 0.456, 0.406}, torch::kFloat).view({1, 3, 1, 1});
  auto stdev = torch::tensor({0.229, 0.224, 0.225}, torch::kFloat).view({1, 3, 1, 1});
  auto frames = to_frames(clip.unsqueeze(0)).cuda();
  auto x = (frames - mean) / stdev; // EXPECT: tensor-device-mismatch -- the statistics stay on the CPU
  auto probs = torch::softmax(model->forward(x), 1).squeeze(0).cpu();
  auto [top_val, top_idx] = probs.topk(5);
  std::vector<std::pair<int64_t, float>> result;
  auto idx = top_idx.accessor<int64_t, 1>();
  auto val = top_val.accessor<float, 1>();
  for (int64_t i = 0; i < 5; ++i)
    result.emplace_back(idx[i], val[i]);
  return result;
}
