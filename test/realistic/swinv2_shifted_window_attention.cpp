// Swin-V2 style shifted-window attention block and a small classification trainer.
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <vector>

namespace F = torch::nn::functional;
using torch::indexing::Slice;

struct SwinConfig {
  int64_t dim = 96;
  int64_t num_heads = 3;
  int64_t window = 7;
  int64_t shift = 3;
  int64_t num_classes = 10;
  double lr = 1e-3;
  int64_t epochs = 5;
  int64_t log_every = 50;
};

// [B, H, W, C] -> [num_windows * B, ws * ws, C]
torch::Tensor window_partition(const torch::Tensor& x, int64_t ws) {
  const auto B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  auto tiles = x.view({B, H / ws, ws, W / ws, ws, C}).permute({0, 1, 3, 2, 4, 5});
  // FACT: x = torch.randn(2, 8, 8, 3).view(2, 2, 4, 2, 4, 3).permute(0, 1, 3, 2, 4, 5); assert is_copy_of(x.reshape(-1, 16, 3), x)
  return tiles.reshape({-1, ws * ws, C}); // EXPECT: tensor-reshape-non-contiguous
}

// [num_windows * B, ws * ws, C] -> [B, H, W, C]
torch::Tensor window_reverse(const torch::Tensor& windows, int64_t ws, int64_t H, int64_t W) {
  const auto C = windows.size(-1);
  const auto B = windows.size(0) / ((H / ws) * (W / ws));
  auto x = windows.view({B, H / ws, W / ws, ws, ws, C}).permute({0, 1, 3, 2, 4, 5});
  // FACT: w = torch.randn(8, 16, 3).view(2, 2, 2, 4, 4, 3).permute(0, 1, 3, 2, 4, 5); assert raises(lambda: w.view(2, 8, 8, 3), "view size is not compatible") and is_contiguous(w.contiguous().view(2, 8, 8, 3))
  return x.contiguous().view({B, H, W, -1}); // LOOKALIKE: tensor-view-non-contiguous -- contiguous() copies before the view
}

// Adds the shift mask to per-window logits.
torch::Tensor apply_shift_mask(const torch::Tensor& attn, const torch::Tensor& mask, int64_t nW) {
  const auto Bw = attn.size(0), nh = attn.size(1), N = attn.size(2);
  torch::Tensor out = attn;
  // FACT: a = torch.randn(4, 2, 3, 3); b = a; b += torch.randn(3, 3); assert shares_storage(a, b)
  out += mask.unsqueeze(1).repeat({Bw / nW, 1, 1}).view({Bw, 1, N, N}); // EXPECT: tensor-alias-then-mutate
  return out.view({Bw, nh, N, N});
}

struct WindowAttentionImpl : torch::nn::Module {
  int64_t dim, heads, ws;
  torch::nn::Linear qkv{nullptr}, proj{nullptr};
  torch::Tensor logit_scale_, rpb_table_, rpb_index_;

  WindowAttentionImpl(int64_t dim_, int64_t heads_, int64_t ws_) : dim(dim_), heads(heads_), ws(ws_) {
    qkv = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
    proj = register_module("proj", torch::nn::Linear(dim, dim));
    logit_scale_ = register_parameter("logit_scale", torch::ones({heads, 1, 1}));
    logit_scale_.mul_(std::log(10.0)); // EXPECT: tensor-inplace-on-leaf
    rpb_table_ = register_parameter("rpb_table", torch::zeros({(2 * ws - 1) * (2 * ws - 1), heads}));
    torch::nn::init::normal_(rpb_table_, 0.0, 0.02); // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under no-grad

    auto coords = torch::stack(torch::meshgrid({torch::arange(ws), torch::arange(ws)}, "ij"));
    auto flat = coords.flatten(1);
    auto rel = (flat.unsqueeze(2) - flat.unsqueeze(1)).permute({1, 2, 0}).contiguous();
    rel.select(2, 0).add_(ws - 1);
    rel.select(2, 1).add_(ws - 1);
    rel.select(2, 0).mul_(2 * ws - 1);
    rpb_index_ = register_buffer("rpb_index", rel.sum(-1));
  }

