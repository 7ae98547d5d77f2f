// k-means on GPU embeddings; assignments are reported on the host every iteration.
#include <torch/torch.h>
#include <iostream>

torch::Tensor kmeans(const torch::Tensor &points_host, int64_t k, int iters) {
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto points = points_host.to(torch::kCUDA);
  auto centroids = points.index_select(0, torch::randperm(points.size(0), opts.dtype(torch::kLong)).narrow(0, 0, k));
  auto point_norms = points.pow(2).sum(1, true);
  auto assign = torch::zeros({points.size(0)}, opts.dtype(torch::kLong));
  for (int it = 0; it < iters; ++it) {
    auto pn = point_norms.clone(); // EXPECT: tensor-clone-in-loop
    auto d = pn - 2 * torch::matmul(points, centroids.t()) + centroids.pow(2).sum(1).unsqueeze(0);
    assign = d.argmin(1);
    auto counts = torch::bincount(assign, {}, k).clamp_min(1).unsqueeze(1).to(torch::kFloat);
    centroids = torch::zeros_like(centroids).index_add_(0, assign, points) / counts;
    auto host_points = points.cpu(); // EXPECT: tensor-clone-in-loop
    std::cout << "iter " << it << " first point " << host_points[0][0].item<float>() << "\n";
  }
  return assign.cpu();
}
