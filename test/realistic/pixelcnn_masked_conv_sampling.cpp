// PixelCNN with gated residual blocks on quantized MNIST: training, test bits/dim, autoregressive
// sampling, image completion and "tall" sampling past the bottom edge.
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace pixelcnn {

using torch::Tensor;
using namespace torch::indexing;
namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct Config {
  std::string data_root = "./data/mnist";
  int64_t channels = 1, image_size = 28, levels = 8;
  int64_t hidden = 64, n_blocks = 7;
  int64_t batch_size = 128, epochs = 30, sample_every = 5, n_samples = 16, tall_rows = 28;
  double lr = 3e-4, temperature = 1.0;
};

// Mask 'A' hides the centre pixel (first layer only); mask 'B' lets it through.
Tensor make_mask(int64_t out, int64_t in, int64_t k, char type) {
  auto mask = torch::ones({out, in, k, k});
  const int64_t c = k / 2;
  mask.index_put_({Slice(), Slice(), c, Slice(c + (type == 'B' ? 1 : 0), None)}, 0.0);
  mask.index_put_({Slice(), Slice(), Slice(c + 1, None), Slice()}, 0.0);
  return mask;
}

struct MaskedConv2dImpl : nn::Module {
  MaskedConv2dImpl(int64_t in, int64_t out, int64_t k, char type)
      : conv(register_module("conv", nn::Conv2d(nn::Conv2dOptions(in, out, k).padding(k / 2)))) {
    mask_ = register_buffer("mask", make_mask(out, in, k, type));
  }

  Tensor forward(const Tensor& x) {
    {
      torch::NoGradGuard no_grad;
      conv->weight.mul_(mask_);  // LOOKALIKE: tensor-inplace-on-leaf -- re-masking runs under NoGradGuard
    }
    return conv->forward(x);
  }

  nn::Conv2d conv;
  Tensor mask_;
};
TORCH_MODULE(MaskedConv2d);

struct GatedBlockImpl : nn::Module {
  explicit GatedBlockImpl(int64_t hidden)
      : conv(register_module("conv", MaskedConv2d(hidden, 2 * hidden, 3, 'B'))),
        proj(register_module("proj", nn::Conv2d(nn::Conv2dOptions(hidden, hidden, 1)))) {}

  Tensor forward(const Tensor& x) {
    auto parts = conv->forward(x).chunk(2, 1);
    auto gate = torch::tanh(parts[0]);
    // FACT: a=torch.randn(4,requires_grad=True); g=torch.tanh(a); g.mul_(torch.sigmoid(a)); assert backward_fails(lambda: g.sum().backward())
    gate.mul_(torch::sigmoid(parts[1]));  // EXPECT: tensor-inplace-on-saved
    auto out = proj->forward(gate);
    out.add_(x);  // LOOKALIKE: tensor-inplace-on-saved -- a conv saves its input and weight; its own output is free to update
    return out;
  }

  MaskedConv2d conv;
  nn::Conv2d proj;
};
TORCH_MODULE(GatedBlock);

struct PixelCNNImpl : nn::Module {
  explicit PixelCNNImpl(const Config& cfg) : cfg_(cfg) {
    input_ = register_module("input", MaskedConv2d(cfg.channels, cfg.hidden, 7, 'A'));
    for (int64_t b = 0; b < cfg.n_blocks; ++b)
      blocks_.push_back(register_module("block" + std::to_string(b), GatedBlock(cfg.hidden)));
    head1_ = register_module("head1", nn::Conv2d(nn::Conv2dOptions(cfg.hidden, cfg.hidden, 1)));
    head2_ = register_module("head2",
                             nn::Conv2d(nn::Conv2dOptions(cfg.hidden, cfg.levels * cfg.channels, 1)));
  }

  // Logits over the quantization levels for every sub-pixel.
  Tensor forward(const Tensor& x) {
    auto h = input_->forward(x);
    for (auto& block : blocks_) h = block->forward(h);
    auto out = head2_->forward(torch::relu(head1_->forward(torch::relu(h))));
    // FACT: o=torch.nn.functional.conv2d(torch.randn(2,3,4,4), torch.randn(8,3,1,1)); assert is_contiguous(o) and is_view_of(o.view(2,8,1,4,4), o)
    return out.view({x.size(0), cfg_.levels, cfg_.channels, x.size(2), x.size(3)});  // LOOKALIKE: tensor-view-non-contiguous -- a conv output is contiguous
  }

  Config cfg_;
  MaskedConv2d input_{nullptr};
  std::vector<GatedBlock> blocks_;
  nn::Conv2d head1_{nullptr}, head2_{nullptr};
};
TORCH_MODULE(PixelCNN);

// [0, 1] intensities -> `levels` evenly spaced values in [-1, 1].
Tensor quantize(const Tensor& x, int64_t levels) {
  auto q = x.mul(static_cast<double>(levels - 1));
  // FACT: x=torch.rand(2,1,4,4); q=x.mul(7); q.round_(); assert is_copy_of(q,x)
  q.round_().mul_(2.0 / (levels - 1)).sub_(1.0);  // LOOKALIKE: tensor-alias-then-mutate -- mul() allocated q, the caller's x is untouched
  return q;
}

// Inverse-frequency weights per level: MNIST is mostly background.
Tensor level_weights(const Tensor& images, int64_t levels) {
  auto idx = torch::round(images * (levels - 1)).to(torch::kLong).flatten();
  auto counts = torch::bincount(idx, {}, levels).to(torch::kFloat).clamp_min(1.0);
  return (counts.sum() / (counts * levels)).clamp_max(10.0);
}

Tensor pixel_nll(const Tensor& logits, const Tensor& labels, const Tensor& weight) {
  const auto k = logits.size(1);
  // FACT: l=torch.randn(2,4,1,3,3); assert is_copy_of(l.permute(0,2,3,4,1).reshape(-1,4), l)
  auto flat = logits.permute({0, 2, 3, 4, 1}).reshape({-1, k});  // EXPECT: tensor-reshape-non-contiguous
  return F::cross_entropy(flat, labels.reshape({-1}), F::CrossEntropyFuncOptions().weight(weight));
}

// Per-image negative log-likelihood in bits per sub-pixel.
Tensor bits_per_dim(const Tensor& logits, const Tensor& labels) {
  const auto n = logits.size(0), k = logits.size(1);
  // FACT: l=torch.randn(2,4,2,3,3); assert is_view_of(l.permute(0,2,3,4,1).reshape(2,-1,4), l)
  auto per_pixel = logits.permute({0, 2, 3, 4, 1}).reshape({n, -1, k});  // LOOKALIKE: tensor-reshape-non-contiguous -- only C,H,W merge and they keep their order: a view
  auto logp = torch::log_softmax(per_pixel, -1).gather(2, labels.reshape({n, -1, 1}));
  return -logp.mean({1, 2}) / std::log(2.0);
}

Tensor pixel_probs(PixelCNN& model, const Tensor& canvas, int64_t i, int64_t j, double temperature) {
  auto logits = model->forward(canvas).index({Slice(), Slice(), 0, i, j});
  return torch::softmax(logits / temperature, 1);
}

// Samples rows [start_row, H) of every image; rows above start_row are kept from `prime`.
Tensor sample(PixelCNN& model, const Config& cfg, torch::Device device, const Tensor& prime = {},
              int64_t start_row = 0) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t s = cfg.image_size;
  const double step = 2.0 / (cfg.levels - 1);
  Tensor canvas = prime.defined()
                      ? prime.to(device)
                      : torch::zeros({cfg.n_samples, cfg.channels, s, s}, torch::TensorOptions(device));
  auto levels = torch::arange(cfg.levels, torch::kFloat);
  auto entropy = torch::zeros({}, canvas.options());
  std::vector<double> level_trace;
  for (int64_t i = start_row; i < s; ++i) {
    for (int64_t j = 0; j < s; ++j) {
      auto probs = pixel_probs(model, canvas, i, j, cfg.temperature);
      auto pix = torch::multinomial(probs, 1).squeeze(1);
      // FACT: p=torch.zeros(2,1,4,4); c=p.to('cpu'); c[:,0,2,3]=torch.tensor([1.0,2.0]); assert c is p and p[1,0,2,3]==2.0
      canvas.index_put_({Slice(), 0, i, j}, pix.to(torch::kFloat) * step - 1.0);  // EXPECT: tensor-alias-then-mutate // LOOKALIKE: tensor-copy-narrowing -- the sampled indices are cast to the canvas dtype explicitly
      entropy += -(probs * probs.clamp_min(1e-12).log()).sum(1).mean();  // LOOKALIKE: tensor-graph-kept-across-iterations -- sampling runs under NoGradGuard
      auto expected_level = (probs * levels).sum(1);  // EXPECT: tensor-device-mismatch
      level_trace.push_back(expected_level.mean().item<double>());  // EXPECT: tensor-sync-in-loop
    }
  }
  const auto n_pix = static_cast<double>((s - start_row) * s);
  std::cout << "sample entropy/pixel " << (entropy / n_pix).item<double>() << " final level "
            << (level_trace.empty() ? 0.0 : level_trace.back()) << '\n';
  return canvas;
}

