// Submanifold sparse 3-D convolution over a hashed voxel set and a small segmentation net.
// Output sites are the input sites; the rulebook maps each kernel offset to (in row, out row).
#include <torch/torch.h>
#include <cmath>
#include <iostream>
#include <vector>

namespace sparse {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GridSpec {
  int64_t batch = 1, dx = 64, dy = 64, dz = 32;
  double voxel_size = 0.05;
};

struct VoxelSet {
  torch::Tensor coords, feats;  // coords: int32 (batch, x, y, z)
  GridSpec spec;
};

struct Rulebook { std::vector<torch::Tensor> in_idx, out_idx; };

torch::Tensor hash_coords(const torch::Tensor& coords, const GridSpec& g) {
  auto key = coords.select(1, 0).to(torch::kLong);
  // FACT: (lambda c: is_copy_of(c.select(1, 0).to(torch.long), c))(torch.zeros(5, 4, dtype=torch.int32))
  key.mul_(g.dx).add_(coords.select(1, 1));  // LOOKALIKE: tensor-alias-then-mutate -- int32 -> int64 conversion makes a new tensor
  key.mul_(g.dy).add_(coords.select(1, 2));
  key.mul_(g.dz).add_(coords.select(1, 3));
  return key;
}

torch::Tensor kernel_offsets(torch::Device device) {
  std::vector<int32_t> v;
  for (int32_t ox = -1; ox <= 1; ++ox)
    for (int32_t oy = -1; oy <= 1; ++oy)
      for (int32_t oz = -1; oz <= 1; ++oz) v.insert(v.end(), {0, ox, oy, oz});
  return torch::tensor(v, torch::kInt).view({27, 4}).to(device);
}

VoxelSet voxelize(const torch::Tensor& xyz, const torch::Tensor& batch_ids,
                  const torch::Tensor& attrs, const GridSpec& spec) {
  const int64_t n = xyz.size(0);
  auto origin = std::get<0>(xyz.min(0));
  auto coords = torch::empty({n, 4}, xyz.options().dtype(torch::kInt));
  coords.select(1, 0).copy_(batch_ids.to(torch::kInt));
  coords.slice(1, 1, 4).copy_((xyz - origin) / spec.voxel_size);  // EXPECT: tensor-copy-narrowing

  auto uniq = torch::_unique(hash_coords(coords, spec), /*sorted=*/true, /*return_inverse=*/true);
  auto inverse = std::get<1>(uniq);
  const int64_t m = std::get<0>(uniq).size(0);
  auto rows = torch::arange(n, inverse.options());
  auto first = torch::full({m}, n, inverse.options()).scatter_reduce_(0, inverse, rows, "amin");
  auto counts = torch::zeros({m}, attrs.options()).index_add_(0, inverse, torch::ones({n}, attrs.options()));
  auto feats = torch::zeros({m, attrs.size(1)}, attrs.options()).index_add_(0, inverse, attrs);
  feats.div_(counts.unsqueeze(1));
  return {coords.index_select(0, first), feats, spec};
}

Rulebook build_rulebook(const torch::Tensor& coords, const GridSpec& g) {
  torch::Tensor skeys, order;
  std::tie(skeys, order) = hash_coords(coords, g).sort();
  auto offsets = kernel_offsets(coords.device());
  auto dims = torch::tensor({g.batch, g.dx, g.dy, g.dz}, coords.options());
  Rulebook rb;
  for (int64_t k = 0; k < offsets.size(0); ++k) {
    auto q = coords + offsets[k];
    auto inside = q.ge(0).logical_and(q.lt(dims)).all(1);
    auto qk = hash_coords(q, g);
    auto pos = torch::searchsorted(skeys, qk).clamp_max(skeys.size(0) - 1);
    auto hit = inside.logical_and(skeys.index_select(0, pos).eq(qk));
    auto out_rows = hit.nonzero().squeeze(1);
    rb.in_idx.push_back(order.index_select(0, pos.index_select(0, out_rows)));
    rb.out_idx.push_back(out_rows);
  }
  return rb;
}

// Features of the occupied cells of a dense grid laid out as a Conv3d input.
VoxelSet dense_to_sparse(const torch::Tensor& grid, const GridSpec& g) {
  const int64_t channels = grid.size(1);
  auto cells = grid.abs().sum(1).gt(0).nonzero();
  auto strides = torch::tensor({g.dx * g.dy * g.dz, g.dy * g.dz, g.dz, int64_t{1}});
  auto linear = (cells * strides).sum(1);  // EXPECT: tensor-device-mismatch
  // FACT: (lambda g: is_copy_of(g.permute(0, 2, 3, 4, 1).reshape(-1, 4), g))(torch.randn(2, 4, 3, 3, 3))
  auto flat = grid.permute({0, 2, 3, 4, 1}).reshape({-1, channels});  // EXPECT: tensor-reshape-non-contiguous
  return {cells.to(torch::kInt), flat.index_select(0, linear), g};
}

VoxelSet to_device(const VoxelSet& vs, torch::Device device) {
  auto coords = torch::empty(vs.coords.sizes(), vs.coords.options().device(device));
  coords.copy_(vs.coords, /*non_blocking=*/true);  // LOOKALIKE: tensor-device-mismatch -- copy_ between devices is allowed
  return {coords, vs.feats.to(device, /*non_blocking=*/true), vs.spec};
}

VoxelSet random_shift(const VoxelSet& vs, int64_t max_shift) {
  auto coords = vs.coords.clone();  // LOOKALIKE: tensor-unnecessary-clone -- only xyz is shifted, the batch column must survive
  auto shift = torch::randint(-max_shift, max_shift + 1, {3}, coords.options());
  coords.slice(1, 1, 4).add_(shift).clamp_min_(0);
  return {coords, vs.feats, vs.spec};
}

torch::Tensor standardize(const torch::Tensor& feats) {
  auto f = feats.contiguous();
  // FACT: (lambda f: shares_storage(f.contiguous(), f))(torch.randn(6, 4))
  f.sub_(f.mean(0)).div_(f.std(0).add(1e-6));  // EXPECT: tensor-alias-then-mutate
  return f;
}

struct SubMConvFunction : public torch::autograd::Function<SubMConvFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor feats, torch::Tensor weight,
                               const Rulebook& rb) {
    ctx->save_for_backward({feats, weight});
    ctx->saved_data["in_idx"] = rb.in_idx;
    ctx->saved_data["out_idx"] = rb.out_idx;
    auto out = torch::zeros({feats.size(0), weight.size(2)}, feats.options());
    for (size_t k = 0; k < rb.in_idx.size(); ++k) {
      if (rb.in_idx[k].numel() == 0) continue;
      auto gathered = feats.index_select(0, rb.in_idx[k]);
      out.index_add_(0, rb.out_idx[k], gathered.mm(weight[k]));
    }
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto feats = saved[0], weight = saved[1];
    auto in_idx = ctx->saved_data["in_idx"].toTensorVector();
    auto out_idx = ctx->saved_data["out_idx"].toTensorVector();
    auto grad_out = grad_outputs[0].clone();  // EXPECT: tensor-unnecessary-clone
    auto grad_feats = torch::zeros_like(feats);
    auto grad_weight = torch::zeros_like(weight);
    for (size_t k = 0; k < in_idx.size(); ++k) {
      if (in_idx[k].numel() == 0) continue;
      auto g_k = grad_out.index_select(0, out_idx[k]);
      grad_feats.index_add_(0, in_idx[k], g_k.mm(weight[k].t()));
      grad_weight[k].copy_(feats.index_select(0, in_idx[k]).t().mm(g_k));
    }
    return {grad_feats, grad_weight, torch::Tensor()};
  }
};

