// Small residual U-Net for semantic segmentation: CE + dice + hard-pixel loss, random rescale/crop/flip, mean IoU on the host.
#include <torch/torch.h>
#include <algorithm>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
struct Sample {
  torch::Tensor image, mask; // [3, H, W] float in [0, 1], contiguous; [H, W] int64 class ids
};

struct ResBlockImpl : torch::nn::Module {
  ResBlockImpl(int64_t in, int64_t out) {
    c1 = register_module("c1", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
    n1 = register_module("n1", torch::nn::BatchNorm2d(out));
    c2 = register_module("c2", torch::nn::Conv2d(torch::nn::Conv2dOptions(out, out, 3).padding(1).bias(false)));
    n2 = register_module("n2", torch::nn::BatchNorm2d(out));
    proj = register_module("proj", torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto h = n1(c1(x));
    // FACT: c = torch.nn.Conv2d(1, 2, 3); b = torch.nn.BatchNorm2d(2); h = b(c(torch.randn(2, 1, 5, 5))); h.relu_(); h.sum().backward(); assert c.weight.grad is not None
    h.relu_(); // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output
    auto out = torch::relu(n2(c2(h)));
    // FACT: c = torch.nn.Conv2d(1, 1, 1); r = torch.relu(c(torch.randn(1, 1, 2, 2))); r += torch.ones(1, 1, 2, 2); assert backward_fails(lambda: r.sum().backward())
    out += proj(x); // EXPECT: tensor-inplace-on-saved -- relu saved its result: the shortcut belongs before the relu
    return out;
  }
  torch::nn::Conv2d c1{nullptr}, c2{nullptr}, proj{nullptr};
  torch::nn::BatchNorm2d n1{nullptr}, n2{nullptr};
};
TORCH_MODULE(ResBlock);

struct UNetImpl : torch::nn::Module {
  UNetImpl(int64_t in, int64_t classes, int64_t base) {
    e1 = register_module("e1", ResBlock(in, base));
    e2 = register_module("e2", ResBlock(base, 2 * base));
    mid = register_module("mid", ResBlock(2 * base, 4 * base));
    up2 = register_module("up2", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(4 * base, 2 * base, 2).stride(2)));
    d2 = register_module("d2", ResBlock(4 * base, 2 * base));
    up1 = register_module("up1", torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(2 * base, base, 2).stride(2)));
    d1 = register_module("d1", ResBlock(2 * base, base));
    head = register_module("head", torch::nn::Conv2d(torch::nn::Conv2dOptions(base, classes, 1)));
  }
  torch::Tensor forward(const torch::Tensor &x) {
    auto s1 = e1(x);
    auto s2 = e2(torch::max_pool2d(s1, 2));
    auto y = d2(torch::cat({up2(mid(torch::max_pool2d(s2, 2))), s2}, 1));
    return head(d1(torch::cat({up1(y), s1}, 1)));
  }
  ResBlock e1{nullptr}, e2{nullptr}, mid{nullptr}, d2{nullptr}, d1{nullptr};
  torch::nn::ConvTranspose2d up2{nullptr}, up1{nullptr};
  torch::nn::Conv2d head{nullptr};
};
TORCH_MODULE(UNet);

// Soft dice from the softmax probabilities; target [B, H, W] int64.
torch::Tensor dice_loss(const torch::Tensor &logits, const torch::Tensor &target, double smooth = 1.0) {
  auto B = logits.size(0), C = logits.size(1);
  // FACT: p = torch.softmax(torch.randn(2, 3, 4, 5), 1); assert is_view_of(p.view(2, 3, -1), p)
  auto probs = torch::softmax(logits, 1).view({B, C, -1}); // LOOKALIKE: tensor-view-non-contiguous -- softmax of a conv output is contiguous
  // FACT: o = torch.nn.functional.one_hot(torch.randint(0, 3, (2, 4, 5)), 3).permute(0, 3, 1, 2); assert not is_contiguous(o) and is_view_of(o.view(2, 3, -1), o)
  auto onehot = torch::one_hot(target, C).permute({0, 3, 1, 2}).view({B, C, -1}); // LOOKALIKE: tensor-view-non-contiguous -- H and W stay adjacent: merging them is a view
  auto inter = (probs * onehot).sum(2);
  auto denom = probs.sum(2) + onehot.sum(2);
  return 1 - ((2 * inter + smooth) / (denom + smooth)).mean();
}

// Cross-entropy over the hardest fraction of the pixels.
torch::Tensor hard_pixel_ce(const torch::Tensor &logits, const torch::Tensor &target, double keep) {
  auto C = logits.size(1);
  // FACT: l = torch.randn(2, 3, 4, 5); assert raises(lambda: l.permute(0, 2, 3, 1).view(-1, 3), "view size is not compatible")
  auto flat = logits.permute({0, 2, 3, 1}).view({-1, C}); // EXPECT: tensor-view-non-contiguous -- classes last needs a copy
  auto per_pixel = torch::cross_entropy_loss(flat, target.view({-1}), {}, at::Reduction::None);
  auto k = std::max<int64_t>(1, static_cast<int64_t>(keep * per_pixel.numel()));
  return std::get<0>(per_pixel.topk(k)).mean();
}