// Slides the window up by `rows` so sampling can continue below the bottom edge.
void scroll_up(Tensor& canvas, int64_t rows) {
  const int64_t h = canvas.size(2);
  // FACT: c=torch.zeros(2,1,6,4); assert shares_storage(c.narrow(2,0,5), c.narrow(2,1,5)) and raises(lambda: c[:1].narrow(2,0,5).copy_(c[:1].narrow(2,1,5)), "some elements")
  canvas.narrow(2, 0, h - rows).copy_(canvas.narrow(2, rows, h - rows));  // EXPECT: tensor-inplace-overlap
  canvas.narrow(2, h - rows, rows).zero_();
}

Tensor sample_tall(PixelCNN& model, const Config& cfg, torch::Device device) {
  auto canvas = sample(model, cfg, device);
  torch::NoGradGuard no_grad;
  const int64_t s = cfg.image_size;
  const double step = 2.0 / (cfg.levels - 1);
  std::vector<Tensor> strips;
  for (int64_t r = 0; r < cfg.tall_rows; ++r) {
    strips.push_back(canvas.narrow(2, 0, 1).clone());  // LOOKALIKE: tensor-unnecessary-clone, tensor-clone-in-loop -- the row leaves the window and scroll_up overwrites it next
    scroll_up(canvas, 1);
    for (int64_t j = 0; j < s; ++j) {
      auto pix = torch::multinomial(pixel_probs(model, canvas, s - 1, j, cfg.temperature), 1);
      canvas.index_put_({Slice(), 0, s - 1, j}, pix.squeeze(1).to(torch::kFloat) * step - 1.0);
    }
  }
  strips.push_back(canvas);
  return torch::cat(strips, 2);
}