struct SubMConv3dImpl : torch::nn::Module {
  SubMConv3dImpl(int64_t cin, int64_t cout) : cin_(cin), cout_(cout) {
    auto w = torch::empty({27, cin, cout});
    w.normal_(0.0, std::sqrt(2.0 / (27.0 * cin)));  // LOOKALIKE: tensor-inplace-on-leaf -- w does not require grad until register_parameter
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", torch::zeros({cout}));
  }
  torch::Tensor forward(const torch::Tensor& feats, const Rulebook& rb) {
    return SubMConvFunction::apply(feats, weight, rb) + bias;
  }
  // Weights of an equivalent dense torch::nn::Conv3d (kernel 3, padding 1).
  void load_dense(const torch::Tensor& dense) {
    torch::NoGradGuard no_grad;
    // FACT: (lambda d: is_view_of(d.permute(2, 3, 4, 1, 0).view(27, 4, 8), d))(torch.randn(8, 4, 3, 3, 3))
    weight.copy_(dense.permute({2, 3, 4, 1, 0}).view({27, cin_, cout_}));  // LOOKALIKE: tensor-view-non-contiguous -- the three kernel dims stay adjacent and in order, so they merge
  }
  torch::Tensor to_dense() const {
    // FACT: (lambda w: is_view_of(w.permute(2, 1, 0).reshape(8, 4, 3, 3, 3), w))(torch.randn(27, 4, 8))
    return weight.detach().permute({2, 1, 0}).reshape({cout_, cin_, 3, 3, 3});  // LOOKALIKE: tensor-reshape-non-contiguous -- only splits one dim, still a view
  }
  int64_t cin_, cout_;
  torch::Tensor weight, bias;
};
TORCH_MODULE(SubMConv3d);

struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t c)
      : conv1(register_module("conv1", SubMConv3d(c, c))), conv2(register_module("conv2", SubMConv3d(c, c))),
        bn1(register_module("bn1", torch::nn::BatchNorm1d(c))), bn2(register_module("bn2", torch::nn::BatchNorm1d(c))) {}
  torch::Tensor forward(const torch::Tensor& x, const Rulebook& rb) {
    auto y = torch::relu(bn1(conv1(x, rb)));
    y = bn2(conv2(y, rb));
    // FACT: (lambda x: (lambda y: (y.add_(1), y.sum().backward(), True)[-1])(torch.nn.functional.batch_norm(x, None, None, training=True)))(torch.randn(6, 4, requires_grad=True))
    y += x;  // LOOKALIKE: tensor-inplace-on-saved -- batch_norm saves its input, not its output
    return torch::relu(y);
  }
  SubMConv3d conv1, conv2;
  torch::nn::BatchNorm1d bn1, bn2;
};
TORCH_MODULE(ResBlock);

struct PreActBlockImpl : torch::nn::Module {
  explicit PreActBlockImpl(int64_t c)
      : bn1(register_module("bn1", torch::nn::BatchNorm1d(c))), bn2(register_module("bn2", torch::nn::BatchNorm1d(c))),
        conv1(register_module("conv1", SubMConv3d(c, c))), conv2(register_module("conv2", SubMConv3d(c, c))) {}
  torch::Tensor forward(torch::Tensor x, const Rulebook& rb) {
    auto y = conv1(torch::relu(bn1(x)), rb);
    y = conv2(torch::relu(bn2(y)), rb);
    // FACT: backward_fails(lambda: (lambda x: (lambda y: (x.add_(y), y.sum().backward()))(torch.nn.functional.batch_norm(x, None, None, training=True)))(torch.randn(6, 4, requires_grad=True) * 1))
    return x.add_(y);  // EXPECT: tensor-inplace-on-saved
  }
  torch::nn::BatchNorm1d bn1, bn2;
  SubMConv3d conv1, conv2;
};
TORCH_MODULE(PreActBlock);

struct SegHeadImpl : torch::nn::Module {
  SegHeadImpl(int64_t cin, int64_t ncls) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(cin));
    proj = register_parameter("proj", torch::empty({cin, ncls}));
    proj.uniform_(-bound, bound);  // EXPECT: tensor-inplace-on-leaf
    bias = register_parameter("bias", torch::zeros({ncls}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::addmm(bias, x, proj); }
  torch::Tensor proj, bias;
};
TORCH_MODULE(SegHead);

struct NetOutput { torch::Tensor logits, recon; };
struct SparseSegNetImpl : torch::nn::Module {
  SparseSegNetImpl(int64_t in_ch, int64_t width, int64_t ncls)
      : stem(register_module("stem", SubMConv3d(in_ch, width))), block1(register_module("block1", ResBlock(width))),
        block2(register_module("block2", PreActBlock(width))), head(register_module("head", SegHead(width, ncls))),
        recon(register_module("recon", torch::nn::Linear(width, in_ch))) {}
  NetOutput forward(const VoxelSet& vs, const Rulebook& rb) {
    auto x = stem(standardize(vs.feats), rb);
    x = block1(x, rb);
    x = block2(x, rb);
    return {head(x), recon(x)};
  }
  SubMConv3d stem;
  ResBlock block1;
  PreActBlock block2;
  SegHead head;
  torch::nn::Linear recon;
};
TORCH_MODULE(SparseSegNet);

struct Scene { VoxelSet vs; torch::Tensor labels; };