  torch::Tensor relative_bias() {
    const int64_t N = ws * ws;
    // FACT: idx = torch.randint(0, 9, (4, 4)); t = torch.randn(9, 3); b = t.index_select(0, idx.view(-1)); assert is_view_of(b.view(4, 4, -1), b)
    auto bias = rpb_table_.index_select(0, rpb_index_.view(-1)).view({N, N, -1}); // LOOKALIKE: tensor-view-non-contiguous -- index_select returns a fresh contiguous tensor
    return 16.0 * torch::sigmoid(bias.permute({2, 0, 1}));
  }

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    const auto Bw = x.size(0), N = x.size(1), C = x.size(2);
    // FACT: y = torch.nn.Linear(6, 18)(torch.randn(4, 5, 6)); assert is_view_of(y.reshape(4, 5, 3, 2, 3), y)
    auto parts = qkv(x).reshape({Bw, N, 3, heads, C / heads}).permute({2, 0, 3, 1, 4}); // LOOKALIKE: tensor-reshape-non-contiguous -- Linear output is contiguous: a view
    auto q = parts[0], k = parts[1], v = parts[2];
    auto attn = F::normalize(q, F::NormalizeFuncOptions().dim(-1))
                    .matmul(F::normalize(k, F::NormalizeFuncOptions().dim(-1)).transpose(-2, -1));
    attn = attn * torch::clamp(logit_scale_, c10::nullopt, std::log(100.0)).exp();
    attn = attn + relative_bias().unsqueeze(0);
    if (mask.defined()) attn = apply_shift_mask(attn, mask, mask.size(0));
    attn = torch::softmax(attn, -1);
    // FACT: a = torch.randn(4, 3, 16, 8); o = a.transpose(1, 2); assert is_copy_of(o.reshape(4, 16, 24), a)
    auto out = attn.matmul(v).transpose(1, 2).reshape({Bw, N, C}); // EXPECT: tensor-reshape-non-contiguous
    return proj(out);
  }
};
TORCH_MODULE(WindowAttention);

struct SwinBlockImpl : torch::nn::Module {
  int64_t ws, shift;
  WindowAttention attn{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

  SwinBlockImpl(const SwinConfig& cfg, int64_t shift_) : ws(cfg.window), shift(shift_) {
    attn = register_module("attn", WindowAttention(cfg.dim, cfg.num_heads, cfg.window));
    norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.dim})));
    fc1 = register_module("fc1", torch::nn::Linear(cfg.dim, 4 * cfg.dim));
    fc2 = register_module("fc2", torch::nn::Linear(4 * cfg.dim, cfg.dim));
  }

  torch::Tensor shift_mask(int64_t H, int64_t W, const torch::TensorOptions& opts) {
    auto img_mask = torch::zeros({1, H, W, 1}, opts);
    std::vector<Slice> spans = {Slice(0, -ws), Slice(-ws, -shift), Slice(-shift, torch::indexing::None)};
    int64_t cnt = 0;
    for (const auto& hs : spans)
      for (const auto& wsl : spans) img_mask.index_put_({Slice(), hs, wsl, Slice()}, cnt++);
    auto mw = window_partition(img_mask, ws);
    // FACT: m = torch.randn(1, 8, 8, 1).view(1, 2, 4, 2, 4, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, 16, 1); assert is_contiguous(m) and is_view_of(m.view(-1, 16), m)
    mw = mw.view({-1, ws * ws}); // LOOKALIKE: tensor-view-non-contiguous -- window_partition's reshape already copied into a contiguous tensor
    auto diff = mw.unsqueeze(1) - mw.unsqueeze(2);
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0);
  }

  torch::Tensor forward(torch::Tensor x, int64_t H, int64_t W) {
    const auto B = x.size(0), C = x.size(2);
    // FACT: x = torch.randn(2, 16, 3); assert is_view_of(x.view(2, 4, 4, 3), x)
    auto grid = x.view({B, H, W, C}); // LOOKALIKE: tensor-view-non-contiguous -- the token sequence is contiguous
    torch::Tensor mask;
    if (shift > 0) {
      grid = torch::roll(grid, {-shift, -shift}, {1, 2});
      mask = shift_mask(H, W, x.options());
    }
    auto windows = window_partition(grid, ws);
    auto merged = window_reverse(attn(windows, mask), ws, H, W);
    if (shift > 0) merged = torch::roll(merged, {shift, shift}, {1, 2});
    x = x + norm1(merged.view({B, H * W, C}));
    return x + norm2(fc2(F::gelu(fc1(x))));
  }
};
TORCH_MODULE(SwinBlock);

