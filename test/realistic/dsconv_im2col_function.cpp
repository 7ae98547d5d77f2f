// Depthwise-separable convolution lowered to im2col + batched matmul, with a
// hand-written backward. Used on targets where cuDNN grouped convs are slow.
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <utility>
#include <vector>

namespace F = torch::nn::functional;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct DSConvOptions {
  int64_t in_channels = 32;
  int64_t out_channels = 64;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t padding = 1;
  double init_std = 0.05;
  double grad_clip = 0.0;        // clamp incoming gradients in backward when > 0
  bool standardize_taps = false;
  bool residual = false;
};

namespace {

int64_t conv_out(int64_t in, int64_t k, int64_t stride, int64_t pad) {
  return (in + 2 * pad - k) / stride + 1;
}

torch::Tensor im2col(const torch::Tensor& x, int64_t k, int64_t stride, int64_t pad) {
  return F::unfold(x, F::UnfoldFuncOptions({k, k}).stride(stride).padding(pad));
}

torch::Tensor col2im(const torch::Tensor& cols, int64_t h, int64_t w, int64_t k,
                     int64_t stride, int64_t pad) {
  return F::fold(cols, F::FoldFuncOptions({h, w}, {k, k}).stride(stride).padding(pad));
}

}  // namespace

class DepthwiseSeparableFn : public torch::autograd::Function<DepthwiseSeparableFn> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor input,
                               torch::Tensor dw_weight, torch::Tensor pw_weight,
                               torch::Tensor bias, int64_t stride, int64_t pad,
                               double grad_clip) {
    const auto n = input.size(0), c = input.size(1);
    const auto h = input.size(2), w = input.size(3);
    const auto k = dw_weight.size(-1);
    const auto oc = pw_weight.size(0);
    const auto oh = conv_out(h, k, stride, pad), ow = conv_out(w, k, stride, pad);
    const auto L = oh * ow;

    // FACT: assert is_contiguous(torch.nn.functional.unfold(torch.randn(2, 3, 6, 6), 3, padding=1))
    auto cols = im2col(input, k, stride, pad).view({n, c, k * k, L});  // LOOKALIKE: tensor-view-non-contiguous -- unfold returns a freshly allocated contiguous buffer
    auto taps = dw_weight.reshape({1, c, k * k, 1});
    auto depthwise = (cols * taps).sum(2);

    // FACT: o = torch.randn(4).view(1, 4, 1).expand(2, 4, 5); assert raises(lambda: o.add_(torch.randn(2, 4, 5)), "more than one element")
    auto out = bias.view({1, oc, 1}).expand({n, oc, L});
    out.add_(torch::matmul(pw_weight.view({oc, c}), depthwise));  // EXPECT: tensor-inplace-on-expanded

    ctx->save_for_backward({cols, depthwise, dw_weight, pw_weight});
    ctx->saved_data["geom"] = std::vector<int64_t>{h, w, k, stride, pad};
    ctx->saved_data["grad_clip"] = grad_clip;
    return out.view({n, oc, oh, ow});
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto cols = saved[0], depthwise = saved[1], dw_weight = saved[2], pw_weight = saved[3];
    auto geom = ctx->saved_data["geom"].toIntVector();
    const int64_t h = geom[0], w = geom[1], k = geom[2], stride = geom[3], pad = geom[4];
    const double clip = ctx->saved_data["grad_clip"].toDouble();
    const auto n = cols.size(0), c = cols.size(1), L = cols.size(3);
    const auto oc = pw_weight.size(0);

    // FACT: g = torch.randn(2, 4, 3, 3); assert shares_storage(g.contiguous().view(2, 4, 9), g)
    auto grad = grad_outputs[0].contiguous().view({n, oc, L});
    if (clip > 0) {
      grad.clamp_(-clip, clip);  // EXPECT: tensor-alias-then-mutate
    }

    auto grad_bias = grad.sum(at::IntArrayRef{0, 2});
    // FACT: assert is_contiguous(torch.bmm(torch.randn(2, 4, 9), torch.randn(2, 3, 9).transpose(1, 2)).sum(0))
    auto grad_pw = torch::bmm(grad, depthwise.transpose(1, 2)).sum(0).view({oc, c, 1, 1});  // LOOKALIKE: tensor-view-non-contiguous -- bmm writes a new contiguous result, the reduction keeps it so

    auto grad_depthwise = torch::matmul(pw_weight.view({oc, c}).t(), grad);
    auto grad_dw = torch::einsum("ncl,nckl->ck", {grad_depthwise, cols}).view({c, 1, k, k});

    auto taps = dw_weight.reshape({1, c, k * k, 1});
    auto grad_cols = grad_depthwise.unsqueeze(2).expand({n, c, k * k, L}).clone();  // EXPECT: tensor-unnecessary-clone
    // FACT: t = torch.randn(2, 3, 5).unsqueeze(2).expand(2, 3, 4, 5).clone(); t.mul_(torch.randn(1, 3, 4, 1)); assert 0 not in t.stride()
    grad_cols.mul_(taps);  // LOOKALIKE: tensor-inplace-on-expanded -- clone() materialised the broadcast, every element has its own slot
    auto grad_input = col2im(grad_cols.view({n, c * k * k, L}), h, w, k, stride, pad);

    return {grad_input, grad_dw, grad_pw, grad_bias,
            torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

class DSConvImpl : public torch::nn::Module {
 public:
  explicit DSConvImpl(const DSConvOptions& opts) : opts_(opts) {
    dw_weight = register_parameter(
        "dw_weight", torch::empty({opts.in_channels, 1, opts.kernel, opts.kernel}));
    pw_weight = register_parameter(
        "pw_weight", torch::empty({opts.out_channels, opts.in_channels, 1, 1}));
    bias = register_parameter("bias", torch::empty({opts.out_channels}));
    reset_parameters();
  }

  void reset_parameters() {
    torch::NoGradGuard no_grad;
    dw_weight.normal_(0.0, opts_.init_std);  // LOOKALIKE: tensor-inplace-on-leaf -- initialisation under NoGradGuard
    pw_weight.normal_(0.0, opts_.init_std);
    bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& x) {
    // FACT: w = torch.randn(4, 1, 3, 3, requires_grad=True); assert raises(lambda: w.sub_(w.mean((2, 3), keepdim=True)), "leaf Variable that requires grad")
    if (opts_.standardize_taps) {
      dw_weight.sub_(dw_weight.mean({2, 3}, /*keepdim=*/true));  // EXPECT: tensor-inplace-on-leaf
    }
    auto y = DepthwiseSeparableFn::apply(x, dw_weight, pw_weight, bias, opts_.stride,
                                         opts_.padding, opts_.grad_clip);
    auto act = torch::relu(y);

    if (track_stats_) {
      auto probe = act.detach();
      // FACT: x = torch.randn(2, 3, requires_grad=True); a = torch.relu(x); a.detach().clamp_max_(6.0); assert backward_fails(lambda: a.sum().backward())
      probe.clamp_max_(6.0);  // EXPECT: tensor-inplace-on-detached
      // FACT: a = torch.randn(2, 4, 3, 3); assert is_copy_of(a.transpose(0, 1).reshape(4, -1), a)
      auto per_channel = probe.transpose(0, 1).reshape({probe.size(1), -1});  // EXPECT: tensor-reshape-non-contiguous
      channel_peak_ = std::get<0>(per_channel.max(1));
    }

    // FACT: x = torch.randn(2, 3, requires_grad=True); a = torch.relu(x); a.add_(1); assert backward_fails(lambda: a.sum().backward())
    if (opts_.residual && x.sizes() == act.sizes()) {
      act.add_(x);  // EXPECT: tensor-inplace-on-saved
    }
    return act;
  }

  void apply_max_norm(double max_norm) {
    torch::NoGradGuard no_grad;
    auto w = pw_weight.detach();
    auto norms = w.flatten(1).norm(2, 1, /*keepdim=*/true).clamp_min(max_norm);
    w.mul_((max_norm / norms).view({-1, 1, 1, 1}));  // LOOKALIKE: tensor-inplace-on-detached -- the max-norm constraint is meant to rewrite the parameter, outside any graph
  }

  void set_track_stats(bool on) { track_stats_ = on; }
  const torch::Tensor& channel_peak() const { return channel_peak_; }

  torch::Tensor dw_weight, pw_weight, bias;

 private:
  DSConvOptions opts_;
  bool track_stats_ = false;
  torch::Tensor channel_peak_;
};
TORCH_MODULE(DSConv);

class DSNetImpl : public torch::nn::Module {
 public:
  DSNetImpl(int64_t num_classes, const DSConvOptions& base) {
    DSConvOptions b1 = base;
    b1.in_channels = 3;
    b1.out_channels = 32;
    DSConvOptions b2 = base;
    b2.in_channels = 32;
    b2.out_channels = 64;
    b2.stride = 2;
    block1 = register_module("block1", DSConv(b1));
    block2 = register_module("block2", DSConv(b2));
    head_w = register_parameter("head_w", torch::randn({num_classes, 64}) * 0.01);
    head_b = register_parameter("head_b", torch::zeros({num_classes}));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = block2(block1(x));
    auto pooled = F::adaptive_avg_pool2d(h, F::AdaptiveAvgPool2dFuncOptions(1)).flatten(1);
    auto logits = torch::matmul(pooled, head_w.t());
    // FACT: a = torch.randn(2, 3, requires_grad=True); y = a @ torch.randn(3, 4); y.add_(1); y.sum().backward(); assert a.grad is not None
    logits.add_(head_b);  // LOOKALIKE: tensor-inplace-on-saved -- matmul saves its operands, not its result
    return logits;
  }

  DSConv block1{nullptr}, block2{nullptr};
  torch::Tensor head_w, head_b;
};
TORCH_MODULE(DSNet);

// Folds a trained block into dense kernels for runtimes without depthwise support.
std::pair<torch::Tensor, torch::Tensor> export_dense_kernels(const DSConv& block) {
  torch::NoGradGuard no_grad;
  const auto& dw = block->dw_weight;
  const auto& pw = block->pw_weight;
  const auto oc = pw.size(0), c = pw.size(1), k = dw.size(-1);
  auto dense = pw.view({oc, c, 1}) * dw.view({1, c, k * k});
  auto oihw = dense.view({oc, c, k, k});
  // FACT: d = torch.randn(4, 3, 9); assert is_view_of(d.permute(1, 0, 2).reshape(3, 4, 3, 3), d)
  auto iohw = dense.permute({1, 0, 2}).reshape({c, oc, k, k});  // LOOKALIKE: tensor-reshape-non-contiguous -- only the last dim is split, the permuted dims stay apart: a view
  // FACT: d = torch.randn(4, 3, 3, 3); assert raises(lambda: d.permute(2, 3, 1, 0).view(27, 4), "view size is not compatible")
  auto hwio = oihw.permute({2, 3, 1, 0}).view({k * k * c, oc});  // EXPECT: tensor-view-non-contiguous
  return {iohw, hwio};
}

struct SyntheticImages {
  int64_t batch_size = 32;
  int64_t num_classes = 10;

  std::pair<torch::Tensor, torch::Tensor> next() const {
    auto images = torch::randint(0, 256, {batch_size, 3, 32, 32}, torch::kUInt8);
    auto labels = torch::randint(0, num_classes, {batch_size}, torch::kLong);
    return {images, labels};
  }
};

void train(int epochs, int steps_per_epoch) {
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  DSConvOptions base;
  base.grad_clip = 1.0;
  DSNet model(10, base);
  model->to(device);
  model->block2->set_track_stats(true);

  torch::optim::SGD optimizer(model->parameters(),
                              torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
  auto channel_stats = torch::tensor({0.485, 0.456, 0.406, 0.229, 0.224, 0.225}).view({2, 1, 3, 1, 1});
  SyntheticImages data;
  const int log_every = 50;

  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    for (int step = 0; step < steps_per_epoch; ++step) {
      auto batch = data.next();
      auto images = batch.first.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a new batch every step, the transfer cannot be hoisted
      auto labels = batch.second.to(device);

      // FACT: u = torch.zeros(2, 3, 4, 4, dtype=torch.uint8); assert is_copy_of(u.to(torch.float32), u)
      auto x = images.to(torch::kFloat);
      x.div_(255.0);  // LOOKALIKE: tensor-alias-then-mutate -- uint8 to float allocates a new tensor, the batch is untouched
      auto stats = channel_stats.to(device);  // EXPECT: tensor-clone-in-loop
      x = (x - stats[0]) / stats[1];

      optimizer.zero_grad();
      auto logits = model->forward(x);
      auto loss = F::cross_entropy(logits, labels);
      loss.backward();
      optimizer.step();
      model->block1->apply_max_norm(3.0);
      model->block2->apply_max_norm(3.0);

      if (step % log_every == 0) {
        std::cout << "epoch " << epoch << " step " << step
                  << " loss " << loss.item<double>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps, not every step
      }
    }
  }

  auto kernels = export_dense_kernels(model->block2);
  std::cout << "exported " << kernels.second.sizes() << '\n';
}

int main() {
  torch::manual_seed(0);
  train(/*epochs=*/2, /*steps_per_epoch=*/200);
  return 0;
}
