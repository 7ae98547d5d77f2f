// PointNet++ (SSG) part segmentation on ShapeNet-Part: set abstraction with FPS + kNN grouping,
// feature propagation by inverse-distance interpolation with skip links.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace pn2 {

struct PartSegConfig {
  int64_t num_points = 2048, num_parts = 50, num_classes = 16;
  int64_t batch_size = 16, epochs = 200, log_every = 20;
  double lr = 1e-3;
};

struct ShapeSample {
  std::vector<double> xyz_normals;  // n rows of x y z nx ny nz
  std::vector<int64_t> parts;
  int64_t category;
};
std::vector<ShapeSample> load_split(const std::string& root, const std::string& split);
void export_predictions(const std::string& dir, size_t first, const torch::Tensor& xyz, const torch::Tensor& pred);

torch::Tensor square_distance(const torch::Tensor& src, const torch::Tensor& dst) {
  auto dist = -2 * torch::matmul(src, dst.transpose(1, 2));
  // FACT: a=torch.randn(2,5,3,requires_grad=True); b=torch.randn(2,4,3); d=-2*torch.matmul(a,b.transpose(1,2)); d+=a.pow(2).sum(-1,keepdim=True); d.sum().backward(); assert a.grad is not None
  dist += src.pow(2).sum(-1, true);  // LOOKALIKE: tensor-inplace-on-saved -- the scalar product's result is not saved, matmul saved its operands
  dist += dst.pow(2).sum(-1).unsqueeze(1);
  return dist;
}

torch::Tensor index_points(const torch::Tensor& points, const torch::Tensor& idx) {
  const int64_t B = points.size(0), C = points.size(2);
  // FACT: d=torch.rand(2,6,5); v,i=d.topk(3,-1,largest=False); assert is_contiguous(i) and is_view_of(i.reshape(2,-1,1), i)
  auto flat = idx.reshape({B, -1, 1}).expand({-1, -1, C});  // LOOKALIKE: tensor-reshape-non-contiguous -- indices come from topk or FPS, both contiguous
  auto shape = idx.sizes().vec();
  shape.push_back(C);
  // FACT: p=torch.randn(2,8,6).narrow(2,0,3); i=torch.randint(0,8,(2,6,1)).expand(-1,-1,3); g=p.gather(1,i); assert is_contiguous(g) and is_view_of(g.view(2,3,2,3), g)
  return points.gather(1, flat).view(shape);  // LOOKALIKE: tensor-view-non-contiguous -- gather allocates a contiguous result even from strided points
}

torch::Tensor farthest_point_sample(const torch::Tensor& xyz, int64_t npoint) {
  const int64_t B = xyz.size(0), N = xyz.size(1);
  auto lopts = xyz.options().dtype(torch::kLong);
  auto centroids = torch::zeros({B, npoint}, lopts);
  auto distance = torch::full({B, N}, 1e10, xyz.options());
  auto farthest = torch::randint(N, {B}, lopts);
  auto batch = torch::arange(B, lopts);
  for (int64_t i = 0; i < npoint; ++i) {
    centroids.select(1, i).copy_(farthest);
    auto centroid = xyz.index({batch, farthest}).unsqueeze(1);
    distance = torch::minimum(distance, (xyz - centroid).pow(2).sum(-1));
    farthest = distance.argmax(-1);
  }
  return centroids;
}

torch::Tensor pc_normalize(torch::Tensor xyz) {
  auto centered = xyz;
  // FACT: p=torch.rand(2,5,6)+1; x=p.narrow(2,0,3); y=x; y-=y.mean(1,keepdim=True); assert shares_storage(y,p) and p[...,:3].mean().abs().item()<1e-5
  centered -= xyz.mean(1, true);  // EXPECT: tensor-alias-then-mutate
  centered /= centered.norm(2, -1).amax(1).view({-1, 1, 1});
  return centered;
}

using Mlp = std::vector<int64_t>;

struct SetAbstractionImpl : torch::nn::Module {
  int64_t npoint, nsample;
  std::vector<torch::nn::Conv2d> convs;
  std::vector<torch::nn::BatchNorm2d> bns;