struct SwinClassifierImpl : torch::nn::Module {
  torch::nn::Conv2d embed{nullptr};
  SwinBlock b0{nullptr}, b1{nullptr};
  torch::nn::Linear head{nullptr};

  explicit SwinClassifierImpl(const SwinConfig& cfg) {
    embed = register_module("embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, cfg.dim, 4).stride(4)));
    b0 = register_module("b0", SwinBlock(cfg, 0));
    b1 = register_module("b1", SwinBlock(cfg, cfg.shift));
    head = register_module("head", torch::nn::Linear(cfg.dim, cfg.num_classes));
    torch::NoGradGuard no_grad;
    head->bias.zero_(); // LOOKALIKE: tensor-inplace-on-leaf -- under NoGradGuard
  }

  torch::Tensor forward(const torch::Tensor& img) {
    auto f = embed(img);
    const auto H = f.size(2), W = f.size(3);
    auto tokens = f.flatten(2).transpose(1, 2);
    tokens = b1(b0(tokens, H, W), H, W);
    return head(tokens.mean(1));
  }
};
TORCH_MODULE(SwinClassifier);

class ImageFolderTensors : public torch::data::datasets::Dataset<ImageFolderTensors> {
 public:
  ImageFolderTensors(torch::Tensor images, torch::Tensor labels)
      : images_(std::move(images)), labels_(std::move(labels)) {
    TORCH_CHECK(images_.scalar_type() == torch::kByte, "expected uint8 images");
  }
  torch::data::Example<> get(size_t i) override {
    auto img = images_[i].to(torch::kFloat);
    // FACT: x = torch.randint(0, 255, (3, 4, 4), dtype=torch.uint8); assert is_copy_of(x[0].to(torch.float32), x)
    img.div_(255.0); // LOOKALIKE: tensor-alias-then-mutate -- uint8 -> float conversion copies
    return {img, labels_[i]};
  }
  torch::optional<size_t> size() const override { return images_.size(0); }

 private:
  torch::Tensor images_, labels_;
};

void train_swin(const SwinConfig& cfg, torch::Tensor images, torch::Tensor labels, const torch::Tensor& class_weights) {
  torch::Device device(torch::kCUDA);
  SwinClassifier model(cfg);
  model->to(device);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(cfg.lr));
  auto loader = torch::data::make_data_loader(
      ImageFolderTensors(images, labels).map(torch::data::transforms::Stack<>()), 64);

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    double running = 0.0;
    torch::Tensor correct = torch::zeros({}, torch::kLong).to(device);
    int64_t step = 0, seen = 0;
    for (auto& batch : *loader) {
      auto x = batch.data.to(device);
      auto y = batch.target.to(device);
      auto logits = model->forward(x);
      auto loss = F::cross_entropy(logits, y, F::CrossEntropyFuncOptions().weight(class_weights.to(device))); // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      opt.step();
      running += loss.item<double>(); // EXPECT: tensor-sync-in-loop
      correct += (logits.argmax(1) == y).sum(); // LOOKALIKE: tensor-graph-kept-across-iterations -- a comparison does not require grad
      seen += x.size(0);
      if (++step % cfg.log_every == 0)
        std::cout << "epoch " << epoch << " step " << step << " loss " << loss.item<float>() << "\n"; // LOOKALIKE: tensor-sync-in-loop -- only every log_every steps
    }
    std::cout << "epoch " << epoch << " mean loss " << running / std::max<int64_t>(step, 1)
              << " acc " << correct.item<double>() / std::max<int64_t>(seen, 1) << "\n";
  }
}