// One training batch: random rescale, random crop, random flip, brightness jitter.
std::pair<torch::Tensor, torch::Tensor> make_batch(const std::vector<Sample> &data, const std::vector<int64_t> &idx, int64_t size) {
  auto B = static_cast<int64_t>(idx.size());
  auto images = torch::empty({B, 3, size, size});
  auto targets = torch::empty({B, size, size}, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const auto &s = data[idx[i]];
    double scale = 1.0 + 0.5 * torch::rand({1}).item<double>();
    auto opts = F::InterpolateFuncOptions().scale_factor(std::vector<double>{scale, scale}).mode(torch::kBilinear).align_corners(false);
    auto img = F::interpolate(s.image.unsqueeze(0), opts)[0];
    auto lbl = F::interpolate(s.mask.unsqueeze(0).unsqueeze(0).to(torch::kFloat), opts)[0][0];
    auto top = torch::randint(0, img.size(1) - size + 1, {1}).item<int64_t>();
    auto left = torch::randint(0, img.size(2) - size + 1, {1}).item<int64_t>();
    auto crop = img.narrow(1, top, size).narrow(2, left, size);
    auto lcrop = lbl.narrow(0, top, size).narrow(1, left, size);
    bool hflip = torch::rand({1}).item<double>() < 0.5;
    auto x = images[i];
    x.copy_(hflip ? torch::flip(crop, {2}) : crop);
    // FACT: b = torch.zeros(2, 3, 4, 4); x = b[1]; x.copy_(torch.ones(3, 4, 4)); x.mul_(0.5); assert b[1].sum() == 24
    x.mul_(0.8 + 0.4 * torch::rand({1}).item<double>()); // LOOKALIKE: tensor-alias-then-mutate -- x is row i of the batch: writing it is the point
    // FACT: m = torch.tensor([[0., 1.], [1., 1.]]).view(1, 1, 2, 2); r = torch.nn.functional.interpolate(m, size=(3, 3), mode='bilinear', align_corners=False)[0, 0]; t = torch.zeros(3, 3, dtype=torch.long); t.copy_(r); assert ((r > 0) & (r < 1)).any() and t.sum() < r.sum()
    targets[i].copy_(hflip ? torch::flip(lcrop, {1}) : lcrop); // EXPECT: tensor-copy-narrowing -- bilinear labels truncated: border pixels drop a class
  }
  return {images, targets};
}
// Validation images are used at full size: only normalised.
torch::Tensor prepare(const torch::Tensor &image, const torch::Tensor &mean, const torch::Tensor &stdev) {
  auto x = image.contiguous(); // the stem wants dense memory
  // FACT: img = torch.rand(3, 4, 4); x = img.contiguous(); x.sub_(0.5); assert shares_storage(x, img) and img.max() <= 0.5
  x.sub_(mean).div_(stdev); // EXPECT: tensor-alias-then-mutate -- contiguous() returned the stored image: normalised again every epoch
  return x.unsqueeze(0);
}

void train(UNet &model, const std::vector<Sample> &train_set, const std::vector<Sample> &val_set,
           const torch::Tensor &class_weight, int64_t classes, int epochs, int64_t batch, int64_t size) {
  torch::Device device(torch::kCUDA);
  model->to(device);
  auto mean = torch::tensor({0.485, 0.456, 0.406}).view({3, 1, 1}), stdev = torch::tensor({0.229, 0.224, 0.225}).view({3, 1, 1});
  auto gpu_mean = mean.to(device), gpu_std = stdev.to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  int64_t step = 0;
  for (int e = 0; e < epochs; ++e) {
    model->train();
    auto perm = torch::randperm(static_cast<int64_t>(train_set.size()));
    for (int64_t start = 0; start + batch <= perm.size(0); start += batch) {
      auto b = make_batch(train_set, std::vector<int64_t>(perm.data_ptr<int64_t>() + start, perm.data_ptr<int64_t>() + start + batch), size);
      auto images = b.first.to(device), targets = b.second.to(device);
      // FACT: x = torch.rand(2, 3, 4, 4, device='meta'); m = torch.rand(3, 1, 1).to('meta'); x.sub_(m).div_(m); assert x.device == m.device
      images.sub_(gpu_mean).div_(gpu_std); // LOOKALIKE: tensor-device-mismatch -- the statistics were moved once, before the loop
      auto logits = model->forward(images);
      auto loss = torch::cross_entropy_loss(logits, targets, class_weight.to(device)) + dice_loss(logits, targets) + // EXPECT: tensor-clone-in-loop -- the same weights sent to the GPU every step
                  0.5 * hard_pixel_ce(logits, targets, 0.25);
      opt.zero_grad();
      loss.backward();
      opt.step();
      if (++step % 50 == 0)
        std::cout << "step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- every 50 steps
    }
    torch::NoGradGuard no_grad;
    model->eval();
    auto hist = torch::zeros({classes, classes}, torch::kLong); // confusion matrix on the host
    for (const auto &s : val_set) {
      auto pred = model->forward(prepare(s.image, mean, stdev).to(device)).argmax(1)[0];
      auto cm = torch::bincount(s.mask.to(device).flatten() * classes + pred.flatten(), {}, classes * classes);
      // FACT: assert raises(lambda: torch.zeros(3, 3, dtype=torch.long).add_(torch.ones(3, 3, dtype=torch.long, device='meta')), 'same device')
      hist += cm.view({classes, classes}); // EXPECT: tensor-device-mismatch -- hist is on the host, the counts on the GPU
    }
    auto h = hist.to(torch::kDouble);
    auto iou = h.diag() / (h.sum(0) + h.sum(1) - h.diag()).clamp_min(1);
    std::cout << "epoch " << e << " mIoU " << iou.mean().item<double>() << "\n";
  }
}