std::vector<Scene> synthetic_scenes(int64_t count, const GridSpec& g, int64_t ncls) {
  std::vector<Scene> scenes;
  for (int64_t i = 0; i < count; ++i) {
    auto xyz = torch::rand({4096, 3}) * torch::tensor({3.0f, 3.0f, 1.5f});
    auto batch_ids = torch::randint(0, g.batch, {4096}, torch::kInt);
    auto vs = voxelize(xyz, batch_ids, torch::rand({4096, 4}), g);
    auto labels = vs.coords.select(1, 3).to(torch::kLong).mul(ncls).div(g.dz, "floor");
    scenes.push_back({vs, labels.clamp_max(ncls - 1)});
  }
  return scenes;
}

void train(SparseSegNet& net, const std::vector<Scene>& scenes, torch::Device device, int epochs, int64_t ncls) {
  namespace F = torch::nn::functional;
  torch::optim::AdamW opt(net->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(1e-4));
  auto class_weights = torch::ones({ncls});
  class_weights[0] = 0.25;
  auto smooth = torch::zeros({}, torch::TensorOptions().device(device));
  int64_t step = 0;
  net->train();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    auto epoch_loss = torch::zeros({}, torch::TensorOptions().device(device));
    for (const auto& scene : scenes) {
      auto vs = to_device(random_shift(scene.vs, 2), device);
      auto labels = scene.labels.to(device);  // LOOKALIKE: tensor-clone-in-loop -- a different scene every step
      auto weights = class_weights.to(device);  // EXPECT: tensor-clone-in-loop
      auto rb = build_rulebook(vs.coords, vs.spec);
      auto out = net->forward(vs, rb);
      auto loss = F::cross_entropy(out.logits, labels, F::CrossEntropyFuncOptions().weight(weights)) +
                  0.1 * torch::mse_loss(out.recon, vs.feats);
      opt.zero_grad();
      loss.backward();
      opt.step();
      epoch_loss += loss;  // EXPECT: tensor-graph-kept-across-iterations
      smooth.mul_(0.98).add_(loss.detach(), 0.02);  // LOOKALIKE: tensor-graph-kept-across-iterations -- detached, no graph kept
      if (++step % 50 == 0)
        std::cout << "step " << step << " loss " << smooth.item<float>() << '\n';  // LOOKALIKE: tensor-sync-in-loop -- read once every 50 steps
    }
    std::cout << "epoch " << epoch << " mean loss "
              << epoch_loss.item<double>() / static_cast<double>(scenes.size()) << '\n';
  }
}

double evaluate(SparseSegNet& net, const std::vector<Scene>& scenes, torch::Device device) {
  torch::NoGradGuard no_grad;
  net->eval();
  int64_t correct = 0, total = 0;
  for (const auto& scene : scenes) {
    auto vs = to_device(scene.vs, device);
    auto labels = scene.labels.to(device);
    auto out = net->forward(vs, build_rulebook(vs.coords, vs.spec));
    correct += out.logits.argmax(1).eq(labels).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    total += labels.size(0);
  }
  return total ? static_cast<double>(correct) / static_cast<double>(total) : 0.0;
}

}  // namespace sparse

int main() {
  using namespace sparse;
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  GridSpec spec{2};
  const int64_t ncls = 4;
  {  // sanity check against a dense Conv3d on a small grid
    torch::NoGradGuard no_grad;
    torch::nn::Conv3d dense(torch::nn::Conv3dOptions(4, 8, 3).padding(1).bias(false));
    SubMConv3d conv(4, 8);
    dense->to(device);
    conv->to(device);
    conv->load_dense(dense->weight);
    GridSpec small{2, 8, 8, 8, 1.0};
    auto grid = torch::randn({2, 4, 8, 8, 8}, device) * torch::rand({2, 1, 8, 8, 8}, device).gt(0.7);
    auto vs = dense_to_sparse(grid, small);
    auto sparse_out = conv(vs.feats, build_rulebook(vs.coords, small)) - conv->bias;
    auto ref = dense(grid).permute({0, 2, 3, 4, 1});
    auto c = vs.coords.to(torch::kLong).unbind(1);
    auto expect = ref.index({c[0], c[1], c[2], c[3]});
    std::cout << "max |sparse - dense| " << (sparse_out - expect).abs().max().item<float>() << '\n';
  }

  auto scenes = synthetic_scenes(16, spec, ncls);
  SparseSegNet net(4, 32, ncls);
  net->to(device);
  train(net, scenes, device, 3, ncls);
  std::cout << "voxel accuracy " << evaluate(net, scenes, device) << '\n';
}
