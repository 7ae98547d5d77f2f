// Offline feature extraction for a retrieval index from a pretrained backbone.
#include <torch/torch.h>
#include <map>
#include <string>
#include <vector>

struct Item {
  std::string id;
  torch::Tensor image;
};

// Forgot the guard: every embedding keeps the backbone's activations for its image.
std::map<std::string, torch::Tensor> build_index(torch::nn::Sequential &backbone, const std::vector<Item> &items) {
  backbone->eval();
  std::map<std::string, torch::Tensor> index;
  for (const auto &it : items) {
    auto emb = torch::nn::functional::normalize(backbone->forward(it.image.unsqueeze(0)),
                                                torch::nn::functional::NormalizeFuncOptions().dim(1));
    // FACT: b = torch.nn.Linear(8, 4); idx = {}; [idx.__setitem__(k, torch.nn.functional.normalize(b(torch.randn(1, 8)), dim=1)) for k in "abc"]; assert all(v.requires_grad for v in idx.values()) and kept_nodes(idx) >= 3
    index[it.id] = emb; // EXPECT: tensor-graph-kept-across-iterations
  }
  return index;
}

// With InferenceMode the same loop keeps nothing.
std::map<std::string, torch::Tensor> build_index_inference(torch::nn::Sequential &backbone,
                                                           const std::vector<Item> &items) {
  c10::InferenceMode guard;
  std::map<std::string, torch::Tensor> index;
  for (const auto &it : items) {
    // FACT: b = torch.nn.Linear(8, 4); idx = {}; f = torch.inference_mode()(lambda: [idx.__setitem__(k, b(torch.randn(1, 8))) for k in "abc"]); f(); assert kept_nodes(idx) == 0
    index[it.id] = backbone->forward(it.image.unsqueeze(0)); // LOOKALIKE: tensor-graph-kept-across-iterations -- InferenceMode records no graph
  }
  return index;
}

// Batched extraction with the guard in an inner scope around the loop.
torch::Tensor extract_all(torch::nn::Sequential &backbone, const std::vector<torch::Tensor> &batches) {
  std::vector<torch::Tensor> feats;
  {
    torch::NoGradGuard no_grad;
    for (const auto &b : batches)
      feats.emplace_back(backbone->forward(b)); // LOOKALIKE: tensor-graph-kept-across-iterations -- under NoGradGuard
  }
  return torch::cat(feats);
}

// Without the guard: a nearest-centroid probe on the extracted features.
double probe_accuracy(torch::nn::Sequential &backbone, const std::vector<torch::Tensor> &batches,
                      const torch::Tensor &labels, const torch::Tensor &centroids) {
  std::vector<torch::Tensor> feats;
  for (const auto &b : batches) {
    auto f = backbone->forward(b);
    // FACT: b = torch.nn.Linear(8, 4); fs = [b(torch.randn(2, 8)).cpu() for _ in range(3)]; assert all(f.requires_grad for f in fs) and kept_nodes(fs) >= 3
    feats.push_back(f.cpu()); // EXPECT: tensor-graph-kept-across-iterations
  }
  auto pred = torch::cdist(torch::cat(feats), centroids).argmin(1);
  return pred.eq(labels).to(torch::kFloat).mean().item<double>();
}