Tensor to_uint8(const Tensor& canvas) {
  auto img = torch::empty(canvas.sizes(), torch::TensorOptions().dtype(torch::kUInt8));
  // FACT: u=torch.empty(3,dtype=torch.uint8); u.copy_(torch.tensor([254.9,1.7,0.5])); assert u.tolist()==[254,1,0]
  img.copy_((canvas + 1.0) * 127.5);  // EXPECT: tensor-copy-narrowing // LOOKALIKE: tensor-device-mismatch -- copy_ may cross devices
  return img;
}

double evaluate(PixelCNN& model, const Config& cfg, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  torch::data::datasets::MNIST test(cfg.data_root, torch::data::datasets::MNIST::Mode::kTest);
  auto inp = quantize(test.images().narrow(0, 0, 1000).to(device), cfg.levels);
  auto labels = ((inp + 1.0) * (0.5 * (cfg.levels - 1))).round().to(torch::kLong);
  return bits_per_dim(model->forward(inp), labels).mean().item<double>();
}

void train(PixelCNN& model, const Config& cfg, torch::Device device) {
  torch::data::datasets::MNIST train_set(cfg.data_root);
  auto level_w = level_weights(train_set.images(), cfg.levels);
  auto loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(
      std::move(train_set).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions().batch_size(cfg.batch_size).workers(2));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(cfg.lr));

  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    model->train();
    std::vector<Tensor> epoch_losses;
    for (auto& batch : *loader) {
      auto x = batch.data.to(device);  // LOOKALIKE: tensor-clone-in-loop -- every step brings a new batch
      auto inp = quantize(x, cfg.levels);
      auto logits = model->forward(inp);
      auto labels = inp.detach();
      // FACT: w=torch.randn(4,1,3,3,requires_grad=True); x=torch.rand(2,1,5,5); y=torch.nn.functional.conv2d(x,w,padding=1); x.detach().add_(1.0).mul_(3.5).round_(); assert backward_fails(lambda: y.sum().backward())
      labels.add_(1.0).mul_(0.5 * (cfg.levels - 1)).round_();  // EXPECT: tensor-inplace-on-detached
      auto loss = pixel_nll(logits, labels.to(torch::kLong), level_w.to(device));  // EXPECT: tensor-clone-in-loop
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_losses.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    }
    const double train_nll = torch::stack(epoch_losses).mean().item<double>();
    std::cout << "epoch " << epoch << " train nll " << train_nll << " test bits/dim "
              << evaluate(model, cfg, device) << '\n';
    if ((epoch + 1) % cfg.sample_every == 0)
      torch::save(to_uint8(sample(model, cfg, device)), "pixelcnn_e" + std::to_string(epoch) + ".pt");
  }
}

}  // namespace pixelcnn

int main() {
  torch::manual_seed(1);
  const torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  pixelcnn::Config cfg;
  pixelcnn::PixelCNN model(cfg);
  model->to(device);
  pixelcnn::train(model, cfg, device);

  // Image completion: keep the top half of test digits, sample the bottom half.
  torch::data::datasets::MNIST test(cfg.data_root, torch::data::datasets::MNIST::Mode::kTest);
  auto originals = pixelcnn::quantize(test.images().narrow(0, 0, cfg.n_samples), cfg.levels).to(device);
  auto completed = pixelcnn::sample(model, cfg, device, originals, cfg.image_size / 2);
  torch::save(pixelcnn::to_uint8(torch::cat({originals, completed}, 0)), "pixelcnn_completion.pt");
  torch::save(pixelcnn::to_uint8(pixelcnn::sample_tall(model, cfg, device)), "pixelcnn_tall.pt");
  torch::save(model, "pixelcnn.pt");
  return 0;
}