  SetAbstractionImpl(int64_t npoint_, int64_t nsample_, int64_t in_ch, const std::vector<int64_t>& mlp)
      : npoint(npoint_), nsample(nsample_) {
    for (size_t i = 0; i < mlp.size(); ++i) {
      convs.push_back(register_module("conv" + std::to_string(i), torch::nn::Conv2d(in_ch, mlp[i], 1)));
      bns.push_back(register_module("bn" + std::to_string(i), torch::nn::BatchNorm2d(mlp[i])));
      in_ch = mlp[i];
    }
  }

  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& xyz, const torch::Tensor& points) {
    torch::Tensor new_xyz, grouped;
    if (npoint == 0) {
      new_xyz = torch::zeros({xyz.size(0), 1, 3}, xyz.options());
      grouped = torch::cat({xyz, points}, -1).unsqueeze(1);
    } else {
      new_xyz = index_points(xyz, farthest_point_sample(xyz, npoint));
      auto knn = std::get<1>(square_distance(new_xyz, xyz).topk(nsample, -1, /*largest=*/false));
      auto grouped_xyz = index_points(xyz, knn);
      // FACT: x=torch.rand(2,8,3); i=torch.randint(0,8,(2,12,1)).expand(-1,-1,3); g=x.gather(1,i); g-=x[:,:1]; assert is_copy_of(g,x)
      grouped_xyz -= new_xyz.unsqueeze(2);  // LOOKALIKE: tensor-alias-then-mutate -- index_points gathers into new storage
      grouped = torch::cat({grouped_xyz, index_points(points, knn)}, -1);
    }
    auto x = grouped.permute({0, 3, 2, 1});
    // FACT: x=torch.randn(2,3,5,requires_grad=True); bn=torch.nn.BatchNorm1d(3); y=bn(x); y.relu_(); y.sum().backward(); assert x.grad is not None
    for (size_t i = 0; i < convs.size(); ++i) x = bns[i](convs[i](x)).relu_();  // LOOKALIKE: tensor-inplace-on-saved -- batch norm saves its input, not its output
    return {new_xyz, std::get<0>(x.max(2)).transpose(1, 2)};
  }
};
TORCH_MODULE(SetAbstraction);

struct FeaturePropagationImpl : torch::nn::Module {
  std::vector<torch::nn::Conv1d> convs;
  std::vector<torch::nn::BatchNorm1d> bns;

  FeaturePropagationImpl(int64_t in_ch, const std::vector<int64_t>& mlp) {
    for (size_t i = 0; i < mlp.size(); ++i) {
      convs.push_back(register_module("conv" + std::to_string(i), torch::nn::Conv1d(in_ch, mlp[i], 1)));
      bns.push_back(register_module("bn" + std::to_string(i), torch::nn::BatchNorm1d(mlp[i])));
      in_ch = mlp[i];
    }
  }

  torch::Tensor forward(const torch::Tensor& xyz1, const torch::Tensor& xyz2, const torch::Tensor& points1,
                        const torch::Tensor& points2, const torch::Tensor& valid) {
    const int64_t B = xyz1.size(0), N = xyz1.size(1);
    torch::Tensor interpolated;
    if (xyz2.size(1) == 1) {
      interpolated = points2.expand({B, N, points2.size(2)});
    } else {
      auto knn = square_distance(xyz1, xyz2).topk(3, -1, /*largest=*/false);
      auto weight = 1.0 / (std::get<0>(knn) + 1e-8);
      weight /= weight.sum(-1, true);
      interpolated = (index_points(points2, std::get<1>(knn)) * weight.unsqueeze(-1)).sum(2);
    }
    auto x = points1.defined() ? torch::cat({points1, interpolated}, -1) : interpolated.contiguous();
    // FACT: g=torch.randn(2,1,4).expand(2,5,4); c=torch.cat([torch.randn(2,5,3),g],-1); c.masked_fill_(c>0,0.0); assert is_copy_of(c,g) and is_copy_of(g.contiguous(),g)
    if (valid.defined()) x.masked_fill_(valid.logical_not().unsqueeze(-1), 0.0);  // LOOKALIKE: tensor-inplace-on-expanded -- cat and contiguous materialise the broadcast global feature
    x = x.permute({0, 2, 1});
    for (size_t i = 0; i < convs.size(); ++i) x = torch::relu(bns[i](convs[i](x)));
    // FACT: x=torch.randn(4,requires_grad=True); r=torch.relu(x*1); r.mul_(torch.ones(4)); assert backward_fails(lambda: r.sum().backward())
    if (valid.defined()) x.mul_(valid.unsqueeze(1));  // EXPECT: tensor-inplace-on-saved
    return x.permute({0, 2, 1});
  }
};
TORCH_MODULE(FeaturePropagation);

struct PartSegNetImpl : torch::nn::Module {
  int64_t num_classes;
  SetAbstraction sa1{nullptr}, sa2{nullptr}, sa3{nullptr};
  FeaturePropagation fp3{nullptr}, fp2{nullptr}, fp1{nullptr};
  torch::nn::Conv1d head1{nullptr}, head2{nullptr};
  torch::nn::BatchNorm1d head_bn{nullptr};
  torch::nn::Dropout drop{nullptr};

  explicit PartSegNetImpl(const PartSegConfig& cfg) : num_classes(cfg.num_classes) {
    sa1 = register_module("sa1", SetAbstraction(512, 32, 3 + 6, Mlp{64, 64, 128}));
    sa2 = register_module("sa2", SetAbstraction(128, 64, 3 + 128, Mlp{128, 128, 256}));
    sa3 = register_module("sa3", SetAbstraction(0, 0, 3 + 256, Mlp{256, 512, 1024}));
    fp3 = register_module("fp3", FeaturePropagation(1024 + 256, Mlp{256, 256}));
    fp2 = register_module("fp2", FeaturePropagation(256 + 128, Mlp{256, 128}));
    fp1 = register_module("fp1", FeaturePropagation(128 + cfg.num_classes + 3 + 6, Mlp{128, 128}));
    head1 = register_module("head1", torch::nn::Conv1d(128, 128, 1));
    head_bn = register_module("head_bn", torch::nn::BatchNorm1d(128));
    drop = register_module("drop", torch::nn::Dropout(0.5));
    head2 = register_module("head2", torch::nn::Conv1d(128, cfg.num_parts, 1));
    torch::nn::init::normal_(head2->weight, 0.0, 1e-3);  // LOOKALIKE: tensor-inplace-on-leaf -- nn::init runs under NoGradGuard
    head2->bias.zero_();  // EXPECT: tensor-inplace-on-leaf
  }

  torch::Tensor forward(const torch::Tensor& points, const torch::Tensor& cls, const torch::Tensor& valid) {
    const int64_t B = points.size(0), N = points.size(1);
    auto l0_xyz = points.narrow(2, 0, 3);
    auto [l1_xyz, l1_pts] = sa1(l0_xyz, points);
    auto [l2_xyz, l2_pts] = sa2(l1_xyz, l1_pts);
    auto [l3_xyz, l3_pts] = sa3(l2_xyz, l2_pts);
    auto l2_new = fp3(l2_xyz, l3_xyz, l2_pts, l3_pts, torch::Tensor());
    auto l1_new = fp2(l1_xyz, l2_xyz, l1_pts, l2_new, torch::Tensor());
    auto one_hot = torch::one_hot(cls, num_classes).to(points.scalar_type()).unsqueeze(1).expand({B, N, num_classes});
    auto l0_new = fp1(l0_xyz, l1_xyz, torch::cat({one_hot, l0_xyz, points}, -1), l1_new, valid);
    auto x = drop(head_bn(head1(l0_new.permute({0, 2, 1}))).relu_());
    return torch::log_softmax(head2(x), 1).permute({0, 2, 1});
  }
};
TORCH_MODULE(PartSegNet);

struct Batch { torch::Tensor points, target, cls, valid; };

Batch collate(const std::vector<ShapeSample>& data, size_t start, const PartSegConfig& cfg) {
  const int64_t B = cfg.batch_size, N = cfg.num_points;
  Batch b{torch::zeros({B, N, 6}), torch::full({B, N}, -1, torch::kLong), torch::empty({B}, torch::kLong),
          torch::zeros({B, N}, torch::kBool)};
  for (int64_t i = 0; i < B; ++i) {
    const auto& s = data[start + i];
    const int64_t n = std::min<int64_t>(N, static_cast<int64_t>(s.parts.size()));
    auto raw = torch::from_blob(const_cast<double*>(s.xyz_normals.data()), {n, 6}, torch::kFloat64);
    b.points.select(0, i).narrow(0, 0, n).copy_(raw);  // EXPECT: tensor-copy-narrowing
    auto parts = torch::from_blob(const_cast<int64_t*>(s.parts.data()), {n}, torch::kLong);
    b.target.select(0, i).narrow(0, 0, n).copy_(parts);  // LOOKALIKE: tensor-copy-narrowing -- int64 labels into an int64 buffer
    b.valid.select(0, i).narrow(0, 0, n).fill_(true);
    b.cls[i] = s.category;
  }
  return b;
}

torch::Tensor prepare(const torch::Tensor& points) {
  return torch::cat({pc_normalize(points.narrow(2, 0, 3)), points.narrow(2, 3, 3)}, -1);
}

void train_epoch(PartSegNet& net, torch::optim::Optimizer& opt, const std::vector<ShapeSample>& data,
                 const PartSegConfig& cfg, torch::Device device, std::vector<torch::Tensor>& loss_history) {
  net->train();
  int64_t correct = 0, seen = 0, step = 0;
  for (size_t start = 0; start + cfg.batch_size <= data.size(); start += cfg.batch_size, ++step) {
    auto batch = collate(data, start, cfg);
    auto points = prepare(batch.points.to(device));
    auto target = batch.target.to(device), valid = batch.valid.to(device);
    auto seg_pred = net->forward(points, batch.cls.to(device), valid);
    // FACT: x=torch.randn(2,5,7).permute(0,2,1); assert not is_contiguous(x) and is_copy_of(x.reshape(-1,5), x)
    auto loss = torch::nll_loss(seg_pred.reshape({-1, cfg.num_parts}), target.view(-1), {}, at::Reduction::Mean, -1);  // EXPECT: tensor-reshape-non-contiguous
    opt.zero_grad();
    loss.backward();
    opt.step();
    loss_history.push_back(loss);  // EXPECT: tensor-graph-kept-across-iterations
    correct += seg_pred.argmax(-1).eq(target).sum().item<int64_t>();  // EXPECT: tensor-sync-in-loop
    seen += batch.valid.sum().item<int64_t>();
    if (step % cfg.log_every == 0)
      std::cout << "step " << step << " nll " << loss.item<float>() << std::endl;  // LOOKALIKE: tensor-sync-in-loop -- read once every log_every steps
  }
  std::cout << "train point accuracy " << double(correct) / std::max<int64_t>(seen, 1) << std::endl;
}

double evaluate(PartSegNet& net, const std::vector<ShapeSample>& data, const PartSegConfig& cfg,
                const torch::Tensor& part_table, torch::Device device, const std::string& out_dir) {
  torch::NoGradGuard no_grad;
  net->eval();
  std::vector<torch::Tensor> shape_ious;
  for (size_t start = 0; start + cfg.batch_size <= data.size(); start += cfg.batch_size) {
    auto batch = collate(data, start, cfg);
    auto points = batch.points.to(device);
    auto xyz = points.narrow(2, 0, 3);
    auto cls = batch.cls.to(device), target = batch.target.to(device), valid = batch.valid.to(device);
    auto seg_pred = net->forward(prepare(points), cls, valid);
    auto allowed = part_table.to(device).index_select(0, cls);  // EXPECT: tensor-clone-in-loop
    auto pred = seg_pred.clone().masked_fill_(allowed.logical_not().unsqueeze(1), -INFINITY).argmax(-1);  // EXPECT: tensor-unnecessary-clone
    auto pred_oh = torch::one_hot(pred, cfg.num_parts).to(torch::kBool).logical_and(valid.unsqueeze(-1));
    auto gt_oh = torch::one_hot(target.clamp_min(0), cfg.num_parts).to(torch::kBool).logical_and(valid.unsqueeze(-1));
    auto inter = pred_oh.logical_and(gt_oh).sum(1).to(torch::kFloat);
    auto uni = pred_oh.logical_or(gt_oh).sum(1).to(torch::kFloat);
    auto part_iou = torch::where(uni > 0, inter / uni.clamp_min(1), torch::ones_like(uni));
    shape_ious.push_back((part_iou * allowed).sum(1) / allowed.sum(1));  // LOOKALIKE: tensor-graph-kept-across-iterations -- computed from argmax under NoGradGuard, no graph
    export_predictions(out_dir, start, xyz.cpu(), pred.cpu());
  }
  return torch::cat(shape_ious).mean().item<double>();
}

}  // namespace pn2

int main(int argc, char** argv) {
  const std::string root = argc > 1 ? argv[1] : "data/shapenetcore_partanno_segmentation_benchmark_v0_normal";
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  pn2::PartSegConfig cfg;
  auto train_set = pn2::load_split(root, "train"), test_set = pn2::load_split(root, "test");
  // parts 0-3 airplane, 4-5 bag, ... contiguous ranges per category as in the benchmark
  const std::vector<int64_t> first_part = {0, 4, 6, 8, 12, 16, 19, 22, 24, 28, 30, 36, 38, 41, 44, 47, 50};
  auto part_table = torch::zeros({cfg.num_classes, cfg.num_parts}, torch::kBool);
  for (int64_t c = 0; c < cfg.num_classes; ++c)
    part_table[c].narrow(0, first_part[c], first_part[c + 1] - first_part[c]).fill_(true);
  pn2::PartSegNet net(cfg);
  net->to(device);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(cfg.lr).weight_decay(1e-4));
  std::vector<torch::Tensor> loss_history;
  for (int64_t epoch = 0; epoch < cfg.epochs; ++epoch) {
    pn2::train_epoch(net, opt, train_set, cfg, device, loss_history);
    if (epoch % 10 == 9)
      std::cout << "epoch " << epoch << " instance mIoU "
                << pn2::evaluate(net, test_set, cfg, part_table, device, "predictions") << std::endl;
  }
  return 0;
}
